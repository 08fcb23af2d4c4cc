// The ESRGAN upscaler (esrgan.h) as the `upscaler` placement module: what `easel upscale` and
// `--upscale-model` run. The network is an nn::Sequence, run by a PlacedSequence under the spec's
// `upscaler` entry (sd-cli's module name): its device (--backend upscaler=DEV, a default NAME, or
// the default device), its parameters' residency (--params-backend upscaler=cpu|disk), segments
// under --max-vram, a layer split over a device list; the plan is one tile's graph, a row of
// `easel plan`, and the measured peak per device is kept. Without placement flags the spec is the
// default one (every module on the first GPU, else the CPU, weights on it): one code path.
//
// The tile is chosen from the device's budget (choose_tile): the largest of the whole image and a
// ladder of tile sizes whose plan fits (the planner's budget for a GPU: free memory minus
// --headroom or --max-vram; for the CPU, which the planner leaves unbudgeted, 3/4 of the free RAM).
// Tiles overlap and are blended as models/esrgan/tiling.h describes.
#pragma once

#include "io/weight_index.h"
#include "models/esrgan/esrgan.h"
#include "runtime/placed_sequence.h"
#include "placement/plan.h"

#include <map>
#include <memory>
#include <string>

namespace easel::esrgan {

/// Planner inputs of the upscaler in `index` for one graph of an h x w input image (module
/// placement::PModule::Upscaler): parameter bytes per RRDB / compact unit as loaded (F32), compute buffers
/// measured with ggml's graph allocator, FLOPs of the graph. Nothing is loaded. Throws as
/// esrgan::infer_config (Error(ModelMismatch) for a file that is not an upscaler) and
/// Error(ModelMismatch) when the weights do not bind.
placement::ModuleCosts upscaler_costs(const io::WeightIndex& index, const std::string& label, int threads, int64_t h, int64_t w);

/// The upscaler of a weight file under a placement spec (see the file comment).
class PlacedUpscaler {
public:
    /// index: the upscaler's weights (kept by reference: must outlive this); label: the file name
    /// for messages; spec: the resolved placement (its upscaler entry is used). Reads headers only.
    /// Throws as upscaler_costs.
    PlacedUpscaler(const io::WeightIndex& index, const std::string& label, placement::PlacementSpec spec, int threads);
    ~PlacedUpscaler();
    PlacedUpscaler(const PlacedUpscaler&) = delete;
    PlacedUpscaler& operator=(const PlacedUpscaler&) = delete;

    const EsrganConfig& config() const;
    /// The device the upscaler runs on (the first of its spec entry).
    const std::string& device() const;

    /// The plan of one graph of an h x w input (a tile, or the whole image), without loading.
    /// Throws Error(OutOfMemory) with the planner's message when it does not fit.
    placement::ModulePlan plan(int64_t h, int64_t w);

    /// The tile side (input pixels, a multiple of the unshuffle factor) for an H x W image: 0 when
    /// the whole image fits the device's budget, else the largest of 1024, 768, 512, 384, 256, 192,
    /// 128, 96, 64, 48, 32 whose plan fits. Throws Error(OutOfMemory) naming the device, its budget
    /// and the smallest tile's need when none fits.
    int choose_tile(int64_t H, int64_t W);

    /// image [1, 3, H, W], RGB in [0, 1] -> [1, 3, H*s, W*s] (unclamped): padded by reflection to
    /// the unshuffle multiple, run whole (tile <= 0 or not smaller than the image) or in tiles of
    /// `tile` input pixels overlapping by `overlap` (< 0: esrgan::default_overlap with the network's
    /// esrgan::context_pixels), cropped back.
    /// The weights load on the first call and stay until the object is destroyed. `on_tile(done,
    /// total)` after each tile. Throws as plan() and the runtime.
    vae::HostTensor upscale(const vae::HostTensor& img, int tile, int overlap = -1, const std::function<void(int, int)>& on_tile = {});

    /// The plan in use (no segments before the first upscale()).
    const placement::ModulePlan& current_plan() const;
    /// Measured peak bytes per device since construction (empty before the first upscale()).
    std::map<std::string, uint64_t> peaks() const;
    /// Parameter bytes the current plan loads (0 before the first upscale()).
    uint64_t param_bytes() const;

private:
    struct Model;
    std::unique_ptr<Model> model_;
    std::unique_ptr<runtime::PlacedSequence<EsrganInputs, EsrganState, ggml_tensor*>> placed_;
    placement::PlacementSpec spec_;
};

}  // namespace easel::esrgan
