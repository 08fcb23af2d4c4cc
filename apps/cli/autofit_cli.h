// --auto-fit for `easel generate` and `easel plan` (docs/placement.md "--auto-fit"): gathers
// the planner's inputs for a generate job (the family's per-module costs at the job's shapes,
// the devices' budgets, max allocation sizes, measured host-to-device bandwidth, host RAM),
// runs placement::auto_fit and rewrites the job's placement flags to the plan's explicit ones.
#pragma once

#include "pipeline/generate_params.h"
#include "placement/autofit.h"

namespace easel::cli {

/// Plans `p` with --auto-fit and replaces p.placement (and, when the plan tiles the VAE,
/// p.vae_tiling / p.vae_tile_size) with the plan's explicit flags; the user's explicit
/// --backend / --params-backend entries (and --clip-on-cpu, --vae-on-cpu, --offload-to-cpu)
/// are kept, --max-vram / --headroom carried over; a --split-mode row entry makes the planner
/// row split the device lists it chooses where the module can be (the plan's --split-mode then
/// names those modules only). Opens the model files (headers only; nothing is loaded) and
/// benchmarks each device (matmul FLOP/s, host-to-device bandwidth; placement::DeviceSpeedCache,
/// skipped with EASEL_AUTOFIT_BENCH=0). Compute-buffer and device measurements are cached under
/// the cache folder (<cache>/autofit/) unless --no-cache. Throws Error(OutOfMemory) with the planner's
/// "nothing fits" message, and as models::open_family / parse_placement.
placement::FitResult apply_auto_fit(pipeline::GenerateParams& p);

}  // namespace easel::cli
