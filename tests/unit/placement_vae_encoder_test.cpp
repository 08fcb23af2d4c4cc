// The AutoencoderKL encoder as a typed block sequence (vae::KLEncoderSequence) run under a
// placement plan (models/vae/placed_encoder.h): on the CPU and over two `easel rpc-server`s on
// 127.0.0.1 (tests/unit/rpc_servers.h), layer split (--backend "vae=A&B"), weights in RAM
// (--params-backend vae=cpu), from disk (vae=disk), a --max-vram cap that cuts the encoder into
// per-evaluation segments, and tiled encode (each tile one run of the sequence): the moments are
// bitwise those of the unplaced CPU encoder (the same ggml ops on the same CPU; the state crosses
// devices as raw bytes), the unplaced encoder matches diffusers' AutoencoderKL.encode on the
// fixture, and every device's measured peak is within 10% of the plan's prediction and within
// its cap. Through the SD family: img2img's encode stage under the vae entry, its plan in
// plan_placement's table (stage vae-encode) and bitwise the unplaced family's posterior.
#include "core/error.h"
#include "io/weight_index.h"
#include "models/family.h"
#include "models/vae/autoencoder_kl.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "placement/spec.h"
#include "models/vae/placed_encoder.h"
#include "placement_test_support.h"
#include "rpc_servers.h"

#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>

using namespace easel;
using placement::PModule;

namespace {

const std::filesystem::path kRef = std::filesystem::path(EASEL_TEST_DATA) / "reference";
const std::filesystem::path kVae = kRef / "autoencoder_kl_sd_tiny.safetensors";
const std::string kSdTiny = (kRef / "sd_tiny" / "sd_tiny.safetensors").string();

easel::test_support::RpcServers& rpc() {
    static easel::test_support::RpcServers r(2);
    return r;
}

placement::PlacementSpec spec_of(const std::string& backend, const std::string& params = "", const std::string& max_vram = "") {
    placement::PlacementFlags f;
    f.backend = "default=CPU," + backend;
    f.params_backend = params;
    f.max_vram = max_vram;
    return placement::parse_placement(f, placement::device_names());
}

vae::HostTensor read4(const io::WeightIndex& idx, const std::string& name) {
    const io::TensorInfo* t = idx.find(name);
    if (!t || t->shape.size() != 4) throw std::runtime_error("fixture lacks a 4-D " + name);
    vae::HostTensor h(t->shape[0], t->shape[1], t->shape[2], t->shape[3]);
    h.data = idx.read_f32(*t);
    return h;
}

/// An image [1, 3, H, W] of smooth made-up values in [-1, 1].
vae::HostTensor image(int64_t H, int64_t W) {
    vae::HostTensor x(1, 3, H, W);
    for (size_t i = 0; i < x.data.size(); ++i) x.data[i] = 0.9f * std::sin(0.13f * (float)i) * std::cos(0.011f * (float)i);
    return x;
}

vae::TilingOptions tiles(int pixels) {
    vae::TilingOptions t;
    t.enabled = pixels > 0;
    t.tile_size = std::max(pixels, 2);
    t.overlap = 0.25f;
    return t;
}

vae::VaeEncoderSource source_of(const io::WeightIndex& idx) {
    vae::VaeEncoderSource s;
    s.index = &idx;
    s.src = *vae::find_autoencoder_kl(idx);
    s.overrides.norm_num_groups = 8;  // the fixture's config (norm_num_groups 8; the file does not show it)
    return s;
}

struct CpuBackend {
    ggml_backend_t b = ggml_backend_cpu_init();
    ~CpuBackend() { ggml_backend_free(b); }
};

/// The unplaced encoder's moments on the CPU (one thread, as the placed runs).
vae::HostTensor cpu_moments(const io::WeightIndex& idx, const vae::HostTensor& img, const vae::TilingOptions& t) {
    CpuBackend cpu;
    vae::KLOverrides ov;
    ov.norm_num_groups = 8;
    auto m = vae::AutoencoderKLModel::load(idx, cpu.b, ov, vae::KLParts::EncoderOnly);
    vae::ExecOptions ex;
    ex.n_threads = 1;
    return m->encode_moments(img, t, ex);
}

std::string gib(uint64_t bytes) { return std::to_string((double)bytes / (1024.0 * 1024.0 * 1024.0)); }

/// Every device's measured peak within 10% of the prediction and within its budget (printed);
/// the plans predict a peak on at least one device.
void expect_peaks_near_prediction(const std::vector<placement::ModulePlan>& plans, const std::map<std::string, uint64_t>& measured,
                                  const std::string& what) {
    ASSERT_FALSE(placement::device_peaks(plans).empty()) << what;
    test_support::expect_peaks_within_10_percent(plans, measured, what, /*print=*/true);
}

}  // namespace

// The sequence: 8 blocks for the tiny VAE (2 levels of 2 resnets, one downsampler, mid resnet /
// attention / resnet) in diffusers' order; its forward() is the encoder + quant_conv, whose
// posterior matches diffusers' AutoencoderKL.encode on the fixture; the costs' block and
// prologue/epilogue bytes sum to the file's encoder.* and quant_conv.* tensors in F32.
TEST(PlacementVaeEncoder, SequenceMatchesDiffusersAndCostsAreTheEncoderBytes) {
    auto idx = io::WeightIndex::open(kVae);
    const vae::VaeEncoderSource s = source_of(idx);
    vae::AutoencoderKLConfig cfg = vae::infer_autoencoder_kl_config(idx, s.src, s.overrides);
    vae::AutoencoderKL net(cfg, vae::KLParts::EncoderOnly);
    const vae::KLEncoderSequence& seq = net.encoder_sequence();
    ASSERT_EQ(seq.n_blocks(), 8);
    const char* names[] = {"encoder.down_blocks.0.resnets.0", "encoder.down_blocks.0.resnets.1", "encoder.down_blocks.0.downsamplers.0",
                           "encoder.down_blocks.1.resnets.0", "encoder.down_blocks.1.resnets.1", "encoder.mid_block.resnets.0",
                           "encoder.mid_block.attentions.0",  "encoder.mid_block.resnets.1"};
    for (int i = 0; i < 8; ++i) EXPECT_EQ(seq.unit(i).name, names[i]);
    EXPECT_EQ(seq.unit(2).kind, vae::KLEncodeUnit::Kind::Downsample);
    EXPECT_EQ(seq.unit(6).kind, vae::KLEncodeUnit::Kind::Attention);

    uint64_t file_bytes = 0;
    for (auto& t : idx.tensors())
        if (t.name.rfind("encoder.", 0) == 0 || t.name.rfind("quant_conv.", 0) == 0)
            file_bytes += 4 * (uint64_t)std::accumulate(t.shape.begin(), t.shape.end(), (int64_t)1, std::multiplies<int64_t>());
    const placement::ModuleCosts c = vae::vae_encoder_costs(s, 1, false, 32, 32);
    EXPECT_EQ(c.module, PModule::Vae);
    ASSERT_EQ(c.block_bytes.size(), 8u);
    EXPECT_EQ(std::accumulate(c.block_bytes.begin(), c.block_bytes.end(), c.prologue_bytes), file_bytes);
    // block 0: a 16-channel resnet: 2 GroupNorms (2 x 2 x 16) + 2 3x3 convs (16*16*9 + 16)
    EXPECT_EQ(c.block_bytes[0], (uint64_t)(2 * 2 * 16 + 2 * (16 * 16 * 9 + 16)) * 4);
    // a tiled encode is costed at one tile's graph: smaller than the whole image's
    const placement::ModuleCosts ct = vae::vae_encoder_costs(s, 1, false, 32, 32, tiles(16));
    EXPECT_LT(ct.measure(0, 8, true, true, "CPU"), c.measure(0, 8, true, true, "CPU"));
    EXPECT_THROW(vae::vae_encoder_costs(s, 1, false, 31, 32), Error);  // not a multiple of f = 2

    // the unplaced encoder (now forward() of the sequence) against diffusers
    const vae::HostTensor x = read4(idx, "__input__.image");
    const vae::LatentDist d = vae::moments_to_dist(cpu_moments(idx, x, {}), 4);
    const vae::HostTensor mean = read4(idx, "__output__.latent_mean"), logvar = read4(idx, "__output__.latent_logvar");
    ASSERT_EQ(d.mean.data.size(), mean.data.size());
    float em = 0, el = 0;
    for (size_t i = 0; i < mean.data.size(); ++i) {
        em = std::max(em, std::fabs(d.mean.data[i] - mean.data[i]));
        el = std::max(el, std::fabs(d.logvar.data[i] - logvar.data[i]));
    }
    std::printf("  unplaced encoder vs diffusers: mean %.3g, logvar %.3g max abs\n", em, el);
    EXPECT_LT(em, 1e-4f);
    EXPECT_LT(el, 1e-4f);
}

// The placed encoder on the CPU (one segment; then an image of another size, replanned): bitwise
// the unplaced one, and its posterior the moments split and clamped.
TEST(PlacementVaeEncoder, PlacedOnTheCpuIsBitwiseTheUnplacedEncoder) {
    auto idx = io::WeightIndex::open(kVae);
    const vae::HostTensor x = read4(idx, "__input__.image");
    const vae::HostTensor want = cpu_moments(idx, x, {});
    vae::PlacedVaeEncoder enc(source_of(idx), spec_of("vae=CPU"), 1, false);
    EXPECT_EQ(enc.encode_moments(x).data, want.data);
    EXPECT_EQ(enc.current_plan().stage, placement::kVaeEncodeStage);
    EXPECT_EQ(enc.current_plan().segments.size(), 1u);
    // a second image of another size replans, same weights
    const vae::HostTensor x2 = image(16, 24);
    EXPECT_EQ(enc.encode_moments(x2).data, cpu_moments(idx, x2, {}).data);
    // the posterior is the moments split and clamped
    const vae::LatentDist d = enc.encode(x);
    const vae::LatentDist w = vae::moments_to_dist(want, 4);
    EXPECT_EQ(d.mean.data, w.mean.data);
    EXPECT_EQ(d.logvar.data, w.logvar.data);
}

// Over two RPC devices (and the CPU): layer split, weights in RAM, from disk, a --max-vram cap
// that forces per-evaluation segments, tiled encode: bitwise the unplaced CPU encoder, every
// device's measured peak within 10% of the prediction and under its cap.
TEST(PlacementVaeEncoder, PlacedOverRpcDevicesIsBitwiseTheCpuEncoder) {
    auto& r = rpc();
    const std::string a = r.devices[0], b = r.devices[1];
    auto idx = io::WeightIndex::open(kVae);
    const vae::VaeEncoderSource s = source_of(idx);
    const vae::HostTensor x = read4(idx, "__input__.image");
    const vae::HostTensor big = image(64, 48);
    const vae::HostTensor want = cpu_moments(idx, x, {}), want_tiled = cpu_moments(idx, big, tiles(32)), want_t8 = cpu_moments(idx, x, tiles(8));
    ASSERT_NE(cpu_moments(idx, big, {}).data, want_tiled.data);  // the tiling changes the moments (blended seams)

    // the uncapped need of an 8x8-pixel tile's encode on one device with the weights in RAM (the
    // whole encode's need is mostly its compute buffer, which segments do not shrink: the caps
    // that force segments are set on small tiles, where the weights are a large part of the need)
    const uint64_t need = vae::PlacedVaeEncoder(s, spec_of("vae=" + a, "vae=cpu"), 1, false).plan(1, 8, 8).devices.at(0).total();
    const uint64_t cap = need * 9 / 10;
    struct Case {
        std::string name, backend, params, max_vram;
        int tile;  // pixels, 0 = whole
        size_t min_segments;
        bool per_eval;  // the plan must upload segments per evaluation
    };
    const std::vector<Case> cases = {
        {"layer split vae=A&B", "vae=" + a + "&" + b, "", "", 0, 2, false},
        {"layer split vae=CPU&B", "vae=CPU&" + b, "", "", 0, 2, false},
        {"weights in RAM (vae=cpu)", "vae=" + a, "vae=cpu", "", 0, 1, false},
        {"weights from disk (vae=disk)", "vae=" + b, "vae=disk", "", 0, 1, false},
        {"tiled 8 px, weights in RAM, --max-vram 0.9 x need: segments", "vae=" + a, "vae=cpu", a + "=" + gib(cap), 8, 2, true},
        {"tiled 8 px, weights from disk, --max-vram 0.9 x need: segments", "vae=" + b, "vae=disk", b + "=" + gib(cap), 8, 2, true},
        {"tiled 32 px, layer split", "vae=" + b + "&" + a, "", "", 32, 2, false},
        {"tiled 32 px, weights in RAM", "vae=" + a, "vae=cpu", "", 32, 1, false},
    };
    for (const Case& c : cases) {
        vae::PlacedVaeEncoder enc(s, spec_of(c.backend, c.params, c.max_vram), 1, false);
        const vae::HostTensor got = c.tile == 32 ? enc.encode_moments(big, tiles(32)) : enc.encode_moments(x, tiles(c.tile));
        EXPECT_EQ(got.data, c.tile == 32 ? want_tiled.data : c.tile == 8 ? want_t8.data : want.data) << c.name;
        const placement::ModulePlan& p = enc.current_plan();
        EXPECT_EQ(p.stage, placement::kVaeEncodeStage);
        EXPECT_GE(p.segments.size(), c.min_segments) << c.name;
        bool per_eval = false;
        for (auto& g : p.segments) per_eval = per_eval || g.per_eval;
        EXPECT_EQ(per_eval, c.per_eval) << c.name;
        expect_peaks_near_prediction({p}, enc.peaks(), c.name);
        if (!c.max_vram.empty())
            for (auto& [d, m] : enc.peaks())
                if (d != "CPU") { EXPECT_LE(m, cap) << c.name << " on " << d; }
    }
    // a cap below what one block needs beside two slots stops before anything is allocated
    vae::PlacedVaeEncoder tight(s, spec_of("vae=" + a, "vae=cpu", a + "=" + gib(need / 20)), 1, false);
    EXPECT_THROW(tight.encode_moments(x), Error);
}

// Through the SD family: FamilyOptions::vae_encode_sizes puts the encode stage in
// plan_placement's plans (module vae, stage vae-encode); encode() runs the placed encoder under
// the vae entry (layer split over the RPC devices): the posterior is bitwise the unplaced
// family's, the plan and peaks are kept after unload(VaeEncoder), peaks within 10%.
TEST(PlacementVaeEncoder, SdFamilyEncodesUnderTheVaePlacement) {
    auto& r = rpc();
    const std::string a = r.devices[0], b = r.devices[1];
    auto open = [&](std::shared_ptr<const placement::PlacementSpec> spec) {
        models::ModelFiles files;
        files.model = kSdTiny;
        models::FamilyOptions fo;
        fo.threads = 1;
        fo.placement = std::move(spec);
        fo.vae_encode_sizes = {{64, 64}};
        return models::open_family(files, fo);
    };
    const vae::HostTensor x = image(64, 64);
    auto plain = open(nullptr);
    const vae::LatentDist want = plain->encode(x, {});
    for (auto [backend, params] : {std::pair<std::string, std::string>{"vae=" + a + "&" + b, ""}, {"vae=" + b, "vae=disk"}}) {
        const std::string what = backend + " " + params;
        auto fam = open(std::make_shared<placement::PlacementSpec>(spec_of(backend, params)));
        const auto planned = fam->plan_placement(8, 8);
        const placement::ModulePlan* enc_plan = nullptr;
        for (auto& p : planned)
            if (placement::stage_of(p) == placement::kVaeEncodeStage) enc_plan = &p;
        ASSERT_NE(enc_plan, nullptr) << what;
        EXPECT_EQ(enc_plan->module, PModule::Vae);
        EXPECT_NE(placement::format_plan(planned).find("vae-encode"), std::string::npos);
        const vae::LatentDist got = fam->encode(x, {});
        EXPECT_EQ(got.mean.data, want.mean.data) << what;
        EXPECT_EQ(got.logvar.data, want.logvar.data) << what;
        fam->unload(models::Module::VaeEncoder);
        auto plans = fam->placement_plans();
        ASSERT_EQ(plans.size(), 1u) << what;
        EXPECT_EQ(placement::stage_of(plans[0]), placement::kVaeEncodeStage);
        // the run's plan is the one planned up front (same image)
        EXPECT_EQ(placement::device_peaks(plans), placement::device_peaks({*enc_plan})) << what;
        expect_peaks_near_prediction(plans, fam->placement_peaks(), "SD family encode " + what);
    }
}
