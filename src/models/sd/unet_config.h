// Configuration of the SD1.x/SD2.x UNet (diffusers UNet2DConditionModel), inferred from weights.
//
// Every dimension that the weights show is read from them: in/out channels and kernel of
// conv_in/conv_out, the time embedding widths, per block the number of resnets and their
// in/out channels (conv1.weight [out, in, k, k]), whether a block has attentions, their
// transformer depth (count of transformer_blocks.k), projection kind (proj_in.weight rank 2 =
// Linear = SD2 "use_linear_projection", rank 4 = 1x1 Conv = SD1), the cross-attention width
// (attn2.to_k.weight [inner, context_dim]), the feed-forward width, down/up samplers.
//
// Two things cannot be seen in weights: the number of attention heads and the GroupNorm group
// count. They come, in order of precedence, from UNetOverrides (tests, CLI), a diffusers
// config.json (unet_overrides_from_diffusers_config()), or the family convention: SD1.x uses 8
// heads (1x1 conv projection), SD2.x/SDXL a head size of 64 (linear projection); 32 groups.
//
// Key layouts: diffusers names (conv_in.weight, down_blocks.0.resnets.0.conv1.weight, ...) are
// canonical. The original LDM layout (model.diffusion_model.input_blocks.1.0.in_layers.0.weight,
// middle_block, output_blocks, time_embed.0, out.2, ...) is read through a key map derived from
// the inferred structure (unet_ldm_key()). Mapping facts from diffusers'
// loaders/single_file_utils.py (convert_ldm_unet_checkpoint).
#pragma once

#include "io/weight_index.h"
#include "nn/block.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace easel::models::sd {

/// Which naming the stored UNet weights use.
enum class UNetKeyLayout {
    Diffusers,  ///< conv_in.weight, down_blocks.i.resnets.j..., mid_block, up_blocks
    Ldm,        ///< input_blocks.N.M..., middle_block, output_blocks, time_embed, out (CompVis/A1111 files)
};

/// Settings that the weights do not show. Unset fields fall back to config.json / convention.
struct UNetOverrides {
    /// Heads per down block (diffusers order, one entry per down block, or one entry for all);
    /// the mid block uses the last entry and up block i uses entry (n-1-i), as diffusers does.
    std::optional<std::vector<int>> num_heads;
    /// Head size for every attention (heads = channels / head_dim). Ignored if num_heads is set.
    std::optional<int> head_dim;
    std::optional<int> norm_groups;        ///< GroupNorm groups of resnets, transformers and conv_norm_out
    std::optional<float> norm_eps;         ///< eps of resnet GroupNorms, conv_norm_out and LayerNorms (1e-5)
    std::optional<bool> flip_sin_to_cos;   ///< timestep embedding order [cos, sin] (true for SD)
    std::optional<float> freq_shift;       ///< timestep embedding downscale_freq_shift (0 for SD)
    /// SDXL text_time conditioning: width of the sinusoidal embedding of each of the 6 time ids
    /// (diffusers addition_time_embed_dim; 256 for SDXL base/refiner/SSD-1B).
    std::optional<int> addition_time_embed_dim;
    /// Where these values came from, for logs ("config.json", "test override", ...).
    std::string source;
};

/// Reads the fields of a diffusers UNet2DConditionModel config.json object that the weights do
/// not show: heads (num_attention_heads, or attention_head_dim when that is null: diffusers'
/// naming quirk, see unet_2d_condition.py), norm_num_groups, norm_eps, flip_sin_to_cos,
/// freq_shift. Throws Error(InvalidInput) on a field of the wrong type.
UNetOverrides unet_overrides_from_diffusers_config(const nlohmann::json& config);

/// Parses a diffusers config.json file with unet_overrides_from_diffusers_config().
/// Throws Error(Io) if unreadable, Error(InvalidInput) if not valid JSON.
UNetOverrides unet_overrides_from_file(const std::filesystem::path& config_json);

/// diffusers ResnetBlock2D (models/resnet.py) as SD uses it; shapes from its weights.
struct ResnetSpec {
    int64_t in = 0;          ///< conv1.weight [out, in, 3, 3]
    int64_t out = 0;
    int64_t temb = 0;        ///< time_emb_proj.weight [out, temb]
    bool shortcut = false;   ///< conv_shortcut present (1x1 conv, in != out)
};

/// diffusers Transformer2DModel (continuous input) with BasicTransformerBlocks.
struct TransformerSpec {
    int64_t channels = 0;     ///< in/out channels of the block (norm, residual)
    int64_t inner = 0;        ///< proj_in output width = heads * head_dim
    int depth = 1;            ///< number of transformer_blocks
    int heads = 1;
    int64_t head_dim = 0;
    int64_t context_dim = 0;  ///< attn2.to_k.weight [inner, context_dim]
    int64_t ff_inner = 0;     ///< ff.net.2.weight [inner, ff_inner] (GEGLU proj is [2*ff_inner, inner])
    bool linear_proj = false; ///< proj_in/proj_out are Linear (SD2) rather than 1x1 Conv (SD1)
};

/// One diffusers down block (CrossAttnDownBlock2D or DownBlock2D).
struct DownBlockSpec {
    std::vector<ResnetSpec> resnets;
    std::vector<TransformerSpec> attentions;  ///< empty, or one per resnet
    bool downsample = false;                  ///< downsamplers.0.conv (3x3, stride 2, padding 1)
};

/// UNetMidBlock2DCrossAttn: resnets[0], then (attentions[i], resnets[i+1]) pairs.
struct MidBlockSpec {
    bool present = false;
    std::vector<ResnetSpec> resnets;
    std::vector<TransformerSpec> attentions;  ///< resnets.size()-1 entries, or empty (UNetMidBlock2D)
};

/// One diffusers up block (CrossAttnUpBlock2D or UpBlock2D). Resnet i's input is the running
/// hidden state concatenated (channels) with one skip from the stack.
struct UpBlockSpec {
    std::vector<ResnetSpec> resnets;
    std::vector<TransformerSpec> attentions;
    bool upsample = false;  ///< upsamplers.0.conv: nearest x2 (or to the skip size) then 3x3 conv
};

/// The complete structure of one UNet, every size known.
struct UNetConfig {
    UNetKeyLayout layout = UNetKeyLayout::Diffusers;
    bool conv_direct = false;      ///< --diffusion-conv-direct: k > 1 convolutions as ggml_conv_2d_direct (execution only)
    std::string prefix;            ///< prefix of the stored names ("model.diffusion_model." etc.)

    int64_t in_channels = 4;       ///< 4, or 9 for in-painting (conv_in.weight [C0, in, k, k])
    int64_t out_channels = 4;      ///< conv_out.weight [out, C0, k, k]
    int64_t model_channels = 0;    ///< C0 = conv_in output width
    int conv_in_kernel = 3, conv_out_kernel = 3;
    int64_t time_proj_dim = 0;     ///< sinusoidal embedding width (time_embedding.linear_1.weight [temb, dim])
    int64_t time_embed_dim = 0;    ///< temb width
    int64_t context_dim = 0;       ///< cross-attention width of the first attention (0 if none)
    int layers_per_block = 0;      ///< resnets per down block (up blocks have one more)

    int norm_groups = 32;
    float norm_eps = 1e-5f;
    bool flip_sin_to_cos = true;
    float freq_shift = 0.0f;

    std::vector<DownBlockSpec> down;
    MidBlockSpec mid;
    std::vector<UpBlockSpec> up;

    /// SDXL-style UNets (diffusers addition_embed_type "text_time", SGM label_emb with
    /// adm_in_channels): add_embedding.linear_1 [time_embed_dim, add_embed_in] -> SiLU ->
    /// linear_2 [time_embed_dim, time_embed_dim], its output added to the time embedding. Its
    /// input is concat(text_embeds [add_text_dim], Timesteps(add_time_dim)(time_ids) flattened
    /// [add_time_ids * add_time_dim]), add_text_dim = add_embed_in - add_time_ids * add_time_dim
    /// (SDXL base: 2816 = 1280 + 6 * 256; the refiner: 2560 = 1280 + 5 * 256, its 5th id the
    /// aesthetic score).
    bool has_add_embedding = false;
    int64_t add_embed_in = 0;     ///< add_embedding.linear_1 input width
    int64_t add_time_dim = 256;   ///< addition_time_embed_dim
    int add_time_ids = 6;         ///< number of time ids (6: base (orig h, w, crop top, left, target h, w); 5: refiner)
    int64_t add_text_dim = 0;     ///< pooled text embedding width (add_embed_in - add_time_ids * add_time_dim)
    /// Where heads/groups came from ("config.json", "SD1.x convention: 8 heads", ...).
    std::string heads_source;

    /// 2^(number of downsamplers): the factor the latent size must be divisible by to avoid
    /// size-matched upsampling (other sizes work too, as in diffusers).
    int64_t downsample_factor() const;
    /// One-line description (blocks, channels, heads) for logs.
    std::string summary() const;
};

/// Infers the UNet structure from the tensors of `index` (diffusers or LDM names, with or
/// without the "model.diffusion_model." / "unet." prefix). `ov` supplies heads/groups/etc.;
/// fields it leaves unset come from index.config() (a diffusers config.json beside the
/// weights) when there is one, else from the family convention.
/// Throws Error(ModelMismatch) when the weights are not a UNet2DConditionModel, and
/// Error(InvalidInput) when a channel count does not divide by the heads or groups given.
UNetConfig infer_unet_config(const io::WeightIndex& index, const UNetOverrides& ov = {});

/// True when the UNet's transformers project with Linear layers (diffusers
/// use_linear_projection, ldm use_linear_in_transformer: SD2.x and SDXL) rather than 1x1
/// convolutions (SD1.x). False for a UNet without attention.
bool uses_linear_projection(const UNetConfig& cfg);

/// The LDM name (without prefix) of a canonical diffusers UNet name, for the structure in
/// `cfg` (which must have uniform layers_per_block). Names not of the UNet come back empty.
/// E.g. "down_blocks.1.resnets.0.norm1.weight" -> "input_blocks.4.0.in_layers.0.weight" (L=2).
std::string unet_ldm_key(const UNetConfig& cfg, const std::string& canonical);

/// A TensorSource over `index` that resolves canonical diffusers names for `cfg`'s layout and
/// prefix. The source refers to `index`, which must outlive it.
nn::TensorSource make_unet_source(const io::WeightIndex& index, const UNetConfig& cfg);

}  // namespace easel::models::sd
