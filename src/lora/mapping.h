// A LoRA file against a model: which patches go where, whether the file was made for this
// model at all, and the one warning that names what is left out.
//
// The check works on names and shapes only (the file's header and the model's headers), so a
// LoRA for another family or size is refused before any weight is read or any graph runs:
//   "LoRA 'x' targets FLUX.1 (hidden 3072), the model is Z-Image (hidden 3840): use a LoRA made for Z-Image"
// Families easel does not run (Qwen-Image, SD3, Anima/Cosmos, Krea 2) are named as such.
#pragma once

#include "lora/key_map.h"
#include "lora/lora_file.h"

#include <string>
#include <vector>

namespace easel::lora {

/// A patch whose name and shapes fit the model.
struct MappedPatch {
    size_t patch = 0;                ///< index into ParsedLora::patches
    int component = -1;              ///< index into KeyMap::components()
    std::vector<Destination> dest;   ///< rows of its update -> targets
};

/// The outcome of mapping a file's patches onto a KeyMap.
struct Mapping {
    std::vector<MappedPatch> mapped;
    std::vector<std::string> unmapped;    ///< module names that match no weight of the model
    std::vector<std::string> mismatched;  ///< "module -> target: LoRA [a, b] vs model [c, d]" (name fits, shape does not)
};

/// Maps every patch of `p` (whose tensors are described by `tensors`, for the DoRA magnitude
/// shapes) onto `km`, checking rows, per-row sizes, biases and DoRA magnitudes.
Mapping map_patches(const ParsedLora& p, const std::vector<io::TensorInfo>& tensors, const KeyMap& km);

/// The model a LoRA is applied to, for messages and the family check.
struct ModelInfo {
    std::string family;          ///< "SD1.x", "SD2.x", "SDXL", "Z-Image", "FLUX.1", "FLUX.2 Klein"
    int64_t width = 0;           ///< hidden size of the DiT, or the UNet's cross-attention (context) width
    std::string width_name = "hidden";  ///< "hidden" or "context"
};

/// What a LoRA's names and shapes say it was made for (messages only; the fit is decided by
/// map_patches).
struct LoraTarget {
    std::string family;          ///< as io::detect names it ("FLUX.1", "FLUX.2", "Qwen-Image", "SD1.x", ...); "" when unknown
    int64_t width = 0;           ///< the most common input width of its diffusion-model patches (UNet: attn2.to_k input)
    std::string width_name = "hidden";
    bool control = false;        ///< a FLUX Control LoRA (full tensors beside the pairs, a widened img_in)
    /// The family was assumed from thin evidence (only transformer_blocks: Qwen-Image / SD3 vs a FLUX
    /// LoRA of the double blocks alone; a UNet LoRA without cross-attention keys).
    bool weak = false;
};

/// Guesses the target of a LoRA (see LoraTarget).
LoraTarget guess_target(const std::vector<io::TensorInfo>& tensors, const ParsedLora& p);

/// Whether easel runs models of the family io::detect names `family`.
bool family_supported(const std::string& family);

/// Decides whether the LoRA `name` may be applied to `model`. Throws Error(ModelMismatch) with
/// one line naming the family and size the LoRA was made for (when its names say) when: a
/// patch's shapes disagree with the model; no patch matches; some patches match nothing and its
/// names point to another family; or its names point firmly to a family easel does not run
/// (Qwen-Image, SD3, Anima/Cosmos, Krea 2) or to a FLUX Control LoRA. A LoRA that fits the model
/// exactly although its names only weakly suggest another family (transformer_blocks alone) is
/// applied, with a warning. Returns the warning to print (empty when none): that, the modules
/// that match nothing and the tensors of no LoRA kind, named (the first few) and counted, and
/// bundled embeddings, which are not applied.
std::string check_fit(const std::string& name, const std::vector<io::TensorInfo>& tensors, const ParsedLora& p, const Mapping& m,
                      const ModelInfo& model);

}  // namespace easel::lora
