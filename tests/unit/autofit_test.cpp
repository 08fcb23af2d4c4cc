// --auto-fit planner (placement/autofit.h) on synthetic device inventories and model sizes.
// Each test writes down the expected plan and why (the tier order of autofit.h: resident,
// time-shared, host-streamed, layer split, disk, CPU; within a tier the least predicted time).
#include "core/error.h"
#include "placement/autofit.h"
#include "placement/spec.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <numeric>

#include <unistd.h>

using namespace easel;
using namespace easel::placement;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;

/// A module of `n` blocks of `block` bytes, `pro` bytes outside the blocks, a compute buffer of
/// `comp` bytes for any block range (ggml's allocator reuses memory across blocks, so a range's
/// buffer is about one block's) and `state` bytes crossing between blocks.
FitModule module(PModule m, int n, uint64_t block, uint64_t pro, uint64_t comp, uint64_t state, double evals = 1) {
    FitModule f;
    f.module = m;
    f.costs.label = pmodule_name(m);
    f.costs.block_bytes.assign((size_t)n, block);
    f.costs.prologue_bytes = pro;
    f.costs.measure = [comp](int, int, bool, bool, const std::string&) { return comp; };
    if (state) f.costs.state_bytes = [state](int) { return state; };
    f.evals = evals;
    return f;
}

FitDevice gpu(const std::string& name, uint64_t budget, uint64_t max_alloc = 0) {
    FitDevice d;
    d.name = name;
    d.type = "gpu";
    d.budget = budget;
    d.max_alloc = max_alloc;
    return d;
}
FitDevice cpu(uint64_t ram) {
    FitDevice d;
    d.name = "CPU";
    d.type = "cpu";
    d.budget = ram;
    return d;
}

/// Parameter bytes of a module (blocks + the rest).
uint64_t params(const FitModule& m) {
    return std::accumulate(m.costs.block_bytes.begin(), m.costs.block_bytes.end(), m.costs.prologue_bytes);
}

const FitChoice& choice(const FitResult& r, PModule m) {
    for (auto& c : r.choices)
        if (c.module == m) return c;
    throw std::runtime_error("no choice for module");
}

/// parse_placement(r.flags) must give back exactly the chosen devices and parameter locations.
void expect_round_trip(const FitResult& r, const std::vector<FitDevice>& devs) {
    std::vector<DeviceName> names;
    for (auto& d : devs) names.push_back({d.name, d.type, false});
    PlacementSpec spec = parse_placement(r.flags, names);
    for (auto& c : r.choices) {
        std::vector<std::string> want;
        for (auto& u : c.plan.devices) want.push_back(u.device);
        EXPECT_EQ(spec[c.module].devices, want) << pmodule_name(c.module);
        EXPECT_EQ(spec[c.module].params, c.plan.params_location) << pmodule_name(c.module);
    }
}

// The three modules of a FLUX-like job (sizes in the ballpark of the examples).
std::vector<FitModule> job(uint64_t te_gib_x4, int dit_blocks, uint64_t dit_block, uint64_t vae_comp) {
    return {module(PModule::Te, 24, te_gib_x4 * GiB / 4 / 24, 64 * MiB, 100 * MiB, 8 * MiB, 2),
            module(PModule::Diffusion, dit_blocks, dit_block, 64 * MiB, 200 * MiB, 16 * MiB, 40),
            module(PModule::Vae, 0, 0, 160 * MiB, vae_comp, 0, 1)};
}

/// The message of the Error(OutOfMemory) auto_fit(req) throws; "" (with a test failure) when it
/// returns a plan or throws another kind.
std::string oom_message(const FitRequest& req) {
    try {
        auto_fit(req);
        ADD_FAILURE() << "expected OutOfMemory, got a plan";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory) << e.what();
        return e.what();
    }
    return "";
}

}  // namespace

// 24 GB card: te 4 GiB + DiT 7.06 GiB + VAE 0.16 GiB (+ compute 0.1 + 0.2 + 2 GiB) = 13.5 GiB at
// once <= 24 GiB: tier 1, everything whole on CUDA0, loaded at once; the predicted peak is the sum.
TEST(AutoFit, SingleLargeCardEverythingResident) {
    FitRequest req;
    req.devices = {cpu(64 * GiB), gpu("CUDA0", 24 * GiB)};
    req.modules = job(16, 28, 256 * MiB, 2 * GiB);
    FitResult r = auto_fit(req);
    EXPECT_EQ(r.tier, Tier::Resident);
    for (auto& c : r.choices) {
        EXPECT_EQ(c.tier, Tier::Resident);
        ASSERT_EQ(c.plan.segments.size(), 1u);
        EXPECT_EQ(c.plan.segments[0].device, "CUDA0");
        EXPECT_EQ(c.plan.segments[0].residency, Residency::Device);
    }
    const uint64_t te = params(req.modules[0]) + 100 * MiB, dit = 28 * 256 * MiB + 64 * MiB + 200 * MiB, vae = 160 * MiB + 2 * GiB;
    EXPECT_EQ(r.resident_bytes.at("CUDA0"), te + dit + vae);  // all loaded at once fits 24 GiB
    EXPECT_EQ(r.predicted_peak.at("CUDA0"), dit);              // the pipeline runs one stage at a time
    EXPECT_EQ(r.flags.backend, "te=CUDA0,diffusion=CUDA0,vae=CUDA0");
    EXPECT_TRUE(r.flags.params_backend.empty());
    EXPECT_FALSE(r.flags.stream_layers);
    expect_round_trip(r, req.devices);
}

// 6 + 6 GiB pair, 7.06 GiB DiT (28 x 256 MiB + 64 MiB), 4 GiB encoder, 32 GiB RAM.
//  * tier 1 fails: the DiT fits neither card whole (7232 + 200 MiB > 6144 MiB);
//  * te (4.16 GiB) fits CUDA0 during its stage: tier 2, CUDA0 (both cards equal: the first);
//  * the DiT fits no card whole, so tier 3: weights in RAM, streamed to CUDA0. Budget 6144 MiB
//    = k resident blocks (256 k + 64 prologue) + 2 slots of the largest streamed segment
//    (the last block with the epilogue params: 320 MiB + 8 KiB each) + 200 compute + 2 states
//    (16 MiB + 8 KiB each): 256 k + 64 + 640.016 + 200 + 32.016 <= 6144 -> k = 20 resident,
//    8 blocks uploaded per evaluation; host RAM holds all 7232 MiB (< 32 GiB).
// Tier 3 comes before layer split in the stated order of preference.
TEST(AutoFit, SixPlusSixStreamsTheDitFromRam) {
    FitRequest req;
    req.devices = {cpu(32 * GiB), gpu("CUDA0", 6 * GiB), gpu("CUDA1", 6 * GiB)};
    req.modules = job(16, 28, 256 * MiB, 300 * MiB);
    FitResult r = auto_fit(req);
    EXPECT_EQ(r.tier, Tier::HostStreamed);
    EXPECT_EQ(choice(r, PModule::Te).tier, Tier::TimeShared);
    EXPECT_EQ(choice(r, PModule::Te).plan.devices[0].device, "CUDA0");
    const FitChoice& d = choice(r, PModule::Diffusion);
    EXPECT_EQ(d.tier, Tier::HostStreamed);
    ASSERT_EQ(d.plan.segments.size(), 9u);  // one resident range + 8 streamed blocks
    EXPECT_EQ(d.plan.segments[0].begin, 0);
    EXPECT_EQ(d.plan.segments[0].end, 20);
    EXPECT_FALSE(d.plan.segments[0].per_eval);
    for (size_t i = 1; i < 9; ++i) EXPECT_TRUE(d.plan.segments[i].per_eval);
    // host RAM: every block, and the non-block parameters with both the first and the last segment
    EXPECT_EQ(d.plan.host_bytes, 28 * 256 * MiB + 2 * 64 * MiB);
    EXPECT_LE(d.plan.devices[0].total(), 6 * GiB);
    EXPECT_EQ(r.flags.params_backend, "diffusion=CPU");
    EXPECT_TRUE(r.flags.stream_layers);
    EXPECT_NE(r.flags_line.find("--stream-layers"), std::string::npos);
    expect_round_trip(r, req.devices);
}

// Same pair with only 4 GiB of RAM: streaming would hold 7232 MiB in RAM (> 4096), so the DiT
// goes to tier 4, layer split over CUDA0&CUDA1, balanced by the equal budgets: 14 + 14 blocks.
TEST(AutoFit, SixPlusSixSplitsWhenRamIsShort) {
    FitRequest req;
    req.devices = {cpu(4 * GiB), gpu("CUDA0", 6 * GiB), gpu("CUDA1", 6 * GiB)};
    req.modules = job(16, 28, 256 * MiB, 300 * MiB);
    FitResult r = auto_fit(req);
    EXPECT_EQ(r.tier, Tier::LayerSplit);
    const FitChoice& d = choice(r, PModule::Diffusion);
    EXPECT_EQ(d.tier, Tier::LayerSplit);
    ASSERT_EQ(d.plan.segments.size(), 2u);
    EXPECT_EQ(d.plan.segments[0].device, "CUDA0");
    EXPECT_EQ(d.plan.segments[0].end, 14);
    EXPECT_EQ(d.plan.segments[1].device, "CUDA1");
    EXPECT_EQ(d.plan.segments[1].begin, 14);
    EXPECT_EQ(r.flags.backend, "te=CUDA0,diffusion=CUDA0&CUDA1,vae=CUDA0");
    EXPECT_TRUE(r.flags.params_backend.empty());
    expect_round_trip(r, req.devices);
}

// 8 GiB card whose largest single allocation is 2 GiB (Vulkan-like), 10 GiB text encoder
// (24 x 416 MiB + 64 MiB), 32 GiB RAM. The encoder fits no card whole -> tier 3, weights in RAM
// run as --max-vram segments (te is not streamed block by block). With the full 8 GiB budget the
// planner's segments would hold ~4 GB of parameters each (two slots beside the compute buffer)
// -- a slot buffer over 2 GiB, which ggml cannot allocate on this device. auto-fit lowers the
// budget (written as a --max-vram cap) until every slot is <= 2 GiB. A --max-vram cap applies to
// every module on the device, so the job is planned again under it: the DiT (7.06 GiB, whole it
// would fit 8 GiB, its parameter buffers split by ggml's allocator into buffers <= 2 GiB) no
// longer fits the cap and streams from RAM in 256 MiB blocks.
TEST(AutoFit, EightGbWithTwoGbMaxAllocation) {
    FitRequest req;
    req.devices = {cpu(32 * GiB), gpu("Vulkan0", 8 * GiB, 2 * GiB)};
    req.modules = {module(PModule::Te, 24, 416 * MiB, 64 * MiB, 100 * MiB, 8 * MiB, 2),
                   module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 200 * MiB, 16 * MiB, 40),
                   module(PModule::Vae, 0, 0, 160 * MiB, 300 * MiB, 0, 1)};
    FitResult r = auto_fit(req);
    const FitChoice& te = choice(r, PModule::Te);
    EXPECT_EQ(te.tier, Tier::HostStreamed);
    int per_eval = 0;
    for (auto& s : te.plan.segments) {
        EXPECT_TRUE(s.per_eval);
        EXPECT_LE(s.param_bytes + (8 << 10), 2 * GiB) << s.begin << "-" << s.end;
        per_eval += s.per_eval;
    }
    EXPECT_GE(per_eval, 5);  // 10 GiB in slots of <= 2 GiB
    const FitChoice& dit = choice(r, PModule::Diffusion);
    EXPECT_EQ(dit.tier, Tier::HostStreamed);
    for (auto& s : dit.plan.segments)
        if (s.per_eval) { EXPECT_LE(s.param_bytes + (8 << 10), 2 * GiB); }
    EXPECT_NE(r.flags.max_vram.find("Vulkan0="), std::string::npos);
    // the cap written in the flags reproduces the plan: the runtime planner under that budget
    std::vector<DeviceName> names{{"CPU", "cpu", false}, {"Vulkan0", "gpu", false}};
    PlacementSpec spec = parse_placement(r.flags, names);
    ASSERT_TRUE(spec.max_vram_gib.count("Vulkan0"));
    const uint64_t cap = (uint64_t)(spec.max_vram_gib.at("Vulkan0") * (double)GiB);
    EXPECT_LE(dit.plan.devices[0].total(), cap);
    EXPECT_LT(cap, 8 * GiB);
    ModulePlan again = plan_module(PModule::Te, spec[PModule::Te], false, req.modules[0].costs, {{"Vulkan0", cap}});
    ASSERT_EQ(again.segments.size(), te.plan.segments.size());
    for (size_t i = 0; i < again.segments.size(); ++i) EXPECT_EQ(again.segments[i].end, te.plan.segments[i].end);
    expect_round_trip(r, req.devices);
}

// CPU only (16 GiB RAM): no accelerator, so every module takes tier 6 on the CPU with its
// weights in RAM; the stages time-share the RAM (peak = the largest stage, the DiT's
// 7232 + 200 MiB).
TEST(AutoFit, CpuOnly) {
    FitRequest req;
    req.devices = {cpu(16 * GiB)};
    req.modules = job(16, 28, 256 * MiB, 300 * MiB);
    FitResult r = auto_fit(req);
    EXPECT_EQ(r.tier, Tier::Cpu);
    for (auto& c : r.choices) {
        EXPECT_EQ(c.tier, Tier::Cpu);
        EXPECT_EQ(c.plan.devices[0].device, "CPU");
    }
    EXPECT_EQ(r.predicted_peak.at("CPU"), 28 * 256 * MiB + 64 * MiB + 200 * MiB);
    EXPECT_EQ(r.flags.backend, "te=CPU,diffusion=CPU,vae=CPU");
    expect_round_trip(r, req.devices);
}

// 8 + 12 GiB pair, DiT 10.06 GiB (40 x 256 MiB + 64), te 5 GiB, VAE 0.16 GiB + 2 GiB decode.
// Tier 1 exists: the DiT only fits the 12 GiB card (10304 + 200 = 10504 MiB <= 12288), the
// encoder (5 GiB + 164 MiB) then only the 8 GiB card, and the VAE (2208 MiB) fits beside the
// encoder (7372 <= 8192) but not beside the DiT (12712 > 12288). Everything resident at once.
TEST(AutoFit, EightPlusTwelveEverythingResident) {
    FitRequest req;
    req.devices = {cpu(32 * GiB), gpu("CUDA0", 8 * GiB), gpu("CUDA1", 12 * GiB)};
    req.modules = job(20, 40, 256 * MiB, 2048 * MiB);
    FitResult r = auto_fit(req);
    EXPECT_EQ(r.tier, Tier::Resident);
    EXPECT_EQ(choice(r, PModule::Diffusion).plan.devices[0].device, "CUDA1");
    EXPECT_EQ(choice(r, PModule::Te).plan.devices[0].device, "CUDA0");
    EXPECT_EQ(choice(r, PModule::Vae).plan.devices[0].device, "CUDA0");
    EXPECT_EQ(r.resident_bytes.at("CUDA1"), 40 * 256 * MiB + 64 * MiB + 200 * MiB);
    EXPECT_EQ(r.resident_bytes.at("CUDA0"), params(req.modules[0]) + 100 * MiB + 160 * MiB + 2048 * MiB);
    EXPECT_EQ(r.predicted_peak.at("CUDA0"), params(req.modules[0]) + 100 * MiB);  // te's stage is the larger one there
    expect_round_trip(r, req.devices);
}

// A faster card wins within a tier: CUDA1 has 4x the FLOP/s of CUDA0, both hold the whole job.
TEST(AutoFit, FastestDeviceWinsWithinTier) {
    FitRequest req;
    req.devices = {cpu(32 * GiB), gpu("CUDA0", 24 * GiB), gpu("CUDA1", 24 * GiB)};
    req.devices[1].flops = 1e13;
    req.devices[2].flops = 4e13;
    req.modules = job(16, 28, 256 * MiB, 300 * MiB);
    FitResult r = auto_fit(req);
    EXPECT_EQ(r.tier, Tier::Resident);
    for (auto& c : r.choices) EXPECT_EQ(c.plan.devices[0].device, "CUDA1");
}

// RAM smaller than the model: 12 GiB card, 6 GiB RAM, te 4 GiB + DiT 9.06 GiB + VAE: the
// whole model (13.4 GiB) fits neither the card at once nor the RAM. Weights go from the model
// file (mapped) straight to the card, one stage at a time (tier 2): RAM is never asked to hold
// them. An explicit --params-backend diffusion=disk is kept (tier 5: read per phase).
TEST(AutoFit, RamSmallerThanTheModel) {
    FitRequest req;
    req.devices = {cpu(6 * GiB), gpu("CUDA0", 12 * GiB)};
    req.modules = job(16, 36, 256 * MiB, 300 * MiB);
    FitResult r = auto_fit(req);
    EXPECT_EQ(r.tier, Tier::TimeShared);
    EXPECT_EQ(choice(r, PModule::Diffusion).plan.segments[0].residency, Residency::Device);
    EXPECT_TRUE(r.flags.params_backend.empty());

    req.pinned_params[(size_t)PModule::Diffusion] = kDisk;
    FitResult d = auto_fit(req);
    EXPECT_EQ(choice(d, PModule::Diffusion).tier, Tier::Disk);
    EXPECT_EQ(choice(d, PModule::Diffusion).plan.segments[0].residency, Residency::Disk);
    EXPECT_EQ(d.flags.params_backend, "diffusion=disk");
    EXPECT_EQ(choice(d, PModule::Te).tier, Tier::TimeShared);  // the rest is still filled in
    expect_round_trip(d, req.devices);
}

// RAM smaller than the model AND a card smaller than the model: 8 GiB card, 6 GiB RAM, DiT
// 9.06 GiB (36 x 256 MiB + 64 MiB), te 2 GiB, VAE 0.16 GiB + 300 MiB.
//  * te and VAE fit the card during their stages (tier 2);
//  * the DiT fits the card whole in no tier up to 4: whole 9280 + 200 = 9480 MiB > 8192;
//    streaming from RAM holds 9344 MiB in RAM (> 6144); one accelerator, so no layer split;
//  * tier 5, disk: --max-vram segments read from the file per evaluation. The planner cuts
//    greedy ranges whose parameters fit (8192 - 200 compute - 2 x 16 MiB states - 16 KiB slot
//    slack) / 2 = 3980 MiB - 8 KiB: blocks 0-14 + the 64 MiB of non-block parameters the first
//    segment runs (3904 MiB; 16 blocks would be 4160), 15-29 (3840), 30-35 + the 64 MiB of the
//    epilogue (1600). On the card: two slots of the largest (2 x (3904 MiB + 8 KiB)) + 200 +
//    2 x (16 MiB + 8 KiB) = 8040 MiB + 32 KiB <= 8192. Host RAM: one transient buffer of the
//    largest segment, 3904 MiB + 8 KiB <= 6144 (the CPU tier would need all 9280 MiB in RAM).
//  * cost: every evaluation reads 9344 MiB from the file (disk_bytes_per_s) and uploads it
//    (default GPU bandwidth 1.2e10 B/s), plus the compute (flops 0 -> the 9280 MiB of parameter
//    bytes as FLOPs at the default 2e13 FLOP/s); 40 evaluations; no load (nothing resident).
TEST(AutoFit, RamAndCardSmallerThanTheModelReadsSegmentsFromDisk) {
    FitRequest req;
    req.devices = {cpu(6 * GiB), gpu("CUDA0", 8 * GiB)};
    req.modules = job(8, 36, 256 * MiB, 300 * MiB);
    FitResult r = auto_fit(req);
    EXPECT_EQ(r.tier, Tier::Disk);
    EXPECT_EQ(choice(r, PModule::Te).tier, Tier::TimeShared);
    EXPECT_EQ(choice(r, PModule::Vae).tier, Tier::TimeShared);
    const FitChoice& d = choice(r, PModule::Diffusion);
    EXPECT_EQ(d.tier, Tier::Disk);
    ASSERT_EQ(d.plan.segments.size(), 3u);
    const int ends[] = {15, 30, 36};
    const uint64_t seg_params[] = {3904 * MiB, 3840 * MiB, 1600 * MiB};
    for (size_t i = 0; i < 3; ++i) {
        const Segment& s = d.plan.segments[i];
        EXPECT_EQ(s.device, "CUDA0");
        EXPECT_EQ(s.residency, Residency::Disk);
        EXPECT_TRUE(s.per_eval);
        EXPECT_EQ(s.end, ends[i]);
        EXPECT_EQ(s.param_bytes, seg_params[i]);
    }
    EXPECT_EQ(d.plan.devices[0].params, 0u);
    EXPECT_EQ(d.plan.devices[0].slots, 2 * (3904 * MiB + 8 * 1024));
    EXPECT_EQ(d.plan.devices[0].total(), 8040 * MiB + 32 * 1024);
    EXPECT_EQ(d.plan.host_bytes, 3904 * MiB + 8 * 1024);
    EXPECT_EQ(r.predicted_peak.at("CPU"), 3904 * MiB + 8 * 1024);  // the RAM the job holds at most
    const double per_eval_bytes = 9344.0 * MiB, all = 9280.0 * MiB;
    // (the compute term: the FLOPs once, split over the segments by their parameter bytes; the
    // non-block weights that both the first and the last segment read are computed once)
    const double want = 40 * (per_eval_bytes / 1.0e9 + per_eval_bytes / 1.2e10 + all / 2.0e13);
    EXPECT_NEAR(d.seconds, want, want * 1e-9);
    EXPECT_EQ(r.flags.backend, "te=CUDA0,diffusion=CUDA0,vae=CUDA0");
    EXPECT_EQ(r.flags.params_backend, "diffusion=disk");
    EXPECT_TRUE(r.flags.max_vram.empty());
    expect_round_trip(r, req.devices);
    // the runtime planner given the same flags and budget cuts the same segments
    std::vector<DeviceName> names{{"CPU", "cpu", false}, {"CUDA0", "gpu", false}};
    PlacementSpec spec = parse_placement(r.flags, names);
    ModulePlan again = plan_module(PModule::Diffusion, spec[PModule::Diffusion], false, req.modules[1].costs, {{"CUDA0", 8 * GiB}});
    ASSERT_EQ(again.segments.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again.segments[i].end, ends[i]);
    EXPECT_NE(format_fit(r).find("read from disk per evaluation"), std::string::npos) << format_fit(r);
}

// The same with 3 GiB of RAM: a 3904 MiB segment would not fit the RAM it passes through, so
// auto-fit lowers the card's budget (a --max-vram cap) by twice the excess: 8040 MiB + 32 KiB -
// 2 x (832 MiB + 8 KiB) = 6376 MiB + 16 KiB, written as 6.2265 GiB (4 decimals, rounded down).
// Under it segments may hold (6375.94 - 232) / 2 = 3071.97 MiB: 0-10 + 64 (2880 MiB), 11-21,
// 22-32 (2816 each), 33-35 + 64 (832). RAM: 2880 MiB + 8 KiB <= 3072. The whole job is planned
// under the cap (te and VAE still fit it).
TEST(AutoFit, DiskSegmentsShrinkToTheHostRam) {
    FitRequest req;
    req.devices = {cpu(3 * GiB), gpu("CUDA0", 8 * GiB)};
    req.modules = job(8, 36, 256 * MiB, 300 * MiB);
    FitResult r = auto_fit(req);
    const FitChoice& d = choice(r, PModule::Diffusion);
    EXPECT_EQ(d.tier, Tier::Disk);
    const int ends[] = {11, 22, 33, 36};
    ASSERT_EQ(d.plan.segments.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_TRUE(d.plan.segments[i].per_eval);
        EXPECT_EQ(d.plan.segments[i].end, ends[i]);
    }
    EXPECT_EQ(d.plan.host_bytes, 2880 * MiB + 8 * 1024);
    EXPECT_LE(d.plan.host_bytes, 3 * GiB);
    EXPECT_EQ(r.flags.max_vram, "CUDA0=6.2265");
    EXPECT_EQ(r.flags.params_backend, "diffusion=disk");
    const uint64_t cap = (uint64_t)(6.2265 * (double)GiB);
    for (auto& c : r.choices) EXPECT_LE(c.plan.devices[0].total(), cap) << pmodule_name(c.module);
    // the flags reproduce the plan through the runtime planner
    std::vector<DeviceName> names{{"CPU", "cpu", false}, {"CUDA0", "gpu", false}};
    PlacementSpec spec = parse_placement(r.flags, names);
    ModulePlan again = plan_module(PModule::Diffusion, spec[PModule::Diffusion], false, req.modules[1].costs, resolve_budgets(spec, {{"CUDA0", "", "gpu", 8 * GiB, 8 * GiB}}));
    ASSERT_EQ(again.segments.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(again.segments[i].end, ends[i]);
}

// Nothing fits: 8 GiB card, 6 GiB RAM, DiT 9.06 GiB in f16 (4.86 G weights) made of two blocks of
// 4.5 GiB. Whole on the card it needs 9280 + 200 = 9480 MiB of 8192 (short 1288 MiB). Cutting it
// cannot help: a segment uploaded per evaluation (from RAM or, as above, from disk) needs two
// slots of at least one block with its non-block parameters (2 x 4672 MiB) beside the compute:
// 9576 MiB (short 1384). The CPU needs 9480 MiB of 6144 RAM. The smallest shortfall is the
// card's 1288 MiB, and q8_0 (34/32 bytes per weight instead of 2) saves 47 % of the weights:
// that is the suggestion.
TEST(AutoFit, NothingFitsNamesSmallestShortfallAndCheapestChange) {
    FitRequest req;
    req.devices = {cpu(6 * GiB), gpu("CUDA0", 8 * GiB)};
    req.modules = job(8, 2, 4608 * MiB, 300 * MiB);
    req.modules[1].param_count = (2 * 4608 * MiB + 64 * MiB) / 2;
    {
        const std::string m = oom_message(req);
        EXPECT_NE(m.find("nothing fits diffusion"), std::string::npos) << m;
        EXPECT_NE(m.find("needs 9480 MiB of CUDA0 but 8192 MiB are available (short 1288 MiB)"), std::string::npos) << m;
        EXPECT_NE(m.find("--type q8_0"), std::string::npos) << m;
    }
    // with a 1.5 GiB compute buffer at 1024x1024 (two blocks of 3840 MiB: segments need
    // 2 x 3904 + 1536 + 32 = 9376 MiB, short 1184)
    req.job.width = req.job.height = 1024;
    req.modules = job(8, 2, 3840 * MiB, 300 * MiB);
    req.modules[1].costs.measure = [](int, int, bool, bool, const std::string&) { return 1536 * MiB; };
    req.modules[1].param_count = 0;
    {
        const std::string m = oom_message(req);
        // 7744 + 1536 = 9280 MiB of 8192: short 1088; 1536 - 1088 = 448 MiB of compute -> sides x 0.54 -> 512x512
        EXPECT_NE(m.find("short 1088 MiB"), std::string::npos) << m;
        EXPECT_NE(m.find("q8_0"), std::string::npos) << m;  // weights assumed f16: q8_0 saves 3.6 GiB, cheaper than halving the sides
    }
}

// A VAE decode that would not fit whole is tiled up front with the largest tile that fits:
// 6 GiB card, decode at 128x128 latent cells needs 7 GiB; tiles of t cells need t^2 x 0.25 MiB:
// 96 -> 2304 MiB fits (the first tried below 128).
TEST(AutoFit, VaeTilingPlannedUpFront) {
    FitRequest req;
    req.devices = {cpu(32 * GiB), gpu("CUDA0", 6 * GiB)};
    req.modules = job(8, 16, 256 * MiB, 7 * GiB);
    FitModule& vae = req.modules[2];
    vae.latent_w = vae.latent_h = 128;
    vae.measure_tile = [](int t, const std::string&) { return (uint64_t)t * t * MiB / 4; };
    FitResult r = auto_fit(req);
    const FitChoice& v = choice(r, PModule::Vae);
    EXPECT_EQ(v.tier, Tier::TimeShared);
    EXPECT_EQ(v.vae_tile, 96);
    EXPECT_EQ(v.plan.devices[0].compute, 96ull * 96 * MiB / 4);
    EXPECT_NE(r.flags_line.find("--vae-tiling --vae-tile-size 96x96"), std::string::npos);
}

/// A made-up VAE encoder for FitModule::encode_costs: 140 MiB of weights outside any block and
/// the compute buffer comp(tile) (tile 0 = the whole image); each tile asked is appended to
/// `asked` when given.
static std::function<ModuleCosts(int)> encoder_costs(std::function<uint64_t(int)> comp, std::vector<int>* asked = nullptr) {
    return [comp, asked](int tile) {
        if (asked) asked->push_back(tile);
        ModuleCosts c;
        c.module = PModule::Vae;
        c.label = "VAE encoder";
        c.prologue_bytes = 140 * MiB;
        c.measure = [b = comp(tile)](int, int, bool, bool, const std::string&) { return b; };
        return c;
    };
}

// An img2img job's VAE encoder runs in its own stage under the decoder's `vae` entry, so a VAE
// placement counts only when the encoder fits it too. 6 GiB card, latent 128x128 cells:
//  - decoder whole: 160 MiB + 2 GiB compute: fits; tiles of t cells: t^2 x 0.25 MiB;
//  - encoder (140 MiB of weights) whole: 7 GiB compute: does not fit; tiles: t^2 x 0.5 MiB.
// The whole VAE is refused for its encoder; the first tile tried below the latent, 96, gives an
// encoder of 140 + 4608 MiB <= 6144 MiB: decode and encode tiled 96x96. The encode stage
// (4748 MiB) is then CUDA0's largest stage (te 2 GiB + 164 MiB, diffusion 4 GiB + 264 MiB).
TEST(AutoFit, ImageEncodeFitsTheVaePlacement) {
    FitRequest req;
    req.devices = {cpu(32 * GiB), gpu("CUDA0", 6 * GiB)};
    req.modules = job(8, 16, 256 * MiB, 2 * GiB);
    FitModule& vae = req.modules[2];
    vae.latent_w = vae.latent_h = 128;
    vae.measure_tile = [](int t, const std::string&) { return (uint64_t)t * t * MiB / 4; };
    std::vector<int> asked;
    vae.encode_costs = encoder_costs([](int t) { return t == 0 ? 7 * GiB : (uint64_t)t * t * MiB / 2; }, &asked);
    FitResult r = auto_fit(req);
    const FitChoice& v = choice(r, PModule::Vae);
    EXPECT_EQ(v.tier, Tier::TimeShared);
    EXPECT_EQ(v.vae_tile, 96);
    EXPECT_EQ(v.plan.devices[0].compute, 96ull * 96 * MiB / 4);
    ASSERT_TRUE(v.encode_plan.has_value());
    EXPECT_EQ(v.encode_plan->stage, "vae-encode");
    ASSERT_EQ(v.encode_plan->devices.size(), 1u);
    EXPECT_EQ(v.encode_plan->devices[0].device, "CUDA0");
    EXPECT_EQ(v.encode_plan->devices[0].params, 140 * MiB);
    EXPECT_EQ(v.encode_plan->devices[0].compute, 96ull * 96 * MiB / 2);
    ASSERT_GE(asked.size(), 2u);
    EXPECT_EQ(asked[0], 0);  // whole first, then tiles
    EXPECT_EQ(asked.back(), 96);
    EXPECT_EQ(r.predicted_peak.at("CUDA0"), 140 * MiB + 96ull * 96 * MiB / 2);
    // plans(): the modules' plans, then the encode stage's
    const auto plans = r.plans();
    ASSERT_EQ(plans.size(), 4u);
    EXPECT_EQ(plans[3].stage, "vae-encode");
    EXPECT_EQ(device_peaks(plans).at("CUDA0"), r.predicted_peak.at("CUDA0"));
    EXPECT_NE(r.flags_line.find("--vae-tiling --vae-tile-size 96x96"), std::string::npos);
}

// When the encoder fits no tile either, nothing fits the VAE and the message says it is the
// encoder: 6 GiB card, encoder compute 7 GiB whole and 8 GiB at any tile (a made-up encoder whose
// buffer does not shrink), the decoder alone would fit whole.
TEST(AutoFit, ImageEncodeThatFitsNowhereIsNamed) {
    FitRequest req;
    req.devices = {gpu("CUDA0", 6 * GiB)};
    req.modules = job(8, 16, 256 * MiB, 2 * GiB);
    FitModule& vae = req.modules[2];
    vae.latent_w = vae.latent_h = 128;
    vae.measure_tile = [](int t, const std::string&) { return (uint64_t)t * t * MiB / 4; };
    vae.encode_costs = encoder_costs([](int t) { return t == 0 ? 7 * GiB : 8 * GiB; });
    {
        const std::string msg = oom_message(req);
        EXPECT_NE(msg.find("nothing fits vae"), std::string::npos) << msg;
        EXPECT_NE(msg.find("its encoder"), std::string::npos) << msg;
        // the closest miss: the whole encoder, 140 MiB + 7 GiB against 6 GiB
        EXPECT_NE(msg.find("needs 7308 MiB of CUDA0 but 6144 MiB are available"), std::string::npos) << msg;
    }
}

// A VAE pinned to a device list that cannot hold it: the message blames the user's entry and
// names the way out (drop the entry, another order, tiling), not a --type that cannot shrink a
// VAE. Two 1 GiB cards; a VAE of blocks of 700 and 100 MiB with a 400 MiB compute buffer: its
// total (1200 MiB) is below the two budgets (2048 MiB), so no shortfall is known, but the device
// holding the 700 MiB block needs 1100 MiB > 1024 in any split.
TEST(AutoFit, PinnedVaeListThatCannotHoldItBlamesTheEntry) {
    FitRequest req;
    req.devices = {gpu("CUDA0", 1 * GiB), gpu("CUDA1", 1 * GiB)};
    req.modules = {module(PModule::Vae, 2, 100 * MiB, 0, 400 * MiB, 0, 1)};
    req.modules[0].costs.block_bytes[0] = 700 * MiB;
    req.pinned_devices[(size_t)PModule::Vae] = {"CUDA0", "CUDA1"};
    {
        const std::string msg = oom_message(req);
        EXPECT_NE(msg.find("nothing fits vae"), std::string::npos) << msg;
        EXPECT_NE(msg.find("--backend"), std::string::npos) << msg;
        EXPECT_EQ(msg.find("quantised --type"), std::string::npos) << msg;
    }
}

// Explicit --backend entries are kept: te pinned to the CPU stays there while the planner
// fills in the rest (diffusion and VAE resident on the card).
TEST(AutoFit, ExplicitEntriesAreKept) {
    FitRequest req;
    req.devices = {cpu(32 * GiB), gpu("CUDA0", 24 * GiB)};
    req.modules = job(16, 28, 256 * MiB, 300 * MiB);
    req.pinned_devices[(size_t)PModule::Te] = {"CPU"};
    FitResult r = auto_fit(req);
    EXPECT_EQ(choice(r, PModule::Te).plan.devices[0].device, "CPU");
    EXPECT_EQ(choice(r, PModule::Te).tier, Tier::Cpu);
    EXPECT_EQ(choice(r, PModule::Diffusion).plan.devices[0].device, "CUDA0");
    EXPECT_EQ(r.flags.backend, "te=CPU,diffusion=CUDA0,vae=CUDA0");
    // an unknown pinned device is an error, not a silent override
    req.pinned_devices[(size_t)PModule::Te] = {"CUDA7"};
    EXPECT_THROW(auto_fit(req), Error);
}

// Two modules of one stage (FLUX.1: T5 4 GiB and CLIP-L 0.25 GiB are both te; the runtime gives
// them one placement, loads them together and plans CLIP in what T5 leaves of each budget,
// placement::plan_modules). With a 5 GiB card both fit whole (4.1 + 0.35 GiB with compute):
// one te entry, CUDA0's predicted peak is their sum. With 4.3 GiB, T5 alone would fit whole
// (the control: tier 2), the pair does not: with weights in RAM T5 is staged whole (4.1 GiB)
// and CLIP-L runs in segments in the 207 MiB left (tier 3), or te goes to the CPU; either way
// both share one placement and the runtime's planning of the flags keeps the stage within the
// budget, where planning each module alone would have put both whole on CUDA0 and failed.
TEST(AutoFit, ModulesOfOneStageShareAPlacementAndTheirSumFits) {
    FitModule t5 = module(PModule::Te, 24, 4 * GiB / 24, 0, 100 * MiB, 8 * MiB, 2);
    FitModule clip = module(PModule::Te, 12, 256 * MiB / 12, 0, 100 * MiB, 1 * MiB, 2);
    FitModule dit = module(PModule::Diffusion, 8, 64 * MiB, 16 * MiB, 200 * MiB, 16 * MiB, 40);
    FitRequest req;
    req.devices = {cpu(32 * GiB), gpu("CUDA0", 5 * GiB)};
    req.modules = {t5, clip, dit};
    FitResult roomy = auto_fit(req);
    ASSERT_EQ(roomy.choices.size(), 3u);
    for (int i : {0, 1}) {
        ASSERT_EQ(roomy.choices[(size_t)i].plan.segments.size(), 1u) << i;
        EXPECT_EQ(roomy.choices[(size_t)i].plan.segments[0].device, "CUDA0") << i;
    }
    const uint64_t pair = roomy.choices[0].plan.devices[0].total() + roomy.choices[1].plan.devices[0].total();
    EXPECT_EQ(pair, params(t5) + 100 * MiB + params(clip) + 100 * MiB);  // each whole: weights + compute
    EXPECT_GE(roomy.predicted_peak.at("CUDA0"), pair);
    EXPECT_EQ(roomy.flags.backend.find("te="), roomy.flags.backend.rfind("te=")) << roomy.flags.backend;  // one entry

    req.devices = {cpu(32 * GiB), gpu("CUDA0", GiB * 43 / 10)};
    req.modules = {t5, dit};
    EXPECT_EQ(choice(auto_fit(req), PModule::Te).tier, Tier::TimeShared);  // T5 alone fits
    req.modules = {t5, clip, dit};
    FitResult tight = auto_fit(req);
    // whatever the tier, the two share one placement, one flags entry, and together fit
    const FitChoice &a = tight.choices[0], &b = tight.choices[1];
    EXPECT_EQ(a.tier, b.tier);
    EXPECT_EQ(a.plan.params_location, b.plan.params_location);
    ASSERT_FALSE(a.plan.segments.empty());
    ASSERT_FALSE(b.plan.segments.empty());
    EXPECT_EQ(a.plan.segments[0].device, b.plan.segments[0].device);
    EXPECT_NE(a.tier, Tier::TimeShared) << "T5 + CLIP-L whole do not fit 4.3 GiB together";
    EXPECT_EQ(tight.flags.backend.find("te="), tight.flags.backend.rfind("te=")) << tight.flags.backend;
    if (a.plan.segments[0].device == "CUDA0") {
        // weights in RAM (tier 3): T5 staged whole (4096 + 100 MiB), CLIP-L in segments in the rest
        EXPECT_EQ(a.tier, Tier::HostStreamed);
        EXPECT_LE(a.plan.devices[0].total() + b.plan.devices[0].total(), GiB * 43 / 10);
        EXPECT_GE(tight.predicted_peak.at("CUDA0"), a.plan.devices[0].total() + b.plan.devices[0].total());
    }
    expect_round_trip(tight, req.devices);
    // and the runtime's own planning of those flags keeps the stage within CUDA0's budget
    PlacementSpec spec = parse_placement(tight.flags, {{"CPU", "cpu", false}, {"CUDA0", "gpu", false}});
    std::vector<ModuleCosts> costs{t5.costs, clip.costs, dit.costs};
    costs[0].module = costs[1].module = PModule::Te;
    EXPECT_NO_THROW(plan_modules(spec, costs, {{"CUDA0", GiB * 43 / 10}}));
    // planned alone each te module fits CUDA0 whole, together they do not: the stage check catches it
    PlacementFlags bf;
    bf.backend = "te=CUDA0,diffusion=CUDA0";
    PlacementSpec both = parse_placement(bf, {{"CPU", "cpu", false}, {"CUDA0", "gpu", false}});
    EXPECT_THROW(plan_modules(both, costs, {{"CUDA0", GiB * 43 / 10}}), Error);
}

// The measurement cache answers a repeated measurement from its file.
TEST(AutoFit, MeasureCacheAnswersFromDisk) {
    const auto dir = std::filesystem::temp_directory_path() / (std::string("easel_autofit_cache_") + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    int calls = 0;
    auto measure = [&](int b, int e, bool, bool, const std::string&) -> uint64_t {
        ++calls;
        return (uint64_t)(e - b) * 1000;
    };
    {
        MeasureCache c(dir, {"model.safetensors", "diffusion", "64x64"});
        auto m = c.wrap(measure);
        EXPECT_EQ(m(0, 3, true, false, "CPU"), 3000u);
        EXPECT_EQ(m(0, 3, true, false, "CPU"), 3000u);
        EXPECT_EQ(calls, 1);
    }
    {
        MeasureCache c(dir, {"model.safetensors", "diffusion", "64x64"});
        auto m = c.wrap(measure);
        EXPECT_EQ(m(0, 3, true, false, "CPU"), 3000u);
        EXPECT_EQ(calls, 1);
        EXPECT_EQ(c.hits(), 1);
        MeasureCache other(dir, {"model.safetensors", "diffusion", "128x128"});  // another shape: another file
        EXPECT_EQ(other.wrap(measure)(0, 3, true, false, "CPU"), 3000u);
        EXPECT_EQ(calls, 2);
    }
    // a device's bandwidth is remembered the same way, so a second plan sees the same figure
    int bw_calls = 0;
    {
        MeasureCache bw(dir, {"autofit-bandwidth-v1", "RPC0", "127.0.0.1:50052"});
        EXPECT_EQ(bw.value("h2d_bytes_per_s", [&] { ++bw_calls; return uint64_t{123456789}; }), 123456789u);
    }
    {
        MeasureCache bw(dir, {"autofit-bandwidth-v1", "RPC0", "127.0.0.1:50052"});
        EXPECT_EQ(bw.value("h2d_bytes_per_s", [&] { ++bw_calls; return uint64_t{999}; }), 123456789u);
        EXPECT_EQ(bw_calls, 1);
    }
    std::filesystem::remove_all(dir);
}
