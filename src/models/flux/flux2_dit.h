// FLUX.2 DiT ([klein] 4B/9B and [dev]): diffusers' Flux2Transformer2DModel
// (diffusers/models/transformers/transformer_flux2.py) as a Block tree with diffusers naming
// and as an nn::Sequence.
//
// Differences from FLUX.1 (flux_dit.h): no biases anywhere; the adaLN modulation layers are
// shared by all blocks of a kind (double_stream_modulation_img/txt [6D, D],
// single_stream_modulation [3D, D], applied to silu(temb) once, in the prologue); no pooled
// text vector; the MLPs are SwiGLU (linear_in [2M, D] -> silu(first half) * second half ->
// linear_out [D, M], M = mlp_ratio * D, mlp_ratio 3); the single blocks fuse q|k|v|mlp_in in
// attn.to_qkv_mlp_proj [3D + 2M, D] and attn|mlp out in attn.to_out [D, D + M]; RoPE over 4
// position axes (t, h, w, l), theta 2000.
//
// Canonical names (diffusers):
//   x_embedder.weight [D, C_in], context_embedder.weight [D, J] (J = 3 x Qwen3 hidden for klein)
//   time_guidance_embed.timestep_embedder.linear_{1,2} [D, 256], [D, D]
//   time_guidance_embed.guidance_embedder.linear_{1,2} (guidance-distilled variants only)
//   double_stream_modulation_img.linear, double_stream_modulation_txt.linear, single_stream_modulation.linear
//   transformer_blocks.N.attn.{to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out}.weight [D, D]
//   transformer_blocks.N.attn.norm_{q,k,added_q,added_k}.weight [head_dim]
//   transformer_blocks.N.{ff,ff_context}.linear_in [2M, D], .linear_out [D, M]
//   single_transformer_blocks.N.attn.{to_qkv_mlp_proj, to_out, norm_q, norm_k}
//   norm_out.linear [2D, D] (scale rows, then shift), proj_out [C_out, D]
// The BFL / ComfyUI layout (img_in, txt_in, time_in, guidance_in, *_modulation_*.lin,
// double_blocks.N.{img,txt}_attn.qkv (sliced), .norm.{query,key}_norm.scale, .proj,
// {img,txt}_mlp.{0,2}, single_blocks.N.linear1/linear2/norm.*, final_layer.*) maps onto it;
// facts from diffusers/loaders/single_file_utils.py (convert_flux2_transformer_checkpoint_to_diffusers).
//
// Sequence: prologue = embeddings + the shared modulation vectors; blocks 0 .. n_double-1 double
// stream, then n_single single-stream blocks (one index space); epilogue = norm_out + proj_out
// on the image tokens. State as FLUX.1's (img/txt, then joint [txt, img]) plus the modulation
// vectors.
//
// Tensor layout (ggml order): img tokens {C_in, L_img, N}; txt {J, L_txt, N}; timestep {N};
// rotary tables {head_dim/2, L_txt + L_img} from rope_tables(ids, axes, 2000) with 4-axis ids.
#pragma once

#include "io/weight_index.h"
#include "models/flux/flux_common.h"
#include "models/flux/flux_dit.h"
#include "nn/layers.h"
#include "nn/sequence.h"

#include <optional>
#include <string>
#include <vector>

namespace easel::models::flux {

/// Finds a FLUX.2 DiT in `index` (prefixes "", "model.diffusion_model.", "transformer.",
/// "diffusion_model."; diffusers keys double_stream_modulation_img.linear.weight +
/// transformer_blocks.0.attn.to_q.weight, or BFL double_stream_modulation_img.lin.weight +
/// double_blocks.0.img_attn.qkv.weight). nullopt when there is none.
std::optional<FluxSource> find_flux2_dit(const io::WeightIndex& index);

/// Architecture of a FLUX.2 DiT; sizes inferred from the weights, rotary axes/theta not.
struct Flux2DiTConfig {
    int64_t in_channels = 128;    ///< token features in (32 latent channels x 2x2 patch)
    int64_t out_channels = 128;
    int64_t hidden = 3072;        ///< D (klein 4B: 3072, klein 9B: 4096)
    int64_t head_dim = 128;
    int64_t heads = 24;
    int64_t mlp_hidden = 9216;    ///< M = 3 D
    int64_t joint_dim = 7680;     ///< context features (3 x Qwen3 hidden: 4B 7680, 9B 12288)
    int64_t time_channels = 256;
    int n_double = 5;
    int n_single = 20;
    bool guidance_embeds = false; ///< klein: false
    std::vector<int> axes_dims{32, 32, 32, 32};  ///< see default_flux2_axes
    double theta = 2000.0;        ///< rope_theta
};

/// RoPE axes for a head size: four equal axes of head_dim/4 (the real models: (32,32,32,32)
/// for head_dim 128; the tiny fixture: (4,4,4,4) for 16). Throws Error(InvalidInput) when
/// head_dim/4 is not a positive even number.
std::vector<int> default_flux2_axes(int64_t head_dim);

/// Infers the configuration from the weights under `src` (axes / theta from a config.json
/// beside the weights when present, apply_rope_config). Throws Error(ModelMismatch).
Flux2DiTConfig infer_flux2_dit_config(const io::WeightIndex& index, const FluxSource& src);

/// Binds the canonical names to the BFL layout (renames, row slices); no-op for diffusers.
void configure_flux2_source(nn::TensorSource& ts, const Flux2DiTConfig& cfg, const FluxSource& src);

/// Graph inputs of the FLUX.2 DiT.
struct Flux2Inputs {
    ggml_tensor* img = nullptr;       ///< F32 {C_in, L_img, N} (hidden_states; reference-image tokens appended after the noisy ones)
    ggml_tensor* txt = nullptr;       ///< F32 {J, L_txt, N} (encoder_hidden_states)
    ggml_tensor* timestep = nullptr;  ///< F32 {N}: sigma (t/1000), multiplied by 1000 here
    ggml_tensor* guidance = nullptr;  ///< F32 {N}; required when guidance_embeds, else ignored
    ggml_tensor* rope_cos = nullptr;  ///< F32 {head_dim/2, L_txt + L_img}: rope_tables of [txt_ids; img_ids]
    ggml_tensor* rope_sin = nullptr;
};

/// State between blocks: as FluxState, plus the shared modulation vectors mod_img/mod_txt
/// {6D, N} (double blocks) and mod_single {3D, N}.
struct Flux2State {
    ggml_tensor* img = nullptr;
    ggml_tensor* txt = nullptr;
    ggml_tensor* joint = nullptr;
    ggml_tensor* temb = nullptr;
    ggml_tensor* mod_img = nullptr;
    ggml_tensor* mod_txt = nullptr;
    ggml_tensor* mod_single = nullptr;
    ggml_tensor* rope_cos = nullptr;
    ggml_tensor* rope_sin = nullptr;
    int64_t n_txt = 0;
    /// Names: "img", "txt" or "joint", then "temb", "mod_img", "mod_txt", "mod_single", "rope_cos", "rope_sin".
    void visit_tensors(const nn::StateTensorFn& f) {
        if (img) f("img", img);
        if (txt) f("txt", txt);
        if (joint) f("joint", joint);
        f("temb", temb);
        f("mod_img", mod_img);
        f("mod_txt", mod_txt);
        f("mod_single", mod_single);
        f("rope_cos", rope_cos);
        f("rope_sin", rope_sin);
    }
};

/// One FLUX.2 double-stream block (Flux2TransformerBlock).
class Flux2DoubleBlock : public nn::Block {
public:
    explicit Flux2DoubleBlock(const Flux2DiTConfig& cfg);
    /// img {D, Li, N}, txt {D, Lt, N}, mod_img/mod_txt {6D, N}, rope {head_dim/2, Lt+Li}.
    void forward(nn::Ctx& c, ggml_tensor*& img, ggml_tensor*& txt, ggml_tensor* mod_img, ggml_tensor* mod_txt, ggml_tensor* cos,
                 ggml_tensor* sin) const;
    int64_t hidden, heads, head_dim, mlp_hidden;
    nn::Linear *to_q, *to_k, *to_v, *to_out, *add_q, *add_k, *add_v, *to_add_out;
    nn::RMSNorm *norm_q, *norm_k, *norm_added_q, *norm_added_k;
    nn::Linear *ff_in, *ff_out, *ffc_in, *ffc_out;
};

/// One FLUX.2 single-stream block (Flux2SingleTransformerBlock with Flux2ParallelSelfAttention).
class Flux2SingleBlock : public nn::Block {
public:
    explicit Flux2SingleBlock(const Flux2DiTConfig& cfg);
    /// x {D, L, N} (joint [txt, img]), mod {3D, N}, rope {head_dim/2, L}: returns x'.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x, ggml_tensor* mod, ggml_tensor* cos, ggml_tensor* sin) const;
    int64_t hidden, heads, head_dim, mlp_hidden;
    nn::Linear *qkv_mlp, *to_out;
    nn::RMSNorm *norm_q, *norm_k;
};

/// The FLUX.2 DiT module tree and its typed block sequence.
class Flux2DiT : public nn::Block, public nn::Sequence<Flux2Inputs, Flux2State, FluxOutputs> {
public:
    /// `final_shift_first`: norm_out.linear rows stored (shift, scale) as BFL does.
    explicit Flux2DiT(const Flux2DiTConfig& cfg, bool final_shift_first = false);
    const Flux2DiTConfig& config() const { return cfg_; }

    int n_blocks() const override { return cfg_.n_double + cfg_.n_single; }
    /// Validates the input shapes (Error(InvalidInput)), embeds them, computes the modulations.
    Flux2State prologue(nn::Ctx& c, const Flux2Inputs& in) const override;
    Flux2State block(nn::Ctx& c, int i, Flux2State s) const override;
    FluxOutputs epilogue(nn::Ctx& c, Flux2State s) const override;
    const nn::Block& block_params(int i) const override;

private:
    Flux2DiTConfig cfg_;
    bool final_shift_first_;
    nn::Linear *x_embedder_, *context_embedder_;
    nn::Linear *t1_, *t2_, *g1_ = nullptr, *g2_ = nullptr;
    nn::Linear *mod_img_, *mod_txt_, *mod_single_;
    std::vector<Flux2DoubleBlock*> double_;
    std::vector<Flux2SingleBlock*> single_;
    nn::Linear *norm_out_, *proj_out_;
};

/// A FLUX.2 DiT with its parameters loaded.
struct Flux2DiTModel {
    std::unique_ptr<Flux2DiT> module;
    nn::ParamBuffer params;
    FluxSource source;

    /// Finds (find_flux2_dit), infers, binds and loads into `buft`. `axes_dims` non-empty
    /// replaces the default axes. Throws Error(ModelMismatch) / Error(OutOfMemory).
    static Flux2DiTModel load(const io::WeightIndex& index, ggml_backend_buffer_type_t buft, const nn::LoadOptions& opt = {},
                              const std::vector<int>& axes_dims = {});
};

}  // namespace easel::models::flux
