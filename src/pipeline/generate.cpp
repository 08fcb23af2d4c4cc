#include "pipeline/generate.h"

#include "core/error.h"
#include "core/log.h"
#include "easel_version.h"
#include "models/sd/stable_diffusion.h"
#include "pipeline/image_io.h"
#include "pipeline/png_meta.h"
#include "placement/devices.h"
#include "sampling/sampler.h"
#include "text/prompt_syntax.h"

#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <random>
#include <thread>

namespace easel::pipeline {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int round_size(int v, int f, const char* what) {
    if (v <= 0) fail(ErrorKind::InvalidInput, "{} {} must be positive", what, v);
    int r = std::max(f, v / f * f);
    if (r != v) log::warn("{} {} is not a multiple of {}: using {}", what, v, f, r);
    return r;
}

ggml_backend_dev_t pick_device() {
    placement::init_backends();
    if (auto* d = placement::first_local_gpu()) return d;
    return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
}

/// Resizes a single-channel [H, W] mask to [h, w] by nearest neighbour (torch interpolate's
/// default mode, as diffusers' inpainting pipelines resize the mask to the latent).
std::vector<float> resize_nearest(const std::vector<float>& m, int H, int W, int h, int w) {
    std::vector<float> r((size_t)h * w);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            int sy = std::min(H - 1, (int)std::floor(y * (double)H / h));
            int sx = std::min(W - 1, (int)std::floor(x * (double)W / w));
            r[(size_t)y * w + x] = m[(size_t)sy * W + sx];
        }
    return r;
}

std::string model_stem(const GenerateParams& p) {
    std::string m = !p.model.empty() ? p.model : p.diffusion_model;
    fs::path path(m);
    if (path.filename().empty()) path = path.parent_path();
    return path.stem().string();
}

size_t peak_rss() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss * 1024;
}

}  // namespace

std::string batch_output_path(const std::string& pattern, int index, int count) {
    if (pattern.find("%d") != std::string::npos || pattern.find("%0") != std::string::npos) {
        char buf[4096];
        std::snprintf(buf, sizeof buf, pattern.c_str(), index + 1);
        return buf;
    }
    if (index == 0 || count <= 1) return pattern;
    fs::path p(pattern);
    return (p.parent_path() / (p.stem().string() + "_" + std::to_string(index + 1) + p.extension().string())).string();
}

std::string find_demo_model() {
    if (const char* env = std::getenv("EASEL_DEMO_MODEL"); env && *env) return env;
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    std::vector<fs::path> cands;
    if (!ec) {
        fs::path bin = exe.parent_path();
        cands = {bin / "../../models/demo", bin / "../models/demo", bin / "../share/easel/models/demo"};
    }
    cands.push_back("models/demo");
    for (auto& c : cands) {
        fs::path f = c / "easel-demo-shapes.safetensors";
        if (fs::is_regular_file(f, ec)) return fs::weakly_canonical(f, ec).string();
    }
    return {};
}

GenerateReport generate(const GenerateParams& params, const ProgressFn& progress) {
    GenerateReport rep;
    GenerateParams p = params;
    if (p.model.empty() && p.diffusion_model.empty()) {
        p.model = find_demo_model();
        if (p.model.empty())
            fail(ErrorKind::InvalidInput, "no model given: pass -m MODEL (a checkpoint file or a diffusers folder)");
        log::info("no -m given: using the bundled demo model {}", p.model);
    }
    if (p.prompt.empty() && p.init_img.empty()) log::warn("empty prompt");
    if (!std::isfinite(p.cfg_scale)) fail(ErrorKind::InvalidInput, "--cfg-scale must be a finite number");
    if (p.steps < 1) fail(ErrorKind::InvalidInput, "--steps {} must be at least 1", p.steps);
    if (p.batch_count < 1) fail(ErrorKind::InvalidInput, "--batch-count {} must be at least 1", p.batch_count);
    if (p.strength < 0 || p.strength > 1) fail(ErrorKind::InvalidInput, "--strength {} must be between 0 and 1", p.strength);
    if (!p.mask.empty() && p.init_img.empty()) fail(ErrorKind::InvalidInput, "--mask needs an init image (-i IMAGE)");
    if (!p.t5xxl.empty() || !p.llm.empty() || !p.clip_g.empty())
        fail(ErrorKind::ModelMismatch, "--t5xxl/--llm/--clip_g are not used by SD1.x/SD2.x; this easel runs SD1.x/SD2.x models only so far");

    const auto method = sampling::parse_sampler(p.sampling_method.empty() ? "euler_a" : p.sampling_method);
    const auto sched = sampling::parse_scheduler(p.scheduler.empty() ? "discrete" : p.scheduler);
    const auto rng_kind = sampling::parse_rng_kind(p.rng);
    const auto sampler_rng_kind = p.sampler_rng.empty() ? rng_kind : sampling::parse_rng_kind(p.sampler_rng);
    const int threads = p.threads > 0 ? p.threads : (int)std::max(1u, std::thread::hardware_concurrency());

    // Output folder must exist before hours of work.
    {
        fs::path out(batch_output_path(p.output, 0, p.batch_count));
        fs::path dir = out.parent_path();
        std::error_code ec;
        if (!dir.empty() && !fs::is_directory(dir, ec))
            fail(ErrorKind::Io, "-o {}: folder {} does not exist", p.output, dir.string());
    }

    // Init image and mask (read before loading the model: a bad file fails fast).
    std::optional<Image> init, mask;
    if (!p.init_img.empty()) init = load_image(p.init_img, 3);
    if (!p.mask.empty()) {
        mask = load_image(p.mask, 1);
        if (mask->width != init->width || mask->height != init->height)
            fail(ErrorKind::InvalidInput, "--mask {} is {}x{} but the init image is {}x{}: they must be the same size", p.mask,
                 mask->width, mask->height, init->width, init->height);
    }

    int64_t seed = p.seed;
    if (seed < 0) {
        std::random_device rd;
        seed = ((int64_t)rd() << 31 ^ rd()) & 0x7fffffff;
        log::info("seed: {}", seed);
    }
    rep.seed = seed;

    // Load.
    auto t0 = Clock::now();
    models::sd::SDFiles files{p.model, p.diffusion_model, p.vae, p.taesd, p.clip_l};
    models::sd::SDOptions so;
    so.device = pick_device();
    so.threads = threads;
    so.flash_attn_te = p.flash_attn;
    so.flash_attn_diffusion = p.flash_attn || p.diffusion_fa;
    so.weight_type = p.weight_type;
    so.prediction = p.prediction;
    so.need_encoder = init.has_value();
    auto model = models::sd::StableDiffusion::load(files, so);
    rep.load_s = since(t0);
    rep.device = ggml_backend_dev_name(so.device);
    log::info("model: {}", model->describe());

    const int f = model->spatial_factor();
    int W = p.width, H = p.height;
    if (init) {
        if (init->width != p.width || init->height != p.height) {
            log::info("using the init image's size {}x{}", init->width, init->height);
        }
        W = init->width;
        H = init->height;
    }
    W = round_size(W, f, "width");
    H = round_size(H, f, "height");
    if (init && (W != init->width || H != init->height)) {
        // crop the init image (and mask) to the rounded size, top-left aligned
        auto crop = [&](Image& im) {
            Image r;
            r.width = W;
            r.height = H;
            r.channels = im.channels;
            r.pixels.resize((size_t)W * H * im.channels);
            for (int y = 0; y < H; ++y)
                std::copy_n(im.pixels.begin() + (size_t)y * im.width * im.channels, (size_t)W * im.channels,
                            r.pixels.begin() + (size_t)y * W * im.channels);
            im = std::move(r);
        };
        crop(*init);
        if (mask) crop(*mask);
    }
    rep.width = W;
    rep.height = H;
    const int64_t h = H / f, w = W / f, C = model->latent_channels();
    const int64_t lat_n = C * h * w;

    // Prompts.
    text::PromptTags tags = text::extract_extra_networks(p.prompt);
    if (!tags.loras.empty()) log::warn("LoRA tags in the prompt are not applied yet (LoRA support is a later feature): {} ignored", tags.loras.size());
    text::PromptTags ntags = text::extract_extra_networks(p.negative_prompt);
    const int clip_skip = p.clip_skip > 0 ? p.clip_skip : model->default_clip_skip();
    t0 = Clock::now();
    auto cond = model->encode_prompt(tags.text, clip_skip);
    models::sd::SDConditioning uncond;
    const bool cfg = p.cfg_scale != 1.0f;
    if (cfg) uncond = model->encode_prompt(ntags.text, clip_skip);
    rep.te_s = since(t0);

    vae::TilingOptions tiling;
    tiling.enabled = p.vae_tiling;
    {
        int tx = 32, ty = 32;
        if (std::sscanf(p.vae_tile_size.c_str(), "%dx%d", &tx, &ty) < 1 || tx <= 0)
            fail(ErrorKind::InvalidInput, "--vae-tile-size {}: expected [X]x[Y] in latent cells, e.g. 32x32", p.vae_tile_size);
        tiling.tile_size = tx * f;
        tiling.overlap = std::clamp(p.vae_tile_overlap, 0.0f, 0.9f);
    }

    // Init image latent (img2img / inpainting), encoded once; sampled per image with its RNG.
    std::optional<vae::LatentDist> init_dist;
    std::vector<float> mask_lat;          // [h, w], 1 = repaint
    std::optional<vae::LatentDist> masked_dist;  // in-painting UNets: the masked image
    if (init) {
        auto tv = Clock::now();
        vae::HostTensor img(1, 3, H, W);
        img.data = image_to_planar(*init, -1.0f, 1.0f);
        init_dist = model->encode(img, tiling);
        if (mask) {
            // diffusers' mask processor: binarised at 0.5 in pixel space (1 = repaint), then
            // resized to the latent by nearest neighbour
            std::vector<float> mfull = image_to_planar(*mask, 0.0f, 1.0f);
            for (auto& v : mfull) v = v >= 0.5f ? 1.0f : 0.0f;
            mask_lat = resize_nearest(mfull, H, W, (int)h, (int)w);
            if (model->is_inpaint()) {
                // diffusers StableDiffusionInpaintPipeline: mask binarised at 0.5, masked image = image * (mask < 0.5)
                vae::HostTensor mimg = img;
                for (int c = 0; c < 3; ++c)
                    for (size_t i = 0; i < (size_t)H * W; ++i)
                        if (mfull[i] >= 0.5f) mimg.data[(size_t)c * H * W + i] = 0.0f;
                masked_dist = model->encode(mimg, tiling);
            }
        } else if (model->is_inpaint()) {
            fail(ErrorKind::InvalidInput, "this is an in-painting model: pass --mask MASK with -i IMAGE (white = repaint)");
        }
        rep.vae_s += since(tv);
    } else if (model->is_inpaint()) {
        fail(ErrorKind::InvalidInput, "this is an in-painting model: pass -i IMAGE and --mask MASK");
    }

    const auto& ms = model->model_sampling();
    sampling::Schedule full;
    if (method == sampling::SamplerKind::DdimTrailing) full = sampling::ddim_trailing_schedule(ms, p.steps);
    else if (method == sampling::SamplerKind::DpmPP2M &&
             (sched == sampling::SchedulerKind::Discrete || sched == sampling::SchedulerKind::Karras))
        // DPM++ 2M runs on diffusers' DPMSolverMultistepScheduler timesteps (integer timesteps,
        // linspace over n+1 points), so that it equals diffusers' "DPM++ 2M" pipelines.
        full = sampling::diffusers_dpmsolver_schedule(ms, p.steps, sched == sampling::SchedulerKind::Karras);
    else full = sampling::make_schedule(ms, sched, p.steps);
    int start = 0;
    if (init) {
        // diffusers' img2img rule (StableDiffusionImg2ImgPipeline.get_timesteps): int(steps *
        // strength) steps run, from step steps - that; at least one step runs.
        int run = std::min(p.steps, (int)((double)p.steps * p.strength));
        if (run < 1) {
            log::warn("--strength {} with {} steps runs no step: running 1", p.strength, p.steps);
            run = 1;
        }
        start = p.steps - run;
    }
    sampling::Schedule schedule;
    schedule.sigmas.assign(full.sigmas.begin() + start, full.sigmas.end());
    schedule.timesteps.assign(full.timesteps.begin() + start, full.timesteps.end());

    for (int b = 0; b < p.batch_count; ++b) {
        const int64_t img_seed = seed + b;
        sampling::Rng rng(rng_kind, (uint64_t)img_seed);
        std::vector<float> x0;
        if (init_dist) {
            // diffusers retrieve_latents(sample_mode="sample"): mean + std * randn, then * scaling factor
            auto eps = rng.randn(lat_n);
            x0.resize((size_t)lat_n);
            for (size_t i = 0; i < x0.size(); ++i)
                x0[i] = (init_dist->mean.data[i] + std::exp(0.5f * init_dist->logvar.data[i]) * eps[i]) * model->scaling_factor();
        }
        // Draw order as diffusers' pipelines: init-image posterior, initial noise, then (inpainting)
        // the masked-image posterior, which ordinary models do not use but still draw.
        std::vector<float> noise = rng.randn(lat_n);
        std::vector<float> masked_lat;
        if (mask) {
            auto eps = rng.randn(lat_n);
            if (masked_dist) {
                masked_lat.resize((size_t)lat_n);
                for (size_t i = 0; i < masked_lat.size(); ++i)
                    masked_lat[i] = (masked_dist->mean.data[i] + std::exp(0.5f * masked_dist->logvar.data[i]) * eps[i]) *
                                    model->scaling_factor();
            }
        }
        // Inpainting at full strength starts from pure noise (diffusers is_strength_max);
        // img2img adds noise to the init latent at the first sigma.
        const bool pure_noise = !init || (mask && start == 0);
        std::vector<float> x = sampling::noise_latent(pure_noise ? std::vector<float>{} : x0, noise, schedule.sigmas[0], false);
        sampling::Rng srng = sampler_rng_kind == rng_kind ? rng : sampling::Rng(sampler_rng_kind, (uint64_t)img_seed);

        const int64_t cin = model->unet_in_channels();
        std::vector<float> unet_in((size_t)(cin * h * w));
        sampling::ModelFn fn = [&](std::span<const float> x_in, double t, sampling::Branch br, std::span<float> out) {
            std::copy(x_in.begin(), x_in.end(), unet_in.begin());
            if (cin == 9) {
                std::copy(mask_lat.begin(), mask_lat.end(), unet_in.begin() + lat_n);
                std::copy(masked_lat.begin(), masked_lat.end(), unet_in.begin() + lat_n + h * w);
            }
            model->unet(unet_in, h, w, t, br == sampling::Branch::Cond ? cond : uncond, out);
        };
        sampling::Denoiser den(ms, fn, p.cfg_scale);
        sampling::Sampler sampler(method, schedule, {1, C, h, w}, x, srng, false, p.eta > 0 ? p.eta : -1.0f);
        const bool blend = mask && !model->is_inpaint();
        int step = 0;
        while (!sampler.done()) {
            auto ts = Clock::now();
            sampler.step(den);
            ++step;
            if (blend) {
                // ordinary model inpainting: keep the known region at the current noise level
                auto st = sampler.state();
                float sigma = st.sigmas[(size_t)st.step];
                auto known = sampling::noise_latent(x0, noise, sigma, false);
                sampling::inpaint_blend(st.x, known, mask_lat, st.shape);
                sampler = sampling::Sampler(std::move(st));
            }
            double dt = since(ts);
            rep.step_s.push_back(dt);
            if (progress) progress(b, step, sampler.steps(), dt);
        }
        std::vector<float> lat = sampler.result();

        auto tv = Clock::now();
        vae::HostTensor z(1, C, h, w);
        z.data = std::move(lat);
        vae::HostTensor img = model->decode(z, tiling);
        rep.vae_s += since(tv);
        Image out = image_from_planar(img.data, (int)img.w, (int)img.h, 3, -1.0f, 1.0f);

        GenerationInfo gi;
        gi.prompt = p.prompt;
        gi.negative_prompt = p.negative_prompt;
        gi.steps = p.steps;
        gi.sampler = a1111_sampler_name(sampling::sampler_name(method));
        gi.scheduler = a1111_scheduler_name(sampling::scheduler_name(sched));
        gi.cfg_scale = p.cfg_scale;
        gi.seed = img_seed;
        gi.width = W;
        gi.height = H;
        gi.model = model_stem(p);
        if (init) gi.denoising_strength = p.strength;
        gi.clip_skip = clip_skip;
        gi.rng = rng_kind == sampling::RngKind::Cpu ? "CPU" : rng_kind == sampling::RngKind::Cuda ? "NV" : "std_default";
        Infotext it = make_infotext(gi);
        std::vector<PngTextEntry> texts{{"parameters", format_infotext(it)}};
        std::string path = batch_output_path(p.output, b, p.batch_count);
        save_png(path, out, texts);
        rep.outputs.push_back(path);
    }
    rep.param_bytes = model->te_param_bytes() + model->unet_param_bytes() + model->vae_param_bytes();
    rep.compute_peak_bytes = std::max(model->te_compute_bytes(), model->unet_compute_bytes());
    rep.host_peak_rss_bytes = peak_rss();
    return rep;
}

}  // namespace easel::pipeline
