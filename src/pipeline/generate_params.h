// Parameters of one image-generation job, named and defaulted as stable-diffusion.cpp's
// sd-cli names them (examples/cli/README.md there), so users' command lines carry over.
#pragma once

#include "placement/spec.h"

#include <cstdint>
#include <string>
#include <vector>

namespace easel::pipeline {

/// Largest --cfg-scale accepted (the server's cfg_scale range is 0..100 too): far above any useful
/// guidance (1 to about 30), well below where the guided prediction overflows float.
inline constexpr float kMaxCfgScale = 100.0f;

/// Everything `easel generate` (and sd-cli-style flat invocations) accepts.
/// Sizes are pixels; strengths and scales are unitless; seed -1 means "random, printed".
struct GenerateParams {
    std::string mode = "img_gen";  ///< -M/--mode (sd-cli): img_gen, or upscale (-i IMAGE --upscale-model M: upscale only)

    // model files
    std::string model;            ///< -m: single file, GGUF, or diffusers folder
    std::string diffusion_model;  ///< --diffusion-model: standalone diffusion model
    std::string vae;              ///< --vae: standalone VAE overriding the model's
    std::string taesd;            ///< --taesd/--tae: tiny autoencoder used for decoding
    std::string clip_l, clip_g, t5xxl, llm;  ///< standalone text encoders
    std::string weight_type;      ///< --type: f32, f16, bf16, q8_0, q4_0, ... ("" keeps the file's)

    // prompt
    std::string prompt;           ///< -p
    std::string negative_prompt;  ///< -n
    std::string prompt_file;      ///< --prompt-file: read -p from this UTF-8 text file (one trailing newline dropped)
    std::string negative_prompt_file;  ///< --negative-prompt-file: read -n from this file
    int clip_skip = -1;           ///< --clip-skip: <= 0 means family default (1 SD1.x, 2 SD2.x)

    // LoRA and textual inversion (docs/lora.md)
    std::string lora_model_dir;   ///< --lora-model-dir: where <lora:NAME:W> tags are resolved
    std::string lora_apply_mode = "auto";  ///< --lora-apply-mode: auto, immediately, at_runtime
    std::vector<std::string> loras;  ///< --lora FILE[:WEIGHT], repeatable
    std::string embd_dir;         ///< --embd-dir: textual-inversion embeddings named in the prompt by file name

    // sampling
    float cfg_scale = 7.0f;       ///< --cfg-scale, 0..kMaxCfgScale
    float guidance = 3.5f;        ///< --guidance (distilled-guidance models)
    /// --guidance was given: a family without a guidance input (Family::uses_guidance) warns once.
    bool guidance_given = false;
    int steps = 20;               ///< --steps
    /// false: --steps / --cfg-scale were not given and generate uses the model file's recommended
    /// settings (easel.steps / easel.cfg_scale, docs/formats.md) or the family's defaults
    /// (Family::defaults(): Z-Image 8 steps CFG 1, FLUX.2 Klein distilled 4 steps CFG 1 ...);
    /// true (the default for library callers): steps / cfg_scale are used as they are.
    bool steps_given = true, cfg_scale_given = true;
    /// --sampling-method: an easel / sd-cli name, an A1111 display name or alias ("DPM++ 2M Karras",
    /// k_dpmpp_2m_ka) or a ComfyUI name (sampling/names.h); "" = family default (euler_a for SD)
    std::string sampling_method;
    std::string scheduler;        ///< --scheduler (any name of sampling/names.h; "" = the sampler's or family's default)
    /// --eta: the noise amount of ancestral / SDE / DDIM / TCD samplers. Used when eta_given, or when
    /// > 0 (library callers); otherwise the method's default (sampling::default_eta). 0 is a value.
    float eta = 0.0f;
    bool eta_given = false;
    std::string sigmas;           ///< --sigmas: a comma-separated schedule given by hand ("" = the scheduler's)
    float flow_shift = 0.0f;      ///< --flow-shift (0 = auto)
    std::string prediction;       ///< --prediction override: eps, v, ... ("" = detect)
    int64_t seed = 42;            ///< -s/--seed (< 0: random, printed)
    std::string rng = "cuda";     ///< --rng: cuda (A1111), cpu (ComfyUI), std_default
    std::string sampler_rng;      ///< --sampler-rng ("" = same as --rng)

    // image
    int width = 512, height = 512;  ///< -W/-H in pixels
    /// false: -W / -H were not given and generate uses the model file's easel.width / easel.height
    /// when it has them (docs/formats.md), else width / height as they are; true (the default for
    /// library callers): width / height are used as they are.
    bool width_given = true, height_given = true;
    int batch_count = 1;            ///< -b
    std::string output = "output.png";  ///< -o (.png, .jpg/.jpeg); printf-style %d allowed for batches
    /// --output-begin-idx (sd-cli): the number of the first image in -o's %d, or in the
    /// NAME_N suffix of a batch; < 0: easel's default (%d from 1; the first image unsuffixed).
    int output_begin_idx = -1;
    std::string init_img;           ///< -i
    std::string mask;               ///< --mask
    float strength = 0.75f;         ///< --strength (img2img)
    std::vector<std::string> ref_images;  ///< -r/--ref-image, repeatable: reference images of edit models (FLUX.2 Klein)

    // VAE
    bool vae_tiling = false;        ///< --vae-tiling
    std::string vae_tile_size = "32x32";  ///< --vae-tile-size in latent cells
    /// --vae-relative-tile-size [X]x[Y] (sd-cli: a fraction of the latent, or tiles per side):
    /// parsed so that it can be refused with its reason (not in this build yet); "" = not given.
    std::string vae_relative_tile_size;
    float vae_tile_overlap = 0.5f;  ///< --vae-tile-overlap, fraction of the tile

    // upscaler (pipeline/upscale.h)
    std::string upscale_model;      ///< --upscale-model: ESRGAN / Real-ESRGAN file; each result is upscaled before it is written
    int upscale_repeats = 1;        ///< --upscale-repeats: passes of the upscaler
    int upscale_tile_size = -1;     ///< --upscale-tile-size in input pixels (< 0: from the device budget, 0: whole image)

    // hires fix (pipeline/hires.h; sd-cli's --hires* flags, A1111's enable_hr / hr_*)
    bool hires = false;             ///< --hires: a second img2img pass at a larger size
    std::string hires_upscaler = "Latent";  ///< --hires-upscaler: Latent, Latent (nearest) ..., Lanczos, Nearest, or an upscaler model name
    std::string hires_upscalers_dir;  ///< --hires-upscalers-dir: where --hires-upscaler model names are looked up
    float hires_scale = 2.0f;       ///< --hires-scale (used when --hires-width/--hires-height are 0)
    int hires_width = 0, hires_height = 0;  ///< --hires-width / --hires-height in pixels (0: from --hires-scale / the aspect ratio)
    int hires_steps = 0;            ///< --hires-steps: steps the second pass runs (0: --steps)
    float hires_denoising_strength = 0.7f;  ///< --hires-denoising-strength, (0, 1]
    std::string hires_sigmas;       ///< --hires-sigmas: the second pass's schedule given by hand ("" = cut by the strength)
    /// A1111's hr_upscaler "None" (the server): a Lanczos resize written as "None" (sd-cli's
    /// --hires-upscaler None turns the hires fix off instead).
    bool hires_a1111_none = false;

    // execution
    bool flash_attn = false;        ///< --fa
    bool diffusion_fa = false;      ///< --diffusion-fa
    /// --vae-conv-direct / --diffusion-conv-direct (sd-cli): ggml_conv_2d_direct instead of
    /// im2col (nn::Conv2d::direct; FamilyOptions::vae_conv_direct / diffusion_conv_direct).
    bool vae_conv_direct = false, diffusion_conv_direct = false;
    bool mmap = false;              ///< --mmap (sd-cli): easel always maps model files read-only; -v says so
    int threads = -1;               ///< -t (<= 0: physical cores)
    placement::PlacementFlags placement;  ///< --backend, --params-backend, --max-vram ... (docs/placement.md)
    bool verbose = false;           ///< -v
    bool color = false;             ///< --color

    // stages, artifacts, checkpoints, cache (docs/artifacts.md)
    std::string stage;              ///< --stage te-encode|llm-encode|vae-encode|diffuse|vae-decode ("" = all)
    std::string save_embeddings;    ///< --save-embeddings: write the prompt conditioning here
    std::string load_embeddings;    ///< --load-embeddings: use this conditioning (no text encoder)
    std::string save_latent;        ///< --save-latent: write the encoded image / final latent here
    std::string load_latent;        ///< --load-latent: init latent (denoise) or latent to decode
    std::string checkpoint_dir;     ///< --checkpoint-dir: sampler checkpoint after every step
    bool resume = false;            ///< --resume: continue from the latest checkpoint
    int resume_step = -1;           ///< --resume-step N: continue from the checkpoint after step N
    bool full_fingerprint = false;  ///< --full-fingerprint: hash whole model files
    std::string cache_dir;          ///< --cache-dir ("" = $XDG_CACHE_HOME/easel or ~/.cache/easel)
    bool no_cache = false;          ///< --no-cache
    int64_t cache_max_mib = 2048;   ///< --cache-max-mib: size cap, least recently used evicted
};

}  // namespace easel::pipeline
