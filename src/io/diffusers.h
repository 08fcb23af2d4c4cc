// Diffusers pipeline folders: model_index.json lists the components of a pipeline.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace easel::io {

/// One entry of a diffusers model_index.json: `"unet": ["diffusers", "UNet2DConditionModel"]`.
struct PipelineComponent {
    std::string name;        ///< component key ("unet", "vae", "text_encoder", "transformer", ...)
    std::string library;     ///< "diffusers", "transformers", ... (empty when null)
    std::string class_name;  ///< e.g. "AutoencoderKL" (empty when null)
    std::filesystem::path folder;  ///< pipeline_folder / name
};

/// Reads `folder/model_index.json` and returns its components (entries whose value is a
/// [library, class] pair, in file order; entries starting with '_' and null components are
/// skipped), plus `pipeline_class` from "_class_name" when `pipeline_class` is non-null.
/// Throws Error(Io) when model_index.json is missing/unreadable, Error(InvalidInput) when it
/// is not valid JSON or not an object.
std::vector<PipelineComponent> list_pipeline_components(const std::filesystem::path& folder,
                                                         std::string* pipeline_class = nullptr);

/// Whether `folder` is a diffusers pipeline folder (has model_index.json).
bool is_pipeline_folder(const std::filesystem::path& folder);

}  // namespace easel::io
