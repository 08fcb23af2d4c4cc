// The SD1.x/SD2.x UNet run under a placement: what `easel generate` uses for the diffusion
// module when placement flags are given (--backend with a device list, --params-backend,
// --max-vram, --stream-layers ...). The plan depends on the job's shapes (latent size,
// context length), so it is made on the first evaluation and again when the shapes change.
#pragma once

#include "models/sd/unet.h"
#include "placement/plan.h"
#include "runtime/placed_sequence.h"
#include "runtime/sequence_runner.h"

#include <memory>
#include <span>

namespace easel::models::sd {

/// Planner inputs of the SD UNet (its weights in `index`, configuration `cfg`) for a batch of
/// `n` latents [n, Cin, h, w] with a context of `tokens` x context_dim, without loading
/// anything (self_contained_costs). `index` must outlive the returned callbacks.
placement::ModuleCosts unet_costs(const io::WeightIndex& index, const UNetConfig& cfg, nn::LoadOptions lo, int threads, bool flash_attn,
                       int64_t n, int64_t h, int64_t w, int64_t tokens);

/// A UNet whose parameters are placed by a placement::ModulePlan (a PlacedSequence over the UNet).
class PlacedUNet {
public:
    /// index/cfg: the UNet's weights and configuration (kept by reference: must outlive this);
    /// lo: load options (--type); spec: the resolved placement (its diffusion entry is used).
    PlacedUNet(const io::WeightIndex& index, const UNetConfig& cfg, nn::LoadOptions lo, placement::PlacementSpec spec, int threads,
               bool flash_attn);
    ~PlacedUNet();

    /// Plans for a batch of `n` latents [n, Cin, h, w] with a context of `tokens` x context_dim
    /// without loading anything. Throws Error(OutOfMemory) when the plan does not fit.
    placement::ModulePlan plan(int64_t n, int64_t h, int64_t w, int64_t tokens);

    /// One evaluation: x [n, Cin, h, w], timesteps [n], context [n, tokens, D] (PyTorch order),
    /// for SDXL UNets the pooled text embeddings [n, add_text_dim] and time ids [n, add_time_ids]
    /// -> prediction [n, Cout, h, w]. Plans and loads on the first call and when the shapes
    /// change (the plan table is logged). Throws as plan() and SequenceRunner::run().
    void run(std::span<const float> x, int64_t n, int64_t h, int64_t w, std::span<const float> t, std::span<const float> context,
             int64_t tokens, std::span<float> out, std::span<const float> text_embeds = {}, std::span<const float> time_ids = {});

    /// The plan in use (empty before the first run()).
    const placement::ModulePlan& current_plan() const { return placed_.current_plan(); }
    /// Measured peaks per device of the loaded runner (empty before the first run()).
    std::map<std::string, uint64_t> peaks() const;
    /// Stages Host/Disk weights for a phase of several run() calls (the denoising loop).
    void begin_phase();
    void end_phase();

private:
    using Placed = runtime::PlacedSequence<UNetInputs, UNetState, ggml_tensor*>;

    UNetConfig cfg_;
    nn::TensorSource src_;
    std::unique_ptr<UNet2DCondition> net_;
    Placed placed_;
};

}  // namespace easel::models::sd
