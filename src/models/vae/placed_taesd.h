// TAESD / TAEF2 decoders (models/vae/taesd.h) in the placement accounting: a tiny autoencoder
// runs whole on the first device of the `vae` entry (it is a few MB: no layer split, no
// params-backend), and the plan shows it as the vae module's row, costed like the other modules
// (parameter bytes as loaded, F32; compute buffer measured with ggml's graph allocator at the
// job's latent shape on the planned device).
#pragma once

#include "io/weight_index.h"
#include "placement/plan.h"
#include "placement/spec.h"

#include <optional>
#include <string>

namespace easel::vae {

/// Planner inputs of the TAESD decoder found in `index` (vae::find_taesd) for a batch-1 raw
/// latent of h x w cells (ggml ne {w, h, L, 1}): module PModule::Vae, one block holding every
/// parameter (F32, nn::param_bytes), `measure` = the compute buffer of the whole decode graph on
/// the device (ggml_gallocr_reserve_n_size on its buffer type), as vae::run_image_graph
/// allocates it; `flops` = the FLOPs of that whole decode graph (runtime::graph_flops; 0 for an
/// empty block range). Nothing is loaded on a device (the graph's parameters are bound to a host
/// buffer for the measurement). Throws Error(ModelMismatch) when `index` holds no TAESD decoder,
/// Error(InvalidInput) for an empty latent.
placement::ModuleCosts taesd_decoder_costs(const io::WeightIndex& index, int64_t h, int64_t w, bool conv_direct = false);

/// The spec TAESD is planned under: `spec` with its vae entry reduced to the first device and
/// its parameters on it (a tiny autoencoder is never split or staged). When the vae entry listed
/// two or more devices, `warning` gets "TAESD runs whole on DEV: it is too small to split".
placement::PlacementSpec taesd_spec(const placement::PlacementSpec& spec, std::optional<std::string>* warning = nullptr);

/// Measured peak of a TAESD decode on its device: the decoder's parameter buffer bytes plus the
/// compute buffer bytes of the decode graph.
inline uint64_t taesd_measured_peak(uint64_t param_buffer_bytes, uint64_t compute_bytes) { return param_buffer_bytes + compute_bytes; }

}  // namespace easel::vae
