// Streaming through the upload ring (runtime/sequence_runner.h "Upload ring", placement/plan.h
// DeviceUse::slot_count): the planner sizes a ring of K slots from the budget (at least 2,
// ModulePlacement::stream_slots kept before leading blocks are made resident); the runner
// uploads the following per-eval segments in order into the slots as they free up. On the CPU
// device (no events) the uploads are synchronous but still issued ahead in ring order; on an
// rpc-server (async, events: one command queue per server) they are queued while a segment
// computes, and inside a phase the next evaluation's first segments during this one's last. A
// slot overwritten before its segment computed would change the output: every run here is
// compared bitwise with the whole UNet resident on the same device, the measured peak with the
// plan's prediction (within 10%) and the cap, and the depth the ring reached with K.
#include "core/error.h"
#include "io/weight_index.h"
#include "models/sd/unet.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "runtime/sequence_runner.h"
#include "rpc_servers.h"
#include "unet_tiny_fixture.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

using namespace easel;
using namespace easel::models::sd;
using placement::PModule;
using placement::Residency;

namespace {

const std::filesystem::path kRef = std::filesystem::path(EASEL_TEST_DATA) / "reference";
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kSlack = 8 << 10;  // the plan's alignment slack per slot / state buffer

easel::test_support::RpcServers& servers() {
    static easel::test_support::RpcServers s(2);
    return s;
}

using Unet = test_support::TinyUnet;
using Runner = test_support::TinyUnetRunner;

/// What one planned run gives.
struct StreamRun {
    placement::ModulePlan plan;
    std::vector<float> out;
    uint64_t peak = 0;
    int ahead = 0;                    // SegmentExecutor::max_uploaded_ahead
    int prefetched = 0;               // SegmentExecutor::prefetched_uploads
    std::map<std::string, int> ring;  // SegmentExecutor::ring_slots
    std::map<std::string, uint64_t> peaks;
};

/// The UNet's plan with `place` (streamed when `stream`) under `budgets`.
placement::ModulePlan plan_of(Unet& u, const placement::ModulePlacement& place, bool stream, const std::map<std::string, uint64_t>& budgets) {
    Runner r(u.net, u.net, u.src, u.opt(), 1);
    return placement::plan_module(PModule::Diffusion, place, stream,
                                  r.costs([&](runtime::GraphBuilder& g) { return u.inputs(g); },
                                          [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; }, "UNet"),
                                  budgets);
}

/// Runs `plan` for `evals` evaluations in one phase (each must equal the first); returns the
/// last output and what the runner measured.
StreamRun run_given(Unet& u, const placement::ModulePlan& plan, int evals) {
    Runner r(u.net, u.net, u.src, u.opt(), 1);
    auto mk = [&](runtime::GraphBuilder& g) { return u.inputs(g); };
    auto sel = [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; };
    r.split_non_block_params(mk, sel);  // as the planning runner did
    StreamRun x;
    x.plan = plan;
    r.load(x.plan);
    r.begin_phase();
    for (int i = 0; i < evals; ++i) {
        auto o = r.run(mk, sel).at(0).data;
        if (i > 0) {
            EXPECT_EQ(o, x.out) << "evaluation " << i << " differs from the first";
        }
        x.out = std::move(o);
    }
    r.end_phase();
    x.peaks = r.peaks();
    x.peak = x.peaks.at(plan.segments.at(0).device);
    x.ahead = r.max_uploaded_ahead();
    x.prefetched = r.prefetched_uploads();
    x.ring = r.ring_slots();
    return x;
}

StreamRun run_plan(Unet& u, const placement::ModulePlacement& place, bool stream, const std::map<std::string, uint64_t>& budgets, int evals) {
    return run_given(u, plan_of(u, place, stream, budgets), evals);
}

/// `p` with a ring of k slots on every device that has one (the slot size kept): the tiny
/// UNet's weights are small beside its compute buffer, so no budget below its whole size leaves
/// the planner room for more than 3 slots; the runner takes K from the plan.
placement::ModulePlan with_ring(placement::ModulePlan p, int k) {
    for (auto& u : p.devices)
        if (u.slot_count > 0) {
            u.slots = u.slots / (uint64_t)u.slot_count * (uint64_t)k;
            u.slot_count = k;
        }
    return p;
}

/// The budget that streams every block with a ring of `k` slots and nothing resident: k slots of
/// the largest single block with the non-block parameters its graph reads, the largest
/// single-block graph, two states kept on the device, the plan's slack.
uint64_t ring_budget(Unet& u, const std::string& dev, int k) {
    Runner r(u.net, u.net, u.src, u.opt(), 1);
    auto c = r.costs([&](runtime::GraphBuilder& g) { return u.inputs(g); }, [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; }, "UNet");
    const int n = u.net.n_blocks();
    const bool known = c.prologue_used_bytes || c.epilogue_used_bytes;
    uint64_t slot = 0, comp = 0, state = 0;
    for (int i = 0; i < n; ++i) {
        uint64_t b = c.block_bytes[(size_t)i];
        if (i == 0) b += known ? c.prologue_used_bytes : c.prologue_bytes;
        if (i == n - 1) b += known ? c.epilogue_used_bytes : c.prologue_bytes;
        slot = std::max(slot, b);
        comp = std::max(comp, c.measure(i, i + 1, i == 0, i == n - 1, dev));
        if (i > 0) state = std::max(state, c.state_bytes(i));
    }
    return (uint64_t)k * (slot + kSlack) + comp + 2 * (state + kSlack) + kSlack;
}

/// Bitwise output, peak within 10% of the prediction and under the cap, ring as planned and
/// filled to its depth.
void check(const StreamRun& x, const std::vector<float>& ref, const std::string& dev, uint64_t cap, const char* what) {
    const placement::DeviceUse* u = nullptr;
    for (auto& d : x.plan.devices)
        if (d.device == dev) u = &d;
    ASSERT_NE(u, nullptr) << what;
    int per_eval = 0;
    for (auto& s : x.plan.segments) per_eval += s.per_eval && s.device == dev;
    std::printf("[placement-stream] %s: %zu segments (%d per eval), ring %d slots, %d uploaded ahead at most; predicted %.3f MiB, "
                "measured %.3f MiB, cap %.3f MiB\n",
                what, x.plan.segments.size(), per_eval, u->slot_count, x.ahead, u->total() / (double)kMiB, x.peaks.at(dev) / (double)kMiB,
                cap / (double)kMiB);
    EXPECT_EQ(x.out, ref) << what;
    EXPECT_LE(u->total(), cap) << what;
    EXPECT_LE(x.peaks.at(dev), cap) << what;
    EXPECT_NEAR((double)x.peaks.at(dev), (double)u->total(), 0.10 * (double)u->total()) << what;
    ASSERT_GT(per_eval, 0) << what;
    EXPECT_EQ(x.ring.at(dev), u->slot_count) << what;  // the runner allocated the plan's ring
}

}  // namespace

// The planner alone (made-up costs: 10 blocks of 100 MiB, 10 MiB of non-block parameters held
// by the first and the last segment, 8 MiB of compute per block, no state), budget 600 MiB:
//  * default: leading blocks resident as the budget allows beside 2 slots of the largest
//    streamed segment (the last block + 10 MiB: 110 MiB + 8 KiB): 100 k + 10 + 220.016 + 8 <= 600
//    -> k = 3 (P0-3 resident, 24 MiB of compute for its graph); 554.016 MiB, the 45.98 MiB left is
//    less than a slot: K = 2;
//  * stream_slots 4: 100 k + 10 + 4 x 110.008 + 8 <= 600 -> k = 1; 110 + 440.03 + 8 = 558.03 MiB,
//    K = 4;
//  * stream_slots 8: no resident prefix leaves room for 8 (or, with k >= 2, 10 - k) slots, so
//    every block streams; 2 slots + 8 MiB = 228.016 MiB, the 371.98 MiB left hold 3 more: K = 5.
TEST(PlacementStream, PlannerSizesTheRingFromTheBudget) {
    placement::ModuleCosts c;
    c.label = "test";
    c.block_bytes = std::vector<uint64_t>(10, 100 * kMiB);
    c.prologue_bytes = 10 * kMiB;
    c.measure = [](int b, int e, bool, bool, const std::string&) { return (uint64_t)(e - b) * 8 * kMiB; };
    placement::ModulePlacement place;
    place.devices = {"A"};
    place.params = "CPU";
    const std::map<std::string, uint64_t> budget{{"A", 600 * kMiB}};
    const uint64_t slot = 110 * kMiB + kSlack;

    auto p = placement::plan_module(PModule::Diffusion, place, true, c, budget);
    ASSERT_EQ(p.segments.size(), 8u);
    EXPECT_FALSE(p.segments[0].per_eval);
    EXPECT_EQ(p.segments[0].end, 3);
    EXPECT_EQ(p.devices[0].slot_count, 2);
    EXPECT_EQ(p.devices[0].slots, 2 * slot);
    EXPECT_EQ(p.devices[0].total(), 310 * kMiB + 2 * slot + 24 * kMiB);
    EXPECT_NE(placement::format_plan({p}).find("upload ring slots: A 2"), std::string::npos) << placement::format_plan({p});

    place.stream_slots = 4;
    p = placement::plan_module(PModule::Diffusion, place, true, c, budget);
    ASSERT_EQ(p.segments.size(), 10u);
    EXPECT_FALSE(p.segments[0].per_eval);
    EXPECT_EQ(p.segments[0].end, 1);
    for (size_t i = 1; i < 10; ++i) EXPECT_TRUE(p.segments[i].per_eval);
    EXPECT_EQ(p.devices[0].slot_count, 4);
    EXPECT_EQ(p.devices[0].slots, 4 * slot);
    EXPECT_EQ(p.devices[0].total(), 110 * kMiB + 4 * slot + 8 * kMiB);

    place.stream_slots = 8;
    p = placement::plan_module(PModule::Diffusion, place, true, c, budget);
    ASSERT_EQ(p.segments.size(), 10u);
    for (auto& s : p.segments) EXPECT_TRUE(s.per_eval);
    EXPECT_EQ(p.devices[0].slot_count, 5);
    EXPECT_EQ(p.devices[0].slots, 5 * slot);
    EXPECT_LE(p.devices[0].total(), 600 * kMiB);

    // --max-vram segments without streaming and disk segments keep two slots
    place.stream_slots = 0;
    p = placement::plan_module(PModule::Diffusion, place, false, c, {{"A", 500 * kMiB}});
    EXPECT_EQ(p.devices[0].slot_count, 2);
    place.params = "disk";
    p = placement::plan_module(PModule::Diffusion, place, false, c, {{"A", 500 * kMiB}});
    EXPECT_EQ(p.devices[0].slot_count, 2);
    // nothing per evaluation: no ring
    p = placement::plan_module(PModule::Diffusion, place, false, c, {});
    EXPECT_EQ(p.devices[0].slot_count, 0);
    EXPECT_EQ(p.devices[0].slots, 0u);
}

// On the CPU device (no RPC): every block streamed through rings the planner sizes (2 and 3
// slots: 3 does not divide the 12 blocks, so the ring wraps within an evaluation), rings of 5, 7
// and 12 (one slot per block) on the planner's 2-slot plan, and the default plan under a budget
// between the smallest streaming one and the whole module (leading blocks resident).
TEST(PlacementStream, RingOnCpuMatchesResidentBitwise) {
    Unet u;
    placement::ModulePlacement place;
    place.devices = {"CPU"};
    const StreamRun resident = run_plan(u, place, false, {}, 1);
    ASSERT_EQ(resident.plan.segments.size(), 1u);
    place.params = "CPU";
    const int n = u.net.n_blocks();
    ASSERT_EQ(n, 12);
    for (int k : {2, 3}) {
        place.stream_slots = k;
        const uint64_t cap = ring_budget(u, "CPU", k);
        ASSERT_LT(cap, resident.plan.devices[0].total());
        StreamRun x = run_plan(u, place, true, {{"CPU", cap}}, 3);
        const std::string what = "CPU, every block streamed, stream_slots " + std::to_string(k);
        check(x, resident.out, "CPU", cap, what.c_str());
        int per_eval = 0;
        for (auto& s : x.plan.segments) per_eval += s.per_eval;
        EXPECT_EQ(per_eval, n) << what;
        EXPECT_EQ(x.plan.devices[0].slot_count, k) << what;
        EXPECT_EQ(x.ahead, k) << what;  // the ring filled: k segments on the device ahead of their compute
        EXPECT_EQ(x.prefetched, 0) << what;  // the CPU has no events: nothing on a second backend
    }
    place.stream_slots = 0;
    const uint64_t cap2 = ring_budget(u, "CPU", 2);
    const placement::ModulePlan two = plan_of(u, place, true, {{"CPU", cap2}});
    ASSERT_EQ(two.devices[0].slot_count, 2);
    for (int k : {5, 7, 12}) {
        const placement::ModulePlan p = with_ring(two, k);
        StreamRun x = run_given(u, p, 3);
        const std::string what = "CPU, every block streamed, ring of " + std::to_string(k);
        check(x, resident.out, "CPU", p.devices[0].total(), what.c_str());
        EXPECT_EQ(x.ahead, k) << what;
    }
    // default plan between the smallest streaming budget and the whole module
    const uint64_t cap = (cap2 + resident.plan.devices[0].total()) / 2;
    StreamRun x = run_plan(u, place, true, {{"CPU", cap}}, 2);
    check(x, resident.out, "CPU", cap, "CPU, default plan");
    EXPECT_FALSE(x.plan.segments.at(0).per_eval);
    EXPECT_GE(x.plan.devices[0].slot_count, 2);
    EXPECT_EQ(x.ahead, std::min<int>(x.plan.devices[0].slot_count, (int)x.plan.segments.size() - 1));
}

#ifdef EASEL_HAS_RPC
// On an easel rpc-server (the device across a socket, async with events): every block streamed
// through the planner's ring of 3, two evaluations in one phase (the next
// one's first segments uploaded during this one's last: prefetched_uploads counts every streamed
// segment but the very first, plus K queued for a fourth evaluation and dropped at the end of
// the phase); then a layer split, blocks 0-5 on one server and 6-11 on the other, each streamed
// through its own ring of 3.
TEST(PlacementStream, RingOnRpcServersMatchesResidentBitwise) {
    auto& rpc = servers();
    ASSERT_EQ(rpc.devices.size(), 2u) << "rpc-servers did not come up";
    Unet u;
    const std::string dev = rpc.devices[0];
    placement::ModulePlacement place;
    place.devices = {dev};
    const StreamRun resident = run_plan(u, place, false, {}, 1);
    const int n = u.net.n_blocks();
    place.params = "CPU";
    place.stream_slots = 3;
    const uint64_t cap = ring_budget(u, dev, 3);
    StreamRun x = run_plan(u, place, true, {{dev, cap}}, 2);
    check(x, resident.out, dev, cap, "RPC, every block streamed, 3 slots");
    EXPECT_EQ(x.plan.devices[0].slot_count, 3);
    EXPECT_EQ(x.ahead, 3);
    EXPECT_EQ(x.prefetched, 2 * n - 1 + 3);

    // layer split: the same segments, the second half on the other server
    placement::ModulePlan split = with_ring(x.plan, 3);
    for (int i = n / 2; i < n; ++i) split.segments[(size_t)i].device = rpc.devices[1];
    split.devices.push_back(split.devices[0]);
    split.devices[1].device = rpc.devices[1];
    StreamRun s = run_given(u, split, 2);
    EXPECT_EQ(s.out, resident.out);
    for (auto& d : rpc.devices) {
        EXPECT_EQ(s.ring.at(d), 3) << d;
        // each server holds the 3 slots, a compute buffer no larger than the single-device one
        EXPECT_LE(s.peaks.at(d), split.devices[0].total()) << d;
    }
    EXPECT_EQ(s.ahead, 3);
}
#endif
