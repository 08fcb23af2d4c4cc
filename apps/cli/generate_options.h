// sd-cli-compatible options of `easel generate` (and of a bare `easel -m ... -p ...`).
#pragma once

#include "pipeline/generate_params.h"

#include <CLI/CLI.hpp>

namespace easel::cli {

/// Adds every generation option to `app`, bound to `p`. Flag names and defaults follow
/// stable-diffusion.cpp's sd-cli (examples/cli/README.md there).
inline void add_generate_options(CLI::App& app, pipeline::GenerateParams& p) {
    // A flag given twice takes its last value, as sd-cli does (scripts often append overrides).
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.add_option("-M,--mode", p.mode, "Run mode (sd-cli): img_gen (the only one supported by generate)")
        ->check(CLI::IsMember({"img_gen"}));
    auto* g = "Model files";
    app.add_option("-m,--model", p.model, "Model: a single file (safetensors/GGUF) or a diffusers folder")->group(g);
    app.add_option("--diffusion-model", p.diffusion_model, "Standalone diffusion model (UNet/DiT)")->group(g);
    app.add_option("--vae", p.vae, "Standalone VAE, overrides the model's")->group(g);
    app.add_option("--taesd,--tae", p.taesd, "Tiny autoencoder (TAESD) used for decoding")->group(g);
    app.add_option("--clip_l,--clip-l", p.clip_l, "Standalone CLIP-L text encoder")->group(g);
    app.add_option("--clip_g,--clip-g", p.clip_g, "Standalone CLIP-G text encoder")->group(g);
    app.add_option("--t5xxl", p.t5xxl, "Standalone T5-XXL text encoder")->group(g);
    app.add_option("--llm", p.llm, "Standalone LLM text encoder (Qwen3, ...)")->group(g);
    app.add_option("--type", p.weight_type, "Weight type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K..q6_K (default: the file's)")->group(g);

    g = "Prompt";
    app.add_option("-p,--prompt", p.prompt, "The prompt (A1111 syntax: (word:1.2), [word], BREAK, <lora:name:w>)")->group(g);
    app.add_option("-n,--negative-prompt", p.negative_prompt, "The negative prompt")->group(g);
    app.add_option("--clip-skip", p.clip_skip, "Ignore the last CLIP layers: 1 none, 2 one (default: 1 for SD1.x, 2 for SD2.x)")->group(g);

    g = "Sampling";
    app.add_option("--cfg-scale", p.cfg_scale, "Classifier-free guidance scale (default 7.0; 1 disables the negative pass)")->group(g);
    app.add_option("--guidance", p.guidance, "Distilled guidance for models with a guidance input (default 3.5)")->group(g);
    app.add_option("--steps", p.steps, "Sampling steps (default 20)")->check(CLI::Range(1, 10000))->group(g);
    app.add_option("--sampling-method", p.sampling_method,
                   "euler, euler_a, heun, dpm2, dpm++2m, dpm++2s_a, lcm, ddim_trailing (default: euler_a for SD)")->group(g);
    app.add_option("--scheduler", p.scheduler, "discrete, karras, exponential, sgm_uniform, simple (default: discrete)")->group(g);
    app.add_option("--eta", p.eta, "Eta for DDIM-style samplers (default 0)")->group(g);
    app.add_option("--flow-shift", p.flow_shift, "Shift for flow-matching models (default: auto)")->group(g);
    app.add_option("--prediction", p.prediction, "Override the prediction type: eps, v")->group(g);
    app.add_option("-s,--seed", p.seed, "RNG seed (default 42; < 0: random, printed)")->group(g);
    app.add_option("--rng", p.rng, "Noise RNG: cuda (A1111, default), cpu (ComfyUI), std_default")->group(g);
    app.add_option("--sampler-rng", p.sampler_rng, "RNG of ancestral samplers (default: --rng)")->group(g);

    g = "Image";
    app.add_option("-W,--width", p.width, "Width in pixels (default 512; rounded to a multiple of 8)")->group(g);
    app.add_option("-H,--height", p.height, "Height in pixels (default 512; rounded to a multiple of 8)")->group(g);
    app.add_option("-b,--batch-count", p.batch_count, "Number of images (seeds seed, seed+1, ...)")->check(CLI::Range(1, 10000))->group(g);
    app.add_option("-o,--output", p.output, "Output PNG (default output.png; printf-style %d for batches)")->group(g);
    app.add_option("-i,--init-img", p.init_img, "Init image for img2img")->group(g);
    app.add_option("--mask", p.mask, "Inpainting mask (white = repaint), same size as the init image")->group(g);
    app.add_option("--strength", p.strength, "img2img strength, 0..1 (default 0.75)")->check(CLI::Range(0.0, 1.0))->group(g);

    g = "VAE";
    app.add_flag("--vae-tiling", p.vae_tiling, "Decode/encode in overlapping tiles to save memory")->group(g);
    app.add_option("--vae-tile-size", p.vae_tile_size, "Tile size in latent cells, [X]x[Y] (default 32x32)")->group(g);
    app.add_option("--vae-tile-overlap", p.vae_tile_overlap, "Tile overlap as a fraction of the tile (default 0.5)")->group(g);

    g = "Execution";
    app.add_flag("--fa", p.flash_attn, "Flash attention in every module")->group(g);
    app.add_flag("--diffusion-fa", p.diffusion_fa, "Flash attention in the diffusion model only")->group(g);
    app.add_option("-t,--threads", p.threads, "CPU threads (<= 0: physical cores)")->group(g);
}

}  // namespace easel::cli
