// Z-Image transformer (see z_image_dit.h). Architecture facts from diffusers'
// models/transformers/transformer_z_image.py (ZImageTransformer2DModel, ZImageTransformerBlock,
// FinalLayer, TimestepEmbedder, RopeEmbedder, patchify_and_embed, _pad_with_ids) and the
// original-layout key names from diffusers' loaders/single_file_utils.py
// (convert_z_image_transformer_checkpoint_to_diffusers), which sd.cpp's z_image.hpp and
// ComfyUI's comfy/ldm/lumina/model.py also use.
#include "models/zimage/z_image_dit.h"

#include "core/error.h"
#include "core/log.h"
#include "runtime/graph_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <regex>

namespace easel::models::zimage {

namespace {

bool starts(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

std::string ne_s(const ggml_tensor* t) { return fmt::format("{{{}, {}, {}, {}}}", t->ne[0], t->ne[1], t->ne[2], t->ne[3]); }

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

const io::TensorInfo& need(const io::WeightIndex& idx, const std::string& name) {
    const io::TensorInfo* t = idx.find(name);
    if (!t) fail(ErrorKind::ModelMismatch, "Z-Image transformer: tensor '{}' is missing; this is not a complete Z-Image transformer", name);
    return *t;
}

int64_t dim_of(const io::TensorInfo& t, size_t i, size_t rank) {
    if (t.shape.size() != rank)
        fail(ErrorKind::ModelMismatch, "Z-Image transformer: tensor '{}' has shape [{}], expected {} dimensions", t.name,
             fmt::join(t.shape, ", "), rank);
    return t.shape[i];
}

// Number of consecutive blocks <p>0., <p>1., ... that have <probe>.
int64_t count_blocks(const io::WeightIndex& idx, const std::string& p, const std::string& probe) {
    int64_t n = 0;
    while (idx.find(p + std::to_string(n) + probe)) ++n;
    return n;
}

std::string x_emb_name(const ZImageDiTConfig& c) { return fmt::format("all_x_embedder.{}-{}", c.patch, c.f_patch); }
std::string final_name(const ZImageDiTConfig& c) { return fmt::format("all_final_layer.{}-{}", c.patch, c.f_patch); }

// RoPE on q or k: x {hd, nh, S} (contiguous), cos/sin {hd/2, 1, S}. Pairs (2k, 2k+1) are the real
// and imaginary parts of complex channel k (diffusers: view_as_complex). The result is
// de-interleaved: {rotated real parts (hd/2), rotated imaginary parts (hd/2)} per head; q and k
// get the same channel permutation, so q.k is that of the interleaved rotation.
ggml_tensor* apply_rope(ggml_context* ctx, ggml_tensor* x, ggml_tensor* cos, ggml_tensor* sin) {
    const int64_t hd = x->ne[0], nh = x->ne[1], S = x->ne[2], half = hd / 2;
    ggml_tensor* xr = ggml_reshape_4d(ctx, x, 2, half, nh, S);
    ggml_tensor* xp = ggml_cont(ctx, ggml_permute(ctx, xr, 3, 0, 1, 2));  // {half, nh, S, 2}
    ggml_tensor* x0 = ggml_view_3d(ctx, xp, half, nh, S, xp->nb[1], xp->nb[2], 0);
    ggml_tensor* x1 = ggml_view_3d(ctx, xp, half, nh, S, xp->nb[1], xp->nb[2], xp->nb[3]);
    ggml_tensor* re = ggml_sub(ctx, ggml_mul(ctx, x0, cos), ggml_mul(ctx, x1, sin));
    ggml_tensor* im = ggml_add(ctx, ggml_mul(ctx, x0, sin), ggml_mul(ctx, x1, cos));
    return ggml_concat(ctx, re, im, 0);  // {hd, nh, S}
}

// x + x * scale (x * (1 + scale)); scale {dim} broadcast over tokens.
ggml_tensor* modulate(ggml_context* ctx, ggml_tensor* x, ggml_tensor* scale) { return ggml_add(ctx, x, ggml_mul(ctx, x, scale)); }

}  // namespace

// ---------------------------------------------------------------- config

std::string ZImageDiTConfig::summary() const {
    return fmt::format("{} layers, dim {}, {} heads x {} ({} kv), {}+{} refiners, caption {}, ffn {}, patch {}, {} channels, axes [{}]",
                       n_layers, dim, n_heads, head_dim, n_kv_heads, n_noise_refiner, n_context_refiner, cap_feat_dim, ffn_hidden,
                       patch, in_channels, fmt::join(axes_dims, ", "));
}

ZImageOverrides overrides_from_config_json(const nlohmann::json& j) {
    ZImageOverrides o;
    auto int_of = [&](const char* k) -> std::optional<int64_t> {
        if (j.contains(k) && j[k].is_number_integer()) return j[k].get<int64_t>();
        return std::nullopt;
    };
    auto first_of = [&](const char* k) -> std::optional<int64_t> {
        if (j.contains(k) && j[k].is_array() && !j[k].empty() && j[k][0].is_number_integer()) return j[k][0].get<int64_t>();
        return std::nullopt;
    };
    auto axes_of = [&](const char* k) -> std::optional<std::array<int64_t, 3>> {
        if (!j.contains(k) || !j[k].is_array()) return std::nullopt;
        if (j[k].size() != 3) fail(ErrorKind::InvalidInput, "Z-Image config: {} must have 3 entries, has {}", k, j[k].size());
        std::array<int64_t, 3> a{};
        for (size_t i = 0; i < 3; ++i) {
            if (!j[k][i].is_number_integer()) fail(ErrorKind::InvalidInput, "Z-Image config: {} must hold integers", k);
            a[i] = j[k][i].get<int64_t>();
        }
        return a;
    };
    auto float_of = [&](const char* k) -> std::optional<float> {
        if (j.contains(k) && j[k].is_number()) return j[k].get<float>();
        return std::nullopt;
    };
    o.n_heads = int_of("n_heads");
    o.n_kv_heads = int_of("n_kv_heads");
    o.in_channels = int_of("in_channels");
    o.patch = first_of("all_patch_size");
    o.f_patch = first_of("all_f_patch_size");
    o.axes_dims = axes_of("axes_dims");
    o.axes_lens = axes_of("axes_lens");
    o.rope_theta = float_of("rope_theta");
    o.t_scale = float_of("t_scale");
    o.norm_eps = float_of("norm_eps");
    return o;
}

std::optional<ZImageKeys> find_zimage_dit(const io::WeightIndex& index) {
    static const std::string kPad = "x_pad_token";
    for (auto& t : index.tensors()) {
        if (t.name.size() < kPad.size() || t.name.compare(t.name.size() - kPad.size(), kPad.size(), kPad) != 0) continue;
        const std::string p = t.name.substr(0, t.name.size() - kPad.size());
        if (!p.empty() && p.back() != '.') continue;
        if (!index.find(p + "cap_pad_token")) continue;
        ZImageKeys k;
        k.prefix = p;
        bool dif = index.find(p + "layers.0.attention.to_q.weight") != nullptr;
        if (!dif)
            for (auto& u : index.tensors())
                if (starts(u.name, p + "all_x_embedder.")) {
                    dif = true;
                    break;
                }
        k.layout = dif ? ZImageKeys::Layout::Diffusers : ZImageKeys::Layout::Original;
        return k;
    }
    return std::nullopt;
}

ZImageDiTConfig infer_config(const io::WeightIndex& index, const ZImageKeys& keys, const ZImageOverrides& ov) {
    ZImageDiTConfig c;
    const std::string& P = keys.prefix;
    const bool dif = keys.layout == ZImageKeys::Layout::Diffusers;

    const auto& pad = need(index, P + "x_pad_token");
    if (pad.shape.empty() || pad.shape.size() > 2 || (pad.shape.size() == 2 && pad.shape[0] != 1))
        fail(ErrorKind::ModelMismatch, "Z-Image transformer: x_pad_token has shape [{}], expected [1, dim] or [dim]", fmt::join(pad.shape, ", "));
    c.pad_token_rank = (int)pad.shape.size();
    c.dim = pad.shape.back();

    // patch sizes: the diffusers key names them
    std::string xe;
    if (dif) {
        static const std::regex re(R"(all_x_embedder\.(\d+)-(\d+)\.weight)");
        for (auto& t : index.tensors()) {
            if (!starts(t.name, P)) continue;
            std::smatch m;
            const std::string rest = t.name.substr(P.size());
            if (std::regex_match(rest, m, re)) {
                c.patch = std::stoll(m[1].str());
                c.f_patch = std::stoll(m[2].str());
                xe = t.name;
                break;
            }
        }
        if (xe.empty()) fail(ErrorKind::ModelMismatch, "Z-Image transformer: no '{}all_x_embedder.<p>-<f>.weight' tensor", P);
    } else {
        xe = P + "x_embedder.weight";
    }
    if (ov.patch) c.patch = *ov.patch;
    if (ov.f_patch) c.f_patch = *ov.f_patch;
    if (c.patch <= 0 || c.f_patch <= 0) fail(ErrorKind::InvalidInput, "Z-Image transformer: patch sizes must be positive");
    if (dif && index.find(P + x_emb_name(c) + ".weight") == nullptr)
        fail(ErrorKind::InvalidInput, "Z-Image transformer: the file has no x_embedder for patch {}-{}", c.patch, c.f_patch);
    const auto& xw = need(index, xe);
    if (dim_of(xw, 0, 2) != c.dim)
        fail(ErrorKind::ModelMismatch, "Z-Image transformer: x_embedder [{}] does not match width {}", fmt::join(xw.shape, ", "), c.dim);
    const int64_t pin = xw.shape[1], pp = c.patch * c.patch * c.f_patch;
    if (pin % pp != 0)
        fail(ErrorKind::ModelMismatch, "Z-Image transformer: x_embedder input {} is not a multiple of patch {}x{}x{}", pin, c.f_patch,
             c.patch, c.patch);
    c.in_channels = pin / pp;
    if (ov.in_channels && *ov.in_channels != c.in_channels)
        fail(ErrorKind::InvalidInput, "Z-Image transformer: config in_channels {} but x_embedder says {}", *ov.in_channels, c.in_channels);
    const std::string fl = dif ? P + final_name(c) + "." : P + "final_layer.";
    const auto& fw = need(index, fl + "linear.weight");
    if (dim_of(fw, 1, 2) != c.dim || fw.shape[0] != pin)
        fail(ErrorKind::ModelMismatch, "Z-Image transformer: final_layer.linear [{}] does not match [{}, {}]", fmt::join(fw.shape, ", "),
             pin, c.dim);

    // layers
    c.n_layers = count_blocks(index, P + "layers.", ".attention_norm1.weight");
    c.n_noise_refiner = count_blocks(index, P + "noise_refiner.", ".attention_norm1.weight");
    c.n_context_refiner = count_blocks(index, P + "context_refiner.", ".attention_norm1.weight");
    if (c.n_layers == 0) fail(ErrorKind::ModelMismatch, "Z-Image transformer under '{}' has no layers", P);

    // heads
    const std::string a0 = P + "layers.0.attention.";
    const io::TensorInfo* nq = index.find(a0 + (dif ? "norm_q.weight" : "q_norm.weight"));
    c.qk_norm = nq != nullptr;
    if (c.qk_norm) {
        c.head_dim = dim_of(*nq, 0, 1);
        if (ov.n_heads && *ov.n_heads * c.head_dim != c.dim)
            fail(ErrorKind::InvalidInput, "Z-Image transformer: config n_heads {} disagrees with the qk-norm head size {} (width {})",
                 *ov.n_heads, c.head_dim, c.dim);
    } else {
        const int64_t h = ov.n_heads ? *ov.n_heads : (c.dim % 128 == 0 ? c.dim / 128 : 0);
        if (h <= 0 || c.dim % h != 0)
            fail(ErrorKind::InvalidInput, "Z-Image transformer without qk-norm: cannot infer the heads of width {}; give n_heads (config.json)",
                 c.dim);
        c.head_dim = c.dim / h;
    }
    if (c.head_dim <= 0 || c.head_dim % 2 != 0)
        fail(ErrorKind::ModelMismatch, "Z-Image transformer: head size {} is not a positive even number", c.head_dim);
    if (dif) {
        const auto& q = need(index, a0 + "to_q.weight");
        const auto& k = need(index, a0 + "to_k.weight");
        c.n_heads = dim_of(q, 0, 2) / c.head_dim;
        c.n_kv_heads = dim_of(k, 0, 2) / c.head_dim;
        if (q.shape[0] % c.head_dim != 0 || k.shape[0] % c.head_dim != 0)
            fail(ErrorKind::ModelMismatch, "Z-Image transformer: to_q/to_k rows {}/{} are not multiples of the head size {}", q.shape[0],
                 k.shape[0], c.head_dim);
    } else {
        const auto& qkv = need(index, a0 + "qkv.weight");
        const int64_t rows = dim_of(qkv, 0, 2);
        if (rows % c.head_dim != 0)
            fail(ErrorKind::ModelMismatch, "Z-Image transformer: qkv rows {} are not a multiple of the head size {}", rows, c.head_dim);
        const int64_t nh_total = rows / c.head_dim;
        if (ov.n_heads && ov.n_kv_heads && *ov.n_heads + 2 * *ov.n_kv_heads == nh_total) {
            c.n_heads = *ov.n_heads;
            c.n_kv_heads = *ov.n_kv_heads;
        } else if (nh_total % 3 == 0) {
            c.n_heads = c.n_kv_heads = nh_total / 3;
        } else {
            fail(ErrorKind::ModelMismatch, "Z-Image transformer: qkv rows {} do not split into q, k, v heads of size {}", rows, c.head_dim);
        }
    }
    if (c.n_heads <= 0 || c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0)
        fail(ErrorKind::ModelMismatch, "Z-Image transformer: {} query heads and {} key/value heads do not fit", c.n_heads, c.n_kv_heads);

    // feed-forward, caption, time
    c.ffn_hidden = dim_of(need(index, P + "layers.0.feed_forward.w1.weight"), 0, 2);
    const auto& capw = need(index, P + "cap_embedder.1.weight");
    if (dim_of(capw, 0, 2) != c.dim) fail(ErrorKind::ModelMismatch, "Z-Image transformer: cap_embedder.1 [{}] does not output width {}", fmt::join(capw.shape, ", "), c.dim);
    c.cap_feat_dim = capw.shape[1];
    const auto& t0 = need(index, P + "t_embedder.mlp.0.weight");
    const auto& t2 = need(index, P + "t_embedder.mlp.2.weight");
    c.t_hidden = dim_of(t0, 0, 2);
    c.t_freq_dim = t0.shape[1];
    c.adaln_dim = dim_of(t2, 0, 2);
    if (t2.shape[1] != c.t_hidden || c.t_freq_dim < 2)
        fail(ErrorKind::ModelMismatch, "Z-Image transformer: t_embedder shapes [{}] and [{}] do not chain", fmt::join(t0.shape, ", "),
             fmt::join(t2.shape, ", "));
    const auto& mod = need(index, P + "layers.0.adaLN_modulation.0.weight");
    if (dim_of(mod, 0, 2) != 4 * c.dim || mod.shape[1] != c.adaln_dim)
        fail(ErrorKind::ModelMismatch, "Z-Image transformer: adaLN_modulation [{}] is not [4 * {}, {}]", fmt::join(mod.shape, ", "), c.dim,
             c.adaln_dim);

    // what the weights cannot say
    if (ov.rope_theta) c.rope_theta = *ov.rope_theta;
    if (ov.t_scale) c.t_scale = *ov.t_scale;
    if (ov.norm_eps) c.norm_eps = *ov.norm_eps;
    if (ov.axes_lens) c.axes_lens = *ov.axes_lens;
    if (ov.axes_dims) {
        c.axes_dims = *ov.axes_dims;
    } else {
        // the released models' [32, 48, 48] (head 128), scaled to this head size
        if (c.head_dim % 16 != 0)
            fail(ErrorKind::InvalidInput,
                 "Z-Image transformer: head size {} is not a multiple of 16, so the RoPE axes [32, 48, 48] cannot be scaled to it; give "
                 "axes_dims (config.json)", c.head_dim);
        c.axes_dims = {c.head_dim / 4, c.head_dim * 3 / 8, c.head_dim * 3 / 8};
    }
    if (c.axes_dims[0] + c.axes_dims[1] + c.axes_dims[2] != c.head_dim || c.axes_dims[0] % 2 || c.axes_dims[1] % 2 || c.axes_dims[2] % 2 ||
        c.axes_dims[0] < 0 || c.axes_dims[1] < 0 || c.axes_dims[2] < 0)
        fail(ErrorKind::InvalidInput, "Z-Image transformer: RoPE axes [{}] must be even and sum to the head size {}",
             fmt::join(c.axes_dims, ", "), c.head_dim);
    return c;
}

nn::TensorSource make_tensor_source(const io::WeightIndex& index, const ZImageKeys& keys, const ZImageDiTConfig& cfg) {
    nn::TensorSource src(index, keys.prefix);
    if (keys.layout == ZImageKeys::Layout::Diffusers) return src;
    const std::string xe = x_emb_name(cfg) + ".", fl = final_name(cfg) + ".";
    src.set_mapper([xe, fl](const std::string& c) -> std::string {
        if (starts(c, xe)) return "x_embedder." + c.substr(xe.size());
        if (starts(c, fl)) return "final_layer." + c.substr(fl.size());
        static const std::pair<const char*, const char*> table[] = {
            {".attention.to_out.0.", ".attention.out."}, {".attention.norm_q.", ".attention.q_norm."}, {".attention.norm_k.", ".attention.k_norm."}};
        for (auto& [from, to] : table) {
            size_t i = c.find(from);
            if (i != std::string::npos) return c.substr(0, i) + to + c.substr(i + std::string(from).size());
        }
        return {};
    });
    const int64_t q = cfg.n_heads * cfg.head_dim, kv = cfg.n_kv_heads * cfg.head_dim;
    auto fuse = [&](const std::string& group, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
            const std::string b = group + "." + std::to_string(i) + ".attention.";
            const std::string stored = keys.prefix + b + "qkv.weight";
            src.slice_rows(b + "to_q.weight", stored, 0, q);
            src.slice_rows(b + "to_k.weight", stored, q, q + kv);
            src.slice_rows(b + "to_v.weight", stored, q + kv, q + 2 * kv);
        }
    };
    fuse("layers", cfg.n_layers);
    fuse("noise_refiner", cfg.n_noise_refiner);
    fuse("context_refiner", cfg.n_context_refiner);
    return src;
}

nn::LoadOptions default_load_options(const io::WeightIndex& index, const ZImageKeys& keys) {
    nn::LoadOptions o;
    o.ignore_unexpected_suffixes = {"norm_final.weight"};
    for (const char* p : {"siglip_embedder.", "siglip_refiner.", "siglip_pad_token"})
        for (auto& t : index.tensors())
            if (starts(t.name, keys.prefix + p)) o.ignore_unexpected_suffixes.push_back(t.name);
    return o;
}

// ---------------------------------------------------------------- RoPE tables

ZImageRope make_rope(const ZImageDiTConfig& cfg, int64_t H, int64_t W, int64_t L) {
    if (H <= 0 || W <= 0 || H % cfg.patch != 0 || W % cfg.patch != 0)
        fail(ErrorKind::InvalidInput, "Z-Image: latent size {}x{} must be positive multiples of the patch size {}", H, W, cfg.patch);
    if (L <= 0) fail(ErrorKind::InvalidInput, "Z-Image: the caption must have at least one token");
    ZImageRope r;
    const int64_t ht = H / cfg.patch, wt = W / cfg.patch;
    r.img_tokens = ht * wt;
    r.img_tokens_padded = round_up(r.img_tokens, kSeqMultiple);
    r.cap_tokens = L;
    r.cap_tokens_padded = round_up(L, kSeqMultiple);
    const int64_t half = cfg.head_dim / 2, S = r.tokens();
    r.cos.assign((size_t)(half * S), 0.0f);
    r.sin.assign((size_t)(half * S), 0.0f);
    // inverse frequencies per complex channel, float64 as RopeEmbedder.precompute_freqs_cis
    std::vector<double> inv((size_t)half);
    std::vector<int> axis((size_t)half);
    {
        int64_t k = 0;
        for (int a = 0; a < 3; ++a)
            for (int64_t j = 0; j < cfg.axes_dims[a] / 2; ++j, ++k) {
                inv[(size_t)k] = 1.0 / std::pow((double)cfg.rope_theta, (double)(2 * j) / (double)cfg.axes_dims[a]);
                axis[(size_t)k] = a;
            }
    }
    auto put = [&](int64_t row, int64_t p0, int64_t p1, int64_t p2) {
        const int64_t pos[3] = {p0, p1, p2};
        for (int64_t k = 0; k < half; ++k) {
            const float ang = (float)((double)pos[axis[(size_t)k]] * inv[(size_t)k]);
            r.cos[(size_t)(row * half + k)] = (float)std::cos((double)ang);
            r.sin[(size_t)(row * half + k)] = (float)std::sin((double)ang);
        }
    };
    const int64_t Lp = r.cap_tokens_padded;
    for (int64_t h = 0; h < ht; ++h)
        for (int64_t w = 0; w < wt; ++w) put(h * wt + w, Lp + 1, h, w);
    for (int64_t i = r.img_tokens; i < r.img_tokens_padded; ++i) put(i, 0, 0, 0);
    for (int64_t i = 0; i < Lp; ++i) put(r.img_tokens_padded + i, 1 + i, 0, 0);
    return r;
}

// ---------------------------------------------------------------- modules

void ZImageState::visit_tensors(const nn::StateTensorFn& f) {
    f("h", h);
    f("adaln", adaln);
    f("rope_cos", rope_cos);
    f("rope_sin", rope_sin);
}

ZImageBlock::ZImageBlock(const ZImageDiTConfig& cfg, bool modulation) : cfg_(cfg), modulation_(modulation) {
    const int64_t q = cfg.n_heads * cfg.head_dim, kv = cfg.n_kv_heads * cfg.head_dim;
    q_ = &add<nn::Linear>("attention.to_q", cfg.dim, q, false);
    k_ = &add<nn::Linear>("attention.to_k", cfg.dim, kv, false);
    v_ = &add<nn::Linear>("attention.to_v", cfg.dim, kv, false);
    o_ = &add<nn::Linear>("attention.to_out.0", q, cfg.dim, false);
    if (cfg.qk_norm) {
        // diffusers Attention(qk_norm="rms_norm", eps=1e-5): the eps is fixed, not norm_eps
        norm_q_ = &add<nn::RMSNorm>("attention.norm_q", cfg.head_dim, 1e-5f);
        norm_k_ = &add<nn::RMSNorm>("attention.norm_k", cfg.head_dim, 1e-5f);
        norm_q_->w->role = nn::ParamRole::Norm;
        norm_k_->w->role = nn::ParamRole::Norm;
    }
    w1_ = &add<nn::Linear>("feed_forward.w1", cfg.dim, cfg.ffn_hidden, false);
    w2_ = &add<nn::Linear>("feed_forward.w2", cfg.ffn_hidden, cfg.dim, false);
    w3_ = &add<nn::Linear>("feed_forward.w3", cfg.dim, cfg.ffn_hidden, false);
    attn_norm1_ = &add<nn::RMSNorm>("attention_norm1", cfg.dim, cfg.norm_eps);
    ffn_norm1_ = &add<nn::RMSNorm>("ffn_norm1", cfg.dim, cfg.norm_eps);
    attn_norm2_ = &add<nn::RMSNorm>("attention_norm2", cfg.dim, cfg.norm_eps);
    ffn_norm2_ = &add<nn::RMSNorm>("ffn_norm2", cfg.dim, cfg.norm_eps);
    if (modulation) mod_ = &add<nn::Linear>("adaLN_modulation.0", cfg.adaln_dim, 4 * cfg.dim, true);
}

ggml_tensor* ZImageBlock::forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* adaln, ggml_tensor* cos, ggml_tensor* sin) const {
    ggml_context* ctx = c.ctx;
    const int64_t D = cfg_.dim, S = x->ne[1], hd = cfg_.head_dim;
    if (x->ne[0] != D || x->ne[2] != 1 || x->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "Z-Image block: hidden state must be {{{}, S, 1}}, got {}", D, ne_s(x));
    if (cos->ne[0] != hd / 2 || cos->ne[1] != 1 || cos->ne[2] != S || sin->ne[0] != cos->ne[0] || sin->ne[2] != S)
        fail(ErrorKind::InvalidInput, "Z-Image block: rope tables {} / {} do not match head size {} and {} tokens", ne_s(cos), ne_s(sin), hd, S);
    ggml_tensor *scale_msa = nullptr, *gate_msa = nullptr, *scale_mlp = nullptr, *gate_mlp = nullptr;
    if (modulation_) {
        if (!adaln || adaln->ne[0] != cfg_.adaln_dim)
            fail(ErrorKind::InvalidInput, "Z-Image block: the modulated block needs the time embedding {{{}}}", cfg_.adaln_dim);
        ggml_tensor* m = mod_->forward(c, adaln);  // {4D, 1}: scale_msa, gate_msa, scale_mlp, gate_mlp
        const size_t es = ggml_element_size(m);
        scale_msa = ggml_view_1d(ctx, m, D, 0);
        gate_msa = ggml_tanh(ctx, ggml_view_1d(ctx, m, D, es * D));
        scale_mlp = ggml_view_1d(ctx, m, D, es * 2 * D);
        gate_mlp = ggml_tanh(ctx, ggml_view_1d(ctx, m, D, es * 3 * D));
    }
    // attention
    ggml_tensor* h = attn_norm1_->forward(c, x);
    if (modulation_) h = modulate(ctx, h, scale_msa);
    ggml_tensor* q = ggml_reshape_3d(ctx, q_->forward(c, h), hd, cfg_.n_heads, S);
    ggml_tensor* k = ggml_reshape_3d(ctx, k_->forward(c, h), hd, cfg_.n_kv_heads, S);
    ggml_tensor* v = v_->forward(c, h);  // {Hkv * hd, S, 1}
    if (norm_q_) q = norm_q_->forward(c, q);
    if (norm_k_) k = norm_k_->forward(c, k);
    q = ggml_reshape_3d(ctx, apply_rope(ctx, q, cos, sin), hd * cfg_.n_heads, S, 1);
    k = ggml_reshape_3d(ctx, apply_rope(ctx, k, cos, sin), hd * cfg_.n_kv_heads, S, 1);
    ggml_tensor* a = nn::attention(c, q, k, v, cfg_.n_heads, cfg_.n_kv_heads, nullptr);
    a = attn_norm2_->forward(c, o_->forward(c, a));
    if (modulation_) a = ggml_mul(ctx, a, gate_msa);
    x = ggml_add(ctx, x, a);
    // feed-forward (SwiGLU)
    h = ffn_norm1_->forward(c, x);
    if (modulation_) h = modulate(ctx, h, scale_mlp);
    h = w2_->forward(c, ggml_mul(ctx, ggml_silu(ctx, w1_->forward(c, h)), w3_->forward(c, h)));
    h = ffn_norm2_->forward(c, h);
    if (modulation_) h = ggml_mul(ctx, h, gate_mlp);
    return ggml_add(ctx, x, h);
}

ZImageDiT::ZImageDiT(const ZImageDiTConfig& cfg) : cfg_(cfg) {
    if (cfg.dim <= 0 || cfg.n_heads <= 0 || cfg.n_kv_heads <= 0 || cfg.head_dim <= 0 || cfg.head_dim % 2 != 0 || cfg.n_layers <= 0 ||
        cfg.in_channels <= 0 || cfg.patch <= 0 || cfg.f_patch != 1 || cfg.cap_feat_dim <= 0 || cfg.adaln_dim <= 0 || cfg.ffn_hidden <= 0 ||
        cfg.axes_dims[0] + cfg.axes_dims[1] + cfg.axes_dims[2] != cfg.head_dim)
        fail(ErrorKind::InvalidInput, "Z-Image transformer config is invalid ({}; temporal patch {})", cfg.summary(), cfg.f_patch);
    const int64_t pdim = cfg.patch * cfg.patch * cfg.f_patch * cfg.in_channels;
    const std::vector<int64_t> pad_shape = cfg.pad_token_rank == 1 ? std::vector<int64_t>{cfg.dim} : std::vector<int64_t>{1, cfg.dim};
    x_pad_ = &param("x_pad_token", pad_shape, nn::ParamRole::Norm);
    cap_pad_ = &param("cap_pad_token", pad_shape, nn::ParamRole::Norm);
    x_emb_ = &add<nn::Linear>(x_emb_name(cfg), pdim, cfg.dim);
    final_lin_ = &add<nn::Linear>(final_name(cfg) + ".linear", cfg.dim, pdim);
    final_mod_ = &add<nn::Linear>(final_name(cfg) + ".adaLN_modulation.1", cfg.adaln_dim, cfg.dim);
    for (int64_t i = 0; i < cfg.n_noise_refiner; ++i) noise_refiner_.push_back(&add<ZImageBlock>("noise_refiner." + std::to_string(i), cfg, true));
    for (int64_t i = 0; i < cfg.n_context_refiner; ++i)
        context_refiner_.push_back(&add<ZImageBlock>("context_refiner." + std::to_string(i), cfg, false));
    t_mlp0_ = &add<nn::Linear>("t_embedder.mlp.0", cfg.t_freq_dim, cfg.t_hidden);
    t_mlp2_ = &add<nn::Linear>("t_embedder.mlp.2", cfg.t_hidden, cfg.adaln_dim);
    cap_norm_ = &add<nn::RMSNorm>("cap_embedder.0", cfg.cap_feat_dim, cfg.norm_eps);
    cap_lin_ = &add<nn::Linear>("cap_embedder.1", cfg.cap_feat_dim, cfg.dim);
    for (int64_t i = 0; i < cfg.n_layers; ++i) layers_.push_back(&add<ZImageBlock>("layers." + std::to_string(i), cfg, true));
}

ZImageState ZImageDiT::prologue(nn::Ctx& c, const ZImageInputs& in) const {
    ggml_context* ctx = c.ctx;
    if (!in.x || !in.t || !in.cap || !in.rope_cos || !in.rope_sin)
        fail(ErrorKind::InvalidInput, "Z-Image transformer: x, t, cap, rope_cos and rope_sin are all required");
    if (!x_pad_->tensor) fail(ErrorKind::Internal, "Z-Image transformer: parameters not loaded");
    const int64_t W = in.x->ne[0], H = in.x->ne[1], C = in.x->ne[2], p = cfg_.patch;
    if (in.x->type != GGML_TYPE_F32 || C != cfg_.in_channels || in.x->ne[3] != 1 || H % p != 0 || W % p != 0)
        fail(ErrorKind::InvalidInput, "Z-Image transformer: latent must be F32 {{W, H, {}, 1}} with H and W multiples of {}, got {}",
             cfg_.in_channels, p, ne_s(in.x));
    if (in.t->type != GGML_TYPE_F32 || ggml_nelements(in.t) != 1)
        fail(ErrorKind::InvalidInput, "Z-Image transformer: t must be one F32 value (batch 1), got {}", ne_s(in.t));
    const int64_t L = in.cap->ne[1];
    if (in.cap->type != GGML_TYPE_F32 || in.cap->ne[0] != cfg_.cap_feat_dim || L < 1 || in.cap->ne[2] != 1 || in.cap->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "Z-Image transformer: caption features must be F32 {{{}, L >= 1, 1}}, got {}", cfg_.cap_feat_dim,
             ne_s(in.cap));
    const int64_t ht = H / p, wt = W / p, T = ht * wt, Tp = round_up(T, kSeqMultiple), Lp = round_up(L, kSeqMultiple), half = cfg_.head_dim / 2;
    for (ggml_tensor* r : {in.rope_cos, in.rope_sin})
        if (r->type != GGML_TYPE_F32 || r->ne[0] != half || r->ne[1] != Tp + Lp || r->ne[2] != 1 || r->ne[3] != 1)
            fail(ErrorKind::InvalidInput, "Z-Image transformer: rope tables must be F32 {{{}, {}}} (make_rope), got {}", half, Tp + Lp, ne_s(r));

    ZImageState s;
    s.img_tokens = T;
    s.h_tokens = ht;
    s.w_tokens = wt;
    s.rope_cos = ggml_reshape_3d(ctx, in.rope_cos, half, 1, Tp + Lp);
    s.rope_sin = ggml_reshape_3d(ctx, in.rope_sin, half, 1, Tp + Lp);
    auto part = [&](ggml_tensor* r, int64_t begin, int64_t n) { return ggml_view_3d(ctx, r, half, 1, n, r->nb[2], r->nb[2], (size_t)begin * r->nb[2]); };

    // time embedding: t_embedder(t * t_scale), [cos, sin] frequencies exp(-ln(1e4) i / half)
    ggml_tensor* tf = nn::timestep_embedding(c, ggml_scale(ctx, in.t, cfg_.t_scale), (int)cfg_.t_freq_dim, true, 0.0f);
    s.adaln = t_mlp2_->forward(c, ggml_silu(ctx, t_mlp0_->forward(c, tf)));  // {adaln_dim, 1}

    // image tokens: patchify [C, ht, p, wt, p] -> [ht * wt, (p, p, C)]
    ggml_tensor* x = ggml_reshape_4d(ctx, in.x, p, wt, p, ht * C);
    x = ggml_cont(ctx, ggml_permute(ctx, x, 0, 2, 1, 3));  // {pw, ph, wt, ht * C}
    x = ggml_reshape_3d(ctx, x, p * p, T, C);
    x = ggml_cont(ctx, ggml_permute(ctx, x, 1, 2, 0, 3));  // {C, p * p, T}
    x = x_emb_->forward(c, ggml_reshape_2d(ctx, x, C * p * p, T));  // {dim, T}
    if (Tp > T) x = ggml_concat(ctx, x, ggml_repeat_4d(ctx, x_pad_->tensor, cfg_.dim, Tp - T, 1, 1), 1);
    x = ggml_reshape_3d(ctx, x, cfg_.dim, Tp, 1);
    for (auto* b : noise_refiner_) x = b->forward(c, x, s.adaln, part(s.rope_cos, 0, Tp), part(s.rope_sin, 0, Tp));

    // caption tokens
    ggml_tensor* cap = cap_lin_->forward(c, cap_norm_->forward(c, in.cap));  // {dim, L, 1}
    cap = ggml_reshape_2d(ctx, cap, cfg_.dim, L);
    if (Lp > L) cap = ggml_concat(ctx, cap, ggml_repeat_4d(ctx, cap_pad_->tensor, cfg_.dim, Lp - L, 1, 1), 1);
    cap = ggml_reshape_3d(ctx, cap, cfg_.dim, Lp, 1);
    for (auto* b : context_refiner_) cap = b->forward(c, cap, nullptr, part(s.rope_cos, Tp, Lp), part(s.rope_sin, Tp, Lp));

    s.h = ggml_concat(ctx, x, cap, 1);  // {dim, Tp + Lp, 1}
    return s;
}

ZImageState ZImageDiT::block(nn::Ctx& c, int i, ZImageState s) const {
    if (i < 0 || i >= n_blocks()) fail(ErrorKind::InvalidInput, "Z-Image transformer has no layer {}", i);
    s.h = layers_[(size_t)i]->forward(c, s.h, s.adaln, s.rope_cos, s.rope_sin);
    return s;
}

ggml_tensor* ZImageDiT::epilogue(nn::Ctx& c, ZImageState s) const {
    ggml_context* ctx = c.ctx;
    const int64_t p = cfg_.patch, C = cfg_.in_channels, T = s.img_tokens, ht = s.h_tokens, wt = s.w_tokens;
    if (T != ht * wt || T <= 0 || s.h->ne[1] < T)
        fail(ErrorKind::InvalidInput, "Z-Image transformer: state holds {} image tokens for a {}x{} grid in {} tokens", T, ht, wt, s.h->ne[1]);
    // final layer: LayerNorm(eps 1e-6, no affine) * (1 + Linear(SiLU(adaln))), Linear
    ggml_tensor* scale = final_mod_->forward(c, ggml_silu(ctx, s.adaln));  // {dim, 1}
    ggml_tensor* y = modulate(ctx, ggml_norm(ctx, s.h, 1e-6f), scale);
    y = final_lin_->forward(c, y);  // {p * p * C, S, 1}
    y = ggml_view_2d(ctx, y, y->ne[0], T, y->nb[1], 0);  // the image's real tokens come first
    // unpatchify [ht * wt, (p, p, C)] -> [C, ht, p, wt, p]
    y = ggml_reshape_3d(ctx, y, C, p * p, T);
    y = ggml_cont(ctx, ggml_permute(ctx, y, 2, 0, 1, 3));  // {p * p, T, C}
    y = ggml_reshape_4d(ctx, y, p, p, wt, ht * C);         // {pw, ph, wt, ht * C}
    y = ggml_cont(ctx, ggml_permute(ctx, y, 0, 2, 1, 3));  // {pw, wt, ph, ht * C}
    return ggml_reshape_4d(ctx, y, wt * p, ht * p, C, 1);
}

// ---------------------------------------------------------------- host-level API

LoadedZImageDiT::~LoadedZImageDiT() = default;

std::unique_ptr<LoadedZImageDiT> LoadedZImageDiT::load(const io::WeightIndex& index, const ZImageLoadOptions& opt) {
    auto keys = find_zimage_dit(index);
    if (!keys)
        fail(ErrorKind::ModelMismatch, "no Z-Image transformer in this file (no x_pad_token / cap_pad_token tensors); pass the Z-Image "
                                       "diffusion model (--diffusion-model)");
    ZImageOverrides ov;
    if (const nlohmann::json* cj = index.config()) ov = overrides_from_config_json(*cj);
    const ZImageOverrides& o = opt.overrides;
    if (o.n_heads) ov.n_heads = o.n_heads;
    if (o.n_kv_heads) ov.n_kv_heads = o.n_kv_heads;
    if (o.in_channels) ov.in_channels = o.in_channels;
    if (o.patch) ov.patch = o.patch;
    if (o.f_patch) ov.f_patch = o.f_patch;
    if (o.axes_dims) ov.axes_dims = o.axes_dims;
    if (o.axes_lens) ov.axes_lens = o.axes_lens;
    if (o.rope_theta) ov.rope_theta = o.rope_theta;
    if (o.t_scale) ov.t_scale = o.t_scale;
    if (o.norm_eps) ov.norm_eps = o.norm_eps;
    ZImageDiTConfig cfg = infer_config(index, *keys, ov);
    std::unique_ptr<LoadedZImageDiT> m(new LoadedZImageDiT());
    m->opt_ = opt;
    m->runner_ = std::make_unique<runtime::GraphRunner>(opt.device, opt.threads);
    m->net_ = std::make_unique<ZImageDiT>(cfg);
    nn::TensorSource src = make_tensor_source(index, *keys, cfg);
    nn::LoadOptions lo = default_load_options(index, *keys);
    lo.weight_type = opt.weight_type;
    m->params_ = nn::ParamBuffer::load(*m->net_, src, m->runner_->buffer_type(), lo);
    log::debug("Z-Image transformer ({} layout, prefix '{}'): {}", keys->layout == ZImageKeys::Layout::Diffusers ? "diffusers" : "original",
               keys->prefix, cfg.summary());
    return m;
}

size_t LoadedZImageDiT::param_bytes() const { return params_.size(); }

void LoadedZImageDiT::forward(const float* x, int64_t H, int64_t W, float t, const float* cap, int64_t L, float* out) {
    const ZImageDiTConfig& cfg = net_->config();
    if (!x || !cap || !out) fail(ErrorKind::InvalidInput, "Z-Image transformer: null buffer");
    if (!std::isfinite(t)) fail(ErrorKind::InvalidInput, "Z-Image transformer: t must be finite");
    ZImageRope rope = make_rope(cfg, H, W, L);  // validates H, W, L
    const int64_t C = cfg.in_channels, D = cfg.cap_feat_dim, half = cfg.head_dim / 2;
    runner_->set_threads(opt_.threads);
    auto res = runner_->run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), opt_.flash_attn, g.backend()};
        ZImageInputs in;
        in.x = g.input_f32("x", {W, H, C, 1}, std::span<const float>(x, (size_t)(C * H * W)));
        in.t = g.input_f32("t", {1}, std::span<const float>(&t, 1));
        in.cap = g.input_f32("cap", {D, L, 1}, std::span<const float>(cap, (size_t)(L * D)));
        in.rope_cos = g.input_f32("rope_cos", {half, rope.tokens()}, rope.cos);
        in.rope_sin = g.input_f32("rope_sin", {half, rope.tokens()}, rope.sin);
        return std::vector<ggml_tensor*>{net_->forward(c, in)};
    });
    compute_bytes_ = std::max(compute_bytes_, runner_->last_compute_bytes());
    if ((int64_t)res[0].data.size() != C * H * W)
        fail(ErrorKind::Internal, "Z-Image transformer: output has {} values, expected {}", res[0].data.size(), C * H * W);
    std::copy(res[0].data.begin(), res[0].data.end(), out);
}

}  // namespace easel::models::zimage
