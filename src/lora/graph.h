// LoRA at run time: the patched linear / convolution as ggml graph code, so that quantised or
// row-split weights stay as they are and the update is added inside each patched matmul:
//
//   y = x W^T + b + sum_k s_k * (x A_k^T) B_k^T        (LoRA: A = down [r, in], B = up [out, r])
//
// The families call patched_linear / patched_conv2d from their one linear / conv place with the
// LoRA tensors of that weight (uploaded beside it, see prepare_terms); without terms both are the
// plain layer. Other update kinds run as a dense update (LoHa, full diff: the target's delta
// rows computed once on the host, delta @ x) or, for a LoKr patch that covers its weight
// exactly, as the Kronecker product applied without forming it:
//   kron(W1, W2) x = vec(W1 X W2^T) with X the input reshaped to [b, d]  (W1 [a, b], W2 [c, d]).
// DoRA runs as per-channel scales (dora_runtime_scales): for merged weights W_k = diag(o) W_{k-1}
// diag(i) + ..., each term and the base matmul get the product of the later DoRA patches'
// output scales (on y's features) and input scales (on x's features), which gives the merged
// layer's output (tests/unit/lora_graph_test.cpp checks both against lora/math.h merges).
//
// Tensor layout (ggml order): x {in, L, N...}; A {in, r} (PyTorch down [r, in]); B {r, out}
// (up [out, r]); a dense delta {in, out}; W1 {b, a}; W2 {d, c}; scales F32 {in} / {out}.
// Convolutions: x {W, H, C, N}; A a kernel {kw, kh, in, r} (PyTorch down [r, in, kh, kw]),
// B {1, 1, r, out} or {r, out}; mid {kw, kh, r_dn, r_up}.
#pragma once

#include "lora/key_map.h"
#include "lora/math.h"

#include <ggml.h>

#include <vector>

namespace easel::lora {

/// One update of a patched linear / conv weight, as graph tensors (F32 or F16; in a buffer the
/// backend running the graph can read).
struct Term {
    enum class Kind { LowRank, Dense, Kron } kind = Kind::LowRank;
    ggml_tensor* down = nullptr;  ///< LowRank A: {in, r} (linear) / {kw, kh, in, r} (conv)
    ggml_tensor* up = nullptr;    ///< LowRank B: {r, out} (or {1, 1, r, out})
    ggml_tensor* mid = nullptr;   ///< conv Tucker core {kw, kh, r_dn, r_up}: down is then a 1x1 kernel
    ggml_tensor* delta = nullptr; ///< Dense: {in, out} (linear) / {kw, kh, in, out} (conv)
    ggml_tensor* w1 = nullptr;    ///< Kron: W1 {b, a}
    ggml_tensor* w2 = nullptr;    ///< Kron: W2 {d, c} (linear only)
    float scale = 1.0f;           ///< alpha / rank x the user's weight
    ggml_tensor* in_scale = nullptr;   ///< DoRA: F32 {in}, multiplies x's features first (null = 1)
    ggml_tensor* out_scale = nullptr;  ///< DoRA: F32 {out}, multiplies the term's features (null = 1)
};

/// All updates of one weight plus the DoRA scales of its base matmul.
struct Terms {
    std::vector<Term> terms;
    ggml_tensor* base_in_scale = nullptr;   ///< F32 {in} or null
    ggml_tensor* base_out_scale = nullptr;  ///< F32 {out} or null
    bool empty() const { return terms.empty() && !base_in_scale && !base_out_scale; }
};

/// The linear layer with its updates: x {in, ...} -> {out, ...}; w ggml {in, out} (any type the
/// backend multiplies), b {out} or null. Throws Error(InvalidInput) on shapes that disagree.
ggml_tensor* patched_linear(ggml_context* ctx, ggml_tensor* x, ggml_tensor* w, ggml_tensor* b, const Terms& t);

/// A 2-D convolution (dilation 1, groups 1) with its updates: x {W, H, in, N}; kernel
/// {k, k, in, out} F32/F16; b {out} or null. The LoRA down kernel runs with the layer's stride
/// and padding, up (and a mid) as in LoCon; Dense terms are kernels of the layer's size.
ggml_tensor* patched_conv2d(ggml_context* ctx, ggml_tensor* x, ggml_tensor* kernel, ggml_tensor* b, int stride, int padding,
                            const Terms& t);

/// s * (x A^T) B^T alone (the term patched_linear adds): x {in, ...}, A {in, r}, B {r, out}.
ggml_tensor* low_rank_term(ggml_context* ctx, ggml_tensor* x, ggml_tensor* down, ggml_tensor* up, float s);

/// A conv2d of x {W, H, C, N} with kernel {kw, kh, C, out} in the kernel's type (im2col + one
/// matmul, as nn::Conv2d): {OW, OH, out, N}.
ggml_tensor* conv2d(ggml_context* ctx, ggml_tensor* x, ggml_tensor* kernel, int stride, int padding);

/// The delta of a LoHa in the graph: (w1a w1b) * (w2a w2b) with PyTorch-shaped factors given in
/// ggml order (w1a {r, out}, w1b {in, r}): {in, out}. For merging on the weight's device.
ggml_tensor* loha_delta_graph(ggml_context* ctx, ggml_tensor* w1a, ggml_tensor* w1b, ggml_tensor* w2a, ggml_tensor* w2b);
/// kron(W1, W2) in the graph: W1 {b, a}, W2 {d, c} -> {b*d, a*c}.
ggml_tensor* kron_graph(ggml_context* ctx, ggml_tensor* w1, ggml_tensor* w2);

/// Host tensors of one patch for one target, ready to upload: the rows of the update that the
/// target takes, laid out on the target's rows.
struct HostTerm {
    Term::Kind kind = Term::Kind::LowRank;
    Tensor down;   ///< LowRank: the file's down (lora_A) [r, in(, kh, kw)] (with mid: [r_dn, in, 1, 1])
    Tensor up;     ///< LowRank: [target rows, r] - the patch's up rows placed at their target rows, zero elsewhere
    Tensor mid;    ///< conv Tucker core, when the file has one
    Tensor delta;  ///< Dense: [target rows, row elems] (alpha / rank applied)
    Tensor w1, w2; ///< Kron: the two factors (w1 [a, b], w2 [c, d]) when the patch covers the target exactly
    float scale = 1.0f;  ///< alpha / rank (LowRank, Kron); the user's weight is applied by the caller
    Tensor bias;   ///< [target rows] bias update (scaled), empty when none
};

/// Builds the host term of patch `p` of `f` for target `t`, from the destinations of that
/// target (rows of the update -> rows of the target). LoRA patches stay low rank; LoKr patches
/// that cover the target exactly stay factored; everything else becomes dense rows.
HostTerm prepare_term(const LoraFile& f, const Patch& p, const Target& t, const std::vector<Destination>& dest);

/// The DoRA scales of one weight at run time. `w` is the base weight (F32, shape w_shape) and
/// `updates` its patches in application order: each a dense update [rows, row_elems] already
/// placed on the target's rows (alpha / rank applied), the user's weight m and, for DoRA, the
/// magnitude (empty otherwise). Returns per update and for the base matmul the input and output
/// scales (empty = none) such that  y = o_0 * (W (i_0 * x)) + sum_k o_k * m_k' * (D_k (i_k * x))
/// equals x W'^T for the merged W' (math.h), where m_k' = m_k (the factor f_k of a DoRA patch is
/// folded into its own i_k / o_k).
struct DoraScales {
    std::vector<float> base_in, base_out;
    std::vector<std::vector<float>> in, out;  ///< one per update
};
struct DoraUpdate {
    const Tensor* delta = nullptr;
    float m = 1.0f;
    const Tensor* magnitude = nullptr;
};
DoraScales dora_runtime_scales(const Tensor& w, const std::vector<DoraUpdate>& updates);

}  // namespace easel::lora
