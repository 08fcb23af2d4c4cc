// models::ModuleSet / ModuleSlot (src/models/module_set.h): the lifecycle every family's modules
// share, on made-up Whole / Placed types whose plans, peaks and sizes are known; and
// resolve_sources' precedence on a made-up pipeline folder.
#include "core/error.h"
#include "models/module_set.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

using namespace easel;
using models::Module;
using models::ModuleSet;
using models::ModuleSlot;

namespace {

struct FakeWhole {
    size_t bytes = 0;
    size_t param_bytes() const { return bytes; }
};

/// A placed module: plans once it "ran", and peaks.
struct FakePlaced {
    placement::ModulePlan plan;  // no segments until run()
    std::map<std::string, uint64_t> measured;
    void run(const std::string& label, std::map<std::string, uint64_t> peaks) {
        plan.label = label;
        plan.segments.resize(1);
        measured = std::move(peaks);
    }
    const placement::ModulePlan& current_plan() const { return plan; }
    std::map<std::string, uint64_t> peaks() const { return measured; }
    uint64_t param_bytes() const { return 77; }
};

placement::ModuleCosts costs_named(const std::string& label) {
    placement::ModuleCosts c;
    c.label = label;
    return c;
}

/// A set with te (placeable), diffusion (placeable) and vae (whole only), counting loads.
struct Fixture {
    ModuleSet set;
    ModuleSlot<FakeWhole, FakePlaced>* te = nullptr;
    ModuleSlot<FakeWhole, FakePlaced>* dit = nullptr;
    ModuleSlot<FakeWhole>* vae = nullptr;
    int whole_loads = 0, placed_loads = 0;
    Fixture() {
        ModuleSlot<FakeWhole, FakePlaced>::Hooks th;
        th.load_whole = [this] {
            ++whole_loads;
            return std::make_unique<FakeWhole>(FakeWhole{100});
        };
        th.load_placed = [this] {
            ++placed_loads;
            return std::make_unique<FakePlaced>();
        };
        th.costs = [](int64_t h, int64_t w) { return std::vector<placement::ModuleCosts>{costs_named("te a"), costs_named("te b")}; };
        th.files = [] { return std::vector<std::string>{"te.safetensors"}; };
        te = &set.add<FakeWhole, FakePlaced>(Module::Te, std::move(th));
        ModuleSlot<FakeWhole, FakePlaced>::Hooks dh;
        dh.load_whole = [] { return std::make_unique<FakeWhole>(FakeWhole{200}); };
        dh.load_placed = [] { return std::make_unique<FakePlaced>(); };
        dh.costs = [](int64_t h, int64_t w) { return std::vector<placement::ModuleCosts>{costs_named(fmt::format("dit {}x{}", h, w))}; };
        dit = &set.add<FakeWhole, FakePlaced>(Module::Diffusion, std::move(dh));
        ModuleSlot<FakeWhole>::Hooks vh;
        vh.load_whole = [] { return std::make_unique<FakeWhole>(FakeWhole{300}); };
        vae = &set.add<FakeWhole>(Module::VaeDecoder, std::move(vh));
    }
};

}  // namespace

TEST(ModuleSet, LoadsWholeWithoutPlacementAndPlacedWithIt) {
    Fixture f;
    f.set.load(Module::Te, false, "Fake");
    EXPECT_TRUE(f.set.loaded(Module::Te));
    EXPECT_NE(f.te->whole(), nullptr);
    EXPECT_EQ(f.te->placed(), nullptr);
    EXPECT_EQ(f.set.param_bytes(Module::Te), 100u);
    f.set.load(Module::Te, false, "Fake");  // loaded: nothing happens
    EXPECT_EQ(f.whole_loads, 1);
    f.set.unload(Module::Te);
    EXPECT_FALSE(f.set.loaded(Module::Te));
    EXPECT_EQ(f.set.param_bytes(Module::Te), 0u);

    f.set.load(Module::Te, true, "Fake");
    EXPECT_EQ(f.placed_loads, 1);
    ASSERT_NE(f.te->placed(), nullptr);
    EXPECT_EQ(f.te->whole(), nullptr);
    EXPECT_EQ(f.set.param_bytes(Module::Te), 77u);  // the placed type's own figure
    // a slot without a placed form loads whole under placement flags too
    f.set.load(Module::VaeDecoder, true, "Fake");
    EXPECT_NE(f.vae->whole(), nullptr);
    EXPECT_EQ(f.set.param_bytes(Module::VaeDecoder), 300u);
    // a module the family lacks
    try {
        f.set.load(Module::VaeEncoder, false, "Fake");
        FAIL() << "no VaeEncoder slot";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
        EXPECT_STREQ(e.what(), "Fake has no vae encoder module");
    }
    EXPECT_FALSE(f.set.loaded(Module::VaeEncoder));
    EXPECT_EQ(f.set.param_bytes(Module::VaeEncoder), 0u);
}

TEST(ModuleSet, KeepsPlansAndPeaksAfterUnloadInSlotOrder) {
    Fixture f;
    f.set.load(Module::Diffusion, true, "Fake");
    f.set.load(Module::Te, true, "Fake");
    EXPECT_TRUE(f.set.plans().empty());  // planned on the first run only
    f.te->placed()->run("te plan", {{"GPU0", 10}, {"GPU1", 5}});
    f.dit->placed()->run("dit plan", {{"GPU0", 40}});
    auto plans = f.set.plans();
    ASSERT_EQ(plans.size(), 2u);
    EXPECT_EQ(plans[0].label, "te plan");  // slot order, not load order
    EXPECT_EQ(plans[1].label, "dit plan");
    f.set.unload(Module::Te);
    f.set.unload(Module::Diffusion);
    plans = f.set.plans();
    ASSERT_EQ(plans.size(), 2u);
    EXPECT_EQ(plans[0].label, "te plan");
    EXPECT_EQ(plans[1].label, "dit plan");
    const auto peaks = f.set.peaks();  // max over the modules per device
    EXPECT_EQ(peaks.at("GPU0"), 40u);
    EXPECT_EQ(peaks.at("GPU1"), 5u);
    // loaded again and unloaded before it ran: the kept plan stays
    f.set.load(Module::Te, true, "Fake");
    f.set.unload(Module::Te);
    ASSERT_EQ(f.set.plans().size(), 2u);
    EXPECT_EQ(f.set.plans()[0].label, "te plan");
    // a new run replaces the kept plan and peaks of its slot
    f.set.load(Module::Te, true, "Fake");
    f.te->placed()->run("te plan 2", {{"GPU1", 3}});
    f.set.unload(Module::Te);
    EXPECT_EQ(f.set.plans()[0].label, "te plan 2");
    EXPECT_EQ(f.te->peaks().at("GPU1"), 3u);
    EXPECT_EQ(f.te->peaks().count("GPU0"), 0u);
}

TEST(ModuleSet, KeepRunMergesPeaksAndReplacesThePlan) {
    Fixture f;
    placement::ModulePlan p;
    p.label = "taesd 1";
    f.vae->keep_run(p, "GPU0", 50);
    p.label = "taesd 2";
    f.vae->keep_run(p, "GPU0", 30);
    ASSERT_EQ(f.vae->plans().size(), 1u);
    EXPECT_EQ(f.vae->plans()[0].label, "taesd 2");
    EXPECT_EQ(f.vae->peaks().at("GPU0"), 50u);
    f.vae->note_compute(7);
    f.vae->note_compute(5);
    EXPECT_EQ(f.set.compute_bytes(Module::VaeDecoder), 7u);
}

TEST(ModuleSet, CostsInSlotOrderWithoutTheTextEncoderWhenSkipped) {
    Fixture f;
    auto c = f.set.costs(4, 6, false);
    ASSERT_EQ(c.size(), 3u);
    EXPECT_EQ(c[0].label, "te a");
    EXPECT_EQ(c[1].label, "te b");
    EXPECT_EQ(c[2].label, "dit 4x6");  // the vae slot has no costs hook
    c = f.set.costs(4, 6, true);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].label, "dit 4x6");
    EXPECT_EQ(f.set.files(Module::Te), std::vector<std::string>{"te.safetensors"});
    EXPECT_TRUE(f.set.files(Module::Diffusion).empty());
}

TEST(ModuleSet, ResolveSourcesTakesFolderComponentsThenFlags) {
    namespace fs = std::filesystem;
    const fs::path root = fs::temp_directory_path() / ("easel_module_set_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
    fs::remove_all(root);
    fs::create_directories(root / "transformer");
    fs::create_directories(root / "vae");
    fs::create_directories(root / "scheduler");
    fs::create_directories(root / "tokenizer");
    std::ofstream(root / "model_index.json") << R"({"_class_name": "FakePipeline", "transformer": ["diffusers", "X"], "vae": ["diffusers", "Y"],
        "scheduler": ["diffusers", "S"], "tokenizer": ["transformers", "T"]})";
    std::ofstream(root / "scheduler" / "scheduler_config.json") << R"({"shift": 2.5})";
    std::ofstream(root / "tokenizer" / "tokenizer.json") << "{}";
    static const models::SourceRule rules[] = {{"transformer", &models::ModelFiles::diffusion_model, "--diffusion-model"},
                                               {"vae", &models::ModelFiles::vae, "--vae"},
                                               {"text_encoder", &models::ModelFiles::llm, "--llm"}};
    models::ModelFiles files;
    files.model = root.string();
    files.vae = "/elsewhere/ae.safetensors";
    const models::ResolvedSources rs = models::resolve_sources(files, rules);
    ASSERT_EQ(rs.sources.size(), 3u);
    EXPECT_TRUE(rs.folder);
    EXPECT_EQ(rs.pipeline_class, "FakePipeline");
    EXPECT_EQ(rs.sources[0].path, (root / "transformer").string());
    EXPECT_EQ(rs.sources[0].named(), "-m " + root.string());  // the flag as the user gave it, not the component folder
    EXPECT_EQ(rs.sources[1].path, "/elsewhere/ae.safetensors");
    EXPECT_EQ(rs.sources[1].named(), "--vae /elsewhere/ae.safetensors");
    EXPECT_TRUE(rs.sources[2].empty());  // no text_encoder folder: absent, named by -m
    EXPECT_EQ(rs.sources[2].named(), "-m " + root.string());
    EXPECT_EQ(rs.model_desc, "diffusers folder " + root.string());
    ASSERT_TRUE(rs.scheduler_config.has_value());
    EXPECT_DOUBLE_EQ((*rs.scheduler_config)["shift"].get<double>(), 2.5);
    EXPECT_EQ(rs.tokenizer_json, (root / "tokenizer" / "tokenizer.json").string());
    EXPECT_NO_THROW(rs.require(0, "Fake pipelines"));
    try {
        rs.require(2, "Fake pipelines");
        FAIL() << "no text_encoder folder";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::ModelMismatch);
        EXPECT_EQ(std::string(e.what()), "-m " + root.string() + ": this diffusers pipeline (FakePipeline) has no text_encoder folder; Fake pipelines have one");
    }

    // a single file: every source is that file, named by -m
    models::ModelFiles one;
    one.model = "/m/model.safetensors";
    one.llm = "/m/qwen.gguf";
    const models::ResolvedSources r1 = models::resolve_sources(one, rules);
    EXPECT_FALSE(r1.folder);
    EXPECT_EQ(r1.sources[0].path, "/m/model.safetensors");
    EXPECT_EQ(r1.sources[1].named(), "-m /m/model.safetensors");
    EXPECT_EQ(r1.sources[2].named(), "--llm /m/qwen.gguf");
    EXPECT_EQ(r1.model_desc, "/m/model.safetensors");
    // --diffusion-model alone: described by it; the others not given
    models::ModelFiles dm;
    dm.diffusion_model = "/m/dit.safetensors";
    const models::ResolvedSources r2 = models::resolve_sources(dm, rules);
    EXPECT_EQ(r2.sources[0].named(), "--diffusion-model /m/dit.safetensors");
    EXPECT_TRUE(r2.sources[1].empty());
    EXPECT_EQ(r2.sources[1].named(), "");
    EXPECT_EQ(r2.model_desc, "/m/dit.safetensors");
    fs::remove_all(root);
}
