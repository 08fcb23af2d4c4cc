// LoRA math on host F32 tensors: the weight update of every patch kind, merging it into a weight
// (plain or DoRA), and the round trip of a stored weight through F32.
//
// All tensors are lora::Tensor: PyTorch order, row-major. Formulas (facts from the references,
// checked against hand-computed figures in tests/unit/lora_math_test.cpp):
//
//   LoRA   delta = s * up @ down                     up [out, r], down [r, in] (PEFT: lora_B, lora_A)
//          conv: up [out, r, 1, 1], down [r, in, kh, kw] -> up @ down.reshape(r, in*kh*kw)
//          conv Tucker (LoCon lora_mid [r_up, r_dn, kh, kw], down [r_dn, in, 1, 1]):
//          delta[o, c, y, x] = s * sum_ij up[o, i] mid[i, j, y, x] down[j, c]
//   LoHa   delta = s * (w1a @ w1b) * (w2a @ w2b)      (Hadamard product; LyCORIS loha.py)
//          Tucker: rebuild_k[p, q, y, x] = sum_ij t_k[i, j, y, x] w_kb[j, q] w_ka[i, p]
//   LoKr   delta = s * kron(w1, w2), w1 = w1_a @ w1_b when factorised, w2 = w2_a @ w2_b (or the
//          Tucker rebuild with lokr_t2); a 2-D w1 meets a 4-D w2 as w1[:, :, None, None]
//   s      alpha / rank (rank: lora_down rows, hada_w1_b rows, lokr_w2_b or lokr_w1_b rows;
//          1 without alpha, and for LoKr with neither factor low-rank)
//   merge  W' = W + m * delta                         m = the user's weight (<lora:name:m>)
//   DoRA   V = W + delta; D = V * (g / ||V||);  W' = W + m * (D - W)
//          ||V|| per output row when the magnitude g is [out] / [out, 1, ...] (PEFT, newer
//          LyCORIS wd_on_out), per input channel when g is [1, in, ...] (LyCORIS, kohya, OneTrainer);
//          at m = 1 this is PEFT's / LyCORIS' merged weight; for m != 1 it interpolates between W
//          and the DoRA weight as ComfyUI and A1111 do (a weight of 0 leaves W untouched).
#pragma once

#include "lora/lora_file.h"

#include <ggml.h>

#include <cstdint>
#include <span>
#include <vector>

namespace easel::lora {

/// a [m, k] @ b [k, n] -> [m, n] (b may have more than 2 dims: it is read as [k, numel/k]; the
/// result keeps b's trailing dims). Accumulates in double. Throws Error(InvalidInput) when the
/// inner sizes differ.
Tensor matmul(const Tensor& a, const Tensor& b);

/// s * up @ down with an optional conv Tucker mid; shape [out, in(, kh, kw)]. See the header.
Tensor lora_delta(const Tensor& up, const Tensor& down, const Tensor* mid, float s);

/// A LyCORIS Tucker rebuild: out[p, q, ...] = sum_ij t[i, j, ...] w_b[j, q] w_a[i, p]
/// (w_a [r, out], w_b [r, in], t [r, r, ...]).
Tensor tucker_rebuild(const Tensor& t, const Tensor& w_a, const Tensor& w_b);

/// s * (w1a @ w1b) * (w2a @ w2b), or with Tucker cores t1/t2 (both or neither).
Tensor loha_delta(const Tensor& w1a, const Tensor& w1b, const Tensor& w2a, const Tensor& w2b, const Tensor* t1,
                  const Tensor* t2, float s);

/// s * kron(w1, w2); w1 2-D, w2 2-D or 4-D (then w1 is broadcast over the kernel dims).
Tensor lokr_delta(const Tensor& w1, const Tensor& w2, float s);

/// The scaled update of `p` read from `f` (alpha / rank applied, no user weight), shape
/// p.delta_shape; a bias-only diff gives an empty tensor (see patch_bias_delta).
Tensor patch_delta(const LoraFile& f, const Patch& p);
/// The scaled bias update of `p` ([out]): PEFT lora_B.bias * s, or diff_b; empty when none.
Tensor patch_bias_delta(const LoraFile& f, const Patch& p);

/// Rows of an update going into rows of a target: src rows [src_begin, src_end) of the patch's
/// update become target rows [dst_begin, dst_begin + src_end - src_begin).
struct RowSlice {
    int64_t src_begin = 0, src_end = 0, dst_begin = 0;
};

/// w[dst rows] += m * delta[src rows]. w: `rows` rows of `row_elems` values; delta: rows of the
/// same row_elems (its trailing dims are flattened). Throws Error(InvalidInput) on a size
/// mismatch or rows out of range.
void merge_rows(std::span<float> w, int64_t rows, int64_t row_elems, const Tensor& delta, const RowSlice& sl, float m);

/// DoRA merge: w (shape w_shape, in place) gets the rows `sl` of `delta` (the patch's full
/// update) with the magnitude vector of the patch ([out], [out, 1...]: per output row, indexed
/// by source row; [1, in, ...]: per input channel, which needs the slice to cover all of w's
/// rows). Throws Error(InvalidInput) when the magnitude fits neither axis or an input-axis
/// magnitude meets a partial slice.
void merge_dora(std::span<float> w, const std::vector<int64_t>& w_shape, const Tensor& delta, const RowSlice& sl,
                const Tensor& magnitude, float m);

/// A stored weight as F32 values (F32, F16, BF16 or any quantised ggml type).
std::vector<float> to_f32(std::span<const uint8_t> bytes, ggml_type type, int64_t numel);
/// F32 values back to `type`: float types are rounded (F16/BF16 round to nearest even, as
/// ggml's converters), quantised types re-quantised with ggml_quantize_chunk (rows of
/// `row_len`). Throws Error(Unsupported) for types that need an importance matrix.
std::vector<uint8_t> from_f32(std::span<const float> values, ggml_type type, int64_t row_len);

}  // namespace easel::lora
