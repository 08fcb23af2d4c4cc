// sd-cli-compatible options of `easel generate` (and of a bare `easel -m ... -p ...`).
#pragma once

#include "pipeline/generate_params.h"
#include "pipeline/hires.h"
#include "pipeline/upscale.h"
#include "command.h"
#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "core/strings.h"
#include "text/unicode.h"
#include "placement_options.h"

#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

namespace easel::cli {

/// Largest -W/-H accepted, in pixels: 16384 (a 2048 x 2048 SD latent; every module's compute
/// grows with the pixel count, and the job is then also checked against the memory of its
/// devices before anything runs, pipeline/memory_check.h).
inline constexpr long long kMaxImageSide = 16384;

/// Refuses a -W/-H above kMaxImageSide at parse time (before a model is opened): a size such as
/// 1000000 would otherwise reach the memory check or a host allocation. Values that are not
/// integers are left to CLI11's conversion error; <= 0 to generate's "must be positive".
inline CLI::Validator max_side_check() {
    return max_integer_check(kMaxImageSide, " pixels is above the maximum of ", ": pass a smaller size (--vae-tiling lowers the decode's memory)",
                             "max image side");
}

/// Adds --upscale-model, --upscale-repeats and --upscale-tile-size (sd-cli's names) to `app`.
inline void add_upscale_options(CLI::App& app, pipeline::GenerateParams& p) {
    const char* g = "Upscaler";
    app.add_option("--upscale-model", p.upscale_model,
                   "ESRGAN / Real-ESRGAN upscaler (RRDBNet or SRVGGNetCompact; .pth, .safetensors ...): each image is upscaled before it is written")
        ->group(g);
    app.add_option("--upscale-repeats", p.upscale_repeats, "Run the upscaler this many times (default 1; 0: not at all)")->check(number_check(0, 16, true))->group(g);
    app.add_option("--upscale-tile-size", p.upscale_tile_size,
                   "Upscaler tile in input pixels (default: the largest the device's budget holds; 0: the whole image at once)")
        ->check(number_check(0, 16384, true))
        ->group(g);
}

/// Runs an upscale-only job (`easel upscale`, sd-cli's `-M upscale`): -i, -o, --upscale-model,
/// --upscale-repeats, --upscale-tile-size, -t and the placement flags of `p`. Returns the exit code.
/// Throws easel::Error (a missing -i / --upscale-model, --upscale-repeats 0, bad files).
inline int run_upscale_mode(const pipeline::GenerateParams& p) {
    if (p.init_img.empty()) fail(ErrorKind::InvalidInput, "upscale mode needs an image: pass -i IMAGE");
    if (p.upscale_model.empty()) fail(ErrorKind::InvalidInput, "upscale mode needs an upscaler: pass --upscale-model FILE");
    if (p.upscale_repeats < 1) fail(ErrorKind::InvalidInput, "--upscale-repeats {} leaves nothing to do in upscale mode: pass 1 or more", p.upscale_repeats);
    pipeline::UpscaleOptions o;
    o.model = p.upscale_model;
    o.repeats = p.upscale_repeats;
    o.tile = p.upscale_tile_size;
    o.threads = p.threads;
    o.placement = p.placement;
    pipeline::upscale_file(p.init_img, p.output, o);
    std::printf("%s\n", p.output.c_str());
    return 0;
}

/// Adds every generation option to `app`, bound to `p`. Flag names and defaults follow
/// Adds sd-cli's hires-fix flags (--hires, --hires-upscaler, --hires-upscalers-dir, --hires-scale,
/// --hires-width/--hires-height, --hires-steps, --hires-denoising-strength, --hires-sigmas) to `app`.
inline void add_hires_options(CLI::App& app, pipeline::GenerateParams& p) {
    const char* g = "Hires fix";
    app.add_flag("--hires", p.hires, "Hires fix (A1111): a second img2img pass at --hires-scale x the size")->group(g);
    app.add_option("--hires-upscaler", p.hires_upscaler,
                   "Hires upscaler: Latent, Latent (nearest), Latent (nearest-exact), Latent (antialiased), Latent (bicubic), "
                   "Latent (bicubic antialiased), Lanczos, Nearest, an upscaler model name in --hires-upscalers-dir (or the stem of "
                   "--upscale-model, or a file path); None turns the hires fix off (default: Latent)")
        ->group(g);
    app.add_option("--hires-upscalers-dir", p.hires_upscalers_dir, "Folder of upscaler models that --hires-upscaler names (NAME.pth, .safetensors ...)")
        ->group(g);
    app.add_option("--hires-scale", p.hires_scale, "Hires target = this x the size, when --hires-width/--hires-height are 0 (default: 2.0)")->group(g);
    app.add_option("--hires-width", p.hires_width, "Hires target width in pixels, 0 to use --hires-scale (default: 0)")
        ->check(number_check(0, (double)kMaxImageSide, true))
        ->group(g);
    app.add_option("--hires-height", p.hires_height, "Hires target height in pixels, 0 to use --hires-scale (default: 0)")
        ->check(number_check(0, (double)kMaxImageSide, true))
        ->group(g);
    app.add_option("--hires-steps", p.hires_steps, "Steps the second pass runs, 0 to reuse --steps (default: 0)")->check(number_check(0, 10000, true))->group(g);
    app.add_option("--hires-denoising-strength", p.hires_denoising_strength, "Second pass denoising strength, (0, 1] (default: 0.7)")->group(g);
    app.add_option("--hires-sigmas", p.hires_sigmas, "The second pass's sigmas, comma-separated (e.g. \"0.85,0.725,0.42,0.0\"); replaces the cut schedule")
        ->group(g);
}

/// stable-diffusion.cpp's sd-cli (examples/cli/README.md there).
inline void add_generate_options(CLI::App& app, pipeline::GenerateParams& p) {
    // A flag given twice takes its last value, as sd-cli does (scripts often append overrides).
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.add_option("-M,--mode", p.mode, "Run mode (sd-cli): img_gen, or upscale (-i IMAGE --upscale-model M: only upscale the image)")
        ->check(CLI::IsMember({"img_gen", "upscale"}));
    auto* g = "Model files";
    app.add_option("-m,--model", p.model, "Model: a single file (safetensors/GGUF) or a diffusers folder")->group(g);
    app.add_option("--diffusion-model", p.diffusion_model, "Standalone diffusion model (UNet/DiT)")->group(g);
    app.add_option("--vae", p.vae, "Standalone VAE, overrides the model's")->group(g);
    app.add_option("--taesd,--tae", p.taesd, "Tiny autoencoder (TAESD) used for decoding")->group(g);
    app.add_option("--clip_l,--clip-l", p.clip_l, "Standalone CLIP-L text encoder")->group(g);
    app.add_option("--clip_g,--clip-g", p.clip_g, "Standalone CLIP-G text encoder")->group(g);
    app.add_option("--t5xxl", p.t5xxl, "Standalone T5-XXL text encoder")->group(g);
    app.add_option("--llm,--qwen2vl", p.llm, "Standalone LLM text encoder (Qwen3, ...); --qwen2vl is sd-cli's old name")->group(g);
    app.add_option("--type", p.weight_type, "Weight type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K..q6_K (default: the file's)")->group(g);

    g = "Prompt";
    app.add_option("-p,--prompt", p.prompt, "The prompt (A1111 syntax: (word:1.2), [word], BREAK, <lora:name:w>)")->group(g);
    app.add_option("-n,--negative-prompt", p.negative_prompt, "The negative prompt")->group(g);
    app.add_option("--prompt-file", p.prompt_file, "Read the prompt from this UTF-8 text file (instead of -p; one trailing newline is dropped)")
        ->group(g);
    app.add_option("--negative-prompt-file", p.negative_prompt_file, "Read the negative prompt from this file (instead of -n)")->group(g);
    app.add_option("--clip-skip", p.clip_skip, "Ignore the last CLIP layers: 1 none, 2 one (default: 1 for SD1.x, 2 for SD2.x)")->group(g);

    g = "LoRA and embeddings";
    app.add_option("--lora-model-dir", p.lora_model_dir, "Folder the <lora:NAME:WEIGHT> tags of the prompts name files in")->group(g);
    app.add_option("--lora-apply-mode", p.lora_apply_mode,
                   "auto (at run time for quantised or row-split weights, else merged at load), immediately, at_runtime")
        ->check(CLI::IsMember({"auto", "immediately", "at_runtime"}))
        ->group(g);
    app.add_option("--lora", p.loras, "A LoRA file to apply, FILE[:WEIGHT] (default weight 1); repeat the flag for several")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)  // every --lora counts
        ->allow_extra_args(false)
        ->group(g);
    app.add_option("--embd-dir", p.embd_dir, "Folder of textual-inversion embeddings, named in the prompt by file name")->group(g);

    g = "Sampling";
    app.add_option("--cfg-scale", p.cfg_scale, "Classifier-free guidance scale (default 7.0; 1 disables the negative pass)")->group(g);
    app.add_option("--guidance", p.guidance, "Distilled guidance for models with a guidance input (FLUX.1 dev; default 3.5; others warn)")
        ->each([&p](const std::string&) { p.guidance_given = true; })
        ->group(g);
    app.add_option("--steps", p.steps, "Sampling steps (default 20)")->check(number_check(1, 10000, true))->group(g);
    app.add_option("--sampling-method", p.sampling_method,
                   "euler, euler_a, heun, dpm2, dpm2_a, dpm++2s_a, dpm++2s, dpm++_sde, dpm++2m, dpm++2mv2, dpm++2m_sde, "
                   "dpm++2m_sde_bt, ipndm, ipndm_v, lms, deis, uni_pc, lcm, ddim, ddim_trailing, tcd, res_multistep, res_2s, "
                   "er_sde, euler_cfg_pp, euler_a_cfg_pp; A1111 names (\"DPM++ 2M Karras\", \"Euler a\") and ComfyUI names too "
                   "(default: euler_a for SD)")->group(g);
    app.add_option("--scheduler", p.scheduler,
                   "discrete (normal), karras, exponential, ays, gits, sgm_uniform, simple, smoothstep, kl_optimal, lcm, beta, "
                   "ddim_uniform, flux, flux2; A1111 names too (default: the model's)")->group(g);
    app.add_option("--sigmas", p.sigmas, "Custom schedule, comma-separated sigmas (e.g. \"14.61,7.8,3.5,0.0\"); steps = count - 1")->group(g);
    app.add_option("--eta", p.eta, "Noise of ancestral, SDE, DDIM and TCD samplers (default: 1 for euler_a, dpm2_a, dpm++2s_a, dpm++_sde, "
                                   "dpm++2m_sde(_bt), er_sde, euler_a_cfg_pp; 0 for the others); 0 is a value")
        ->each([&p](const std::string&) { p.eta_given = true; })
        ->group(g);
    app.add_option("--flow-shift", p.flow_shift, "Shift for flow-matching models (default: auto)")->group(g);
    app.add_option("--prediction", p.prediction, "Override the prediction type: eps, v")->group(g);
    app.add_option("-s,--seed", p.seed, "RNG seed (default 42; < 0: random, printed)")
        ->check(CLI::Validator(
            [](std::string& v) -> std::string {  // CLI11 would clamp an out-of-range value to INT64_MAX silently
                errno = 0;
                char* end = nullptr;
                (void)std::strtoll(v.c_str(), &end, 10);
                if (end != v.c_str() && *end == '\0' && errno == ERANGE)
                    return v + " is outside the seed range -9223372036854775808..9223372036854775807";
                return {};
            },
            "", "seed range"))
        ->group(g);
    app.add_option("--rng", p.rng, "Noise RNG: cuda (A1111, default), cpu (ComfyUI), std_default")->group(g);
    app.add_option("--sampler-rng", p.sampler_rng, "RNG of ancestral / SDE sampler noise and of the Brownian-tree seed (default: --rng)")->group(g);

    g = "Image";
    app.add_option("-W,--width", p.width, "Width in pixels (default 512, at most 16384; rounded down to the model's multiple: 8 for SD1.x/2.x, 16 for FLUX and Z-Image)")
        ->check(max_side_check())
        ->group(g);
    app.add_option("-H,--height", p.height, "Height in pixels (default 512, at most 16384; rounded down to the model's multiple: 8 for SD1.x/2.x, 16 for FLUX and Z-Image)")
        ->check(max_side_check())
        ->group(g);
    app.add_option("-b,--batch-count", p.batch_count, "Number of images (seeds seed, seed+1, ...)")->check(number_check(1, 10000, true))->group(g);
    app.add_option("-o,--output", p.output,
                   "Output image: .png (with the parameters in its text chunks), .jpg/.jpeg (quality 90, parameters in a comment) "
                   "(default output.png; printf-style %d for batches)")
        ->group(g);
    app.add_option("--output-begin-idx", p.output_begin_idx,
                   "Number of the first image in -o's %d or in the NAME_N suffix of a batch (default: %d counts from 1, the first image has no suffix)")
        ->check(CLI::NonNegativeNumber)
        ->group(g);
    app.add_option("-i,--init-img", p.init_img, "Init image for img2img")->group(g);
    app.add_option("--mask", p.mask, "Inpainting mask (white = repaint), same size as the init image")->group(g);
    app.add_option("--strength", p.strength, "img2img strength, 0..1 (default 0.75)")->check(number_check(0.0, 1.0, false))->group(g);
    app.add_option("-r,--ref-image", p.ref_images, "Reference image for edit models (FLUX.2 Klein); repeat the flag for several")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)  // every -r counts (the default policy here is TakeLast)
        ->allow_extra_args(false)
        ->group(g);

    g = "VAE";
    app.add_flag("--vae-tiling", p.vae_tiling, "Decode/encode in overlapping tiles to save memory")->group(g);
    app.add_option("--vae-tile-size", p.vae_tile_size, "Tile size in latent cells, [X]x[Y] (default 32x32)")->group(g);
    app.add_option("--vae-tile-overlap", p.vae_tile_overlap, "Tile overlap as a fraction of the tile (default 0.5)")->group(g);
    app.add_option("--vae-relative-tile-size", p.vae_relative_tile_size,
                   "sd-cli's tile size relative to the latent: not in this build yet (refused; give --vae-tile-size in latent cells)")
        ->group(g);
    app.add_flag("--vae-conv-direct", p.vae_conv_direct, "Convolutions of the VAE (and TAESD) through ggml_conv_2d_direct instead of im2col: no im2col buffer, less memory")
        ->group(g);

    add_upscale_options(app, p);
    add_hires_options(app, p);

    g = "Execution";
    app.add_flag("--fa", p.flash_attn, "Flash attention in every module")->group(g);
    app.add_flag("--diffusion-fa", p.diffusion_fa, "Flash attention in the diffusion model only")->group(g);
    app.add_flag("--diffusion-conv-direct", p.diffusion_conv_direct,
                 "Convolutions of the diffusion model (SD1.x/SD2.x/SDXL UNet) through ggml_conv_2d_direct instead of im2col")
        ->group(g);
    app.add_flag("--mmap", p.mmap, "Memory-map the model files (sd-cli): easel always does (read-only mappings); -v says so")->group(g);
    app.add_option("-t,--threads", p.threads, "CPU threads (<= 0: physical cores; at most 512)")->check(max_threads_check())->group(g);
    add_placement_options(app, p.placement);
}

/// Reads a prompt file (--prompt-file, --negative-prompt-file): its whole text, one trailing
/// newline ("\n" or "\r\n") dropped. Throws Error(Io) naming `flag` and the file when it cannot be
/// read, Error(InvalidInput) naming them and the first bad byte when it is not UTF-8.
inline std::string read_prompt_file(const std::string& path, const char* flag) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(platform::u8path(path), ec))
        fail(ErrorKind::Io, "{} {}: no such file (or not a regular file); pass a text file holding the prompt", flag, path);
    std::ifstream in(platform::u8path(path), std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) fail(ErrorKind::Io, "{} {}: cannot read it", flag, path);
    if (const size_t at = text::first_invalid_utf8(text); at != std::string::npos)
        fail(ErrorKind::InvalidInput, "{} {}: not UTF-8 text (byte 0x{:02X} at offset {}); save the file as UTF-8", flag, path,
             (unsigned)(unsigned char)text[at], at);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    if (!text.empty() && text.back() == '\r') text.pop_back();
    return text;
}

/// Settles the options of add_generate_options() that need the parsed command line as a whole,
/// before anything runs: which flags were given (--steps, --cfg-scale, --width, --height: otherwise
/// the model file's recommended settings or the family's defaults), --prompt-file / --negative-prompt-file (each excludes its -p / -n), and the notes
/// of the accepted flags that change nothing in this build: --mmap (a debug line: easel maps
/// model files already). Throws
/// Error(InvalidInput) for -p with --prompt-file, a prompt file that is not UTF-8 and an empty
/// --sigmas / --hires-sigmas; Error(Io) for a prompt file that cannot be read.
inline void resolve_generate_options(const CLI::App& app, pipeline::GenerateParams& p) {
    p.steps_given = app.count("--steps") > 0;
    p.cfg_scale_given = app.count("--cfg-scale") > 0;
    p.width_given = app.count("--width") > 0;
    p.height_given = app.count("--height") > 0;
    if (!p.prompt_file.empty()) {
        if (app.count("--prompt") > 0) fail(ErrorKind::InvalidInput, "give either -p/--prompt or --prompt-file, not both");
        p.prompt = read_prompt_file(p.prompt_file, "--prompt-file");
    }
    if (!p.negative_prompt_file.empty()) {
        if (app.count("--negative-prompt") > 0)
            fail(ErrorKind::InvalidInput, "give either -n/--negative-prompt or --negative-prompt-file, not both");
        p.negative_prompt = read_prompt_file(p.negative_prompt_file, "--negative-prompt-file");
    }
    // an empty list given on purpose is refused, not taken for "the scheduler's" (the meaning of no flag)
    for (const char* f : {"--sigmas", "--hires-sigmas"}) {
        const std::string& v = std::string(f) == "--sigmas" ? p.sigmas : p.hires_sigmas;
        if (app.count(f) > 0 && v.find_first_not_of(" \t") == std::string::npos)
            fail(ErrorKind::InvalidInput, "{} is empty: give the sigmas comma-separated, e.g. {} \"14.61,7.8,3.5,0.0\", or leave the flag out "
                 "for the scheduler's", f, f);
    }
    if (!p.vae_relative_tile_size.empty())
        fail(ErrorKind::Unsupported, "--vae-relative-tile-size {}: not in this build yet; give the tile in latent cells with --vae-tile-size "
             "NxN (8 px per cell; FLUX.2 Klein 16)", p.vae_relative_tile_size);
    if (p.mmap) log::debug("--mmap: easel memory-maps every model file read-only already (the default; nothing to change)");
}

/// The flags of `easel generate` that act only with another flag, given without it: one warning
/// line per group, naming the flags given and the one they need (issue 20: nothing accepted is
/// silently ignored): --hires-* without --hires; --strength without an init image (-i, or
/// --load-latent); --upscale-repeats / --upscale-tile-size without --upscale-model (the tile size
/// also acts for a hires upscaler model); --vae-tile-size / --vae-tile-overlap without
/// --vae-tiling. Returns the lines (without "warning: "); warn_flags_without_their_switch() logs them.
inline std::vector<std::string> flags_without_their_switch(const CLI::App& app, const pipeline::GenerateParams& p) {
    std::vector<std::string> lines;
    const auto given = [&app](std::initializer_list<const char*> flags) {
        std::string list;
        for (const char* f : flags)
            if (app.count(f) > 0) list += (list.empty() ? "" : ", ") + std::string(f);
        return list;
    };
    if (!p.hires) {
        const std::string h = given({"--hires-upscaler", "--hires-upscalers-dir", "--hires-scale", "--hires-width", "--hires-height", "--hires-steps",
                                     "--hires-denoising-strength", "--hires-sigmas"});
        if (!h.empty()) lines.push_back(h + ": not used: the hires fix is off; add --hires to run its second pass");
    }
    if (app.count("--strength") > 0 && p.init_img.empty() && p.load_latent.empty())
        lines.push_back(fmt::format("--strength {}: not used without an init image: a text-to-image job starts from pure noise; pass -i IMAGE "
                                    "for img2img", p.strength));
    if (p.upscale_model.empty()) {
        // a hires upscaler model (not a built-in name) is tiled by --upscale-tile-size too
        bool hires_model = p.hires;
        for (const std::string& b : pipeline::builtin_hires_upscalers())
            if (ascii_lower(b) == ascii_lower(p.hires_upscaler) || ascii_lower(p.hires_upscaler) == "none") hires_model = false;
        const std::string u = hires_model ? given({"--upscale-repeats"}) : given({"--upscale-repeats", "--upscale-tile-size"});
        if (!u.empty()) lines.push_back(u + ": not used without --upscale-model (no upscaler runs in this job); pass --upscale-model FILE");
    }
    if (!p.vae_tiling) {
        const std::string v = given({"--vae-tile-size", "--vae-tile-overlap"});
        if (!v.empty()) lines.push_back(v + ": not used without --vae-tiling (the VAE runs untiled); add --vae-tiling");
    }
    return lines;
}

/// Logs flags_without_their_switch() as warnings (`easel generate` calls it once, after parsing).
inline void warn_flags_without_their_switch(const CLI::App& app, const pipeline::GenerateParams& p) {
    for (const std::string& line : flags_without_their_switch(app, p)) log::warn("{}", line);
}

/// Adds the stage file flags (docs/artifacts.md), shared by `generate` and the stage commands:
/// --save-embeddings/--load-embeddings, --save-latent/--load-latent, --checkpoint-dir,
/// --resume, --resume-step, --full-fingerprint, and the cache flags (--cache-dir, --no-cache,
/// --cache-max-mib).
inline void add_stage_options(CLI::App& app, pipeline::GenerateParams& p) {
    auto* g = "Stages and files";
    app.add_option("--save-embeddings", p.save_embeddings, "Write the prompt conditioning to FILE (safetensors)")->group(g);
    app.add_option("--load-embeddings", p.load_embeddings, "Use the conditioning in FILE instead of running the text encoder")->group(g);
    app.add_option("--save-latent", p.save_latent, "Write the latent to FILE (encode-image: the image's; denoise/generate: the final one)")->group(g);
    app.add_option("--load-latent", p.load_latent, "Latent from FILE: the init latent (denoise/generate) or the latent to decode")->group(g);
    app.add_option("--checkpoint-dir", p.checkpoint_dir, "Write a sampler checkpoint after every step into DIR")->group(g);
    app.add_flag("--resume", p.resume, "Continue from the latest checkpoint in --checkpoint-dir")->group(g);
    app.add_option("--resume-step", p.resume_step, "Continue from the checkpoint written after step N")->check(CLI::NonNegativeNumber)->group(g);
    app.add_flag("--full-fingerprint", p.full_fingerprint, "Fingerprint model files by hashing every byte (default: size, mtime, sampled chunks)")->group(g);
    app.add_option("--cache-dir", p.cache_dir, "Artifact cache folder (default $XDG_CACHE_HOME/easel or ~/.cache/easel; Windows %LOCALAPPDATA%\\easel\\cache)")->group(g);
    app.add_flag("--no-cache", p.no_cache, "Neither read nor write the artifact cache")->group(g);
    app.add_option("--cache-max-mib", p.cache_max_mib, "Cache size cap in MiB; least recently used entries are evicted (default 2048)")->group(g);
}

}  // namespace easel::cli
