#include "models/vae/autoencoder_kl.h"

#include "models/vae/tiling.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

namespace easel::vae {

namespace {

std::vector<std::string> split_dots(const std::string& s) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (true) {
        size_t p = s.find('.', start);
        parts.push_back(s.substr(start, p == std::string::npos ? std::string::npos : p - start));
        if (p == std::string::npos) break;
        start = p + 1;
    }
    return parts;
}

std::string join_dots(const std::vector<std::string>& parts, size_t from = 0) {
    std::string r;
    for (size_t i = from; i < parts.size(); ++i) {
        if (!r.empty()) r += '.';
        r += parts[i];
    }
    return r;
}

bool is_uint(const std::string& s) { return !s.empty() && std::all_of(s.begin(), s.end(), ::isdigit); }

// Renames inside a resnet: conv_shortcut -> nin_shortcut, the rest are equal.
std::string ldm_resnet_rest(const std::string& rest) {
    if (rest.rfind("conv_shortcut.", 0) == 0) return "nin_shortcut." + rest.substr(14);
    return rest;
}

// mid_block.<...> (parts from the mid_block element on) -> ldm "mid.<...>"; empty if unknown.
std::string ldm_mid(const std::vector<std::string>& p, size_t i) {
    // p[i] == "mid_block"
    if (i + 2 < p.size() && p[i + 1] == "resnets" && (p[i + 2] == "0" || p[i + 2] == "1"))
        return std::string("mid.block_") + (p[i + 2] == "0" ? "1" : "2") + "." + ldm_resnet_rest(join_dots(p, i + 3));
    if (i + 3 < p.size() && p[i + 1] == "attentions" && p[i + 2] == "0") {
        const std::string& what = p[i + 3];
        std::string rest;
        if (what == "group_norm") rest = "norm." + join_dots(p, i + 4);
        else if (what == "to_q") rest = "q." + join_dots(p, i + 4);
        else if (what == "to_k") rest = "k." + join_dots(p, i + 4);
        else if (what == "to_v") rest = "v." + join_dots(p, i + 4);
        else if (what == "to_out" && i + 4 < p.size() && p[i + 4] == "0") rest = "proj_out." + join_dots(p, i + 5);
        else return {};
        return "mid.attn_1." + rest;
    }
    return {};
}

std::string legacy_attn(const std::string& canonical) {
    static const std::pair<const char*, const char*> table[] = {
        {".attentions.0.to_q.", ".attentions.0.query."},
        {".attentions.0.to_k.", ".attentions.0.key."},
        {".attentions.0.to_v.", ".attentions.0.value."},
        {".attentions.0.to_out.0.", ".attentions.0.proj_attn."},
    };
    for (auto& [from, to] : table) {
        size_t p = canonical.find(from);
        if (p != std::string::npos) return canonical.substr(0, p) + to + canonical.substr(p + std::strlen(from));
    }
    return canonical;
}

// kl_canonical_to_ldm, with the FLUX.2 placement of the quant convs when `quant_in_halves`.
std::string ldm_name(const std::string& canonical, int n_levels, bool quant_in_halves) {
    if (quant_in_halves) {
        if (canonical.rfind("quant_conv.", 0) == 0) return "encoder." + canonical;
        if (canonical.rfind("post_quant_conv.", 0) == 0) return "decoder." + canonical;
    }
    return kl_canonical_to_ldm(canonical, n_levels);
}

// Resolves canonical names of an AutoencoderKL in a source.
struct Resolver {
    const io::WeightIndex& index;
    const KLSource& src;
    int n_levels = 0;

    std::string stored(const std::string& canonical) const {
        switch (src.layout) {
            case KLLayout::Diffusers: return src.prefix + canonical;
            case KLLayout::DiffusersLegacy: return src.prefix + legacy_attn(canonical);
            case KLLayout::Ldm: return src.prefix + ldm_name(canonical, n_levels, src.quant_in_halves);
        }
        return src.prefix + canonical;
    }
    const io::TensorInfo* find(const std::string& canonical) const { return index.find(stored(canonical)); }
    const io::TensorInfo& need(const std::string& canonical, size_t rank) const {
        const io::TensorInfo* t = find(canonical);
        if (!t) fail(ErrorKind::ModelMismatch, "AutoencoderKL: missing tensor '{}' (looked up as '{}')", canonical, stored(canonical));
        if (t->shape.size() != rank)
            fail(ErrorKind::ModelMismatch, "AutoencoderKL: tensor '{}' has rank {}, expected {}", stored(canonical), t->shape.size(), rank);
        return *t;
    }
};

// Counts levels directly on stored names (they do not need the level count to resolve).
int count_levels(const io::WeightIndex& index, const KLSource& src, bool encoder) {
    int n = 0;
    while (true) {
        std::string key;
        if (src.layout == KLLayout::Ldm)
            key = fmt::format("{}{}.{}.{}.block.0.conv1.weight", src.prefix, encoder ? "encoder" : "decoder", encoder ? "down" : "up", n);
        else
            key = fmt::format("{}{}.{}.{}.resnets.0.conv1.weight", src.prefix, encoder ? "encoder" : "decoder",
                              encoder ? "down_blocks" : "up_blocks", n);
        if (!index.contains(key)) return n;
        ++n;
    }
}

ggml_tensor* silu(nn::Ctx& c, ggml_tensor* x) { return ggml_silu(c.ctx, x); }

void check_groups(int groups, int64_t channels, const char* where) {
    if (groups <= 0 || channels % groups != 0)
        fail(ErrorKind::ModelMismatch,
             "AutoencoderKL: {} has {} channels, not divisible by norm_num_groups={}; set the group count from the model's config.json",
             where, channels, groups);
}

}  // namespace

std::string kl_canonical_to_ldm(const std::string& canonical, int n_levels) {
    auto p = split_dots(canonical);
    if (p.size() < 2) return canonical;
    const std::string& half = p[0];
    if (half != "encoder" && half != "decoder") return canonical;  // quant_conv, post_quant_conv
    const std::string& what = p[1];
    if (what == "conv_norm_out") return half + ".norm_out." + join_dots(p, 2);
    if (what == "mid_block") {
        std::string m = ldm_mid(p, 1);
        return m.empty() ? canonical : half + "." + m;
    }
    if ((what == "down_blocks" || what == "up_blocks") && p.size() > 4 && is_uint(p[2])) {
        const bool up = what == "up_blocks";
        int level = std::atoi(p[2].c_str());
        if (up) level = n_levels - 1 - level;
        const std::string base = fmt::format("{}.{}.{}.", half, up ? "up" : "down", level);
        if (p[3] == "resnets" && is_uint(p[4])) return base + "block." + p[4] + "." + ldm_resnet_rest(join_dots(p, 5));
        if ((p[3] == "downsamplers" || p[3] == "upsamplers") && p[4] == "0")
            return base + (up ? "upsample." : "downsample.") + join_dots(p, 5);
    }
    return canonical;
}

std::optional<KLSource> find_autoencoder_kl(const io::WeightIndex& index) {
    for (const char* prefix : {"", "first_stage_model.", "vae."}) {
        const std::string pre = prefix;
        KLSource s;
        s.prefix = pre;
        const bool diff_enc = index.contains(pre + "encoder.down_blocks.0.resnets.0.conv1.weight");
        const bool diff_dec = index.contains(pre + "decoder.up_blocks.0.resnets.0.conv1.weight");
        const bool ldm_enc = index.contains(pre + "encoder.down.0.block.0.conv1.weight");
        const bool ldm_dec = index.contains(pre + "decoder.up.0.block.0.conv1.weight");
        if (diff_enc || diff_dec) {
            s.layout = (index.contains(pre + "encoder.mid_block.attentions.0.query.weight") ||
                        index.contains(pre + "decoder.mid_block.attentions.0.query.weight"))
                           ? KLLayout::DiffusersLegacy
                           : KLLayout::Diffusers;
            s.has_encoder = diff_enc && index.contains(pre + "encoder.conv_in.weight");
            s.has_decoder = diff_dec && index.contains(pre + "decoder.conv_in.weight");
        } else if (ldm_enc || ldm_dec) {
            s.layout = KLLayout::Ldm;
            s.quant_in_halves = index.contains(pre + "encoder.quant_conv.weight") || index.contains(pre + "decoder.post_quant_conv.weight");
            s.has_encoder = ldm_enc && index.contains(pre + "encoder.conv_in.weight");
            s.has_decoder = ldm_dec && index.contains(pre + "decoder.conv_in.weight");
        } else {
            continue;
        }
        if (s.has_encoder || s.has_decoder) return s;
    }
    return std::nullopt;
}

KLOverrides kl_overrides_from_diffusers_config(const nlohmann::json& config) {
    KLOverrides ov;
    if (!config.is_object()) fail(ErrorKind::InvalidInput, "AutoencoderKL config.json is not a JSON object");
    if (auto it = config.find("norm_num_groups"); it != config.end() && !it->is_null()) {
        if (!it->is_number_integer() || it->get<int64_t>() <= 0)
            fail(ErrorKind::InvalidInput, "AutoencoderKL config.json: norm_num_groups must be a positive integer");
        ov.norm_num_groups = int(it->get<int64_t>());
    }
    return ov;
}

AutoencoderKLConfig infer_autoencoder_kl_config(const io::WeightIndex& index, const KLSource& src, const KLOverrides& ov) {
    AutoencoderKLConfig cfg;
    cfg.has_encoder = src.has_encoder;
    cfg.has_decoder = src.has_decoder;
    if (!cfg.has_encoder && !cfg.has_decoder)
        fail(ErrorKind::ModelMismatch, "AutoencoderKL: neither encoder nor decoder weights found under prefix '{}'", src.prefix);
    const int n_enc = cfg.has_encoder ? count_levels(index, src, true) : 0;
    const int n_dec = cfg.has_decoder ? count_levels(index, src, false) : 0;
    if (cfg.has_encoder && cfg.has_decoder && n_enc != n_dec)
        fail(ErrorKind::ModelMismatch, "AutoencoderKL: encoder has {} levels but decoder {}", n_enc, n_dec);
    const int n = std::max(n_enc, n_dec);
    if (n < 1) fail(ErrorKind::ModelMismatch, "AutoencoderKL: no resolution levels found under prefix '{}'", src.prefix);
    Resolver r{index, src, n};

    auto count_resnets = [&](const std::string& base) {
        int k = 0;
        while (r.find(fmt::format("{}.resnets.{}.conv1.weight", base, k))) ++k;
        return k;
    };

    std::vector<int64_t> enc_ch, dec_ch;
    if (cfg.has_encoder) {
        for (int i = 0; i < n; ++i)
            enc_ch.push_back(r.need(fmt::format("encoder.down_blocks.{}.resnets.0.conv1.weight", i), 4).shape[0]);
        cfg.layers_per_block = count_resnets("encoder.down_blocks.0");
        const auto& ci = r.need("encoder.conv_in.weight", 4);
        cfg.in_channels = ci.shape[1];
        const auto& co = r.need("encoder.conv_out.weight", 4);
        if (co.shape[0] % 2 != 0)
            fail(ErrorKind::ModelMismatch, "AutoencoderKL: encoder.conv_out has {} output channels; expected 2 x latent channels", co.shape[0]);
        cfg.latent_channels = co.shape[0] / 2;
        cfg.mid_block_attention = r.find("encoder.mid_block.attentions.0.to_q.weight") != nullptr;
    }
    if (cfg.has_decoder) {
        dec_ch.assign(size_t(n), 0);
        for (int i = 0; i < n; ++i)
            dec_ch[size_t(n - 1 - i)] = r.need(fmt::format("decoder.up_blocks.{}.resnets.0.conv1.weight", i), 4).shape[0];
        const int dec_layers = count_resnets("decoder.up_blocks.0") - 1;
        if (cfg.has_encoder && dec_layers != cfg.layers_per_block)
            fail(ErrorKind::ModelMismatch, "AutoencoderKL: decoder has {} resnets per level, expected layers_per_block+1 = {}",
                 dec_layers + 1, cfg.layers_per_block + 1);
        cfg.layers_per_block = dec_layers;
        const auto& ci = r.need("decoder.conv_in.weight", 4);
        if (cfg.has_encoder && ci.shape[1] != cfg.latent_channels)
            fail(ErrorKind::ModelMismatch, "AutoencoderKL: decoder takes {} latent channels, encoder emits {}", ci.shape[1],
                 cfg.latent_channels);
        cfg.latent_channels = ci.shape[1];
        cfg.out_channels = r.need("decoder.conv_out.weight", 4).shape[0];
        const bool dec_attn = r.find("decoder.mid_block.attentions.0.to_q.weight") != nullptr;
        if (cfg.has_encoder && dec_attn != cfg.mid_block_attention)
            fail(ErrorKind::ModelMismatch, "AutoencoderKL: encoder and decoder disagree on the mid-block attention");
        cfg.mid_block_attention = dec_attn;
    }
    if (cfg.has_encoder && cfg.has_decoder && enc_ch != dec_ch)
        fail(ErrorKind::ModelMismatch, "AutoencoderKL: encoder and decoder have different block_out_channels");
    cfg.block_out_channels = cfg.has_encoder ? enc_ch : dec_ch;
    if (cfg.layers_per_block < 1) fail(ErrorKind::ModelMismatch, "AutoencoderKL: no resnets found in the first level");
    cfg.use_quant_conv = r.find("quant_conv.weight") != nullptr;
    cfg.use_post_quant_conv = r.find("post_quant_conv.weight") != nullptr;
    cfg.conv_direct = ov.conv_direct;
    if (ov.norm_num_groups) cfg.norm_num_groups = *ov.norm_num_groups;
    else if (const nlohmann::json* js = index.config(); js && js->is_object())
        cfg.norm_num_groups = kl_overrides_from_diffusers_config(*js).norm_num_groups.value_or(32);
    else cfg.norm_num_groups = 32;
    for (int64_t ch : cfg.block_out_channels) check_groups(cfg.norm_num_groups, ch, "a level");
    return cfg;
}

// ---------------------------------------------------------------------------------------------
// Modules

ResnetBlock2D::ResnetBlock2D(int64_t in, int64_t out, int groups, float eps) {
    check_groups(groups, in, "a resnet input");
    check_groups(groups, out, "a resnet output");
    norm1 = &add<nn::GroupNorm>("norm1", groups, in, eps);
    conv1 = &add<nn::Conv2d>("conv1", in, out, 3, 1, 1);
    norm2 = &add<nn::GroupNorm>("norm2", groups, out, eps);
    conv2 = &add<nn::Conv2d>("conv2", out, out, 3, 1, 1);
    if (in != out) conv_shortcut = &add<nn::Conv2d>("conv_shortcut", in, out, 1, 1, 0);
}

ggml_tensor* ResnetBlock2D::forward(nn::Ctx& c, ggml_tensor* x) const {
    ggml_tensor* h = conv1->forward(c, silu(c, norm1->forward(c, x)));
    h = conv2->forward(c, silu(c, norm2->forward(c, h)));
    ggml_tensor* sc = conv_shortcut ? conv_shortcut->forward(c, x) : x;
    return ggml_add(c.ctx, sc, h);
}

AttnProjection::AttnProjection(int64_t ch, bool conv_shape) : channels(ch) {
    w = &param("weight", conv_shape ? std::vector<int64_t>{ch, ch, 1, 1} : std::vector<int64_t>{ch, ch}, nn::ParamRole::Weight);
    b = &param("bias", {ch}, nn::ParamRole::Bias);
}

ggml_tensor* AttnProjection::forward(nn::Ctx& c, ggml_tensor* x) const {
    ggml_tensor* W = w->tensor;
    if (ggml_n_dims(W) > 2) W = ggml_reshape_2d(c.ctx, W, channels, channels);  // [C, C, 1, 1] -> [C, C]
    return ggml_add(c.ctx, nn::weight_matmul(c, *w, W, x), b->tensor);
}

VaeAttention::VaeAttention(int64_t ch, int groups, float eps, bool conv_shape) : channels(ch) {
    group_norm = &add<nn::GroupNorm>("group_norm", groups, ch, eps);
    to_q = &add<AttnProjection>("to_q", ch, conv_shape);
    to_k = &add<AttnProjection>("to_k", ch, conv_shape);
    to_v = &add<AttnProjection>("to_v", ch, conv_shape);
    to_out = &add<AttnProjection>("to_out.0", ch, conv_shape);
}

ggml_tensor* VaeAttention::forward(nn::Ctx& c, ggml_tensor* x) const {
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2], N = x->ne[3];
    ggml_tensor* h = group_norm->forward(c, x);
    h = ggml_reshape_3d(c.ctx, h, W * H, C, N);
    h = ggml_cont(c.ctx, ggml_permute(c.ctx, h, 1, 0, 2, 3));  // {C, L, N}
    ggml_tensor* q = to_q->forward(c, h);
    ggml_tensor* k = to_k->forward(c, h);
    ggml_tensor* v = to_v->forward(c, h);
    ggml_tensor* a = nn::attention(c, q, k, v, 1, 1);           // {C, L, N}
    a = to_out->forward(c, a);
    a = ggml_cont(c.ctx, ggml_permute(c.ctx, a, 1, 0, 2, 3));  // {L, C, N}
    a = ggml_reshape_4d(c.ctx, a, W, H, C, N);
    return ggml_add(c.ctx, a, x);
}

VaeMidBlock::VaeMidBlock(int64_t ch, int groups, float eps, bool attention, bool conv_shape) {
    resnet0 = &add<ResnetBlock2D>("resnets.0", ch, ch, groups, eps);
    if (attention) attn = &add<VaeAttention>("attentions.0", ch, groups, eps, conv_shape);
    resnet1 = &add<ResnetBlock2D>("resnets.1", ch, ch, groups, eps);
}

ggml_tensor* VaeMidBlock::forward(nn::Ctx& c, ggml_tensor* x) const {
    x = resnet0->forward(c, x);
    if (attn) x = attn->forward(c, x);
    return resnet1->forward(c, x);
}

DownEncoderBlock2D::DownEncoderBlock2D(int64_t in, int64_t out, int layers, bool downsample, int groups, float eps) {
    for (int j = 0; j < layers; ++j)
        resnets.push_back(&add<ResnetBlock2D>(fmt::format("resnets.{}", j), j == 0 ? in : out, out, groups, eps));
    if (downsample) down = &add<nn::Conv2d>("downsamplers.0.conv", out, out, 3, 2, 0);
}

ggml_tensor* DownEncoderBlock2D::forward(nn::Ctx& c, ggml_tensor* x) const {
    for (auto* r : resnets) x = r->forward(c, x);
    if (down) {
        x = ggml_pad_ext(c.ctx, x, 0, 1, 0, 1, 0, 0, 0, 0);  // F.pad(x, (0, 1, 0, 1))
        x = down->forward(c, x);
    }
    return x;
}

UpDecoderBlock2D::UpDecoderBlock2D(int64_t in, int64_t out, int layers, bool upsample, int groups, float eps) {
    for (int j = 0; j < layers; ++j)
        resnets.push_back(&add<ResnetBlock2D>(fmt::format("resnets.{}", j), j == 0 ? in : out, out, groups, eps));
    if (upsample) up = &add<nn::Conv2d>("upsamplers.0.conv", out, out, 3, 1, 1);
}

ggml_tensor* UpDecoderBlock2D::forward(nn::Ctx& c, ggml_tensor* x) const {
    for (auto* r : resnets) x = r->forward(c, x);
    if (up) {
        x = ggml_upscale(c.ctx, x, 2, GGML_SCALE_MODE_NEAREST);
        x = up->forward(c, x);
    }
    return x;
}

VaeEncoder::VaeEncoder(const AutoencoderKLConfig& cfg, bool conv_shape_attn) {
    const auto& ch = cfg.block_out_channels;
    const int g = cfg.norm_num_groups;
    const float eps = cfg.norm_eps;
    conv_in = &add<nn::Conv2d>("conv_in", cfg.in_channels, ch[0], 3, 1, 1);
    int64_t prev = ch[0];
    for (size_t i = 0; i < ch.size(); ++i) {
        down_blocks.push_back(&add<DownEncoderBlock2D>(fmt::format("down_blocks.{}", i), prev, ch[i], cfg.layers_per_block,
                                                       i + 1 < ch.size(), g, eps));
        prev = ch[i];
    }
    mid = &add<VaeMidBlock>("mid_block", ch.back(), g, eps, cfg.mid_block_attention, conv_shape_attn);
    norm_out = &add<nn::GroupNorm>("conv_norm_out", g, ch.back(), eps);
    conv_out = &add<nn::Conv2d>("conv_out", ch.back(), 2 * cfg.latent_channels, 3, 1, 1);
}

ggml_tensor* VaeEncoder::forward(nn::Ctx& c, ggml_tensor* x) const {
    x = conv_in->forward(c, x);
    for (auto* d : down_blocks) x = d->forward(c, x);
    x = mid->forward(c, x);
    x = silu(c, norm_out->forward(c, x));
    return conv_out->forward(c, x);
}

VaeDecoder::VaeDecoder(const AutoencoderKLConfig& cfg, bool conv_shape_attn) {
    const auto& ch = cfg.block_out_channels;
    const int g = cfg.norm_num_groups;
    const float eps = cfg.norm_eps;
    const size_t n = ch.size();
    conv_in = &add<nn::Conv2d>("conv_in", cfg.latent_channels, ch.back(), 3, 1, 1);
    mid = &add<VaeMidBlock>("mid_block", ch.back(), g, eps, cfg.mid_block_attention, conv_shape_attn);
    int64_t prev = ch.back();
    for (size_t i = 0; i < n; ++i) {
        const int64_t out = ch[n - 1 - i];
        up_blocks.push_back(&add<UpDecoderBlock2D>(fmt::format("up_blocks.{}", i), prev, out, cfg.layers_per_block + 1,
                                                   i + 1 < n, g, eps));
        prev = out;
    }
    norm_out = &add<nn::GroupNorm>("conv_norm_out", g, ch[0], eps);
    conv_out = &add<nn::Conv2d>("conv_out", ch[0], cfg.out_channels, 3, 1, 1);
}

AutoencoderKL::AutoencoderKL(const AutoencoderKLConfig& cfg, KLParts parts, bool ldm_attn_shape) : cfg_(cfg) {
    if (cfg.block_out_channels.empty()) fail(ErrorKind::InvalidInput, "AutoencoderKL: empty block_out_channels");
    const bool want_enc = parts != KLParts::DecoderOnly;
    const bool want_dec = parts != KLParts::EncoderOnly;
    if (parts == KLParts::EncoderOnly && !cfg.has_encoder)
        fail(ErrorKind::ModelMismatch, "AutoencoderKL: the encoder was asked for but the weights hold only a decoder");
    if (parts == KLParts::DecoderOnly && !cfg.has_decoder)
        fail(ErrorKind::ModelMismatch, "AutoencoderKL: the decoder was asked for but the weights hold only an encoder");
    if (want_enc && cfg.has_encoder) {
        encoder_ = &add<VaeEncoder>("encoder", cfg, ldm_attn_shape);
        if (cfg.use_quant_conv)
            quant_conv_ = &add<nn::Conv2d>("quant_conv", 2 * cfg.latent_channels, 2 * cfg.latent_channels, 1, 1, 0);
        enc_seq_ = std::make_unique<KLEncoderSequence>();
        enc_seq_->encoder_ = encoder_;
        enc_seq_->quant_conv_ = quant_conv_;
        using K = KLEncodeUnit::Kind;
        auto& units = enc_seq_->units_;
        for (size_t b = 0; b < encoder_->down_blocks.size(); ++b) {
            const DownEncoderBlock2D* db = encoder_->down_blocks[b];
            for (size_t j = 0; j < db->resnets.size(); ++j)
                units.push_back(KLEncodeUnit{K::Resnet, db->resnets[j], db->resnets[j], nullptr, nullptr,
                                             fmt::format("encoder.down_blocks.{}.resnets.{}", b, j)});
            if (db->down)
                units.push_back(KLEncodeUnit{K::Downsample, db->down, nullptr, nullptr, db->down,
                                             fmt::format("encoder.down_blocks.{}.downsamplers.0", b)});
        }
        const VaeMidBlock* mid = encoder_->mid;
        units.push_back(KLEncodeUnit{K::Resnet, mid->resnet0, mid->resnet0, nullptr, nullptr, "encoder.mid_block.resnets.0"});
        if (mid->attn) units.push_back(KLEncodeUnit{K::Attention, mid->attn, nullptr, mid->attn, nullptr, "encoder.mid_block.attentions.0"});
        units.push_back(KLEncodeUnit{K::Resnet, mid->resnet1, mid->resnet1, nullptr, nullptr, "encoder.mid_block.resnets.1"});
    }
    if (want_dec && cfg.has_decoder) {
        if (cfg.use_post_quant_conv)
            post_quant_conv_ = &add<nn::Conv2d>("post_quant_conv", cfg.latent_channels, cfg.latent_channels, 1, 1, 0);
        decoder_ = &add<VaeDecoder>("decoder", cfg, ldm_attn_shape);
        using K = KLDecodeUnit::Kind;
        auto resnet = [&](const ResnetBlock2D* r, std::string name) {
            units_.push_back(KLDecodeUnit{K::Resnet, r, r, nullptr, nullptr, std::move(name)});
        };
        resnet(decoder_->mid->resnet0, "decoder.mid_block.resnets.0");
        if (const VaeAttention* a = decoder_->mid->attn)
            units_.push_back(KLDecodeUnit{K::Attention, a, nullptr, a, nullptr, "decoder.mid_block.attentions.0"});
        resnet(decoder_->mid->resnet1, "decoder.mid_block.resnets.1");
        for (size_t b = 0; b < decoder_->up_blocks.size(); ++b) {
            const UpDecoderBlock2D* ub = decoder_->up_blocks[b];
            for (size_t j = 0; j < ub->resnets.size(); ++j) resnet(ub->resnets[j], fmt::format("decoder.up_blocks.{}.resnets.{}", b, j));
            if (ub->up)
                units_.push_back(KLDecodeUnit{K::Upsample, ub->up, nullptr, nullptr, ub->up, fmt::format("decoder.up_blocks.{}.upsamplers.0", b)});
        }
    }
    if (cfg_.conv_direct) nn::set_conv_direct(*this, true);
}

const KLEncoderSequence& AutoencoderKL::encoder_sequence() const {
    if (!enc_seq_) fail(ErrorKind::InvalidInput, "AutoencoderKL: this VAE was loaded without an encoder");
    return *enc_seq_;
}

ggml_tensor* AutoencoderKL::encode_moments(nn::Ctx& c, ggml_tensor* image) const {
    return encoder_sequence().forward(c, KLEncodeInputs{image});
}

KLEncodeState KLEncoderSequence::prologue(nn::Ctx& c, const KLEncodeInputs& in) const {
    return KLEncodeState{encoder_->conv_in->forward(c, in.image)};
}

KLEncodeState KLEncoderSequence::block(nn::Ctx& c, int i, KLEncodeState s) const {
    if (i < 0 || i >= n_blocks())
        fail(ErrorKind::InvalidInput, "AutoencoderKL: encoder block {} out of range [0, {})", i, n_blocks());
    const KLEncodeUnit& u = units_[size_t(i)];
    switch (u.kind) {
        case KLEncodeUnit::Kind::Resnet: s.h = u.resnet->forward(c, s.h); break;
        case KLEncodeUnit::Kind::Attention: s.h = u.attn->forward(c, s.h); break;
        case KLEncodeUnit::Kind::Downsample:
            // DownEncoderBlock2D's downsampler (downsampling.py Downsample2D, padding 0):
            // F.pad(x, (0, 1, 0, 1)), then the 3x3 conv with stride 2
            s.h = u.down->forward(c, ggml_pad_ext(c.ctx, s.h, 0, 1, 0, 1, 0, 0, 0, 0));
            break;
    }
    return s;
}

ggml_tensor* KLEncoderSequence::epilogue(nn::Ctx& c, KLEncodeState s) const {
    ggml_tensor* h = silu(c, encoder_->norm_out->forward(c, s.h));
    h = encoder_->conv_out->forward(c, h);
    if (quant_conv_) h = quant_conv_->forward(c, h);
    return h;
}

KLDecodeState AutoencoderKL::prologue(nn::Ctx& c, const KLDecodeInputs& in) const {
    if (!decoder_) fail(ErrorKind::InvalidInput, "AutoencoderKL: this VAE was loaded without a decoder");
    ggml_tensor* z = in.z;
    if (post_quant_conv_) z = post_quant_conv_->forward(c, z);
    return KLDecodeState{decoder_->conv_in->forward(c, z)};
}

KLDecodeState AutoencoderKL::block(nn::Ctx& c, int i, KLDecodeState s) const {
    if (i < 0 || i >= n_blocks())
        fail(ErrorKind::InvalidInput, "AutoencoderKL: decoder block {} out of range [0, {})", i, n_blocks());
    const KLDecodeUnit& u = units_[size_t(i)];
    switch (u.kind) {
        case KLDecodeUnit::Kind::Resnet: s.h = u.resnet->forward(c, s.h); break;
        case KLDecodeUnit::Kind::Attention: s.h = u.attn->forward(c, s.h); break;
        case KLDecodeUnit::Kind::Upsample:
            // UpDecoderBlock2D's upsampler (upsampling.py Upsample2D): nearest x2, 3x3 conv
            s.h = u.up->forward(c, ggml_upscale(c.ctx, s.h, 2, GGML_SCALE_MODE_NEAREST));
            break;
    }
    return s;
}

ggml_tensor* AutoencoderKL::epilogue(nn::Ctx& c, KLDecodeState s) const {
    if (!decoder_) fail(ErrorKind::InvalidInput, "AutoencoderKL: this VAE was loaded without a decoder");
    ggml_tensor* h = silu(c, decoder_->norm_out->forward(c, s.h));
    return decoder_->conv_out->forward(c, h);
}

ggml_tensor* AutoencoderKL::decode(nn::Ctx& c, ggml_tensor* z) const { return forward(c, KLDecodeInputs{z}); }

nn::TensorSource kl_tensor_source(const io::WeightIndex& index, const KLSource& src, const AutoencoderKLConfig& cfg) {
    nn::TensorSource ts(index, src.prefix);
    const int n_levels = int(cfg.block_out_channels.size());
    if (src.layout == KLLayout::Ldm)
        ts.set_mapper([n_levels, q = src.quant_in_halves](const std::string& canonical) { return ldm_name(canonical, n_levels, q); });
    else if (src.layout == KLLayout::DiffusersLegacy)
        ts.set_mapper([](const std::string& canonical) { return legacy_attn(canonical); });
    return ts;
}

nn::LoadOptions kl_load_options(const AutoencoderKLConfig& cfg, KLParts parts, ggml_type weight_type) {
    if (weight_type != GGML_TYPE_F32 && weight_type != GGML_TYPE_F16)
        fail(ErrorKind::InvalidInput, "VAE weights can be kept in F32 or F16, not {}", ggml_type_name(weight_type));
    nn::LoadOptions lo;
    lo.weight_type = weight_type;
    // A half left out on purpose leaves its stored keys unused: check unexpected keys only when
    // every half the weights hold was built.
    const bool enc = parts != KLParts::DecoderOnly && cfg.has_encoder, dec = parts != KLParts::EncoderOnly && cfg.has_decoder;
    lo.check_unexpected = enc == cfg.has_encoder && dec == cfg.has_decoder;
    // FLUX.2 VAE (AutoencoderKLFlux2): the BatchNorm statistics of the patchified latents are not
    // used by encode/decode (the pipeline normalises with them; models/flux/flux2_vae.h).
    lo.ignore_unexpected_suffixes = {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"};
    return lo;
}

// ---------------------------------------------------------------------------------------------
// Loaded model

AutoencoderKLModel::~AutoencoderKLModel() = default;

std::unique_ptr<AutoencoderKLModel> AutoencoderKLModel::load(const io::WeightIndex& index, ggml_backend_t backend,
                                                             const KLOverrides& ov, KLParts parts, ggml_type weight_type) {
    auto src = find_autoencoder_kl(index);
    if (!src)
        fail(ErrorKind::ModelMismatch,
             "no AutoencoderKL found: expected keys like 'decoder.up_blocks.0.resnets.0.conv1.weight' (diffusers) or "
             "'first_stage_model.decoder.up.0.block.0.conv1.weight' (ldm)");
    return load(index, *src, backend, ov, parts, weight_type);
}

std::unique_ptr<AutoencoderKLModel> AutoencoderKLModel::load(const io::WeightIndex& index, const KLSource& src,
                                                             ggml_backend_t backend, const KLOverrides& ov, KLParts parts,
                                                             ggml_type weight_type) {
    if (!backend) fail(ErrorKind::Internal, "AutoencoderKLModel::load called without a backend");
    AutoencoderKLConfig cfg = infer_autoencoder_kl_config(index, src, ov);
    std::unique_ptr<AutoencoderKLModel> m(new AutoencoderKLModel());
    m->backend_ = backend;
    m->module_ = std::make_unique<AutoencoderKL>(cfg, parts, src.layout == KLLayout::Ldm);

    nn::TensorSource ts = kl_tensor_source(index, src, cfg);
    const nn::LoadOptions lo = kl_load_options(cfg, parts, weight_type);
    m->params_ = nn::ParamBuffer::load(*m->module_, ts, ggml_backend_get_default_buffer_type(backend), lo);
    return m;
}

namespace {

void check_tiling(const TilingOptions& t, int f) {
    if (t.tile_size < f || t.tile_size % f != 0)
        fail(ErrorKind::InvalidInput, "VAE tile size {} must be a positive multiple of the spatial factor {}", t.tile_size, f);
}

}  // namespace

HostTensor encode_moments_with(const AutoencoderKLConfig& cfg, const HostTensor& image, const TilingOptions& tiling,
                               const std::function<HostTensor(const HostTensor&)>& run) {
    const int f = cfg.spatial_factor();
    if (image.c != cfg.in_channels)
        fail(ErrorKind::InvalidInput, "VAE encode: image has {} channels, the encoder takes {}", image.c, cfg.in_channels);
    if (image.n <= 0 || image.h <= 0 || image.w <= 0 || image.h % f != 0 || image.w % f != 0)
        fail(ErrorKind::InvalidInput, "VAE encode: image size {}x{} must be a positive multiple of {}", image.w, image.h, f);
    if (tiling.enabled) {
        check_tiling(tiling, f);
        if (image.h > tiling.tile_size || image.w > tiling.tile_size)
            return tiled_apply(image, tiling.tile_size, tiling.tile_size / f, tiling.overlap, run);
    }
    return run(image);
}

std::pair<int64_t, int64_t> encode_graph_image(const AutoencoderKLConfig& cfg, int64_t H, int64_t W, const TilingOptions& tiling) {
    if (!tiling.enabled) return {H, W};
    check_tiling(tiling, cfg.spatial_factor());
    const int64_t t = tiling.tile_size;
    if (H > t || W > t) return {std::min(H, t), std::min(W, t)};
    return {H, W};
}

HostTensor AutoencoderKLModel::encode_moments(const HostTensor& image, const TilingOptions& tiling, const ExecOptions& ex) const {
    if (!module_->has_encoder()) fail(ErrorKind::InvalidInput, "this VAE was loaded without its encoder; it cannot encode images");
    return encode_moments_with(config(), image, tiling, [&](const HostTensor& x) {
        return run_image_graph(backend_, x, [&](nn::Ctx& c, ggml_tensor* in) { return module_->encode_moments(c, in); }, ex);
    });
}

LatentDist AutoencoderKLModel::encode(const HostTensor& image, const TilingOptions& tiling, const ExecOptions& ex) const {
    return moments_to_dist(encode_moments(image, tiling, ex), config().latent_channels);
}

LatentDist moments_to_dist(const HostTensor& m, int64_t L) {
    if (L <= 0 || m.c != 2 * L)
        fail(ErrorKind::InvalidInput, "VAE encode: the encoder gave {} moment channels, expected 2 x {} latent channels", m.c, L);
    LatentDist d{HostTensor(m.n, L, m.h, m.w), HostTensor(m.n, L, m.h, m.w)};
    for (int64_t n = 0; n < m.n; ++n)
        for (int64_t c = 0; c < L; ++c)
            for (int64_t y = 0; y < m.h; ++y)
                for (int64_t x = 0; x < m.w; ++x) {
                    d.mean.at(n, c, y, x) = m.at(n, c, y, x);
                    d.logvar.at(n, c, y, x) = std::clamp(m.at(n, L + c, y, x), -30.0f, 20.0f);
                }
    return d;
}

HostTensor decode_with(const AutoencoderKLConfig& cfg, const HostTensor& latent, const TilingOptions& tiling,
                       const std::function<HostTensor(const HostTensor&)>& run) {
    if (latent.c != cfg.latent_channels)
        fail(ErrorKind::InvalidInput, "VAE decode: latent has {} channels, this VAE takes {}", latent.c, cfg.latent_channels);
    if (latent.h <= 0 || latent.w <= 0) fail(ErrorKind::InvalidInput, "VAE decode: empty latent");
    const int f = cfg.spatial_factor();
    if (tiling.enabled) {
        check_tiling(tiling, f);
        const int64_t lt = tiling.tile_size / f;
        if (latent.h > lt || latent.w > lt) return tiled_apply(latent, lt, tiling.tile_size, tiling.overlap, run);
    }
    return run(latent);
}

std::pair<int64_t, int64_t> decode_graph_latent(const AutoencoderKLConfig& cfg, int64_t h, int64_t w, const TilingOptions& tiling) {
    if (!tiling.enabled) return {h, w};
    const int f = cfg.spatial_factor();
    check_tiling(tiling, f);
    const int64_t lt = tiling.tile_size / f;
    if (h > lt || w > lt) return {std::min(h, lt), std::min(w, lt)};
    return {h, w};
}

HostTensor AutoencoderKLModel::decode(const HostTensor& latent, const TilingOptions& tiling, const ExecOptions& ex) const {
    if (!module_->has_decoder()) fail(ErrorKind::InvalidInput, "this VAE was loaded without its decoder; it cannot decode latents");
    return decode_with(config(), latent, tiling, [&](const HostTensor& z) {
        return run_image_graph(backend_, z, [&](nn::Ctx& c, ggml_tensor* in) { return module_->decode(c, in); }, ex);
    });
}

}  // namespace easel::vae
