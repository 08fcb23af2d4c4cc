// LatentFormat: how a family's diffusion model sees the VAE's latent space.
//
// The VAE itself works on raw latents (what AutoencoderKL::encode returns as the mean and what
// decode takes). The diffusion model is trained on normalised latents:
//   normalised = (raw - shift_factor) * scaling_factor          (after encode)
//   raw        = normalised / scaling_factor + shift_factor      (before decode)
// as diffusers' pipelines do (e.g. FluxPipeline: `(latents / vae.config.scaling_factor) +
// vae.config.shift_factor` before vae.decode). The numbers belong to the family/pipeline; this
// struct only carries them.
#pragma once

#include <cstdint>
#include <span>

namespace easel::vae {

/// Latent channels, spatial factor and normalisation constants of one latent space.
struct LatentFormat {
    int64_t channels = 4;        ///< latent channels C of a latent [N, C, H/f, W/f]
    int spatial_factor = 8;      ///< image pixels per latent pixel along each axis (f)
    float scaling_factor = 1.0f; ///< multiplies (raw - shift) after encode
    float shift_factor = 0.0f;   ///< subtracted from raw latents before scaling

    /// SD 1.x / 2.x VAE: 4 channels, f 8, scale 0.18215, no shift (diffusers vae config).
    static LatentFormat sd1() { return {4, 8, 0.18215f, 0.0f}; }
    /// SDXL VAE: 4 channels, f 8, scale 0.13025, no shift.
    static LatentFormat sdxl() { return {4, 8, 0.13025f, 0.0f}; }
    /// FLUX.1 / Z-Image VAE: 16 channels, f 8, scale 0.3611, shift 0.1159.
    static LatentFormat flux1() { return {16, 8, 0.3611f, 0.1159f}; }

    /// raw VAE latent -> diffusion-model latent, in place: x = (x - shift) * scale.
    void normalise(std::span<float> x) const {
        for (float& v : x) v = (v - shift_factor) * scaling_factor;
    }
    /// diffusion-model latent -> raw VAE latent, in place: x = x / scale + shift.
    void denormalise(std::span<float> x) const {
        for (float& v : x) v = v / scaling_factor + shift_factor;
    }
};

}  // namespace easel::vae
