// The Z-Image diffusion transformer (S3-DiT): diffusers' ZImageTransformer2DModel
// (diffusers/models/transformers/transformer_z_image.py, "basic" mode: one image per item,
// no SigLIP / omni inputs) as a Block tree with diffusers naming and as an nn::Sequence:
//
//   prologue  patchify (p x p patches, features ordered (ph, pw, c), c fastest) -> x_embedder,
//             pad the image tokens to a multiple of 32 with x_pad_token; t_embedder(t * t_scale);
//             noise_refiner layers (modulated) on the image tokens; cap_embedder (RMSNorm +
//             Linear) on the caption, pad to a multiple of 32 with cap_pad_token;
//             context_refiner layers (not modulated) on the caption tokens; join [image, caption]
//   block[i]  layers.i (modulated; scale + tanh gate, no shift; sandwich RMSNorms)
//   epilogue  final layer (LayerNorm without affine, scale 1 + Linear(SiLU(adaln)), Linear),
//             drop the pad and caption tokens, unpatchify
//
// The 32-multiple pad tokens are NOT masked: they take part in attention, as in diffusers.
// Only padding that makes the items of a batch equally long is masked there; this module runs
// one item per graph, so it never needs a mask (see docs/formats.md, "Z-Image").
//
// 3-axis RoPE (RopeEmbedder): head_dim = sum(axes_dims); axis a rotates its axes_dims[a] head
// channels as adjacent pairs (complex numbers) by pos[a] * theta^(-2j/axes_dims[a]),
// theta = rope_theta (256). Position ids (patchify_and_embed / _pad_with_ids), with Lp the
// caption length padded to a multiple of 32:
//   caption token i (0 <= i < Lp, pad tokens included): (1 + i, 0, 0)
//   image token (h, w):                                (Lp + 1, h, w)
//   image pad token:                                   (0, 0, 0)
// The angles are computed on the host in float64 (as diffusers) and passed as cos/sin tables.
// Inside the graph q and k are de-interleaved (all real parts, then all imaginary parts of
// each head) before the rotation; q.k is unchanged by that common permutation of channels.
//
// Key layouts (canonical = diffusers; see docs/formats.md):
//   diffusers                                  original (Z-Image repo / ComfyUI / sd.cpp GGUF)
//   all_x_embedder.{p}-{f}.{weight,bias}       x_embedder.{weight,bias}
//   all_final_layer.{p}-{f}.linear.*           final_layer.linear.*
//   all_final_layer.{p}-{f}.adaLN_modulation.1.*  final_layer.adaLN_modulation.1.*
//   <L>.attention.to_q/to_k/to_v.weight        <L>.attention.qkv.weight (rows q | k | v, sliced)
//   <L>.attention.to_out.0.weight              <L>.attention.out.weight
//   <L>.attention.norm_q/norm_k.weight         <L>.attention.q_norm/k_norm.weight
//   same in both: x_pad_token, cap_pad_token ([1, dim] or [dim]), t_embedder.mlp.{0,2}.*,
//   cap_embedder.{0,1}.*, <L>.feed_forward.w{1,2,3}.weight, <L>.attention_norm{1,2}.weight,
//   <L>.ffn_norm{1,2}.weight, <L>.adaLN_modulation.0.* (modulated layers only),
//   where <L> is noise_refiner.i, context_refiner.i or layers.i. Any prefix
//   (model.diffusion_model., diffusion_model., ...) is found from x_pad_token.
//
// Time convention: the model's t is what ZImagePipeline passes, t = (1000 - t_sched) / 1000
// (= 1 - sigma for the flow-match schedule), multiplied inside by t_scale (1000). The pipeline
// negates the model output before scheduler.step: velocity (noise - x0) = -output.
//
// Tensor layout (ggml order, innermost first): latent x {W, H, C, 1} (= PyTorch [C, H, W]
// row-major); caption {cap_feat_dim, L, 1}; hidden states {dim, S, 1}.
#pragma once

#include "io/weight_index.h"
#include "nn/layers.h"
#include "nn/sequence.h"

#include <ggml-backend.h>
#include <nlohmann/json_fwd.hpp>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace easel::runtime {
class GraphRunner;
}

namespace easel::models::zimage {

/// Sequence lengths are padded to a multiple of this (diffusers SEQ_MULTI_OF).
inline constexpr int64_t kSeqMultiple = 32;

/// Architecture of a Z-Image transformer. How each field is found (infer_config):
///  * dim: x_pad_token's last dimension; in_channels * p * p: x_embedder's input width;
///    p, f from the diffusers key "all_x_embedder.{p}-{f}" (original layout: p = 2, f = 1,
///    the only patch of released models), or config.json all_patch_size/all_f_patch_size;
///  * head_dim: the size of attention.norm_q (qk-norm); n_heads = to_q rows / head_dim
///    (fused qkv: rows / head_dim / 3 unless config.json n_kv_heads says otherwise);
///    kv heads from to_k rows; without qk-norm: config.json n_heads, else head_dim 128;
///  * ffn_hidden: feed_forward.w1 rows; layer counts: the indices of layers.N, noise_refiner.N,
///    context_refiner.N; cap_feat_dim: cap_embedder.1 input width; adaln_dim: t_embedder.mlp.2
///    rows (min(dim, 256)); t_hidden / t_freq_dim: t_embedder.mlp.0 shape ([1024, 256]);
///  * not in the weights: axes_dims from config.json, else [32, 48, 48] scaled to head_dim:
///    [head_dim / 4, 3 head_dim / 8, 3 head_dim / 8] (= [32, 48, 48] at the real head_dim 128,
///    [4, 6, 6] at head_dim 16; diffusers and sd.cpp/ComfyUI take [32, 48, 48] from config /
///    hard-code it); axes_lens from config.json, else [1024, 512, 512] (informational: easel
///    computes rotations for any position); rope_theta 256, t_scale 1000, norm_eps 1e-5 from
///    config.json when present.
struct ZImageDiTConfig {
    int64_t in_channels = 16;   ///< latent channels C (out_channels = in_channels)
    int64_t patch = 2;          ///< spatial patch p
    int64_t f_patch = 1;        ///< temporal patch (1 for images)
    int64_t dim = 0;            ///< hidden size
    int64_t n_heads = 0;
    int64_t n_kv_heads = 0;
    int64_t head_dim = 0;       ///< dim / n_heads = sum(axes_dims)
    int64_t ffn_hidden = 0;     ///< SwiGLU hidden width (int(dim / 3 * 8) in diffusers)
    int64_t n_layers = 0;
    int64_t n_noise_refiner = 0;
    int64_t n_context_refiner = 0;
    int64_t cap_feat_dim = 0;   ///< caption feature width (Qwen3 hidden size, 2560 for Qwen3-4B)
    int64_t adaln_dim = 0;      ///< min(dim, 256)
    int64_t t_hidden = 1024;    ///< t_embedder hidden width
    int64_t t_freq_dim = 256;   ///< sinusoidal frequency embedding size
    bool qk_norm = true;
    std::array<int64_t, 3> axes_dims{32, 48, 48};
    std::array<int64_t, 3> axes_lens{1024, 512, 512};
    float rope_theta = 256.0f;
    float t_scale = 1000.0f;
    float norm_eps = 1e-5f;
    int pad_token_rank = 2;     ///< x_pad_token / cap_pad_token stored as [1, dim] (2) or [dim] (1)

    /// "30 layers, dim 3840, 30 heads x 128, 2+2 refiners, caption 2560".
    std::string summary() const;
};

/// Values that override the inferred ones (config.json, tests).
struct ZImageOverrides {
    std::optional<int64_t> n_heads, n_kv_heads, in_channels, patch, f_patch;
    std::optional<std::array<int64_t, 3>> axes_dims, axes_lens;
    std::optional<float> rope_theta, t_scale, norm_eps;
};

/// Reads n_heads, n_kv_heads, in_channels, all_patch_size[0], all_f_patch_size[0], axes_dims,
/// axes_lens, rope_theta, t_scale, norm_eps from a diffusers ZImageTransformer2DModel
/// config.json (or a fixture sidecar's "config"). Throws Error(InvalidInput) for axes of a
/// length other than 3.
ZImageOverrides overrides_from_config_json(const nlohmann::json& config);

/// Where a Z-Image transformer's tensors are in a weight file.
struct ZImageKeys {
    enum class Layout { Diffusers, Original } layout = Layout::Diffusers;
    std::string prefix;  ///< "" , "model.diffusion_model.", ...
};

/// Finds the transformer in `index` by its "x_pad_token" + "cap_pad_token" tensors; the layout
/// is Diffusers when "<prefix>layers.0.attention.to_q.weight" or all_x_embedder exists, else
/// Original. nullopt when there is none.
std::optional<ZImageKeys> find_zimage_dit(const io::WeightIndex& index);

/// Infers the configuration from the weights under `keys` (see ZImageDiTConfig), then applies
/// `ov`. Throws Error(ModelMismatch) when a needed tensor is missing or shapes disagree,
/// Error(InvalidInput) when the axes dims cannot be derived (head_dim not a multiple of 16 and
/// no axes_dims given) or an override contradicts the weights.
ZImageDiTConfig infer_config(const io::WeightIndex& index, const ZImageKeys& keys, const ZImageOverrides& ov = {});

/// A TensorSource binding the canonical (diffusers) names of ZImageDiT(cfg) to `keys`: the
/// prefix, and for the original layout the renames and the q/k/v row slices of attention.qkv.
nn::TensorSource make_tensor_source(const io::WeightIndex& index, const ZImageKeys& keys, const ZImageDiTConfig& cfg);
/// Load options that ignore what files carry beside the basic-mode model: "norm_final.weight"
/// (dropped by diffusers' converter) and the SigLIP (omni) tensors siglip_embedder.*,
/// siglip_refiner.*, siglip_pad_token (found in `index`).
nn::LoadOptions default_load_options(const io::WeightIndex& index, const ZImageKeys& keys);

/// Host-side RoPE tables for one item: cos and sin of every token's angles, [S, head_dim / 2]
/// row-major (ggml ne {head_dim / 2, S}), S = Tp + Lp, tokens ordered [image (Tp), caption (Lp)]
/// as the joined sequence. Channel j < axes_dims[0]/2 belongs to axis 0, and so on.
struct ZImageRope {
    std::vector<float> cos, sin;
    int64_t img_tokens = 0;         ///< T = (H / p) * (W / p)
    int64_t img_tokens_padded = 0;  ///< Tp = T rounded up to 32
    int64_t cap_tokens = 0;         ///< L
    int64_t cap_tokens_padded = 0;  ///< Lp = L rounded up to 32
    int64_t tokens() const { return img_tokens_padded + cap_tokens_padded; }
};
/// Builds the tables for a latent of H x W (multiples of cfg.patch) and a caption of L >= 1
/// tokens. Angles in float64 rounded to float32, then cos/sin (as diffusers' precompute_freqs_cis).
/// Throws Error(InvalidInput) on sizes that are not positive or not multiples of the patch.
ZImageRope make_rope(const ZImageDiTConfig& cfg, int64_t H, int64_t W, int64_t L);

/// Graph inputs of one evaluation (batch 1), all F32.
struct ZImageInputs {
    ggml_tensor* x = nullptr;         ///< latent {W, H, C, 1}, H and W multiples of the patch
    ggml_tensor* t = nullptr;         ///< {1}: the model's t (ZImagePipeline: (1000 - t_sched) / 1000)
    ggml_tensor* cap = nullptr;       ///< caption features {cap_feat_dim, L, 1}, L >= 1
    ggml_tensor* rope_cos = nullptr;  ///< {head_dim / 2, S} from make_rope() for these H, W, L
    ggml_tensor* rope_sin = nullptr;  ///< {head_dim / 2, S}
};

/// What flows between the main layers. rope_cos/rope_sin are pure functions of H, W, L (a
/// segment may also feed them again from make_rope()); adaln is t_embedder's output.
struct ZImageState {
    ggml_tensor* h = nullptr;         ///< joined tokens {dim, S, 1}: [image (Tp), caption (Lp)]
    ggml_tensor* adaln = nullptr;     ///< {adaln_dim, 1}
    ggml_tensor* rope_cos = nullptr;  ///< {head_dim / 2, 1, S}
    ggml_tensor* rope_sin = nullptr;  ///< {head_dim / 2, 1, S}
    int64_t img_tokens = 0;           ///< T (the first T tokens are the image's real tokens)
    int64_t h_tokens = 0, w_tokens = 0;  ///< H / p, W / p
    /// Calls f on "h", "adaln", "rope_cos", "rope_sin".
    void visit_tensors(const nn::StateTensorFn& f);
};

/// One ZImageTransformerBlock: (modulated) sandwich-norm self-attention with qk RMSNorm and
/// 3-axis RoPE, then a SwiGLU feed-forward (w2(silu(w1 x) * w3 x)).
class ZImageBlock : public nn::Block {
public:
    ZImageBlock(const ZImageDiTConfig& cfg, bool modulation);
    /// x {dim, S, 1}; adaln {adaln_dim, 1} (modulated blocks; ignored otherwise); cos/sin
    /// {head_dim / 2, 1, S}. Returns {dim, S, 1}.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* adaln, ggml_tensor* cos, ggml_tensor* sin) const;

private:
    ZImageDiTConfig cfg_;
    bool modulation_;
    nn::Linear *q_, *k_, *v_, *o_, *w1_, *w2_, *w3_, *mod_ = nullptr;
    nn::RMSNorm *norm_q_ = nullptr, *norm_k_ = nullptr, *attn_norm1_, *attn_norm2_, *ffn_norm1_, *ffn_norm2_;
};

/// ZImageTransformer2DModel (basic mode) as a Block tree (diffusers names) and a Sequence.
class ZImageDiT : public nn::Block, public nn::Sequence<ZImageInputs, ZImageState, ggml_tensor*> {
public:
    explicit ZImageDiT(const ZImageDiTConfig& cfg);
    const ZImageDiTConfig& config() const { return cfg_; }

    int n_blocks() const override { return (int)layers_.size(); }
    /// Patchify, embedders, refiners, join (see the file comment). Throws Error(InvalidInput) on
    /// inputs of the wrong shape or type (channels, patch multiples, caption width, rope sizes).
    ZImageState prologue(nn::Ctx& c, const ZImageInputs& in) const override;
    ZImageState block(nn::Ctx& c, int i, ZImageState s) const override;
    /// Final layer + unpatchify: the model output {W, H, C, 1} (PyTorch [C, H, W]).
    ggml_tensor* epilogue(nn::Ctx& c, ZImageState s) const override;
    const nn::Block& block_params(int i) const override { return *layers_.at((size_t)i); }

private:
    ZImageDiTConfig cfg_;
    nn::Param* x_pad_ = nullptr;
    nn::Param* cap_pad_ = nullptr;
    nn::Linear *x_emb_, *t_mlp0_, *t_mlp2_, *cap_lin_, *final_lin_, *final_mod_;
    nn::RMSNorm* cap_norm_;
    std::vector<ZImageBlock*> noise_refiner_, context_refiner_, layers_;
};

/// Options of LoadedZImageDiT::load().
struct ZImageLoadOptions {
    ggml_backend_dev_t device = nullptr;      ///< nullptr: CPU
    int threads = 0;                          ///< CPU threads (<= 0: all)
    bool flash_attn = false;                  ///< ggml_flash_attn_ext where the backend allows
    ggml_type weight_type = GGML_TYPE_COUNT;  ///< --type for matmul weights; COUNT keeps the stored types
    ZImageOverrides overrides;                ///< on top of config.json (when the index has one)
};

/// A Z-Image transformer with its weights loaded on a device, evaluated from host memory.
/// The API the Z-Image family calls.
class LoadedZImageDiT {
public:
    /// Finds the transformer in `index` (either layout, any prefix), infers its configuration
    /// (index.config() JSON, then opt.overrides, take precedence over defaults), builds the
    /// tree and loads the weights on opt.device. `index` must outlive the returned object only
    /// during this call. Throws Error(ModelMismatch) when the file holds no Z-Image transformer
    /// or its tensors do not match (missing / unexpected / mis-shaped keys named),
    /// Error(OutOfMemory) when the weights do not fit, Error(Unsupported) when the device's
    /// backend cannot be created.
    static std::unique_ptr<LoadedZImageDiT> load(const io::WeightIndex& index, const ZImageLoadOptions& opt = {});
    ~LoadedZImageDiT();

    const ZImageDiTConfig& config() const { return net_->config(); }
    ZImageDiT& module() { return *net_; }
    runtime::GraphRunner& runner() { return *runner_; }

    /// One evaluation, exactly diffusers' `transformer([x], [t], [cap])[0]` for one item:
    ///  x   latent [C, H, W] row-major (C = config().in_channels; H, W multiples of the patch,
    ///      in latent cells: image pixels / 8);
    ///  t   the model's time, as ZImagePipeline passes it: t = (1000 - t_sched) / 1000, i.e.
    ///      1 - sigma (t = 0 is pure noise, 1 is clean);
    ///  cap caption features [L, D] row-major (D = config().cap_feat_dim; the Qwen3
    ///      hidden_states[-2] of the real tokens), L >= 1;
    ///  out [C, H, W]: the raw model output. The flow velocity (noise - x0) the scheduler
    ///      steps with is -out (ZImagePipeline: noise_pred = -noise_pred).
    /// The caller checks that its conditioning width equals config().cap_feat_dim (the buffer
    /// carries no width). Throws Error(InvalidInput) on sizes that do not fit the model (H, W not
    /// positive multiples of the patch, L < 1, t not finite); nothing reaches a ggml assert.
    void forward(const float* x, int64_t H, int64_t W, float t, const float* cap, int64_t L, float* out);

    /// Bytes of the loaded parameters.
    size_t param_bytes() const;
    /// Peak compute-buffer bytes over the forward() calls so far.
    size_t compute_bytes() const { return compute_bytes_; }

private:
    LoadedZImageDiT() = default;
    std::unique_ptr<runtime::GraphRunner> runner_;
    std::unique_ptr<ZImageDiT> net_;
    nn::ParamBuffer params_;
    ZImageLoadOptions opt_;
    size_t compute_bytes_ = 0;
};

}  // namespace easel::models::zimage
