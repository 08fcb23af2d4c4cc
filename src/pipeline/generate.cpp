#include "pipeline/generate.h"

#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "core/strings.h"
#include "easel_version.h"
#include "lora/apply.h"
#include "lora/lora_file.h"
#include "lora/request.h"
#include "models/family.h"
#include "models/recommended.h"
#include "models/family_base.h"
#include "models/sd/stable_diffusion.h"
#include "pipeline/artifact.h"
#include "pipeline/cache.h"
#include "pipeline/fingerprint.h"
#include "pipeline/flag_checks.h"
#include "pipeline/hires.h"
#include "pipeline/image_io.h"
#include "pipeline/memory_check.h"
#include "pipeline/png_meta.h"
#include "sampling/names.h"
#include "pipeline/stages.h"
#include "pipeline/upscale.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "sampling/sampler.h"
#include "text/embeddings.h"
#include "text/prompt_syntax.h"
#include "text/unicode.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <fstream>
#include <random>
#include <string_view>
#include <thread>

namespace easel::pipeline {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using models::Module;

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
    fs::path path = platform::u8path(m);
    if (path.filename().empty()) path = path.parent_path();
    return platform::path_utf8(path.stem());
}

size_t peak_rss() { return (size_t)platform::peak_rss_bytes(); }

/// Everything resolved from the flags before a model is opened.
struct Setup {
    GenerateParams p;
    sampling::SamplerKind method = sampling::SamplerKind::EulerA;
    sampling::SchedulerKind sched = sampling::SchedulerKind::Discrete;
    bool method_given = false, sched_given = false;  ///< from the flags (or implied by an A1111 name)
    std::vector<float> sigmas;                       ///< --sigmas
    sampling::RngKind rng_kind, sampler_rng_kind;
    int threads = 1;
    int64_t seed = 0;
    ggml_backend_dev_t device = nullptr;
    /// The images the job encodes ({H, W} pixels as loaded): -i, and the reference images -r
    /// (FamilyOptions::vae_encode_sizes / reference_sizes: the encode stage's plan).
    std::vector<std::pair<int64_t, int64_t>> encode_sizes, reference_sizes;
    /// Generator::Options::keep_loaded: a stage leaves its modules loaded for the next job.
    bool keep_loaded = false;
    /// The LoRAs of the job (--lora, prompt tags), resolved and with their files' headers checked.
    std::vector<lora::LoraRequest> loras;
    /// The model file's recommended sampling settings (easel.* metadata), read when it is opened.
    models::RecommendedSettings recommended;
    /// --embd-dir's textual-inversion embeddings, read, and their files (the conditioning cache key).
    std::vector<text::Embedding> embeddings;
    std::vector<std::string> embedding_files;
    /// DenoiseJob::start_step (the hires fix's second pass); -1: the cut from --strength.
    int start_step = -1;
    /// Infotext: a denoising strength and fields after the fixed ones (the hires fix's).
    std::optional<double> info_strength;
    std::vector<std::pair<std::string, std::string>> info_extra;
};

/// --lora, --lora-model-dir with the prompts' tags, --lora-apply-mode and --embd-dir, checked
/// before anything runs: every file found, every weight a number, every LoRA file's keys one of
/// the known formats, no NaN in them (the fit to the model is checked by apply_loras).
void check_loras(Setup& s) {
    const GenerateParams& p = s.p;
    (void)lora::parse_apply_mode(p.lora_apply_mode);
    if (!p.lora_model_dir.empty() && !std::filesystem::is_directory(p.lora_model_dir))
        fail(ErrorKind::Io, "--lora-model-dir '{}' is not a folder", p.lora_model_dir);
    const bool tags = p.prompt.find('<') != std::string::npos || p.negative_prompt.find('<') != std::string::npos;
    s.loras = lora::collect_loras(p.loras, tags ? text::extract_extra_networks(p.prompt) : text::PromptTags{},
                                  tags ? text::extract_extra_networks(p.negative_prompt) : text::PromptTags{}, p.lora_model_dir);
    for (const lora::LoraRequest& r : s.loras) {
        if (!r.active()) {
            log::info("LoRA '{}' ({}) has weight 0: off", r.name, r.path.string());
            continue;
        }
        lora::LoraFile::open(r.path).check_values();  // a malformed file fails here, before the model opens
    }
    if (!p.embd_dir.empty()) {
        // every embedding of the folder, as A1111 loads its embeddings folder; a file that is not
        // one is named and left out
        for (const auto& [name, path] : text::list_embeddings(p.embd_dir)) {
            try {
                s.embeddings.push_back(text::read_embedding(path));
                s.embedding_files.push_back(platform::path_utf8(path));
            } catch (const Error& e) {
                log::warn("--embd-dir: {} is left out: {}", platform::path_utf8(path), e.what());
            }
        }
        log::info("--embd-dir {}: {} textual-inversion embeddings", p.embd_dir, s.embeddings.size());
    }
}

/// The job's LoRAs onto the open model (models::set_loras): their values checked, their fit to
/// the model checked, modules loaded with another set unloaded.
void apply_loras(const Setup& s, models::Family& fam) {
    models::set_loras(fam, lora::open_loras(s.loras), lora::parse_apply_mode(s.p.lora_apply_mode));
    if (auto* sd = dynamic_cast<models::sd::StableDiffusion*>(&fam)) sd->set_embeddings(s.embeddings);
    else if (!s.embeddings.empty())
        log::warn("--embd-dir: textual-inversion embeddings are for SD1.x/SD2.x's CLIP text encoders; {} does not use them", fam.name());
}

/// Frees module m after its stage, unless the job runs on a Generator that keeps its modules.
void release(models::Family& fam, const Setup& s, Module m) {
    if (!s.keep_loaded) fam.unload(m);
}

/// Refuses a prompt that is not UTF-8 (the tokenizers and the PNG metadata need text): one line
/// with the flag, the byte and its offset. Throws Error(InvalidInput).
void check_utf8(const std::string& text, const char* flag) {
    const size_t at = text::first_invalid_utf8(text);
    if (at == std::string::npos) return;
    fail(ErrorKind::InvalidInput, "{} is not valid UTF-8 (byte 0x{:02X} at offset {}): pass UTF-8 text", flag,
         (unsigned)(unsigned char)text[at], at);
}

Setup resolve(const GenerateParams& params) {
    Setup s;
    s.p = params;
    GenerateParams& p = s.p;
    if (p.model.empty() && p.diffusion_model.empty()) {
        p.model = find_demo_model();
        if (p.model.empty()) fail(ErrorKind::InvalidInput, "no model given: pass -m MODEL (a checkpoint file or a diffusers folder)");
        log::info("no -m given: using the bundled demo model {}", p.model);
    }
    // (a scale such as 1e30 would reach the sampler and come back as "the model gave NaN")
    if (!(p.cfg_scale >= 0.0f && p.cfg_scale <= kMaxCfgScale))
        fail(ErrorKind::InvalidInput, "--cfg-scale {} is outside 0..{}: pass a guidance scale such as 7 (SD), or 1 (CFG off: distilled models)",
             p.cfg_scale, kMaxCfgScale);
    if (!std::isfinite(p.eta) || p.eta < 0) fail(ErrorKind::InvalidInput, "--eta must be a finite number >= 0, got {}", p.eta);
    if (!std::isfinite(p.flow_shift)) fail(ErrorKind::InvalidInput, "--flow-shift must be a finite number");
    // image b uses seed + b: the last one must still be a valid (non-negative) int64 seed
    if (p.seed >= 0 && p.seed > std::numeric_limits<int64_t>::max() - (p.batch_count - 1))
        fail(ErrorKind::InvalidInput, "-s {} with -b {}: the seeds of the later images pass {}; pass a smaller -s", p.seed,
             p.batch_count, std::numeric_limits<int64_t>::max());
    check_utf8(p.prompt, "-p/--prompt");
    check_utf8(p.negative_prompt, "-n/--negative-prompt");
    if (p.steps < 1) fail(ErrorKind::InvalidInput, "--steps {} must be at least 1", p.steps);
    if (p.batch_count < 1) fail(ErrorKind::InvalidInput, "--batch-count {} must be at least 1", p.batch_count);
    if (p.strength < 0 || p.strength > 1) fail(ErrorKind::InvalidInput, "--strength {} must be between 0 and 1", p.strength);
    if (!p.mask.empty() && p.init_img.empty() && p.load_latent.empty())
        fail(ErrorKind::InvalidInput, "--mask needs an init image (-i IMAGE; denoise: --load-latent from encode-image)");
    if ((p.resume || p.resume_step >= 0) && p.checkpoint_dir.empty())
        fail(ErrorKind::InvalidInput, "--resume/--resume-step need --checkpoint-dir DIR (where the checkpoints are)");
    if (p.cache_max_mib < 0) fail(ErrorKind::InvalidInput, "--cache-max-mib {} must be >= 0", p.cache_max_mib);
    // sd-cli: --hires-upscaler None turns the hires fix off
    if (p.hires && !p.hires_a1111_none && ascii_lower(p.hires_upscaler) == "none") {
        log::info("--hires-upscaler None: no hires fix");
        p.hires = false;
    }
    check_hires_flags(p);
    // Names given are checked now (fail fast); absent ones take the family's defaults once the
    // model is open (apply_family_defaults).
    // Any name of the one table (sampling/names.h): easel / sd-cli, A1111 ("DPM++ 2M Karras"), ComfyUI.
    // An A1111 sampler name implies its schedule ("... Karras", or A1111's automatic choice) unless
    // --scheduler says otherwise; a name that spells the schedule out must agree with --scheduler.
    std::optional<sampling::SchedulerKind> sched_flag;
    if (!p.scheduler.empty()) sched_flag = sampling::resolve_scheduler_name(p.scheduler);
    if (!p.sampling_method.empty()) {
        const auto r = sampling::resolve_sampler_name(p.sampling_method);
        s.method = r.sampler;
        s.method_given = true;
        if (r.explicit_scheduler && sched_flag && r.scheduler && *sched_flag != *r.scheduler)
            fail(ErrorKind::InvalidInput, "--sampling-method \"{}\" names the {} schedule but --scheduler is {}: give one of them",
                 p.sampling_method, sampling::scheduler_name(*r.scheduler), sampling::scheduler_name(*sched_flag));
        if (r.scheduler && !sched_flag) {
            s.sched = *r.scheduler;
            s.sched_given = true;
        }
    }
    if (sched_flag) {
        s.sched = *sched_flag;
        s.sched_given = true;
    }
    if (!p.sigmas.empty()) s.sigmas = sampling::parse_sigmas(p.sigmas);
    check_loras(s);
    s.rng_kind = sampling::parse_rng_kind(p.rng);
    s.sampler_rng_kind = p.sampler_rng.empty() ? s.rng_kind : sampling::parse_rng_kind(p.sampler_rng);
    s.threads = p.threads > 0 ? p.threads : (int)std::max(1u, std::thread::hardware_concurrency());
    s.seed = p.seed;
    if (s.seed < 0) {
        std::random_device rd;
        s.seed = ((int64_t)rd() << 31 ^ rd()) & 0x7fffffff;
        log::info("seed: {}", s.seed);
    }
    return s;
}

DenoiseJob make_job(const Setup& s, int64_t img_seed, int W, int H);

/// The sampler, scheduler, --eta and --sigmas against the model, before any stage runs: a method
/// without a flow form on a flow model, a schedule the model cannot have (ays on a flow model, a
/// --sigmas value above 1 on one, ...), TCD's eta above 1. Warns when --eta is given to a method
/// it does not change. Throws Error(InvalidInput).
void check_sampling(const Setup& s, const models::Family& fam) {
    const auto& info = sampling::sampler_info(s.method);
    const bool flow = fam.model_sampling().is_flow();
    if (flow && !info.flow) {
        std::string ok;
        for (const auto& i : sampling::sampler_infos())
            if (i.flow) ok += (ok.empty() ? "" : ", ") + std::string(i.name);
        fail(ErrorKind::InvalidInput, "sampling method {} has no form for flow models ({}): use one of {}", info.name, fam.name(), ok);
    }
    if (s.p.eta_given && !info.uses_eta) log::warn("--eta {} has no effect on {}: it is deterministic", s.p.eta, info.name);
    if (s.method == sampling::SamplerKind::Tcd && (s.p.eta_given || s.p.eta > 0) && s.p.eta > 1)
        fail(ErrorKind::InvalidInput, "--eta {} for tcd (its gamma) must be between 0 and 1", s.p.eta);
    (void)job_schedule(fam, make_job(s, 0, s.p.width, s.p.height), false);
}

/// Whether the job needs the negative prompt's conditioning: CFG, or a CFG++ sampler (which uses
/// the unconditional prediction at every CFG scale).
bool need_negative(const Setup& s) { return s.p.cfg_scale != 1.0f || sampling::sampler_info(s.method).needs_uncond; }

/// Sampler, scheduler, steps, CFG scale and size the user left out: what the model file recommends
/// (its easel.* metadata, docs/formats.md; logged), else the family's defaults (SD: euler_a,
/// discrete, 20, 7; Z-Image: euler, discrete, 8, 1; FLUX.2 Klein distilled: euler, flux2, 4, 1).
/// The size keeps GenerateParams' value unless the file recommends one.
void apply_family_defaults(Setup& s, const models::Family& fam) {
    const auto d = fam.defaults();
    const models::RecommendedSettings& rec = s.recommended;
    std::vector<std::string> taken;  // what came from the file, for the log line
    std::optional<sampling::SchedulerKind> rec_sched;  // a recommended A1111 name may imply a schedule
    if (!s.method_given && rec.sampler) {
        const auto r = sampling::resolve_sampler_name(*rec.sampler);
        s.method = r.sampler;
        rec_sched = r.scheduler;
        taken.push_back("sampler " + *rec.sampler);
    } else if (!s.method_given) {
        s.method = sampling::parse_sampler(d.sampler);
    }
    if (rec.scheduler) rec_sched = sampling::resolve_scheduler_name(*rec.scheduler);
    // tcd: sd.cpp's default scheduler for it is lcm (lcm keeps easel's earlier default, the family's)
    if (!s.sched_given && rec_sched) {
        s.sched = *rec_sched;
        taken.push_back("scheduler " + std::string(sampling::scheduler_name(*rec_sched)));
    } else if (!s.sched_given) {
        s.sched = s.method == sampling::SamplerKind::Tcd ? sampling::SchedulerKind::Lcm : sampling::parse_scheduler(d.scheduler);
    }
    if (!s.p.steps_given) s.p.steps = rec.steps.value_or(d.steps);
    if (!s.p.steps_given && rec.steps) taken.push_back(fmt::format("{} steps", *rec.steps));
    if (!s.p.cfg_scale_given) s.p.cfg_scale = rec.cfg_scale.value_or(d.cfg_scale);
    if (!s.p.cfg_scale_given && rec.cfg_scale) taken.push_back(fmt::format("CFG scale {}", *rec.cfg_scale));
    if (!s.p.width_given && rec.width) {
        s.p.width = *rec.width;
        taken.push_back(fmt::format("width {}", *rec.width));
    }
    if (!s.p.height_given && rec.height) {
        s.p.height = *rec.height;
        taken.push_back(fmt::format("height {}", *rec.height));
    }
    if (!taken.empty()) {
        std::string list;
        for (const auto& t : taken) list += (list.empty() ? "" : ", ") + t;
        log::info("from the model file's recommended settings (easel.* metadata of {}): {}", rec.file, list);
    }
    if (!s.sigmas.empty()) {
        const int n = static_cast<int>(s.sigmas.size()) - 1;
        // (said only of a list custom_schedule will accept: a refused one gets its one error line)
        const bool decreasing = n >= 1 && std::is_sorted(s.sigmas.rbegin(), s.sigmas.rend()) &&
                                std::adjacent_find(s.sigmas.begin(), s.sigmas.end()) == s.sigmas.end();
        if (s.p.steps != n && decreasing) log::info("--sigmas gives {} steps (--steps {} is not used)", n, s.p.steps);
        s.p.steps = n;
    }
}

/// --vae-tile-size's X in latent cells (square tiles of X x X). Throws Error(InvalidInput).
int vae_tile_cells(const GenerateParams& p) {
    int tx = 32, ty = 32;
    if (std::sscanf(p.vae_tile_size.c_str(), "%dx%d", &tx, &ty) < 1 || tx <= 0)
        fail(ErrorKind::InvalidInput, "--vae-tile-size {}: expected [X]x[Y], positive latent cells, e.g. 32x32", p.vae_tile_size);
    return tx;
}

/// --vae-tiling's tile and overlap checked before anything runs (the decode would otherwise
/// fail only after the denoising): overlap in [0, 1), and a tile that still advances.
void check_vae_tiling_impl(const GenerateParams& p) {
    if (!p.vae_tiling) return;
    const int cells = vae_tile_cells(p);
    const float ov = p.vae_tile_overlap;
    if (!(ov >= 0.0f && ov < 1.0f))
        fail(ErrorKind::InvalidInput, "--vae-tile-overlap {} is outside [0, 1); use e.g. 0.5", ov);
    const float used = std::clamp(ov, 0.0f, 0.9f);  // as tiling_options() applies it
    if ((int64_t)((double)cells * (1.0 - (double)used)) <= 0)
        fail(ErrorKind::InvalidInput, "--vae-tile-size {}: a tile of {} latent cells with overlap {} leaves no step between tiles; use at least {}x{}",
             p.vae_tile_size, cells, used, (int)std::ceil(1.0 / (1.0 - (double)used)), (int)std::ceil(1.0 / (1.0 - (double)used)));
}

std::unique_ptr<models::Family> open_model(Setup& s) {
    // (the device and the family's defaults are set on `s`; Generator keeps both for later jobs)
    const GenerateParams& p = s.p;
    models::ModelFiles files;
    files.model = p.model;
    files.diffusion_model = p.diffusion_model;
    files.vae = p.vae;
    files.taesd = p.taesd;
    files.clip_l = p.clip_l;
    files.clip_g = p.clip_g;
    files.t5xxl = p.t5xxl;
    files.llm = p.llm;
    models::FamilyOptions fo;
    s.device = pick_device();
    fo.te_device = fo.diffusion_device = fo.vae_device = s.device;
    if (p.placement.any()) {
        // sd-cli placement flags (docs/placement.md): a device per module; the diffusion model
        // runs under a placement plan (layer split, weights in RAM / on disk, --max-vram)
        auto spec = std::make_shared<placement::PlacementSpec>(placement::parse_placement(p.placement, placement::device_names()));
        for (auto& w : spec->warnings) log::warn("{}", w);
        using placement::PModule;
        fo.te_device = placement::find_device((*spec)[PModule::Te].devices.at(0));
        fo.diffusion_device = placement::find_device((*spec)[PModule::Diffusion].devices.at(0));
        // (the VAE decoder and encoder run under their plans; TAESD whole on the first vae device)
        fo.vae_device = placement::find_device((*spec)[PModule::Vae].devices.at(0));
        s.device = fo.diffusion_device;
        fo.placement = spec;
    }
    fo.threads = s.threads;
    fo.flash_attn_te = p.flash_attn;
    fo.flash_attn_diffusion = p.flash_attn || p.diffusion_fa;
    fo.vae_conv_direct = p.vae_conv_direct;
    fo.diffusion_conv_direct = p.diffusion_conv_direct;
    fo.weight_type = p.weight_type;
    fo.prediction = p.prediction;
    fo.flow_shift = p.flow_shift;
    fo.guidance = p.guidance;
    fo.vae_tile = planned_vae_tile(p);
    fo.vae_encode_sizes = s.encode_sizes;
    fo.reference_sizes = s.reference_sizes;
    auto fam = models::open_family(files, fo);
    s.recommended = models::read_recommended(files);
    apply_family_defaults(s, *fam);
    check_sampling(s, *fam);
    warn_inapplicable_flags(p, *fam);  // --guidance, --prediction, --vae-tile-size XxY the model does not use
    apply_loras(s, *fam);
    return fam;
}

vae::TilingOptions tiling_options(const GenerateParams& p, int f) {
    vae::TilingOptions tiling;
    tiling.enabled = p.vae_tiling;
    tiling.tile_size = vae_tile_cells(p) * f;
    tiling.overlap = std::clamp(p.vae_tile_overlap, 0.0f, 0.9f);
    return tiling;
}

std::optional<ArtifactCache> open_cache(const GenerateParams& p) {
    if (p.no_cache) return std::nullopt;
    if (!p.cache_dir.empty()) return ArtifactCache(platform::u8path(p.cache_dir), (uint64_t)p.cache_max_mib << 20);  // an explicit folder must work
    try {
        return ArtifactCache(default_cache_dir(), (uint64_t)p.cache_max_mib << 20);
    } catch (const Error& e) {
        // e.g. a read-only home folder: the job runs as it would with --no-cache
        log::debug("{}; running without the cache", e.what());
        return std::nullopt;
    }
}

/// --checkpoint-dir made (or found) before any stage: a path that is a file, or a folder that
/// cannot be created, is refused up front; so is a folder another easel process is writing
/// checkpoints into (an exclusive lock on <dir>/.easel.lock, held by the returned object for the
/// whole job and released by the OS if the process dies). Throws Error(Io).
[[nodiscard]] std::optional<platform::FileLock> prepare_checkpoint_dir(const GenerateParams& p) {
    if (p.checkpoint_dir.empty()) return std::nullopt;
    std::error_code ec;
    if (fs::exists(platform::u8path(p.checkpoint_dir), ec) && !fs::is_directory(platform::u8path(p.checkpoint_dir), ec))
        fail(ErrorKind::Io, "--checkpoint-dir {}: exists and is not a folder; pass a folder path", p.checkpoint_dir);
    fs::create_directories(platform::u8path(p.checkpoint_dir), ec);
    if (!fs::is_directory(platform::u8path(p.checkpoint_dir), ec)) fail(ErrorKind::Io, "--checkpoint-dir {}: cannot create the folder", p.checkpoint_dir);
    auto lock = platform::FileLock::try_lock(platform::u8path(p.checkpoint_dir) / ".easel.lock");
    if (!lock)
        fail(ErrorKind::Io, "--checkpoint-dir {}: another easel process is writing checkpoints there; wait for it to end or give another folder",
             p.checkpoint_dir);
    return lock;
}

/// --resume / --resume-step checked once the step count is known (after the family's defaults),
/// before any stage: a step past --steps, and no checkpoint of image 1 to resume from.
/// Throws Error(InvalidInput).
void check_resume(const GenerateParams& p) {
    if (p.resume_step >= 0 && p.resume_step > p.steps)
        fail(ErrorKind::InvalidInput, "--resume-step {} is past --steps {}: pass a step from 0 to {}", p.resume_step, p.steps, p.steps);
    if (!p.resume && p.resume_step < 0) return;
    if (!p.resume && p.resume_step == 0) return;  // step 0 is the initial latent: made again from the seed (and -i), no file needed
    if (find_checkpoint(platform::u8path(p.checkpoint_dir), 0, p.resume ? -1 : p.resume_step)) return;
    if (p.resume_step >= 0)
        fail(ErrorKind::InvalidInput, "--resume-step {}: no checkpoint {} in {}", p.resume_step, platform::path_utf8(checkpoint_path("", 0, p.resume_step)),
             p.checkpoint_dir);
    fail(ErrorKind::InvalidInput, "--resume: no checkpoint of image 1 in {}", p.checkpoint_dir);
}

/// Warns when -o holds a % sequence batch_output_path() does not replace as a user may expect:
/// more than one %d (each gets the same image number) or another conversion (%s, %x ...: kept
/// as written).
void warn_output_pattern(const std::string& pattern) {
    int numbers = 0, others = 0;
    for (size_t i = 0; i < pattern.size(); ++i) {
        if (pattern[i] != '%') continue;
        if (i + 1 < pattern.size() && pattern[i + 1] == '%') {
            ++i;
            continue;
        }
        size_t j = i + 1;
        while (j < pattern.size() && std::isdigit((unsigned char)pattern[j])) ++j;
        if (j < pattern.size() && pattern[j] == 'd') ++numbers;
        else ++others;
        i = j < pattern.size() ? j : i;
    }
    if (numbers > 1) log::warn("-o {}: {} %d placeholders; each one is replaced by the same image number", pattern, numbers);
    if (others > 0) log::warn("-o {}: only %d (the image number) and %% are replaced; other % sequences are kept as written", pattern);
}

std::string device_name(ggml_backend_dev_t d) { return d ? ggml_backend_dev_name(d) : "CPU"; }

/// The upscaler of a job (--upscale-model with --upscale-repeats >= 1), opened (headers only) so
/// that a wrong file fails before any stage; nullptr without one.
std::unique_ptr<ImageUpscaler> open_upscaler(const GenerateParams& p, int threads) {
    if (p.upscale_model.empty()) return nullptr;
    if (p.upscale_repeats < 1) {
        log::info("--upscale-repeats {}: the upscaler is not run", p.upscale_repeats);
        return nullptr;
    }
    UpscaleOptions o;
    o.model = p.upscale_model;
    o.repeats = p.upscale_repeats;
    o.tile = p.upscale_tile_size;
    o.threads = threads;
    o.placement = p.placement;
    return std::make_unique<ImageUpscaler>(o);
}

/// Before any stage: the upscaled result of a W x H image fits host memory, and the upscaler's
/// plan (one tile's graph) fits its device; the plan is logged when placement flags are given.
void check_upscaler(ImageUpscaler& up, const GenerateParams& p, int W, int H) {
    up.check_memory(W, H);
    int tile = 0;
    const placement::ModulePlan plan = up.plan(W, H, &tile);
    log::info("upscaler: {}, {}", up.describe(), tile > 0 ? fmt::format("tiles of {} px", tile) : "the whole image at once");
    if (p.placement.any()) log::info("placement plan of the upscale stage:\n{}", placement::format_plan({plan}));
}

/// Upscales decoded images and writes them (the upscale stage: after the VAE is freed).
void upscale_and_save(ImageUpscaler& up, const GenerateParams& p, std::vector<Image>& images, const std::vector<std::vector<PngTextEntry>>& texts,
                      const std::vector<std::string>& paths, GenerateReport* rep) {
    for (size_t i = 0; i < images.size(); ++i) {
        UpscaleReport r;
        Image out = up.upscale(images[i], &r);
        images[i] = Image{};  // the decoded image is no longer needed
        std::vector<PngTextEntry> t = texts[i];
        t.push_back({"postprocessing", postprocessing_text(up, p.upscale_repeats)});
        save_image(platform::u8path(paths[i]), out, t);
        log::info("{}", format_upscale_report(up, r));
        if (rep) {
            rep->upscale_s += r.seconds;
            rep->upscale_peak_bytes = r.peaks;
        }
    }
}

/// Before any stage: the placement plan (placed jobs; a plan that cannot fit its budgets stops
/// here) or, on the plain path, every module's whole need on the job's device, compared with the
/// machine (host RAM for the CPU, the device's total memory otherwise) without allocating
/// (pipeline/memory_check.h). Costing the modules also checks every module's tensor shapes
/// against its file's headers (runtime::self_contained_costs), so a mis-shaped VAE is reported
/// before the text encoder runs. Throws Error(OutOfMemory) / Error(ModelMismatch).
void check_memory(models::Family& fam, const Setup& s, int W, int H) {
    const GenerateParams& p = s.p;
    const int f = fam.latent_format().spatial_factor;
    MemoryJob job;
    job.width = W;
    job.height = H;
    job.flash_attn = p.flash_attn;
    job.diffusion_fa = p.flash_attn || p.diffusion_fa;
    job.vae_tiling = p.vae_tiling;
    if (p.placement.any()) {
        auto plans = fam.plan_placement(H / f, W / f);
        if (plans.empty()) return;
        log::info("placement plan:\n{}", placement::format_plan(plans));
        check_plans_fit_host(plans, job, host_ram_bytes());
        return;
    }
    std::vector<placement::ModuleCosts> costs;
    try {
        costs = fam.placement_costs(H / f, W / f);
    } catch (const Error& e) {
        // --load-embeddings needs no text encoder: a file without one (a UNet alone) still runs
        if (p.load_embeddings.empty() || e.kind() != ErrorKind::ModelMismatch) throw;
        log::debug("memory check skipped: {}", e.what());
        return;
    }
    const std::string dev = device_name(s.device);
    const auto needs = whole_module_needs(costs, [&](placement::PModule) { return dev; });
    for (const auto& n : needs)
        log::debug("predicted need of {} on {}: parameters {:.1f} MiB, compute {:.1f} MiB", placement::pmodule_name(n.module), n.device,
                   (double)n.params / 1048576.0, (double)n.compute / 1048576.0);
    check_needs_fit(needs, job, [&](const std::string& name) -> uint64_t {
        if (!s.device || ggml_backend_dev_type(s.device) == GGML_BACKEND_DEVICE_TYPE_CPU) return host_ram_bytes();
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(s.device, &free, &total);
        (void)name;
        return total;
    });
}

/// The text-encoder LoRAs of a job (lora::te_lora_key; "" when none).
std::string te_loras(const Setup& s) { return lora::te_lora_key(s.loras, lora::parse_apply_mode(s.p.lora_apply_mode)); }
/// The job's active LoRAs (lora::lora_set_key; "" when none).
std::string all_loras(const Setup& s) { return lora::lora_set_key(s.loras, lora::parse_apply_mode(s.p.lora_apply_mode)); }
/// A model fingerprint with the LoRAs applied to the module: "FP + LoRAs name@hash:te:unet (mode)",
/// so that artifacts and checkpoints name the LoRA set they were made with (resume compares it).
std::string with_loras(std::string fp, const std::string& loras) { return loras.empty() ? fp : fp + " + LoRAs " + loras; }

/// The cache key of a job's prompt conditioning: the text encoders' file identities (path, size,
/// mtime; nothing is read from them), the text-encoder LoRAs (file hashes, weights, mode), the
/// --embd-dir embeddings' file identities, the
/// prompts, clip skip, CFG on/off, weight type, flash attention and device.
std::string conditioning_key(models::Family& fam, const Setup& s, bool need_negative) {
    const GenerateParams& p = s.p;
    const int clip_skip = p.clip_skip > 0 ? p.clip_skip : fam.defaults().clip_skip;
    return cache_key({"conditioning", std::to_string(kArtifactFormatVersion), family_base_name(fam.name()),
                      file_identity(fam.module_files(Module::Te)), te_loras(s), file_identity(s.embedding_files), p.prompt, p.negative_prompt, std::to_string(clip_skip),
                      need_negative ? "neg" : "noneg", p.weight_type, p.flash_attn ? "fa" : "", device_name(s.device)});
}

/// The conditioning of a job: --load-embeddings, else the cache, else the text encoder.
PromptConditioning obtain_conditioning(models::Family& fam, const Setup& s, bool need_negative, ArtifactCache* cache,
                                       GenerateReport* rep) {
    const GenerateParams& p = s.p;
    const int clip_skip = p.clip_skip > 0 ? p.clip_skip : fam.defaults().clip_skip;
    if (!p.load_embeddings.empty()) {
        Artifact a = read_artifact(platform::u8path(p.load_embeddings), ArtifactKind::Conditioning);
        PromptConditioning c = conditioning_from_artifact(a, p.load_embeddings);
        if (c.family != family_base_name(fam.name()))
            fail(ErrorKind::ModelMismatch, "--load-embeddings {}: made by a {} text encoder, this model is {}", p.load_embeddings, c.family,
                 fam.name());
        if (need_negative && !c.has_negative)
            fail(ErrorKind::InvalidInput, "--load-embeddings {}: holds no negative prompt (encoded with --cfg-scale 1); this job uses CFG scale {}",
                 p.load_embeddings, p.cfg_scale);
        log::info("conditioning from {} (prompt \"{}\"); the text encoder is not loaded", p.load_embeddings, c.prompt);
        return c;
    }
    std::string key;
    if (cache) {
        key = conditioning_key(fam, s, need_negative);
        if (auto a = cache->get(ArtifactKind::Conditioning, key)) {
            try {
                PromptConditioning c = conditioning_from_artifact(*a, platform::path_utf8(cache->path(ArtifactKind::Conditioning, key)));
                log::info("cache hit: prompt conditioning from {}; the text encoder was not opened (saved ~{:.2f} s of encoding)",
                          platform::path_utf8(cache->path(ArtifactKind::Conditioning, key)), c.encode_s);
                if (rep) {
                    rep->conditioning_cached = true;
                    rep->te_saved_s = c.encode_s;
                }
                return c;
            } catch (const Error& e) {
                log::warn("cache entry refused ({}); encoding again", e.what());
            }
        }
    }
    StageMeter meter;
    PromptConditioning c = encode_prompts(fam, p.prompt, p.negative_prompt, clip_skip, need_negative);
    log_stage("encode-prompt", fam, {Module::Te}, meter);
    if (rep) rep->param_bytes += module_bytes(fam, Module::Te).params;
    if (cache || !p.save_embeddings.empty())
        c.model_fingerprint = with_loras(model_fingerprint(fam.module_files(Module::Te), p.full_fingerprint), te_loras(s));
    release(fam, s, Module::Te);
    if (cache) cache->put(key, conditioning_artifact(c));
    return c;
}

/// The init image's posterior: the cache, else the VAE encoder.
vae::LatentDist obtain_posterior(models::Family& fam, const Setup& s, const Image& img, const vae::TilingOptions& tiling,
                                 ArtifactCache* cache, const char* what) {
    std::string key;
    if (cache) {
        key = cache_key({"posterior", std::to_string(kArtifactFormatVersion), family_base_name(fam.name()),
                         file_identity(fam.module_files(Module::VaeEncoder)), xxh3_hex(img.pixels), std::to_string(img.width),
                         std::to_string(img.height), tiling.enabled ? fmt::format("{}:{}", tiling.tile_size, tiling.overlap) : "",
                         s.p.flash_attn ? "fa" : "", device_name(s.device)});
        if (auto a = cache->get(ArtifactKind::Latent, key)) {
            auto m = a->f32("mean"), lv = a->f32("logvar");
            const auto* t = a->find("mean");
            if (t && t->shape.size() == 4 && m.size() == lv.size()) {
                vae::LatentDist d;
                d.mean = vae::HostTensor(t->shape[0], t->shape[1], t->shape[2], t->shape[3]);
                d.logvar = d.mean;
                d.mean.data = std::move(m);
                d.logvar.data = std::move(lv);
                log::info("cache hit: {} latent from {}; the VAE encoder was not loaded", what, platform::path_utf8(cache->path(ArtifactKind::Latent, key)));
                return d;
            }
        }
    }
    vae::LatentDist d = encode_image(fam, img, tiling);
    if (cache) {
        nlohmann::json pj = {{"image_hash", xxh3_hex(img.pixels)}, {"width", img.width}, {"height", img.height}};
        cache->put(key, posterior_artifact(d, fam, pj));
    }
    return d;
}

/// A float flag's value as the decimal the user wrote (0.6f -> 0.6, not 0.6000000238418579): the
/// shortest decimal that reads back as the same float, as a double, for the infotext.
double as_written(float v) { return std::strtod(fmt::format("{}", v).c_str(), nullptr); }

std::string infotext_for(const Setup& s, const PromptConditioning& c, int64_t img_seed, int W, int H, bool has_init) {
    const GenerateParams& p = s.p;
    GenerationInfo gi;
    gi.prompt = c.prompt;
    gi.negative_prompt = c.negative_prompt;
    gi.steps = p.steps;
    gi.sampler = a1111_sampler_name(sampling::sampler_name(s.method));
    gi.scheduler = a1111_scheduler_name(sampling::scheduler_name(s.sched));
    gi.cfg_scale = as_written(p.cfg_scale);
    gi.seed = img_seed;
    gi.width = W;
    gi.height = H;
    gi.model = model_stem(p);
    if (has_init) gi.denoising_strength = as_written(p.strength);
    if (s.info_strength) gi.denoising_strength = s.info_strength;
    gi.extra = s.info_extra;
    gi.clip_skip = c.clip_skip;
    gi.rng = s.rng_kind == sampling::RngKind::Cpu ? "CPU" : s.rng_kind == sampling::RngKind::Cuda ? "NV" : "std_default";
    return format_infotext(make_infotext(gi));
}

DenoiseJob make_job(const Setup& s, int64_t img_seed, int W, int H) {
    DenoiseJob j;
    j.method = s.method;
    j.scheduler = s.sched;
    j.steps = s.p.steps;
    j.cfg_scale = s.p.cfg_scale;
    j.eta = (s.p.eta_given || s.p.eta > 0) ? s.p.eta : -1.0f;
    j.sigmas = s.sigmas;
    j.rng = s.rng_kind;
    j.sampler_rng = s.sampler_rng_kind;
    j.seed = img_seed;
    j.width = W;
    j.height = H;
    j.strength = s.p.strength;
    j.start_step = s.start_step;
    return j;
}

/// The resume state of image b, when asked for (nullopt: start fresh).
std::optional<sampling::SamplerState> resume_state(const Setup& s, int b, const nlohmann::json& job, const sampling::Schedule& sched) {
    const GenerateParams& p = s.p;
    if (!p.resume && p.resume_step < 0) return std::nullopt;
    if (p.resume) {
        // the newest checkpoint that can be read (a truncated or corrupt one is skipped, named)
        auto rp = load_latest_checkpoint(platform::u8path(p.checkpoint_dir), b, job, sched);
        if (!rp) {
            if (b == 0) fail(ErrorKind::InvalidInput, "--resume: no checkpoint of image 1 in {}", p.checkpoint_dir);
            log::info("image {}: no checkpoint, starting at step 0", b + 1);
            return std::nullopt;
        }
        log::info("image {}: resuming from {} ({} of {} steps done)", b + 1, platform::path_utf8(rp->path), rp->state.step, rp->state.timesteps.size());
        return std::move(rp->state);
    }
    if (p.resume_step == 0) {  // the state before step 1: the initial latent, the same as a fresh start
        log::info("image {}: --resume-step 0: starting from the initial latent (step 0)", b + 1);
        return std::nullopt;
    }
    auto path = find_checkpoint(platform::u8path(p.checkpoint_dir), b, p.resume_step);
    if (!path)
        fail(ErrorKind::InvalidInput, "--resume-step {}: no checkpoint {} in {}", p.resume_step,
             platform::path_utf8(checkpoint_path("", b, p.resume_step)), p.checkpoint_dir);
    auto st = load_checkpoint(*path, job, sched);
    log::info("image {}: resuming from {} ({} of {} steps done)", b + 1, platform::path_utf8(*path), st.step, st.timesteps.size());
    return st;
}

/// Image b's own inputs (the hires fix's second pass: each image its own init latent): fills in
/// the DenoiseInputs and the init hash.
using PerImageInputs = std::function<void(int b, DenoiseInputs& in, std::string& init_hash)>;

/// Denoises the batch; the final latents (diffusion space) in batch order. `infotexts` gets each
/// image's infotext, unless it already holds one for that image (then that one is kept and stored
/// with --save-latent).
std::vector<std::vector<float>> denoise_batch(models::Family& fam, const Setup& s, const PromptConditioning& cond, const DenoiseInputs& base,
                                              const std::string& init_hash, int W, int H, const ProgressFn& progress,
                                              std::vector<double>* step_s, std::vector<std::string>* infotexts,
                                              size_t* param_bytes = nullptr, const StepFn& on_step = {},
                                              bool* stopped = nullptr, const PerImageInputs& per_image = {}) {
    const GenerateParams& p = s.p;
    std::string fp;
    const bool ckpt = !p.checkpoint_dir.empty();
    if (ckpt) {
        std::error_code ec;
        fs::create_directories(platform::u8path(p.checkpoint_dir), ec);
        if (!fs::is_directory(platform::u8path(p.checkpoint_dir), ec))
            fail(ErrorKind::Io, "--checkpoint-dir {}: cannot create the folder", p.checkpoint_dir);
        fp = with_loras(model_fingerprint(fam.module_files(Module::Diffusion), p.full_fingerprint), all_loras(s));
    }
    const std::string chash = conditioning_hash(cond);
    std::vector<std::vector<float>> out;
    StageMeter meter;
    fam.load(Module::Diffusion);
    for (int b = 0; b < p.batch_count; ++b) {
        const int64_t img_seed = s.seed + b;
        DenoiseInputs in = base;
        std::string ihash = init_hash;
        if (per_image) per_image(b, in, ihash);
        const bool has_init = in.init_posterior || in.init_latent;
        DenoiseJob job = make_job(s, img_seed, W, H);
        DenoiseControl ctl;
        ctl.image = b;
        if (ckpt) {
            ctl.checkpoint_dir = platform::u8path(p.checkpoint_dir);
            ctl.job = job_params(job, family_base_name(fam.name()), fp, chash, ihash);
            ctl.resume = resume_state(s, b, ctl.job, job_schedule(fam, job, has_init));
        }
        if (progress) ctl.progress = [&, b](int step, int steps, double dt) { progress(b, step, steps, dt); };
        if (on_step)
            ctl.on_step = [&, b](const sampling::Sampler& smp) {
                StepInfo si;
                si.image = b;
                si.images = p.batch_count;
                si.step = (int)smp.step_index();
                si.steps = smp.steps();
                si.sampler = &smp;
                si.channels = fam.latent_format().channels;
                si.h = H / fam.latent_format().spatial_factor;
                si.w = W / fam.latent_format().spatial_factor;
                return on_step(si);
            };
        DenoiseResult r = denoise(fam, job, in, ctl);
        if (step_s) step_s->insert(step_s->end(), r.step_s.begin(), r.step_s.end());
        if (infotexts && (int)infotexts->size() <= b) infotexts->push_back(infotext_for(s, cond, img_seed, W, H, has_init));
        if (!p.save_latent.empty()) {
            nlohmann::json pj = job_params(job, family_base_name(fam.name()), fp, chash, ihash);
            pj["infotext"] = infotexts ? (*infotexts)[(size_t)b] : infotext_for(s, cond, img_seed, W, H, has_init);
            const auto lf = fam.latent_format();
            write_artifact(platform::u8path(batch_output_path(p.save_latent, b, p.batch_count)),
                           latent_artifact(r.latent, lf.channels, H / lf.spatial_factor, W / lf.spatial_factor, fam, pj));
        }
        out.push_back(std::move(r.latent));
        if (r.stopped) {  // interrupted: this image ends here, the later ones are not made
            if (stopped) *stopped = true;
            log::info("image {}: sampling stopped after step {} of {}", b + 1, r.step_s.size() + std::max<int64_t>(r.resumed_at, 0),
                      job.steps);
            break;
        }
    }
    log_stage("denoise", fam, {Module::Diffusion}, meter);
    if (param_bytes) *param_bytes += module_bytes(fam, Module::Diffusion).params;
    if (auto plans = fam.placement_plans(); !plans.empty())
        log::info("placement: peak bytes per device, measured beside the plan's prediction:\n{}",
                  placement::format_peaks(plans, fam.placement_peaks()));
    release(fam, s, Module::Diffusion);
    return out;
}

/// After a decode: when the VAE decoder ran under a placement plan, the measured peak per device
/// beside the prediction, over every placed module of the job (stages time-share a device).
void log_peaks_after_decode(const models::Family& fam) {
    auto plans = fam.placement_plans();
    if (std::none_of(plans.begin(), plans.end(), [](const placement::ModulePlan& pl) {
            return pl.module == placement::PModule::Vae && placement::stage_of(pl) != placement::kVaeEncodeStage;
        }))
        return;
    log::info("placement: peak bytes per device after the decode, measured beside the plan's prediction:\n{}",
              placement::format_peaks(plans, fam.placement_peaks()));
}

/// After an encode stage: when the VAE encoder ran under a placement plan, the measured peak per
/// device beside the prediction (over every placed module of the job so far).
void log_peaks_after_encode(const models::Family& fam) {
    auto plans = fam.placement_plans();
    if (std::none_of(plans.begin(), plans.end(), [](const placement::ModulePlan& pl) { return placement::stage_of(pl) == placement::kVaeEncodeStage; }))
        return;
    log::info("placement: peak bytes per device after the image encode, measured beside the plan's prediction:\n{}",
              placement::format_peaks(plans, fam.placement_peaks()));
}

/// A hires job's upscaler and target (pipeline/hires.h), resolved before any stage.
struct HiresPlan {
    HiresUpscaler up;
    HiresTarget target;
    std::unique_ptr<ImageUpscaler> model;  ///< Kind::Model: the ESRGAN network (headers only until used)
};

/// An image upscaled to w x h by the hires upscaler (A1111 images.resize_image, mode "Just
/// resize"): Lanczos / Nearest as PIL; a model runs until both sides reach the target (at most 3
/// passes, Upscaler.upscale), then a Lanczos resize to w x h.
Image hires_upscale_image(const Image& img, int w, int h, HiresPlan& hp, GenerateReport& rep) {
    switch (hp.up.kind) {
    case HiresUpscaler::Kind::Nearest: return resize_nearest_pil(img, w, h);
    case HiresUpscaler::Kind::Lanczos: return resize_lanczos_pil(img, w, h);
    case HiresUpscaler::Kind::Model: {
        Image cur = img;
        for (int pass = 0; pass < 3 && (cur.width < w || cur.height < h); ++pass) {
            UpscaleReport r;
            cur = hp.model->upscale(cur, &r);
            log::info("hires fix: {}", format_upscale_report(*hp.model, r));
            rep.upscale_s += r.seconds;
            rep.upscale_peak_bytes = r.peaks;
        }
        return resize_lanczos_pil(cur, w, h);
    }
    case HiresUpscaler::Kind::Latent: break;
    }
    fail(ErrorKind::Internal, "hires_upscale_image: a latent upscaler");
}

/// The hires fix's second pass (pipeline/hires.h) over the first pass's latents (W x H pixels):
/// the upscale (latent interpolation; or decode (VAE decoder, freed), pixel upscaler (freed),
/// encode (VAE encoder, freed)), then img2img at the target size with the job's seeds, prompts,
/// sampler and CFG, the last N steps of int(N / strength) (or --hires-sigmas). Checkpoints go to
/// <checkpoint-dir>/hires; --resume continues there when that pass has checkpoints. Returns the
/// latents at hp.target's size.
std::vector<std::vector<float>> hires_pass(models::Family& fam, const Setup& s, const PromptConditioning& cond,
                                           const std::vector<std::vector<float>>& lowres, int W, int H, HiresPlan& hp,
                                           const vae::TilingOptions& tiling, const ProgressFn& progress, GenerateReport& rep,
                                           std::vector<std::string>& infotexts, const StepFn& on_step) {
    const GenerateParams& p = s.p;
    const HiresTarget& t = hp.target;
    const auto lf = fam.latent_format();
    const int f = lf.spatial_factor;
    const int64_t C = lf.channels, h = H / f, w = W / f, uh = t.up_height / f, uw = t.up_width / f, th = t.height / f, tw = t.width / f;
    const size_t n = lowres.size();
    std::vector<std::vector<float>> init_lat(n);
    std::vector<vae::LatentDist> init_post(n);
    std::vector<std::string> hashes(n);
    auto tv = Clock::now();
    // --checkpoint-dir: each image's second-pass input (the upscaled latent, or the upscaled
    // image's posterior) is a file, DIR/hires/image<b>-input.safetensors, keyed by what made it (the
    // first pass's latent, the upscaler, the target); --resume reads it instead of upscaling again
    const bool ckpt = !p.checkpoint_dir.empty();
    const fs::path hdir = ckpt ? platform::u8path(p.checkpoint_dir) / "hires" : fs::path();
    if (ckpt) {
        std::error_code ec;
        fs::create_directories(hdir, ec);
        if (!fs::is_directory(hdir, ec)) fail(ErrorKind::Io, "--checkpoint-dir {}: cannot create the folder", platform::path_utf8(hdir));
    }
    auto input_path = [&](size_t b) { return hdir / fmt::format("image{}-input.safetensors", b + 1); };
    std::vector<std::string> input_keys(n);
    std::vector<bool> have(n, false);
    for (size_t b = 0; b < n; ++b) {
        input_keys[b] = "xxh3-128:" + hash_parts({"hires-input", family_base_name(fam.name()), hp.up.name, hp.up.model_path,
                                                  fmt::format("{}x{} {}x{} {},{}", t.up_width, t.up_height, t.width, t.height, t.crop_x, t.crop_y),
                                                  xxh3_hex(std::span<const uint8_t>((const uint8_t*)lowres[b].data(), lowres[b].size() * sizeof(float)))});
        std::error_code ec;
        if (!ckpt || !(p.resume || p.resume_step >= 0) || !fs::is_regular_file(input_path(b), ec)) continue;
        const Artifact a = read_artifact(input_path(b), ArtifactKind::Latent);
        const auto pj = nlohmann::json::parse(a.meta.count("params") ? a.meta.at("params") : "{}", nullptr, false);
        if (!pj.is_object() || pj.value("hires_input_key", "") != input_keys[b]) {
            log::info("image {}: {} was made from another first pass or upscaler; upscaling again", b + 1, platform::path_utf8(input_path(b)));
            continue;
        }
        LoadedLatent z = load_latent(input_path(b), fam);
        if (z.h != th || z.w != tw || (hp.up.is_latent() ? z.space != "diffusion" : z.space != "posterior")) continue;
        if (hp.up.is_latent()) init_lat[b] = std::move(z.latent);
        else init_post[b] = std::move(*z.posterior);
        have[b] = true;
        log::info("image {}: the hires pass's input from {}", b + 1, platform::path_utf8(input_path(b)));
    }
    const bool all_have = std::all_of(have.begin(), have.end(), [](bool v) { return v; });
    if (hp.up.is_latent()) {
        for (size_t b = 0; b < n; ++b) {
            if (have[b]) continue;
            const auto z = interpolate_latent(lowres[b], C, h, w, uh, uw, hp.up.mode, hp.up.antialias);
            init_lat[b] = crop_latent(z, C, uh, uw, t.crop_x, t.crop_y, tw, th);
        }
        if (!all_have)
            log::info("hires fix: {} upscale of the latent {}x{} -> {}x{} cells{}", hp.up.name, w, h, uw, uh,
                      uw != tw || uh != th ? fmt::format(", cropped to {}x{}", tw, th) : "");
    } else if (!all_have) {
        std::vector<Image> imgs(n);
        {
            StageMeter meter;
            for (size_t b = 0; b < n; ++b)
                if (!have[b]) imgs[b] = decode_latent(fam, lowres[b], h, w, tiling);
            log_stage("hires decode", fam, {Module::VaeDecoder}, meter);
            release(fam, s, Module::VaeDecoder);
        }
        for (size_t b = 0; b < n; ++b)
            if (!have[b]) imgs[b] = hires_upscale_image(imgs[b], t.up_width, t.up_height, hp, rep);
        hp.model.reset();  // the upscaler's weights are freed before the encoder loads
        log::info("hires fix: {} upscale of the image {}x{} -> {}x{}", hp.up.name, W, H, t.up_width, t.up_height);
        StageMeter meter;
        for (size_t b = 0; b < n; ++b) {
            if (have[b]) continue;
            vae::LatentDist d = encode_image(fam, imgs[b], tiling);
            imgs[b] = Image{};
            if (uw != tw || uh != th) {
                auto cut = [&](vae::HostTensor& x) {
                    vae::HostTensor r(1, C, th, tw);
                    r.data = crop_latent(x.data, C, uh, uw, t.crop_x, t.crop_y, tw, th);
                    x = std::move(r);
                };
                cut(d.mean);
                cut(d.logvar);
            }
            init_post[b] = std::move(d);
        }
        log_stage("hires encode", fam, {Module::VaeEncoder}, meter);
        release(fam, s, Module::VaeEncoder);
        log_peaks_after_encode(fam);
    }
    for (size_t b = 0; b < n; ++b) {
        const nlohmann::json pj{{"hires_input_key", input_keys[b]}, {"hires_upscaler", hp.up.name}, {"image", b + 1}};
        if (hp.up.is_latent()) {
            hashes[b] = xxh3_hex(std::span<const uint8_t>((const uint8_t*)init_lat[b].data(), init_lat[b].size() * sizeof(float)));
            if (ckpt && !have[b]) write_artifact(input_path(b), latent_artifact(init_lat[b], C, th, tw, fam, pj));
        } else {
            const Artifact a = posterior_artifact(init_post[b], fam, pj);
            hashes[b] = artifact_data_hash(a);
            if (ckpt && !have[b]) write_artifact(input_path(b), a);
        }
    }
    rep.vae_s += since(tv);

    Setup s2 = s;
    s2.p.batch_count = (int)n;
    s2.p.strength = p.hires_denoising_strength;
    s2.sigmas.clear();  // a first-pass --sigmas is that pass's
    if (!p.hires_sigmas.empty()) {
        s2.sigmas = sampling::parse_sigmas(p.hires_sigmas);
        s2.p.steps = (int)s2.sigmas.size() - 1;
        s2.start_step = 0;
    } else {
        const HiresSchedule hs = hires_schedule(p.hires_steps > 0 ? p.hires_steps : p.steps, as_written(p.hires_denoising_strength));
        s2.p.steps = hs.schedule_steps;
        s2.start_step = hs.start;
    }
    if (!p.checkpoint_dir.empty()) {
        const fs::path dir = platform::u8path(p.checkpoint_dir) / "hires";
        s2.p.checkpoint_dir = platform::path_utf8(dir);
        s2.p.resume = (p.resume || p.resume_step >= 0) && find_checkpoint(dir, 0).has_value();
        s2.p.resume_step = -1;
    }
    log::info("hires fix: second pass {}x{}, {} of {} steps, denoising strength {}", t.width, t.height, s2.p.steps - s2.start_step, s2.p.steps,
              as_written(p.hires_denoising_strength));
    DenoiseInputs base;
    base.cond = &cond;
    auto per_image = [&](int b, DenoiseInputs& in, std::string& ih) {
        if (hp.up.is_latent()) in.init_latent = &init_lat[(size_t)b];
        else in.init_posterior = &init_post[(size_t)b];
        ih = "xxh3-128:" + hash_parts({"hires", hashes[(size_t)b]});
    };
    return denoise_batch(fam, s2, cond, base, "", t.width, t.height, progress, &rep.step_s, &infotexts, nullptr, on_step, &rep.interrupted,
                         per_image);
}

}  // namespace

void check_output_folder(const std::string& path, const char* flag) {
    if (path.empty()) fail(ErrorKind::InvalidInput, "{} is empty: pass an output file path", flag);
    const fs::path target = platform::u8path(path);
    fs::path dir = target.parent_path();
    std::error_code ec;
    if (!dir.empty() && !fs::is_directory(dir, ec)) fail(ErrorKind::Io, "{} {}: folder {} does not exist", flag, path, platform::path_utf8(dir));
    if (fs::is_directory(target, ec))
        fail(ErrorKind::Io, "{} {}: is a folder; give a file name, e.g. {}", flag, path, platform::path_utf8(target / "output.png"));
    const fs::file_status st = fs::status(target, ec);
    if (fs::exists(st) && !fs::is_regular_file(st))
        fail(ErrorKind::InvalidInput, "{} {}: exists and is not a regular file (a device or a pipe); give a file path", flag, path);
    std::random_device rd;
    const fs::path probe = (dir.empty() ? fs::path(".") : dir) / fmt::format(".easel-probe-{}-{:08x}", platform::process_id(), rd());
    {
        std::ofstream f(probe, std::ios::binary | std::ios::trunc);
        if (!f) fail(ErrorKind::Io, "{} {}: cannot write into folder {}; check its permissions", flag, path, platform::path_utf8(dir.empty() ? fs::path(".") : dir));
    }
    fs::remove(probe, ec);
}


EncodeSizes encode_image_sizes(const GenerateParams& p) {
    EncodeSizes r;
    if (!p.init_img.empty()) {
        const Image im = load_image(platform::u8path(p.init_img), 3);
        r.init.push_back({im.height, im.width});
    }
    for (const auto& f : p.ref_images) {
        const Image im = load_image(platform::u8path(f), 3);
        r.references.push_back({im.height, im.width});
    }
    return r;
}

std::string batch_output_path(const std::string& pattern, int index, int count, int begin) {
    // The placeholders are replaced here, never by printf: the pattern is user input, and a
    // %s or %n in it must not reach a format function.
    std::string out;
    bool placeholder = false;
    for (size_t i = 0; i < pattern.size(); ++i) {
        if (pattern[i] != '%') {
            out += pattern[i];
            continue;
        }
        if (i + 1 < pattern.size() && pattern[i + 1] == '%') {  // %% -> %
            out += '%';
            ++i;
            continue;
        }
        size_t j = i + 1;
        int width = 0;
        const bool zero = j < pattern.size() && pattern[j] == '0';
        while (j < pattern.size() && std::isdigit((unsigned char)pattern[j]) && width < 100) width = width * 10 + (pattern[j++] - '0');
        if (j < pattern.size() && pattern[j] == 'd') {  // %d, %Nd, %0Nd
            std::string n = std::to_string(begin >= 0 ? begin + index : index + 1);
            if ((int)n.size() < width) n.insert(0, (size_t)(width - (int)n.size()), zero ? '0' : ' ');
            out += n;
            placeholder = true;
            i = j;
        } else {
            out += '%';  // any other % stays as written
        }
    }
    if (placeholder) return out;
    if (count <= 1 || (index == 0 && begin < 0)) return pattern;
    const fs::path p = platform::u8path(pattern);
    const int number = begin >= 0 ? begin + index : index + 1;
    return platform::path_utf8(p.parent_path() /
                               platform::u8path(platform::path_utf8(p.stem()) + "_" + std::to_string(number) + platform::path_utf8(p.extension())));
}

int planned_vae_tile(const GenerateParams& p) { return p.vae_tiling ? vae_tile_cells(p) : 0; }

void check_vae_tiling(const GenerateParams& p) { check_vae_tiling_impl(p); }

std::string find_demo_model() {
    if (auto env = platform::env("EASEL_DEMO_MODEL")) return *env;
    std::error_code ec;
    const fs::path exe = platform::executable_path();
    std::vector<fs::path> cands;
    if (!exe.empty()) {
        fs::path bin = exe.parent_path();
        cands = {bin / "../../models/demo", bin / "../models/demo", bin / "../share/easel/models/demo"};
    }
    cands.push_back("models/demo");
    for (auto& c : cands) {
        fs::path f = c / "easel-demo-shapes.safetensors";
        if (fs::is_regular_file(f, ec)) return platform::path_utf8(fs::weakly_canonical(f, ec));
    }
    return {};
}

/// The family a Generator holds, and the device and defaults it was opened with.
struct Generator::Impl {
    GenerateParams base;
    Options opt;
    std::unique_ptr<models::Family> fam;
    models::RecommendedSettings recommended;  ///< the model file's easel.* settings
    ggml_backend_dev_t device = nullptr;
    double open_s = 0;

    /// Opens the family for the job `s` (first job), or (later jobs) checks that `s` asks for the
    /// same model and execution settings and gives it the device and the family's defaults.
    void open_for(Setup& s);
};

namespace {

/// The settings a family is opened with (model files, FamilyOptions): a job run on an open
/// Generator must agree with them. Returns the first differing flag, or nullptr.
const char* differing_model_flag(const GenerateParams& a, const GenerateParams& b) {
    if (a.model != b.model) return "-m/--model";
    if (a.diffusion_model != b.diffusion_model) return "--diffusion-model";
    if (a.vae != b.vae) return "--vae";
    if (a.taesd != b.taesd) return "--taesd";
    if (a.clip_l != b.clip_l) return "--clip_l";
    if (a.clip_g != b.clip_g) return "--clip_g";
    if (a.t5xxl != b.t5xxl) return "--t5xxl";
    if (a.llm != b.llm) return "--llm";
    if (a.weight_type != b.weight_type) return "--type";
    if (a.prediction != b.prediction) return "--prediction";
    if (a.flow_shift != b.flow_shift) return "--flow-shift";
    if (a.guidance != b.guidance) return "--guidance";
    if (a.flash_attn != b.flash_attn) return "--fa";
    if (a.diffusion_fa != b.diffusion_fa) return "--diffusion-fa";
    if (a.threads != b.threads) return "-t/--threads";
    if (a.vae_tiling != b.vae_tiling || (a.vae_tiling && a.vae_tile_size != b.vae_tile_size)) return "--vae-tiling/--vae-tile-size";
    const auto& x = a.placement;
    const auto& y = b.placement;
    if (x.backend != y.backend || x.params_backend != y.params_backend || x.split_mode != y.split_mode || x.max_vram != y.max_vram ||
        x.headroom != y.headroom || x.stream_layers != y.stream_layers || x.offload_to_cpu != y.offload_to_cpu ||
        x.clip_on_cpu != y.clip_on_cpu || x.vae_on_cpu != y.vae_on_cpu)
        return "the placement flags";
    return nullptr;
}

}  // namespace

void Generator::Impl::open_for(Setup& s) {
    s.keep_loaded = opt.keep_loaded;
    if (!fam) {
        auto t0 = Clock::now();
        fam = open_model(s);
        device = s.device;
        recommended = s.recommended;
        open_s = since(t0);
        return;
    }
    if (const char* flag = differing_model_flag(s.p, base))
        fail(ErrorKind::InvalidInput, "{} of this job differs from the loaded model's; a job on an open model cannot change it", flag);
    s.device = device;
    s.recommended = recommended;
    apply_family_defaults(s, *fam);
    apply_loras(s, *fam);
}

Generator::Generator(const GenerateParams& base, Options opt) : impl_(std::make_unique<Impl>()) {
    impl_->base = base;
    impl_->opt = opt;
}

Generator::~Generator() = default;

bool Generator::is_open() const { return impl_->fam != nullptr; }

models::Family& Generator::family() {
    if (!impl_->fam) fail(ErrorKind::Internal, "Generator::family(): the model is not open yet");
    return *impl_->fam;
}

const GenerateParams& Generator::base() const { return impl_->base; }

void Generator::open(int width, int height) {
    Setup s = resolve(impl_->base);
    impl_->open_for(s);
    models::Family& fam = *impl_->fam;
    const int m = fam.size_multiple();
    const int W = std::max(m, width / m * m), H = std::max(m, height / m * m);
    check_memory(fam, s, W, H);  // prints the placement plan of placed jobs
    if (!impl_->opt.keep_loaded) return;
    auto t0 = Clock::now();
    for (Module mod : {Module::Te, Module::Diffusion, Module::VaeDecoder}) {
        if (fam.module_files(mod).empty() && mod == Module::Te) continue;  // conditioning only from files
        fam.load(mod);
    }
    log::info("modules loaded in {:.2f} s (kept loaded between jobs)", since(t0));
}

Image Generator::decode_preview(std::span<const float> latent, int64_t h, int64_t w) {
    models::Family& fam = family();
    Setup s = resolve(impl_->base);
    return decode_latent(fam, latent, h, w, tiling_options(s.p, fam.latent_format().spatial_factor));
}

GenerateReport generate(const GenerateParams& params, const ProgressFn& progress) {
    Generator g(params);
    return g.run(params, progress);
}

GenerateReport Generator::run(const GenerateParams& params, const ProgressFn& progress, const StepFn& on_step) {
    GenerateReport rep;
    Setup s = resolve(params);
    const GenerateParams& p = s.p;
    if (p.prompt.empty() && p.init_img.empty() && p.load_embeddings.empty()) log::warn("empty prompt");
    if (!p.load_latent.empty() && !p.init_img.empty())
        fail(ErrorKind::InvalidInput, "give either -i IMAGE or --load-latent INIT, not both");
    if (!p.load_latent.empty() && !p.mask.empty())
        fail(ErrorKind::InvalidInput, "--mask works with -i IMAGE, not with --load-latent");

    // Output folders must exist before hours of work.
    warn_output_pattern(p.output);
    for (int b = 0; b < p.batch_count; ++b) check_output_folder(batch_output_path(p.output, b, p.batch_count, p.output_begin_idx), "-o");
    (void)check_output_path(platform::u8path(p.output), "-o");  // .webp, .bmp: refused before anything runs; no extension: warned
    const auto checkpoint_lock = prepare_checkpoint_dir(p);
    check_vae_tiling_impl(p);
    if (!p.save_latent.empty()) check_output_folder(p.save_latent, "--save-latent");
    if (!p.save_embeddings.empty()) check_output_folder(p.save_embeddings, "--save-embeddings");
    // --upscale-model: a file that is not an upscaler fails here, before any model is loaded
    auto upscaler = open_upscaler(p, s.threads);

    // Init image and mask (read before loading the model: a bad file fails fast).
    std::optional<Image> init, mask;
    if (!p.init_img.empty()) init = load_image(platform::u8path(p.init_img), 3);
    if (!p.mask.empty()) {
        mask = load_image(platform::u8path(p.mask), 1);
        if (mask->width != init->width || mask->height != init->height)
            fail(ErrorKind::InvalidInput, "--mask {} is {}x{} but the init image is {}x{}: they must be the same size", p.mask,
                 mask->width, mask->height, init->width, init->height);
    }
    std::vector<Image> refs;  // -r: reference images of edit models
    for (const auto& r : p.ref_images) refs.push_back(load_image(platform::u8path(r), 3));
    if (init) s.encode_sizes.push_back({init->height, init->width});  // the encode stage's plan
    for (const Image& r : refs) s.reference_sizes.push_back({r.height, r.width});
    rep.seed = s.seed;

    auto t0 = Clock::now();
    const bool opened_here = !impl_->fam;
    impl_->open_for(s);
    models::Family* fam = impl_->fam.get();
    rep.load_s = opened_here ? since(t0) : 0.0;
    rep.device = device_name(s.device);
    // what the model decides about the flags, before any stage runs
    for (const Image& r : refs) fam->check_reference_image(r.width, r.height);
    check_resume(p);
    const bool is_inpaint_model = fam->diffusion_in_channels() != fam->latent_format().channels;
    if (is_inpaint_model && !init)
        fail(ErrorKind::InvalidInput, "this is an in-painting model: pass -i IMAGE and --mask MASK");
    if (is_inpaint_model && !mask)
        fail(ErrorKind::InvalidInput, "this is an in-painting model: pass --mask MASK with -i IMAGE (white = repaint)");

    std::optional<LoadedLatent> init_lat;
    if (!p.load_latent.empty()) init_lat = load_latent(platform::u8path(p.load_latent), *fam);

    const int f = fam->latent_format().spatial_factor;
    int W = p.width, H = p.height;
    if (init) {
        if (init->width != p.width || init->height != p.height) log::info("using the init image's size {}x{}", init->width, init->height);
        W = init->width;
        H = init->height;
    } else if (init_lat) {
        W = (int)init_lat->w * f;
        H = (int)init_lat->h * f;
        if (W != p.width || H != p.height) log::info("using the latent's size {}x{}", W, H);
    }
    W = round_size(W, fam->size_multiple(), "width");
    H = round_size(H, fam->size_multiple(), "height");
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
    const int64_t h = H / f, w = W / f;

    auto cache = open_cache(p);
    ArtifactCache* cachep = cache ? &*cache : nullptr;
    const bool cfg = need_negative(s);
    // conditioning from --load-embeddings or the cache never opens the text encoder, not even
    // for the memory check's headers
    if (!p.load_embeddings.empty() || (cachep && cachep->get(ArtifactKind::Conditioning, conditioning_key(*fam, s, cfg))))
        fam->set_costs_skip_te(true);
    // --hires: the upscaler and the target, checked before any stage; the memory at the larger size
    std::optional<HiresPlan> hires;
    int outW = W, outH = H;
    if (p.hires) {
        if (mask) fail(ErrorKind::Unsupported, "--hires with --mask: the hires fix has no in-painting pass here; in-paint the upscaled image in a second job");
        hires.emplace();
        hires->up = p.hires_a1111_none ? resolve_hires_upscaler("Lanczos", "", "") : resolve_hires_upscaler(p.hires_upscaler, p.hires_upscalers_dir, p.upscale_model);
        if (p.hires_a1111_none) hires->up.name = "None";
        hires->target = hires_target(W, H, as_written(p.hires_scale), p.hires_width, p.hires_height, fam->size_multiple(), f);
        if (hires->up.kind == HiresUpscaler::Kind::Model) {
            UpscaleOptions o;
            o.model = hires->up.model_path;
            o.tile = p.upscale_tile_size;
            o.threads = s.threads;
            o.placement = p.placement;
            hires->model = std::make_unique<ImageUpscaler>(o);
            check_upscaler(*hires->model, p, W, H);
        }
        s.info_strength = as_written(p.hires_denoising_strength);
        s.info_extra = hires_infotext_fields(hires->target, p.hires_steps, hires->up);
        outW = hires->target.width;
        outH = hires->target.height;
        log::info("hires fix: {}x{} -> {}x{} with {}, denoising strength {}", W, H, outW, outH, hires->up.name, as_written(p.hires_denoising_strength));
    }
    check_memory(*fam, s, hires ? hires->target.up_width : W, hires ? hires->target.up_height : H);
    if (upscaler) check_upscaler(*upscaler, p, outW, outH);

    // Stage 1: prompts.
    t0 = Clock::now();
    PromptConditioning cond = obtain_conditioning(*fam, s, cfg, cachep, &rep);
    rep.te_s = since(t0);
    if (!p.save_embeddings.empty()) write_artifact(platform::u8path(p.save_embeddings), conditioning_artifact(cond));
    log::info("model: {}", fam->describe());

    // Stage 2: init image (img2img / inpainting).
    const vae::TilingOptions tiling = tiling_options(p, f);
    std::optional<vae::LatentDist> init_dist, masked_dist;
    std::vector<float> mask_lat;  // [h, w], 1 = repaint
    std::string init_hash;
    if (init) {
        auto tv = Clock::now();
        StageMeter meter;
        init_dist = obtain_posterior(*fam, s, *init, tiling, cachep, "init image");
        if (mask) {
            // diffusers' mask processor: binarised at 0.5 in pixel space (1 = repaint), then
            // resized to the latent by nearest neighbour
            std::vector<float> mfull = image_to_planar(*mask, 0.0f, 1.0f);
            for (auto& v : mfull) v = v >= 0.5f ? 1.0f : 0.0f;
            mask_lat = resize_nearest(mfull, H, W, (int)h, (int)w);
            if (is_inpaint_model) {
                // diffusers StableDiffusionInpaintPipeline: masked image = image * (mask < 0.5)
                vae::HostTensor mimg(1, 3, H, W);
                mimg.data = image_to_planar(*init, -1.0f, 1.0f);
                for (int c = 0; c < 3; ++c)
                    for (size_t i = 0; i < (size_t)H * W; ++i)
                        if (mfull[i] >= 0.5f) mimg.data[(size_t)c * H * W + i] = 0.0f;
                masked_dist = fam->encode(mimg, tiling);
            }
        }
        if (fam->loaded(Module::VaeEncoder)) log_stage("encode-image", *fam, {Module::VaeEncoder}, meter);
        release(*fam, s, Module::VaeEncoder);
        log_peaks_after_encode(*fam);
        rep.vae_s += since(tv);
        init_hash = artifact_data_hash(posterior_artifact(*init_dist, *fam, {}));
        if (mask) {
            // resume must see the same mask (and, for in-painting UNets, the same masked image)
            std::vector<std::string> parts{init_hash, xxh3_hex(std::span<const uint8_t>((const uint8_t*)mask_lat.data(), mask_lat.size() * 4))};
            if (masked_dist) parts.push_back(artifact_data_hash(posterior_artifact(*masked_dist, *fam, {})));
            init_hash = "xxh3-128:" + hash_parts(parts);
        }
    } else if (init_lat) {
        init_hash = init_lat->hash;
    }
    if (!refs.empty()) {
        // edit models: the family encodes its reference images now; resume must see the same ones
        auto tv = Clock::now();
        StageMeter meter;
        std::vector<vae::HostTensor> rt;
        std::vector<std::string> parts{init_hash};
        for (const Image& r : refs) {
            vae::HostTensor t(1, 3, r.height, r.width);
            t.data = image_to_planar(r, -1.0f, 1.0f);
            rt.push_back(std::move(t));
            parts.push_back(xxh3_hex(r.pixels));
        }
        fam->set_reference_images(rt);
        if (fam->loaded(Module::VaeEncoder)) log_stage("encode-image", *fam, {Module::VaeEncoder}, meter);
        release(*fam, s, Module::VaeEncoder);
        log_peaks_after_encode(*fam);
        rep.vae_s += since(tv);
        init_hash = "xxh3-128:" + hash_parts(parts);
    }

    // Stage 3: denoise.
    DenoiseInputs in;
    in.cond = &cond;
    if (init_dist) in.init_posterior = &*init_dist;
    if (init_lat && init_lat->posterior) in.init_posterior = &*init_lat->posterior;
    if (init_lat && !init_lat->posterior) in.init_latent = &init_lat->latent;
    if (mask) in.mask = &mask_lat;
    if (masked_dist) in.masked_posterior = &*masked_dist;
    std::vector<std::string> infotexts;
    Setup s1 = s;
    if (hires) s1.p.save_latent.clear();  // --save-latent: the final (hires) latent
    auto latents = denoise_batch(*fam, s1, cond, in, init_hash, W, H, progress, &rep.step_s, &infotexts, &rep.param_bytes, on_step,
                                 &rep.interrupted);
    rep.compute_peak_bytes = std::max(module_bytes(*fam, Module::Te).compute, module_bytes(*fam, Module::Diffusion).compute);
    int64_t dh = h, dw = w;  // the latents' size at decode
    if (hires && rep.interrupted) {
        log::info("hires fix: sampling was stopped in the first pass; the second pass is not run");
    } else if (hires) {
        // Stage 3b: the hires fix's second pass
        latents = hires_pass(*fam, s, cond, latents, W, H, *hires, tiling, progress, rep, infotexts, on_step);
        dh = outH / f;
        dw = outW / f;
        rep.width = outW;
        rep.height = outH;
    }

    // Stage 4: decode.
    auto tv = Clock::now();
    StageMeter meter;
    std::vector<Image> decoded;  // kept for the upscale stage
    std::vector<std::vector<PngTextEntry>> all_texts;
    for (int b = 0; b < (int)latents.size(); ++b) {  // fewer than -b when sampling was stopped
        Image out = decode_latent(*fam, latents[(size_t)b], dh, dw, tiling);
        std::vector<PngTextEntry> texts{{"parameters", infotexts[(size_t)b]}};
        std::string path = batch_output_path(p.output, b, p.batch_count, p.output_begin_idx);
        if (upscaler) {
            decoded.push_back(std::move(out));
            all_texts.push_back(std::move(texts));
        } else {
            save_image(platform::u8path(path), out, texts);
        }
        rep.outputs.push_back(path);
    }
    log_stage("decode", *fam, {Module::VaeDecoder}, meter);
    rep.param_bytes += module_bytes(*fam, Module::VaeDecoder).params;
    rep.compute_peak_bytes = std::max(rep.compute_peak_bytes, module_bytes(*fam, Module::VaeDecoder).compute);
    release(*fam, s, Module::VaeDecoder);
    log_peaks_after_decode(*fam);
    rep.placed_peak_bytes = fam->placement_peaks();
    rep.vae_s += since(tv);
    // Stage 5: upscale (--upscale-model), with the VAE freed
    if (upscaler) upscale_and_save(*upscaler, p, decoded, all_texts, rep.outputs, &rep);
    rep.host_peak_rss_bytes = peak_rss();
    return rep;
}

Stage parse_stage(const std::string& name) {
    const std::string n = ascii_lower(name);
    if (n == "encode-prompt" || n == "te-encode" || n == "llm-encode") return Stage::EncodePrompt;
    if (n == "encode-image" || n == "vae-encode") return Stage::EncodeImage;
    if (n == "denoise" || n == "diffuse") return Stage::Denoise;
    if (n == "decode" || n == "vae-decode") return Stage::Decode;
    fail(ErrorKind::InvalidInput, "--stage {}: unknown stage (te-encode, llm-encode, vae-encode, diffuse, vae-decode)", name);
}

const char* stage_name(Stage s) {
    switch (s) {
    case Stage::EncodePrompt: return "encode-prompt";
    case Stage::EncodeImage: return "encode-image";
    case Stage::Denoise: return "denoise";
    case Stage::Decode: return "decode";
    }
    return "?";
}

std::vector<std::string> run_stage(Stage stage, const GenerateParams& params, const ProgressFn& progress) {
    Setup s = resolve(params);
    const GenerateParams& p = s.p;
    auto need = [&](const std::string& v, const char* flag) {
        if (v.empty()) fail(ErrorKind::InvalidInput, "{} needs {}", stage_name(stage), flag);
    };
    std::vector<std::string> written;
    if (p.hires)
        fail(ErrorKind::InvalidInput, "--hires runs its second pass inside `easel generate`; {} runs one stage (see docs/hires.md for the same "
             "job stage by stage)", stage_name(stage));
    if (!p.upscale_model.empty() && stage != Stage::Decode)
        fail(ErrorKind::InvalidInput, "--upscale-model upscales images: it works with `easel generate`, `easel decode` and `easel upscale`, not with {}",
             stage_name(stage));
    switch (stage) {
    case Stage::EncodePrompt: {
        need(p.save_embeddings, "--save-embeddings FILE");
        check_output_folder(p.save_embeddings, "--save-embeddings");
        auto fam = open_model(s);
        StageMeter meter;
        const int clip_skip = p.clip_skip > 0 ? p.clip_skip : fam->defaults().clip_skip;
        PromptConditioning c = encode_prompts(*fam, p.prompt, p.negative_prompt, clip_skip, need_negative(s));
        c.model_fingerprint = with_loras(model_fingerprint(fam->module_files(Module::Te), p.full_fingerprint), te_loras(s));
        log_stage("encode-prompt", *fam, {Module::Te}, meter);
        fam->unload(Module::Te);
        write_artifact(platform::u8path(p.save_embeddings), conditioning_artifact(c));
        written.push_back(p.save_embeddings);
        break;
    }
    case Stage::EncodeImage: {
        need(p.init_img, "-i IMAGE");
        need(p.save_latent, "--save-latent FILE");
        check_output_folder(p.save_latent, "--save-latent");
        Image img = load_image(platform::u8path(p.init_img), 3);
        s.encode_sizes.push_back({img.height, img.width});  // the encode stage's plan
        auto fam = open_model(s);
        const int f = fam->latent_format().spatial_factor;
        const int W = round_size(img.width, fam->size_multiple(), "width"), H = round_size(img.height, fam->size_multiple(), "height");
        if (W != img.width || H != img.height) {
            Image r;
            r.width = W;
            r.height = H;
            r.channels = 3;
            r.pixels.resize((size_t)W * H * 3);
            for (int y = 0; y < H; ++y)
                std::copy_n(img.pixels.begin() + (size_t)y * img.width * 3, (size_t)W * 3, r.pixels.begin() + (size_t)y * W * 3);
            img = std::move(r);
        }
        StageMeter meter;
        vae::LatentDist d = encode_image(*fam, img, tiling_options(p, f));
        log_stage("encode-image", *fam, {Module::VaeEncoder}, meter);
        nlohmann::json pj = {{"image", p.init_img}, {"image_hash", xxh3_hex(img.pixels)}, {"width", W}, {"height", H},
                             {"model_fingerprint", model_fingerprint(fam->module_files(Module::VaeEncoder), p.full_fingerprint)}};
        fam->unload(Module::VaeEncoder);
        log_peaks_after_encode(*fam);
        write_artifact(platform::u8path(p.save_latent), posterior_artifact(d, *fam, pj));
        written.push_back(p.save_latent);
        break;
    }
    case Stage::Denoise: {
        need(p.load_embeddings, "--load-embeddings FILE (from `easel encode-prompt`)");
        need(p.save_latent, "--save-latent OUT");
        if (!p.init_img.empty()) fail(ErrorKind::InvalidInput, "denoise takes --load-latent INIT (from `easel encode-image`), not -i IMAGE");
        std::vector<Image> refs;  // -r: reference images of edit models, encoded by the family in this stage (as generate does)
        for (const auto& r : p.ref_images) refs.push_back(load_image(platform::u8path(r), 3));
        for (const Image& r : refs) s.reference_sizes.push_back({r.height, r.width});
        check_output_folder(p.save_latent, "--save-latent");
        const auto checkpoint_lock = prepare_checkpoint_dir(p);
        auto fam = open_model(s);
        for (const Image& r : refs) fam->check_reference_image(r.width, r.height);
        check_resume(p);
        std::optional<LoadedLatent> init_lat;
        if (!p.load_latent.empty()) init_lat = load_latent(platform::u8path(p.load_latent), *fam);
        if (fam->diffusion_in_channels() != fam->latent_format().channels)
            fail(ErrorKind::Unsupported, "this is an in-painting model; run it with `easel generate -i IMAGE --mask MASK`");
        const int f = fam->latent_format().spatial_factor;
        int W = p.width, H = p.height;
        if (init_lat) {
            W = (int)init_lat->w * f;
            H = (int)init_lat->h * f;
            if (W != p.width || H != p.height) log::info("using the latent's size {}x{}", W, H);
        }
        W = round_size(W, fam->size_multiple(), "width");
        H = round_size(H, fam->size_multiple(), "height");
        PromptConditioning cond = obtain_conditioning(*fam, s, need_negative(s), nullptr, nullptr);
        DenoiseInputs in;
        in.cond = &cond;
        if (init_lat && init_lat->posterior) in.init_posterior = &*init_lat->posterior;
        if (init_lat && !init_lat->posterior) in.init_latent = &init_lat->latent;
        std::string init_hash = init_lat ? init_lat->hash : "";
        std::vector<float> mask_lat;  // [h, w], 1 = repaint: prepared as generate prepares it
        if (!p.mask.empty()) {
            if (!init_lat || !init_lat->posterior)
                fail(ErrorKind::InvalidInput, "denoise --mask {} needs --load-latent INIT from `easel encode-image -i IMAGE` (the image the mask repaints)",
                     p.mask);
            const Image m = load_image(platform::u8path(p.mask), 1);
            if (m.width < W || m.height < H)
                fail(ErrorKind::InvalidInput, "--mask {} is {}x{} but the init latent is {}x{} pixels: pass the mask of the image given to encode-image",
                     p.mask, m.width, m.height, W, H);
            std::vector<float> mfull((size_t)W * H);  // cropped top-left to W x H, binarised at 0.5 (generate's rule)
            for (int y = 0; y < H; ++y)
                for (int x = 0; x < W; ++x) mfull[(size_t)y * W + x] = (1.0f / 255.0f) * m.pixels[(size_t)y * m.width + x] >= 0.5f ? 1.0f : 0.0f;
            mask_lat = resize_nearest(mfull, H, W, H / f, W / f);
            in.mask = &mask_lat;
            init_hash = "xxh3-128:" + hash_parts({init_hash, xxh3_hex(std::span<const uint8_t>((const uint8_t*)mask_lat.data(), mask_lat.size() * 4))});
        }
        if (!refs.empty()) {
            std::vector<vae::HostTensor> rt;
            std::vector<std::string> parts{init_hash};
            for (const Image& r : refs) {
                vae::HostTensor t(1, 3, r.height, r.width);
                t.data = image_to_planar(r, -1.0f, 1.0f);
                rt.push_back(std::move(t));
                parts.push_back(xxh3_hex(r.pixels));
            }
            fam->set_reference_images(rt);
            release(*fam, s, Module::VaeEncoder);
            init_hash = "xxh3-128:" + hash_parts(parts);
        }
        Setup s2 = s;
        if (s2.p.save_latent.empty()) s2.p.save_latent = p.save_latent;
        denoise_batch(*fam, s2, cond, in, init_hash, W, H, progress, nullptr, nullptr);
        for (int b = 0; b < p.batch_count; ++b) written.push_back(batch_output_path(p.save_latent, b, p.batch_count));
        break;
    }
    case Stage::Decode: {
        need(p.load_latent, "--load-latent FILE (from `easel denoise`)");
        check_output_folder(p.output, "-o");
        (void)check_output_path(platform::u8path(p.output), "-o");
        auto upscaler = open_upscaler(p, s.threads);
        auto fam = open_model(s);
        LoadedLatent z = load_latent(platform::u8path(p.load_latent), *fam);
        if (z.space != "diffusion")
            fail(ErrorKind::InvalidInput, "--load-latent {}: holds an image's posterior (from encode-image), not a denoised latent; decode "
                 "the output of `easel denoise`", p.load_latent);
        const int f = fam->latent_format().spatial_factor;
        std::string infotext;
        {
            Artifact a = read_artifact(platform::u8path(p.load_latent), ArtifactKind::Latent);
            try {
                auto pj = nlohmann::json::parse(a.at("params"));
                if (pj.contains("infotext") && pj["infotext"].is_string()) infotext = pj["infotext"].get<std::string>();
            } catch (const std::exception&) {
            }
        }
        StageMeter meter;
        if (upscaler) check_upscaler(*upscaler, p, (int)(z.w * f), (int)(z.h * f));
        Image out = decode_latent(*fam, z.latent, z.h, z.w, tiling_options(p, f));
        log_stage("decode", *fam, {Module::VaeDecoder}, meter);
        fam->unload(Module::VaeDecoder);
        log_peaks_after_decode(*fam);
        std::vector<PngTextEntry> texts;
        if (!infotext.empty()) texts.push_back({"parameters", infotext});
        if (upscaler) {
            std::vector<Image> one{std::move(out)};
            upscale_and_save(*upscaler, p, one, {texts}, {p.output}, nullptr);
        } else {
            save_image(platform::u8path(p.output), out, texts);
        }
        written.push_back(p.output);
        break;
    }
    }
    return written;
}

}  // namespace easel::pipeline
