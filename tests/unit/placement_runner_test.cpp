// Placement runtime: the tiny SD UNet and CLIP fixtures run as plan segments over several
// devices (CPU + easel rpc-servers on 127.0.0.1), with parameters on the device, in host RAM
// (staged or streamed block by block) or on disk, give the same output as one CPU graph.
#include "core/error.h"
#include "io/weight_index.h"
#include "models/clip/clip_text.h"
#include "models/sd/unet.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "runtime/graph_runner.h"
#include "runtime/sequence_runner.h"
#include "rpc_servers.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>


using namespace easel;
using namespace easel::models::sd;
using placement::PModule;
using placement::Residency;

namespace {

const std::filesystem::path kRef = std::filesystem::path(EASEL_TEST_DATA) / "reference";

nlohmann::json sidecar(const std::string& name) {
    std::ifstream f(kRef / (name + ".json"));
    return nlohmann::json::parse(f);
}

std::vector<float> read(const io::WeightIndex& idx, const std::string& name) {
    const io::TensorInfo* t = idx.find(name);
    if (!t) throw std::runtime_error("fixture lacks " + name);
    return idx.read_f32(*t);
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float m = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

/// Devices for multi-device tests: CPU plus up to two RPC devices (tests/unit/rpc_servers.h).
easel::test_support::RpcServers& servers() {
    static easel::test_support::RpcServers s(2);
    return s;
}

// ---------------------------------------------------------------- UNet fixture

struct UnetCase {
    io::WeightIndex idx = io::WeightIndex::open(kRef / "unet_sd15_tiny.safetensors");
    UNetConfig cfg = infer_unet_config(idx, unet_overrides_from_diffusers_config(sidecar("unet_sd15_tiny").at("config")));
    nn::TensorSource src = make_unet_source(idx, cfg);
    UNet2DCondition net{cfg};
    std::vector<float> sample = read(idx, "__input__.sample"), t = read(idx, "__input__.timestep"),
                       ctx = read(idx, "__input__.encoder_hidden_states"), expected = read(idx, "__output__.sample");
    nn::LoadOptions opt() const {
        nn::LoadOptions o;
        o.check_unexpected = false;  // the fixture also holds __input__/__output__ tensors
        return o;
    }
    UNetInputs inputs(runtime::GraphBuilder& g) const {
        UNetInputs in;
        in.sample = g.input_f32("sample", {16, 16, 4, 2}, sample);
        in.timestep = g.input_f32("timestep", {2}, t);
        in.context = g.input_f32("context", {32, 77, 2}, ctx);
        return in;
    }
};

using UnetRunner = runtime::SequenceRunner<UNetInputs, UNetState, ggml_tensor*>;

/// Plans with `place` and runs the UNet fixture; returns the output and the runner's peaks.
std::vector<float> run_unet_plan(UnetCase& u, const placement::ModulePlacement& place, bool stream,
                                 const std::map<std::string, uint64_t>& budgets, placement::ModulePlan* plan_out = nullptr,
                                 std::map<std::string, uint64_t>* peaks = nullptr, int evals = 1) {
    UnetRunner r(u.net, u.net, u.src, u.opt(), 1);
    auto mk = [&](runtime::GraphBuilder& g) { return u.inputs(g); };
    auto sel = [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; };
    auto costs = r.costs(mk, sel, "UNet");
    auto plan = placement::plan_module(PModule::Diffusion, place, stream, costs, budgets);
    r.load(plan);
    std::vector<float> out;
    r.begin_phase();
    for (int i = 0; i < evals; ++i) {
        auto o = r.run(mk, sel);
        if (i > 0) {
            EXPECT_EQ(o.at(0).data, out) << "evaluation " << i << " differs from the first";
        }
        out = o.at(0).data;
    }
    r.end_phase();
    if (plan_out) *plan_out = plan;
    if (peaks) *peaks = r.peaks();
    return out;
}

/// The reference: the whole UNet as one graph on the CPU (GraphRunner, nn::ParamBuffer::load).
std::vector<float> unet_one_graph(UnetCase& u) {
    runtime::GraphRunner runner(nullptr, 1);
    auto pb = nn::ParamBuffer::load(u.net, u.src, runner.buffer_type(), u.opt());
    auto out = runner.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false};
        return std::vector<ggml_tensor*>{u.net.forward(c, u.inputs(g))};
    });
    return out.at(0).data;
}

}  // namespace

TEST(PlacementPlan, LayerSplitBalancesByBudgetAndReportsWhatDoesNotFit) {
    placement::ModuleCosts c;
    c.label = "test";
    c.block_bytes = std::vector<uint64_t>(10, 100 << 20);  // 10 blocks of 100 MiB
    c.prologue_bytes = 10 << 20;
    c.measure = [](int b, int e, bool, bool, const std::string&) { return (uint64_t)(e - b) * (8 << 20); };
    placement::ModulePlacement place;
    place.devices = {"A", "B"};
    // budgets 3:1 -> blocks about 7.5 : 2.5 of the bytes
    auto p = placement::plan_module(PModule::Diffusion, place, false, c, {{"A", 3000ull << 20}, {"B", 1000ull << 20}});
    ASSERT_EQ(p.segments.size(), 2u);
    EXPECT_EQ(p.segments[0].begin, 0);
    EXPECT_TRUE(p.segments[0].prologue);
    EXPECT_TRUE(p.segments[1].epilogue);
    EXPECT_GE(p.segments[0].end, 7);
    EXPECT_LE(p.segments[0].end, 8);
    // A: blocks + prologue params + compute of its range
    const int na = p.segments[0].end;
    EXPECT_EQ(p.devices[0].params, (uint64_t)na * (100 << 20) + (10 << 20));
    EXPECT_EQ(p.devices[0].compute, (uint64_t)na * (8 << 20));
    EXPECT_EQ(p.devices[1].params, (uint64_t)(10 - na) * (100 << 20) + (10 << 20));
    // equal budgets: 5 + 5; a model that would fit on A alone is still split
    p = placement::plan_module(PModule::Diffusion, place, false, c, {});
    EXPECT_EQ(p.segments[0].end, 5);

    // one device, params on the device, budget too small: the message names the numbers and the fix
    place.devices = {"A"};
    try {
        placement::plan_module(PModule::Diffusion, place, false, c, {{"A", 500ull << 20}});
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
        EXPECT_NE(std::string(e.what()).find("diffusion needs 1090 MiB on A but the budget leaves 500 MiB (1010 params + 0 streaming slots + 80 compute + 0 state)"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("--params-backend diffusion=cpu --stream-layers"), std::string::npos) << e.what();
    }

    // params in host RAM, 500 MiB cap: segments uploaded per evaluation, 2 slots + compute within the cap
    place.params = "CPU";
    p = placement::plan_module(PModule::Diffusion, place, false, c, {{"A", 500ull << 20}});
    EXPECT_GT(p.segments.size(), 1u);
    for (auto& s : p.segments) EXPECT_TRUE(s.per_eval);
    EXPECT_LE(p.devices[0].total(), 500ull << 20);
    EXPECT_EQ(p.host_bytes, 1000ull * (1 << 20) + 2 * (10 << 20));  // the prologue/epilogue params are held twice
    const placement::ModulePlan from_ram = p;
    // streaming: leading blocks resident as the budget allows, the rest one block per upload
    p = placement::plan_module(PModule::Diffusion, place, true, c, {{"A", 600ull << 20}});
    ASSERT_GE(p.segments.size(), 2u);
    EXPECT_FALSE(p.segments[0].per_eval);
    EXPECT_GT(p.segments[0].end, 0);
    for (size_t i = 1; i < p.segments.size(); ++i) {
        EXPECT_TRUE(p.segments[i].per_eval);
        EXPECT_EQ(p.segments[i].end - p.segments[i].begin, 1);
    }
    EXPECT_LE(p.devices[0].total(), 600ull << 20);
    // disk that does not fit whole: the same --max-vram segments as from RAM, each read from the
    // file per evaluation; host RAM holds one transient buffer of the largest segment (+ 8 KiB slack)
    place.params = "disk";
    p = placement::plan_module(PModule::Diffusion, place, false, c, {{"A", 500ull << 20}});
    ASSERT_EQ(p.segments.size(), from_ram.segments.size());
    uint64_t largest = 0;
    for (size_t i = 0; i < p.segments.size(); ++i) {
        EXPECT_EQ(p.segments[i].residency, Residency::Disk);
        EXPECT_TRUE(p.segments[i].per_eval);
        EXPECT_EQ(p.segments[i].end, from_ram.segments[i].end);
        largest = std::max(largest, p.segments[i].param_bytes);
    }
    EXPECT_EQ(p.devices[0].total(), from_ram.devices[0].total());
    EXPECT_EQ(p.host_bytes, largest + (8 << 10));
    EXPECT_LT(p.host_bytes, from_ram.host_bytes);
    // not even one block fits two slots beside its graph: stops with the fix
    try {
        placement::plan_module(PModule::Diffusion, place, false, c, {{"A", 200ull << 20}});
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
        EXPECT_NE(std::string(e.what()).find("a larger --max-vram"), std::string::npos) << e.what();
    }
}

TEST(PlacementPlan, BudgetsFromMaxVramAndHeadroom) {
    std::vector<placement::DeviceInfo> devs(3);
    devs[0].name = "CPU", devs[0].type = "cpu", devs[0].free_bytes = 8ull << 30;
    devs[1].name = "CUDA0", devs[1].type = "gpu", devs[1].free_bytes = 10ull << 30;
    devs[2].name = "CUDA1", devs[2].type = "gpu", devs[2].free_bytes = 4ull << 30;
    placement::PlacementSpec s;
    auto b = placement::resolve_budgets(s, devs);
    EXPECT_FALSE(b.count("CPU"));  // host RAM unlimited unless asked
    EXPECT_EQ(b.at("CUDA0"), 10ull << 30);  // free memory, no hidden reserve
    s.max_vram_all_gib = -1.5;
    s.max_vram_gib["CUDA1"] = 2;
    s.headroom_mib["CUDA0"] = 512;
    b = placement::resolve_budgets(s, devs);
    EXPECT_EQ(b.at("CUDA0"), (10ull << 30) - (1536ull << 20) - (512ull << 20));
    EXPECT_EQ(b.at("CUDA1"), 2ull << 30);
    EXPECT_FALSE(b.count("CPU"));
    // nothing left (a headroom above the free memory, free minus more than there is, a cap that
    // rounds to nothing) is a 1-byte budget, never 0 (= no cap): every plan then stops
    s = {};
    s.headroom_mib["CUDA0"] = 30000;     // > 10 GiB free
    s.max_vram_gib["CUDA1"] = -30;       // free minus 30 GiB
    s.max_vram_gib["CPU"] = 1e-30;
    b = placement::resolve_budgets(s, devs);
    EXPECT_EQ(b.at("CUDA0"), 1u);
    EXPECT_EQ(b.at("CUDA1"), 1u);
    EXPECT_EQ(b.at("CPU"), 1u);
    s = {};
    s.max_vram_gib["CUDA0"] = 1e99;  // huge: clamped, not overflowed
    EXPECT_EQ(placement::resolve_budgets(s, devs).at("CUDA0"), (uint64_t)9.0e18);
}

TEST(PlacementRunner, UnetSegmentsOnOneDeviceMatchOneGraphBitwise) {
    UnetCase u;
    const auto ref = unet_one_graph(u);
    EXPECT_LT(max_abs_diff(ref, u.expected), 1e-4f);
    placement::ModulePlacement place;
    place.devices = {"CPU"};
    placement::ModulePlan plan;
    // whole module as one segment
    auto out = run_unet_plan(u, place, false, {}, &plan);
    EXPECT_EQ(plan.segments.size(), 1u);
    EXPECT_EQ(out, ref);
    // one segment per block on the same device (what --max-vram cuts to): the state stays in a
    // device buffer between the graphs
    placement::ModulePlan cut;
    const int n = u.net.n_blocks();
    for (int i = 0; i < n; ++i) {
        placement::Segment sg;
        sg.device = "CPU";
        sg.begin = i, sg.end = i + 1, sg.prologue = i == 0, sg.epilogue = i == n - 1;
        cut.segments.push_back(sg);
    }
    UnetRunner r(u.net, u.net, u.src, u.opt(), 1);
    r.load(cut);
    auto o = r.run([&](runtime::GraphBuilder& g) { return u.inputs(g); }, [](ggml_tensor*& x) { return std::vector<ggml_tensor*>{x}; });
    EXPECT_EQ(o.at(0).data, ref);
}

#ifdef EASEL_HAS_RPC
TEST(PlacementRunner, UnetLayerSplitOverThreeDevicesMatchesOneDevice) {
    auto& rpc = servers();
    ASSERT_EQ(rpc.devices.size(), 2u) << "rpc-servers did not come up";
    UnetCase u;
    const auto ref = unet_one_graph(u);
    placement::ModulePlacement place;
    place.devices = {rpc.devices[0], rpc.devices[1]};
    placement::ModulePlan plan;
    std::map<std::string, uint64_t> peaks;
    auto out = run_unet_plan(u, place, false, {}, &plan, &peaks, 2);
    ASSERT_EQ(plan.segments.size(), 2u);
    std::printf("[placement] UNet split %s:%d-%d %s:%d-%d, max abs diff vs one CPU graph %.3g\n%s", plan.segments[0].device.c_str(),
                plan.segments[0].begin, plan.segments[0].end, plan.segments[1].device.c_str(), plan.segments[1].begin,
                plan.segments[1].end, max_abs_diff(out, ref), placement::format_peaks({plan}, peaks).c_str());
    EXPECT_EQ(out, ref);  // same CPU kernels on the far side: bitwise
    for (auto& d : plan.devices) EXPECT_LE(peaks.at(d.device), d.total() + (16 << 10)) << d.device;  // + buffer alignment of the weights
    // three devices: CPU & RPC0 & RPC1
    place.devices = {"CPU", rpc.devices[0], rpc.devices[1]};
    out = run_unet_plan(u, place, false, {}, &plan, &peaks);
    ASSERT_EQ(plan.segments.size(), 3u);
    EXPECT_EQ(out, ref);
}

TEST(PlacementRunner, UnetHostParamsStagedStreamedAndFromDiskMatch) {
    auto& rpc = servers();
    ASSERT_EQ(rpc.devices.size(), 2u);
    UnetCase u;
    const auto ref = unet_one_graph(u);
    const std::string dev = rpc.devices[0];
    placement::ModulePlacement place;
    place.devices = {dev};
    placement::ModulePlan plan;
    std::map<std::string, uint64_t> peaks;

    // --params-backend cpu: staged for the phase
    place.params = "CPU";
    auto out = run_unet_plan(u, place, false, {}, &plan, &peaks, 2);
    EXPECT_EQ(plan.segments.size(), 1u);
    EXPECT_EQ(plan.segments[0].residency, Residency::Host);
    EXPECT_EQ(out, ref);
    const uint64_t staged_total = plan.devices[0].total();

    // --params-backend cpu --stream-layers --max-vram DEV=<small>: the smallest budget that
    // streams every block (two slots of the largest block + the largest single-block graph)
    uint64_t cap = 0;
    {
        UnetRunner r(u.net, u.net, u.src, u.opt(), 1);
        auto c = r.costs([&](runtime::GraphBuilder& g) { return u.inputs(g); }, [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; }, "UNet");
        const int n = u.net.n_blocks();
        uint64_t slot = 0, comp = 0, state = 0;
        for (int i = 0; i < n; ++i) {
            slot = std::max(slot, c.block_bytes[(size_t)i] + (i == 0 || i == n - 1 ? c.prologue_bytes : 0));
            comp = std::max(comp, c.measure(i, i + 1, i == 0, i == n - 1, dev));
            if (i > 0) state = std::max(state, c.state_bytes(i));
        }
        cap = 2 * (slot + (8 << 10)) + comp + 2 * (state + (8 << 10)) + (8 << 10);  // + the plan's alignment slack
    }
    out = run_unet_plan(u, place, true, {{dev, cap}}, &plan, &peaks, 2);
    int streamed = 0;
    for (auto& s : plan.segments) streamed += s.per_eval;
    std::printf("[placement] streamed UNet: %zu segments (%d per evaluation), predicted %.3f MiB, measured %.3f MiB, cap %.3f MiB\n",
                plan.segments.size(), streamed, plan.devices[0].total() / 1048576.0, peaks.at(dev) / 1048576.0, cap / 1048576.0);
    EXPECT_GE(streamed, u.net.n_blocks() - 1);
    EXPECT_EQ(out, ref);
    EXPECT_LE(peaks.at(dev), cap);
    EXPECT_LE(peaks.at(dev), plan.devices[0].total());

    // --max-vram segmentation without streaming, between the streaming minimum and what one
    // staged graph needs: ranges of blocks uploaded per evaluation, run one after another
    const uint64_t seg_cap = (cap + staged_total) / 2;
    out = run_unet_plan(u, place, false, {{dev, seg_cap}}, &plan, &peaks, 2);
    std::printf("[placement] segmented UNet: %zu segments, predicted %.3f MiB, measured %.3f MiB, cap %.3f MiB\n", plan.segments.size(),
                plan.devices[0].total() / 1048576.0, peaks.at(dev) / 1048576.0, seg_cap / 1048576.0);
    EXPECT_GT(plan.segments.size(), 1u);
    EXPECT_LT(plan.segments.size(), (size_t)u.net.n_blocks());
    EXPECT_EQ(out, ref);
    EXPECT_LE(peaks.at(dev), seg_cap);

    // --params-backend disk: read per phase, freed after
    place.params = "disk";
    out = run_unet_plan(u, place, false, {}, &plan, &peaks, 2);
    EXPECT_EQ(plan.segments[0].residency, Residency::Disk);
    EXPECT_EQ(out, ref);
}

TEST(PlacementRunner, ClipLayerSplitMatchesOneDevice) {
    auto& rpc = servers();
    ASSERT_EQ(rpc.devices.size(), 2u);
    namespace clip = models::clip;
    auto idx = io::WeightIndex::open(kRef / "clip_text_with_projection_tiny.safetensors");
    auto keys = clip::find_clip_text_encoders(idx);
    auto cfg = clip::infer_config(idx, keys.at(0), clip::overrides_from_config_json(sidecar("clip_text_with_projection_tiny")["config"]));
    clip::ClipTextModel m(cfg);
    auto src = clip::make_tensor_source(idx, keys[0], cfg);
    auto lopt = clip::default_load_options(keys[0], cfg, idx);
    const io::TensorInfo* it = idx.find("__input__.input_ids");
    ASSERT_NE(it, nullptr);
    const int64_t N = it->shape[0], L = it->shape[1];
    std::vector<int32_t> ids;
    for (auto x : idx.read_i64(*it)) ids.push_back((int32_t)x);
    auto pool = clip::pool_indices(ids, L, N, cfg.eos_token_id);
    auto mk = [&](runtime::GraphBuilder& g) { return clip::ClipInputs{g.input_i32("ids", {L, N}, ids), g.input_i32("pool", {N}, pool)}; };
    auto sel = [](clip::ClipOutputs& o) { return std::vector<ggml_tensor*>{o.last_hidden_state, o.text_embeds}; };

    runtime::SequenceRunner<clip::ClipInputs, clip::ClipState, clip::ClipOutputs> one(m, m, src, lopt, 1);
    placement::ModulePlacement place;
    place.devices = {"CPU"};
    one.load(placement::plan_module(PModule::Te, place, false, one.costs(mk, sel, "CLIP"), {}));
    auto ref = one.run(mk, sel);
    EXPECT_LT(max_abs_diff(ref[0].data, read(idx, "__output__.last_hidden_state")), 1e-4f);
    EXPECT_LT(max_abs_diff(ref[1].data, read(idx, "__output__.text_embeds")), 1e-4f);

    runtime::SequenceRunner<clip::ClipInputs, clip::ClipState, clip::ClipOutputs> split(m, m, src, lopt, 1);
    place.devices = {rpc.devices[0], "CPU", rpc.devices[1]};
    auto plan = placement::plan_module(PModule::Te, place, false, split.costs(mk, sel, "CLIP"), {});
    ASSERT_EQ(plan.segments.size(), 3u);
    split.load(plan);
    auto out = split.run(mk, sel);  // the I32 pool index crosses devices as I32
    EXPECT_EQ(out[0].data, ref[0].data);
    EXPECT_EQ(out[1].data, ref[1].data);
}
#endif
