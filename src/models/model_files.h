// Small helpers every family uses while finding and loading its modules.
#pragma once

#include "io/weight_index.h"
#include "models/vae/autoencoder_kl.h"
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

/// Latent channels of the AutoencoderKL `src` in `index`, read from one header (nothing else of
/// the VAE is inferred): the input channels of decoder.conv_in.weight [C, latent, 3, 3], else
/// half the output channels of encoder.conv_out.weight [2 latent, C, 3, 3]; 0 when neither is
/// there or its shape is not 4-D.
int64_t kl_latent_channels(const io::WeightIndex& index, const vae::KLSource& src);

/// Refuses a VAE whose latent channels (kl_latent_channels) are not `want`, before its
/// configuration is inferred (a wrong kind of VAE would otherwise stop at a config-level check
/// such as its group count), in one line naming the flag, the kind found and the kind needed:
/// "--vae F: an SD VAE (4 latent channels); Z-Image needs the FLUX.1 VAE (16 latent channels,
/// ae.safetensors)". `flag_and_path` e.g. "--vae ae.safetensors"; `family` e.g. "Z-Image";
/// `needed` e.g. "the FLUX.1 VAE (16 latent channels, ae.safetensors)". Unknown channel counts
/// (0) pass. Throws Error(ModelMismatch).
void check_vae_kind(const io::WeightIndex& index, const vae::KLSource& src, int64_t want, const std::string& flag_and_path,
                    const std::string& family, const std::string& needed);

}  // namespace easel::models
