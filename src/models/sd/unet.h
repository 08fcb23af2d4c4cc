// The SD1.x/SD2.x UNet (diffusers UNet2DConditionModel) as a typed sequence of blocks.
//
//   prologue   time embedding (sinusoidal -> time_embedding.linear_1 -> SiLU -> linear_2),
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
// Later (designed for, not built): SDXL adds add_embedding (text_time) to the time embedding
// in the prologue; ControlNet residuals are added to every skip and to the mid output in the
// Mid block (diffusers down_block_additional_residuals / mid_block_additional_residual).
#pragma once

#include "models/sd/unet_blocks.h"
#include "models/sd/unet_config.h"

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
};

/// What flows between blocks.
struct UNetState {
    ggml_tensor* h = nullptr;         ///< hidden state {W, H, C, N}
    ggml_tensor* temb = nullptr;      ///< silu(time embedding) {Temb, N}: what every resnet consumes
    ggml_tensor* context = nullptr;   ///< {Dctx, L, N}
    std::vector<ggml_tensor*> skips;  ///< skip stack, bottom (conv_in output) first
};

/// The UNet: a Block tree whose parameter names are the diffusers names, and its block sequence.
class UNet2DCondition : public nn::Block {
public:
    /// Kind of an entry of the block sequence.
    enum class Kind { Down, Downsample, Mid, Up };

    /// Builds the tree for `cfg` (from infer_unet_config()). Throws Error(Unsupported) for an
    /// SDXL-style UNet (add_embedding) until that is implemented.
    explicit UNet2DCondition(UNetConfig cfg);

    const UNetConfig& config() const { return cfg_; }

    /// Number of entries in the block sequence.
    size_t num_blocks() const { return units_.size(); }
    /// Kind of entry i.
    Kind block_kind(size_t i) const { return units_.at(i).kind; }
    /// Readable name of entry i, e.g. "down_blocks.0.resnets.1+attentions.1".
    std::string block_name(size_t i) const;
    /// Calls fn(full_name, param) for every parameter entry i uses (prologue/epilogue: see below).
    void visit_block_params(size_t i, const std::function<void(const std::string&, nn::Param&)>& fn);
    /// Parameters of the prologue (time_embedding, conv_in) and epilogue (conv_norm_out, conv_out).
    void visit_prologue_params(const std::function<void(const std::string&, nn::Param&)>& fn);
    void visit_epilogue_params(const std::function<void(const std::string&, nn::Param&)>& fn);

    /// Checks input shapes against the config: sample {W, H, in_channels, N} with W, H >= 1,
    /// timestep {N}, context {context_dim, L >= 1, N}, all F32. Throws Error(InvalidInput).
    void validate(const UNetInputs& in) const;

    /// Time embedding and conv_in; returns the state before block 0. Validates the inputs.
    UNetState prologue(nn::Ctx& c, const UNetInputs& in) const;
    /// Runs entry i on the state. Entries must run in order 0..num_blocks()-1.
    void forward_block(nn::Ctx& c, size_t i, UNetState& s) const;
    /// conv_norm_out, SiLU, conv_out: returns eps / v prediction [N, out, H, W], ne {W, H, out, N}.
    ggml_tensor* epilogue(nn::Ctx& c, UNetState& s) const;

    /// The whole network: prologue, every block, epilogue.
    ggml_tensor* forward(nn::Ctx& c, const UNetInputs& in) const;

private:
    struct Unit {
        Kind kind;
        int block = 0;  ///< down/up block index
        int layer = 0;  ///< resnet index inside the block
        ResnetBlock2D* resnet = nullptr;
        Transformer2D* attn = nullptr;
        Downsample2D* down = nullptr;
        Upsample2D* up = nullptr;
        std::vector<std::pair<std::string, nn::Block*>> modules;  ///< full path -> module
    };

    UNetConfig cfg_;
    nn::Conv2d* conv_in_;
    nn::Linear* time_linear_1_;
    nn::Linear* time_linear_2_;
    std::vector<ResnetBlock2D*> mid_resnets_;
    std::vector<Transformer2D*> mid_attns_;
    nn::GroupNorm* conv_norm_out_;
    nn::Conv2d* conv_out_;
    std::vector<Unit> units_;
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
