// FLUX.2 VAE latent space (diffusers AutoencoderKLFlux2,
// diffusers/models/autoencoders/autoencoder_kl_flux2.py, and Flux2KleinPipeline).
//
// The FLUX.2 VAE is an AutoencoderKL (vae::AutoencoderKLModel loads and runs it: 32 latent
// channels, spatial factor 8) plus a BatchNorm2d(4 * latent_channels, affine=False) whose
// running statistics normalise the 2x2-patchified latent the DiT works on:
//   diffusion latent = (patchify(vae latent) - running_mean) / sqrt(running_var + eps)
//   vae latent       = unpatchify(diffusion latent * sqrt(running_var + eps) + running_mean)
// patchify: [N, C, H, W] -> [N, 4C, H/2, W/2], channel c*4 + dy*2 + dx (Flux2Pipeline._patchify_latents).
// eps is the config's batch_norm_eps (1e-4), not stored in the weights.
//
// Host tensors are vae::HostTensor [N, C, H, W] (W fastest).
#pragma once

#include "io/weight_index.h"
#include "models/vae/host_tensor.h"

#include <string>
#include <vector>

namespace easel::models::flux {

/// The BatchNorm statistics of a FLUX.2 VAE.
struct Flux2LatentStats {
    std::vector<float> mean;  ///< running_mean [4L]
    std::vector<float> var;   ///< running_var [4L]
    float eps = 1e-4f;        ///< batch_norm_eps

    /// Reads bn.running_mean / bn.running_var (prefixes "", "vae.", "first_stage_model.") from
    /// `index`; eps from the config.json beside the weights ("batch_norm_eps") when present.
    /// Throws Error(ModelMismatch) when the statistics are missing or their sizes differ.
    static Flux2LatentStats load(const io::WeightIndex& index);
};

/// [N, C, H, W] -> [N, 4C, H/2, W/2] (Flux2Pipeline._patchify_latents). Throws
/// Error(InvalidInput) on odd H or W.
vae::HostTensor patchify_2x2(const vae::HostTensor& z);
/// [N, 4C, h, w] -> [N, C, 2h, 2w] (Flux2Pipeline._unpatchify_latents). Throws
/// Error(InvalidInput) when the channel count is not a multiple of 4.
vae::HostTensor unpatchify_2x2(const vae::HostTensor& z);

/// VAE latent [N, L, H, W] -> diffusion latent [N, 4L, H/2, W/2] (patchify, normalise).
/// Throws Error(InvalidInput) when 4L differs from the statistics' size.
vae::HostTensor flux2_vae_to_diffusion(const vae::HostTensor& z, const Flux2LatentStats& s);
/// Diffusion latent [N, 4L, h, w] -> VAE latent [N, L, 2h, 2w] (de-normalise, unpatchify), as
/// Flux2KleinPipeline does before vae.decode.
vae::HostTensor flux2_diffusion_to_vae(const vae::HostTensor& x, const Flux2LatentStats& s);

/// Flux2KleinPipeline._pack_latents: [N, C, h, w] -> tokens [N, h*w, C] (row-major, token
/// y*w + x), the DiT's hidden_states.
std::vector<float> flux2_pack_tokens(const vae::HostTensor& x);
/// The inverse for tokens in grid order (Flux2KleinPipeline._unpack_latents_with_ids with the
/// ids of flux2_image_ids(h, w)): tokens [N, h*w, C] -> [N, C, h, w]. Throws
/// Error(InvalidInput) when the size is not n*c*h*w.
vae::HostTensor flux2_unpack_tokens(const std::vector<float>& tokens, int64_t n, int64_t c, int64_t h, int64_t w);

}  // namespace easel::models::flux
