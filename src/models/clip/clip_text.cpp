// CLIP text encoders (see clip_text.h). Architecture facts from transformers'
// models/clip/modeling_clip.py (CLIPTextEmbeddings, CLIPEncoderLayer, CLIPTextTransformer) and
// OpenCLIP's text tower naming (open_clip/transformer.py) as stored in SD2.x/SDXL checkpoints.
#include "models/clip/clip_text.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <regex>

namespace easel::models::clip {

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

const io::TensorInfo& need(const io::WeightIndex& idx, const std::string& name) {
    const io::TensorInfo* t = idx.find(name);
    if (!t) fail(ErrorKind::ModelMismatch, "CLIP text encoder: tensor '{}' is missing; this is not a complete CLIP text model", name);
    return *t;
}

const char* kOpenClipQkv = "transformer.resblocks.0.attn.in_proj_weight";
const char* kHfToken = "embeddings.token_embedding.weight";

}  // namespace

// ---------------------------------------------------------------- config

ClipOverrides overrides_from_config_json(const nlohmann::json& j) {
    ClipOverrides o;
    if (j.contains("num_attention_heads") && j["num_attention_heads"].is_number_integer()) o.heads = j["num_attention_heads"].get<int64_t>();
    if (j.contains("hidden_act") && j["hidden_act"].is_string()) {
        std::string a = j["hidden_act"].get<std::string>();
        if (a == "quick_gelu") o.act = Activation::QuickGelu;
        else if (a == "gelu") o.act = Activation::Gelu;
        else fail(ErrorKind::InvalidInput, "CLIP config: hidden_act '{}' is not supported (quick_gelu or gelu)", a);
    }
    if (j.contains("layer_norm_eps") && j["layer_norm_eps"].is_number()) o.eps = j["layer_norm_eps"].get<float>();
    if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) o.eos_token_id = j["eos_token_id"].get<int64_t>();
    return o;
}

std::vector<ClipKeys> find_clip_text_encoders(const io::WeightIndex& index) {
    std::vector<ClipKeys> out;
    for (auto& t : index.tensors()) {
        if (ends_with(t.name, kHfToken)) {
            ClipKeys k;
            k.layout = ClipKeys::Layout::Transformers;
            k.prefix = t.name.substr(0, t.name.size() - std::string(kHfToken).size());
            // text_projection sits beside text_model. (transformers) or under the same prefix
            std::string outer = ends_with(k.prefix, "text_model.") ? k.prefix.substr(0, k.prefix.size() - 11) : k.prefix;
            if (index.find(outer + "text_projection.weight")) k.projection_name = outer + "text_projection.weight";
            else if (index.find(k.prefix + "text_projection.weight")) k.projection_name = k.prefix + "text_projection.weight";
            out.push_back(k);
        } else if (ends_with(t.name, kOpenClipQkv)) {
            ClipKeys k;
            k.layout = ClipKeys::Layout::OpenClip;
            k.prefix = t.name.substr(0, t.name.size() - std::string(kOpenClipQkv).size());
            if (!index.find(k.prefix + "token_embedding.weight")) continue;  // a vision tower or something else
            if (index.find(k.prefix + "text_projection")) k.projection_name = k.prefix + "text_projection";
            out.push_back(k);
        }
    }
    std::sort(out.begin(), out.end(), [](const ClipKeys& a, const ClipKeys& b) { return a.prefix < b.prefix; });
    return out;
}

ClipConfig infer_config(const io::WeightIndex& index, const ClipKeys& keys, const ClipOverrides& ov) {
    ClipConfig c;
    const bool hf = keys.layout == ClipKeys::Layout::Transformers;
    const std::string& p = keys.prefix;
    const auto& tok = need(index, p + (hf ? "embeddings.token_embedding.weight" : "token_embedding.weight"));
    const auto& pos = need(index, p + (hf ? "embeddings.position_embedding.weight" : "positional_embedding"));
    if (tok.shape.size() != 2 || pos.shape.size() != 2 || tok.shape[1] != pos.shape[1])
        fail(ErrorKind::ModelMismatch, "CLIP text encoder: token embedding [{}] and position embedding [{}] do not agree",
             fmt::join(tok.shape, ", "), fmt::join(pos.shape, ", "));
    c.vocab = tok.shape[0];
    c.width = tok.shape[1];
    c.positions = pos.shape[0];
    // count layers
    const std::string lp = p + (hf ? "encoder.layers." : "transformer.resblocks.");
    const std::string probe = hf ? ".layer_norm1.weight" : ".ln_1.weight";
    while (index.find(lp + std::to_string(c.layers) + probe)) ++c.layers;
    if (c.layers == 0) fail(ErrorKind::ModelMismatch, "CLIP text encoder under '{}' has no encoder layers", p);
    const auto& fc1 = need(index, lp + "0" + (hf ? ".mlp.fc1.weight" : ".mlp.c_fc.weight"));
    if (fc1.shape.size() != 2 || fc1.shape[1] != c.width)
        fail(ErrorKind::ModelMismatch, "CLIP text encoder: fc1 weight [{}] does not match width {}", fmt::join(fc1.shape, ", "), c.width);
    c.intermediate = fc1.shape[0];
    if (!keys.projection_name.empty()) {
        const auto& pr = need(index, keys.projection_name);
        if (pr.shape.size() != 2) fail(ErrorKind::ModelMismatch, "CLIP text projection '{}' is not 2-D", keys.projection_name);
        c.projection = hf ? pr.shape[0] : pr.shape[1];
    }
    c.heads = c.width % 64 == 0 ? c.width / 64 : 1;
    // OpenAI CLIP (SD1.x, SDXL's first encoder, FLUX/SD3 CLIP-L) uses quick_gelu; OpenCLIP H (1024,
    // SD2.x) and bigG (1280, SDXL/SD3 second encoder) use gelu, in either layout.
    c.act = (!hf || c.width == 1024 || c.width == 1280) ? Activation::Gelu : Activation::QuickGelu;
    if (ov.heads) c.heads = *ov.heads;
    if (ov.act) c.act = *ov.act;
    if (ov.eps) c.eps = *ov.eps;
    if (ov.eos_token_id) c.eos_token_id = *ov.eos_token_id;
    if (ov.layers) {
        if (*ov.layers < 1 || *ov.layers > c.layers)
            fail(ErrorKind::InvalidInput, "CLIP text encoder has {} layers; cannot use {}", c.layers, *ov.layers);
        c.layers = *ov.layers;
    }
    if (c.heads <= 0 || c.width % c.heads != 0)
        fail(ErrorKind::InvalidInput, "CLIP text encoder: width {} is not divisible into {} heads", c.width, c.heads);
    return c;
}

nn::TensorSource make_tensor_source(const io::WeightIndex& index, const ClipKeys& keys, const ClipConfig& cfg) {
    nn::TensorSource src(index, keys.prefix);
    if (keys.layout == ClipKeys::Layout::Transformers) {
        if (cfg.projection > 0 && !keys.projection_name.empty()) src.rename("text_projection.weight", keys.projection_name);
        return src;
    }
    // OpenCLIP layout
    const std::string& p = keys.prefix;
    src.set_mapper([](const std::string& c) -> std::string {
        static const std::regex layer(R"(encoder\.layers\.(\d+)\.(.*))");
        std::smatch m;
        if (c == "embeddings.token_embedding.weight") return "token_embedding.weight";
        if (c == "embeddings.position_embedding.weight") return "positional_embedding";
        if (c.rfind("final_layer_norm.", 0) == 0) return "ln_final." + c.substr(17);
        if (std::regex_match(c, m, layer)) {
            const std::string base = "transformer.resblocks." + m[1].str() + ".";
            const std::string rest = m[2].str();
            static const std::pair<const char*, const char*> table[] = {
                {"layer_norm1.", "ln_1."},       {"layer_norm2.", "ln_2."},      {"mlp.fc1.", "mlp.c_fc."},
                {"mlp.fc2.", "mlp.c_proj."},     {"self_attn.out_proj.", "attn.out_proj."}};
            for (auto& [from, to] : table)
                if (rest.rfind(from, 0) == 0) return base + to + rest.substr(std::string(from).size());
        }
        return {};
    });
    const char* qkv[3] = {"q_proj", "k_proj", "v_proj"};
    for (int64_t l = 0; l < cfg.layers; ++l) {
        const std::string base = p + "transformer.resblocks." + std::to_string(l) + ".attn.";
        for (int i = 0; i < 3; ++i) {
            const std::string c = "encoder.layers." + std::to_string(l) + ".self_attn." + qkv[i];
            src.slice_rows(c + ".weight", base + "in_proj_weight", i * cfg.width, (i + 1) * cfg.width);
            src.slice_rows(c + ".bias", base + "in_proj_bias", i * cfg.width, (i + 1) * cfg.width);
        }
    }
    if (cfg.projection > 0 && !keys.projection_name.empty()) src.transpose("text_projection.weight", keys.projection_name);
    return src;
}

nn::LoadOptions default_load_options(const ClipKeys& keys, const ClipConfig& cfg, const io::WeightIndex& index) {
    nn::LoadOptions o;
    o.ignore_unexpected_suffixes = {"position_ids", "logit_scale", "attn_mask"};
    if (cfg.projection == 0 && !keys.projection_name.empty()) o.ignore_unexpected_suffixes.push_back(keys.projection_name);
    const bool hf = keys.layout == ClipKeys::Layout::Transformers;
    const std::string lp = keys.prefix + (hf ? "encoder.layers." : "transformer.resblocks.");
    for (auto& t : index.tensors()) {
        if (t.name.compare(0, lp.size(), lp) != 0) continue;
        int64_t l = std::atoll(t.name.c_str() + lp.size());
        if (l >= cfg.layers) o.ignore_unexpected_suffixes.push_back(t.name);
    }
    return o;
}

// ---------------------------------------------------------------- modules

ClipEncoderLayer::ClipEncoderLayer(const ClipConfig& cfg) : cfg_(cfg) {
    q_ = &add<nn::Linear>("self_attn.q_proj", cfg.width, cfg.width);
    k_ = &add<nn::Linear>("self_attn.k_proj", cfg.width, cfg.width);
    v_ = &add<nn::Linear>("self_attn.v_proj", cfg.width, cfg.width);
    o_ = &add<nn::Linear>("self_attn.out_proj", cfg.width, cfg.width);
    ln1_ = &add<nn::LayerNorm>("layer_norm1", cfg.width, cfg.eps);
    fc1_ = &add<nn::Linear>("mlp.fc1", cfg.width, cfg.intermediate);
    fc2_ = &add<nn::Linear>("mlp.fc2", cfg.intermediate, cfg.width);
    ln2_ = &add<nn::LayerNorm>("layer_norm2", cfg.width, cfg.eps);
}

ggml_tensor* ClipEncoderLayer::forward(nn::Ctx& c, ggml_tensor* h, ggml_tensor* mask) const {
    ggml_tensor* x = ln1_->forward(c, h);
    ggml_tensor* a = nn::attention(c, q_->forward(c, x), k_->forward(c, x), v_->forward(c, x), cfg_.heads, cfg_.heads, mask);
    h = ggml_add(c.ctx, h, o_->forward(c, a));
    x = fc1_->forward(c, ln2_->forward(c, h));
    if (cfg_.act == Activation::QuickGelu) {
        // x * sigmoid(1.702 x), in F32 (ggml_gelu_quick on the CPU uses an F16 table)
        x = ggml_mul(c.ctx, x, ggml_sigmoid(c.ctx, ggml_scale(c.ctx, x, 1.702f)));
    } else {
        x = ggml_gelu_erf(c.ctx, x);
    }
    return ggml_add(c.ctx, h, fc2_->forward(c, x));
}

ClipTextModel::ClipTextModel(const ClipConfig& cfg) : cfg_(cfg) {
    if (cfg.vocab <= 0 || cfg.width <= 0 || cfg.layers <= 0 || cfg.positions <= 0 || cfg.intermediate <= 0 || cfg.heads <= 0 ||
        cfg.width % cfg.heads != 0)
        fail(ErrorKind::InvalidInput, "CLIP text config is invalid (vocab {}, width {}, layers {}, positions {}, heads {})", cfg.vocab,
             cfg.width, cfg.layers, cfg.positions, cfg.heads);
    tok_ = &add<nn::Embedding>("embeddings.token_embedding", cfg.vocab, cfg.width);
    pos_ = &add<nn::Embedding>("embeddings.position_embedding", cfg.positions, cfg.width);
    pos_->w->role = nn::ParamRole::Norm;  // read as a view, not through get_rows: keep it F32
    for (int64_t i = 0; i < cfg.layers; ++i) layers_.push_back(&add<ClipEncoderLayer>("encoder.layers." + std::to_string(i), cfg));
    final_ln_ = &add<nn::LayerNorm>("final_layer_norm", cfg.width, cfg.eps);
    if (cfg.projection > 0) proj_ = &add<nn::Linear>("text_projection", cfg.width, cfg.projection, false);
}

ggml_tensor* ClipTextModel::causal_mask(nn::Ctx& c, int64_t L) {
    // zeros {L, L} from an op (no host data), then -inf above the diagonal
    ggml_tensor* z = ggml_scale(c.ctx, ggml_repeat_4d(c.ctx, ggml_arange(c.ctx, 0.0f, (float)L, 1.0f), L, L, 1, 1), 0.0f);
    return ggml_diag_mask_inf(c.ctx, z, 0);
}

ClipState ClipTextModel::prologue(nn::Ctx& c, const ClipInputs& in) const {
    if (!in.ids || in.ids->type != GGML_TYPE_I32 || in.ids->ne[2] != 1 || in.ids->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "CLIP text encoder: ids must be an I32 tensor {{L, N}}");
    const int64_t L = in.ids->ne[0], N = in.ids->ne[1];
    if (L > cfg_.positions)
        fail(ErrorKind::InvalidInput, "CLIP text encoder: {} tokens exceed the {} positions of the model; split the prompt into chunks",
             L, cfg_.positions);
    if (in.pool_index && (in.pool_index->type != GGML_TYPE_I32 || ggml_nelements(in.pool_index) != N))
        fail(ErrorKind::InvalidInput, "CLIP text encoder: pool_index must be I32 {{N={}}}", N);
    ggml_tensor* w = pos_->w->tensor;
    if (!w) fail(ErrorKind::Internal, "CLIP text encoder: parameters not loaded");
    ggml_tensor* pos = ggml_view_2d(c.ctx, w, cfg_.width, L, w->nb[1], 0);  // first L rows
    if (w->type != GGML_TYPE_F32) pos = ggml_cast(c.ctx, pos, GGML_TYPE_F32);
    ggml_tensor* tok = tok_->forward(c, in.ids);
    if ((in.embed_keep == nullptr) != (in.embed_fix == nullptr))
        fail(ErrorKind::InvalidInput, "CLIP text encoder: embed_keep and embed_fix go together");
    if (in.embed_fix) {
        const ggml_tensor *k = in.embed_keep, *f = in.embed_fix;
        if (k->type != GGML_TYPE_F32 || f->type != GGML_TYPE_F32 || ggml_nelements(k) != L * N || f->ne[0] != cfg_.width ||
            f->ne[1] != L || f->ne[2] != N)
            fail(ErrorKind::InvalidInput, "CLIP text encoder: embedding inputs must be F32 {{1, {}, {}}} and {{{}, {}, {}}}", L, N, cfg_.width, L, N);
        tok = ggml_add(c.ctx, ggml_mul(c.ctx, tok, ggml_reshape_3d(c.ctx, in.embed_keep, 1, L, N)), in.embed_fix);
    }
    ClipState s;
    s.h = ggml_add(c.ctx, tok, pos);
    s.mask = causal_mask(c, L);
    s.pool_index = in.pool_index;
    return s;
}

ClipState ClipTextModel::block(nn::Ctx& c, int i, ClipState s) const {
    if (i < 0 || i >= n_blocks()) fail(ErrorKind::InvalidInput, "CLIP text encoder has no layer {}", i);
    s.h = layers_[(size_t)i]->forward(c, s.h, s.mask);
    return s;
}

ClipOutputs ClipTextModel::epilogue(nn::Ctx& c, ClipState s) const {
    ClipOutputs o;
    o.last_hidden_state = final_ln_->forward(c, s.h);
    if (s.pool_index) {
        const int64_t L = s.h->ne[1], N = s.h->ne[2];
        ggml_tensor* flat = ggml_reshape_2d(c.ctx, o.last_hidden_state, cfg_.width, L * N);
        o.pooler_output = ggml_get_rows(c.ctx, flat, s.pool_index);  // {width, N}
        if (proj_) o.text_embeds = proj_->forward(c, o.pooler_output);
    }
    return o;
}

ClipEncoded ClipTextModel::encode(nn::Ctx& c, const ClipInputs& in, const ClipEncodeOptions& opt) const {
    const int n = n_blocks();
    const int k = std::max(opt.clip_skip, 1);
    if (k > n) fail(ErrorKind::InvalidInput, "clip skip {} is larger than the {} layers of the text encoder", k, n);
    const int ctx_index = n + 1 - k;  // hidden_states index of the context
    ClipEncoded e;
    ClipState s = prologue(c, in);
    const bool full = in.pool_index || opt.all_hidden_states || k == 1;
    if (opt.all_hidden_states) e.hidden_states.push_back(s.h);
    ggml_tensor* ctx_h = ctx_index == 0 ? s.h : nullptr;
    const int run_to = full ? n : ctx_index;
    for (int i = 0; i < run_to; ++i) {
        s = block(c, i, s);
        if (opt.all_hidden_states) e.hidden_states.push_back(s.h);
        if (i + 1 == ctx_index) ctx_h = s.h;
    }
    if (full) e.out = epilogue(c, s);
    if (k == 1) e.context = e.out.last_hidden_state;
    else e.context = opt.final_norm_on_skip ? final_ln_->forward(c, ctx_h) : ctx_h;
    return e;
}

void check_token_ids(const std::vector<int32_t>& ids, int64_t vocab) {
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || ids[i] >= vocab)
            fail(ErrorKind::InvalidInput, "token id {} at position {} is outside the text encoder's vocabulary of {}; "
                 "the tokenizer does not match the model", ids[i], i, vocab);
}

std::vector<int32_t> pool_indices(const std::vector<int32_t>& ids, int64_t L, int64_t N, int64_t eos_token_id) {
    if ((int64_t)ids.size() != L * N) fail(ErrorKind::InvalidInput, "pool_indices: {} ids for {} x {}", ids.size(), N, L);
    std::vector<int32_t> out((size_t)N);
    for (int64_t n = 0; n < N; ++n) {
        const int32_t* row = ids.data() + n * L;
        int64_t pos = 0;
        if (eos_token_id == 2) {
            pos = std::max_element(row, row + L) - row;  // first maximum, as torch.argmax
        } else {
            for (int64_t j = 0; j < L; ++j)
                if (row[j] == eos_token_id) {
                    pos = j;
                    break;
                }
        }
        out[(size_t)n] = (int32_t)(n * L + pos);
    }
    return out;
}

}  // namespace easel::models::clip
