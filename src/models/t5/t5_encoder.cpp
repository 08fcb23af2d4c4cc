// T5 encoder (see t5_encoder.h). Architecture facts from transformers' models/t5/modeling_t5.py
// (T5LayerNorm, T5DenseGatedActDense, T5DenseActDense, T5Attention._relative_position_bucket /
// compute_bias, T5Stack) and, for the GGUF names, llama.cpp's T5 tensor names as ComfyUI-GGUF
// maps them back (loader.py T5_SD_MAP).
#include "models/t5/t5_encoder.h"

#include "core/error.h"

#include <cfloat>
#include <cmath>

namespace easel::models::t5 {

namespace {

std::string ne_str(const ggml_tensor* t) { return fmt::format("{{{}, {}, {}, {}}}", t->ne[0], t->ne[1], t->ne[2], t->ne[3]); }

const io::TensorInfo& need(const io::WeightIndex& idx, const std::string& name) {
    const io::TensorInfo* t = idx.find(name);
    if (!t) fail(ErrorKind::ModelMismatch, "T5 encoder: tensor '{}' is missing; this is not a complete T5 encoder", name);
    return *t;
}

void need_2d(const io::TensorInfo& t, int64_t rows, int64_t cols) {
    if (t.shape.size() != 2 || (rows >= 0 && t.shape[0] != rows) || (cols >= 0 && t.shape[1] != cols))
        fail(ErrorKind::ModelMismatch, "T5 encoder: tensor '{}' has shape [{}], expected [{}, {}]", t.name, fmt::join(t.shape, ", "),
             rows < 0 ? std::string("?") : std::to_string(rows), cols < 0 ? std::string("?") : std::to_string(cols));
}

const char* kHfQ = "encoder.block.0.layer.0.SelfAttention.q.weight";
const char* kGgufQ = "enc.blk.0.attn_q.weight";

bool ends_with(const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Canonical (transformers) block-local suffix -> llama.cpp suffix.
const std::pair<const char*, const char*> kGgufBlock[] = {
    {"layer.0.SelfAttention.q.weight", "attn_q.weight"},
    {"layer.0.SelfAttention.k.weight", "attn_k.weight"},
    {"layer.0.SelfAttention.v.weight", "attn_v.weight"},
    {"layer.0.SelfAttention.o.weight", "attn_o.weight"},
    {"layer.0.SelfAttention.relative_attention_bias.weight", "attn_rel_b.weight"},
    {"layer.0.layer_norm.weight", "attn_norm.weight"},
    {"layer.1.DenseReluDense.wi_0.weight", "ffn_gate.weight"},
    {"layer.1.DenseReluDense.wi_1.weight", "ffn_up.weight"},
    {"layer.1.DenseReluDense.wi.weight", "ffn_up.weight"},
    {"layer.1.DenseReluDense.wo.weight", "ffn_down.weight"},
    {"layer.1.layer_norm.weight", "ffn_norm.weight"},
};

// canonical -> stored (without prefix) for the llama.cpp layout; empty if unknown.
std::string gguf_name(const std::string& c) {
    if (c == "shared.weight") return "token_embd.weight";
    if (c == "encoder.final_layer_norm.weight") return "enc.output_norm.weight";
    const std::string bp = "encoder.block.";
    if (c.rfind(bp, 0) != 0) return {};
    size_t dot = c.find('.', bp.size());
    if (dot == std::string::npos) return {};
    const std::string n = c.substr(bp.size(), dot - bp.size());
    const std::string rest = c.substr(dot + 1);
    for (auto& [from, to] : kGgufBlock)
        if (rest == from) return "enc.blk." + n + "." + to;
    return {};
}

// Stored name (with prefix) of a canonical name under `keys`.
std::string stored(const T5Keys& keys, const std::string& canonical) {
    if (canonical == "shared.weight") return keys.prefix + keys.embedding;
    if (keys.layout == T5Keys::Layout::LlamaCpp) {
        std::string g = gguf_name(canonical);
        if (!g.empty()) return keys.prefix + g;
    }
    return keys.prefix + canonical;
}

std::string blk(int64_t i, const char* rest) { return "encoder.block." + std::to_string(i) + "." + rest; }

}  // namespace

// ---------------------------------------------------------------- keys and config

std::optional<T5Keys> find_t5_encoder(const io::WeightIndex& index) {
    for (auto& t : index.tensors()) {
        T5Keys k;
        if (ends_with(t.name, kHfQ)) {
            k.layout = T5Keys::Layout::Transformers;
            k.prefix = t.name.substr(0, t.name.size() - std::string(kHfQ).size());
            if (index.find(k.prefix + "shared.weight")) k.embedding = "shared.weight";
            else if (index.find(k.prefix + "encoder.embed_tokens.weight")) k.embedding = "encoder.embed_tokens.weight";
            else continue;
            return k;
        }
        if (ends_with(t.name, kGgufQ)) {
            k.layout = T5Keys::Layout::LlamaCpp;
            k.prefix = t.name.substr(0, t.name.size() - std::string(kGgufQ).size());
            k.embedding = "token_embd.weight";
            if (!index.find(k.prefix + k.embedding)) continue;
            return k;
        }
    }
    return std::nullopt;
}

T5Config infer_config(const io::WeightIndex& index, const T5Keys& keys) {
    T5Config c;
    const auto& emb = need(index, stored(keys, "shared.weight"));
    need_2d(emb, -1, -1);
    c.vocab = emb.shape[0];
    c.d_model = emb.shape[1];
    while (index.find(stored(keys, blk(c.layers, "layer.0.SelfAttention.q.weight")))) ++c.layers;
    if (c.layers == 0) fail(ErrorKind::ModelMismatch, "T5 encoder under '{}' has no blocks", keys.prefix);
    const auto& rel = need(index, stored(keys, blk(0, "layer.0.SelfAttention.relative_attention_bias.weight")));
    need_2d(rel, -1, -1);
    c.num_buckets = rel.shape[0];
    c.heads = rel.shape[1];
    if (c.num_buckets < 4 || c.heads < 1)
        fail(ErrorKind::ModelMismatch, "T5 encoder: relative_attention_bias [{}] is not [buckets >= 4, heads]", fmt::join(rel.shape, ", "));
    const auto& q = need(index, stored(keys, blk(0, "layer.0.SelfAttention.q.weight")));
    need_2d(q, -1, c.d_model);
    if (q.shape[0] % c.heads != 0)
        fail(ErrorKind::ModelMismatch, "T5 encoder: q has {} rows, not a multiple of the {} heads of the bias table", q.shape[0], c.heads);
    c.d_kv = q.shape[0] / c.heads;
    if (const io::TensorInfo* wi0 = index.find(stored(keys, blk(0, "layer.1.DenseReluDense.wi_0.weight")))) {
        need_2d(*wi0, -1, c.d_model);
        c.d_ff = wi0->shape[0];
        c.ff = FeedForward::GatedGelu;
    } else {
        // llama.cpp names wi (v1.0) ffn_up too; ffn_gate absent means ReLU
        const auto& wi = need(index, stored(keys, blk(0, "layer.1.DenseReluDense.wi.weight")));
        need_2d(wi, -1, c.d_model);
        c.d_ff = wi.shape[0];
        c.ff = FeedForward::Relu;
    }
    c.bias_every_layer = c.layers > 1 && index.find(stored(keys, blk(1, "layer.0.SelfAttention.relative_attention_bias.weight")));
    return c;
}

nn::TensorSource make_tensor_source(const io::WeightIndex& index, const T5Keys& keys) {
    nn::TensorSource src(index, keys.prefix);
    if (keys.embedding != "shared.weight") src.rename("shared.weight", keys.prefix + keys.embedding);
    if (keys.layout == T5Keys::Layout::LlamaCpp) src.set_mapper([](const std::string& c) { return gguf_name(c); });
    return src;
}

nn::LoadOptions default_load_options(const io::WeightIndex& index, const T5Keys& keys) {
    nn::LoadOptions o;
    const std::string& p = keys.prefix;
    for (auto& t : index.tensors()) {
        if (t.name.compare(0, p.size(), p) != 0) continue;
        const std::string rest = t.name.substr(p.size());
        // the tied copy of the embedding, and the parts of a full T5 (decoder, LM head) an encoder does not use
        if ((rest == "encoder.embed_tokens.weight" && keys.embedding != rest) || (rest == "shared.weight" && keys.embedding != rest) ||
            rest.rfind("decoder.", 0) == 0 || rest.rfind("dec.", 0) == 0 || rest == "lm_head.weight" || rest == "output.weight")
            o.ignore_unexpected_suffixes.push_back(t.name);
    }
    return o;
}

std::vector<int32_t> relative_position_buckets(int64_t L, int64_t num_buckets, int64_t max_distance) {
    if (L < 1) fail(ErrorKind::InvalidInput, "T5 relative position buckets: sequence length must be at least 1 (got {})", L);
    if (num_buckets < 4 || max_distance < 1)
        fail(ErrorKind::InvalidInput, "T5 relative position buckets: need num_buckets >= 4 and max_distance >= 1 (got {}, {})", num_buckets,
             max_distance);
    const int64_t half = num_buckets / 2;  // bidirectional: half the buckets per direction
    const int64_t max_exact = half / 2;
    std::vector<int32_t> out((size_t)(L * L));
    for (int64_t i = 0; i < L; ++i) {      // query position
        for (int64_t j = 0; j < L; ++j) {  // key position
            const int64_t rel = j - i;
            int64_t b = rel > 0 ? half : 0;
            const int64_t n = rel < 0 ? -rel : rel;
            if (n < max_exact) {
                b += n;
            } else {
                // float32 as torch: log(n / max_exact) / log(max_distance / max_exact) * (half - max_exact), truncated
                const float r = std::log((float)n / (float)max_exact) / std::log((float)max_distance / (float)max_exact) *
                                (float)(half - max_exact);
                int64_t large = max_exact + (int64_t)r;
                b += std::min(large, half - 1);
            }
            out[(size_t)(i * L + j)] = (int32_t)b;
        }
    }
    return out;
}

// ---------------------------------------------------------------- modules

T5Block::T5Block(const T5Config& cfg, bool rel_bias) : cfg_(cfg) {
    const int64_t inner = cfg.heads * cfg.d_kv;
    q_ = &add<nn::Linear>("layer.0.SelfAttention.q", cfg.d_model, inner, false);
    k_ = &add<nn::Linear>("layer.0.SelfAttention.k", cfg.d_model, inner, false);
    v_ = &add<nn::Linear>("layer.0.SelfAttention.v", cfg.d_model, inner, false);
    o_ = &add<nn::Linear>("layer.0.SelfAttention.o", inner, cfg.d_model, false);
    if (rel_bias) {
        // a tiny table read with get_rows: kept F32 whatever the file stores
        auto& b = add<nn::Block>("layer.0.SelfAttention.relative_attention_bias");
        rel_ = &b.param("weight", {cfg.num_buckets, cfg.heads}, nn::ParamRole::Norm);
    }
    ln0_ = &add<nn::RMSNorm>("layer.0.layer_norm", cfg.d_model, cfg.eps);
    if (cfg.ff == FeedForward::GatedGelu) {
        wi0_ = &add<nn::Linear>("layer.1.DenseReluDense.wi_0", cfg.d_model, cfg.d_ff, false);
        wi1_ = &add<nn::Linear>("layer.1.DenseReluDense.wi_1", cfg.d_model, cfg.d_ff, false);
    } else {
        wi_ = &add<nn::Linear>("layer.1.DenseReluDense.wi", cfg.d_model, cfg.d_ff, false);
    }
    wo_ = &add<nn::Linear>("layer.1.DenseReluDense.wo", cfg.d_ff, cfg.d_model, false);
    ln1_ = &add<nn::RMSNorm>("layer.1.layer_norm", cfg.d_model, cfg.eps);
}

ggml_tensor* T5Block::forward(nn::Ctx& c, ggml_tensor* h, ggml_tensor* buckets, ggml_tensor* mask_add, ggml_tensor* bias,
                              ggml_tensor** bias_out) const {
    ggml_context* ctx = c.ctx;
    const int64_t D = cfg_.d_kv, H = cfg_.heads, L = h->ne[1], N = h->ne[2];
    if (rel_) {
        if (!rel_->tensor) fail(ErrorKind::Internal, "T5 encoder: parameters not loaded");
        if (!buckets || ggml_nelements(buckets) != L * L)
            fail(ErrorKind::InvalidInput, "T5 encoder: position buckets must be I32 {{L*L = {}}}", L * L);
        // compute_bias: table rows at bucket(j - i) -> {H, Lk, Lq} -> {Lk, Lq, H}
        ggml_tensor* b = ggml_get_rows(ctx, rel_->tensor, buckets);  // {H, L*L}
        b = ggml_reshape_3d(ctx, b, H, L, L);
        bias = ggml_cont(ctx, ggml_permute(ctx, b, 2, 0, 1, 3));  // {Lk, Lq, H}
        if (mask_add) bias = ggml_add(ctx, ggml_repeat_4d(ctx, bias, L, L, H, N), mask_add);  // {Lk, Lq, H, N}
    }
    if (!bias) fail(ErrorKind::InvalidInput, "T5 encoder: a block without a relative bias table needs the position bias of block 0");
    if (bias->ne[0] != L || bias->ne[1] != L || bias->ne[2] != H || (bias->ne[3] != 1 && bias->ne[3] != N))
        fail(ErrorKind::InvalidInput, "T5 encoder: position bias {} does not match L={} heads={} N={}", ne_str(bias), L, H, N);
    if (bias_out) *bias_out = bias;

    // layer.0: self-attention without 1/sqrt(d_kv) scaling
    ggml_tensor* x = ln0_->forward(c, h);
    auto heads = [&](ggml_tensor* t) {  // {H*D, L, N} -> {D, L, H, N}
        return ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, t, D, H, L, N), 0, 2, 1, 3));
    };
    ggml_tensor* q = heads(q_->forward(c, x));
    ggml_tensor* k = heads(k_->forward(c, x));
    ggml_tensor* v = v_->forward(c, x);
    ggml_tensor* kq = ggml_mul_mat(ctx, k, q);  // {Lk, Lq, H, N}
    kq = ggml_soft_max(ctx, ggml_add(ctx, kq, bias));
    ggml_tensor* vt = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, v, D, H, L, N), 1, 2, 0, 3));  // {Lk, D, H, N}
    ggml_tensor* a = ggml_mul_mat(ctx, vt, kq);                                                          // {D, Lq, H, N}
    a = ggml_reshape_3d(ctx, ggml_cont(ctx, ggml_permute(ctx, a, 0, 2, 1, 3)), D * H, L, N);            // {D*H, L, N}
    h = ggml_add(ctx, h, o_->forward(c, a));

    // layer.1: feed-forward
    x = ln1_->forward(c, h);
    ggml_tensor* f;
    if (cfg_.ff == FeedForward::GatedGelu) {
        // gelu_new(wi_0 x) in F32 (ggml_gelu on the CPU reads an F16 table): 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
        ggml_tensor* g = wi0_->forward(c, x);
        ggml_tensor* inner = ggml_add(ctx, g, ggml_scale(ctx, ggml_mul(ctx, ggml_sqr(ctx, g), g), 0.044715f));
        ggml_tensor* t = ggml_tanh(ctx, ggml_scale(ctx, inner, 0.7978845608028654f));
        g = ggml_mul(ctx, g, ggml_scale_bias(ctx, t, 0.5f, 0.5f));
        f = ggml_mul(ctx, g, wi1_->forward(c, x));
    } else {
        f = ggml_relu(ctx, wi_->forward(c, x));
    }
    // wo input / 32, output * 32: keeps T5-XXL's large FF activations inside F16 range where a
    // backend rounds the activations to the weight type (see the header); exact in F32.
    constexpr float kFfScale = 32.0f;
    ggml_tensor* y = wo_->forward(c, ggml_scale(ctx, f, 1.0f / kFfScale));
    if (y->op == GGML_OP_MUL_MAT) ggml_prec_set_acc(y, GGML_PREC_F32);
    return ggml_add(ctx, h, ggml_scale(ctx, y, kFfScale));
}

T5Encoder::T5Encoder(const T5Config& cfg) : cfg_(cfg) {
    if (cfg.vocab <= 0 || cfg.d_model <= 0 || cfg.d_kv <= 0 || cfg.heads <= 0 || cfg.d_ff <= 0 || cfg.layers <= 0 || cfg.num_buckets < 4 ||
        cfg.max_distance < 1)
        fail(ErrorKind::InvalidInput, "T5 config is invalid (vocab {}, d_model {}, d_kv {}, heads {}, d_ff {}, layers {}, buckets {})",
             cfg.vocab, cfg.d_model, cfg.d_kv, cfg.heads, cfg.d_ff, cfg.layers, cfg.num_buckets);
    embed_ = &add<nn::Embedding>("shared", cfg.vocab, cfg.d_model);
    for (int64_t i = 0; i < cfg.layers; ++i)
        blocks_.push_back(&add<T5Block>("encoder.block." + std::to_string(i), cfg, i == 0 || cfg.bias_every_layer));
    final_ln_ = &add<nn::RMSNorm>("encoder.final_layer_norm", cfg.d_model, cfg.eps);
}

T5State T5Encoder::prologue(nn::Ctx& c, const T5Inputs& in) const {
    if (!in.ids || in.ids->type != GGML_TYPE_I32 || in.ids->ne[2] != 1 || in.ids->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "T5 encoder: ids must be an I32 tensor {{L, N}}");
    const int64_t L = in.ids->ne[0], N = in.ids->ne[1];
    if (!in.buckets || in.buckets->type != GGML_TYPE_I32 || ggml_nelements(in.buckets) != L * L || in.buckets->ne[0] != L * L)
        fail(ErrorKind::InvalidInput, "T5 encoder: buckets must be an I32 vector {{L*L = {}}} from relative_position_buckets()", L * L);
    T5State s;
    s.h = embed_->forward(c, in.ids);
    if (s.h->type != GGML_TYPE_F32) s.h = ggml_cast(c.ctx, s.h, GGML_TYPE_F32);
    s.buckets = in.buckets;
    if (in.mask) {
        if (in.mask->type != GGML_TYPE_F32 || in.mask->ne[0] != L || in.mask->ne[1] != N || in.mask->ne[2] != 1 || in.mask->ne[3] != 1)
            fail(ErrorKind::InvalidInput, "T5 encoder: attention mask must be F32 {{L={}, N={}}}, got {}", L, N, ne_str(in.mask));
        // (1 - mask) * float_min, as transformers' extended attention mask: 1 -> 0, 0 -> -FLT_MAX
        ggml_tensor* m = ggml_scale_bias(c.ctx, in.mask, FLT_MAX, -FLT_MAX);
        s.mask_add = ggml_reshape_4d(c.ctx, m, L, 1, 1, N);
    }
    return s;
}

T5State T5Encoder::block(nn::Ctx& c, int i, T5State s) const {
    if (i < 0 || i >= n_blocks()) fail(ErrorKind::InvalidInput, "T5 encoder has no block {}", i);
    ggml_tensor* bias = nullptr;
    s.h = blocks_[(size_t)i]->forward(c, s.h, s.buckets, s.mask_add, blocks_[(size_t)i]->has_rel_bias() ? nullptr : s.bias, &bias);
    s.bias = bias;
    return s;
}

T5Outputs T5Encoder::epilogue(nn::Ctx& c, T5State s) const {
    T5Outputs o;
    o.last_hidden_state = final_ln_->forward(c, s.h);
    return o;
}

void check_token_ids(const std::vector<int32_t>& ids, int64_t vocab) {
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || ids[i] >= vocab)
            fail(ErrorKind::InvalidInput,
                 "token id {} at position {} is outside the T5 encoder's vocabulary of {}; the tokenizer does not match the model", ids[i], i,
                 vocab);
}

}  // namespace easel::models::t5
