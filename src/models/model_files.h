// Small helpers every family uses while finding and loading its modules.
#pragma once

#include "io/weight_index.h"
#include "nn/block.h"

#include <ggml.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

namespace easel::models {

/// Opens a weight file or folder named by a flag ("-m", "--vae" ...). Throws Error(Io) naming
/// the flag and the path when it does not exist; the WeightIndex's own errors otherwise.
std::unique_ptr<io::WeightIndex> open_index(const std::string& path, const std::string& flag);

/// A JSON file (config.json, scheduler_config.json ...): nullopt when it cannot be opened;
/// Error(InvalidInput) when it is not valid JSON.
std::optional<nlohmann::json> read_json(const std::filesystem::path& p);

/// --type NAME -> ggml type: any float type, or a quantised type ggml can quantise to
/// (case-insensitive ggml names: f32, f16, bf16, q8_0, q4_K ...). "" gives GGML_TYPE_COUNT
/// (keep the stored types). Throws Error(InvalidInput) for other names.
ggml_type parse_weight_type(const std::string& name);

/// Bytes of the parameters bound (ggml tensors attached) in a module tree.
size_t bound_bytes(const nn::Block& root);

}  // namespace easel::models
