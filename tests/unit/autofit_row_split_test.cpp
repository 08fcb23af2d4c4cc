// --auto-fit with --split-mode row (placement/autofit.h FitRequest::split): a device list the
// planner chooses (or a pinned one) is planned as a row split where the module can be row split,
// with the row split's per-device costs (placement::plan_row_split), else as a layer split with
// a warning; the flags say `--split-mode M=row` for the row-split modules only. Synthetic
// modules first (expected plans and the arithmetic written down), then the tiny Z-Image
// pipeline (Qwen3 te with flash attention, DiT; F32 weights) auto-fitted over two easel
// rpc-servers on 127.0.0.1 (tests/unit/rpc_servers.h: ports the OS hands out) and run
// under the plan's flags: outputs within 1e-5 of the unplaced family, every RPC device's measured
// peak within 10% of the plan's prediction and under auto-fit's.
#include "core/error.h"
#include "models/family.h"
#include "placement/autofit.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "placement/row_split.h"
#include "placement/spec.h"
#include "autofit_test_support.h"
#include "row_split_test_support.h"
#include "rpc_servers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

using namespace easel;
using namespace easel::placement;

namespace {

using test_support::fit_choice;
using test_support::fit_device;
using test_support::max_abs_diff;

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;
constexpr double kMiB = 1024.0 * 1024.0;

/// A DiT-like module: `n` blocks of `block` bytes, `pro` outside them, a `comp`-byte compute
/// buffer for any graph, `state` bytes between blocks; row-split rules allowing `max_devices`
/// devices (0: no rules; `why_not`: rules that refuse), each device holding 1/n of every block.
FitModule module(PModule m, int n, uint64_t block, uint64_t pro, uint64_t comp, uint64_t state, int64_t max_devices,
                 const std::string& why_not = "") {
    FitModule f = test_support::fit_module(m, n, block, pro, comp, state);
    if (max_devices > 0 || !why_not.empty()) {
        auto r = std::make_shared<RowSplitRules>();
        r->module = "synthetic DiT";
        r->why_not = why_not;
        r->max_devices = max_devices;
        r->max_devices_param = "blocks.0.attn.to_k.weight";
        f.costs.row_split = r;
        if (why_not.empty())
            f.costs.row_split_bytes = [n, block](size_t k) { return std::vector<uint64_t>(k, (uint64_t)n * block / k); };
    }
    f.evals = 20;
    return f;
}

std::vector<DeviceName> names_of(const std::vector<FitDevice>& devs) {
    std::vector<DeviceName> v;
    for (auto& d : devs) v.push_back({d.name, d.type, false});
    return v;
}

/// The machine of the synthetic tests: two 6 GiB cards and 4 GiB of RAM, so that a 7 GiB DiT
/// fits neither card whole (tier 2) nor RAM (tier 3): tier 4.
std::vector<FitDevice> pair_6_6() { return {fit_device("CPU", "cpu", 4 * GiB), fit_device("CUDA0", "gpu", 6 * GiB), fit_device("CUDA1", "gpu", 6 * GiB)}; }

}  // namespace

// DiT 28 x 256 MiB + 64 MiB, compute 200 MiB, state 16 MiB, rules for up to 8 devices, and
// --split-mode diffusion=row: tier 4 as a row split over CUDA0&CUDA1 (plan_row_split): each card
// holds half of every block (3584 MiB), the blocks graph's compute buffer (200) and one
// all-reduce staging tensor (16, one step for two devices); CUDA0 adds the prologue/epilogue
// weights (64) and their compute (200): 4064 MiB on CUDA0, 3800 on CUDA1, both under 6144. The
// flags name it (`--split-mode "diffusion=row"`) and parse back to the same plan.
TEST(AutoFitRowSplit, RowSplitPlannedInTheSplitTier) {
    FitRequest req;
    req.devices = pair_6_6();
    req.modules = {module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 200 * MiB, 16 * MiB, 8)};
    // a bare `--split-mode row` names every module; the flags keep it only for the row-split
    // module (the others are not planned here and name no device list)
    req.split.fill(SplitMode::Row);
    FitResult r = auto_fit(req);
    const FitChoice& d = fit_choice(r, PModule::Diffusion);
    EXPECT_EQ(d.tier, Tier::LayerSplit);
    EXPECT_TRUE(d.row_split);
    ASSERT_EQ(d.plan.segments.size(), 3u);
    EXPECT_EQ(d.plan.segments[1].device, "CUDA0&CUDA1");
    ASSERT_EQ(d.plan.devices.size(), 2u);
    EXPECT_EQ(d.plan.devices[0].total(), (3584 + 64 + 200 + 16 + 200) * MiB);
    EXPECT_EQ(d.plan.devices[1].total(), (3584 + 200 + 16) * MiB);
    EXPECT_EQ(r.predicted_peak.at("CUDA0"), (3584 + 64 + 200 + 16 + 200) * MiB);
    EXPECT_EQ(r.flags.backend, "diffusion=CUDA0&CUDA1");
    EXPECT_EQ(r.flags.split_mode, "diffusion=row");
    EXPECT_NE(r.flags_line.find("--split-mode \"diffusion=row\""), std::string::npos) << r.flags_line;
    EXPECT_TRUE(r.warnings.empty());
    // the flags give the runtime the same plan
    const PlacementSpec spec = parse_placement(r.flags, names_of(req.devices));
    EXPECT_EQ(spec[PModule::Diffusion].split, SplitMode::Row);
    std::map<std::string, uint64_t> budgets{{"CUDA0", 6 * GiB}, {"CUDA1", 6 * GiB}};
    const ModulePlan again = plan_module(PModule::Diffusion, spec[PModule::Diffusion], false, req.modules[0].costs, budgets);
    ASSERT_EQ(again.devices.size(), 2u);
    EXPECT_EQ(again.segments[1].device, "CUDA0&CUDA1");
    EXPECT_EQ(again.devices[0].total(), d.plan.devices[0].total());
    EXPECT_EQ(again.devices[1].total(), d.plan.devices[1].total());
    // the same job without --split-mode row: a layer split, no --split-mode in the flags
    req.split[(size_t)PModule::Diffusion] = SplitMode::Layer;
    FitResult l = auto_fit(req);
    EXPECT_FALSE(fit_choice(l, PModule::Diffusion).row_split);
    EXPECT_EQ(fit_choice(l, PModule::Diffusion).plan.segments[0].device, "CUDA0");
    EXPECT_TRUE(l.flags.split_mode.empty());
}

// The cost model of a row split: each member computes half of the blocks (the slower one sets
// the pace) and the two row-role matmuls of each block all-reduce a hidden state over the slower
// link. With F = 1e14 FLOPs per evaluation, 20 evaluations, 2e13 FLOP/s and 12 GB/s on both:
//   load (disk, 1 GB/s): the 7168 MiB of blocks (the meta buffer) + 64 MiB of the rest, read once
//   per eval: compute of the blocks 1e14 x 7168/7296 / (2 x 2e13) + of the prologue and epilogue
//             graphs 1e14 x 128/7296 / 2e13, + all-reduce 28 blocks x 2 x 16 MiB x 2 / 12e9
// (the shares of the FLOPs by parameter bytes of the three segments: 7168, 64, 64 of 7296).
TEST(AutoFitRowSplit, RowSplitSecondsCountHalfTheComputeAndTheAllReduce) {
    FitRequest req;
    req.devices = pair_6_6();
    for (auto& d : req.devices) {
        d.flops = 2e13;
        d.h2d_bytes_per_s = 12e9;
    }
    req.modules = {module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 200 * MiB, 16 * MiB, 8)};
    req.modules[0].flops_per_eval = 1e14;
    req.split[(size_t)PModule::Diffusion] = SplitMode::Row;
    FitResult r = auto_fit(req);
    ASSERT_TRUE(fit_choice(r, PModule::Diffusion).row_split);
    const double load = (7168.0 + 64 + 64) * MiB / 1e9;
    const double per_eval = 1e14 * 7168 / 7296 / (2 * 2e13) + 1e14 * 128 / 7296 / 2e13 + 28 * 2 * 16.0 * MiB * 2 / 12e9;
    // (the prologue and epilogue segments each load the 64 MiB of non-block weights: the runtime
    // shares one copy, the cost model reads it twice: 0.07 s of 50 s)
    EXPECT_NEAR(fit_choice(r, PModule::Diffusion).seconds, load + 20 * per_eval, 1e-9 * (load + 20 * per_eval));
}

// Where the row split cannot apply the planner falls back to a layer split over the same devices
// with one warning naming why, and the flags carry no --split-mode row (the runtime would
// otherwise row split what the plan made a layer split):
//  * rules that refuse (e.g. grouped-query attention): their reason;
//  * more devices than whole heads (max_devices 1 for two cards);
//  * a module without rules;
//  * a row split that does not fit: with a 2000 MiB compute buffer each card holds the whole
//    blocks graph's buffer, CUDA0 also the prologue's: 3584 + 64 + 2000 + 16 + 2000 = 7664 MiB >
//    6144, while the layer split's CUDA0 needs 14 blocks (3584) + 64 + 2000 = 5648 MiB (its one
//    segment hands the state to CUDA1: no state buffer kept on the device).
TEST(AutoFitRowSplit, FallsBackToLayerSplitWithAWarning) {
    struct Case {
        const char* name;
        FitModule m;
        std::string why;
    };
    std::vector<Case> cases = {
        {"rules refuse", module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 200 * MiB, 16 * MiB, 0, "grouped-query attention (GQA)"),
         "grouped-query attention (GQA)"},
        {"too few heads", module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 200 * MiB, 16 * MiB, 1),
         "blocks.0.attn.to_k.weight cuts into only 1 whole slices (heads) for 2 devices"},
        {"no rules", module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 200 * MiB, 16 * MiB, 0), "this module has no row-split rules"},
        {"does not fit", module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 2000 * MiB, 16 * MiB, 8),
         "no row split over the candidate devices fits their budgets"},
    };
    for (auto& c : cases) {
        FitRequest req;
        req.devices = pair_6_6();
        req.modules = {c.m};
        req.split[(size_t)PModule::Diffusion] = SplitMode::Row;
        FitResult r = auto_fit(req);
        const FitChoice& d = fit_choice(r, PModule::Diffusion);
        EXPECT_EQ(d.tier, Tier::LayerSplit) << c.name;
        EXPECT_FALSE(d.row_split) << c.name;
        ASSERT_EQ(d.plan.devices.size(), 2u) << c.name;
        EXPECT_EQ(d.plan.segments[0].device, "CUDA0") << c.name;
        EXPECT_TRUE(r.flags.split_mode.empty()) << c.name << ": " << r.flags.split_mode;
        ASSERT_EQ(r.warnings.size(), 1u) << c.name;
        EXPECT_NE(r.warnings[0].find("--split-mode row for diffusion"), std::string::npos) << r.warnings[0];
        EXPECT_NE(r.warnings[0].find(c.why), std::string::npos) << c.name << ": " << r.warnings[0];
        EXPECT_NE(r.warnings[0].find("auto-fit plans a layer split"), std::string::npos) << r.warnings[0];
        if (std::string(c.name) == "does not fit") { EXPECT_EQ(d.plan.devices[0].total(), (3584 + 64 + 2000) * MiB); }
    }
}

// A module that fits one card whole is not split: --split-mode row changes nothing and says so.
TEST(AutoFitRowSplit, OneDeviceNeedsNoSplit) {
    FitRequest req;
    req.devices = {fit_device("CPU", "cpu", 4 * GiB), fit_device("CUDA0", "gpu", 24 * GiB), fit_device("CUDA1", "gpu", 24 * GiB)};
    req.modules = {module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 200 * MiB, 16 * MiB, 8)};
    req.split[(size_t)PModule::Diffusion] = SplitMode::Row;
    FitResult r = auto_fit(req);
    EXPECT_EQ(fit_choice(r, PModule::Diffusion).plan.devices.size(), 1u);
    EXPECT_TRUE(r.flags.split_mode.empty());
    bool said = false;
    for (auto& l : r.reasons) said |= l.find("--split-mode row not needed") != std::string::npos;
    EXPECT_TRUE(said);
}

// ---------------------------------------------------------------- the tiny Z-Image over two rpc-servers

namespace {

const std::filesystem::path kRef = std::filesystem::path(EASEL_TEST_DATA) / "reference";

easel::test_support::RpcServers& rpc() {
    static easel::test_support::RpcServers s(2);
    return s;
}

models::FamilyOptions options(std::shared_ptr<const PlacementSpec> spec) {
    models::FamilyOptions fo;
    fo.threads = 1;
    fo.placement = std::move(spec);
    fo.weight_type = "f32";  // F32 matmuls: the row split's own rounding only (~1e-7)
    fo.flash_attn_te = true;  // the Qwen3 te row-splits only with flash attention
    return fo;
}

models::ModelFiles zimage_files() {
    models::ModelFiles files;
    files.model = (kRef / "zimage_tiny" / "diffusers").string();
    return files;
}

struct ZOut {
    std::vector<float> ctx_pos, ctx_neg, v_pos, v_neg;
};

/// Two prompts' contexts and two DiT evaluations (the positive and the negative caption).
ZOut run(models::Family& fam) {
    ZOut o;
    auto pos = fam.encode_prompt("a red cat on a mat", 0);
    auto neg = fam.encode_prompt("blurry", 0);
    o.ctx_pos = pos.context;
    o.ctx_neg = neg.context;
    fam.unload(models::Module::Te);
    const int64_t C = 16, h = 8, w = 8;
    std::vector<float> x((size_t)(C * h * w));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * (float)i);
    o.v_pos.resize(x.size());
    o.v_neg.resize(x.size());
    fam.diffusion(x, {}, h, w, 700.0, pos, o.v_pos);
    fam.diffusion(x, {}, h, w, 700.0, neg, o.v_neg);
    return o;
}

}  // namespace

// `--backend "te=RPC0&RPC1,diffusion=RPC0&RPC1" --split-mode row --auto-fit` on the tiny Z-Image
// (64 x 64 px: an 8 x 8 latent), as apps/cli/autofit_cli.cpp builds the request: the family's
// costs at the job's shapes, the two RPC devices with their free memory. Expected: te (Qwen3,
// one kv head: K/V mirrored, query heads split) and DiT (heads) planned as row splits, the flags
// `--split-mode "te=row,diffusion=row"`; run under those flags, contexts and velocities within
// 1e-5 of the unplaced family (and not equal: the row split's own rounding), each RPC device's
// measured peak within 10% of the plan the flags give at the real prompt lengths, and at most
// auto-fit's prediction (planned at the longest prompt, 512 tokens).
TEST(AutoFitRowSplit, ZImageTeAndDitOverTwoRpcServers) {
    auto& r = rpc();
    ASSERT_EQ(r.devices.size(), 2u) << "rpc-servers did not come up";
    auto plain = models::open_family(zimage_files(), options(nullptr));
    const ZOut ref = run(*plain);

    FitRequest req;
    for (auto& d : list_devices()) {
        if (d.type != "cpu" && std::find(r.devices.begin(), r.devices.end(), d.name) == r.devices.end()) continue;
        FitDevice fd;
        fd.name = d.name;
        fd.type = d.type;
        fd.budget = d.type == "cpu" ? 0 : (d.free_bytes ? d.free_bytes : 8 * GiB);
        req.devices.push_back(fd);
    }
    auto probe = models::open_family(zimage_files(), options(nullptr));
    for (auto& c : probe->placement_costs(8, 8)) {
        if (c.module == PModule::Vae) continue;  // (the VAE is not run here)
        FitModule m;
        m.module = c.module;
        m.costs = c;
        m.evals = 2;  // (two prompts / two DiT evaluations, as run() does)
        req.modules.push_back(std::move(m));
    }
    for (PModule m : {PModule::Te, PModule::Diffusion}) {
        req.pinned_devices[(size_t)m] = r.devices;
        req.split[(size_t)m] = SplitMode::Row;
    }
    FitResult fit = auto_fit(req);
    std::printf("[auto-fit row split]\n%s", format_fit(fit).c_str());
    EXPECT_TRUE(fit.warnings.empty()) << fit.warnings[0];
    EXPECT_TRUE(fit_choice(fit, PModule::Te).row_split);
    EXPECT_TRUE(fit_choice(fit, PModule::Diffusion).row_split);
    EXPECT_EQ(fit.flags.split_mode, "te=row,diffusion=row");

    PlacementFlags flags = fit.flags;
    flags.backend = "default=CPU," + flags.backend;  // (the VAE on the CPU, as the unplaced family)
    auto spec = std::make_shared<PlacementSpec>(parse_placement(flags, device_names()));
    auto fam = models::open_family(zimage_files(), options(spec));
    const ZOut o = run(*fam);
    const float d_ctx = std::max(max_abs_diff(o.ctx_pos, ref.ctx_pos), max_abs_diff(o.ctx_neg, ref.ctx_neg));
    const float d_v = std::max(max_abs_diff(o.v_pos, ref.v_pos), max_abs_diff(o.v_neg, ref.v_neg));
    const auto plans = fam->placement_plans();
    std::printf("[auto-fit row split] contexts max abs diff %.3g, velocities %.3g vs the unplaced family\n%s%s", d_ctx, d_v,
                format_plan(plans).c_str(), format_peaks(plans, fam->placement_peaks()).c_str());
    EXPECT_LE(d_ctx, 1e-5f);
    EXPECT_LE(d_v, 1e-5f);
    EXPECT_GT(d_v, 0.0f) << "expected the row split's own rounding, not the layer-split path";
    for (auto& p : plans) {
        bool meta = false;
        for (auto& sg : p.segments) meta |= is_row_split_device(sg.device);
        EXPECT_TRUE(meta) << pmodule_name(p.module) << " did not run as a row split";
    }
    const auto predicted = device_peaks(plans);
    const auto measured = fam->placement_peaks();
    for (auto& name : r.devices) {
        ASSERT_TRUE(predicted.count(name) && measured.count(name)) << name;
        const double m = (double)measured.at(name), p = (double)predicted.at(name), a = (double)fit.predicted_peak.at(name);
        std::printf("[auto-fit row split] %s: measured %.3f MiB, plan %.3f MiB (%+.1f%%), auto-fit %.3f MiB\n", name.c_str(), m / kMiB,
                    p / kMiB, 100.0 * (m - p) / p, a / kMiB);
        EXPECT_LE(m, 1.1 * p) << name;
        EXPECT_GE(m, 0.9 * p) << name;
        EXPECT_LE(m, a) << name;
    }
}
