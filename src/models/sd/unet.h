// The SD1.x/SD2.x UNet (diffusers UNet2DConditionModel) as a typed sequence of blocks.
//
//   prologue   time embedding (sinusoidal -> time_embedding.linear_1 -> SiLU -> linear_2),
//              plus, for SDXL (text_time), add_embedding(concat(text_embeds, sinusoidal(time_ids)));
//              conv_in; pushes the first skip
//   block[i]   in order:
//                Down   down_blocks.b.resnets.j (+ attentions.j); pushes a skip
//                Downsample down_blocks.b.downsamplers.0; pushes a skip
//                Mid    the whole mid_block (resnet, attention, resnet)
//                Up     pops a skip, concatenates it (channels), up_blocks.b.resnets.j
//                       (+ attentions.j) (+ upsamplers.0 after the block's last resnet)
//   epilogue   conv_norm_out -> SiLU -> conv_out
//
// The state between blocks (UNetState) is the running hidden state, the activated time
// embedding, the conditioning and the skip stack, so a runtime can cut the sequence anywhere.
// Order of operations follows diffusers/models/unets/unet_2d_condition.py forward().
//
// Later (designed for, not built): ControlNet residuals are added to every skip and to the mid output in the
// Mid block (diffusers down_block_additional_residuals / mid_block_additional_residual).
#pragma once

#include "models/sd/unet_blocks.h"
#include "models/sd/unet_config.h"
#include "nn/sequence.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace easel::models::sd {

/// Inputs of one UNet evaluation (all F32).
struct UNetInputs {
    ggml_tensor* sample = nullptr;    ///< latent x_t [N, Cin, H, W], ne {W, H, Cin, N}; any H, W >= 1
    ggml_tensor* timestep = nullptr;  ///< [N], ne {N}: per-sample timestep, fractional allowed (0..1000 scale)
    ggml_tensor* context = nullptr;   ///< conditioning [N, L, Dctx], ne {Dctx, L, N} (text encoder hidden states)
    /// SDXL (UNetConfig::has_add_embedding) only, else null: the pooled text embedding
    /// [N, add_text_dim], ne {add_text_dim, N} (OpenCLIP-G text_embeds) and the micro-conditioning
    /// time ids [N, add_time_ids], ne {add_time_ids, N} (pixels: original h, w, crop top, left,
    /// target h, w; the refiner: original h, w, crop top, left, aesthetic score).
    ggml_tensor* text_embeds = nullptr;
    ggml_tensor* time_ids = nullptr;
};

/// What flows between blocks (an nn::SequenceState). Nothing is recomputed: every tensor a
/// later block reads is here.
struct UNetState {
    ggml_tensor* h = nullptr;         ///< hidden state {W, H, C, N}
    ggml_tensor* temb = nullptr;      ///< silu(time embedding) {Temb, N}: what every resnet consumes
    ggml_tensor* context = nullptr;   ///< {Dctx, L, N}
    std::vector<ggml_tensor*> skips;  ///< skip stack, bottom (conv_in output) first

    /// Calls f on "h", "temb", "context", then "skip.0" .. "skip.{n-1}" (bottom first).
    void visit_tensors(const nn::StateTensorFn& f);
};

/// One entry of the UNet's block sequence: a grouping Block (empty name) whose children are
/// added under their full diffusers paths, so block_params(i) is one subtree and parameter
/// names stay the checkpoint names.
class UNetUnit : public nn::Block {
public:
    /// Kind of an entry of the block sequence.
    enum class Kind { Down, Downsample, Mid, Up };
    Kind kind = Kind::Down;
    int block = 0;  ///< down/up block index
    int layer = 0;  ///< resnet index inside the block
    ResnetBlock2D* resnet = nullptr;
    Transformer2D* attn = nullptr;
    Downsample2D* down = nullptr;
    Upsample2D* up = nullptr;
    std::vector<ResnetBlock2D*> mid_resnets;  ///< Mid: resnets[0], (attentions[i], resnets[i+1])...
    std::vector<Transformer2D*> mid_attns;
};

/// The UNet: a Block tree whose parameter names are the diffusers names, run as an
/// nn::Sequence (see nn/sequence.h). Outputs: the eps / v prediction [N, out, H, W], ne {W, H, out, N}.
class UNet2DCondition : public nn::Block, public nn::Sequence<UNetInputs, UNetState, ggml_tensor*> {
public:
    using Kind = UNetUnit::Kind;

    /// Builds the tree for `cfg` (from infer_unet_config()).
    explicit UNet2DCondition(UNetConfig cfg);

    const UNetConfig& config() const { return cfg_; }

    int n_blocks() const override { return (int)units_.size(); }
    /// Kind of entry i.
    Kind block_kind(int i) const { return units_.at((size_t)i)->kind; }
    /// Readable name of entry i, e.g. "down_blocks.0.resnets.1+attentions.1".
    std::string block_name(int i) const;
    /// The parameters of entry i (visit_params("") gives their full diffusers names).
    const nn::Block& block_params(int i) const override { return *units_.at((size_t)i); }
    /// Parameters of the prologue (time_embedding, add_embedding, conv_in) and epilogue (conv_norm_out, conv_out).
    void visit_prologue_params(const std::function<void(const std::string&, nn::Param&)>& fn);
    void visit_epilogue_params(const std::function<void(const std::string&, nn::Param&)>& fn);

    /// Checks input shapes against the config: sample {W, H, in_channels, N} with W, H >= 1,
    /// timestep {N}, context {context_dim, L >= 1, N}, for SDXL text_embeds {add_text_dim, N}
    /// and time_ids {add_time_ids, N}, all F32. Throws Error(InvalidInput).
    void validate(const UNetInputs& in) const;

    /// Time embedding and conv_in; returns the state before block 0. Validates the inputs first.
    UNetState prologue(nn::Ctx& c, const UNetInputs& in) const override;
    /// Entry i on the state leaving entry i-1. Entries must run in order.
    UNetState block(nn::Ctx& c, int i, UNetState s) const override;
    /// conv_norm_out, SiLU, conv_out: returns eps / v prediction [N, out, H, W], ne {W, H, out, N}.
    ggml_tensor* epilogue(nn::Ctx& c, UNetState s) const override;

private:
    UNetConfig cfg_;
    nn::Conv2d* conv_in_;
    nn::Linear* time_linear_1_;
    nn::Linear* time_linear_2_;
    nn::Linear* add_linear_1_ = nullptr;
    nn::Linear* add_linear_2_ = nullptr;
    nn::GroupNorm* conv_norm_out_;
    nn::Conv2d* conv_out_;
    std::vector<UNetUnit*> units_;
};

/// A UNet with its parameters loaded.
struct LoadedUNet {
    std::unique_ptr<UNet2DCondition> net;
    nn::ParamBuffer params;
};

/// infer_unet_config(index, ov), builds the tree and loads its parameters into `buft` through
/// make_unet_source(). Throws as infer_unet_config() and nn::ParamBuffer::load().
LoadedUNet load_unet(const io::WeightIndex& index, ggml_backend_buffer_type_t buft, const UNetOverrides& ov = {},
                     const nn::LoadOptions& opt = {});

}  // namespace easel::models::sd
