// The AutoencoderKL encoder (SD, FLUX.1, Z-Image, FLUX.2 VAEs; models/vae/autoencoder_kl.h) run
// under a placement: what a family uses for the encode stage (img2img -i, in-painting's masked
// image, FLUX.2 Klein's reference images -r, `easel encode-image`) when placement flags are
// given. It runs under the spec's `vae` entry, like the decoder (--backend "vae=A&B" layer split,
// --params-backend vae=cpu|disk, --max-vram segments), in its own pipeline stage
// (kVaeEncodeStage: the encoder is loaded before the prompts' denoising and freed after).
//
// The encoder is an nn::Sequence (vae::KLEncoderSequence: prologue conv_in, blocks = down-block
// resnets / downsamplers and the mid block's resnets / attention, epilogue norm + SiLU +
// conv_out + quant_conv), so this is a PlacedSequence over it, built encoder-only with the
// loader's key map and load options (weights F32, as vae::AutoencoderKLModel keeps them). Tiled
// encode (--vae-tiling) follows vae::encode_moments_with exactly; each tile is one evaluation of
// the placed sequence. An encode is planned at its largest graph, the first tile (the tiles at
// the image's right and bottom edges are cropped, smaller): every tile runs under that plan.
#pragma once

#include "models/vae/placed_decoder.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace easel::vae {

/// Where a family's AutoencoderKL lies (the same description as the decoder's; the source must
/// hold an encoder).
using VaeEncoderSource = VaeDecoderSource;

/// Planner inputs of the encoder (module PModule::Vae, stage kVaeEncodeStage) for a batch-1
/// image of H x W pixels as it will be encoded with `tiling`: costed at the largest graph of the
/// encode (the first tile, vae::encode_graph_image). Parameter bytes per block as loaded (F32);
/// compute buffers measured with ggml's graph allocator. Nothing is loaded. Throws
/// Error(ModelMismatch) when the source holds no encoder, Error(InvalidInput) for an image size
/// that is not a positive multiple of the VAE factor or a bad tile size.
placement::ModuleCosts vae_encoder_costs(const VaeEncoderSource& s, int threads, bool flash_attn, int64_t H, int64_t W,
                                         const vae::TilingOptions& tiling = {});

/// The plans of the encode stage for images of the given sizes ({H, W} pixels each; an empty
/// list gives no plan): one plan, of the largest encode graph among them (by pixels; the
/// PlacedVaeEncoder replans a smaller image at run time, keeping the loaded weights when the
/// segments are the same), under spec's `vae` entry and `budgets`, with stage kVaeEncodeStage.
/// Throws as vae_encoder_costs and plan_module.
std::vector<placement::ModulePlan> plan_vae_encode(const VaeEncoderSource& s, const placement::PlacementSpec& spec,
                                                   const std::map<std::string, uint64_t>& budgets, int threads, bool flash_attn,
                                                   const std::vector<std::pair<int64_t, int64_t>>& sizes, const vae::TilingOptions& tiling = {});

/// Planner inputs of the encode stage for images of the given sizes ({H, W} pixels each): the
/// costs of the largest encode graph among them (by pixels, as plan_vae_encode plans it), with
/// tiling applied as vae::encode_graph_image decides. std::nullopt for an empty list. Nothing is
/// loaded. Throws as vae_encoder_costs (Error(InvalidInput) for a size that is not a positive
/// multiple of the VAE factor).
std::optional<placement::ModuleCosts> encode_stage_costs(const VaeEncoderSource& s, int threads, bool flash_attn,
                                                         const std::vector<std::pair<int64_t, int64_t>>& sizes, const vae::TilingOptions& tiling = {});

/// The plan of the encode stage from its costs (encode_stage_costs): plan_module under spec's
/// `vae` entry and `budgets` (no streaming), with ModulePlan::stage = kVaeEncodeStage. Throws as
/// plan_module; its Error(OutOfMemory) message is prefixed "the image encode (vae-encode stage,
/// the VAE encoder): ".
placement::ModulePlan plan_encode_stage(const placement::ModuleCosts& costs, const placement::PlacementSpec& spec,
                                        const std::map<std::string, uint64_t>& budgets);

/// The tiling a family plans its VAE graphs at: tiles of `tile_cells` latent cells (0 = whole,
/// tiling off), i.e. tile_size = tile_cells x `spatial_factor` image pixels, the default
/// overlap (which changes no graph size). Throws nothing.
vae::TilingOptions planned_tiling(int tile_cells, int spatial_factor);

/// The sizes {H, W} (pixels) rounded down to a multiple of `multiple` (the family's pixel
/// granularity, e.g. 8 for SD, 16 for FLUX.1 and Z-Image), at least one multiple per side: what the
/// families resize an init image to before encoding it. Throws nothing.
std::vector<std::pair<int64_t, int64_t>> encode_sizes_at(const std::vector<std::pair<int64_t, int64_t>>& sizes, int64_t multiple);

/// An AutoencoderKL encoder whose parameters are placed by a ModulePlan (a PlacedSequence over
/// the encoder sequence, under the spec's `vae` entry; plans carry stage kVaeEncodeStage).
class PlacedVaeEncoder {
public:
    /// s: the encoder's weights (its index must outlive this); spec: the resolved placement.
    /// Reads headers only. Throws Error(ModelMismatch) when the source holds no encoder.
    PlacedVaeEncoder(const VaeEncoderSource& s, placement::PlacementSpec spec, int threads, bool flash_attn);
    ~PlacedVaeEncoder();
    PlacedVaeEncoder(const PlacedVaeEncoder&) = delete;
    PlacedVaeEncoder& operator=(const PlacedVaeEncoder&) = delete;

    const vae::AutoencoderKLConfig& config() const;

    /// The plan of one encode graph of an image [n, in, H, W], without loading anything. Throws
    /// Error(OutOfMemory) with the planner's message when it does not fit.
    placement::ModulePlan plan(int64_t n, int64_t H, int64_t W);

    /// Image [N, in, H, W] in [-1, 1] -> raw moments [N, 2L, H/f, W/f] (mean, then unclamped
    /// logvar), tiled as vae::encode_moments_with decides (each tile one evaluation). Plans (at
    /// the first, largest tile) and loads on the first call and when an encode's largest graph has
    /// another shape (the plan table is logged). Outputs are bitwise those of
    /// vae::AutoencoderKLModel::encode_moments on the same devices' ops. Throws as
    /// vae::encode_moments_with, plan() and runtime::SequenceRunner::run().
    vae::HostTensor encode_moments(const vae::HostTensor& image, const vae::TilingOptions& tiling = {});
    /// encode_moments() split into the posterior (vae::moments_to_dist).
    vae::LatentDist encode(const vae::HostTensor& image, const vae::TilingOptions& tiling = {});

    /// The plan in use (no segments before the first encode); stage kVaeEncodeStage.
    const placement::ModulePlan& current_plan() const { return plan_; }
    /// Measured peak bytes per device since construction (empty before the first encode).
    std::map<std::string, uint64_t> peaks() const { return placed_.peaks(); }
    /// Parameter bytes the current plan loads (0 before the first encode).
    uint64_t param_bytes() const;

private:
    using Placed = runtime::PlacedSequence<vae::KLEncodeInputs, vae::KLEncodeState, ggml_tensor*>;
    struct Model;                   // the encoder-only tree, its TensorSource and load options
    std::unique_ptr<Model> model_;  // before placed_, which refers into it
    Placed placed_;
    placement::ModulePlan plan_;  // placed_'s plan with the stage set
};

}  // namespace easel::vae
