// Pieces shared by the FLUX.1 and FLUX.2 DiTs (src/models/flux/flux_dit.h, flux2_dit.h):
// multi-axis rotary position tables, their application to attention heads, adaLN modulation,
// tanh-approximated GELU, and the 2x2 latent packing of the FLUX pipelines.
//
// Tensor layout (ggml order, innermost first): token sequences {D, L, N}; attention heads
// {head_dim, heads, L, N}; modulation vectors {k*D, N} (k chunks of D, chunk 0 first).
// Host tensors are PyTorch order, row-major.
#pragma once

#include "io/weight_index.h"
#include "nn/layers.h"

#include <cstdint>
#include <span>
#include <vector>

namespace easel::models::flux {

/// Rotary tables for a token sequence, one (cos, sin) pair per rotated pair of channels.
/// cos/sin: [tokens, half_dim] row-major (ggml ne = {half_dim, tokens}); half_dim = sum(axes)/2.
struct RopeTables {
    std::vector<float> cos, sin;
    int64_t half_dim = 0;
    int64_t tokens = 0;
};

/// Multi-axis RoPE tables as diffusers' FluxPosEmbed / Flux2PosEmbed compute them
/// (diffusers/models/embeddings.py get_1d_rotary_pos_embed with repeat_interleave_real=True,
/// use_real=True, freqs in float64): for axis a of size d_a (even) and pair j < d_a/2,
/// angle = ids[t, a] * theta^(-2j/d_a); the axes are concatenated in order.
/// ids: [tokens, n_axes] row-major (position ids; FLUX.1: (0, row, col) for image tokens,
/// zeros for text; FLUX.2: (t, h, w, l)). Throws Error(InvalidInput) when ids.size() is not
/// tokens * axes.size() or an axis size is odd or not positive.
RopeTables rope_tables(std::span<const float> ids, int64_t tokens, std::span<const int> axes, double theta);

/// Applies rotary embedding to x: {head_dim, heads, L, N} with cos/sin F32 {head_dim/2, L}
/// (broadcast over heads and batch). Channel pairs (2j, 2j+1) rotate by the pair's angle:
/// out[2j] = x[2j] cos - x[2j+1] sin, out[2j+1] = x[2j+1] cos + x[2j] sin (diffusers
/// apply_rotary_emb with use_real_unbind_dim=-1). Returns a contiguous tensor of x's shape.
/// Throws Error(InvalidInput) on a shape mismatch.
ggml_tensor* apply_rope(nn::Ctx& c, ggml_tensor* x, ggml_tensor* cos, ggml_tensor* sin);

/// GELU with the tanh approximation (torch GELU(approximate="tanh")) in F32:
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). On the CPU backend (or an unknown one) it
/// is composed from exact F32 ops, because ggml_gelu on the CPU reads an F16 table; on other
/// backends ggml_gelu (computed in F32 there) is used.
ggml_tensor* gelu_tanh(nn::Ctx& c, ggml_tensor* x);

/// Chunk i of width d of a modulation vector mod {k*d, N}, as {d, 1, N} (contiguous), ready to
/// broadcast over the tokens of a {d, L, N} sequence (torch.chunk(mod, k, dim=-1)[i]).
ggml_tensor* mod_chunk(nn::Ctx& c, ggml_tensor* mod, int i, int64_t d);

/// adaLN modulation: x * (1 + scale) + shift. x {D, L, N}; shift/scale {D, 1, N}.
ggml_tensor* modulate(nn::Ctx& c, ggml_tensor* x, ggml_tensor* shift, ggml_tensor* scale);

/// Rows [begin, begin + len) of a sequence x {D, L, N} along L, as a contiguous {D, len, N}.
ggml_tensor* seq_slice(nn::Ctx& c, ggml_tensor* x, int64_t begin, int64_t len);

/// FluxPipeline._pack_latents: latent [N, C, H, W] (H, W even) -> tokens [N, (H/2)(W/2), 4C],
/// token (y, x) = y * (W/2) + x, feature c*4 + dy*2 + dx. Throws Error(InvalidInput) on odd H/W
/// or a size mismatch.
std::vector<float> pack_latents(std::span<const float> latent, int64_t n, int64_t c, int64_t h, int64_t w);
/// The inverse of pack_latents (FluxPipeline._unpack_latents): tokens [N, (H/2)(W/2), 4C] ->
/// latent [N, C, H, W].
std::vector<float> unpack_latents(std::span<const float> tokens, int64_t n, int64_t c, int64_t h, int64_t w);

/// FluxPipeline._prepare_latent_image_ids: [rows*cols, 3] row-major, token (y, x) -> (0, y, x).
std::vector<float> flux1_image_ids(int64_t rows, int64_t cols);
/// Flux2KleinPipeline._prepare_latent_ids: [rows*cols, 4] row-major, token (y, x) ->
/// (t, y, x, 0) with t = `t` (0 for the generated image; reference images use t = 10, 20, ...).
std::vector<float> flux2_image_ids(int64_t rows, int64_t cols, float t = 0.0f);
/// Flux2KleinPipeline._prepare_text_ids: [tokens, 4] row-major, token l -> (0, 0, 0, l).
std::vector<float> flux2_text_ids(int64_t tokens);

/// "{ne0, ne1, ne2, ne3}" of a graph tensor, for error messages.
std::string ne_str(const ggml_tensor* t);

/// Number of consecutive indices i (from 0) for which the tensor prefix + i + suffix exists.
int count_indexed(const io::WeightIndex& idx, const std::string& prefix, const std::string& suffix);

/// The tensor `name` of a FLUX transformer file, which must have `rank` dimensions. Throws
/// Error(ModelMismatch) naming the tensor and `model` ("FLUX.1", "FLUX.2") otherwise.
const io::TensorInfo& need_tensor(const io::WeightIndex& idx, const std::string& name, size_t rank, const char* model);

/// {hd*h, L, N} -> {hd, h, L, N} (attention heads), and back.
ggml_tensor* split_heads(nn::Ctx& c, ggml_tensor* x, int64_t hd, int64_t h);
ggml_tensor* merge_heads(nn::Ctx& c, ggml_tensor* x);

/// Rows [begin, begin + n) of a Linear's output: x {in, L, N} -> {n, L, N} with the weight's rows
/// (and bias entries) of that range, read through views of the loaded tensors (no copy): the
/// same values as the matching rows of l.forward(c, x). Throws Error(InvalidInput) on a range
/// outside the layer's outputs or a wrong input width.
ggml_tensor* linear_rows(nn::Ctx& c, const nn::Linear& l, ggml_tensor* x, int64_t begin, int64_t n);

/// Sequences of equal width D joined along the features: parts {D, L, N} each -> {k D, L, N},
/// per token [part 0 | part 1 | ...] (torch.cat(dim=-1)), built as a concat of D-wide rows
/// along a new axis: ggml's meta device can split that when every part is split the same way
/// along D (--split-mode row, flux_row_split.h), which it cannot for a concat along the split
/// axis. Throws Error(InvalidInput) when the parts' shapes differ or the list is empty.
ggml_tensor* join_rows(nn::Ctx& c, const std::vector<ggml_tensor*>& parts);

/// LayerNorm without affine parameters, eps 1e-6 (the FLUX blocks' norms).
ggml_tensor* layer_norm(nn::Ctx& c, ggml_tensor* x);

}  // namespace easel::models::flux
