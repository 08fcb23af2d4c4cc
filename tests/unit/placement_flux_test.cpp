// Placement of the FLUX families (models::flux::Flux1: T5 + CLIP-L text encoders and the FLUX.1
// DiT; models::flux::Flux2Klein: the Qwen3 text encoder and the FLUX.2 DiT; both: the
// AutoencoderKL decoder, vae::PlacedVaeDecoder) with the tiny
// reference pipelines (tests/data/reference/{flux1_tiny,klein_tiny}): run over CPU + two
// `easel rpc-server`s on 127.0.0.1 (layer split, weights in RAM / on disk, streamed and
// --max-vram segments under a cap) they give bitwise the outputs of the same family without
// placement (the same ggml ops on the same CPU; states cross devices as raw bytes), with every
// device's measured peak within 10% of the plan's prediction; --split-mode row of the DiTs
// (ggml's meta device over both RPC devices, F32 weights) stays within 1e-5 of the CPU run;
// Family::placement_costs matches the parameters the family loads.
#include "core/error.h"
#include "models/family.h"
#include "models/flux/flux1.h"
#include "models/flux/flux2_klein.h"
#include "models/flux/flux_row_split.h"
#include "models/vae/host_tensor.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "placement/row_split.h"
#include "placement/spec.h"
#include "rpc_servers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

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
                                                        const std::string& max_vram = "", bool stream = false,
                                                        const std::string& split = "") {
    placement::PlacementFlags f;
    // modules the spec leaves out run on the CPU, as the unplaced family they are compared with does
    f.backend = backend.find('=') == std::string::npos ? backend : "default=CPU," + backend;
    f.params_backend = params;
    f.max_vram = max_vram;
    f.stream_layers = stream;
    f.split_mode = split;
    return std::make_shared<placement::PlacementSpec>(placement::parse_placement(f, placement::device_names()));
}

enum class Fam { Flux1, Klein };

models::ModelFiles files_of(Fam f) {
    models::ModelFiles files;
    files.model = (kRef / (f == Fam::Flux1 ? "flux1_tiny" : "klein_tiny") / "diffusers").string();
    return files;
}

/// Everything a job computes that placement may touch: the contexts (and FLUX.1's pooled
/// vectors) of two prompts, and DiT evaluations for both at two timesteps.
struct Out {
    std::vector<float> ctx_pos, ctx_neg, pooled_pos, v_pos, v_neg, v_pos2, image;
};

/// decode: also decode the first velocity as a latent (the VAE decoder under the plan).
Out run_family(Fam f, std::shared_ptr<const placement::PlacementSpec> spec, std::unique_ptr<models::Family>* hold = nullptr,
               const std::string& type = "", bool decode = false) {
    models::FamilyOptions fo;
    fo.threads = 1;
    fo.placement = spec;
    fo.weight_type = type;
    auto fam = models::open_family(files_of(f), fo);
    Out o;
    auto pos = fam->encode_prompt("a red cat on a mat", 0);
    auto neg = fam->encode_prompt("blurry", 0);
    o.ctx_pos = pos.context;
    o.ctx_neg = neg.context;
    o.pooled_pos = pos.pooled;
    fam->unload(models::Module::Te);
    const int64_t C = fam->latent_format().channels;
    const int64_t h = f == Fam::Flux1 ? 8 : 4, w = f == Fam::Flux1 ? 6 : 3;  // 64x48 pixels
    std::vector<float> x((size_t)(C * h * w));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * (float)i);
    o.v_pos.resize(x.size());
    o.v_neg.resize(x.size());
    o.v_pos2.resize(x.size());
    fam->diffusion(x, {}, h, w, 700.0, pos, o.v_pos);
    fam->diffusion(x, {}, h, w, 700.0, neg, o.v_neg);
    fam->diffusion(x, {}, h, w, 300.0, pos, o.v_pos2);  // a second step on the same plan
    if (decode) {  // the DiT stays loaded (its plan is reported while loaded)
        vae::HostTensor lat(1, C, h, w);
        std::copy(o.v_pos.begin(), o.v_pos.end(), lat.data.begin());
        o.image = fam->decode(lat, {}).data;
    }
    if (hold) *hold = std::move(fam);
    return o;
}

/// Every device's measured peak within 10% of the plans' prediction (per-stage accounting:
/// FLUX.1's T5 and CLIP are one stage) and within its budget.
void expect_peaks_near_prediction(const models::Family& fam, const std::string& what) {
    auto plans = fam.placement_plans();
    ASSERT_FALSE(plans.empty()) << what;
    auto predicted = placement::device_peaks(plans);
    auto measured = fam.placement_peaks();
    for (auto& [d, p] : predicted) {
        ASSERT_TRUE(measured.count(d)) << what << ": no measured peak on " << d;
        const double m = (double)measured.at(d);
        std::printf("[flux placement] %s: %s measured %.3f MiB, predicted %.3f MiB\n", what.c_str(), d.c_str(), m / kMiB, (double)p / kMiB);
        EXPECT_LE(m, 1.1 * (double)p) << what << " on " << d;
        EXPECT_GE(m, 0.9 * (double)p) << what << " on " << d;
        for (auto& pl : plans)
            for (auto& u : pl.devices)
                if (u.device == d && u.budget) { EXPECT_LE(m, (double)u.budget) << what << " on " << d; }
    }
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

void expect_bitwise(const Out& o, const Out& plain, const std::string& name) {
    EXPECT_EQ(o.ctx_pos, plain.ctx_pos) << name;
    EXPECT_EQ(o.ctx_neg, plain.ctx_neg) << name;
    EXPECT_EQ(o.pooled_pos, plain.pooled_pos) << name;
    EXPECT_EQ(o.v_pos, plain.v_pos) << name;
    EXPECT_EQ(o.v_neg, plain.v_neg) << name;
    EXPECT_EQ(o.v_pos2, plain.v_pos2) << name;
    EXPECT_EQ(o.image, plain.image) << name;
}

const char* fam_name(Fam f) { return f == Fam::Flux1 ? "FLUX.1" : "Klein"; }

}  // namespace

// ---------------------------------------------------------------- costs

TEST(PlacementFlux, CostsMatchTheLoadedParameters) {
    for (Fam f : {Fam::Flux1, Fam::Klein}) {
        models::FamilyOptions fo;
        fo.threads = 1;
        auto fam = models::open_family(files_of(f), fo);
        auto costs = fam->placement_costs(8, 6);
        // FLUX.1: T5 and CLIP (both te, one stage); Klein: Qwen3; then the DiT and the VAE decoder
        ASSERT_EQ(costs.size(), f == Fam::Flux1 ? 4u : 3u) << fam_name(f);
        const size_t n_te = costs.size() - 2;
        for (size_t i = 0; i < n_te; ++i) EXPECT_EQ(costs[i].module, PModule::Te) << fam_name(f);
        EXPECT_EQ(costs.back().module, PModule::Vae);
        const auto& dc = costs[n_te];
        EXPECT_EQ(dc.module, PModule::Diffusion);
        int64_t blocks = 0, n_double = 0, hidden = 0;
        if (auto* f1 = dynamic_cast<models::flux::Flux1*>(fam.get())) {
            blocks = f1->dit_config().n_double + f1->dit_config().n_single;
            n_double = f1->dit_config().n_double;
            hidden = f1->dit_config().hidden;
        }
        if (auto* k = dynamic_cast<models::flux::Flux2Klein*>(fam.get())) {
            blocks = k->dit_config().n_double + k->dit_config().n_single;
            n_double = k->dit_config().n_double;
            hidden = k->dit_config().hidden;
        }
        ASSERT_GT(n_double, 0) << fam_name(f);
        ASSERT_GE(blocks - n_double, 2) << fam_name(f) << ": the checks below need two single blocks";
        EXPECT_EQ((int64_t)dc.block_bytes.size(), blocks) << fam_name(f);
        const uint64_t dit = std::accumulate(dc.block_bytes.begin(), dc.block_bytes.end(), dc.prologue_bytes);
        fam->load(models::Module::Diffusion);
        EXPECT_EQ((double)dit, (double)fam->param_bytes(models::Module::Diffusion)) << fam_name(f);
        EXPECT_GT(dc.measure(0, (int)dc.block_bytes.size(), true, true, "CPU"), 0u);
        // the state entering the first single block holds the image and text streams apart (the
        // last double block's outputs); from there on the joint stream [txt; img] replaces them:
        // the same bytes, not both. Both streams are F32 [hidden, tokens]: the image tokens (FLUX.1
        // packs the 8x6 latent 2x2: 12; FLUX.2's latent is patchified already: 48) and the 512 text
        // tokens, beside the time embedding / modulations and the rotary tables.
        const int64_t img_tokens = f == Fam::Flux1 ? 12 : 48;
        const uint64_t streams = (uint64_t)hidden * (img_tokens + 512) * sizeof(float);
        EXPECT_EQ(dc.state_bytes(n_double), dc.state_bytes(n_double + 1)) << fam_name(f);
        EXPECT_EQ(dc.state_bytes(1), dc.state_bytes(n_double)) << fam_name(f);
        EXPECT_GT(dc.state_bytes(n_double + 1), streams) << fam_name(f);
        EXPECT_LT(dc.state_bytes(n_double + 1), 2 * streams) << fam_name(f);
        EXPECT_TRUE(dc.row_split != nullptr);
        EXPECT_TRUE(dc.row_split->why_not.empty()) << dc.row_split->why_not;
        for (size_t i = 0; i < costs.size(); ++i)
            if (i != n_te) { EXPECT_GT(costs[i].measure(0, (int)costs[i].block_bytes.size(), true, true, "CPU"), 0u) << fam_name(f); }
    }
}

// ---------------------------------------------------------------- placed families

TEST(PlacementFlux, SplitOverRpcIsBitwiseTheCpuOutputs) {
    auto& r = rpc();
    const std::string a = r.devices[0], b = r.devices[1];
    struct Case {
        std::string name, backend, params;
    };
    const std::vector<Case> cases = {
        {"layer split te and diffusion, VAE decoder on an RPC device", "te=" + a + "&" + b + ",diffusion=" + b + "&" + a + ",vae=" + a, ""},
        {"weights in RAM (staged)", a, "cpu"},
        {"weights on disk", b, "disk"},
    };
    for (Fam f : {Fam::Flux1, Fam::Klein}) {
        const Out plain = run_family(f, nullptr, nullptr, "", true);
        for (auto& c : cases) {
            const std::string name = std::string(fam_name(f)) + " " + c.name;
            std::unique_ptr<models::Family> fam;
            const bool vae = c.backend.find("vae=") != std::string::npos;  // decode where the VAE is placed
            const Out o = run_family(f, spec_of(c.backend, c.params), &fam, "", vae);
            Out ref = plain;
            if (!vae) ref.image.clear();
            expect_bitwise(o, ref, name);
            expect_peaks_near_prediction(*fam, name);
            auto plans = fam->placement_plans();
            // te (FLUX.1: T5 and CLIP), diffusion, the VAE decoder once it decoded
            ASSERT_EQ(plans.size(), (f == Fam::Flux1 ? 3u : 2u) + (vae ? 1u : 0u)) << name;
            const auto& dp = plans[plans.size() - (vae ? 2 : 1)];
            EXPECT_EQ(dp.module, PModule::Diffusion);
            if (vae) {
                EXPECT_EQ(plans.back().module, PModule::Vae);
                EXPECT_FALSE(plain.image.empty());
            }
            if (c.backend.find('&') != std::string::npos) {
                // the DiT's double- and single-stream blocks form one sequence cut across the devices
                EXPECT_GE(dp.segments.size(), 2u) << name;
                EXPECT_NE(dp.segments.front().device, dp.segments.back().device) << name;
            }
        }
    }
}

// Weights in RAM on a capped device, streamed (--stream-layers) and as --max-vram segments: the
// cap is the plan's own prediction for the mode (what `easel plan` prints). The tiny DiTs'
// weights (0.19 MiB FLUX.1, 0.2 MiB Klein) are small beside the compute buffer of their
// 512-token context (2.6 MiB, as large for one block as for all), so no cap below the whole
// model holds two streaming slots beside it: per-evaluation uploads are covered by the UNet and
// CLIP cases of placement_runner_test.cpp.
TEST(PlacementFlux, WeightsInRamUnderACapAreBitwiseTheCpuOutputs) {
    auto& r = rpc();
    const std::string a = r.devices[0];
    for (Fam f : {Fam::Flux1, Fam::Klein}) {
        const Out plain = run_family(f, nullptr);
        for (bool stream : {true, false}) {
            const std::string name = std::string(fam_name(f)) + (stream ? " streamed" : " segments");
            models::FamilyOptions fo;
            fo.threads = 1;
            fo.placement = spec_of("diffusion=" + a, "diffusion=cpu", "", stream);
            auto probe = models::open_family(files_of(f), fo);
            // + 4 KiB: --max-vram is given in GiB with 9 decimals (1 byte)
            const auto probe_plans = probe->plan_placement(8, 6);
            const uint64_t cap = probe_plans[probe_plans.size() - 2].devices.at(0).total() + 4096;
            char gib[64];
            std::snprintf(gib, sizeof gib, "%.9f", (double)cap / (1024.0 * kMiB));
            std::unique_ptr<models::Family> fam;
            const Out o = run_family(f, spec_of("diffusion=" + a, "diffusion=cpu", a + "=" + gib, stream), &fam);
            expect_bitwise(o, plain, name);
            auto plans = fam->placement_plans();
            const auto& dp = plans.back();
            EXPECT_EQ(dp.module, PModule::Diffusion);
            EXPECT_EQ(dp.host_bytes, dp.devices.at(0).params) << name << ": the weights are held in RAM and staged";
            expect_peaks_near_prediction(*fam, name);
            EXPECT_LE(fam->placement_peaks().at(a), cap) << name;
        }
    }
}

// --split-mode row: the DiT's blocks as one graph on ggml's meta device over both RPC devices
// (F32 weights: with F16 weights ggml rounds activations to F16 and the reordered partial sums
// differ by ~1e-3). The text encoders are layer split (T5, Qwen3 have no rules).
TEST(PlacementFlux, RowSplitDiTIsWithin1e5OfTheCpuRun) {
    auto& r = rpc();
    const std::string a = r.devices[0], b = r.devices[1];
    for (Fam f : {Fam::Flux1, Fam::Klein}) {
        const std::string name = std::string(fam_name(f)) + " row split";
        const Out plain = run_family(f, nullptr, nullptr, "f32");
        std::unique_ptr<models::Family> fam;
        const Out o = run_family(f, spec_of("diffusion=" + a + "&" + b, "", "", false, "diffusion=row"), &fam, "f32");
        EXPECT_EQ(o.ctx_pos, plain.ctx_pos) << name;
        const float d1 = max_abs_diff(o.v_pos, plain.v_pos), d2 = max_abs_diff(o.v_neg, plain.v_neg), d3 = max_abs_diff(o.v_pos2, plain.v_pos2);
        std::printf("[flux placement] %s: max abs diff vs CPU %.3g %.3g %.3g\n", name.c_str(), d1, d2, d3);
        EXPECT_LE(d1, 1e-5f) << name;
        EXPECT_LE(d2, 1e-5f) << name;
        EXPECT_LE(d3, 1e-5f) << name;
        auto plans = fam->placement_plans();
        const auto& dp = plans.back();
        ASSERT_EQ(dp.module, PModule::Diffusion);
        ASSERT_EQ(dp.segments.size(), 3u) << name << ": prologue, blocks on the meta device, epilogue";
        EXPECT_TRUE(placement::is_row_split_device(dp.segments[1].device)) << name;
        expect_peaks_near_prediction(*fam, name);
    }
}
