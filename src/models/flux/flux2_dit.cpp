// FLUX.2 DiT (see flux2_dit.h).
#include "models/flux/flux2_dit.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

namespace easel::models::flux {

namespace {

const io::TensorInfo& need(const io::WeightIndex& idx, const std::string& name, size_t rank) {
    return need_tensor(idx, name, rank, "FLUX.2");
}

// Columns [begin, begin + n) of x {F, L, N} (features), contiguous.
ggml_tensor* feat_slice(nn::Ctx& c, ggml_tensor* x, int64_t begin, int64_t n) {
    return ggml_cont(c.ctx, ggml_view_3d(c.ctx, x, n, x->ne[1], x->ne[2], x->nb[1], x->nb[2], size_t(begin) * ggml_element_size(x)));
}

}  // namespace

std::vector<int> default_flux2_axes(int64_t head_dim) {
    if (head_dim <= 0 || head_dim % 8 != 0)
        fail(ErrorKind::InvalidInput, "FLUX.2 rotary axes: head size {} must be a positive multiple of 8", head_dim);
    const int a = int(head_dim / 4);
    return {a, a, a, a};
}

std::optional<FluxSource> find_flux2_dit(const io::WeightIndex& index) {
    for (const char* p : {"", "model.diffusion_model.", "transformer.", "diffusion_model."}) {
        const std::string pre = p;
        if (index.find(pre + "double_stream_modulation_img.linear.weight") && index.find(pre + "transformer_blocks.0.attn.to_q.weight"))
            return FluxSource{pre, FluxLayout::Diffusers};
        if (index.find(pre + "double_stream_modulation_img.lin.weight") && index.find(pre + "double_blocks.0.img_attn.qkv.weight"))
            return FluxSource{pre, FluxLayout::Bfl};
    }
    return std::nullopt;
}

Flux2DiTConfig infer_flux2_dit_config(const io::WeightIndex& idx, const FluxSource& src) {
    const std::string& p = src.prefix;
    const bool bfl = src.layout == FluxLayout::Bfl;
    auto N = [&](const char* diffusers, const char* b) { return p + (bfl ? b : diffusers); };
    Flux2DiTConfig cfg;
    const auto& x = need(idx, N("x_embedder.weight", "img_in.weight"), 2);
    cfg.hidden = x.shape[0];
    cfg.in_channels = x.shape[1];
    cfg.joint_dim = need(idx, N("context_embedder.weight", "txt_in.weight"), 2).shape[1];
    cfg.time_channels = need(idx, N("time_guidance_embed.timestep_embedder.linear_1.weight", "time_in.in_layer.weight"), 2).shape[1];
    cfg.guidance_embeds = idx.find(N("time_guidance_embed.guidance_embedder.linear_1.weight", "guidance_in.in_layer.weight")) != nullptr;
    cfg.head_dim =
        need(idx, N("transformer_blocks.0.attn.norm_q.weight", "double_blocks.0.img_attn.norm.query_norm.scale"), 1).shape[0];
    cfg.out_channels = need(idx, N("proj_out.weight", "final_layer.linear.weight"), 2).shape[0];
    const int64_t ff_rows = need(idx, N("transformer_blocks.0.ff.linear_in.weight", "double_blocks.0.img_mlp.0.weight"), 2).shape[0];
    if (ff_rows % 2 != 0) fail(ErrorKind::ModelMismatch, "FLUX.2 DiT: the SwiGLU input projection has an odd row count {}", ff_rows);
    cfg.mlp_hidden = ff_rows / 2;
    cfg.n_double = bfl ? count_indexed(idx, p + "double_blocks.", ".img_attn.qkv.weight")
                       : count_indexed(idx, p + "transformer_blocks.", ".attn.to_q.weight");
    cfg.n_single = bfl ? count_indexed(idx, p + "single_blocks.", ".linear1.weight")
                       : count_indexed(idx, p + "single_transformer_blocks.", ".attn.to_qkv_mlp_proj.weight");
    if (cfg.head_dim <= 0 || cfg.hidden % cfg.head_dim != 0)
        fail(ErrorKind::ModelMismatch, "FLUX.2 DiT: hidden size {} is not a multiple of the head size {}", cfg.hidden, cfg.head_dim);
    cfg.heads = cfg.hidden / cfg.head_dim;
    if (cfg.n_single > 0) {
        const auto& t = need(idx, N("single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight", "single_blocks.0.linear1.weight"), 2);
        if (t.shape[0] != 3 * cfg.hidden + 2 * cfg.mlp_hidden)
            fail(ErrorKind::ModelMismatch, "FLUX.2 DiT: single-block projection has {} rows, expected 3*{} + 2*{}", t.shape[0],
                 cfg.hidden, cfg.mlp_hidden);
    }
    cfg.axes_dims = default_flux2_axes(cfg.head_dim);
    if (const nlohmann::json* j = idx.config()) apply_rope_config(*j, cfg.head_dim, cfg.axes_dims, cfg.theta);
    return cfg;
}

void configure_flux2_source(nn::TensorSource& ts, const Flux2DiTConfig& cfg, const FluxSource& src) {
    if (src.layout != FluxLayout::Bfl) return;
    const std::string& p = src.prefix;
    const int64_t D = cfg.hidden;
    auto ren = [&](const std::string& canonical, const std::string& stored) { ts.rename(canonical + ".weight", p + stored + ".weight"); };
    auto slice = [&](const std::string& canonical, const std::string& stored, int64_t b, int64_t e) {
        ts.slice_rows(canonical + ".weight", p + stored + ".weight", b, e);
    };
    ren("x_embedder", "img_in");
    ren("context_embedder", "txt_in");
    ren("time_guidance_embed.timestep_embedder.linear_1", "time_in.in_layer");
    ren("time_guidance_embed.timestep_embedder.linear_2", "time_in.out_layer");
    ren("time_guidance_embed.guidance_embedder.linear_1", "guidance_in.in_layer");
    ren("time_guidance_embed.guidance_embedder.linear_2", "guidance_in.out_layer");
    ren("double_stream_modulation_img.linear", "double_stream_modulation_img.lin");
    ren("double_stream_modulation_txt.linear", "double_stream_modulation_txt.lin");
    ren("single_stream_modulation.linear", "single_stream_modulation.lin");
    ren("norm_out.linear", "final_layer.adaLN_modulation.1");
    ren("proj_out", "final_layer.linear");
    for (int i = 0; i < cfg.n_double; ++i) {
        const std::string t = "transformer_blocks." + std::to_string(i) + ".", b = "double_blocks." + std::to_string(i) + ".";
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
        ren(t + "ff.linear_in", b + "img_mlp.0");
        ren(t + "ff.linear_out", b + "img_mlp.2");
        ren(t + "ff_context.linear_in", b + "txt_mlp.0");
        ren(t + "ff_context.linear_out", b + "txt_mlp.2");
    }
    for (int i = 0; i < cfg.n_single; ++i) {
        const std::string t = "single_transformer_blocks." + std::to_string(i) + ".", b = "single_blocks." + std::to_string(i) + ".";
        ren(t + "attn.to_qkv_mlp_proj", b + "linear1");
        ren(t + "attn.to_out", b + "linear2");
        ts.rename(t + "attn.norm_q.weight", p + b + "norm.query_norm.scale");
        ts.rename(t + "attn.norm_k.weight", p + b + "norm.key_norm.scale");
    }
}

// ------------------------------------------------------------------------------------ blocks

Flux2DoubleBlock::Flux2DoubleBlock(const Flux2DiTConfig& cfg)
    : hidden(cfg.hidden), heads(cfg.heads), head_dim(cfg.head_dim), mlp_hidden(cfg.mlp_hidden) {
    const int64_t D = cfg.hidden, M = cfg.mlp_hidden;
    to_q = &add<nn::Linear>("attn.to_q", D, D, false);
    to_k = &add<nn::Linear>("attn.to_k", D, D, false);
    to_v = &add<nn::Linear>("attn.to_v", D, D, false);
    norm_q = &add<nn::RMSNorm>("attn.norm_q", head_dim, 1e-6f);
    norm_k = &add<nn::RMSNorm>("attn.norm_k", head_dim, 1e-6f);
    to_out = &add<nn::Linear>("attn.to_out.0", D, D, false);
    norm_added_q = &add<nn::RMSNorm>("attn.norm_added_q", head_dim, 1e-6f);
    norm_added_k = &add<nn::RMSNorm>("attn.norm_added_k", head_dim, 1e-6f);
    add_q = &add<nn::Linear>("attn.add_q_proj", D, D, false);
    add_k = &add<nn::Linear>("attn.add_k_proj", D, D, false);
    add_v = &add<nn::Linear>("attn.add_v_proj", D, D, false);
    to_add_out = &add<nn::Linear>("attn.to_add_out", D, D, false);
    ff_in = &add<nn::Linear>("ff.linear_in", D, 2 * M, false);
    ff_out = &add<nn::Linear>("ff.linear_out", M, D, false);
    ffc_in = &add<nn::Linear>("ff_context.linear_in", D, 2 * M, false);
    ffc_out = &add<nn::Linear>("ff_context.linear_out", M, D, false);
}

void Flux2DoubleBlock::forward(nn::Ctx& c, ggml_tensor*& img, ggml_tensor*& txt, ggml_tensor* m, ggml_tensor* mc, ggml_tensor* cos,
                               ggml_tensor* sin) const {
    ggml_context* ctx = c.ctx;
    const int64_t D = hidden, Lt = txt->ne[1], Li = img->ne[1];
    ggml_tensor* ni = modulate(c, layer_norm(c, img), mod_chunk(c, m, 0, D), mod_chunk(c, m, 1, D));
    ggml_tensor* nt = modulate(c, layer_norm(c, txt), mod_chunk(c, mc, 0, D), mod_chunk(c, mc, 1, D));
    ggml_tensor* q = norm_q->forward(c, split_heads(c, to_q->forward(c, ni), head_dim, heads));
    ggml_tensor* k = norm_k->forward(c, split_heads(c, to_k->forward(c, ni), head_dim, heads));
    ggml_tensor* v = to_v->forward(c, ni);
    ggml_tensor* qt = norm_added_q->forward(c, split_heads(c, add_q->forward(c, nt), head_dim, heads));
    ggml_tensor* kt = norm_added_k->forward(c, split_heads(c, add_k->forward(c, nt), head_dim, heads));
    ggml_tensor* vt = add_v->forward(c, nt);
    q = apply_rope(c, ggml_concat(ctx, qt, q, 2), cos, sin);
    k = apply_rope(c, ggml_concat(ctx, kt, k, 2), cos, sin);
    v = ggml_concat(ctx, vt, v, 1);
    ggml_tensor* o = nn::attention(c, merge_heads(c, q), merge_heads(c, k), v, heads, heads);
    ggml_tensor* ot = to_add_out->forward(c, seq_slice(c, o, 0, Lt));
    ggml_tensor* oi = to_out->forward(c, seq_slice(c, o, Lt, Li));

    img = ggml_add(ctx, img, ggml_mul(ctx, oi, mod_chunk(c, m, 2, D)));
    ggml_tensor* hi = modulate(c, layer_norm(c, img), mod_chunk(c, m, 3, D), mod_chunk(c, m, 4, D));
    hi = ff_out->forward(c, ggml_swiglu(ctx, ff_in->forward(c, hi)));  // silu(first half) * second half
    img = ggml_add(ctx, img, ggml_mul(ctx, hi, mod_chunk(c, m, 5, D)));

    txt = ggml_add(ctx, txt, ggml_mul(ctx, ot, mod_chunk(c, mc, 2, D)));
    ggml_tensor* ht = modulate(c, layer_norm(c, txt), mod_chunk(c, mc, 3, D), mod_chunk(c, mc, 4, D));
    ht = ffc_out->forward(c, ggml_swiglu(ctx, ffc_in->forward(c, ht)));
    txt = ggml_add(ctx, txt, ggml_mul(ctx, ht, mod_chunk(c, mc, 5, D)));
}

Flux2SingleBlock::Flux2SingleBlock(const Flux2DiTConfig& cfg)
    : hidden(cfg.hidden), heads(cfg.heads), head_dim(cfg.head_dim), mlp_hidden(cfg.mlp_hidden) {
    const int64_t D = cfg.hidden, M = cfg.mlp_hidden;
    qkv_mlp = &add<nn::Linear>("attn.to_qkv_mlp_proj", D, 3 * D + 2 * M, false);
    norm_q = &add<nn::RMSNorm>("attn.norm_q", head_dim, 1e-6f);
    norm_k = &add<nn::RMSNorm>("attn.norm_k", head_dim, 1e-6f);
    to_out = &add<nn::Linear>("attn.to_out", D + M, D, false);
}

ggml_tensor* Flux2SingleBlock::forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* m, ggml_tensor* cos, ggml_tensor* sin) const {
    ggml_context* ctx = c.ctx;
    const int64_t D = hidden, M = mlp_hidden;
    ggml_tensor* nx = modulate(c, layer_norm(c, x), mod_chunk(c, m, 0, D), mod_chunk(c, m, 1, D));
    if (M % D == 0) {
        // to_qkv_mlp_proj's rows [q | k | v | gate | value] read as D-wide parts (linear_rows:
        // the same values as the fused matmul), the SwiGLU per D-wide chunk, and to_out's input
        // [o | mlp chunks] joined by join_rows: a form ggml's meta device splits along the heads
        // (--split-mode row, flux_row_split.h)
        ggml_tensor* q = apply_rope(c, norm_q->forward(c, split_heads(c, linear_rows(c, *qkv_mlp, nx, 0, D), head_dim, heads)), cos, sin);
        ggml_tensor* k = apply_rope(c, norm_k->forward(c, split_heads(c, linear_rows(c, *qkv_mlp, nx, D, D), head_dim, heads)), cos, sin);
        ggml_tensor* v = linear_rows(c, *qkv_mlp, nx, 2 * D, D);
        ggml_tensor* o = nn::attention(c, merge_heads(c, q), merge_heads(c, k), v, heads, heads);
        std::vector<ggml_tensor*> parts{o};
        for (int64_t j = 0; j < M / D; ++j)
            parts.push_back(ggml_swiglu_split(ctx, linear_rows(c, *qkv_mlp, nx, 3 * D + j * D, D), linear_rows(c, *qkv_mlp, nx, 3 * D + M + j * D, D)));
        ggml_tensor* y = to_out->forward(c, join_rows(c, parts));
        return ggml_add(ctx, x, ggml_mul(ctx, y, mod_chunk(c, m, 2, D)));
    }
    ggml_tensor* h = qkv_mlp->forward(c, nx);  // {3D + 2M, L, N}: q | k | v | mlp (gate half, value half)
    ggml_tensor* q = apply_rope(c, norm_q->forward(c, split_heads(c, feat_slice(c, h, 0, D), head_dim, heads)), cos, sin);
    ggml_tensor* k = apply_rope(c, norm_k->forward(c, split_heads(c, feat_slice(c, h, D, D), head_dim, heads)), cos, sin);
    ggml_tensor* v = feat_slice(c, h, 2 * D, D);
    ggml_tensor* mlp = ggml_swiglu(ctx, feat_slice(c, h, 3 * D, 2 * M));
    ggml_tensor* o = nn::attention(c, merge_heads(c, q), merge_heads(c, k), v, heads, heads);
    ggml_tensor* y = to_out->forward(c, ggml_concat(ctx, o, mlp, 0));
    return ggml_add(ctx, x, ggml_mul(ctx, y, mod_chunk(c, m, 2, D)));
}

// ------------------------------------------------------------------------------------ model

Flux2DiT::Flux2DiT(const Flux2DiTConfig& cfg, bool final_shift_first) : cfg_(cfg), final_shift_first_(final_shift_first) {
    const int64_t D = cfg.hidden;
    int64_t axes_sum = 0;
    for (int a : cfg.axes_dims) axes_sum += a;
    if (axes_sum != cfg.head_dim)
        fail(ErrorKind::InvalidInput, "FLUX.2 DiT: rotary axes sum to {}, the head size is {}", axes_sum, cfg.head_dim);
    x_embedder_ = &add<nn::Linear>("x_embedder", cfg.in_channels, D, false);
    context_embedder_ = &add<nn::Linear>("context_embedder", cfg.joint_dim, D, false);
    t1_ = &add<nn::Linear>("time_guidance_embed.timestep_embedder.linear_1", cfg.time_channels, D, false);
    t2_ = &add<nn::Linear>("time_guidance_embed.timestep_embedder.linear_2", D, D, false);
    if (cfg.guidance_embeds) {
        g1_ = &add<nn::Linear>("time_guidance_embed.guidance_embedder.linear_1", cfg.time_channels, D, false);
        g2_ = &add<nn::Linear>("time_guidance_embed.guidance_embedder.linear_2", D, D, false);
    }
    mod_img_ = &add<nn::Linear>("double_stream_modulation_img.linear", D, 6 * D, false);
    mod_txt_ = &add<nn::Linear>("double_stream_modulation_txt.linear", D, 6 * D, false);
    mod_single_ = &add<nn::Linear>("single_stream_modulation.linear", D, 3 * D, false);
    for (int i = 0; i < cfg.n_double; ++i) double_.push_back(&add<Flux2DoubleBlock>("transformer_blocks." + std::to_string(i), cfg));
    for (int i = 0; i < cfg.n_single; ++i)
        single_.push_back(&add<Flux2SingleBlock>("single_transformer_blocks." + std::to_string(i), cfg));
    norm_out_ = &add<nn::Linear>("norm_out.linear", D, 2 * D, false);
    proj_out_ = &add<nn::Linear>("proj_out", D, cfg.out_channels, false);
}

Flux2State Flux2DiT::prologue(nn::Ctx& c, const Flux2Inputs& in) const {
    ggml_context* ctx = c.ctx;
    if (!in.img || !in.txt || !in.timestep || !in.rope_cos || !in.rope_sin)
        fail(ErrorKind::InvalidInput, "FLUX.2 DiT: img, txt, timestep and rotary tables are all required");
    const int64_t N = in.img->ne[2], Li = in.img->ne[1], Lt = in.txt->ne[1];
    if (in.img->ne[0] != cfg_.in_channels || in.img->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "FLUX.2 DiT: image tokens must be {{{}, L, N}}, got {}", cfg_.in_channels, ne_str(in.img));
    if (in.txt->ne[0] != cfg_.joint_dim || in.txt->ne[2] != N || in.txt->ne[3] != 1)
        fail(ErrorKind::InvalidInput,
             "FLUX.2 DiT: context must be {{{}, L, {}}} (3 stacked Qwen3 layers of the matching text encoder), got {}",
             cfg_.joint_dim, N, ne_str(in.txt));
    if (in.timestep->ne[0] != N || ggml_n_dims(in.timestep) != 1)
        fail(ErrorKind::InvalidInput, "FLUX.2 DiT: timestep must be {{{}}}, got {}", N, ne_str(in.timestep));
    if (cfg_.guidance_embeds && (!in.guidance || in.guidance->ne[0] != N || ggml_n_dims(in.guidance) != 1))
        fail(ErrorKind::InvalidInput, "FLUX.2 DiT: this model embeds guidance: a guidance vector {{{}}} is required", N);
    if (in.rope_cos->ne[0] != cfg_.head_dim / 2 || in.rope_cos->ne[1] != Lt + Li || !ggml_are_same_shape(in.rope_cos, in.rope_sin))
        fail(ErrorKind::InvalidInput, "FLUX.2 DiT: rotary tables must be {{{}, {}}} (head_dim/2, text + image tokens), got {}",
             cfg_.head_dim / 2, Lt + Li, ne_str(in.rope_cos));
    auto embed = [&](nn::Linear* l1, nn::Linear* l2, ggml_tensor* t) {
        ggml_tensor* e = nn::timestep_embedding(c, ggml_scale(ctx, t, 1000.0f), int(cfg_.time_channels), true, 0.0f);
        return l2->forward(c, ggml_silu(ctx, l1->forward(c, e)));
    };
    ggml_tensor* temb = embed(t1_, t2_, in.timestep);
    if (cfg_.guidance_embeds) temb = ggml_add(ctx, temb, embed(g1_, g2_, in.guidance));
    ggml_tensor* st = ggml_silu(ctx, temb);
    Flux2State s;
    s.temb = temb;
    s.mod_img = mod_img_->forward(c, st);
    s.mod_txt = mod_txt_->forward(c, st);
    s.mod_single = mod_single_->forward(c, st);
    s.img = x_embedder_->forward(c, in.img);
    s.txt = context_embedder_->forward(c, in.txt);
    s.rope_cos = in.rope_cos;
    s.rope_sin = in.rope_sin;
    s.n_txt = Lt;
    return s;
}

Flux2State Flux2DiT::block(nn::Ctx& c, int i, Flux2State s) const {
    if (i < 0 || i >= n_blocks()) fail(ErrorKind::InvalidInput, "FLUX.2 DiT: block {} outside the {} blocks", i, n_blocks());
    if (i < cfg_.n_double) {
        if (!s.img || !s.txt) fail(ErrorKind::InvalidInput, "FLUX.2 DiT: double block {} needs the separate img and txt streams", i);
        double_[size_t(i)]->forward(c, s.img, s.txt, s.mod_img, s.mod_txt, s.rope_cos, s.rope_sin);
        return s;
    }
    if (!s.joint) {
        if (!s.img || !s.txt) fail(ErrorKind::InvalidInput, "FLUX.2 DiT: single block {} needs img and txt or the joint stream", i);
        s.n_txt = s.txt->ne[1];
        s.joint = ggml_concat(c.ctx, s.txt, s.img, 1);
        s.img = s.txt = nullptr;
    }
    s.joint = single_[size_t(i - cfg_.n_double)]->forward(c, s.joint, s.mod_single, s.rope_cos, s.rope_sin);
    return s;
}

FluxOutputs Flux2DiT::epilogue(nn::Ctx& c, Flux2State s) const {
    ggml_tensor* x = s.joint ? seq_slice(c, s.joint, s.n_txt, s.joint->ne[1] - s.n_txt) : s.img;
    if (!x) fail(ErrorKind::InvalidInput, "FLUX.2 DiT epilogue: the state holds no image tokens");
    const int64_t D = cfg_.hidden;
    ggml_tensor* m = norm_out_->forward(c, ggml_silu(c.ctx, s.temb));
    ggml_tensor* scale = mod_chunk(c, m, final_shift_first_ ? 1 : 0, D);
    ggml_tensor* shift = mod_chunk(c, m, final_shift_first_ ? 0 : 1, D);
    return {proj_out_->forward(c, modulate(c, layer_norm(c, x), shift, scale))};
}

const nn::Block& Flux2DiT::block_params(int i) const {
    if (i < 0 || i >= n_blocks()) fail(ErrorKind::InvalidInput, "FLUX.2 DiT: block {} outside the {} blocks", i, n_blocks());
    if (i < cfg_.n_double) return *double_[size_t(i)];
    return *single_[size_t(i - cfg_.n_double)];
}

Flux2DiTModel Flux2DiTModel::load(const io::WeightIndex& index, ggml_backend_buffer_type_t buft, const nn::LoadOptions& opt,
                                  const std::vector<int>& axes_dims) {
    auto src = find_flux2_dit(index);
    if (!src)
        fail(ErrorKind::ModelMismatch,
             "no FLUX.2 DiT found: expected keys like 'double_stream_modulation_img.linear.weight' (diffusers) or "
             "'double_stream_modulation_img.lin.weight' + 'double_blocks.0.img_attn.qkv.weight' (BFL/ComfyUI)");
    Flux2DiTConfig cfg = infer_flux2_dit_config(index, *src);
    if (!axes_dims.empty()) cfg.axes_dims = axes_dims;
    Flux2DiTModel m;
    m.source = *src;
    m.module = std::make_unique<Flux2DiT>(cfg, src->layout == FluxLayout::Bfl);
    nn::TensorSource ts(index, src->prefix);
    configure_flux2_source(ts, cfg, *src);
    m.params = nn::ParamBuffer::load(*m.module, ts, buft, opt);
    return m;
}

}  // namespace easel::models::flux
