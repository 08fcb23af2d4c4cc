// Live previews of a job while it is denoised, made from the model's denoised estimate of the
// last step (sampling::Sampler::denoised(), what A1111's live preview shows).
//
//   proj: a linear map of the latent channels to RGB, at the latent's resolution (one pixel per
//         latent cell): AUTOMATIC1111's "Approx cheap" factors for the 4-channel SD1.x / SD2.x
//         latent (modules/sd_vae_approx.py cheap_approximation); other latents have no
//         factors (proj_preview returns nothing).
//   vae:  the job's own decoder (VAE or TAESD) on the current latent (Generator::decode_preview),
//         full size, at the cost of one decode.
#pragma once

#include "pipeline/image_io.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace easel::server {

/// --preview: none, proj, vae, or auto (proj where the latent has factors, else none).
enum class PreviewMethod { None, Proj, Vae, Auto };
/// Parses a --preview value. Throws Error(InvalidInput) listing the names.
PreviewMethod parse_preview_method(const std::string& name);

/// The proj preview of a diffusion-space latent [channels, h, w] (w fastest): RGB [h, w, 3],
/// (sum_c latent[c] * factor[c][rgb] + 1) / 2 clamped to [0, 1], times 255. nullopt when there
/// are no factors for this many channels.
std::optional<pipeline::Image> proj_preview(std::span<const float> latent, int64_t channels, int64_t h, int64_t w);

}  // namespace easel::server
