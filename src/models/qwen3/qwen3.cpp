// Qwen3 text encoder (see qwen3.h). Architecture facts from transformers'
// models/qwen3/modeling_qwen3.py (Qwen3Attention with per-head q_norm/k_norm before RoPE,
// Qwen3MLP, Qwen3DecoderLayer, Qwen3Model.norm; rotate_half RoPE = ggml's NEOX mode); GGUF
// tensor names from llama.cpp's gguf-py constants (MODEL_ARCH.QWEN3).
#include "models/qwen3/qwen3.h"
#include "core/platform.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>

namespace easel::models::qwen3 {

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

const char* kHfEmbed = "embed_tokens.weight";
const char* kHfQNorm0 = "layers.0.self_attn.q_norm.weight";

// canonical name -> llama.cpp GGUF name ("" if not a Qwen3 parameter)
std::string to_gguf(const std::string& c) {
    if (c == "embed_tokens.weight") return "token_embd.weight";
    if (c == "norm.weight") return "output_norm.weight";
    static const std::regex layer(R"(layers\.(\d+)\.(.*))");
    std::smatch m;
    if (!std::regex_match(c, m, layer)) return {};
    static const std::pair<const char*, const char*> table[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    for (auto& [from, to] : table)
        if (m[2].str() == from) return "blk." + m[1].str() + "." + to;
    return {};
}

// Stored name of a canonical parameter under keys.
std::string stored(const Qwen3Keys& k, const std::string& canonical) {
    return k.layout == Qwen3Keys::Layout::Gguf ? to_gguf(canonical) : k.prefix + canonical;
}

const io::TensorInfo& need(const io::WeightIndex& idx, const Qwen3Keys& k, const std::string& canonical, size_t dims) {
    const std::string name = stored(k, canonical);
    const io::TensorInfo* t = idx.find(name);
    if (!t) fail(ErrorKind::ModelMismatch, "Qwen3 text encoder: tensor '{}' is missing; this is not a complete Qwen3 model", name);
    if (t->shape.size() != dims)
        fail(ErrorKind::ModelMismatch, "Qwen3 text encoder: tensor '{}' has shape [{}], expected {} dimensions", name,
             fmt::join(t->shape, ", "), dims);
    return *t;
}

std::optional<double> meta_number(const io::WeightIndex& idx, const std::string& key) {
    auto it = idx.metadata().find(key);
    if (it == idx.metadata().end()) return std::nullopt;
    if (it->second.kind == io::MetaValue::Kind::Float) return it->second.f;
    if (it->second.kind == io::MetaValue::Kind::Int) return (double)it->second.i;
    return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------- config

Qwen3Overrides overrides_from_config_json(const nlohmann::json& j) {
    Qwen3Overrides o;
    if (!j.is_object()) return o;
    if (j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number()) o.eps = j["rms_norm_eps"].get<float>();
    if (j.contains("rope_theta") && j["rope_theta"].is_number()) o.rope_theta = j["rope_theta"].get<float>();
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object() && j["rope_parameters"].contains("rope_theta") &&
        j["rope_parameters"]["rope_theta"].is_number())
        o.rope_theta = j["rope_parameters"]["rope_theta"].get<float>();
    return o;
}

std::optional<Qwen3Keys> find_qwen3(const io::WeightIndex& index) {
    if (index.find("token_embd.weight") && index.find("blk.0.attn_q_norm.weight"))
        return Qwen3Keys{Qwen3Keys::Layout::Gguf, ""};
    std::optional<Qwen3Keys> best;
    for (auto& t : index.tensors()) {
        if (!ends_with(t.name, kHfEmbed)) continue;
        std::string p = t.name.substr(0, t.name.size() - std::string(kHfEmbed).size());
        if (!p.empty() && p.back() != '.') continue;
        if (!index.find(p + kHfQNorm0)) continue;
        if (!best || p.size() < best->prefix.size()) best = Qwen3Keys{Qwen3Keys::Layout::Transformers, p};
    }
    return best;
}

Qwen3Config infer_config(const io::WeightIndex& index, const Qwen3Keys& keys, const Qwen3Overrides& ov) {
    Qwen3Config c;
    const auto& emb = need(index, keys, "embed_tokens.weight", 2);
    c.vocab = emb.shape[0];
    c.hidden = emb.shape[1];
    while (index.find(stored(keys, "layers." + std::to_string(c.layers) + ".input_layernorm.weight"))) ++c.layers;
    if (c.layers == 0) fail(ErrorKind::ModelMismatch, "Qwen3 text encoder: no decoder layers found (layers.0.input_layernorm.weight)");
    const auto& qn = need(index, keys, "layers.0.self_attn.q_norm.weight", 1);
    const auto& q = need(index, keys, "layers.0.self_attn.q_proj.weight", 2);
    const auto& k = need(index, keys, "layers.0.self_attn.k_proj.weight", 2);
    const auto& g = need(index, keys, "layers.0.mlp.gate_proj.weight", 2);
    c.head_dim = qn.shape[0];
    if (c.head_dim <= 0 || q.shape[0] % c.head_dim != 0 || k.shape[0] % c.head_dim != 0)
        fail(ErrorKind::ModelMismatch, "Qwen3 text encoder: q_proj rows {} / k_proj rows {} are not multiples of head_dim {} (q_norm size)",
             q.shape[0], k.shape[0], c.head_dim);
    c.heads = q.shape[0] / c.head_dim;
    c.kv_heads = k.shape[0] / c.head_dim;
    if (c.kv_heads == 0 || c.heads % c.kv_heads != 0)
        fail(ErrorKind::ModelMismatch, "Qwen3 text encoder: {} query heads are not a multiple of {} key/value heads", c.heads, c.kv_heads);
    if (q.shape[1] != c.hidden || k.shape[1] != c.hidden || g.shape[1] != c.hidden)
        fail(ErrorKind::ModelMismatch, "Qwen3 text encoder: projections of layer 0 do not take the hidden size {} as input", c.hidden);
    c.intermediate = g.shape[0];
    // GGUF metadata (llama.cpp: <arch>.rope.freq_base, <arch>.attention.layer_norm_rms_epsilon)
    std::string arch = "qwen3";
    if (auto it = index.metadata().find("general.architecture");
        it != index.metadata().end() && it->second.kind == io::MetaValue::Kind::String)
        arch = it->second.s;
    if (auto v = meta_number(index, arch + ".rope.freq_base")) c.rope_theta = (float)*v;
    if (auto v = meta_number(index, arch + ".attention.layer_norm_rms_epsilon")) c.eps = (float)*v;
    if (const nlohmann::json* cfg = index.config()) {
        Qwen3Overrides f = overrides_from_config_json(*cfg);
        if (f.eps) c.eps = *f.eps;
        if (f.rope_theta) c.rope_theta = *f.rope_theta;
    }
    if (ov.eps) c.eps = *ov.eps;
    if (ov.rope_theta) c.rope_theta = *ov.rope_theta;
    if (ov.layers) {
        if (*ov.layers < 1 || *ov.layers > c.layers)
            fail(ErrorKind::InvalidInput, "Qwen3 text encoder has {} layers; cannot use {}", c.layers, *ov.layers);
        c.layers = *ov.layers;
    }
    if (!(c.eps > 0) || !(c.rope_theta > 0))
        fail(ErrorKind::InvalidInput, "Qwen3 text encoder: rms_norm_eps {} and rope_theta {} must be positive", c.eps, c.rope_theta);
    return c;
}

nn::TensorSource make_tensor_source(const io::WeightIndex& index, const Qwen3Keys& keys, const Qwen3Config&) {
    if (keys.layout == Qwen3Keys::Layout::Transformers) return nn::TensorSource(index, keys.prefix);
    nn::TensorSource src(index, "");
    src.set_mapper([](const std::string& c) { return to_gguf(c); });
    return src;
}

nn::LoadOptions default_load_options(const Qwen3Keys& keys, const Qwen3Config& cfg, const io::WeightIndex& index) {
    nn::LoadOptions o;
    o.ignore_unexpected_suffixes = {"rotary_emb.inv_freq"};
    std::string lp;
    if (keys.layout == Qwen3Keys::Layout::Gguf) {
        o.ignore_unexpected_suffixes.push_back("output.weight");  // lm_head (tied models have none)
        o.ignore_unexpected_suffixes.push_back("rope_freqs.weight");
        lp = "blk.";
    } else {
        o.ignore_unexpected_suffixes.push_back(keys.prefix + "lm_head.weight");
        lp = keys.prefix + "layers.";
    }
    for (auto& t : index.tensors()) {
        if (t.name.rfind("__", 0) == 0) {  // reference fixtures' __input__.* / __output__.* entries
            o.ignore_unexpected_suffixes.push_back(t.name);
            continue;
        }
        if (t.name.compare(0, lp.size(), lp) != 0) continue;
        const char* p = t.name.c_str() + lp.size();
        if (*p < '0' || *p > '9') continue;
        if (std::atoll(p) >= cfg.layers) o.ignore_unexpected_suffixes.push_back(t.name);
    }
    return o;
}

// ---------------------------------------------------------------- modules

Qwen3DecoderLayer::Qwen3DecoderLayer(const Qwen3Config& cfg) : cfg_(cfg) {
    const int64_t qd = cfg.heads * cfg.head_dim, kvd = cfg.kv_heads * cfg.head_dim;
    ln1_ = &add<nn::RMSNorm>("input_layernorm", cfg.hidden, cfg.eps);
    q_ = &add<nn::Linear>("self_attn.q_proj", cfg.hidden, qd, false);
    k_ = &add<nn::Linear>("self_attn.k_proj", cfg.hidden, kvd, false);
    v_ = &add<nn::Linear>("self_attn.v_proj", cfg.hidden, kvd, false);
    o_ = &add<nn::Linear>("self_attn.o_proj", qd, cfg.hidden, false);
    q_norm_ = &add<nn::RMSNorm>("self_attn.q_norm", cfg.head_dim, cfg.eps);
    k_norm_ = &add<nn::RMSNorm>("self_attn.k_norm", cfg.head_dim, cfg.eps);
    ln2_ = &add<nn::RMSNorm>("post_attention_layernorm", cfg.hidden, cfg.eps);
    gate_ = &add<nn::Linear>("mlp.gate_proj", cfg.hidden, cfg.intermediate, false);
    up_ = &add<nn::Linear>("mlp.up_proj", cfg.hidden, cfg.intermediate, false);
    down_ = &add<nn::Linear>("mlp.down_proj", cfg.intermediate, cfg.hidden, false);
}

ggml_tensor* Qwen3DecoderLayer::forward(nn::Ctx& c, ggml_tensor* h, ggml_tensor* mask, ggml_tensor* pos) const {
    ggml_context* ctx = c.ctx;
    const int64_t L = h->ne[1], N = h->ne[2], D = cfg_.head_dim;
    if (h->ne[0] != cfg_.hidden || h->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "Qwen3 layer: hidden state must be {{{}, L, N}}, got {{{}, {}, {}, {}}}", cfg_.hidden, h->ne[0],
             h->ne[1], h->ne[2], h->ne[3]);
    if (!pos || pos->type != GGML_TYPE_I32 || pos->ne[0] != L || ggml_nelements(pos) != L)
        fail(ErrorKind::InvalidInput, "Qwen3 layer: positions must be I32 {{L={}}}", L);
    ggml_tensor* x = ln1_->forward(c, h);
    // per-head RMSNorm over head_dim, then RoPE (rotate_half form = NEOX) on {D, heads, L, N}
    auto qk = [&](const nn::Linear* proj, const nn::RMSNorm* norm, int64_t heads) {
        ggml_tensor* t = ggml_reshape_4d(ctx, proj->forward(c, x), D, heads, L, N);
        t = norm->forward(c, t);
        t = ggml_rope_ext(ctx, t, pos, nullptr, (int)D, GGML_ROPE_TYPE_NEOX, 0, cfg_.rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        return ggml_reshape_3d(ctx, t, D * heads, L, N);
    };
    ggml_tensor* q = qk(q_, q_norm_, cfg_.heads);
    ggml_tensor* k = qk(k_, k_norm_, cfg_.kv_heads);
    ggml_tensor* v = v_->forward(c, x);
    ggml_tensor* a = nn::attention(c, q, k, v, cfg_.heads, cfg_.kv_heads, mask);
    h = ggml_add(ctx, h, o_->forward(c, a));
    x = ln2_->forward(c, h);
    ggml_tensor* m = ggml_mul(ctx, ggml_silu(ctx, gate_->forward(c, x)), up_->forward(c, x));
    return ggml_add(ctx, h, down_->forward(c, m));
}

Qwen3Model::Qwen3Model(const Qwen3Config& cfg) : cfg_(cfg) {
    if (cfg.vocab <= 0 || cfg.hidden <= 0 || cfg.layers <= 0 || cfg.heads <= 0 || cfg.kv_heads <= 0 || cfg.head_dim <= 0 ||
        cfg.intermediate <= 0 || cfg.heads % cfg.kv_heads != 0)
        fail(ErrorKind::InvalidInput, "Qwen3 config is invalid (vocab {}, hidden {}, layers {}, heads {}, kv heads {}, head_dim {}, intermediate {})",
             cfg.vocab, cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate);
    tok_ = &add<nn::Embedding>("embed_tokens", cfg.vocab, cfg.hidden);
    for (int64_t i = 0; i < cfg.layers; ++i) layers_.push_back(&add<Qwen3DecoderLayer>("layers." + std::to_string(i), cfg));
    norm_ = &add<nn::RMSNorm>("norm", cfg.hidden, cfg.eps);
}

Qwen3State Qwen3Model::prologue(nn::Ctx& c, const Qwen3Inputs& in) const {
    if (!in.ids || in.ids->type != GGML_TYPE_I32 || in.ids->ne[2] != 1 || in.ids->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "Qwen3 text encoder: ids must be an I32 tensor {{L, N}}");
    const int64_t L = in.ids->ne[0], N = in.ids->ne[1];
    if (!in.pos || in.pos->type != GGML_TYPE_I32 || ggml_nelements(in.pos) != L)
        fail(ErrorKind::InvalidInput, "Qwen3 text encoder: pos must be an I32 tensor {{L={}}} (see qwen3::positions())", L);
    Qwen3State s;
    s.h = tok_->forward(c, in.ids);
    if (s.h->type != GGML_TYPE_F32) s.h = ggml_cast(c.ctx, s.h, GGML_TYPE_F32);
    s.pos = in.pos;
    if (in.mask) {
        const auto* m = in.mask;
        if (m->type != GGML_TYPE_F32 || m->ne[0] != L || m->ne[1] != L || m->ne[2] != 1 || (m->ne[3] != N && m->ne[3] != 1))
            fail(ErrorKind::InvalidInput, "Qwen3 text encoder: mask must be F32 {{L={}, L, 1, N={}}} (see qwen3::attention_mask())", L, N);
        s.mask = in.mask;
    } else {
        // causal {L, L} from ops (no host data): 0 on and below the diagonal, -inf above
        ggml_tensor* z = ggml_scale(c.ctx, ggml_repeat_4d(c.ctx, ggml_arange(c.ctx, 0.0f, (float)L, 1.0f), L, L, 1, 1), 0.0f);
        s.mask = ggml_diag_mask_inf(c.ctx, z, 0);
    }
    return s;
}

Qwen3State Qwen3Model::block(nn::Ctx& c, int i, Qwen3State s) const {
    if (i < 0 || i >= n_blocks()) fail(ErrorKind::InvalidInput, "Qwen3 text encoder has no layer {}", i);
    s.h = layers_[(size_t)i]->forward(c, s.h, s.mask, s.pos);
    return s;
}

Qwen3Outputs Qwen3Model::epilogue(nn::Ctx& c, Qwen3State s) const { return Qwen3Outputs{norm_->forward(c, s.h)}; }

int Qwen3Model::resolve_index(int index) const {
    const int n = n_blocks();
    const int r = index < 0 ? n + 1 + index : index;
    if (r < 0 || r > n)
        fail(ErrorKind::InvalidInput, "hidden-state index {} is outside the {} hidden states of this Qwen3 model (0..{}, or -{}..-1)", index,
             n + 1, n, n + 1);
    return r;
}

std::vector<ggml_tensor*> Qwen3Model::hidden_states(nn::Ctx& c, const Qwen3Inputs& in, std::span<const int> indices) const {
    if (indices.empty()) fail(ErrorKind::InvalidInput, "Qwen3 text encoder: no hidden-state index requested");
    std::vector<int> idx;
    int hi = 0;
    for (int i : indices) {
        idx.push_back(resolve_index(i));
        hi = std::max(hi, idx.back());
    }
    const int n = n_blocks();
    std::vector<ggml_tensor*> hs((size_t)hi + 1, nullptr);  // hs[j] = hidden_states[j]
    Qwen3State s = prologue(c, in);
    hs[0] = s.h;
    const int run_to = std::min(hi, n);
    for (int i = 0; i < run_to; ++i) {
        s = block(c, i, s);
        if (i + 1 < n) hs[(size_t)i + 1] = s.h;
    }
    if (hi == n) hs[(size_t)n] = epilogue(c, s).last_hidden_state;
    std::vector<ggml_tensor*> out;
    for (int j : idx) out.push_back(hs[(size_t)j]);
    return out;
}

// ---------------------------------------------------------------- host helpers

std::vector<float> attention_mask(std::span<const int32_t> mask01, int64_t L, int64_t N) {
    if (L <= 0 || N <= 0 || (int64_t)mask01.size() != L * N)
        fail(ErrorKind::InvalidInput, "attention mask has {} values, expected N={} x L={}", mask01.size(), N, L);
    const float ninf = -std::numeric_limits<float>::infinity();
    std::vector<float> m((size_t)(L * L * N), ninf);
    for (int64_t n = 0; n < N; ++n) {
        const int32_t* row = mask01.data() + n * L;
        for (int64_t q = 0; q < L; ++q) {
            float* out = m.data() + (n * L + q) * L;
            bool any = false;
            for (int64_t k = 0; k <= q; ++k)
                if (row[k] != 0) {
                    out[k] = 0.0f;
                    any = true;
                }
            if (!any)
                for (int64_t k = 0; k <= q; ++k) out[k] = 0.0f;
        }
    }
    return m;
}

std::vector<int32_t> positions(int64_t L) {
    std::vector<int32_t> p((size_t)std::max<int64_t>(L, 0));
    for (int64_t i = 0; i < L; ++i) p[(size_t)i] = (int32_t)i;
    return p;
}

runtime::HostTensor stack_hidden_states(std::span<const runtime::HostTensor> hs) {
    if (hs.empty()) fail(ErrorKind::InvalidInput, "stack_hidden_states: no tensors");
    const int64_t L = hs[0].ne[1], N = hs[0].ne[2];
    int64_t D = 0;
    for (auto& t : hs) {
        if (t.ne[1] != L || t.ne[2] != N || t.ne[3] != 1 || (int64_t)t.data.size() != t.numel())
            fail(ErrorKind::InvalidInput, "stack_hidden_states: tensors must all be {{D, L={}, N={}}}", L, N);
        D += t.ne[0];
    }
    runtime::HostTensor out;
    out.name = "stacked_hidden_states";
    out.ne = {D, L, N, 1};
    out.data.resize((size_t)(D * L * N));
    for (int64_t tok = 0; tok < L * N; ++tok) {
        float* dst = out.data.data() + tok * D;
        for (auto& t : hs) {
            const float* src = t.data.data() + tok * t.ne[0];
            dst = std::copy(src, src + t.ne[0], dst);
        }
    }
    return out;
}

// ---------------------------------------------------------------- runner

struct Qwen3TextEncoder::Impl {
    std::unique_ptr<runtime::GraphRunner> runner;  // destroyed last
    Qwen3Config cfg;
    std::unique_ptr<Qwen3Model> model;
    nn::ParamBuffer params;
    bool flash = true;
};

Qwen3TextEncoder Qwen3TextEncoder::open(const std::filesystem::path& path, const Qwen3RunOptions& opt) {
    io::WeightIndex index = io::WeightIndex::open(path);
    return Qwen3TextEncoder(index, opt);
}

Qwen3TextEncoder::Qwen3TextEncoder(const io::WeightIndex& index, const Qwen3RunOptions& opt) : impl_(std::make_unique<Impl>()) {
    auto keys = find_qwen3(index);
    if (!keys)
        fail(ErrorKind::ModelMismatch,
             "no Qwen3 text encoder found in '{}' (looked for embed_tokens.weight + layers.0.self_attn.q_norm.weight, or GGUF "
             "token_embd.weight + blk.0.attn_q_norm.weight)",
             index.files().empty() ? std::string("<none>") : platform::path_utf8(index.files()[0].path));
    impl_->cfg = infer_config(index, *keys, opt.overrides);
    impl_->model = std::make_unique<Qwen3Model>(impl_->cfg);
    impl_->runner = std::make_unique<runtime::GraphRunner>(opt.device, opt.threads);
    impl_->flash = opt.flash_attn;
    nn::LoadOptions lo = default_load_options(*keys, impl_->cfg, index);
    lo.weight_type = opt.weight_type;
    impl_->params = nn::ParamBuffer::load(*impl_->model, make_tensor_source(index, *keys, impl_->cfg), impl_->runner->buffer_type(), lo);
}

Qwen3TextEncoder::Qwen3TextEncoder(Qwen3TextEncoder&&) noexcept = default;
Qwen3TextEncoder& Qwen3TextEncoder::operator=(Qwen3TextEncoder&&) noexcept = default;
Qwen3TextEncoder::~Qwen3TextEncoder() = default;

const Qwen3Config& Qwen3TextEncoder::config() const { return impl_->cfg; }
const Qwen3Model& Qwen3TextEncoder::model() const { return *impl_->model; }
size_t Qwen3TextEncoder::param_bytes() const { return impl_->params.size(); }
runtime::GraphRunner& Qwen3TextEncoder::runner() const { return *impl_->runner; }

std::vector<runtime::HostTensor> Qwen3TextEncoder::run(std::span<const int32_t> ids, std::span<const int32_t> mask01, int64_t B,
                                                       int64_t L, std::span<const int> indices) const {
    if (B <= 0 || L <= 0 || (int64_t)ids.size() != B * L)
        fail(ErrorKind::InvalidInput, "Qwen3 text encoder: {} token ids for a batch of {} x {}", ids.size(), B, L);
    if (!mask01.empty() && (int64_t)mask01.size() != B * L)
        fail(ErrorKind::InvalidInput, "Qwen3 text encoder: attention mask has {} values for a batch of {} x {}", mask01.size(), B, L);
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || ids[i] >= impl_->cfg.vocab)
            fail(ErrorKind::InvalidInput, "token id {} at position {} is outside the Qwen3 vocabulary of {}; the tokenizer does not match the model",
                 ids[i], i, impl_->cfg.vocab);
    for (int i : indices) impl_->model->resolve_index(i);  // validate before building
    std::vector<float> mask;
    if (!mask01.empty()) mask = attention_mask(mask01, L, B);
    const std::vector<int32_t> pos = positions(L);
    auto out = impl_->runner->run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), impl_->flash, g.backend()};
        Qwen3Inputs in;
        in.ids = g.input_i32("ids", {L, B}, ids);
        in.pos = g.input_i32("pos", {L}, pos);
        if (!mask.empty()) in.mask = g.input_f32("mask", {L, L, 1, B}, mask);
        return impl_->model->hidden_states(c, in, indices);
    });
    for (size_t i = 0; i < out.size() && i < indices.size(); ++i)
        out[i].name = "hidden_states." + std::to_string(impl_->model->resolve_index(indices[i]));
    return out;
}

}  // namespace easel::models::qwen3
