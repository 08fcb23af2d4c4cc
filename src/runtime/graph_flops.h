// graph_flops: the floating-point operations of one evaluation of a ggml graph, counted from the
// shapes of its nodes (nothing is computed or allocated), for --auto-fit's cost model
// (placement::ModuleCosts::flops; docs/placement.md "--auto-fit", cost model).
//
// What is counted (a multiply-add is 2 FLOPs; shapes in ggml ne order, innermost first):
//   GGML_OP_MUL_MAT         dst = src0^T src1, src0 ne {K, M, ...}, dst ne {M, N, b2, b3}:
//                           2 x K x nelements(dst) (broadcast batches included: every dst
//                           element is one K-long dot product). A ggml_conv_2d / easel's
//                           nn::Conv2d is im2col + MUL_MAT and is counted here: 2 x Cin x kh x kw
//                           x Cout x Hout x Wout x N.
//   GGML_OP_MUL_MAT_ID      mixture-of-experts matmul, src0 ne {K, M, experts}, dst ne
//                           {M, experts used, tokens}: 2 x K x nelements(dst).
//   GGML_OP_FLASH_ATTN_EXT  q ne {Dk, Nq, H, B}, k ne {Dk, Nkv, Hkv, B}, v ne {Dv, Nkv, Hkv, B}
//                           (ggml.h ggml_flash_attn_ext): Q K^T is 2 x Dk x Nq x Nkv x H x B,
//                           P V is 2 x Dv x Nq x Nkv x H x B (grouped-query attention: the kv heads
//                           are shared, the products are per query head). A mask (causal or
//                           padding) does not shorten them: the kernel computes the full product.
//                           Nkv is k's ne[1] as given (padding included: it is computed).
//   GGML_OP_CONV_2D         direct conv (ggml_conv_2d_direct), kernel ne {kw, kh, Cin, Cout},
//                           dst ne {Wout, Hout, Cout, N}: 2 x kw x kh x Cin x nelements(dst).
//   GGML_OP_CONV_2D_DW      depthwise direct conv, kernel ne {kw, kh, 1, C}:
//                           2 x kw x kh x nelements(dst).
//   GGML_OP_CONV_TRANSPOSE_2D  kernel ne {kw, kh, Cout, Cin}, input ne {W, H, Cin, N}: every input
//                           value is scattered through kw x kh x Cout taps:
//                           2 x kw x kh x Cout x nelements(input).
// easel's nn layers build none of the three direct convolutions today (nn::Conv2d is im2col +
// MUL_MAT); they are counted so a graph that uses them is not under-counted.
//
// What is not counted, and why: elementwise ops (add, mul, scale, unary activations), norms
// (layer / group / RMS norm), softmax outside flash attention, RoPE, im2col, copies, views,
// reshapes, get_rows, concat, pooling, upscale, 1-D / 3-D convolutions (not built by easel).
// They are O(elements) against the matmuls' O(elements x K) (K = a layer's width, 32..5120),
// are bound by memory bandwidth rather than arithmetic, and the device throughput the planner
// divides by is a matmul figure (placement::measure_matmul_flops): counting them at that rate
// would not predict their time any better.
#pragma once

#include <ggml.h>

namespace easel::runtime {

/// FLOPs of one node (0 for the ops not counted; see the file comment for the formulas).
double node_flops(const ggml_tensor* node);

/// FLOPs of one evaluation of `gf`: node_flops summed over its nodes (leafs are inputs and
/// parameters, no work). Units: floating-point operations, a multiply-add = 2. Shapes only:
/// works on a no_alloc graph; null = 0.
double graph_flops(const ggml_cgraph* gf);

}  // namespace easel::runtime
