// Building blocks of the SD UNet, each mirroring a diffusers module so that parameter names
// bind to diffusers keys directly:
//   ResnetBlock2D        diffusers/models/resnet.py
//   Downsample2D         diffusers/models/downsampling.py   (conv 3x3, stride 2, padding 1)
//   Upsample2D           diffusers/models/upsampling.py     (nearest interpolation, conv 3x3)
//   CrossAttention       diffusers/models/attention_processor.py Attention (to_q/to_k/to_v/to_out.0)
//   GegluFeedForward     diffusers/models/attention.py FeedForward with activations.py GEGLU
//   BasicTransformerBlock diffusers/models/attention.py (norm_type "layer_norm")
//   Transformer2D        diffusers/models/transformers/transformer_2d.py (continuous input)
//
// Layout (ggml order, innermost first): images are ne = {W, H, C, N} ([N, C, H, W] in PyTorch),
// token sequences ne = {D, L, N} ([N, L, D]), the time embedding ne = {Temb, N}.
#pragma once

#include "models/sd/unet_config.h"
#include "nn/layers.h"

namespace easel::models::sd {

/// diffusers ResnetBlock2D (time_embedding_norm "default", output_scale_factor 1):
/// h = conv1(silu(norm1(x))) + time_emb_proj(silu(temb)); h = conv2(silu(norm2(h)));
/// out = (conv_shortcut(x) or x) + h.
class ResnetBlock2D : public nn::Block {
public:
    /// groups/eps: the UNet's norm_num_groups / norm_eps. Channels from `spec` (weights).
    ResnetBlock2D(const ResnetSpec& spec, int groups, float eps);
    /// x: {W, H, in, N}; temb_act: silu(time embedding) {temb, N}. Returns {W, H, out, N}.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* temb_act) const;

    ResnetSpec spec;
    nn::GroupNorm* norm1;
    nn::Conv2d* conv1;
    nn::Linear* time_emb_proj;
    nn::GroupNorm* norm2;
    nn::Conv2d* conv2;
    nn::Conv2d* conv_shortcut = nullptr;
};

/// diffusers Downsample2D with use_conv, padding 1: child "conv" (3x3, stride 2, padding 1).
/// An input of H rows gives ceil(H/2) rows (torch Conv2d arithmetic).
class Downsample2D : public nn::Block {
public:
    explicit Downsample2D(int64_t channels);
    /// x: {W, H, C, N} -> {ceil(W/2), ceil(H/2), C, N}.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    nn::Conv2d* conv;
};

/// diffusers Upsample2D with use_conv: nearest-neighbour resize (F.interpolate mode "nearest":
/// source index floor(dst * in / out)) to (out_w, out_h), then child "conv" (3x3, padding 1).
class Upsample2D : public nn::Block {
public:
    explicit Upsample2D(int64_t channels);
    /// x: {W, H, C, N} -> {out_w, out_h, C, N}. diffusers uses 2W x 2H unless the forward
    /// passes upsample_size (the size of the skip connection it must match).
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x, int64_t out_w, int64_t out_h) const;
    nn::Conv2d* conv;
};

/// Multi-head attention with diffusers Attention names: to_q [inner, query_dim], to_k/to_v
/// [inner, kv_dim] (no biases), to_out.0 [query_dim, inner] with bias. Scale 1/sqrt(head_dim).
class CrossAttention : public nn::Block {
public:
    CrossAttention(int64_t query_dim, int64_t kv_dim, int heads, int64_t head_dim);
    /// x: {query_dim, Lq, N}; kv: {kv_dim, Lk, N} (x itself for self-attention). Returns {query_dim, Lq, N}.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* kv) const;
    int heads;
    int64_t head_dim;
    nn::Linear *to_q, *to_k, *to_v, *to_out;
};

/// diffusers FeedForward(activation_fn="geglu"): net.0.proj Linear(dim, 2*inner), GEGLU
/// (first half * gelu_erf(second half)), net.2 Linear(inner, dim). GELU is the exact erf form.
class GegluFeedForward : public nn::Block {
public:
    GegluFeedForward(int64_t dim, int64_t inner);
    /// x: {dim, L, N} -> {dim, L, N}.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    nn::Linear *proj, *out;
};

/// diffusers BasicTransformerBlock as SD uses it: x += attn1(norm1(x)); x += attn2(norm2(x), context);
/// x += ff(norm3(x)). LayerNorms have eps 1e-5 (diffusers' default; the UNet does not pass norm_eps).
class BasicTransformerBlock : public nn::Block {
public:
    explicit BasicTransformerBlock(const TransformerSpec& spec);
    /// x: {inner, L, N}; context: {context_dim, Lc, N}. Returns {inner, L, N}.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* context) const;
    nn::LayerNorm *norm1, *norm2, *norm3;
    CrossAttention *attn1, *attn2;
    GegluFeedForward* ff;
};

/// proj_in / proj_out of Transformer2D: a Linear [out, in] (SD2, use_linear_projection) or a
/// 1x1 Conv2d [out, in, 1, 1] (SD1). Both are applied to tokens as a matrix product (a 1x1
/// convolution is a per-pixel Linear), so one code path serves both layouts.
class TokenProjection : public nn::Block {
public:
    TokenProjection(int64_t in, int64_t out, bool linear);
    /// x: {in, L, N} -> {out, L, N}.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    int64_t in, out;
    nn::Param* w;
    nn::Param* b;
};

/// diffusers Transformer2DModel for continuous inputs: GroupNorm(groups, C, eps 1e-6) ->
/// proj_in -> transformer_blocks -> proj_out -> + input.
class Transformer2D : public nn::Block {
public:
    Transformer2D(const TransformerSpec& spec, int groups);
    /// x: {W, H, C, N}; context: {context_dim, Lc, N}. Returns {W, H, C, N}.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* context) const;
    TransformerSpec spec;
    nn::GroupNorm* norm;
    TokenProjection* proj_in;
    std::vector<BasicTransformerBlock*> blocks;
    TokenProjection* proj_out;
};

}  // namespace easel::models::sd
