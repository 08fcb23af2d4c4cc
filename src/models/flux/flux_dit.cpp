// FLUX.1 DiT (see flux_dit.h).
#include "models/flux/flux_dit.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <unordered_map>

namespace easel::models::flux {

namespace {

const io::TensorInfo& need(const io::WeightIndex& idx, const std::string& name, size_t rank) {
    return need_tensor(idx, name, rank, "FLUX.1");
}

}  // namespace

// ------------------------------------------------------------------------------------ config

void apply_rope_config(const nlohmann::json& j, int64_t head_dim, std::vector<int>& axes, double& theta) {
    if (j.contains("axes_dims_rope")) {
        const auto& a = j["axes_dims_rope"];
        std::vector<int> v;
        int64_t sum = 0;
        bool ok = a.is_array() && !a.empty();
        if (ok)
            for (const auto& e : a) {
                if (!e.is_number_integer() || e.get<int64_t>() <= 0 || e.get<int64_t>() % 2 != 0) ok = false;
                else {
                    v.push_back(e.get<int>());
                    sum += e.get<int64_t>();
                }
            }
        if (!ok || sum != head_dim)
            fail(ErrorKind::InvalidInput, "config.json: axes_dims_rope must be positive even sizes summing to the head size {}, got {}",
                 head_dim, a.dump());
        axes = v;
    }
    if (j.contains("rope_theta")) {
        const auto& t = j["rope_theta"];
        if (!t.is_number() || t.get<double>() <= 0) fail(ErrorKind::InvalidInput, "config.json: rope_theta must be a positive number");
        theta = t.get<double>();
    }
}

std::vector<int> default_flux1_axes(int64_t head_dim) {
    if (head_dim < 8 || head_dim % 2 != 0)
        fail(ErrorKind::InvalidInput, "FLUX rotary axes: head size {} must be even and at least 8", head_dim);
    const int64_t a = 2 * ((head_dim - head_dim / 8) / 4);
    return {int(head_dim - 2 * a), int(a), int(a)};
}

std::optional<FluxSource> find_flux_dit(const io::WeightIndex& index) {
    for (const char* p : {"", "model.diffusion_model.", "transformer.", "diffusion_model."}) {
        const std::string pre = p;
        if (index.find(pre + "x_embedder.weight") && index.find(pre + "transformer_blocks.0.norm1.linear.weight"))
            return FluxSource{pre, FluxLayout::Diffusers};
        if (index.find(pre + "img_in.weight") && index.find(pre + "double_blocks.0.img_mod.lin.weight"))
            return FluxSource{pre, FluxLayout::Bfl};
    }
    return std::nullopt;
}

FluxDiTConfig infer_flux_dit_config(const io::WeightIndex& idx, const FluxSource& src) {
    const std::string& p = src.prefix;
    const bool bfl = src.layout == FluxLayout::Bfl;
    auto N = [&](const char* diffusers, const char* b) { return p + (bfl ? b : diffusers); };
    FluxDiTConfig cfg;
    const auto& x = need(idx, N("x_embedder.weight", "img_in.weight"), 2);
    cfg.hidden = x.shape[0];
    cfg.in_channels = x.shape[1];
    cfg.joint_dim = need(idx, N("context_embedder.weight", "txt_in.weight"), 2).shape[1];
    cfg.pooled_dim = need(idx, N("time_text_embed.text_embedder.linear_1.weight", "vector_in.in_layer.weight"), 2).shape[1];
    cfg.time_channels = need(idx, N("time_text_embed.timestep_embedder.linear_1.weight", "time_in.in_layer.weight"), 2).shape[1];
    cfg.guidance_embeds = idx.find(N("time_text_embed.guidance_embedder.linear_1.weight", "guidance_in.in_layer.weight")) != nullptr;
    cfg.head_dim =
        need(idx, N("transformer_blocks.0.attn.norm_q.weight", "double_blocks.0.img_attn.norm.query_norm.scale"), 1).shape[0];
    cfg.out_channels = need(idx, N("proj_out.weight", "final_layer.linear.weight"), 2).shape[0];
    cfg.mlp_hidden = need(idx, N("transformer_blocks.0.ff.net.0.proj.weight", "double_blocks.0.img_mlp.0.weight"), 2).shape[0];
    cfg.n_double = bfl ? count_indexed(idx, p + "double_blocks.", ".img_mod.lin.weight")
                       : count_indexed(idx, p + "transformer_blocks.", ".norm1.linear.weight");
    cfg.n_single = bfl ? count_indexed(idx, p + "single_blocks.", ".modulation.lin.weight")
                       : count_indexed(idx, p + "single_transformer_blocks.", ".norm.linear.weight");
    if (cfg.head_dim <= 0 || cfg.hidden % cfg.head_dim != 0)
        fail(ErrorKind::ModelMismatch, "FLUX DiT: hidden size {} is not a multiple of the head size {}", cfg.hidden, cfg.head_dim);
    cfg.heads = cfg.hidden / cfg.head_dim;
    if (cfg.n_single > 0) {
        const std::string single_mlp = bfl ? p + "single_blocks.0.linear1.weight" : p + "single_transformer_blocks.0.proj_mlp.weight";
        const auto& t = need(idx, single_mlp, 2);
        const int64_t m = bfl ? t.shape[0] - 3 * cfg.hidden : t.shape[0];
        if (m != cfg.mlp_hidden)
            fail(ErrorKind::ModelMismatch, "FLUX DiT: the single blocks' MLP width {} differs from the double blocks' {}", m,
                 cfg.mlp_hidden);
    }
    cfg.axes_dims = default_flux1_axes(cfg.head_dim);
    if (const nlohmann::json* j = idx.config()) apply_rope_config(*j, cfg.head_dim, cfg.axes_dims, cfg.theta);
    return cfg;
}

void configure_flux_source(nn::TensorSource& ts, const FluxDiTConfig& cfg, const FluxSource& src) {
    if (src.layout != FluxLayout::Bfl) return;
    const std::string& p = src.prefix;
    const int64_t D = cfg.hidden, M = cfg.mlp_hidden;
    auto ren = [&](const std::string& canonical, const std::string& stored, bool bias = true) {
        ts.rename(canonical + ".weight", p + stored + ".weight");
        if (bias) ts.rename(canonical + ".bias", p + stored + ".bias");
    };
    auto slice = [&](const std::string& canonical, const std::string& stored, int64_t b, int64_t e) {
        ts.slice_rows(canonical + ".weight", p + stored + ".weight", b, e);
        ts.slice_rows(canonical + ".bias", p + stored + ".bias", b, e);
    };
    ren("x_embedder", "img_in");
    ren("context_embedder", "txt_in");
    ren("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer");
    ren("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer");
    ren("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer");
    ren("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer");
    ren("time_text_embed.text_embedder.linear_1", "vector_in.in_layer");
    ren("time_text_embed.text_embedder.linear_2", "vector_in.out_layer");
    ren("norm_out.linear", "final_layer.adaLN_modulation.1");
    ren("proj_out", "final_layer.linear");
    for (int i = 0; i < cfg.n_double; ++i) {
        const std::string t = "transformer_blocks." + std::to_string(i) + ".", b = "double_blocks." + std::to_string(i) + ".";
        ren(t + "norm1.linear", b + "img_mod.lin");
        ren(t + "norm1_context.linear", b + "txt_mod.lin");
        slice(t + "attn.to_q", b + "img_attn.qkv", 0, D);
        slice(t + "attn.to_k", b + "img_attn.qkv", D, 2 * D);
        slice(t + "attn.to_v", b + "img_attn.qkv", 2 * D, 3 * D);
        slice(t + "attn.add_q_proj", b + "txt_attn.qkv", 0, D);
        slice(t + "attn.add_k_proj", b + "txt_attn.qkv", D, 2 * D);
        slice(t + "attn.add_v_proj", b + "txt_attn.qkv", 2 * D, 3 * D);
        ts.rename(t + "attn.norm_q.weight", p + b + "img_attn.norm.query_norm.scale");
        ts.rename(t + "attn.norm_k.weight", p + b + "img_attn.norm.key_norm.scale");
        ts.rename(t + "attn.norm_added_q.weight", p + b + "txt_attn.norm.query_norm.scale");
        ts.rename(t + "attn.norm_added_k.weight", p + b + "txt_attn.norm.key_norm.scale");
        ren(t + "attn.to_out.0", b + "img_attn.proj");
        ren(t + "attn.to_add_out", b + "txt_attn.proj");
        ren(t + "ff.net.0.proj", b + "img_mlp.0");
        ren(t + "ff.net.2", b + "img_mlp.2");
        ren(t + "ff_context.net.0.proj", b + "txt_mlp.0");
        ren(t + "ff_context.net.2", b + "txt_mlp.2");
    }
    for (int i = 0; i < cfg.n_single; ++i) {
        const std::string t = "single_transformer_blocks." + std::to_string(i) + ".", b = "single_blocks." + std::to_string(i) + ".";
        ren(t + "norm.linear", b + "modulation.lin");
        slice(t + "attn.to_q", b + "linear1", 0, D);
        slice(t + "attn.to_k", b + "linear1", D, 2 * D);
        slice(t + "attn.to_v", b + "linear1", 2 * D, 3 * D);
        slice(t + "proj_mlp", b + "linear1", 3 * D, 3 * D + M);
        ts.rename(t + "attn.norm_q.weight", p + b + "norm.query_norm.scale");
        ts.rename(t + "attn.norm_k.weight", p + b + "norm.key_norm.scale");
        ren(t + "proj_out", b + "linear2");
    }
}

// ------------------------------------------------------------------------------------ blocks

FluxDoubleBlock::FluxDoubleBlock(const FluxDiTConfig& cfg) : hidden(cfg.hidden), heads(cfg.heads), head_dim(cfg.head_dim) {
    const int64_t D = cfg.hidden, M = cfg.mlp_hidden;
    norm1 = &add<nn::Linear>("norm1.linear", D, 6 * D);
    norm1_context = &add<nn::Linear>("norm1_context.linear", D, 6 * D);
    norm_q = &add<nn::RMSNorm>("attn.norm_q", head_dim, 1e-6f);
    norm_k = &add<nn::RMSNorm>("attn.norm_k", head_dim, 1e-6f);
    to_q = &add<nn::Linear>("attn.to_q", D, D);
    to_k = &add<nn::Linear>("attn.to_k", D, D);
    to_v = &add<nn::Linear>("attn.to_v", D, D);
    to_out = &add<nn::Linear>("attn.to_out.0", D, D);
    norm_added_q = &add<nn::RMSNorm>("attn.norm_added_q", head_dim, 1e-6f);
    norm_added_k = &add<nn::RMSNorm>("attn.norm_added_k", head_dim, 1e-6f);
    add_q = &add<nn::Linear>("attn.add_q_proj", D, D);
    add_k = &add<nn::Linear>("attn.add_k_proj", D, D);
    add_v = &add<nn::Linear>("attn.add_v_proj", D, D);
    to_add_out = &add<nn::Linear>("attn.to_add_out", D, D);
    ff_in = &add<nn::Linear>("ff.net.0.proj", D, M);
    ff_out = &add<nn::Linear>("ff.net.2", M, D);
    ffc_in = &add<nn::Linear>("ff_context.net.0.proj", D, M);
    ffc_out = &add<nn::Linear>("ff_context.net.2", M, D);
}

void FluxDoubleBlock::forward(nn::Ctx& c, ggml_tensor*& img, ggml_tensor*& txt, ggml_tensor* temb, ggml_tensor* cos,
                              ggml_tensor* sin) const {
    ggml_context* ctx = c.ctx;
    const int64_t D = hidden, Lt = txt->ne[1], Li = img->ne[1];
    ggml_tensor* st = ggml_silu(ctx, temb);
    ggml_tensor* m = norm1->forward(c, st);          // {6D, N}: shift, scale, gate (attn); shift, scale, gate (mlp)
    ggml_tensor* mc = norm1_context->forward(c, st);
    ggml_tensor* ni = modulate(c, layer_norm(c, img), mod_chunk(c, m, 0, D), mod_chunk(c, m, 1, D));
    ggml_tensor* nt = modulate(c, layer_norm(c, txt), mod_chunk(c, mc, 0, D), mod_chunk(c, mc, 1, D));

    ggml_tensor* q = norm_q->forward(c, split_heads(c, to_q->forward(c, ni), head_dim, heads));
    ggml_tensor* k = norm_k->forward(c, split_heads(c, to_k->forward(c, ni), head_dim, heads));
    ggml_tensor* v = to_v->forward(c, ni);
    ggml_tensor* qt = norm_added_q->forward(c, split_heads(c, add_q->forward(c, nt), head_dim, heads));
    ggml_tensor* kt = norm_added_k->forward(c, split_heads(c, add_k->forward(c, nt), head_dim, heads));
    ggml_tensor* vt = add_v->forward(c, nt);
    // joint sequence [txt, img]
    q = apply_rope(c, ggml_concat(ctx, qt, q, 2), cos, sin);
    k = apply_rope(c, ggml_concat(ctx, kt, k, 2), cos, sin);
    v = ggml_concat(ctx, vt, v, 1);
    ggml_tensor* o = nn::attention(c, merge_heads(c, q), merge_heads(c, k), v, heads, heads);  // {D, Lt+Li, N}
    ggml_tensor* ot = to_add_out->forward(c, seq_slice(c, o, 0, Lt));
    ggml_tensor* oi = to_out->forward(c, seq_slice(c, o, Lt, Li));

    img = ggml_add(ctx, img, ggml_mul(ctx, oi, mod_chunk(c, m, 2, D)));
    ggml_tensor* hi = modulate(c, layer_norm(c, img), mod_chunk(c, m, 3, D), mod_chunk(c, m, 4, D));
    hi = ff_out->forward(c, gelu_tanh(c, ff_in->forward(c, hi)));
    img = ggml_add(ctx, img, ggml_mul(ctx, hi, mod_chunk(c, m, 5, D)));

    txt = ggml_add(ctx, txt, ggml_mul(ctx, ot, mod_chunk(c, mc, 2, D)));
    ggml_tensor* ht = modulate(c, layer_norm(c, txt), mod_chunk(c, mc, 3, D), mod_chunk(c, mc, 4, D));
    ht = ffc_out->forward(c, gelu_tanh(c, ffc_in->forward(c, ht)));
    txt = ggml_add(ctx, txt, ggml_mul(ctx, ht, mod_chunk(c, mc, 5, D)));
}

FluxSingleBlock::FluxSingleBlock(const FluxDiTConfig& cfg)
    : hidden(cfg.hidden), heads(cfg.heads), head_dim(cfg.head_dim), mlp_hidden(cfg.mlp_hidden) {
    const int64_t D = cfg.hidden, M = cfg.mlp_hidden;
    norm = &add<nn::Linear>("norm.linear", D, 3 * D);
    proj_mlp = &add<nn::Linear>("proj_mlp", D, M);
    proj_out = &add<nn::Linear>("proj_out", D + M, D);
    norm_q = &add<nn::RMSNorm>("attn.norm_q", head_dim, 1e-6f);
    norm_k = &add<nn::RMSNorm>("attn.norm_k", head_dim, 1e-6f);
    to_q = &add<nn::Linear>("attn.to_q", D, D);
    to_k = &add<nn::Linear>("attn.to_k", D, D);
    to_v = &add<nn::Linear>("attn.to_v", D, D);
}

ggml_tensor* FluxSingleBlock::forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* temb, ggml_tensor* cos, ggml_tensor* sin) const {
    ggml_context* ctx = c.ctx;
    const int64_t D = hidden;
    ggml_tensor* m = norm->forward(c, ggml_silu(ctx, temb));  // {3D, N}: shift, scale, gate
    ggml_tensor* nx = modulate(c, layer_norm(c, x), mod_chunk(c, m, 0, D), mod_chunk(c, m, 1, D));
    ggml_tensor* q = apply_rope(c, norm_q->forward(c, split_heads(c, to_q->forward(c, nx), head_dim, heads)), cos, sin);
    ggml_tensor* k = apply_rope(c, norm_k->forward(c, split_heads(c, to_k->forward(c, nx), head_dim, heads)), cos, sin);
    ggml_tensor* v = to_v->forward(c, nx);
    ggml_tensor* o = nn::attention(c, merge_heads(c, q), merge_heads(c, k), v, heads, heads);
    ggml_tensor* h = nullptr;
    if (mlp_hidden % D == 0) {
        // the MLP in D-wide chunks (rows of proj_mlp), joined to the attention output as
        // [o | chunk 0 | chunk 1 | ...] = [o | mlp]: the same values as one proj_mlp, in a form
        // ggml's meta device splits (--split-mode row, flux_row_split.h)
        std::vector<ggml_tensor*> parts{o};
        for (int64_t j = 0; j < mlp_hidden / D; ++j) parts.push_back(gelu_tanh(c, linear_rows(c, *proj_mlp, nx, j * D, D)));
        h = proj_out->forward(c, join_rows(c, parts));
    } else {
        h = proj_out->forward(c, ggml_concat(ctx, o, gelu_tanh(c, proj_mlp->forward(c, nx)), 0));
    }
    return ggml_add(ctx, x, ggml_mul(ctx, h, mod_chunk(c, m, 2, D)));
}

// ------------------------------------------------------------------------------------ model

FluxDiT::FluxDiT(const FluxDiTConfig& cfg, bool final_shift_first) : cfg_(cfg), final_shift_first_(final_shift_first) {
    const int64_t D = cfg.hidden;
    int64_t axes_sum = 0;
    for (int a : cfg.axes_dims) axes_sum += a;
    if (axes_sum != cfg.head_dim)
        fail(ErrorKind::InvalidInput, "FLUX DiT: rotary axes sum to {}, the head size is {}", axes_sum, cfg.head_dim);
    x_embedder_ = &add<nn::Linear>("x_embedder", cfg.in_channels, D);
    context_embedder_ = &add<nn::Linear>("context_embedder", cfg.joint_dim, D);
    t1_ = &add<nn::Linear>("time_text_embed.timestep_embedder.linear_1", cfg.time_channels, D);
    t2_ = &add<nn::Linear>("time_text_embed.timestep_embedder.linear_2", D, D);
    if (cfg.guidance_embeds) {
        g1_ = &add<nn::Linear>("time_text_embed.guidance_embedder.linear_1", cfg.time_channels, D);
        g2_ = &add<nn::Linear>("time_text_embed.guidance_embedder.linear_2", D, D);
    }
    p1_ = &add<nn::Linear>("time_text_embed.text_embedder.linear_1", cfg.pooled_dim, D);
    p2_ = &add<nn::Linear>("time_text_embed.text_embedder.linear_2", D, D);
    for (int i = 0; i < cfg.n_double; ++i) double_.push_back(&add<FluxDoubleBlock>("transformer_blocks." + std::to_string(i), cfg));
    for (int i = 0; i < cfg.n_single; ++i)
        single_.push_back(&add<FluxSingleBlock>("single_transformer_blocks." + std::to_string(i), cfg));
    norm_out_ = &add<nn::Linear>("norm_out.linear", D, 2 * D);
    proj_out_ = &add<nn::Linear>("proj_out", D, cfg.out_channels);
}

FluxState FluxDiT::prologue(nn::Ctx& c, const FluxInputs& in) const {
    ggml_context* ctx = c.ctx;
    if (!in.img || !in.txt || !in.pooled || !in.timestep || !in.rope_cos || !in.rope_sin)
        fail(ErrorKind::InvalidInput, "FLUX DiT: img, txt, pooled, timestep and rotary tables are all required");
    const int64_t N = in.img->ne[2], Li = in.img->ne[1], Lt = in.txt->ne[1];
    if (in.img->ne[0] != cfg_.in_channels || in.img->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "FLUX DiT: image tokens must be {{{}, L, N}}, got {}", cfg_.in_channels, ne_str(in.img));
    if (in.txt->ne[0] != cfg_.joint_dim || in.txt->ne[2] != N || in.txt->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "FLUX DiT: context must be {{{}, L, {}}} (T5 width, batch), got {}", cfg_.joint_dim, N,
             ne_str(in.txt));
    if (in.pooled->ne[0] != cfg_.pooled_dim || in.pooled->ne[1] != N || ggml_n_dims(in.pooled) > 2)
        fail(ErrorKind::InvalidInput, "FLUX DiT: pooled vector must be {{{}, {}}}, got {}", cfg_.pooled_dim, N, ne_str(in.pooled));
    if (in.timestep->ne[0] != N || ggml_n_dims(in.timestep) != 1)
        fail(ErrorKind::InvalidInput, "FLUX DiT: timestep must be {{{}}}, got {}", N, ne_str(in.timestep));
    if (cfg_.guidance_embeds && (!in.guidance || in.guidance->ne[0] != N || ggml_n_dims(in.guidance) != 1))
        fail(ErrorKind::InvalidInput, "FLUX DiT: this model embeds guidance (FLUX.1-dev): a guidance vector {{{}}} is required", N);
    if (in.rope_cos->ne[0] != cfg_.head_dim / 2 || in.rope_cos->ne[1] != Lt + Li || !ggml_are_same_shape(in.rope_cos, in.rope_sin))
        fail(ErrorKind::InvalidInput, "FLUX DiT: rotary tables must be {{{}, {}}} (head_dim/2, text + image tokens), got {}",
             cfg_.head_dim / 2, Lt + Li, ne_str(in.rope_cos));

    auto embed = [&](nn::Linear* l1, nn::Linear* l2, ggml_tensor* v) { return l2->forward(c, ggml_silu(ctx, l1->forward(c, v))); };
    auto tproj = [&](ggml_tensor* t) {
        return nn::timestep_embedding(c, ggml_scale(ctx, t, 1000.0f), int(cfg_.time_channels), true, 0.0f);
    };
    ggml_tensor* temb = embed(t1_, t2_, tproj(in.timestep));
    if (cfg_.guidance_embeds) temb = ggml_add(ctx, temb, embed(g1_, g2_, tproj(in.guidance)));
    temb = ggml_add(ctx, temb, embed(p1_, p2_, ggml_reshape_2d(ctx, in.pooled, cfg_.pooled_dim, N)));

    FluxState s;
    s.img = x_embedder_->forward(c, in.img);
    s.txt = context_embedder_->forward(c, in.txt);
    s.temb = temb;
    s.rope_cos = in.rope_cos;
    s.rope_sin = in.rope_sin;
    s.n_txt = Lt;
    return s;
}

FluxState FluxDiT::block(nn::Ctx& c, int i, FluxState s) const {
    if (i < 0 || i >= n_blocks()) fail(ErrorKind::InvalidInput, "FLUX DiT: block {} outside the {} blocks", i, n_blocks());
    if (i < cfg_.n_double) {
        if (!s.img || !s.txt) fail(ErrorKind::InvalidInput, "FLUX DiT: double block {} needs the separate img and txt streams", i);
        double_[size_t(i)]->forward(c, s.img, s.txt, s.temb, s.rope_cos, s.rope_sin);
        return s;
    }
    if (!s.joint) {
        if (!s.img || !s.txt) fail(ErrorKind::InvalidInput, "FLUX DiT: single block {} needs img and txt or the joint stream", i);
        s.n_txt = s.txt->ne[1];
        s.joint = ggml_concat(c.ctx, s.txt, s.img, 1);
        s.img = s.txt = nullptr;
    }
    s.joint = single_[size_t(i - cfg_.n_double)]->forward(c, s.joint, s.temb, s.rope_cos, s.rope_sin);
    return s;
}

FluxOutputs FluxDiT::epilogue(nn::Ctx& c, FluxState s) const {
    ggml_tensor* x = s.joint ? seq_slice(c, s.joint, s.n_txt, s.joint->ne[1] - s.n_txt) : s.img;
    if (!x) fail(ErrorKind::InvalidInput, "FLUX DiT epilogue: the state holds no image tokens");
    const int64_t D = cfg_.hidden;
    ggml_tensor* m = norm_out_->forward(c, ggml_silu(c.ctx, s.temb));  // {2D, N}
    ggml_tensor* scale = mod_chunk(c, m, final_shift_first_ ? 1 : 0, D);
    ggml_tensor* shift = mod_chunk(c, m, final_shift_first_ ? 0 : 1, D);
    x = modulate(c, layer_norm(c, x), shift, scale);
    return {proj_out_->forward(c, x)};
}

const nn::Block& FluxDiT::block_params(int i) const {
    if (i < 0 || i >= n_blocks()) fail(ErrorKind::InvalidInput, "FLUX DiT: block {} outside the {} blocks", i, n_blocks());
    if (i < cfg_.n_double) return *double_[size_t(i)];
    return *single_[size_t(i - cfg_.n_double)];
}

FluxDiTModel FluxDiTModel::load(const io::WeightIndex& index, ggml_backend_buffer_type_t buft, const nn::LoadOptions& opt,
                                const std::vector<int>& axes_dims) {
    auto src = find_flux_dit(index);
    if (!src)
        fail(ErrorKind::ModelMismatch,
             "no FLUX.1 DiT found: expected keys like 'transformer_blocks.0.norm1.linear.weight' (diffusers) or "
             "'double_blocks.0.img_mod.lin.weight' (BFL/ComfyUI, optionally under 'model.diffusion_model.')");
    FluxDiTConfig cfg = infer_flux_dit_config(index, *src);
    if (!axes_dims.empty()) cfg.axes_dims = axes_dims;
    FluxDiTModel m;
    m.source = *src;
    m.module = std::make_unique<FluxDiT>(cfg, src->layout == FluxLayout::Bfl);
    nn::TensorSource ts(index, src->prefix);
    configure_flux_source(ts, cfg, *src);
    m.params = nn::ParamBuffer::load(*m.module, ts, buft, opt);
    return m;
}

}  // namespace easel::models::flux
