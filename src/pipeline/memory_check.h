// Refusing a job whose memory cannot exist, before anything is allocated.
//
// The placement planner's predictions (placement/plan.h: parameter bytes per block from the
// headers, compute buffers sized with ggml's graph allocator on a no_alloc graph) are compared
// with what the machine has: host RAM for the CPU (which the planner treats as unlimited) and
// each device's total memory on the plain path. A job past them stops with one line giving the
// numbers and the changes that shrink the need (a smaller -W/-H, --vae-tiling, flash attention),
// instead of a failed malloc after the text encoder ran.
#pragma once

#include "placement/plan.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace easel::pipeline {

/// Physical host RAM in bytes (platform::physical_memory_bytes); 0 when unknown.
uint64_t host_ram_bytes();

/// What one module needs of one device when it runs whole there (the plain path: its weights on
/// the device and one graph over all its blocks).
struct MemoryNeed {
    placement::PModule module = placement::PModule::Diffusion;
    std::string device;     ///< ggml device name ("CPU", "CUDA0" ...)
    uint64_t params = 0;    ///< parameter bytes (every block + prologue/epilogue), at the loaded types
    uint64_t compute = 0;   ///< compute buffer of the whole graph (ModuleCosts::measure(0, n, true, true))
    uint64_t total() const { return params + compute; }
};

/// The job's settings that decide which changes can shrink a need (for the message).
struct MemoryJob {
    int width = 0, height = 0;       ///< pixels
    bool flash_attn = false;         ///< --fa (every module, the VAE's attention too)
    bool diffusion_fa = false;       ///< --fa or --diffusion-fa
    bool vae_tiling = false;         ///< --vae-tiling
};

/// The whole-module needs of `costs` (models::Family::placement_costs at the job's latent) on the
/// devices `device_of` names per module. Measures each graph once (nothing is allocated).
std::vector<MemoryNeed> whole_module_needs(const std::vector<placement::ModuleCosts>& costs,
                                           const std::function<std::string(placement::PModule)>& device_of);

/// Throws Error(OutOfMemory) when a need exceeds its device's memory (`capacity(device)` bytes;
/// 0 = unknown, not checked), in one line naming the first such module in `needs`' order (the
/// run order) and its fixes, then any later one with its own: "diffusion needs 128.2 GiB on CPU
/// at 4096x4096 (parameters 0.0 GiB + compute 128.2 GiB) but host RAM is 31.3 GiB: use a smaller
/// -W/-H or --diffusion-fa (flash attention); vae needs 256.4 GiB too: use ...". Modules run one
/// at a time (the pipeline frees each before the next), so each need is compared alone.
void check_needs_fit(const std::vector<MemoryNeed>& needs, const MemoryJob& job,
                     const std::function<uint64_t(const std::string&)>& capacity);

/// For placed jobs: the planner leaves the CPU unbudgeted; throws Error(OutOfMemory) as
/// check_needs_fit when a stage's predicted bytes on the CPU (placement::device_peaks, plus the
/// host RAM the stage's plans hold for their weights) exceed `host_ram` bytes (0: not checked).
void check_plans_fit_host(const std::vector<placement::ModulePlan>& plans, const MemoryJob& job, uint64_t host_ram);

/// The one-line refusal of check_needs_fit for `module` needing `params` + `compute` bytes on
/// `device` that has `capacity` bytes (exposed for tests).
std::string memory_refusal(placement::PModule module, const std::string& device, uint64_t params, uint64_t compute, uint64_t capacity,
                           const MemoryJob& job);

}  // namespace easel::pipeline
