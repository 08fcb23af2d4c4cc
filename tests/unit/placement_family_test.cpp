// Placement of every placed module of a family (models::Family with FamilyOptions::placement):
// the Z-Image Qwen3 text encoder and transformer, the SD CLIP text encoder and UNet, run over
// CPU + two `easel rpc-server`s on 127.0.0.1 (layer split, weights in RAM / on disk) give
// bitwise the outputs of the same family without placement (the same ggml ops on the same
// CPU; states cross devices as raw bytes); the planner's per-stage accounting of a device
// (modules of one stage add, stages time-share) on hand-made plans; Family::placement_costs
// (what --auto-fit plans from) matches the parameters the family loads.
#include "core/error.h"
#include "models/family.h"
#include "models/zimage/z_image.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "placement/row_split.h"
#include "placement/spec.h"
#include "placement_test_support.h"
#include "rpc_servers.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <thread>

#include <unistd.h>


using namespace easel;
using placement::PModule;

namespace {

const std::filesystem::path kRef = std::filesystem::path(EASEL_TEST_DATA) / "reference";
constexpr uint64_t kMiB = 1 << 20;

/// Two easel rpc-servers serving the CPU (tests/unit/rpc_servers.h).
easel::test_support::RpcServers& rpc() {
    static easel::test_support::RpcServers r(2);
    return r;
}

std::shared_ptr<const placement::PlacementSpec> spec_of(const std::string& backend, const std::string& params = "",
                                                        const std::string& max_vram = "", bool stream = false) {
    placement::PlacementFlags f;
    // modules the spec leaves out run on the CPU, as the unplaced family they are compared with
    // does (without this, a GPU build would put them on its first GPU)
    f.backend = backend.find('=') == std::string::npos ? backend : "default=CPU," + backend;
    f.params_backend = params;
    f.max_vram = max_vram;
    f.stream_layers = stream;
    return std::make_shared<placement::PlacementSpec>(placement::parse_placement(f, placement::device_names()));
}

placement::ModulePlan hand_plan(PModule m, std::vector<std::pair<std::string, uint64_t>> uses, uint64_t budget) {
    placement::ModulePlan p;
    p.module = m;
    for (auto& [d, b] : uses) {
        placement::DeviceUse u;
        u.device = d;
        u.params = b;
        u.budget = budget;
        p.devices.push_back(u);
    }
    return p;
}

/// Everything a Z-Image job computes that placement may touch: the prompt's context, one
/// transformer evaluation for the positive and one for the negative caption (two lengths).
struct ZOut {
    std::vector<float> ctx_pos, ctx_neg, v_pos, v_neg;
};

ZOut run_zimage(std::shared_ptr<const placement::PlacementSpec> spec, models::Family** keep = nullptr,
                std::unique_ptr<models::Family>* hold = nullptr) {
    models::ModelFiles files;
    files.model = (kRef / "zimage_tiny" / "diffusers").string();
    models::FamilyOptions fo;
    fo.threads = 1;
    fo.placement = spec;
    auto fam = models::open_family(files, fo);
    ZOut o;
    auto pos = fam->encode_prompt("a red cat on a mat", 0);
    auto neg = fam->encode_prompt("blurry", 0);
    o.ctx_pos = pos.context;
    o.ctx_neg = neg.context;
    fam->unload(models::Module::Te);
    const int64_t C = 16, h = 8, w = 8;
    std::vector<float> x((size_t)(C * h * w));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * (float)i);
    o.v_pos.resize(x.size());
    o.v_neg.resize(x.size());
    fam->diffusion(x, {}, h, w, 700.0, pos, o.v_pos);
    fam->diffusion(x, {}, h, w, 700.0, neg, o.v_neg);
    fam->diffusion(x, {}, h, w, 300.0, pos, o.v_pos);  // a second step on the same plan
    if (keep && hold) {
        *keep = fam.get();
        *hold = std::move(fam);
    }
    return o;
}

/// Checks that every device's measured peak is within 10% of the plan's prediction and
/// within its budget.
void expect_peaks_near_prediction(const models::Family& fam, const std::string& what) {
    auto plans = fam.placement_plans();
    ASSERT_FALSE(plans.empty()) << what;
    test_support::expect_peaks_within_10_percent(plans, fam.placement_peaks(), what);
}

}  // namespace

// ---------------------------------------------------------------- stage accounting

// te 100 MiB and diffusion 300 MiB on D0, diffusion 200 MiB on D1: in their own stages the
// device peak of D0 is the larger stage (300); in one stage they add (400).
TEST(PlacementStages, DevicePeaksAddWithinAStageAndTakeTheLargestStage) {
    auto te = hand_plan(PModule::Te, {{"D0", 100 * kMiB}}, 0);
    auto dit = hand_plan(PModule::Diffusion, {{"D0", 300 * kMiB}, {"D1", 200 * kMiB}}, 0);
    auto peaks = placement::device_peaks({te, dit});
    EXPECT_EQ(peaks.at("D0"), 300 * kMiB);
    EXPECT_EQ(peaks.at("D1"), 200 * kMiB);
    te.stage = dit.stage = "together";
    peaks = placement::device_peaks({te, dit});
    EXPECT_EQ(peaks.at("D0"), 400 * kMiB);
    EXPECT_EQ(peaks.at("D1"), 200 * kMiB);
    // the table shows each stage's bytes and the peak per device
    const std::string t = placement::format_plan({hand_plan(PModule::Te, {{"D0", 100 * kMiB}}, 0),
                                                  hand_plan(PModule::Diffusion, {{"D0", 300 * kMiB}, {"D1", 200 * kMiB}}, 0)});
    EXPECT_NE(t.find("per device, by stage"), std::string::npos) << t;
    EXPECT_NE(t.find("D0                            100.0      300.0      300.0"), std::string::npos) << t;
}

// A 350 MiB budget on D0 holds either module alone but not both in one stage.
TEST(PlacementStages, ModulesOfOneStageMustFitTogether) {
    auto te = hand_plan(PModule::Te, {{"D0", 100 * kMiB}}, 350 * kMiB);
    auto dit = hand_plan(PModule::Diffusion, {{"D0", 300 * kMiB}}, 350 * kMiB);
    EXPECT_NO_THROW(placement::check_stage_budgets({te, dit}));
    te.stage = dit.stage = "denoise";
    try {
        placement::check_stage_budgets({te, dit});
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
        EXPECT_NE(std::string(e.what()).find("on D0 the denoise stage needs 400 MiB (te 100 + diffusion 300) but the budget leaves 350 MiB"),
                  std::string::npos)
            << e.what();
    }
}

// plan_modules plans each module from its own spec entry, one stage each.
TEST(PlacementStages, PlanModulesUsesEachModulesEntry) {
    placement::PlacementSpec spec;
    spec[PModule::Te].devices = {"A"};
    spec[PModule::Diffusion].devices = {"A", "B"};
    auto costs = [](PModule m, int blocks) {
        placement::ModuleCosts c;
        c.module = m;
        c.block_bytes.assign((size_t)blocks, 10 * kMiB);
        c.prologue_bytes = 0;
        c.measure = [](int, int, bool, bool, const std::string&) { return (uint64_t)kMiB; };
        return c;
    };
    auto plans = placement::plan_modules(spec, {costs(PModule::Te, 4), costs(PModule::Diffusion, 6)}, {});
    ASSERT_EQ(plans.size(), 2u);
    EXPECT_EQ(plans[0].module, PModule::Te);
    EXPECT_EQ(plans[0].stage, "te");
    ASSERT_EQ(plans[0].devices.size(), 1u);
    EXPECT_EQ(plans[0].devices[0].params, 40 * kMiB);
    EXPECT_EQ(plans[1].stage, "diffusion");
    ASSERT_EQ(plans[1].devices.size(), 2u);
    EXPECT_EQ(plans[1].devices[0].params, 30 * kMiB);  // equal shares without budgets
    EXPECT_EQ(plans[1].devices[1].params, 30 * kMiB);
}

// ---------------------------------------------------------------- Family::placement_costs

// Z-Image's costs: te (Qwen3 without its last layer) then diffusion; the transformer's bytes
// are the bytes the plain family loads (buffer padding aside), one block per main layer.
TEST(PlacementFamily, ZImageCostsMatchTheLoadedParameters) {
    models::ModelFiles files;
    files.model = (kRef / "zimage_tiny" / "diffusers").string();
    models::FamilyOptions fo;
    fo.threads = 1;
    auto fam = models::open_family(files, fo);
    auto costs = fam->placement_costs(8, 8);
    ASSERT_EQ(costs.size(), 3u);
    EXPECT_EQ(costs[0].module, PModule::Te);
    EXPECT_EQ(costs[1].module, PModule::Diffusion);
    EXPECT_EQ(costs[2].module, PModule::Vae);  // the AutoencoderKL decoder (tests/unit/placement_vae_test.cpp)
    auto* z = dynamic_cast<models::zimage::ZImage*>(fam.get());
    ASSERT_NE(z, nullptr);
    EXPECT_EQ((int64_t)costs[1].block_bytes.size(), z->dit_config().n_layers);
    const uint64_t dit = std::accumulate(costs[1].block_bytes.begin(), costs[1].block_bytes.end(), costs[1].prologue_bytes);
    fam->load(models::Module::Diffusion);
    const double loaded = (double)fam->param_bytes(models::Module::Diffusion);
    EXPECT_LE((double)dit, loaded);
    EXPECT_GE((double)dit, 0.97 * loaded);
    // the measure callbacks outlive the family's temporaries and size a real graph
    const uint64_t whole = costs[1].measure(0, (int)costs[1].block_bytes.size(), true, true, "CPU");
    const uint64_t first = costs[1].measure(0, 1, true, false, "CPU");
    EXPECT_GT(whole, 0u);
    EXPECT_GT(first, 0u);
    EXPECT_GT(costs[0].measure(0, (int)costs[0].block_bytes.size(), true, true, "CPU"), 0u);
    EXPECT_GT(costs[1].state_bytes(1), 0u);
}

// ---------------------------------------------------------------- placed families

TEST(PlacementFamily, ZImageTeAndTransformerSplitOverRpcAreBitwiseTheCpuOutputs) {
    auto& r = rpc();
    const std::string a = r.devices[0], b = r.devices[1];
    const ZOut plain = run_zimage(nullptr);
    struct Case {
        std::string name, backend, params, max_vram;
        bool stream;
    };
    const std::vector<Case> cases = {
        {"layer split te and diffusion", "te=" + a + "&" + b + ",diffusion=" + b + "&" + a, "", "", false},
        {"layer split diffusion over the CPU and an RPC device", "diffusion=CPU&" + a, "", "", false},
        {"weights in RAM (staged)", a, "cpu", "", false},
        {"weights on disk", b, "disk", "", false},
        {"te on an RPC device, weights from disk", "te=" + b + ",diffusion=CPU", "te=disk", "", false},
    };
    for (auto& c : cases) {
        models::Family* fam = nullptr;
        std::unique_ptr<models::Family> hold;
        const ZOut o = run_zimage(spec_of(c.backend, c.params, c.max_vram, c.stream), &fam, &hold);
        EXPECT_EQ(o.ctx_pos, plain.ctx_pos) << c.name;
        EXPECT_EQ(o.ctx_neg, plain.ctx_neg) << c.name;
        EXPECT_EQ(o.v_pos, plain.v_pos) << c.name;
        EXPECT_EQ(o.v_neg, plain.v_neg) << c.name;
        expect_peaks_near_prediction(*fam, c.name);
        auto plans = fam->placement_plans();
        ASSERT_EQ(plans.size(), 2u) << c.name;
        EXPECT_EQ(plans[0].module, PModule::Te);
        EXPECT_EQ(plans[1].module, PModule::Diffusion);
    }
}

// --split-mode row through the family (what `easel generate --split-mode row` runs): the DiT's
// main layers on ggml's meta device over the two RPC devices. Partial sums are added in another
// order, so not bitwise: this pipeline's transformer is stored in F16 (the CPU's F16 matmuls
// convert the activations to F16), and the velocity moves by 2.1e-5 (measured; values of order 1)
// where the bare DiT with F32 weights moves by 2.4e-7 (row_split_test.cpp). The text encoder is
// not split (no rules) and stays bitwise.
TEST(PlacementFamily, ZImageRowSplitThroughTheFamily) {
    auto& r = rpc();
    const ZOut plain = run_zimage(nullptr);
    placement::PlacementFlags f;
    f.backend = "default=CPU,diffusion=" + r.devices[0] + "&" + r.devices[1];
    f.split_mode = "row";
    auto spec = std::make_shared<placement::PlacementSpec>(placement::parse_placement(f, placement::device_names()));
    models::Family* fam = nullptr;
    std::unique_ptr<models::Family> hold;
    const ZOut o = run_zimage(spec, &fam, &hold);
    EXPECT_EQ(o.ctx_pos, plain.ctx_pos);
    float d = 0;
    ASSERT_EQ(o.v_pos.size(), plain.v_pos.size());
    for (size_t i = 0; i < o.v_pos.size(); ++i) d = std::max(d, std::fabs(o.v_pos[i] - plain.v_pos[i]));
    EXPECT_LE(d, 1e-4f);
    EXPECT_GT(d, 0.0f) << "expected the row split's own rounding, not the layer-split path";
    auto plans = fam->placement_plans();
    ASSERT_GE(plans.size(), 2u);
    bool meta = false;
    for (auto& sg : plans[1].segments) meta |= placement::is_row_split_device(sg.device);
    EXPECT_TRUE(meta) << "the DiT's plan has no row-split segment";
    expect_peaks_near_prediction(*fam, "row split");
}

// Weights in RAM on a capped device, streamed (--stream-layers) and as --max-vram segments: the
// cap is the plan's prediction at the 512-token caption (placement_costs), above what the run
// needs. (The tiny transformer keeps 93% of its weights outside the main layers, in the
// embedders and refiners that the prologue segment carries, so no cap below the whole model
// can hold two streaming slots: per-evaluation uploads are covered by the UNet and CLIP cases
// of placement_runner_test.cpp.)
TEST(PlacementFamily, ZImageWeightsInRamUnderACapAreBitwiseTheCpuOutputs) {
    auto& r = rpc();
    const std::string a = r.devices[0];
    const ZOut plain = run_zimage(nullptr);
    models::ModelFiles files;
    files.model = (kRef / "zimage_tiny" / "diffusers").string();
    models::FamilyOptions fo;
    fo.threads = 1;
    fo.placement = spec_of("diffusion=" + a, "diffusion=cpu", "", true);
    auto probe = models::open_family(files, fo);
    const uint64_t need = probe->plan_placement(8, 8).at(1).devices.at(0).total();
    const double cap_gib = (double)need / (1024.0 * kMiB);
    for (bool stream : {true, false}) {
        models::Family* fam = nullptr;
        std::unique_ptr<models::Family> hold;
        const ZOut o = run_zimage(spec_of("diffusion=" + a, "diffusion=cpu", a + "=" + std::to_string(cap_gib), stream), &fam, &hold);
        const std::string name = stream ? "streamed" : "segments";
        EXPECT_EQ(o.ctx_pos, plain.ctx_pos) << name;
        EXPECT_EQ(o.v_pos, plain.v_pos) << name;
        EXPECT_EQ(o.v_neg, plain.v_neg) << name;
        auto plans = fam->placement_plans();
        ASSERT_EQ(plans.size(), 2u);
        EXPECT_EQ(plans[1].host_bytes, plans[1].devices.at(0).params) << name << ": the weights are held in RAM and staged";
        expect_peaks_near_prediction(*fam, name);
        EXPECT_LE(fam->placement_peaks().at(a), need) << name;
    }
}

// SD: the CLIP text encoder under a plan (layer split over both RPC devices at clip skip 1; at
// clip skip 2 built to the context layer only) gives the plain family's conditioning.
TEST(PlacementFamily, SdClipSplitOverRpcIsBitwiseTheCpuConditioning) {
    auto& r = rpc();
    models::ModelFiles files;
    files.model = (kRef / "sd_tiny" / "sd_tiny.safetensors").string();
    models::FamilyOptions fo;
    fo.threads = 1;
    auto plain = models::open_family(files, fo);
    // the tiny CLIP has 2 layers: split over two devices at clip skip 1; at clip skip 2 the
    // encoder is one layer, run on one RPC device with its weights in RAM
    struct Case {
        std::string backend, params;
        int skip;
        size_t devices;
    };
    for (const Case& c : {Case{"te=" + r.devices[0] + "&" + r.devices[1], "", 1, 2}, Case{"te=" + r.devices[1], "te=cpu", 2, 1}}) {
        fo.placement = spec_of(c.backend, c.params);
        auto placed = models::open_family(files, fo);
        auto want = plain->encode_prompt("a (red:1.2) cat", c.skip);
        auto got = placed->encode_prompt("a (red:1.2) cat", c.skip);
        EXPECT_EQ(got.tokens, want.tokens);
        EXPECT_EQ(got.context, want.context) << "clip skip " << c.skip;
        expect_peaks_near_prediction(*placed, "SD te, clip skip " + std::to_string(c.skip));
        auto plans = placed->placement_plans();
        ASSERT_EQ(plans.size(), 1u);
        EXPECT_EQ(plans[0].module, PModule::Te);
        EXPECT_EQ(plans[0].devices.size(), c.devices);
        EXPECT_EQ(plans[0].segments.back().end, 3 - c.skip) << "layers built for clip skip " << c.skip;
    }
}
