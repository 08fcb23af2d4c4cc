// Configurations of the full-size architectures the benchmarks build with made-up weights
// (the released models' config.json values), shared by easel-bench-zimage, easel-bench-flux and
// easel-bench-multigpu.
#pragma once

#include "models/flux/flux2_dit.h"
#include "models/flux/flux_dit.h"
#include "models/zimage/z_image_dit.h"

namespace easel::bench {

/// Z-Image-Turbo's transformer/config.json, with `layers` main layers and `refiners` refiner
/// layers of each kind (30 and 2 for the real model).
inline models::zimage::ZImageDiTConfig turbo_config(int layers, int refiners) {
    models::zimage::ZImageDiTConfig c;
    c.in_channels = 16;
    c.patch = 2;
    c.f_patch = 1;
    c.dim = 3840;
    c.n_heads = c.n_kv_heads = 30;
    c.head_dim = 128;
    c.ffn_hidden = 10240;  // int(3840 / 3 * 8)
    c.n_layers = layers;
    c.n_noise_refiner = c.n_context_refiner = refiners;
    c.cap_feat_dim = 2560;
    c.adaln_dim = 256;
    c.t_hidden = 1024;
    c.t_freq_dim = 256;
    c.axes_dims = {32, 48, 48};
    c.axes_lens = {1024, 512, 512};
    return c;
}

/// FLUX.1-dev transformer/config.json (black-forest-labs/FLUX.1-dev), `dbl`/`sgl` blocks.
inline models::flux::FluxDiTConfig flux1_dev_config(int dbl, int sgl) {
    models::flux::FluxDiTConfig c;
    c.in_channels = c.out_channels = 64;
    c.hidden = 3072;
    c.head_dim = 128;
    c.heads = 24;
    c.mlp_hidden = 12288;
    c.joint_dim = 4096;
    c.pooled_dim = 768;
    c.time_channels = 256;
    c.n_double = dbl;
    c.n_single = sgl;
    c.guidance_embeds = true;
    c.axes_dims = {16, 56, 56};
    return c;
}

/// FLUX.2 [klein] 9B transformer config (Flux2Transformer2DModel; Qwen3-8B text features).
inline models::flux::Flux2DiTConfig klein9b_config(int dbl, int sgl) {
    models::flux::Flux2DiTConfig c;
    c.in_channels = c.out_channels = 128;
    c.hidden = 4096;
    c.head_dim = 128;
    c.heads = 32;
    c.mlp_hidden = 12288;  // mlp_ratio 3
    c.joint_dim = 12288;   // 3 x 4096
    c.time_channels = 256;
    c.n_double = dbl;
    c.n_single = sgl;
    c.guidance_embeds = false;
    c.axes_dims = {32, 32, 32, 32};
    return c;
}

}  // namespace easel::bench
