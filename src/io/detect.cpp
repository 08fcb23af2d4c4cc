// Family detection (see detect.h and docs/formats.md for the rules).
#include "io/detect.h"

#include "core/strings.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

namespace easel::io {

namespace {

bool starts(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool contains(const std::string& s, const std::string& p) { return s.find(p) != std::string::npos; }

// Tensors of one component, names with the component prefix removed.
struct View {
    std::unordered_map<std::string, const TensorInfo*> m;
    std::vector<std::string> names;  // file order

    void add(const std::string& n, const TensorInfo* t) {
        if (m.emplace(n, t).second) names.push_back(n);
    }
    bool has(const std::string& k) const { return m.count(k) != 0; }
    const TensorInfo* get(const std::string& k) const {
        auto it = m.find(k);
        return it == m.end() ? nullptr : it->second;
    }
    // shape[i] of tensor k (negative i counts from the end), or -1 when absent.
    int64_t dim(const std::string& k, int i) const {
        const TensorInfo* t = get(k);
        if (!t) return -1;
        const int n = (int)t->shape.size();
        if (i < 0) i += n;
        return (i >= 0 && i < n) ? t->shape[i] : -1;
    }
    int rank(const std::string& k) const {
        const TensorInfo* t = get(k);
        return t ? (int)t->shape.size() : -1;
    }
    bool any_prefix(const std::string& p) const {
        for (auto& n : names)
            if (starts(n, p)) return true;
        return false;
    }
    bool any_contains(const std::string& p) const {
        for (auto& n : names)
            if (contains(n, p)) return true;
        return false;
    }
    // First name containing p (or "").
    std::string first_containing(const std::string& p) const {
        for (auto& n : names)
            if (contains(n, p)) return n;
        return "";
    }
    // Number of distinct integers N in names "<p>N." (N need not be contiguous).
    int count_blocks(const std::string& p) const {
        std::set<long> ids;
        for (auto& n : names) {
            if (!starts(n, p)) continue;
            size_t i = p.size(), j = i;
            while (j < n.size() && std::isdigit((unsigned char)n[j])) ++j;
            if (j > i && j < n.size() && n[j] == '.') ids.insert(std::stol(n.substr(i, j - i)));
        }
        return (int)ids.size();
    }
};

struct Verdict {
    std::string family, variant, kind, role, detail, layout;
    std::vector<std::string> notes;
    bool known() const { return !kind.empty(); }
};

std::string meta_str(const std::map<std::string, MetaValue>& meta, const std::string& k) {
    auto it = meta.find(k);
    if (it == meta.end()) return "";
    return it->second.kind == MetaValue::Kind::String ? it->second.s : "";
}

// --- UNet (SD1.x / SD2.x / SDXL) -------------------------------------------------------------
bool classify_unet(const View& v, const std::map<std::string, MetaValue>& meta, const nlohmann::json* cfg, Verdict& r) {
    const bool ldm = v.has("input_blocks.0.0.weight");
    const bool dif = v.has("conv_in.weight") && v.has("time_embedding.linear_1.weight");
    if (!ldm && !dif) return false;
    r.kind = "unet";
    r.role = "diffusion model";
    r.layout = ldm ? "original (LDM)" : "diffusers";
    const std::string in_k = ldm ? "input_blocks.0.0.weight" : "conv_in.weight";
    const int64_t in_ch = v.dim(in_k, 1), ch = v.dim(in_k, 0);
    const std::string k2 = v.first_containing("attn2.to_k.weight");
    const int64_t ctx = k2.empty() ? -1 : v.dim(k2, -1);
    const std::string pin = v.first_containing("proj_in.weight");
    const bool linear_proj = !pin.empty() && v.rank(pin) == 2;
    int64_t adm = v.dim("label_emb.0.0.weight", 1);
    if (adm < 0) adm = v.dim("add_embedding.linear_1.weight", 1);
    if (adm > 0) {
        r.family = "SDXL";
        if (ctx == 2048) r.variant = "base";
        else if (ctx == 1280) r.variant = "refiner";
        else r.variant = fmt::format("SDXL-style (context {}, adm {})", ctx, adm);
    } else if (ctx == 768) {
        r.family = "SD1.x";
    } else if (ctx == 1024) {
        r.family = "SD2.x";
    } else {
        r.family = linear_proj ? "SD2.x" : "SD1.x";
        r.notes.push_back(fmt::format("context width {} is not a released size: SD1/SD2 told apart by proj_in ({})", ctx,
                                      linear_proj ? "linear: SD2-style" : "1x1 conv: SD1-style"));
    }
    if (in_ch == 9) r.variant = r.variant.empty() ? "inpaint" : r.variant + ", inpaint";
    else if (in_ch == 8) r.variant = r.variant.empty() ? "instruct-pix2pix (8 in-channels)" : r.variant + ", 8 in-channels";
    if (r.family == "SD2.x") {
        std::string pred = ascii_lower(meta_str(meta, "modelspec.prediction_type") + meta_str(meta, "prediction_type"));
        if (cfg && cfg->is_object() && cfg->contains("prediction_type") && (*cfg)["prediction_type"].is_string())
            pred = ascii_lower((*cfg)["prediction_type"].get<std::string>());
        if (v.has("v_pred")) pred = "v";
        std::string p;
        if (contains(pred, "v")) p = "v-prediction";
        else if (contains(pred, "eps")) p = "eps-prediction";
        if (p.empty()) {
            r.variant = r.variant.empty() ? "768-v or 512 eps: prediction from config/metadata" : r.variant;
            r.notes.push_back("SD2.x: v-prediction (768-v) vs eps (512-base) cannot be seen from UNet weights; give --prediction or a config");
        } else {
            r.variant = r.variant.empty() ? p : r.variant + ", " + p;
        }
    }
    r.detail = fmt::format("UNet: {} in-channels, base width {}, context {}{}", in_ch, ch, ctx, adm > 0 ? fmt::format(", adm {}", adm) : "");
    return true;
}

// --- SD3 MMDiT -------------------------------------------------------------------------------
bool classify_sd3(const View& v, Verdict& r) {
    const bool orig = v.has("joint_blocks.0.context_block.attn.qkv.weight") || v.has("joint_blocks.0.x_block.attn.qkv.weight");
    const bool dif = v.has("pos_embed.proj.weight") && v.has("context_embedder.weight") && v.any_prefix("transformer_blocks.");
    if (!orig && !dif) return false;
    r.kind = "mmdit";
    r.role = "diffusion model";
    r.family = "SD3";
    r.layout = orig ? "original" : "diffusers";
    const int depth = orig ? v.count_blocks("joint_blocks.") : v.count_blocks("transformer_blocks.");
    const bool mmditx = orig ? v.any_contains(".x_block.attn2.") : v.any_contains(".attn2.");
    if (mmditx) r.variant = "3.5 medium";
    else if (depth == 38) r.variant = "3.5 large";
    else if (depth == 24) r.variant = "3 medium";
    else r.variant = fmt::format("{} joint blocks", depth);
    const int64_t w = orig ? v.dim("x_embedder.proj.weight", 0) : v.dim("pos_embed.proj.weight", 0);
    r.detail = fmt::format("MMDiT: {} joint blocks, width {}{}", depth, w, mmditx ? ", MMDiT-X (extra self-attention)" : "");
    return true;
}

// --- FLUX.1 / FLUX.2 -------------------------------------------------------------------------
bool classify_flux(const View& v, Verdict& r) {
    const bool bfl = v.has("double_blocks.0.img_attn.qkv.weight") || v.any_prefix("double_blocks.");
    const bool bfl2 = v.has("double_stream_modulation_img.lin.weight");
    const bool dif2 = v.has("double_stream_modulation_img.linear.weight");
    const bool dif1 = v.any_prefix("single_transformer_blocks.") && v.has("x_embedder.weight") && !dif2;
    if (!bfl && !bfl2 && !dif1 && !dif2) return false;
    r.role = "diffusion model";
    const bool is2 = bfl2 || dif2;
    const bool isbfl = bfl || bfl2;
    r.layout = isbfl ? "BFL" : "diffusers";
    const int nd = isbfl ? v.count_blocks("double_blocks.") : v.count_blocks("transformer_blocks.");
    const int ns = isbfl ? v.count_blocks("single_blocks.") : v.count_blocks("single_transformer_blocks.");
    const int64_t hidden = isbfl ? v.dim("img_in.weight", 0) : v.dim("x_embedder.weight", 0);
    const int64_t in_feat = isbfl ? v.dim("img_in.weight", 1) : v.dim("x_embedder.weight", 1);
    const int64_t txt = isbfl ? v.dim("txt_in.weight", 1) : v.dim("context_embedder.weight", 1);
    if (is2) {
        r.family = "FLUX.2";
        r.kind = "flux2";
        const bool guidance = v.has("guidance_in.in_layer.weight") || v.any_prefix("time_guidance_embed.guidance_embedder.");
        if (guidance) r.variant = "dev";
        else if (hidden == 3072 && nd == 5 && ns == 20) r.variant = "Klein 4B";
        else if (hidden == 4096 && nd == 8 && ns == 24) r.variant = "Klein 9B";
        else r.variant = "Klein (no guidance embedder)";
        r.detail = fmt::format("{} double + {} single blocks, hidden {}, text width {} (3 stacked LLM layers of {})", nd, ns, hidden,
                               txt, txt > 0 ? txt / 3 : -1);
    } else {
        r.family = "FLUX.1";
        r.kind = "flux1";
        const bool guidance = v.has("guidance_in.in_layer.weight") || v.any_prefix("time_text_embed.guidance_embedder.");
        if (v.any_prefix("distilled_guidance_layer.")) r.variant = "Chroma (FLUX.1-schnell derived)";
        else r.variant = guidance ? "dev" : "schnell";
        if (!guidance) r.notes.push_back("no guidance embedder: FLUX.1 schnell (or a de-distilled dev)");
        if (in_feat == 384) r.variant += ", Fill (inpaint)";
        else if (in_feat == 128) r.variant += ", Canny/Depth (control)";
        r.detail = fmt::format("{} double + {} single blocks, hidden {}, text width {}", nd, ns, hidden, txt);
    }
    return true;
}

// --- Z-Image / Qwen-Image --------------------------------------------------------------------
bool classify_dit_other(const View& v, Verdict& r) {
    if (v.any_prefix("noise_refiner.") && v.any_prefix("context_refiner.")) {
        r.family = "Z-Image";
        r.kind = "zimage";
        r.role = "diffusion model";
        r.layout = v.any_contains("attention.to_q.weight") ? "diffusers" : "original";
        int64_t dim = v.dim("x_pad_token", -1);
        r.detail = fmt::format("{} layers, {} noise + {} context refiner layers, width {}", v.count_blocks("layers."),
                               v.count_blocks("noise_refiner."), v.count_blocks("context_refiner."), dim);
        r.notes.push_back("Z-Image Turbo and base share one layout: sampling defaults come from metadata/config");
        return true;
    }
    if (v.any_contains(".img_mod.1.weight") && v.has("txt_norm.weight")) {
        r.family = "Qwen-Image";
        r.kind = "qwenimage";
        r.role = "diffusion model";
        r.layout = "diffusers";
        r.detail = fmt::format("{} blocks, width {}, text width {}", v.count_blocks("transformer_blocks."), v.dim("img_in.weight", 0),
                               v.dim("txt_in.weight", 1));
        r.notes.push_back("Qwen-Image and Qwen-Image-Edit share one layout");
        return true;
    }
    return false;
}

// --- VAEs ------------------------------------------------------------------------------------
bool classify_vae(const View& v, Verdict& r) {
    const bool dif = (v.has("encoder.conv_in.weight") && v.any_prefix("encoder.down_blocks.")) ||
                     (v.has("decoder.conv_in.weight") && v.any_prefix("decoder.up_blocks."));
    const bool ldm = (v.has("encoder.conv_in.weight") && v.any_prefix("encoder.down.")) ||
                     (v.has("decoder.conv_in.weight") && v.any_prefix("decoder.up."));
    if (v.any_prefix("encoder.downsamples.") || v.any_prefix("decoder.upsamples.")) {
        r.family = "Qwen-Image VAE";
        r.kind = "vae_wan";
        r.role = "VAE";
        r.layout = "original";
        r.detail = "causal 3D VAE (Wan 2.1 style)";
        return true;
    }
    if (!dif && !ldm) return false;
    r.role = "VAE";
    r.layout = dif ? "diffusers" : "original (LDM)";
    int64_t latent = v.dim("encoder.conv_out.weight", 0);
    if (latent > 0) latent /= 2;  // mean and log-variance
    else latent = v.dim("decoder.conv_in.weight", 1);
    const bool bn = v.has("bn.running_mean");
    const bool quant = v.has("quant_conv.weight") || v.has("post_quant_conv.weight");
    if (bn) {
        r.family = "FLUX.2 VAE";
        r.kind = "vae_flux2";
        r.detail = fmt::format("{} latent channels, batch-norm over {} patchified channels", latent, v.dim("bn.running_mean", 0));
    } else {
        r.kind = "vae_kl";
        if (latent == 4) {
            r.family = "SD VAE";
            r.notes.push_back("SD1.x, SD2.x and SDXL VAEs share this layout (SDXL's has other weights and scale 0.13025)");
        } else if (latent == 16) {
            r.family = "FLUX VAE";
            r.notes.push_back("16-channel KL VAE: FLUX.1, Z-Image and SD3 share this layout (scale/shift differ)");
        } else {
            r.family = "KL VAE";
        }
        r.detail = fmt::format("{} latent channels{}", latent, quant ? ", quant_conv" : "");
    }
    r.variant = fmt::format("{}ch", latent);
    return true;
}

// TAESD family: diffusers AutoencoderTiny (encoder.layers.N / decoder.layers.N) or the original
// numbered Sequential (N.weight, N.conv.M.weight).
bool classify_taesd(const View& v, Verdict& r) {
    bool diff = v.any_prefix("encoder.layers.") || v.any_prefix("decoder.layers.");
    bool orig = !v.names.empty();
    for (auto& n : v.names)
        if (n.empty() || !std::isdigit((unsigned char)n[0])) orig = false;
    if (!diff && !orig) return false;
    if (orig && !v.any_contains(".conv.")) return false;
    // Convs of a Sequential in index order: (index, name).
    auto convs = [&](const std::string& pre) {
        std::vector<std::pair<long, std::string>> c;
        for (auto& n : v.names) {
            if (!starts(n, pre)) continue;
            std::string rest = n.substr(pre.size());
            size_t j = 0;
            while (j < rest.size() && std::isdigit((unsigned char)rest[j])) ++j;
            if (j == 0 || rest.substr(j) != ".weight" || v.rank(n) != 4) continue;
            c.emplace_back(std::stol(rest.substr(0, j)), n);
        }
        std::sort(c.begin(), c.end());
        return c;
    };
    r.kind = "taesd";
    r.role = "VAE";
    r.layout = diff ? "diffusers" : "original";
    int64_t latent = -1;
    std::string part;
    bool pool = v.any_contains(".pool.");
    if (diff) {
        auto e = convs("encoder.layers."), d = convs("decoder.layers.");
        if (e.empty() && d.empty()) return false;
        if (!e.empty()) latent = v.dim(e.back().second, 0);
        else if (!d.empty()) latent = v.dim(d.front().second, 1);
        part = !e.empty() && !d.empty() ? "encoder + decoder" : !e.empty() ? "encoder" : "decoder";
    } else {
        auto c = convs("");
        if (c.empty()) return false;
        if (v.dim(c.front().second, 1) == 3) {
            part = "encoder";
            latent = v.dim(c.back().second, 0);
        } else if (v.dim(c.back().second, 0) == 3) {
            part = "decoder";
            latent = v.dim(c.front().second, 1);
        } else {
            return false;
        }
    }
    std::string name;
    if (latent == 4) name = "TAESD";
    else if (latent == 16) name = "TAEF1";
    else if (latent == 32 && pool) name = "TAEF2";
    else if (latent == 32) name = "TAESANA";
    else name = fmt::format("TAESD-style ({} latent channels)", latent);
    if (latent == 4) r.notes.push_back("TAESD and TAESDXL share one layout");
    if (latent == 16) r.notes.push_back("TAEF1 and TAESD3 share one layout");
    r.family = "TAESD";
    r.variant = name + " " + part;
    r.detail = fmt::format("tiny autoencoder {}, {} latent channels", part, latent);
    return true;
}

// --- Text encoders ---------------------------------------------------------------------------
bool classify_text(const View& v, Verdict& r) {
    for (const char* pre : {"text_model.", ""}) {
        std::string p = pre;
        if (!v.has(p + "embeddings.token_embedding.weight") || !v.any_prefix(p + "encoder.layers.")) continue;
        const int64_t h = v.dim(p + "embeddings.token_embedding.weight", 1);
        const int n = v.count_blocks(p + "encoder.layers.");
        r.family = "CLIP text encoder";
        r.kind = "clip";
        r.role = "text encoder";
        r.layout = "transformers";
        if (h == 768 && n == 12) r.variant = "CLIP-L";
        else if (h == 1280 && n == 32) r.variant = "CLIP-G (OpenCLIP bigG)";
        else if (h == 1024 && n == 24) r.variant = "OpenCLIP-H";
        else r.variant = fmt::format("hidden {}, {} layers", h, n);
        const bool proj = v.has("text_projection.weight");
        r.detail = fmt::format("CLIP text: hidden {}, {} layers{}", h, n, proj ? ", text_projection" : "");
        if (proj) r.variant += ", with projection";
        return true;
    }
    for (const char* pre : {"", "model."}) {
        std::string p = pre;
        if (!v.any_prefix(p + "transformer.resblocks.") || !v.has(p + "token_embedding.weight")) continue;
        const int64_t h = v.dim(p + "token_embedding.weight", 1);
        const int n = v.count_blocks(p + "transformer.resblocks.");
        r.family = "OpenCLIP text encoder";
        r.kind = "openclip";
        r.role = "text encoder";
        r.layout = "OpenCLIP";
        r.variant = h == 1024 ? "OpenCLIP-H (ViT-H/14)" : h == 1280 ? "OpenCLIP-G (ViT-bigG/14)" : fmt::format("hidden {}", h);
        r.detail = fmt::format("OpenCLIP text: hidden {}, {} layers", h, n);
        return true;
    }
    if (v.any_prefix("encoder.block.") && v.any_contains("SelfAttention.q.weight")) {
        int64_t d = v.dim("shared.weight", 1);
        if (d < 0) d = v.dim("encoder.embed_tokens.weight", 1);
        if (d < 0) d = v.dim(v.first_containing("SelfAttention.q.weight"), 1);
        const int n = v.count_blocks("encoder.block.");
        r.family = "T5 encoder";
        r.kind = "t5";
        r.role = "text encoder";
        r.layout = "transformers";
        r.variant = (d == 4096 && n == 24) ? "T5-XXL (v1.1)" : fmt::format("d_model {}, {} blocks", d, n);
        r.detail = fmt::format("T5 encoder: d_model {}, {} blocks{}", d, n, v.any_contains("wi_1.weight") ? ", gated-GELU" : "");
        return true;
    }
    // Decoder-only LLMs (transformers naming, with or without "model.").
    for (const char* pre : {"model.", "", "model.language_model.", "language_model.model."}) {
        std::string p = pre;
        if (!v.has(p + "embed_tokens.weight") || !v.any_prefix(p + "layers.")) continue;
        const int64_t h = v.dim(p + "embed_tokens.weight", 1);
        const int n = v.count_blocks(p + "layers.");
        const bool qn = v.any_contains("self_attn.q_norm.weight");
        const bool qb = v.any_contains("self_attn.q_proj.bias");
        r.kind = "llm";
        r.role = "text encoder";
        r.family = "LLM text encoder";
        r.layout = "transformers";
        std::string arch = qn ? "Qwen3" : qb ? "Qwen2/2.5" : "Llama/Mistral-style";
        if (v.any_prefix("visual.") || v.any_prefix("model.visual.")) arch = "Qwen2.5-VL";
        std::string size;
        if (arch == "Qwen3") {
            static const std::map<int64_t, const char*> q3 = {{1024, "0.6B"}, {2048, "1.7B"}, {2560, "4B"}, {4096, "8B"}, {5120, "14B"}};
            if (auto it = q3.find(h); it != q3.end()) size = std::string(" ") + it->second;
        }
        if (arch == "Qwen2.5-VL" && h == 3584) size = " 7B";
        if (arch == "Llama/Mistral-style" && h == 5120 && n == 40) size = " (Mistral Small 3.x 24B?)";
        r.variant = arch + size;
        r.detail = fmt::format("{}: hidden {}, {} layers{}", arch, h, n, v.has("lm_head.weight") ? ", lm_head" : "");
        return true;
    }
    if (v.has("token_embd.weight") && v.any_prefix("blk.")) {
        r.kind = "llm";
        r.role = "text encoder";
        r.family = "LLM text encoder";
        r.layout = "llama.cpp GGUF";
        r.variant = v.any_contains("attn_q_norm") ? "Qwen3-style (llama.cpp names)" : "llama.cpp names";
        r.detail = fmt::format("hidden {}, {} layers", v.dim("token_embd.weight", 1), v.count_blocks("blk."));
        return true;
    }
    return false;
}

// --- Upscalers -------------------------------------------------------------------------------
bool classify_esrgan(const View& v, Verdict& r) {
    r.role = "upscaler";
    r.kind = "esrgan";
    r.family = "ESRGAN upscaler";
    // RRDBNet: the upsampling stages double the size each; Real-ESRGAN's x2 / x1 models take the
    // image pixel-unshuffled by 2 / 4 (conv_first on 12 / 48 channels): scale = 2^stages / u
    auto unshuffle = [&](const std::string& first) {
        const int64_t in = v.dim(first, 1);
        return in == 12 ? 2 : in == 48 ? 4 : 1;
    };
    if (v.has("conv_first.weight") && (v.any_prefix("body.0.rdb1.") || v.any_prefix("RRDB_trunk.0."))) {
        const bool trunk = v.any_prefix("RRDB_trunk.");
        int n_up = 0;
        while (v.has(std::string(trunk ? "upconv" : "conv_up") + std::to_string(n_up + 1) + ".weight")) ++n_up;
        const int u = unshuffle("conv_first.weight");
        r.variant = fmt::format("RRDBNet x{}", std::max(1, (1 << n_up) / u));
        r.layout = trunk ? "ESRGAN (RRDB_trunk)" : "BasicSR";
        r.detail = fmt::format("RRDBNet: {} blocks, {} features{}", v.count_blocks(trunk ? "RRDB_trunk." : "body."), v.dim("conv_first.weight", 0),
                               u > 1 ? fmt::format(", pixel unshuffle {}", u) : "");
        return true;
    }
    if (v.has("model.0.weight") && v.any_contains(".RDB1.")) {
        // model.0 conv_first, model.1 the trunk, then the upsampling convs and the two HR convs
        int convs = 0;
        for (auto& n : v.names)
            if (starts(n, "model.") && !starts(n, "model.1.") && !starts(n, "model.0.") && v.rank(n) == 4) ++convs;
        const int u = unshuffle("model.0.weight");
        r.variant = fmt::format("RRDBNet x{}", std::max(1, (1 << std::max(0, convs - 2)) / u));
        r.layout = "ESRGAN (old)";
        r.detail = fmt::format("RRDBNet: {} blocks, {} features (original ESRGAN keys)", v.count_blocks("model.1.sub.") - 1, v.dim("model.0.weight", 0));
        return true;
    }
    if (v.has("body.0.weight") && v.rank("body.0.weight") == 4 && v.dim("body.0.weight", 1) == 3) {
        bool all_body = true;
        for (auto& n : v.names)
            if (!starts(n, "body.")) all_body = false;
        if (!all_body) return false;
        // SRVGGNetCompact: conv, PReLU, ..., last conv with 3 * scale^2 outputs (pixel shuffle).
        std::string last;
        long best = -1;
        for (auto& n : v.names) {
            if (v.rank(n) != 4) continue;
            long i = std::stol(n.substr(5));
            if (i > best) best = i, last = n;
        }
        const int64_t out = v.dim(last, 0);
        int scale = 1;
        while (scale * scale * 3 < out) ++scale;
        int convs = 0;
        for (auto& n : v.names) convs += v.rank(n) == 4;
        r.variant = fmt::format("SRVGGNetCompact x{}", scale);
        r.layout = "BasicSR";
        r.detail = fmt::format("compact VGG: {} convs, {} features, x{} pixel shuffle", convs, v.dim("body.0.weight", 0), scale);
        return true;
    }
    r = Verdict{};
    return false;
}

Verdict classify(const View& v, const std::map<std::string, MetaValue>& meta, const nlohmann::json* cfg) {
    Verdict r;
    if (classify_unet(v, meta, cfg, r) || classify_sd3(v, r) || classify_flux(v, r) || classify_dit_other(v, r) ||
        classify_vae(v, r) || classify_text(v, r) || classify_taesd(v, r) || classify_esrgan(v, r))
        return r;
    return Verdict{};
}

// --- LoRA and embeddings (whole-file formats) ------------------------------------------------
bool is_lora_key(const std::string& n) {
    return contains(n, "lora_up") || contains(n, "lora_down") || contains(n, "lora_A.") || contains(n, "lora_B.") ||
           contains(n, ".lokr_w") || contains(n, ".hada_w") || contains(n, "proj_lora") || contains(n, ".lora.down.") ||
           contains(n, ".lora.up.") || ((contains(n, ":down") || contains(n, ":up")) && n.find(':') != std::string::npos);
}

}  // namespace

std::string detect_lora_target(const std::vector<TensorInfo>& ts, std::vector<std::string>* notes_out) {
    std::vector<std::string> scratch;
    std::vector<std::string>& notes = notes_out ? *notes_out : scratch;
    std::string target;
    auto norm = [](std::string n) {
        for (auto& c : n)
            if (c == '_') c = '.';
        return n;
    };
    bool tblocks_only = false;
    int64_t tb_width = -1;
    bool flux = false, flux2 = false, qwen = false, unet = false, zimg = false, sd3 = false, cosmos = false, krea = false;
    for (auto& t : ts) {
        const std::string n = norm(t.name);
        // Z-Image (Lumina-style) blocks: layers.N.attention.{to_q,qkv,to_out} / feed_forward.w1-3
        if (contains(n, "layers.") && (contains(n, ".attention.to.q") || contains(n, ".attention.qkv") || contains(n, ".attention.to.out") ||
                                       contains(n, ".feed.forward.w")))
            zimg = true;
        if (contains(n, "txtfusion") || contains(n, ".attn.wq") || contains(n, "unet.tproj")) krea = true;
        if (contains(n, "double.blocks") || contains(n, "single.blocks") || contains(n, "single.transformer.blocks")) flux = true;
        if (contains(n, "to.qkv.mlp.proj") || contains(n, "double.stream.modulation")) flux2 = true;
        if (contains(n, "img.mlp") || contains(n, "txt.mlp") || contains(n, "img.mod")) qwen = true;
        if (contains(n, "input.blocks") || contains(n, "down.blocks") || contains(n, "output.blocks") || contains(n, "up.blocks") ||
            contains(n, "unet:"))
            unet = true;
        if (contains(n, "noise.refiner") || contains(n, "context.refiner")) zimg = true;
        if (contains(n, "blocks") && (contains(n, "mlp.layer1") || contains(n, "adaln.modulation.cross.attn"))) cosmos = true;
        if (contains(n, "joint.blocks")) sd3 = true;
        if (contains(n, "cross.attn") && contains(n, "blocks")) cosmos = true;
        if (contains(n, "transformer.blocks") && (contains(n, "lora.down") || contains(n, "lora.A")) && t.shape.size() == 2) {
            tblocks_only = true;
            tb_width = t.shape[1];
        }
    }
    if (flux && !flux2) {
        // BFL names are the same in both FLUX generations; the fused widths differ: single-block
        // linear1 = 3D + 2 * 3D (FLUX.2, SwiGLU) vs 3D + 4D (FLUX.1), img_mlp.0 = 6D vs 4D
        std::map<std::string, int64_t> up_rows, down_cols;
        for (auto& t : ts) {
            if (t.shape.size() != 2) continue;
            for (const char* suf : {".lora_up.weight", ".lora_B.weight", ".lora.up.weight"})
                if (t.name.size() > strlen(suf) && t.name.compare(t.name.size() - strlen(suf), strlen(suf), suf) == 0)
                    up_rows[t.name.substr(0, t.name.size() - strlen(suf))] = t.shape[0];
            for (const char* suf : {".lora_down.weight", ".lora_A.weight", ".lora.down.weight"})
                if (t.name.size() > strlen(suf) && t.name.compare(t.name.size() - strlen(suf), strlen(suf), suf) == 0)
                    down_cols[t.name.substr(0, t.name.size() - strlen(suf))] = t.shape[1];
        }
        for (auto& [m, rows] : up_rows) {
            auto d = down_cols.find(m);
            if (d == down_cols.end() || d->second <= 0) continue;
            const std::string n = norm(m);
            if ((contains(n, "linear1") && rows == 9 * d->second) || ((contains(n, "img.mlp.0") || contains(n, "txt.mlp.0")) && rows == 6 * d->second))
                flux2 = true;
        }
    }
    if (flux) target = flux2 ? "FLUX.2" : "FLUX.1";
    else if (qwen) target = "Qwen-Image";
    else if (zimg) target = "Z-Image";
    else if (sd3) target = "SD3";
    else if (unet) {
        // Cross-attention key input width names the UNet family: 768 SD1.x, 1024 SD2.x, 2048 SDXL.
        int64_t ctx = -1;
        bool te2 = false;
        for (auto& t : ts) {
            const std::string n = norm(t.name);
            if (starts(t.name, "lora_te2_") || contains(t.name, "text_encoder_2")) te2 = true;
            if (contains(n, "attn2.to.k") && (contains(n, "lora.down") || contains(n, "lora.A")) && t.shape.size() == 2) ctx = t.shape[1];
        }
        target = (te2 || ctx == 2048) ? "SDXL" : ctx == 1024 ? "SD2.x" : "SD1.x";
        if (ctx < 0 && !te2) {
            // cloneofsimo: text encoder rank-r pairs of width 768 (CLIP-L) mean SD1.x.
            for (auto& t : ts)
                if (starts(t.name, "text_encoder:") && t.shape.size() == 2 && (t.shape[1] == 768 || t.shape[0] == 768)) ctx = 768;
            if (ctx < 0) notes.push_back("UNet LoRA without cross-attention keys: SD1.x assumed");
        }
    } else if (tblocks_only && tb_width == 3072) {
        target = "Qwen-Image";
        notes.push_back("only transformer_blocks keys of width 3072: Qwen-Image assumed (a FLUX.1 LoRA would also touch single blocks)");
    } else if (tblocks_only) {
        target = "SD3 (transformer_blocks only)";
    } else if (cosmos) {
        target = "Anima/Cosmos";
    } else if (krea) {
        target = "Krea 2";
    } else {
        target = "unknown model";
    }
    return target;
}

namespace {

bool detect_lora(const std::vector<TensorInfo>& ts, Detection& d) {
    size_t n_lora = 0;
    for (auto& t : ts) n_lora += is_lora_key(t.name);
    if (n_lora == 0) return false;
    auto any = [&](auto pred) {
        for (auto& t : ts)
            if (pred(t.name)) return true;
        return false;
    };
    auto has_sub = [&](const char* s) { return any([&](const std::string& n) { return contains(n, s); }); };
    d.family = "LoRA";
    // Format.
    std::string fmt_name;
    if (any([](const std::string& n) { return n.find(':') != std::string::npos; })) fmt_name = "cloneofsimo";
    else if (has_sub("proj_lora")) fmt_name = "xlabs";
    else if (any([](const std::string& n) { return starts(n, "lora_unet_") || starts(n, "lora_te") || starts(n, "lora_transformer_"); }))
        fmt_name = "kohya";
    else if (any([](const std::string& n) { return starts(n, "base_model.model."); })) fmt_name = "peft";
    else if (any([](const std::string& n) { return starts(n, "diffusion_model."); }))
        fmt_name = has_sub("lora_A.") ? "ComfyUI/ai-toolkit (BFL names)" : "ComfyUI";
    else if (has_sub(".lora.down.")) fmt_name = "diffusers (attention processors)";
    else if (has_sub("lora_A.") || has_sub("lora_B.")) fmt_name = "diffusers/peft";
    else fmt_name = "diffusers";
    std::vector<std::string> kinds;
    if (has_sub("lora_down") || has_sub("lora_A.") || has_sub("proj_lora") || has_sub(".lora.down.") || has_sub(":down"))
        kinds.push_back("LoRA");
    if (has_sub(".lokr_w")) kinds.push_back("LoKr");
    if (has_sub(".hada_w")) kinds.push_back("LoHa");
    if (has_sub("dora_scale") || has_sub(".magnitude")) kinds.push_back("DoRA");
    size_t full = 0;
    for (auto& t : ts)
        if (!is_lora_key(t.name) && !contains(t.name, ".alpha") && !contains(t.name, "dora_scale") && !contains(t.name, "magnitude") &&
            !starts(t.name, "<"))
            ++full;
    std::string kind_s;
    for (auto& k : kinds) kind_s += (kind_s.empty() ? "" : "+") + k;
    std::string target = detect_lora_target(ts, &d.notes);
    d.variant = kind_s + " for " + target;
    d.layout = fmt_name;
    if (full > 0) {
        d.variant += fmt::format(", plus {} full tensors", full);
        if (has_sub("img_in") || has_sub("x_embedder")) d.notes.push_back("control LoRA: replaces the input projection (extra conditioning channels)");
    }
    // Components: diffusion part vs text encoder part.
    DetectedComponent dm{"LoRA (diffusion model)", "lora", "", "", 0, 0, 0}, te{"LoRA (text encoders)", "lora", "", "", 0, 0, 0},
        emb{"embedding", "embedding", "", "pivotal-tuning token embeddings", 0, 0, 0};
    for (auto& t : ts) {
        DetectedComponent* c = &dm;
        if (starts(t.name, "lora_te") || starts(t.name, "text_encoder") || starts(t.name, "te.") || starts(t.name, "te1.") ||
            starts(t.name, "te2."))
            c = &te;
        if (starts(t.name, "<")) c = &emb;
        c->tensors++;
        c->param_bytes += t.nbytes;
        c->params += t.numel();
    }
    for (auto* c : {&dm, &te, &emb})
        if (c->tensors) d.components.push_back(*c);
    return true;
}

bool detect_embedding(const std::vector<TensorInfo>& ts, Detection& d) {
    if (ts.empty() || ts.size() > 8) return false;
    std::set<std::string> names;
    for (auto& t : ts) {
        if (t.shape.empty() || t.shape.size() > 2) return false;
        names.insert(t.name);
    }
    bool a1111 = names.count("emb_params") || std::all_of(ts.begin(), ts.end(), [](auto& t) { return starts(t.name, "string_to_param."); });
    bool sdxl = names.count("clip_l") && names.count("clip_g");
    if (!a1111 && !sdxl) return false;
    d.family = "Textual inversion";
    d.layout = sdxl ? "SDXL (clip_l + clip_g)" : "A1111/InvokeAI";
    int64_t width = ts[0].shape.back(), vectors = ts[0].shape.size() == 2 ? ts[0].shape[0] : 1;
    std::string target = sdxl ? "SDXL" : width == 768 ? "SD1.x" : width == 1024 ? "SD2.x" : fmt::format("width {}", width);
    d.variant = fmt::format("{} vector{} for {}", vectors, vectors == 1 ? "" : "s", target);
    DetectedComponent c{"embedding", "embedding", "", fmt::format("{} x {}", vectors, width), 0, 0, 0};
    for (auto& t : ts) {
        c.tensors++;
        c.param_bytes += t.nbytes;
        c.params += t.numel();
    }
    d.components.push_back(c);
    return true;
}

// Component prefixes of single-file checkpoints, longest first within a family.
const std::vector<std::pair<std::string, std::string>>& known_prefixes() {
    static const std::vector<std::pair<std::string, std::string>> p = {
        {"model.diffusion_model.", "diffusion model"},
        {"first_stage_model.", "VAE"},
        {"cond_stage_model.transformer.", "text encoder"},
        {"cond_stage_model.model.", "text encoder"},
        {"cond_stage_model.", "text encoder"},
        {"conditioner.embedders.0.transformer.", "text encoder 1"},
        {"conditioner.embedders.0.model.", "text encoder 1"},
        {"conditioner.embedders.1.model.", "text encoder 2"},
        {"conditioner.embedders.1.transformer.", "text encoder 2"},
        {"text_encoders.clip_l.transformer.", "text encoder (clip_l)"},
        {"text_encoders.clip_g.transformer.", "text encoder (clip_g)"},
        {"text_encoders.t5xxl.transformer.", "text encoder (t5xxl)"},
        {"text_encoders.clip_l.", "text encoder (clip_l)"},
        {"text_encoders.clip_g.", "text encoder (clip_g)"},
        {"text_encoders.t5xxl.", "text encoder (t5xxl)"},
        {"text_encoders.qwen3_4b.", "text encoder (qwen3)"},
        {"text_encoder.", "text encoder"},
        {"text_encoder_2.", "text encoder 2"},
        {"text_encoder_3.", "text encoder 3"},
        {"model_ema.", "EMA weights"},
        {"diffusion_model.", "diffusion model"},
        {"vae.", "VAE"},
    };
    return p;
}

}  // namespace

Detection detect(const std::vector<TensorInfo>& ts, const std::map<std::string, MetaValue>& meta, const nlohmann::json* cfg) {
    Detection d;
    // Reference fixtures carry inputs/outputs beside the weights: leave them out.
    std::vector<TensorInfo> weights;
    weights.reserve(ts.size());
    for (auto& t : ts)
        if (!starts(t.name, "__input__.") && !starts(t.name, "__output__.")) weights.push_back(t);
    if (weights.empty()) {
        d.family = "unknown";
        d.notes.push_back("no tensors");
        return d;
    }
    if (detect_lora(weights, d) || detect_embedding(weights, d)) return d;

    // Group by component prefix.
    std::vector<std::pair<std::string, View>> groups;  // prefix -> view
    auto group_of = [&](const std::string& p) -> View& {
        for (auto& [gp, v] : groups)
            if (gp == p) return v;
        groups.emplace_back(p, View{});
        return groups.back().second;
    };
    bool any_prefixed = false;
    for (auto& t : weights) {
        std::string pre;
        for (auto& [p, role] : known_prefixes())
            if (starts(t.name, p)) {
                pre = p;
                break;
            }
        any_prefixed |= !pre.empty();
        group_of(pre).add(t.name.substr(pre.size()), &t);
    }
    // A standalone file whose names all start with a prefix such as "text_encoder." or
    // "vae." is one component; keep the prefix for display.
    std::string main_family, main_variant, main_layout;
    std::vector<std::string> text_kinds;
    for (auto& [pre, v] : groups) {
        DetectedComponent c;
        c.prefix = pre;
        for (auto& [n, t] : v.m) {
            c.tensors++;
            c.param_bytes += t->nbytes;
            c.params += t->numel();
        }
        // ComfyUI's / Forge's marker tensors of v-prediction / zero-terminal-SNR single files
        // (0-d, outside every component prefix; presence counts).
        const bool top_level = pre.empty();  // (clang before 16 cannot capture a structured binding)
        const bool only_markers = !v.names.empty() && std::all_of(v.names.begin(), v.names.end(), [&](const std::string& n) {
            return top_level && (n == "v_pred" || n == "ztsnr");
        });
        if (only_markers) {
            c.role = "markers";
            c.kind = "other";
            c.detail = "ComfyUI/Forge marker tensors:";
            for (auto& n : v.names) c.detail += n == "v_pred" ? " v_pred (v-prediction)" : " ztsnr (zero terminal SNR)";
            d.components.push_back(std::move(c));
            continue;
        }
        Verdict r = classify(v, meta, cfg);
        std::string role_hint;
        for (auto& [p, role] : known_prefixes())
            if (p == pre) role_hint = role;
        if (pre == "model_ema.") {
            c.role = "EMA weights";
            c.kind = "ema";
            c.detail = "exponential-moving-average copy of the diffusion model (unused for inference)";
        } else if (r.known()) {
            c.role = r.role;
            if (!role_hint.empty() && r.role == "text encoder") c.role = role_hint;
            c.kind = r.kind;
            c.detail = (r.variant.empty() || r.detail.find(r.variant) != std::string::npos) ? r.detail : r.variant + ": " + r.detail;
            for (auto& n : r.notes) d.notes.push_back(n);
            if (r.role == "diffusion model" || main_family.empty() || (r.role != "text encoder" && r.role != "VAE" && !any_prefixed)) {
                if (main_family.empty() || r.role == "diffusion model") {
                    main_family = r.family;
                    main_variant = r.variant;
                    main_layout = r.layout;
                }
            }
            if (r.role == "text encoder") text_kinds.push_back(r.variant.empty() ? r.family : r.variant);
        } else {
            c.role = (pre.empty() && any_prefixed) ? "other" : (role_hint.empty() ? "unknown" : role_hint);
            c.kind = "other";
            c.detail = pre.empty() && any_prefixed ? "tensors outside the known component prefixes (e.g. LDM noise-schedule buffers)"
                                                   : "layout not recognised";
        }
        d.components.push_back(std::move(c));
    }
    // Single-file checkpoints: the family is the diffusion model's; say which parts are there.
    const bool has_dm = std::any_of(d.components.begin(), d.components.end(), [](auto& c) { return c.role == "diffusion model"; });
    if (has_dm) {
        d.family = main_family;
        d.variant = main_variant;
        d.layout = any_prefixed ? (main_layout == "diffusers" ? "diffusers (prefixed)" : "single-file checkpoint, " + main_layout + " names")
                                : main_layout;
    } else if (!main_family.empty()) {
        d.family = main_family;
        d.variant = main_variant;
        d.layout = main_layout;
        if (groups.size() > 1) {
            // e.g. a file of text encoders only
            std::string s;
            for (auto& k : text_kinds) s += (s.empty() ? "" : " + ") + k;
            if (text_kinds.size() > 1) {
                d.family = "text encoders";
                d.variant = s;
            }
        }
    } else {
        d.family = "unknown";
        d.notes.push_back("no known layout matched: not a diffusion model, VAE, text encoder, LoRA, embedding or upscaler easel knows");
    }
    // The markers (and for SD1.x the prediction_type metadata, which SD2.x's classify reads)
    // name the prediction and the schedule of SD-family files.
    if (d.family == "SD1.x" || d.family == "SD2.x" || d.family == "SDXL") {
        bool v_pred = false, ztsnr = false;
        for (auto& t : weights) {
            v_pred |= t.name == "v_pred";
            ztsnr |= t.name == "ztsnr";
        }
        const std::string mp = ascii_lower(meta_str(meta, "prediction_type") + meta_str(meta, "modelspec.prediction_type"));
        auto add = [&](const std::string& what) {
            if (!contains(d.variant, what)) d.variant = d.variant.empty() ? what : d.variant + ", " + what;
        };
        if (v_pred || (d.family != "SD2.x" && contains(mp, "v"))) add("v-prediction");
        if (ztsnr) add("zero terminal SNR");
        if (v_pred || ztsnr)
            d.notes.push_back(fmt::format("marker tensors{}{} (ComfyUI/Forge): {}{}{}", v_pred ? " v_pred" : "", ztsnr ? " ztsnr" : "",
                                          v_pred ? "v-prediction" : "", v_pred && ztsnr ? ", " : "",
                                          ztsnr ? "betas rescaled to zero terminal SNR (Lin et al. 2023)" : ""));
    }
    // Hints from metadata / config.
    if (auto it = meta.find("general.architecture"); it != meta.end() && it->second.kind == MetaValue::Kind::String)
        d.notes.push_back("GGUF general.architecture = " + it->second.s);
    if (cfg && cfg->is_object() && cfg->contains("_class_name") && (*cfg)["_class_name"].is_string())
        d.notes.push_back("config.json: " + (*cfg)["_class_name"].get<std::string>());
    // Components from the SDXL single file: OpenCLIP-G and CLIP-L; note the refiner's one encoder.
    if (d.family == "SDXL" && d.variant == "refiner" && text_kinds.size() == 1)
        d.notes.push_back("SDXL refiner: only the OpenCLIP-G text encoder");
    return d;
}

Detection detect(const WeightIndex& wi) {
    Detection d = detect(wi.tensors(), wi.metadata(), wi.config());
    if (!wi.files().empty() && wi.files()[0].format == "gguf") d.layout = d.layout.empty() ? "GGUF" : d.layout + ", GGUF";
    return d;
}

}  // namespace easel::io
