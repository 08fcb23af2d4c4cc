// The AutoencoderKL decoder (SD, FLUX.1, Z-Image, FLUX.2 VAEs; models/vae/autoencoder_kl.h) run
// under a placement: what a family uses for its `vae` module when placement flags are given
// (--backend "vae=A&B" layer split, --params-backend vae=cpu|disk, --max-vram segments), and the
// planner inputs of the decoder (Family::placement_costs, --auto-fit).
//
// The decoder is an nn::Sequence (prologue post_quant_conv + conv_in, blocks = mid resnets /
// attention and up-block resnets / upsamplers, epilogue norm + SiLU + conv_out), so this is a
// PlacedSequence over it, built decoder-only with the loader's key map and load options
// (weights F32, as vae::AutoencoderKLModel keeps them). Tiled decode (--vae-tiling) follows
// vae::decode_with exactly; each tile is one evaluation of the placed sequence. A decode is
// planned at its largest graph, the first tile (the tiles at the latent's right and bottom edges
// are cropped, smaller): every tile of the decode runs under that plan.
#pragma once

#include "io/weight_index.h"
#include "models/vae/autoencoder_kl.h"
#include "placement/plan.h"
#include "runtime/placed_sequence.h"

#include <map>
#include <memory>
#include <string>

namespace easel::vae {

/// Where a family's AutoencoderKL lies: the weight index (kept by reference: it must outlive
/// whatever is built from this), the source found by vae::find_autoencoder_kl (prefix, layout;
/// it must hold a decoder) and the overrides (norm groups from config.json).
struct VaeDecoderSource {
    const io::WeightIndex* index = nullptr;
    vae::KLSource src;
    vae::KLOverrides overrides;
};

/// Planner inputs of the decoder (module PModule::Vae) for a batch-1 latent of h x w cells as
/// it will be decoded with `tiling`: costed at the largest graph of the decode (the first tile,
/// vae::decode_graph_latent, when `tiling` tiles it; else h x w). Parameter bytes per block as
/// loaded (F32); compute buffers measured with ggml's graph allocator. Also fills
/// ModuleCosts::flops: the FLOPs of the whole untiled decode graph of h x w (the job's latent,
/// also when the bytes are measured at a tile; the overlap a tiled decode recomputes is not in
/// it), and ModuleCosts::measure_tile (one tile x tile tile, clipped to h x w, as one graph on a device;
/// the graphs of each tile size are built once and kept) and latent_h / latent_w = h, w.
/// Nothing is loaded. Throws Error(ModelMismatch) when the source holds no decoder or its keys
/// do not describe an AutoencoderKL, Error(InvalidInput) for a tile size that is not a positive
/// multiple of the VAE factor.
placement::ModuleCosts vae_decoder_costs(const VaeDecoderSource& s, int threads, bool flash_attn, int64_t h, int64_t w,
                              const vae::TilingOptions& tiling = {});

/// An AutoencoderKL decoder whose parameters are placed by a ModulePlan (a PlacedSequence over
/// the decoder sequence, under the spec's `vae` entry).
class PlacedVaeDecoder {
public:
    /// s: the decoder's weights (its index must outlive this); spec: the resolved placement.
    /// Reads headers only. Throws as vae_decoder_costs.
    PlacedVaeDecoder(const VaeDecoderSource& s, placement::PlacementSpec spec, int threads, bool flash_attn);
    ~PlacedVaeDecoder();
    PlacedVaeDecoder(const PlacedVaeDecoder&) = delete;
    PlacedVaeDecoder& operator=(const PlacedVaeDecoder&) = delete;

    const vae::AutoencoderKLConfig& config() const;

    /// The plan of one decode graph of a latent [n, L, h, w], without loading anything. Throws
    /// Error(OutOfMemory) with the planner's message when it does not fit.
    placement::ModulePlan plan(int64_t n, int64_t h, int64_t w);

    /// Raw latent [N, L, h, w] -> image [N, out, h*f, w*f] (about [-1, 1]), tiled as
    /// vae::decode_with decides (each tile one evaluation of the sequence). Plans (at the first,
    /// largest tile; the other tiles run under that plan) and loads on the first call and when a
    /// decode's largest graph has another shape (the plan table is logged). Outputs
    /// are bitwise those of vae::AutoencoderKLModel::decode on the same devices' ops. Throws as
    /// vae::decode_with, plan() and runtime::SequenceRunner::run().
    vae::HostTensor decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling = {});

    /// The plan in use (no segments before the first decode()).
    const placement::ModulePlan& current_plan() const { return placed_.current_plan(); }
    /// Measured peak bytes per device since construction (empty before the first decode()).
    std::map<std::string, uint64_t> peaks() const { return placed_.peaks(); }
    /// Parameter bytes the current plan loads (0 before the first decode()).
    uint64_t param_bytes() const;

private:
    using Placed = runtime::PlacedSequence<vae::KLDecodeInputs, vae::KLDecodeState, ggml_tensor*>;
    struct Model;                   // the decoder-only tree, its TensorSource and load options
    std::unique_ptr<Model> model_;  // before placed_, which refers into it
    Placed placed_;
};

}  // namespace easel::vae
