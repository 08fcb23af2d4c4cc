// SD UNet building blocks; see unet_blocks.h for the diffusers module each one mirrors.
#include "models/sd/unet_blocks.h"

#include "core/error.h"

#include <fmt/format.h>

namespace easel::models::sd {

// ---------------------------------------------------------------- ResnetBlock2D

ResnetBlock2D::ResnetBlock2D(const ResnetSpec& s, int groups, float eps) : spec(s) {
    norm1 = &add<nn::GroupNorm>("norm1", groups, s.in, eps);
    conv1 = &add<nn::Conv2d>("conv1", s.in, s.out, 3, 1, 1);
    time_emb_proj = &add<nn::Linear>("time_emb_proj", s.temb, s.out);
    norm2 = &add<nn::GroupNorm>("norm2", groups, s.out, eps);
    conv2 = &add<nn::Conv2d>("conv2", s.out, s.out, 3, 1, 1);
    if (s.shortcut) conv_shortcut = &add<nn::Conv2d>("conv_shortcut", s.in, s.out, 1, 1, 0);
}

ggml_tensor* ResnetBlock2D::forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* temb_act) const {
    ggml_context* g = c.ctx;
    ggml_tensor* h = ggml_silu(g, norm1->forward(c, x));
    h = conv1->forward(c, h);
    ggml_tensor* t = time_emb_proj->forward(c, temb_act);  // {out, N}
    t = ggml_reshape_4d(g, t, 1, 1, t->ne[0], t->ne[1]);
    h = ggml_add(g, h, t);
    h = ggml_silu(g, norm2->forward(c, h));
    h = conv2->forward(c, h);
    ggml_tensor* sc = conv_shortcut ? conv_shortcut->forward(c, x) : x;
    return ggml_add(g, sc, h);
}

// ---------------------------------------------------------------- Down/Upsample2D

Downsample2D::Downsample2D(int64_t channels) { conv = &add<nn::Conv2d>("conv", channels, channels, 3, 2, 1); }

ggml_tensor* Downsample2D::forward(nn::Ctx& c, ggml_tensor* x) const { return conv->forward(c, x); }

Upsample2D::Upsample2D(int64_t channels) { conv = &add<nn::Conv2d>("conv", channels, channels, 3, 1, 1); }

ggml_tensor* Upsample2D::forward(nn::Ctx& c, ggml_tensor* x, int64_t out_w, int64_t out_h) const {
    ggml_tensor* h = ggml_interpolate(c.ctx, x, out_w, out_h, x->ne[2], x->ne[3], GGML_SCALE_MODE_NEAREST);
    return conv->forward(c, h);
}

// ---------------------------------------------------------------- attention

CrossAttention::CrossAttention(int64_t query_dim, int64_t kv_dim, int heads_, int64_t head_dim_)
    : heads(heads_), head_dim(head_dim_) {
    const int64_t inner = heads_ * head_dim_;
    to_q = &add<nn::Linear>("to_q", query_dim, inner, false);
    to_k = &add<nn::Linear>("to_k", kv_dim, inner, false);
    to_v = &add<nn::Linear>("to_v", kv_dim, inner, false);
    to_out = &add<nn::Linear>("to_out.0", inner, query_dim, true);
}

ggml_tensor* CrossAttention::forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* kv) const {
    ggml_tensor* q = to_q->forward(c, x);
    ggml_tensor* k = to_k->forward(c, kv);
    ggml_tensor* v = to_v->forward(c, kv);
    ggml_tensor* o = nn::attention(c, q, k, v, heads, heads);
    return to_out->forward(c, o);
}

GegluFeedForward::GegluFeedForward(int64_t dim, int64_t inner) {
    proj = &add<nn::Linear>("net.0.proj", dim, 2 * inner);
    out = &add<nn::Linear>("net.2", inner, dim);
}

ggml_tensor* GegluFeedForward::forward(nn::Ctx& c, ggml_tensor* x) const {
    ggml_tensor* h = proj->forward(c, x);  // {2*inner, L, N}: [hidden | gate]
    // swapped: the activation goes to the second half (gate), as GEGLU's hidden * gelu(gate)
    h = ggml_geglu_erf_swapped(c.ctx, h);
    return out->forward(c, h);
}

BasicTransformerBlock::BasicTransformerBlock(const TransformerSpec& s) {
    norm1 = &add<nn::LayerNorm>("norm1", s.inner, 1e-5f);
    attn1 = &add<CrossAttention>("attn1", s.inner, s.inner, s.heads, s.head_dim);
    norm2 = &add<nn::LayerNorm>("norm2", s.inner, 1e-5f);
    attn2 = &add<CrossAttention>("attn2", s.inner, s.context_dim, s.heads, s.head_dim);
    norm3 = &add<nn::LayerNorm>("norm3", s.inner, 1e-5f);
    ff = &add<GegluFeedForward>("ff", s.inner, s.ff_inner);
}

ggml_tensor* BasicTransformerBlock::forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* context) const {
    ggml_context* g = c.ctx;
    ggml_tensor* n = norm1->forward(c, x);
    x = ggml_add(g, attn1->forward(c, n, n), x);
    x = ggml_add(g, attn2->forward(c, norm2->forward(c, x), context), x);
    x = ggml_add(g, ff->forward(c, norm3->forward(c, x)), x);
    return x;
}

// ---------------------------------------------------------------- Transformer2D

TokenProjection::TokenProjection(int64_t in_, int64_t out_, bool linear) : in(in_), out(out_) {
    std::vector<int64_t> shape = linear ? std::vector<int64_t>{out_, in_} : std::vector<int64_t>{out_, in_, 1, 1};
    w = &param("weight", shape, nn::ParamRole::Weight);
    b = &param("bias", {out_}, nn::ParamRole::Bias);
}

ggml_tensor* TokenProjection::forward(nn::Ctx& c, ggml_tensor* x) const {
    ggml_tensor* wt = w->tensor;
    if (ggml_n_dims(wt) > 2) wt = ggml_reshape_2d(c.ctx, wt, in, out);  // [out, in, 1, 1] -> {in, out}
    ggml_tensor* y = nn::weight_matmul(c, *w, wt, x);
    return ggml_add(c.ctx, y, b->tensor);
}

Transformer2D::Transformer2D(const TransformerSpec& s, int groups) : spec(s) {
    norm = &add<nn::GroupNorm>("norm", groups, s.channels, 1e-6f);
    proj_in = &add<TokenProjection>("proj_in", s.channels, s.inner, s.linear_proj);
    for (int k = 0; k < s.depth; ++k)
        blocks.push_back(&add<BasicTransformerBlock>(fmt::format("transformer_blocks.{}", k), s));
    proj_out = &add<TokenProjection>("proj_out", s.inner, s.channels, s.linear_proj);
}

ggml_tensor* Transformer2D::forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* context) const {
    ggml_context* g = c.ctx;
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2], N = x->ne[3];
    ggml_tensor* h = norm->forward(c, x);
    // {W, H, C, N} -> tokens {C, W*H, N}; token index w + W*h as PyTorch's permute(0,2,3,1).reshape
    h = ggml_cont(g, ggml_permute(g, h, 1, 2, 0, 3));
    h = ggml_reshape_3d(g, h, C, W * H, N);
    h = proj_in->forward(c, h);
    for (auto* blk : blocks) h = blk->forward(c, h, context);
    h = proj_out->forward(c, h);
    h = ggml_reshape_4d(g, h, C, W, H, N);
    h = ggml_cont(g, ggml_permute(g, h, 2, 0, 1, 3));  // back to {W, H, C, N}
    return ggml_add(g, h, x);
}

}  // namespace easel::models::sd
