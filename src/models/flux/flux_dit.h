// FLUX.1 DiT (schnell / dev): diffusers' FluxTransformer2DModel
// (diffusers/models/transformers/transformer_flux.py; BFL flux/model.py is the original) as a
// Block tree with diffusers naming and as an nn::Sequence.
//
// Canonical parameter names (diffusers; D = hidden = heads * head_dim, M = mlp hidden):
//   x_embedder.{weight [D, C_in], bias}            context_embedder.{weight [D, J], bias}
//   time_text_embed.timestep_embedder.linear_{1,2} ([D, 256], [D, D], biases)
//   time_text_embed.guidance_embedder.linear_{1,2} (dev only: absent in schnell)
//   time_text_embed.text_embedder.linear_{1,2}     ([D, P], [D, D]; P = pooled CLIP width)
//   transformer_blocks.N.norm1.linear / norm1_context.linear [6D, D]
//   transformer_blocks.N.attn.{to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj} [D, D] + bias,
//     attn.to_out.0, attn.to_add_out [D, D] + bias, attn.norm_{q,k,added_q,added_k}.weight [head_dim]
//   transformer_blocks.N.ff.net.0.proj [M, D], ff.net.2 [D, M] (+ ff_context.*), biases
//   single_transformer_blocks.N.norm.linear [3D, D], attn.to_{q,k,v} [D, D], attn.norm_{q,k},
//     proj_mlp [M, D], proj_out [D, D + M], biases
//   norm_out.linear [2D, D] (scale rows first, then shift), proj_out [C_out, D]
// The BFL / ComfyUI layout (optionally under "model.diffusion_model."; city96 GGUF files use it
// without prefix) maps onto these names in configure_flux_source(): img_in, txt_in,
// time_in/guidance_in/vector_in.{in,out}_layer, double_blocks.N.{img,txt}_mod.lin,
// {img,txt}_attn.qkv (fused q|k|v rows, sliced), {img,txt}_attn.norm.{query,key}_norm.scale,
// {img,txt}_attn.proj, {img,txt}_mlp.{0,2}, single_blocks.N.linear1 (fused q|k|v|mlp rows,
// sliced), linear2, norm.{query,key}_norm.scale, modulation.lin, final_layer.linear and
// final_layer.adaLN_modulation.1 (shift rows first: the final layer reads its chunks in that
// order instead of copying swapped rows). Facts from diffusers/loaders/single_file_utils.py
// (convert_flux_transformer_checkpoint_to_diffusers).
//
// Sequence: prologue = x_embedder, context_embedder, time/guidance/pooled embedding (temb);
// blocks 0 .. n_double-1 are the double-stream blocks, n_double .. n_double+n_single-1 the
// single-stream blocks (one index space); epilogue = norm_out + proj_out on the image tokens.
// The State carries img and txt separately through the double blocks; the first single block
// joins them as [txt, img] (diffusers' order) into `joint`, and img/txt are then null.
//
// Tensor layout (ggml order): img tokens {C_in, L_img, N}; txt {J, L_txt, N}; pooled {P, N};
// timestep / guidance {N}; rotary tables {head_dim/2, L_txt + L_img} (text tokens first).
#pragma once

#include "io/weight_index.h"
#include "models/flux/flux_common.h"
#include "nn/layers.h"
#include "nn/sequence.h"

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

namespace easel::models::flux {

/// Key layout of a stored FLUX.1 DiT.
enum class FluxLayout {
    Diffusers,  ///< transformer_blocks.N.attn.to_q ... (diffusers FluxTransformer2DModel)
    Bfl,        ///< double_blocks.N.img_attn.qkv ... (BFL flux, ComfyUI, city96 GGUF)
};

/// Where a FLUX DiT lies in a weight file.
struct FluxSource {
    std::string prefix;  ///< "", "model.diffusion_model.", "transformer." ...
    FluxLayout layout = FluxLayout::Diffusers;
};

/// Finds a FLUX.1 DiT in `index`: tries the prefixes "", "model.diffusion_model.",
/// "transformer.", "diffusion_model." with both layouts (keys x_embedder.weight +
/// transformer_blocks.0.norm1.linear.weight, or img_in.weight + double_blocks.0.img_mod.lin.weight).
/// Returns nullopt when there is none (a FLUX.2 file is not a FLUX.1 DiT: it lacks the per-block
/// modulation).
std::optional<FluxSource> find_flux_dit(const io::WeightIndex& index);

/// Architecture of a FLUX.1 DiT, every size inferred from the weights except the rotary axes.
struct FluxDiTConfig {
    int64_t in_channels = 64;      ///< token features in (16 latent channels x 2x2 patch)
    int64_t out_channels = 64;     ///< proj_out rows
    int64_t hidden = 3072;         ///< D
    int64_t head_dim = 128;        ///< from attn.norm_q.weight
    int64_t heads = 24;            ///< D / head_dim
    int64_t mlp_hidden = 12288;    ///< ff.net.0.proj rows (the single blocks must agree)
    int64_t joint_dim = 4096;      ///< context features (T5-XXL d_model)
    int64_t pooled_dim = 768;      ///< pooled vector features (CLIP-L)
    int64_t time_channels = 256;   ///< sinusoidal timestep features
    int n_double = 19;             ///< transformer_blocks
    int n_single = 38;             ///< single_transformer_blocks
    bool guidance_embeds = true;   ///< dev: true; schnell: false (guidance_embedder absent)
    std::vector<int> axes_dims{16, 56, 56};  ///< RoPE axes; see default_flux1_axes
    double theta = 10000.0;        ///< RoPE base (FluxPosEmbed theta)
};

/// RoPE axis sizes for a head size, since the weights do not show them: the real models use
/// (16, 56, 56) for head_dim 128. The rule reproducing that pattern: two equal spatial axes
/// a = 2 * floor((head_dim - head_dim/8) / 4) and a first axis head_dim - 2a (16 -> (4, 6, 6),
/// as the tiny reference fixture). Throws Error(InvalidInput) for head_dim < 8 or odd.
std::vector<int> default_flux1_axes(int64_t head_dim);

/// Reads "axes_dims_rope" and "rope_theta" of a diffusers transformer config.json (the fields
/// the weights do not show) into `axes` / `theta` when present. Throws Error(InvalidInput) when
/// the axes are not positive even sizes summing to `head_dim`, or theta is not positive.
void apply_rope_config(const nlohmann::json& config, int64_t head_dim, std::vector<int>& axes, double& theta);

/// Infers the configuration from the weights under `src` (rotary axes and theta from the
/// config.json beside the weights when there is one, see apply_rope_config). Throws Error(ModelMismatch) naming the
/// missing key or the inconsistent shapes.
FluxDiTConfig infer_flux_dit_config(const io::WeightIndex& index, const FluxSource& src);

/// Sets up `ts` (whose prefix must be src.prefix) so that the canonical diffusers names bind to
/// the stored tensors of `src` (renames and row slices for the BFL layout; nothing for diffusers).
void configure_flux_source(nn::TensorSource& ts, const FluxDiTConfig& cfg, const FluxSource& src);

/// Graph inputs of the FLUX.1 DiT (one denoiser call).
struct FluxInputs {
    ggml_tensor* img = nullptr;       ///< F32 {C_in, L_img, N}: packed latent tokens (hidden_states)
    ggml_tensor* txt = nullptr;       ///< F32 {J, L_txt, N}: T5 hidden states (encoder_hidden_states)
    ggml_tensor* pooled = nullptr;    ///< F32 {P, N}: CLIP pooled output (pooled_projections)
    ggml_tensor* timestep = nullptr;  ///< F32 {N}: sigma in [0, 1] (the pipeline's t/1000; multiplied by 1000 here)
    ggml_tensor* guidance = nullptr;  ///< F32 {N}: guidance scale (dev; multiplied by 1000 here); ignored by schnell
    ggml_tensor* rope_cos = nullptr;  ///< F32 {head_dim/2, L_txt + L_img}: rope_tables() of [txt_ids; img_ids]
    ggml_tensor* rope_sin = nullptr;  ///< same shape
};

/// State between blocks. Double blocks: img {D, L_img, N} and txt {D, L_txt, N}; from the first
/// single block on: joint {D, L_txt + L_img, N} ([txt, img]) and img = txt = null. temb {D, N}
/// (the conditioning vector) and the rotary tables travel with it (pure functions of the
/// inputs; a segment may also re-supply them from the host). n_txt is L_txt (not a tensor).
struct FluxState {
    ggml_tensor* img = nullptr;
    ggml_tensor* txt = nullptr;
    ggml_tensor* joint = nullptr;
    ggml_tensor* temb = nullptr;
    ggml_tensor* rope_cos = nullptr;
    ggml_tensor* rope_sin = nullptr;
    int64_t n_txt = 0;
    /// Names: "img", "txt" (double blocks) or "joint" (single blocks), then "temb", "rope_cos", "rope_sin".
    void visit_tensors(const nn::StateTensorFn& f) {
        if (img) f("img", img);
        if (txt) f("txt", txt);
        if (joint) f("joint", joint);
        f("temb", temb);
        f("rope_cos", rope_cos);
        f("rope_sin", rope_sin);
    }
};

/// Epilogue output: the denoiser prediction for the image tokens {C_out, L_img, N} (FLUX.1 is
/// trained on the flow-matching velocity: noise - x0).
struct FluxOutputs {
    ggml_tensor* sample = nullptr;
};

/// One FLUX.1 double-stream block (FluxTransformerBlock). Parameters as listed in the file comment.
class FluxDoubleBlock : public nn::Block {
public:
    explicit FluxDoubleBlock(const FluxDiTConfig& cfg);
    /// img {D, Li, N}, txt {D, Lt, N}, temb {D, N}, rope tables {head_dim/2, Lt + Li}: updates img and txt.
    void forward(nn::Ctx& c, ggml_tensor*& img, ggml_tensor*& txt, ggml_tensor* temb, ggml_tensor* cos, ggml_tensor* sin) const;
    int64_t hidden, heads, head_dim;
    nn::Linear *norm1, *norm1_context;
    nn::Linear *to_q, *to_k, *to_v, *to_out, *add_q, *add_k, *add_v, *to_add_out;
    nn::RMSNorm *norm_q, *norm_k, *norm_added_q, *norm_added_k;
    nn::Linear *ff_in, *ff_out, *ffc_in, *ffc_out;
};

/// One FLUX.1 single-stream block (FluxSingleTransformerBlock).
class FluxSingleBlock : public nn::Block {
public:
    explicit FluxSingleBlock(const FluxDiTConfig& cfg);
    /// x {D, L, N} (the joint [txt, img] stream), temb {D, N}, rope tables {head_dim/2, L}: returns x'.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* temb, ggml_tensor* cos, ggml_tensor* sin) const;
    int64_t hidden, heads, head_dim, mlp_hidden;
    nn::Linear* norm;
    nn::Linear *to_q, *to_k, *to_v, *proj_mlp, *proj_out;
    nn::RMSNorm *norm_q, *norm_k;
};

/// The FLUX.1 DiT module tree and its typed block sequence.
class FluxDiT : public nn::Block, public nn::Sequence<FluxInputs, FluxState, FluxOutputs> {
public:
    /// `final_shift_first`: norm_out.linear's rows are (shift, scale) as BFL stores them,
    /// instead of diffusers' (scale, shift).
    explicit FluxDiT(const FluxDiTConfig& cfg, bool final_shift_first = false);
    const FluxDiTConfig& config() const { return cfg_; }

    int n_blocks() const override { return cfg_.n_double + cfg_.n_single; }
    /// Validates the input shapes (Error(InvalidInput) naming the mismatch), embeds them.
    FluxState prologue(nn::Ctx& c, const FluxInputs& in) const override;
    FluxState block(nn::Ctx& c, int i, FluxState s) const override;
    FluxOutputs epilogue(nn::Ctx& c, FluxState s) const override;
    const nn::Block& block_params(int i) const override;

private:
    FluxDiTConfig cfg_;
    bool final_shift_first_;
    nn::Linear *x_embedder_, *context_embedder_;
    nn::Linear *t1_, *t2_, *g1_ = nullptr, *g2_ = nullptr, *p1_, *p2_;
    std::vector<FluxDoubleBlock*> double_;
    std::vector<FluxSingleBlock*> single_;
    nn::Linear *norm_out_, *proj_out_;
};

/// A FLUX.1 DiT with its parameters loaded.
struct FluxDiTModel {
    std::unique_ptr<FluxDiT> module;
    nn::ParamBuffer params;
    FluxSource source;

    /// Finds the DiT in `index` (find_flux_dit), infers the config, binds and loads it into
    /// `buft` with `opt` (opt.weight_type = --type). `axes_dims`, when non-empty, replaces the
    /// default rotary axes. Throws Error(ModelMismatch) when no FLUX.1 DiT is found or keys
    /// mismatch, Error(OutOfMemory) when the buffer cannot be allocated.
    static FluxDiTModel load(const io::WeightIndex& index, ggml_backend_buffer_type_t buft, const nn::LoadOptions& opt = {},
                             const std::vector<int>& axes_dims = {});
};

}  // namespace easel::models::flux
