// sd-cli's placement flags (stable-diffusion.cpp docs/backend.md; easel docs/placement.md),
// bound to a placement::PlacementFlags.
#pragma once

#include "placement/spec.h"

#include <CLI/CLI.hpp>

namespace easel::cli {

/// Adds --backend, --params-backend, --split-mode, --max-vram, --headroom, --stream-layers,
/// --offload-to-cpu, --clip-on-cpu, --vae-on-cpu and --auto-fit to `app`, bound to `f`.
inline void add_placement_options(CLI::App& app, placement::PlacementFlags& f) {
    const char* g = "Placement (docs/placement.md)";
    app.add_option("--backend", f.backend,
                   "Device per module: NAME, or MODULE=NAME,... (diffusion, te/clip, vae, controlnet, upscaler; all=/*= default); "
                   "A&B splits a module over devices; auto, gpu")
        ->group(g);
    app.add_option("--params-backend", f.params_backend, "Where weights live: same syntax as --backend plus disk (no device lists)")->group(g);
    app.add_option("--split-mode", f.split_mode, "layer or row (global or MODULE=MODE,...); row: tensor parallelism on ggml's meta device where the module has rules (the SD UNet, the Z-Image, FLUX.1 and FLUX.2 Klein DiTs), else layer split with a warning")->group(g);
    app.add_option("--max-vram", f.max_vram, "Budget in GiB, global or DEV=GiB,...; 0 = no cap; negative = free memory minus N GiB")->group(g);
    app.add_option("--headroom", f.headroom, "MiB kept free per device, global or DEV=MiB,... (default 0)")->group(g);
    app.add_flag("--stream-layers", f.stream_layers, "Stream diffusion blocks from RAM to the device (with --params-backend diffusion=cpu)")->group(g);
    app.add_flag("--offload-to-cpu", f.offload_to_cpu, "Keep weights in RAM (= --params-backend '*=cpu' first)")->group(g);
    app.add_flag("--clip-on-cpu", f.clip_on_cpu, "Run the text encoder on the CPU (= --backend te=cpu first)")->group(g);
    app.add_flag("--vae-on-cpu", f.vae_on_cpu, "Run the VAE on the CPU (= --backend vae=cpu first)")->group(g);
    app.add_flag("--auto-fit", f.auto_fit,
                 "Place every module from measured sizes (docs/placement.md --auto-fit); explicit --backend/--params-backend entries are kept; "
                 "prints the plan as explicit flags")
        ->group(g);
}

}  // namespace easel::cli
