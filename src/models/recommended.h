// The sampling settings a model file recommends in its metadata: the easel.* keys of
// docs/formats.md ("Recommended sampling settings in a file's metadata"). The pipeline uses each
// one over Family::defaults() where the user gave no flag for it (pipeline/generate.cpp).
#pragma once

#include "models/family.h"

#include <map>
#include <optional>
#include <string>

namespace easel::io {
struct MetaValue;
}

namespace easel::models {

/// easel.sampler, easel.scheduler, easel.cfg_scale, easel.steps, easel.width, easel.height of one
/// file, checked. Each key the file lacks stays empty.
struct RecommendedSettings {
    std::optional<std::string> sampler;    ///< a --sampling-method name (sampling::resolve_sampler_name accepts it)
    std::optional<std::string> scheduler;  ///< a --scheduler name (sampling::resolve_scheduler_name accepts it)
    std::optional<float> cfg_scale;        ///< finite, > 0
    std::optional<int> steps;              ///< 1 .. 10000
    std::optional<int> width, height;      ///< pixels: multiples of 8, 8 .. 16384
    std::string file;                      ///< the file they were read from (for logs)
    bool empty() const { return !sampler && !scheduler && !cfg_scale && !steps && !width && !height; }
};

/// Reads the easel.* keys from a weight file's metadata (safetensors __metadata__ strings; GGUF
/// strings or numbers); `file` names the file in errors. Throws Error(InvalidInput), one line
/// naming the file, the key, its value and the fix, for a value that is not valid (an unknown
/// sampler or scheduler name, steps outside 1 .. 10000, a CFG scale <= 0, a size that is not a
/// multiple of 8 ...).
RecommendedSettings read_recommended(const std::map<std::string, io::MetaValue>& metadata, const std::string& file);

/// The recommended settings of the file that holds the diffusion model (--diffusion-model, else
/// -m; of a diffusers folder the unet / transformer folder), headers only. Empty when there is
/// none, the path does not exist (open_family reports that) or it is a PyTorch pickle (.ckpt,
/// .pt, .pth, .bin: no such keys). Throws as the overload above, and Error(Io) / Error(InvalidInput)
/// as io::WeightIndex::open for an unreadable or malformed file.
RecommendedSettings read_recommended(const ModelFiles& files);

}  // namespace easel::models
