// The diffusion module slot of the SD-family UNets (SD1.x/SD2.x and SDXL): the UNet loaded whole
// or under a placement plan, its file and its costs, in one place for both families.
#pragma once

#include "io/weight_index.h"
#include "models/family.h"
#include "models/module_set.h"
#include "models/sd/placed_unet.h"
#include "models/sd/unet.h"
#include "runtime/graph_runner.h"

#include <memory>
#include <string>

namespace easel::models::sd {

/// The UNet loaded whole on FamilyOptions::diffusion_device: its runner and parameters.
struct UNetWhole {
    std::unique_ptr<runtime::GraphRunner> runner;
    LoadedUNet unet;
    size_t param_bytes() const { return unet.params.size(); }
};

/// The hooks of an SD-family diffusion slot over the UNet in `index` (configuration `cfg`, read
/// at open): load_whole on opt.diffusion_device (a load that finds no such UNet is refused as
/// Error(ModelMismatch) naming `family`, "SD1.x/SD2.x", and the fix), load_placed under
/// opt.placement (planned on the first evaluation: the plan needs the shapes), files = `src`'s
/// path, costs = a batch-1 evaluation at the job's latent with a 77-token context. `index`,
/// `src`, `cfg` and `opt` are kept by reference: the family's members, which outlive its slots.
ModuleSlot<UNetWhole, PlacedUNet>::Hooks unet_slot_hooks(const io::WeightIndex& index, const ModuleSource& src, const UNetConfig& cfg,
                                                         const FamilyOptions& opt, ggml_type weight_type, std::string family);

}  // namespace easel::models::sd
