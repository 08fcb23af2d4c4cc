// Common layers. Each mirrors the PyTorch module of the same name: parameter names
// ("weight", "bias") and shapes as torch.nn declares them, so checkpoint keys bind directly.
//
// Layout (ggml order, innermost first): Linear acts on ne[0] (features); Conv2d/GroupNorm take
// images ne = {W, H, C, N}; LayerNorm/RMSNorm normalise ne[0].
#pragma once

#include "nn/block.h"

namespace easel::nn {

/// Graph-building context passed to every forward().
struct Ctx {
    ggml_context* ctx = nullptr;
    bool flash_attn = false;  ///< use ggml_flash_attn_ext where the shapes allow it
    /// The backend the graph will run on, when known: attention() then falls back to the plain
    /// path where the backend cannot run flash attention for the shapes (e.g. CUDA head sizes).
    ggml_backend_t backend = nullptr;
};

/// Which operand of ggml_mul_mat the weight is in weight_matmul (the result's layout follows).
enum class WeightSide {
    First,   ///< ggml_mul_mat(w, x): w {K, N}, x {K, M...} -> {N, M...} (Linear, 1x1 conv, projections)
    Second,  ///< ggml_mul_mat(x, w): x {K, M}, w {K, N} -> {M, N} (Conv2d's im2col columns)
};

/// The one place where a layer's weight parameter meets its input in a graph: today exactly
/// ggml_mul_mat of `w` and `x` in the order `side` says. `w` is `p`'s tensor or a 2-D view /
/// reshape of it ({K, N}: K input features, N outputs), holding p's output rows
/// [row_begin, row_begin + N) (FLUX's fused projections are read as row views). Every Linear,
/// Conv2d (1x1 and im2col), the UNet's and the VAE's attention projections and the FLUX row
/// views go through it, for every module and placement (whole, layer split, row split on the
/// meta device, streamed, from disk): a runtime low-rank term keyed by `p` (LoRA's B (A x)) is
/// added here. Throws nothing itself (ggml validates the shapes its callers checked).
ggml_tensor* weight_matmul(Ctx& c, const Param& p, ggml_tensor* w, ggml_tensor* x, int64_t row_begin = 0, WeightSide side = WeightSide::First);

/// torch.nn.Linear: y = x W^T + b. weight [out, in], bias [out]. x: ne = {in, ...}.
class Linear : public Block {
public:
    Linear(int64_t in, int64_t out, bool bias = true);
    ggml_tensor* forward(Ctx& c, ggml_tensor* x) const;
    int64_t in, out;
    Param* w;
    Param* b = nullptr;
};

/// torch.nn.Conv2d (dilation 1, groups 1). weight [out, in, k, k], bias [out]. x: {W, H, in, N};
/// returns {OW, OH, out, N}. im2col in the kernel's type (F32 kernel: exact F32; F16 kernel:
/// data rounded to F16 as ggml_conv_2d does) + one matmul; 1x1 stride-1 kernels are a plain
/// matmul over channels. With `direct` set (sd-cli's --vae-conv-direct / --diffusion-conv-direct,
/// set_conv_direct) a k > 1 kernel runs as ggml_conv_2d_direct instead: no im2col buffer (K*K*C
/// x OW*OH floats), the same sums in another order; it falls back to im2col where c.backend cannot
/// run it or a run-time LoRA term is bound to the weight (weight_matmul). Throws
/// Error(InvalidInput) on a channel mismatch or a too-small image.
class Conv2d : public Block {
public:
    Conv2d(int64_t in, int64_t out, int kernel, int stride = 1, int padding = 0, bool bias = true);
    ggml_tensor* forward(Ctx& c, ggml_tensor* x) const;
    int64_t in, out;
    int kernel, stride, padding;
    bool direct = false;  ///< ggml_conv_2d_direct for k > 1 (see above)
    Param* w;
    Param* b = nullptr;

private:
    /// The direct convolution {OW, OH, out, N} of x, or nullptr where im2col must run instead.
    ggml_tensor* direct_conv(Ctx& c, ggml_tensor* x) const;
};

/// Sets Conv2d::direct on every convolution under `root` (a module's network: the VAE's, the
/// UNet's, TAESD's). Returns how many convolutions it set.
int set_conv_direct(Block& root, bool direct);

/// torch.nn.GroupNorm(groups, channels, eps, affine). x: {W, H, C, N} or {L, C, N} (channels at ne[2] or ne[1]).
class GroupNorm : public Block {
public:
    GroupNorm(int groups, int64_t channels, float eps = 1e-5f, bool affine = true);
    /// x: {W, H, C, N}; returns the same shape.
    ggml_tensor* forward(Ctx& c, ggml_tensor* x) const;
    int groups;
    int64_t channels;
    float eps;
    Param* w = nullptr;
    Param* b = nullptr;
};

/// torch.nn.LayerNorm over ne[0]. weight/bias [dim] (optional: affine=false, or bias=false).
class LayerNorm : public Block {
public:
    LayerNorm(int64_t dim, float eps = 1e-5f, bool affine = true, bool bias = true);
    ggml_tensor* forward(Ctx& c, ggml_tensor* x) const;
    int64_t dim;
    float eps;
    Param* w = nullptr;
    Param* b = nullptr;
};

/// RMSNorm over ne[0] (T5/Qwen/FLUX style): x / sqrt(mean(x^2) + eps) * weight. weight [dim].
class RMSNorm : public Block {
public:
    RMSNorm(int64_t dim, float eps = 1e-6f, bool affine = true);
    ggml_tensor* forward(Ctx& c, ggml_tensor* x) const;
    int64_t dim;
    float eps;
    Param* w = nullptr;
};

/// torch.nn.Embedding: weight [num, dim]; ids: I32 tensor {L, N}; returns {dim, L, N}.
class Embedding : public Block {
public:
    Embedding(int64_t num, int64_t dim);
    ggml_tensor* forward(Ctx& c, ggml_tensor* ids) const;
    int64_t num, dim;
    Param* w;
};

/// Scaled dot-product attention, multi-head.
/// q: {D*Hq, Lq, N}, k/v: {D*Hkv, Lk, N} (Hq a multiple of Hkv: grouped-query attention).
/// mask: optional additive F32 {Lk, Lq} (broadcast over heads and batch) or {Lk, Lq, 1, N}; -INF masks.
/// Returns {D*Hq, Lq, N}. Scale 1/sqrt(D). Uses ggml_flash_attn_ext when c.flash_attn is set
/// (and c.backend, if given, supports it for these shapes/types; F32 K/V that the backend's kernel
/// does not take, as CUDA's, are cast to F16 around the op), else soft_max(k^T q * scale + mask) v;
/// both give the same result within float tolerance (on the CPU with F32 K/V both are F32; CUDA's
/// flash kernel rounds K/V to F16). Query head h uses key/value head h / (Hq / Hkv)
/// (transformers' repeat_kv). Throws Error(InvalidInput) on inconsistent shapes.
ggml_tensor* attention(Ctx& c, ggml_tensor* q, ggml_tensor* k, ggml_tensor* v, int64_t n_heads_q,
                       int64_t n_heads_kv, ggml_tensor* mask = nullptr);

/// Sinusoidal timestep embedding as diffusers' get_timestep_embedding
/// (diffusers/models/embeddings.py): exponent = -ln(max_period) * i / (half - shift),
/// emb = t * scale * exp(exponent), [sin, cos] (or [cos, sin] when flip_sin_to_cos).
/// t: F32 {N}; returns F32 {dim, N}.
ggml_tensor* timestep_embedding(Ctx& c, ggml_tensor* t, int dim, bool flip_sin_to_cos = true,
                                float downscale_freq_shift = 1.0f, float scale = 1.0f,
                                float max_period = 10000.0f);

}  // namespace easel::nn
