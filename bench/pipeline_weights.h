// A full-size Z-Image pipeline of made-up BF16 weights as three standalone safetensors files,
// each in the layout easel's ordinary load path reads (`easel generate --diffusion-model
// --llm --vae`), for the end-to-end placement runs of issue 10 (easel-bench-multigpu
// --write-pipeline DIR; bench/README.md):
//
//   DIR/z_image_dit.safetensors    Z-Image-Turbo transformer (turbo_config: dim 3840, 30 layers,
//                                  2 + 2 refiners), diffusers names; 6.15 G parameters, 12.3 GB
//   DIR/qwen3_4b.safetensors       Qwen3-4B text encoder (transformers Qwen3Model names, no
//                                  prefix, no lm_head: Qwen3-4B ties it to embed_tokens);
//                                  4.02 G parameters, 8.0 GB
//   DIR/flux1_vae.safetensors      FLUX.1 VAE (diffusers AutoencoderKL, 16 latent channels,
//                                  block_out_channels 128,256,512,512, no quant convs); 84 M, 0.17 GB
//
// Sizes are the released models' config.json values (Tongyi-MAI/Z-Image-Turbo transformer/,
// text_encoder/ (Qwen/Qwen3-4B) and vae/); the values are those of write_made_up_bf16 (uniform,
// norm scales 1), so the images are noise: the files exist to measure placement and memory.
#pragma once

#include "full_size_configs.h"
#include "made_up_weights.h"
#include "models/qwen3/qwen3.h"
#include "models/vae/autoencoder_kl.h"
#include "models/zimage/z_image_dit.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>

namespace easel::bench {

/// Qwen3-4B (Qwen/Qwen3-4B config.json) with `layers` decoder layers (36 for the real model):
/// hidden 2560, 32 heads x 128, 8 KV heads, intermediate 9728, vocab 151936, RMS eps 1e-6,
/// RoPE theta 1e6.
inline models::qwen3::Qwen3Config qwen3_4b_config(int layers) {
    models::qwen3::Qwen3Config c;
    c.vocab = 151936;
    c.hidden = 2560;
    c.layers = layers;
    c.heads = 32;
    c.kv_heads = 8;
    c.head_dim = 128;
    c.intermediate = 9728;
    c.eps = 1e-6f;
    c.rope_theta = 1e6f;
    return c;
}

/// The FLUX.1 VAE (black-forest-labs/FLUX.1-dev vae/config.json, also Z-Image's): AutoencoderKL
/// with 16 latent channels, block_out_channels 128,256,512,512, 2 resnets per level, 32 groups,
/// use_quant_conv / use_post_quant_conv false.
inline vae::AutoencoderKLConfig flux1_vae_config() {
    vae::AutoencoderKLConfig c;
    c.in_channels = c.out_channels = 3;
    c.latent_channels = 16;
    c.block_out_channels = {128, 256, 512, 512};
    c.layers_per_block = 2;
    c.norm_num_groups = 32;
    c.norm_eps = 1e-6f;
    c.use_quant_conv = c.use_post_quant_conv = false;
    return c;
}

/// Paths of the three files write_zimage_pipeline() writes.
struct PipelineFiles {
    std::filesystem::path dit, llm, vae;
};

/// Norm scales of the Z-Image DiT set to 1, except its pad tokens (Norm-role parameters too).
inline bool zimage_dit_ones(const std::string& name, nn::ParamRole role) {
    return role == nn::ParamRole::Norm && name.find("pad_token") == std::string::npos;
}

/// Writes the three files into `dir` (created when absent): the DiT with `dit_layers` main layers
/// (30: full size), the text encoder with `te_layers` layers (36: full size; Z-Image reads
/// hidden_states[-2], so at least 2), the VAE at full size. Files already present are kept when
/// `reuse` (they must have been written with the same options). The DiT is written on its own
/// thread beside the other two, each file generating `threads` tensors at a time (0: the
/// hardware's thread count).
/// Throws Error(InvalidInput) for layer counts out of range, Error(Io) when a file cannot be written.
inline PipelineFiles write_zimage_pipeline(const std::filesystem::path& dir, int dit_layers, int te_layers, uint64_t seed, bool reuse, int threads = 0) {
    if (threads <= 0) threads = (int)std::max(1u, std::thread::hardware_concurrency());
    if (dit_layers < 1 || dit_layers > 30) fail(ErrorKind::InvalidInput, "--layers {}: the Z-Image DiT has 1 to 30 main layers", dit_layers);
    if (te_layers < 2 || te_layers > 36) fail(ErrorKind::InvalidInput, "--te-layers {}: Qwen3-4B has 2 to 36 layers here (Z-Image reads hidden_states[-2])", te_layers);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) fail(ErrorKind::Io, "cannot create {}: {} (choose another --write-pipeline folder)", dir.string(), ec.message());
    PipelineFiles f{dir / "z_image_dit.safetensors", dir / "qwen3_4b.safetensors", dir / "flux1_vae.safetensors"};
    auto want = [&](const std::filesystem::path& p) { return !(reuse && std::filesystem::exists(p)); };
    std::exception_ptr dit_error;
    std::thread dit_thread([&] {
        try {
            if (!want(f.dit)) return;
            models::zimage::ZImageDiT dit(turbo_config(dit_layers, 2));
            write_made_up_bf16(f.dit, dit, seed, "easel-bench-multigpu --write-pipeline: made-up Z-Image-Turbo transformer", zimage_dit_ones, threads);
        } catch (...) {
            dit_error = std::current_exception();
        }
    });
    try {
        if (want(f.llm)) {
            models::qwen3::Qwen3Model te(qwen3_4b_config(te_layers));
            write_made_up_bf16(f.llm, te, seed ^ 0x7e7e7eull, "easel-bench-multigpu --write-pipeline: made-up Qwen3-4B", norm_role_is_one, threads);
        }
        if (want(f.vae)) {
            vae::AutoencoderKL ae(flux1_vae_config());
            write_made_up_bf16(f.vae, ae, seed ^ 0xae0ull, "easel-bench-multigpu --write-pipeline: made-up FLUX.1 VAE", norm_role_is_one, threads);
        }
    } catch (...) {
        dit_thread.join();
        throw;
    }
    dit_thread.join();
    if (dit_error) std::rethrow_exception(dit_error);
    return f;
}

}  // namespace easel::bench
