// PlacedVaeDecoder and vae_decoder_costs (see placed_decoder.h).
#include "models/vae/placed_decoder.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace easel::vae {

using vae::KLDecodeInputs;
using vae::KLDecodeState;

namespace {

/// The decoder-only tree, its TensorSource and load options for `s`.
struct DecoderModel {
    vae::AutoencoderKLConfig cfg;
    std::unique_ptr<vae::AutoencoderKL> net;
    std::unique_ptr<nn::TensorSource> src;
    nn::LoadOptions lo;
    explicit DecoderModel(const VaeDecoderSource& s) {
        if (!s.index) fail(ErrorKind::Internal, "VaeDecoderSource without a weight index");
        if (!s.src.has_decoder) fail(ErrorKind::ModelMismatch, "the VAE weights hold no decoder (prefix '{}'); pass a VAE with a decoder", s.src.prefix);
        cfg = vae::infer_autoencoder_kl_config(*s.index, s.src, s.overrides);
        net = std::make_unique<vae::AutoencoderKL>(cfg, vae::KLParts::DecoderOnly, s.src.layout == vae::KLLayout::Ldm);
        src = std::make_unique<nn::TensorSource>(vae::kl_tensor_source(*s.index, s.src, cfg));
        lo = vae::kl_load_options(cfg, vae::KLParts::DecoderOnly);
    }
};

/// The decoder's input: the raw latent [n, L, h, w] (ggml ne {w, h, L, n}) from host data.
std::function<KLDecodeInputs(runtime::GraphBuilder&)> decoder_inputs(int64_t L, int64_t n, int64_t h, int64_t w, std::span<const float> z) {
    return [=](runtime::GraphBuilder& g) { return KLDecodeInputs{g.input_f32("vae_input", {w, h, L, n}, z)}; };
}

std::vector<ggml_tensor*> decoder_output(ggml_tensor*& o) { return {o}; }

std::string decoder_label(const vae::AutoencoderKL& net, int64_t n, int64_t h, int64_t w) {
    return fmt::format("VAE decoder {} blocks, latent {}x{}x{}x{}", net.n_blocks(), n, net.config().latent_channels, h, w);
}

/// Costs of one decode graph of a batch-1 latent of h x w cells; owns everything it uses.
placement::ModuleCosts graph_costs(const VaeDecoderSource& s, int threads, bool flash_attn, int64_t h, int64_t w, const std::string& label_suffix) {
    struct Keep {
        DecoderModel m;
        std::vector<float> z;
        explicit Keep(const VaeDecoderSource& s) : m(s) {}
    };
    auto k = std::make_shared<Keep>(s);
    const int64_t L = k->m.cfg.latent_channels;
    k->z.assign((size_t)(L * h * w), 0.0f);
    return runtime::self_contained_costs<KLDecodeInputs, KLDecodeState, ggml_tensor*>(
        placement::PModule::Vae, k, *k->m.net, *k->m.net, *k->m.src, k->m.lo, threads, flash_attn, decoder_inputs(L, 1, h, w, k->z), decoder_output,
        decoder_label(*k->m.net, 1, h, w) + label_suffix);
}

}  // namespace

placement::ModuleCosts vae_decoder_costs(const VaeDecoderSource& s, int threads, bool flash_attn, int64_t h, int64_t w, const vae::TilingOptions& tiling) {
    if (h <= 0 || w <= 0) fail(ErrorKind::InvalidInput, "VAE decoder costs: empty latent {}x{}", w, h);
    if (!s.index) fail(ErrorKind::Internal, "VaeDecoderSource without a weight index");
    const vae::AutoencoderKLConfig cfg = vae::infer_autoencoder_kl_config(*s.index, s.src, s.overrides);
    const auto [gh, gw] = vae::decode_graph_latent(cfg, h, w, tiling);
    const std::string suffix = (gh != h || gw != w) ? fmt::format(" (tiles of a {}x{} latent)", h, w) : "";
    placement::ModuleCosts c = graph_costs(s, threads, flash_attn, gh, gw, suffix);
    c.latent_h = h;
    c.latent_w = w;
    if (gh != h || gw != w) {
        // FLOPs of the whole decode at the job's latent (one untiled graph of h x w, built on first
        // use; its graphs are shape-only, nothing allocated), not of the first tile the bytes are
        // measured at
        auto whole = std::make_shared<std::optional<placement::ModuleCosts>>();
        c.flops = [s, threads, flash_attn, h, w, whole](int b, int e, bool pro, bool epi) -> double {
            if (!*whole) *whole = graph_costs(s, threads, flash_attn, h, w, "");
            return (*whole)->flops(b, e, pro, epi);
        };
    }
    // one tile t x t (clipped to the latent) as one graph: the costs of each tile size are made
    // on first use and kept (the callbacks may be called for many devices)
    auto tiles = std::make_shared<std::map<int, placement::ModuleCosts>>();
    c.measure_tile = [s, threads, flash_attn, h, w, tiles](int t, const std::string& device) -> uint64_t {
        if (t <= 0) fail(ErrorKind::InvalidInput, "VAE tile of {} latent cells", t);
        auto it = tiles->find(t);
        if (it == tiles->end())
            it = tiles->emplace(t, graph_costs(s, threads, flash_attn, std::min<int64_t>(t, h), std::min<int64_t>(t, w), " (one tile)")).first;
        const placement::ModuleCosts& tc = it->second;
        return tc.measure(0, (int)tc.block_bytes.size(), true, true, device);
    };
    return c;
}

struct PlacedVaeDecoder::Model : DecoderModel {
    using DecoderModel::DecoderModel;
};

PlacedVaeDecoder::PlacedVaeDecoder(const VaeDecoderSource& s, placement::PlacementSpec spec, int threads, bool flash_attn)
    : model_(std::make_unique<Model>(s)),
      placed_(*model_->net, *model_->net, *model_->src, model_->lo, placement::PModule::Vae, std::move(spec), threads, flash_attn) {}

PlacedVaeDecoder::~PlacedVaeDecoder() = default;

const vae::AutoencoderKLConfig& PlacedVaeDecoder::config() const { return model_->cfg; }

placement::ModulePlan PlacedVaeDecoder::plan(int64_t n, int64_t h, int64_t w) {
    if (n <= 0 || h <= 0 || w <= 0) fail(ErrorKind::InvalidInput, "VAE decoder plan: empty latent {}x{}x{}", n, h, w);
    std::vector<float> z((size_t)(n * model_->cfg.latent_channels * h * w));
    return placed_.plan(decoder_inputs(model_->cfg.latent_channels, n, h, w, z), decoder_output, decoder_label(*model_->net, n, h, w));
}

vae::HostTensor PlacedVaeDecoder::decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) {
    const auto& cfg = model_->cfg;
    // The plan is keyed by the decode's largest graph, the first tile (decode_with runs it first):
    // the other tiles of the decode are no larger (edge tiles are cropped), so they run under
    // that plan, whose buffers hold their smaller graphs and states, and the prediction stays
    // the decode's peak.
    const auto [gh, gw] = vae::decode_graph_latent(cfg, std::max<int64_t>(latent.h, 1), std::max<int64_t>(latent.w, 1), tiling);
    const std::vector<int64_t> key{latent.n, gh, gw};
    return vae::decode_with(cfg, latent, tiling, [&](const vae::HostTensor& z) {
        auto res = placed_.run(key, decoder_inputs(cfg.latent_channels, z.n, z.h, z.w, z.data), decoder_output,
                               decoder_label(*model_->net, key[0], key[1], key[2]));
        const runtime::HostTensor& o = res.at(0);
        const int f = cfg.spatial_factor();
        if (o.ne[0] != z.w * f || o.ne[1] != z.h * f || o.ne[2] != cfg.out_channels || o.ne[3] != z.n)
            fail(ErrorKind::Internal, "VAE decoder output {}x{}x{}x{}, expected {}x{}x{}x{}", o.ne[3], o.ne[2], o.ne[1], o.ne[0], z.n,
                 cfg.out_channels, z.h * f, z.w * f);
        vae::HostTensor r;
        r.n = o.ne[3], r.c = o.ne[2], r.h = o.ne[1], r.w = o.ne[0];
        r.data = std::move(res[0].data);
        return r;
    });
}

uint64_t PlacedVaeDecoder::param_bytes() const {
    uint64_t b = 0;
    for (auto& s : current_plan().segments) b += s.param_bytes;
    return b;
}

}  // namespace easel::vae
