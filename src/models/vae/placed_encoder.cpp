// PlacedVaeEncoder, vae_encoder_costs and plan_vae_encode (see placed_encoder.h).
#include "models/vae/placed_encoder.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

namespace easel::vae {

using vae::KLEncodeInputs;
using vae::KLEncodeState;

namespace {

/// The encoder-only tree, its TensorSource and load options for `s`.
struct EncoderModel {
    vae::AutoencoderKLConfig cfg;
    std::unique_ptr<vae::AutoencoderKL> net;
    std::unique_ptr<nn::TensorSource> src;
    nn::LoadOptions lo;
    explicit EncoderModel(const VaeEncoderSource& s) {
        if (!s.index) fail(ErrorKind::Internal, "VaeEncoderSource without a weight index");
        if (!s.src.has_encoder)
            fail(ErrorKind::ModelMismatch, "the VAE weights hold no encoder (prefix '{}'); pass a VAE with an encoder to encode images", s.src.prefix);
        cfg = vae::infer_autoencoder_kl_config(*s.index, s.src, s.overrides);
        net = std::make_unique<vae::AutoencoderKL>(cfg, vae::KLParts::EncoderOnly, s.src.layout == vae::KLLayout::Ldm);
        src = std::make_unique<nn::TensorSource>(vae::kl_tensor_source(*s.index, s.src, cfg));
        lo = vae::kl_load_options(cfg, vae::KLParts::EncoderOnly);
    }
};

/// The encoder's input: the image [n, C, H, W] (ggml ne {W, H, C, n}) from host data.
std::function<KLEncodeInputs(runtime::GraphBuilder&)> encoder_inputs(int64_t C, int64_t n, int64_t H, int64_t W, std::span<const float> x) {
    return [=](runtime::GraphBuilder& g) { return KLEncodeInputs{g.input_f32("vae_image", {W, H, C, n}, x)}; };
}

std::vector<ggml_tensor*> encoder_output(ggml_tensor*& o) { return {o}; }

std::string encoder_label(const vae::KLEncoderSequence& seq, int64_t C, int64_t n, int64_t H, int64_t W) {
    return fmt::format("VAE encoder {} blocks, image {}x{}x{}x{}", seq.n_blocks(), n, C, H, W);
}

void check_image(const vae::AutoencoderKLConfig& cfg, int64_t n, int64_t H, int64_t W) {
    const int f = cfg.spatial_factor();
    if (n <= 0 || H <= 0 || W <= 0 || H % f != 0 || W % f != 0)
        fail(ErrorKind::InvalidInput, "VAE encode: image {}x{} (batch {}) must be a positive multiple of {}", W, H, n, f);
}

}  // namespace

placement::ModuleCosts vae_encoder_costs(const VaeEncoderSource& s, int threads, bool flash_attn, int64_t H, int64_t W,
                                         const vae::TilingOptions& tiling) {
    struct Keep {
        EncoderModel m;
        std::vector<float> x;
        explicit Keep(const VaeEncoderSource& s) : m(s) {}
    };
    auto k = std::make_shared<Keep>(s);
    check_image(k->m.cfg, 1, H, W);
    const auto [gh, gw] = vae::encode_graph_image(k->m.cfg, H, W, tiling);
    const int64_t C = k->m.cfg.in_channels;
    k->x.assign((size_t)(C * gh * gw), 0.0f);
    const vae::KLEncoderSequence& seq = k->m.net->encoder_sequence();
    const std::string suffix = (gh != H || gw != W) ? fmt::format(" (tiles of a {}x{} image)", W, H) : "";
    return runtime::self_contained_costs<KLEncodeInputs, KLEncodeState, ggml_tensor*>(placement::PModule::Vae, k, *k->m.net, seq, *k->m.src, k->m.lo, threads,
                                                                              flash_attn, encoder_inputs(C, 1, gh, gw, k->x), encoder_output,
                                                                              encoder_label(seq, C, 1, gh, gw) + suffix);
}

std::vector<std::pair<int64_t, int64_t>> encode_sizes_at(const std::vector<std::pair<int64_t, int64_t>>& sizes, int64_t multiple) {
    const int64_t m = std::max<int64_t>(1, multiple);
    std::vector<std::pair<int64_t, int64_t>> r;
    for (auto [H, W] : sizes) r.push_back({std::max(m, H / m * m), std::max(m, W / m * m)});
    return r;
}

std::optional<placement::ModuleCosts> encode_stage_costs(const VaeEncoderSource& s, int threads, bool flash_attn,
                                              const std::vector<std::pair<int64_t, int64_t>>& sizes, const vae::TilingOptions& tiling) {
    if (sizes.empty()) return std::nullopt;
    if (!s.index) fail(ErrorKind::Internal, "VaeEncoderSource without a weight index");
    const vae::AutoencoderKLConfig cfg = vae::infer_autoencoder_kl_config(*s.index, s.src, s.overrides);
    // the largest graph among the encodes (by pixels): its compute buffer bounds the others'
    std::pair<int64_t, int64_t> best{0, 0}, best_img{0, 0};
    for (auto [H, W] : sizes) {
        check_image(cfg, 1, H, W);
        const auto g = vae::encode_graph_image(cfg, H, W, tiling);
        if (g.first * g.second > best.first * best.second) best = g, best_img = {H, W};
    }
    return vae_encoder_costs(s, threads, flash_attn, best_img.first, best_img.second, tiling);
}

placement::ModulePlan plan_encode_stage(const placement::ModuleCosts& costs, const placement::PlacementSpec& spec,
                                        const std::map<std::string, uint64_t>& budgets) {
    placement::ModulePlan p;
    try {
        p = placement::plan_module(placement::PModule::Vae, spec[placement::PModule::Vae], false, costs, budgets);
    } catch (const Error& e) {
        // say that it is the image encode (the decoder under the same entry may fit)
        if (e.kind() != ErrorKind::OutOfMemory) throw;
        fail(ErrorKind::OutOfMemory, "the image encode ({} stage, the VAE encoder): {}", placement::kVaeEncodeStage, e.what());
    }
    p.stage = placement::kVaeEncodeStage;
    return p;
}

std::vector<placement::ModulePlan> plan_vae_encode(const VaeEncoderSource& s, const placement::PlacementSpec& spec,
                                                   const std::map<std::string, uint64_t>& budgets, int threads, bool flash_attn,
                                                   const std::vector<std::pair<int64_t, int64_t>>& sizes,
                                        const vae::TilingOptions& tiling) {
    const std::optional<placement::ModuleCosts> c = encode_stage_costs(s, threads, flash_attn, sizes, tiling);
    if (!c) return {};
    return {plan_encode_stage(*c, spec, budgets)};
}

vae::TilingOptions planned_tiling(int tile_cells, int spatial_factor) {
    vae::TilingOptions t;
    t.enabled = tile_cells > 0;
    t.tile_size = std::max(tile_cells, 1) * spatial_factor;
    return t;
}

struct PlacedVaeEncoder::Model : EncoderModel {
    using EncoderModel::EncoderModel;
};

PlacedVaeEncoder::PlacedVaeEncoder(const VaeEncoderSource& s, placement::PlacementSpec spec, int threads, bool flash_attn)
    : model_(std::make_unique<Model>(s)),
      placed_(*model_->net, model_->net->encoder_sequence(), *model_->src, model_->lo, placement::PModule::Vae, std::move(spec), threads, flash_attn) {}

PlacedVaeEncoder::~PlacedVaeEncoder() = default;

const vae::AutoencoderKLConfig& PlacedVaeEncoder::config() const { return model_->cfg; }

placement::ModulePlan PlacedVaeEncoder::plan(int64_t n, int64_t H, int64_t W) {
    const auto& cfg = model_->cfg;
    check_image(cfg, n, H, W);
    std::vector<float> x((size_t)(n * cfg.in_channels * H * W));
    placement::ModulePlan p = placed_.plan(encoder_inputs(cfg.in_channels, n, H, W, x), encoder_output,
                                encoder_label(model_->net->encoder_sequence(), cfg.in_channels, n, H, W));
    p.stage = placement::kVaeEncodeStage;
    return p;
}

vae::HostTensor PlacedVaeEncoder::encode_moments(const vae::HostTensor& image, const vae::TilingOptions& tiling) {
    const auto& cfg = model_->cfg;
    const vae::KLEncoderSequence& seq = model_->net->encoder_sequence();
    // The plan is keyed by the encode's largest graph, the first tile (encode_moments_with runs it
    // first): the other tiles are no larger (edge tiles are cropped), so they run under that plan.
    const auto [gh, gw] = vae::encode_graph_image(cfg, std::max<int64_t>(image.h, 1), std::max<int64_t>(image.w, 1), tiling);
    const std::vector<int64_t> key{image.n, gh, gw};
    vae::HostTensor out = vae::encode_moments_with(cfg, image, tiling, [&](const vae::HostTensor& x) {
        auto res = placed_.run(key, encoder_inputs(cfg.in_channels, x.n, x.h, x.w, x.data), encoder_output,
                               encoder_label(seq, cfg.in_channels, key[0], key[1], key[2]));
        const runtime::HostTensor& o = res.at(0);
        const int f = cfg.spatial_factor();
        if (o.ne[0] != x.w / f || o.ne[1] != x.h / f || o.ne[2] != 2 * cfg.latent_channels || o.ne[3] != x.n)
            fail(ErrorKind::Internal, "VAE encoder output {}x{}x{}x{}, expected {}x{}x{}x{}", o.ne[3], o.ne[2], o.ne[1], o.ne[0], x.n,
                 2 * cfg.latent_channels, x.h / f, x.w / f);
        vae::HostTensor r;
        r.n = o.ne[3], r.c = o.ne[2], r.h = o.ne[1], r.w = o.ne[0];
        r.data = std::move(res[0].data);
        return r;
    });
    plan_ = placed_.current_plan();
    plan_.stage = placement::kVaeEncodeStage;
    return out;
}

vae::LatentDist PlacedVaeEncoder::encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) {
    return vae::moments_to_dist(encode_moments(image, tiling), model_->cfg.latent_channels);
}

uint64_t PlacedVaeEncoder::param_bytes() const {
    uint64_t b = 0;
    for (auto& s : plan_.segments) b += s.param_bytes;
    return b;
}

}  // namespace easel::vae
