// Disk residency cut into --max-vram segments (placement/plan.h Residency::Disk, per_eval): a
// module that fits neither the device whole nor host RAM runs as block ranges whose weights are
// read from the model file into one transient host buffer and uploaded into the device's slots
// before every evaluation (runtime/sequence_runner.h). The tiny SD UNet fixture on the CPU and
// on an easel rpc-server (tests/unit/rpc_servers.h) must give the one-graph CPU
// output bitwise, with the measured device peak and host buffer within 10% of the plan.
#include "core/error.h"
#include "io/weight_index.h"
#include "models/sd/unet.h"
#include "placement/plan.h"
#include "runtime/graph_runner.h"
#include "runtime/sequence_runner.h"
#include "rpc_servers.h"
#include "unet_tiny_fixture.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

using namespace easel;
using namespace easel::models::sd;
using placement::PModule;
using placement::Residency;

namespace {

const std::filesystem::path kRef = std::filesystem::path(EASEL_TEST_DATA) / "reference";
constexpr double kMiB = 1048576.0;

using Unet = test_support::TinyUnet;
using Runner = test_support::TinyUnetRunner;

/// The whole UNet as one graph on the CPU (nn::ParamBuffer::load): the reference.
std::vector<float> one_graph(Unet& u) {
    runtime::GraphRunner runner(nullptr, 1);
    auto pb = nn::ParamBuffer::load(u.net, u.src, runner.buffer_type(), u.opt());
    auto out = runner.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false};
        return std::vector<ggml_tensor*>{u.net.forward(c, u.inputs(g))};
    });
    return out.at(0).data;
}

/// What one disk-segmented run measured.
struct DiskRun {
    placement::ModulePlan plan;
    std::vector<float> out;
    uint64_t peak = 0, host_peak = 0;
    int disk_reads = 0;
};

/// Plans the UNet on `dev` with --params-backend disk under `cap` bytes and runs `evals`
/// evaluations in one phase (each must equal the first).
DiskRun run_disk(Unet& u, const std::string& dev, uint64_t cap, int evals) {
    Runner r(u.net, u.net, u.src, u.opt(), 1);
    auto mk = [&](runtime::GraphBuilder& g) { return u.inputs(g); };
    auto sel = [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; };
    placement::ModulePlacement place;
    place.devices = {dev};
    place.params = placement::kDisk;
    DiskRun d;
    d.plan = placement::plan_module(PModule::Diffusion, place, false, r.costs(mk, sel, "UNet"), {{dev, cap}});
    r.load(d.plan);
    r.begin_phase();
    for (int i = 0; i < evals; ++i) {
        auto o = r.run(mk, sel);
        if (i == 0) d.out = o.at(0).data;
        else EXPECT_EQ(o.at(0).data, d.out) << "evaluation " << i;
    }
    r.end_phase();
    d.peak = r.peaks().at(dev);
    d.host_peak = r.host_peak();
    d.disk_reads = r.disk_reads();
    return d;
}

/// The smallest budget of a per-eval plan (two slots of the largest single block with its
/// non-block parameters + the largest single-block graph + two states + the plan's slack) and
/// the budget of the whole module as one graph with its parameters on the device.
std::pair<uint64_t, uint64_t> caps_for(Unet& u, const std::string& dev) {
    Runner r(u.net, u.net, u.src, u.opt(), 1);
    auto c = r.costs([&](runtime::GraphBuilder& g) { return u.inputs(g); }, [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; }, "UNet");
    const int n = u.net.n_blocks();
    uint64_t slot = 0, comp = 0, state = 0, params = c.prologue_bytes;
    for (int i = 0; i < n; ++i) {
        slot = std::max(slot, c.block_bytes[(size_t)i] + (i == 0 || i == n - 1 ? c.prologue_bytes : 0));
        comp = std::max(comp, c.measure(i, i + 1, i == 0, i == n - 1, dev));
        if (i > 0) state = std::max(state, c.state_bytes(i));
        params += c.block_bytes[(size_t)i];
    }
    return {2 * (slot + (8 << 10)) + comp + 2 * (state + (8 << 10)) + (8 << 10), params + c.measure(0, n, true, true, dev)};
}

/// Checks a disk-segmented run against the reference and its plan.
void check(const DiskRun& d, const std::vector<float>& ref, uint64_t cap, int evals, const char* what) {
    int per_eval = 0;
    for (auto& s : d.plan.segments) {
        EXPECT_EQ(s.residency, Residency::Disk);
        per_eval += s.per_eval;
    }
    const uint64_t predicted = d.plan.devices.at(0).total();
    std::printf("[placement-disk] %s: %zu segments read from disk per evaluation; device predicted %.3f MiB, measured %.3f MiB, cap "
                "%.3f MiB; host buffer predicted %.3f MiB, measured %.3f MiB; %d reads\n",
                what, d.plan.segments.size(), predicted / kMiB, d.peak / kMiB, cap / kMiB, d.plan.host_bytes / kMiB, d.host_peak / kMiB,
                d.disk_reads);
    EXPECT_EQ(per_eval, (int)d.plan.segments.size());
    EXPECT_GE(d.plan.segments.size(), 3u) << what;  // the cap forces several segments
    EXPECT_EQ(d.out, ref) << what;                 // the same CPU kernels: bitwise
    EXPECT_LE(d.peak, cap) << what;
    EXPECT_LE(predicted, cap) << what;
    EXPECT_NEAR((double)d.peak, (double)predicted, 0.10 * (double)predicted) << what;
    // host RAM: one transient buffer of the largest segment at a time (not the whole module)
    EXPECT_NEAR((double)d.host_peak, (double)d.plan.host_bytes, 0.10 * (double)d.plan.host_bytes) << what;
    uint64_t all = 0;
    for (auto& s : d.plan.segments) all += s.param_bytes;
    EXPECT_LT(d.host_peak, all) << what;
    EXPECT_EQ(d.disk_reads, (int)d.plan.segments.size() * evals) << what;
}

}  // namespace

// On the CPU device itself (no RPC needed): the cap halfway between the per-block minimum and
// the whole module, and the per-block minimum (segments of one block, or two small ones).
TEST(PlacementDisk, UnetDiskSegmentsOnCpuMatchOneGraphBitwise) {
    Unet u;
    const auto ref = one_graph(u);
    EXPECT_LT([&] {
        float m = 0;
        auto e = test_support::read_fixture(u.idx, "__output__.sample");
        for (size_t i = 0; i < e.size(); ++i) m = std::max(m, std::fabs(e[i] - ref[i]));
        return m;
    }(), 1e-4f);  // the reference is diffusers' output
    const auto [lo, whole] = caps_for(u, "CPU");
    ASSERT_LT(lo, whole);
    const uint64_t mid = (lo + whole) / 2;
    DiskRun half = run_disk(u, "CPU", mid, 2);
    check(half, ref, mid, 2, "CPU, cap halfway");
    DiskRun d = run_disk(u, "CPU", lo, 2);
    check(d, ref, lo, 2, "CPU, smallest cap");
    EXPECT_GT(d.plan.segments.size(), half.plan.segments.size());  // less room: smaller segments
}

#ifdef EASEL_HAS_RPC
// On an easel rpc-server (the device across a socket, as a GPU across PCIe): the parameters
// read from the file cross to the server's slots every evaluation.
TEST(PlacementDisk, UnetDiskSegmentsOnRpcDeviceMatchOneGraphBitwise) {
    static easel::test_support::RpcServers rpc(1);
    ASSERT_EQ(rpc.devices.size(), 1u) << "rpc-server did not come up";
    const std::string dev = rpc.devices[0];
    Unet u;
    const auto ref = one_graph(u);
    const auto [lo, whole] = caps_for(u, dev);
    const uint64_t cap = lo + (whole - lo) / 3;
    check(run_disk(u, dev, cap, 3), ref, cap, 3, "RPC, cap at a third");
    // a budget the module fits whole: one segment read for the phase, as before
    placement::ModulePlacement place;
    place.devices = {dev};
    place.params = placement::kDisk;
    Runner r(u.net, u.net, u.src, u.opt(), 1);
    auto mk = [&](runtime::GraphBuilder& g) { return u.inputs(g); };
    auto sel = [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; };
    auto plan = placement::plan_module(PModule::Diffusion, place, false, r.costs(mk, sel, "UNet"), {{dev, whole + (1 << 20)}});
    ASSERT_EQ(plan.segments.size(), 1u);
    EXPECT_FALSE(plan.segments[0].per_eval);
    EXPECT_EQ(plan.host_bytes, 0u);
    r.load(plan);
    EXPECT_EQ(r.run(mk, sel).at(0).data, ref);
    EXPECT_EQ(r.host_peak(), 0u);
}
#endif
