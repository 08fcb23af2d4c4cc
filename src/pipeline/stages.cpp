#include "pipeline/stages.h"

#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "placement/plan.h"
#include "text/prompt_syntax.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <cstring>
#include <exception>
#include <thread>
#include <type_traits>
#include <variant>

namespace easel::pipeline {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

void add_cond(Artifact& a, const std::string& p, const models::Conditioning& c) {
    if (!c.context.empty()) a.add_f32(p + ".context", {c.tokens, c.dim}, c.context);
    if (!c.pooled.empty()) a.add_f32(p + ".pooled", {(int64_t)c.pooled.size()}, c.pooled);
    if (!c.mask.empty()) a.add_u8(p + ".mask", {(int64_t)c.mask.size()}, c.mask);
    if (!c.token_ids.empty()) a.add_i32(p + ".token_ids", {(int64_t)c.token_ids.size()}, c.token_ids);
    if (!c.token_weights.empty()) a.add_f32(p + ".token_weights", {(int64_t)c.token_weights.size()}, c.token_weights);
}

models::Conditioning read_cond(const Artifact& a, const std::string& p, const std::string& what) {
    models::Conditioning c;
    if (const auto* t = a.find(p + ".context")) {
        if (t->shape.size() != 2) fail(ErrorKind::InvalidInput, "{}: {}.context must be 2-D [tokens, dim]", what, p);
        c.tokens = t->shape[0];
        c.dim = t->shape[1];
        c.context = a.f32(p + ".context", what);
    }
    if (a.has(p + ".pooled")) c.pooled = a.f32(p + ".pooled", what);
    if (a.has(p + ".mask")) {
        c.mask = a.u8(p + ".mask", what);
        if ((int64_t)c.mask.size() != c.tokens) fail(ErrorKind::InvalidInput, "{}: {}.mask has {} values for {} tokens", what, p, c.mask.size(), c.tokens);
    }
    if (a.has(p + ".token_ids")) c.token_ids = a.i32(p + ".token_ids", what);
    if (a.has(p + ".token_weights")) c.token_weights = a.f32(p + ".token_weights", what);
    if (c.empty()) fail(ErrorKind::InvalidInput, "{}: holds no {} conditioning", what, p);
    return c;
}

nlohmann::json parse_params(const Artifact& a, const std::string& what) {
    try {
        auto j = nlohmann::json::parse(a.at("params", what));
        if (!j.is_object()) throw std::runtime_error("not an object");
        return j;
    } catch (const Error&) {
        throw;
    } catch (const std::exception&) {
        fail(ErrorKind::InvalidInput, "{}: metadata 'params' is not a JSON object", what);
    }
}

std::string dump_value(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

std::string family_base_name(const std::string& family) {
    const std::string suf = " inpainting";
    if (family.size() > suf.size() && family.compare(family.size() - suf.size(), suf.size(), suf) == 0)
        return family.substr(0, family.size() - suf.size());
    return family;
}

// ---------------------------------------------------------------------------------------------

PromptConditioning encode_prompts(models::Family& fam, const std::string& prompt, const std::string& negative_prompt,
                                  int clip_skip, bool need_negative) {
    PromptConditioning r;
    r.prompt = prompt;
    r.negative_prompt = negative_prompt;
    r.family = family_base_name(fam.name());
    r.clip_skip = clip_skip > 0 ? clip_skip : fam.defaults().clip_skip;
    text::PromptTags tags = text::extract_extra_networks(prompt);
    if (!tags.loras.empty())
        log::debug("{} LoRA tag(s) stripped from the text the encoder sees (the LoRAs themselves are applied to the model, "
                   "pipeline/generate.cpp apply_loras)", tags.loras.size());
    text::PromptTags ntags = text::extract_extra_networks(negative_prompt);
    const double t0 = now_s();
    fam.load(models::Module::Te);
    r.positive = fam.encode_prompt(tags.text, r.clip_skip);
    if (need_negative) {
        std::optional<models::Conditioning> zero;
        if (ntags.text.empty()) zero = fam.empty_negative(r.positive);  // SDXL: zeros, as diffusers
        r.negative = zero ? std::move(*zero) : fam.encode_prompt(ntags.text, r.clip_skip);
        r.has_negative = true;
    }
    r.encode_s = now_s() - t0;
    return r;
}

Artifact conditioning_artifact(const PromptConditioning& c) {
    Artifact a;
    a.kind = ArtifactKind::Conditioning;
    add_cond(a, "positive", c.positive);
    if (c.has_negative) add_cond(a, "negative", c.negative);
    a.meta["model"] = c.family;
    a.meta["model_fingerprint"] = c.model_fingerprint;
    nlohmann::ordered_json p;
    p["prompt"] = c.prompt;
    p["negative_prompt"] = c.negative_prompt;
    p["clip_skip"] = c.clip_skip;
    p["has_negative"] = c.has_negative;
    a.meta["params"] = p.dump();
    a.meta["encode_seconds"] = fmt::format("{:.6f}", c.encode_s);
    return a;
}

PromptConditioning conditioning_from_artifact(const Artifact& a, const std::string& what) {
    PromptConditioning c;
    auto p = parse_params(a, what);
    c.family = a.at("model", what);
    c.model_fingerprint = a.meta.count("model_fingerprint") ? a.meta.at("model_fingerprint") : "";
    c.prompt = p.value("prompt", "");
    c.negative_prompt = p.value("negative_prompt", "");
    c.clip_skip = p.value("clip_skip", 0);
    c.has_negative = p.value("has_negative", false);
    c.positive = read_cond(a, "positive", what);
    if (c.has_negative) c.negative = read_cond(a, "negative", what);
    if (a.meta.count("encode_seconds")) {
        try {
            c.encode_s = std::stod(a.meta.at("encode_seconds"));
        } catch (...) {
        }
    }
    return c;
}

std::string conditioning_hash(const PromptConditioning& c) { return artifact_data_hash(conditioning_artifact(c)); }

// ---------------------------------------------------------------------------------------------

namespace {
void latent_meta(Artifact& a, const models::Family& fam, const char* space, const nlohmann::json& params) {
    a.kind = ArtifactKind::Latent;
    a.meta["latent_space"] = space;
    a.meta["model"] = fam.name();
    auto lf = fam.latent_format();
    a.meta["latent_channels"] = std::to_string(lf.channels);
    a.meta["spatial_factor"] = std::to_string(lf.spatial_factor);
    a.meta["scaling_factor"] = fmt::format("{}", lf.scaling_factor);
    a.meta["shift_factor"] = fmt::format("{}", lf.shift_factor);
    a.meta["params"] = params.dump();
}
}  // namespace

Artifact posterior_artifact(const vae::LatentDist& d, const models::Family& fam, const nlohmann::json& params) {
    Artifact a;
    latent_meta(a, fam, "posterior", params);
    const auto& m = d.mean;
    a.add_f32("mean", {m.n, m.c, m.h, m.w}, m.data);
    a.add_f32("logvar", {d.logvar.n, d.logvar.c, d.logvar.h, d.logvar.w}, d.logvar.data);
    return a;
}

Artifact latent_artifact(std::span<const float> z, int64_t C, int64_t h, int64_t w, const models::Family& fam,
                         const nlohmann::json& params) {
    Artifact a;
    latent_meta(a, fam, "diffusion", params);
    a.add_f32("latent", {1, C, h, w}, z);
    return a;
}

LoadedLatent load_latent(const fs::path& path, const models::Family& fam) {
    const std::string what = platform::path_utf8(path);
    Artifact a = read_artifact(path, ArtifactKind::Latent);
    LoadedLatent r;
    r.space = a.at("latent_space", what);
    r.hash = artifact_data_hash(a);
    const std::string name = r.space == "posterior" ? "mean" : r.space == "diffusion" ? "latent" : "";
    if (name.empty()) fail(ErrorKind::InvalidInput, "{}: unknown latent_space '{}' (posterior or diffusion)", what, r.space);
    const ArtifactTensor* t = a.find(name);
    if (!t || t->shape.size() != 4 || t->shape[0] != 1)
        fail(ErrorKind::InvalidInput, "{}: tensor '{}' must be [1, C, h, w]", what, name);
    r.c = t->shape[1];
    r.h = t->shape[2];
    r.w = t->shape[3];
    const auto lf = fam.latent_format();
    if (r.c != lf.channels)
        fail(ErrorKind::ModelMismatch, "{}: a {}-channel latent (made by {}); {} latents have {} channels", what, r.c,
             a.meta.count("model") ? a.meta.at("model") : "an unknown model", fam.name(), lf.channels);
    if (a.meta.count("model") && family_base_name(a.meta.at("model")) != family_base_name(fam.name()))
        fail(ErrorKind::ModelMismatch, "{}: made by a {} model, this is {}", what, a.meta.at("model"), fam.name());
    if (r.space == "posterior") {
        vae::LatentDist d;
        d.mean = vae::HostTensor(1, r.c, r.h, r.w);
        d.logvar = vae::HostTensor(1, r.c, r.h, r.w);
        d.mean.data = a.f32("mean", what);
        d.logvar.data = a.f32("logvar", what);
        if (d.logvar.data.size() != d.mean.data.size()) fail(ErrorKind::InvalidInput, "{}: mean and logvar differ in size", what);
        r.posterior = std::move(d);
    } else {
        r.latent = a.f32("latent", what);
    }
    return r;
}

vae::LatentDist encode_image(models::Family& fam, const Image& im, const vae::TilingOptions& tiling) {
    vae::HostTensor img(1, 3, im.height, im.width);
    img.data = image_to_planar(im, -1.0f, 1.0f);
    return fam.encode(img, tiling);
}

Image decode_latent(models::Family& fam, std::span<const float> z, int64_t h, int64_t w, const vae::TilingOptions& tiling) {
    const int64_t C = fam.latent_format().channels;
    if ((int64_t)z.size() != C * h * w) fail(ErrorKind::InvalidInput, "latent has {} values, expected {}x{}x{}", z.size(), C, h, w);
    vae::HostTensor t(1, C, h, w);
    t.data.assign(z.begin(), z.end());
    vae::HostTensor img = fam.decode(t, tiling);
    return image_from_planar(img.data, (int)img.w, (int)img.h, 3, -1.0f, 1.0f);
}

// ---------------------------------------------------------------------------------------------

sampling::Schedule job_schedule(const models::Family& fam, const DenoiseJob& job, bool has_init, int* start_out) {
    const sampling::ModelSampling& ms = fam.model_sampling();
    sampling::Schedule full;
    const bool diffusers_multistep = job.method == sampling::SamplerKind::DpmPP2M || job.method == sampling::SamplerKind::UniPc ||
                                     job.method == sampling::SamplerKind::Deis;
    if (!job.sigmas.empty()) full = sampling::custom_schedule(ms, job.sigmas);
    else if (job.method == sampling::SamplerKind::DdimTrailing) full = sampling::ddim_trailing_schedule(ms, job.steps);
    else if (job.method == sampling::SamplerKind::Ddim) full = sampling::ddim_schedule(ms, job.steps, sampling::Spacing::Leading);
    else if (diffusers_multistep && !ms.is_flow() &&
             (job.scheduler == sampling::SchedulerKind::Discrete || job.scheduler == sampling::SchedulerKind::Karras))
        // DPM++ 2M, UniPC and DEIS run on the timesteps of diffusers' DPMSolverMultistep /
        // UniPCMultistep / DEISMultistep schedulers (integer timesteps, linspace over n+1 points;
        // karras: rounded), so that they equal diffusers' pipelines.
        full = sampling::diffusers_dpmsolver_schedule(ms, job.steps, job.scheduler == sampling::SchedulerKind::Karras);
    else {
        sampling::ScheduleOptions so = fam.schedule_options();
        if (so.image_seq_len <= 0) so.image_seq_len = fam.image_seq_len(job.width, job.height);
        full = sampling::make_schedule(ms, job.scheduler, job.steps, so);
    }
    const int steps = full.steps();  // a beta or ddim_uniform schedule, or --sigmas, can differ from job.steps
    int start = 0;
    if (has_init && job.start_step >= 0) {
        start = std::min(job.start_step, steps - 1);
    } else if (has_init) {
        // diffusers' img2img rules: StableDiffusionImg2ImgPipeline.get_timesteps runs int(steps *
        // strength) steps, from step steps - that; the flow-matching pipelines (SD3, FLUX,
        // Z-Image: StableDiffusion3Img2ImgPipeline.get_timesteps) start at
        // t_start = int(steps - steps * strength), so 8 steps at 0.6 run 5 there, 4 here. At least
        // one step runs.
        int run = ms.is_flow() ? steps - (int)std::max((double)steps - (double)steps * job.strength, 0.0)
                               : std::min(steps, (int)((double)steps * job.strength));
        if (run < 1) {
            log::warn("--strength {} with {} steps runs no step: running 1", job.strength, steps);
            run = 1;
        }
        start = steps - run;
    }
    if (start_out) *start_out = start;
    sampling::Schedule s;
    s.sigmas.assign(full.sigmas.begin() + start, full.sigmas.end());
    s.timesteps.assign(full.timesteps.begin() + start, full.timesteps.end());
    if (start == 0) s.init_noise_sigma = full.init_noise_sigma;
    return s;
}

nlohmann::json job_params(const DenoiseJob& job, const std::string& family, const std::string& model_fingerprint,
                          const std::string& conditioning_hash, const std::string& init_hash) {
    nlohmann::ordered_json j;
    j["family"] = family;
    j["model_fingerprint"] = model_fingerprint;
    j["sampler"] = sampling::sampler_name(job.method);
    j["scheduler"] = sampling::scheduler_name(job.scheduler);
    j["steps"] = job.steps;
    j["seed"] = job.seed;
    j["width"] = job.width;
    j["height"] = job.height;
    j["cfg_scale"] = job.cfg_scale;
    j["eta"] = job.eta;
    j["rng"] = sampling::rng_kind_name(job.rng);
    j["sampler_rng"] = sampling::rng_kind_name(job.sampler_rng);
    j["strength"] = init_hash.empty() ? nlohmann::json(nullptr) : nlohmann::json(job.strength);
    j["conditioning_hash"] = conditioning_hash;
    j["init_hash"] = init_hash;
    if (!job.sigmas.empty()) j["sigmas"] = job.sigmas;
    if (job.start_step >= 0) j["start_step"] = job.start_step;
    return nlohmann::json(j);
}

namespace {
/// Test hook (docs/artifacts.md "Checkpoints"): with EASEL_TEST_STOP_AFTER_STEP=k in the
/// environment the process stops itself (SIGSTOP) right after the checkpoint of step k is
/// written, so a test can kill it at exactly that point instead of racing the clock.
bool stop_asked_after(int64_t step) {
#ifdef SIGSTOP
    static const char* v = std::getenv("EASEL_TEST_STOP_AFTER_STEP");
    return v && *v && std::strtoll(v, nullptr, 10) == step;
#else
    (void)step;
    return false;
#endif
}

/// Writes the denoising loop's checkpoints on a thread of its own, so that step k+1 computes
/// while step k's checkpoint goes to the disk: write_artifact flushes the file and its folder
/// (two fsyncs, 1-25 ms each on this project's 2-core machine, more under other processes' I/O),
/// which written in line added up to about 5 % of a 256x256 demo job. One write at a time:
/// put() first waits for the write before it, so every step still gets its checkpoint, in order.
/// flush() waits for the last one; both rethrow a failed write's Error. The destructor waits
/// too (an error then is logged: the loop is already leaving with an exception of its own), so
/// every checkpoint handed over is on the disk once denoise() returns or throws.
class CheckpointWriter {
public:
    CheckpointWriter() = default;
    CheckpointWriter(const CheckpointWriter&) = delete;
    CheckpointWriter& operator=(const CheckpointWriter&) = delete;
    ~CheckpointWriter() {
        try {
            flush();
        } catch (const std::exception& e) {
            log::warn("checkpoint: {}", e.what());
        }
    }
    void put(fs::path path, Artifact a) {
        flush();
        thread_ = std::thread([this, path = std::move(path), a = std::move(a)] {
            try {
                write_artifact(path, a);
            } catch (...) {
                error_ = std::current_exception();
            }
        });
    }
    void flush() {
        if (thread_.joinable()) thread_.join();
        if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    }

private:
    std::thread thread_;
    std::exception_ptr error_;
};
}  // namespace

DenoiseResult denoise(models::Family& fam, const DenoiseJob& job, const DenoiseInputs& in, const DenoiseControl& control) {
    if (!in.cond) fail(ErrorKind::Internal, "denoise: no conditioning");
    const bool cfg = job.cfg_scale != 1.0f;
    if (cfg && !in.cond->has_negative)
        fail(ErrorKind::InvalidInput, "the conditioning has no negative prompt (it was encoded with --cfg-scale 1); encode it again with "
             "the CFG scale of this job, or run with --cfg-scale 1");
    if (sampling::sampler_info(job.method).needs_uncond && !in.cond->has_negative)
        fail(ErrorKind::InvalidInput, "{} needs the negative prompt's prediction too, and the conditioning has none (it was encoded with "
             "--cfg-scale 1); encode it again with --sampling-method {}, or use another sampler",
             sampling::sampler_name(job.method), sampling::sampler_name(job.method));
    const auto lf = fam.latent_format();
    const int f = lf.spatial_factor;
    const int64_t h = job.height / f, w = job.width / f, C = lf.channels, n = C * h * w;
    const bool has_init = in.init_posterior || in.init_latent;
    const bool has_mask = in.mask != nullptr;
    const int64_t cin = fam.diffusion_in_channels();
    if (cin != C && !(has_mask && in.masked_posterior))
        fail(ErrorKind::InvalidInput, "this is an in-painting model: pass -i IMAGE and --mask MASK (white = repaint)");
    // Inpainting resumes too: the blend's inputs (x0, noise, mask) are redrawn from the seed and
    // the inputs below exactly as in the first run, and the checkpoints hold x after the blend.

    fam.load(models::Module::Diffusion);
    const auto& ms = fam.model_sampling();
    const bool flow = ms.is_flow();
    int start_step = 0;
    const sampling::Schedule schedule = job_schedule(fam, job, has_init, &start_step);

    // Draw order as diffusers' pipelines: init-image posterior, initial noise, then (inpainting)
    // the masked-image posterior, which ordinary models do not use but still draw.
    sampling::Rng rng(job.rng, (uint64_t)job.seed);
    std::vector<float> x0;
    if (in.init_posterior) {
        // diffusers retrieve_latents(sample_mode="sample"): mean + std * randn, then (z - shift) * scale
        auto eps = rng.randn(n);
        x0.resize((size_t)n);
        const auto& d = *in.init_posterior;
        for (size_t i = 0; i < x0.size(); ++i)
            x0[i] = (d.mean.data[i] + std::exp(0.5f * d.logvar.data[i]) * eps[i] - lf.shift_factor) * lf.scaling_factor;
    } else if (in.init_latent) {
        x0 = *in.init_latent;
    }
    if (has_init && (int64_t)x0.size() != n)
        fail(ErrorKind::InvalidInput, "init latent has {} values; {}x{} needs {}", x0.size(), job.width, job.height, n);
    std::vector<float> noise = rng.randn(n);
    std::vector<float> concat;  // in-painting UNets: mask [1, h, w] + masked-image latent [C, h, w]
    if (has_mask) {
        auto eps = rng.randn(n);
        if (in.masked_posterior && cin != C) {
            concat.assign(in.mask->begin(), in.mask->end());
            const auto& d = *in.masked_posterior;
            for (int64_t i = 0; i < n; ++i)
                concat.push_back((d.mean.data[(size_t)i] + std::exp(0.5f * d.logvar.data[(size_t)i]) * eps[(size_t)i] - lf.shift_factor) *
                                 lf.scaling_factor);
        }
    }
    // Inpainting at full strength starts from pure noise (diffusers is_strength_max); img2img
    // adds noise to the init latent at the first sigma.
    const bool pure_noise = !has_init || (has_mask && start_step == 0);

    DenoiseResult res;
    std::optional<sampling::Sampler> sampler;
    if (control.resume) {
        sampler.emplace(*control.resume);
        res.resumed_at = control.resume->step;
    } else {
        // Pure noise is scaled by the schedule's init_noise_sigma (diffusers: sigmas[0], except
        // EulerDiscreteScheduler's leading spacing, sqrt(sigmas[0]^2 + 1)).
        std::vector<float> x = pure_noise ? sampling::noise_latent({}, noise, schedule.initial_sigma(), flow)
                                          : sampling::noise_latent(x0, noise, schedule.sigmas[0], flow);
        sampling::Rng srng = job.sampler_rng == job.rng ? rng : sampling::Rng(job.sampler_rng, (uint64_t)job.seed);
        sampler.emplace(job.method, schedule, std::vector<int64_t>{1, C, h, w}, std::move(x), srng, flow, job.eta);
    }

    const models::Conditioning& pos = in.cond->positive;
    const models::Conditioning& neg = in.cond->negative;
    sampling::ModelFn fn = [&](std::span<const float> x_in, double t, sampling::Branch br, std::span<float> out) {
        fam.diffusion(x_in, concat, h, w, t, br == sampling::Branch::Cond ? pos : neg, out);
    };
    sampling::Denoiser den(ms, fn, job.cfg_scale);
    const bool blend = has_mask && cin == C;
    CheckpointWriter checkpoints;
    while (!sampler->done()) {
        auto ts = Clock::now();
        sampler->step(den);
        if (blend) {
            // ordinary model inpainting: keep the known region at the current noise level
            auto st = sampler->state();
            float sigma = st.sigmas[(size_t)st.step];
            auto known = sampling::noise_latent(x0, noise, sigma, flow);
            sampling::inpaint_blend(st.x, known, *in.mask, st.shape);
            sampler.emplace(std::move(st));
        }
        if (!control.checkpoint_dir.empty()) {
            checkpoints.put(checkpoint_path(control.checkpoint_dir, control.image, sampler->step_index()),
                            checkpoint_artifact(sampler->state(), control.job));
            if (stop_asked_after(sampler->step_index())) {
                checkpoints.flush();  // the test kills the process here: the checkpoint is on the disk
                std::raise(SIGSTOP);
            }
        }
        double dt = std::chrono::duration<double>(Clock::now() - ts).count();
        res.step_s.push_back(dt);
        if (control.progress) control.progress((int)sampler->step_index(), sampler->steps(), dt);
        if (control.on_step && !control.on_step(*sampler) && !sampler->done()) {
            res.stopped = true;
            break;
        }
    }
    checkpoints.flush();
    res.latent = sampler->result();
    return res;
}

fs::path checkpoint_path(const fs::path& dir, int image, int64_t step) {
    return dir / fmt::format("image{}-step{:04d}.safetensors", image + 1, step);
}

std::vector<fs::path> list_checkpoints(const fs::path& dir, int image) {
    std::error_code ec;
    std::vector<std::pair<long, fs::path>> found;
    if (!fs::is_directory(dir, ec)) return {};
    const std::regex re(fmt::format("image{}-step([0-9]+)\\.safetensors", image + 1));
    for (auto& e : fs::directory_iterator(dir, ec)) {
        std::smatch m;
        const std::string name = platform::path_utf8(e.path().filename());
        if (!std::regex_match(name, m, re) || m[1].length() > 9) continue;
        found.emplace_back(std::stol(m[1].str()), e.path());
    }
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<fs::path> out;
    for (auto& f : found) out.push_back(std::move(f.second));
    return out;
}

std::optional<fs::path> find_checkpoint(const fs::path& dir, int image, int64_t step) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return std::nullopt;
    if (step >= 0) {
        fs::path p = checkpoint_path(dir, image, step);
        if (fs::is_regular_file(p, ec)) return p;
        return std::nullopt;
    }
    auto all = list_checkpoints(dir, image);
    if (all.empty()) return std::nullopt;
    return all.front();
}

void write_checkpoint(const fs::path& path, const sampling::SamplerState& st, const nlohmann::json& job) {
    write_artifact(path, checkpoint_artifact(st, job));
}

Artifact checkpoint_artifact(const sampling::SamplerState& st, const nlohmann::json& job) {
    Artifact a;
    a.kind = ArtifactKind::Checkpoint;
    for (auto& [k, v] : st.to_map()) {
        const std::string name = "state." + k;  // (clang before 16 cannot capture a structured binding)
        std::visit(
            [&](const auto& vec) {
                using T = typename std::decay_t<decltype(vec)>::value_type;
                if constexpr (std::is_same_v<T, float>) a.add_f32(name, {(int64_t)vec.size()}, vec);
                else if constexpr (std::is_same_v<T, int64_t>) a.add_i64(name, {(int64_t)vec.size()}, vec);
                else a.add_u8(name, {(int64_t)vec.size()}, vec);
            },
            v);
    }
    a.meta["model"] = job.value("family", "");
    a.meta["model_fingerprint"] = job.value("model_fingerprint", "");
    a.meta["params"] = job.dump();
    a.meta["step"] = std::to_string(st.step);
    return a;
}

namespace {

/// A checkpoint file as read: its sampler state and the job it was written for. Throws
/// Error(InvalidInput) when the file is truncated or corrupt (read_artifact's checks, the params
/// metadata, the sampler state's own validation), Error(Io) when it cannot be read.
struct CheckpointFile {
    sampling::SamplerState state;
    nlohmann::json params;
};

CheckpointFile read_checkpoint_file(const fs::path& path) {
    const std::string what = platform::path_utf8(path);
    Artifact a = read_artifact(path, ArtifactKind::Checkpoint);
    CheckpointFile c;
    c.params = parse_params(a, what);
    sampling::StateMap m;
    for (auto& t : a.tensors) {
        if (t.name.rfind("state.", 0) != 0) continue;
        const std::string key = t.name.substr(6);
        if (t.dtype == "F32") m[key] = a.f32(t.name, what);
        else if (t.dtype == "I64") m[key] = a.i64(t.name, what);
        else if (t.dtype == "U8") m[key] = a.u8(t.name, what);
        else fail(ErrorKind::InvalidInput, "{}: tensor {} has dtype {}", what, t.name, t.dtype);
    }
    try {
        c.state = sampling::SamplerState::from_map(m);
    } catch (const Error& e) {
        fail(ErrorKind::InvalidInput, "{}: bad sampler state ({})", what, e.what());
    }
    return c;
}

/// Throws Error(InvalidInput) naming every parameter in which the checkpoint differs from the job.
void check_checkpoint(const CheckpointFile& c, const fs::path& path, const nlohmann::json& job, const sampling::Schedule& schedule) {
    const nlohmann::json& saved = c.params;
    const sampling::SamplerState& st = c.state;
    std::vector<std::string> diffs;
    for (auto& [k, v] : job.items()) {
        if (!saved.contains(k)) {
            diffs.push_back(fmt::format("{}: missing in the checkpoint", k));
            continue;
        }
        const auto& s = saved[k];
        bool same = s == v;
        if (!same && s.is_number() && v.is_number()) same = s.get<double>() == v.get<double>();
        if (!same) diffs.push_back(fmt::format("{}: checkpoint {}, now {}", k, dump_value(s), dump_value(v)));
    }
    if (st.sigmas.size() != schedule.sigmas.size() ||
        std::memcmp(st.sigmas.data(), schedule.sigmas.data(), st.sigmas.size() * sizeof(float)) != 0)
        diffs.push_back(fmt::format("sigmas: the checkpoint's {} sigmas differ from this job's {}", st.sigmas.size(), schedule.sigmas.size()));
    if (!diffs.empty()) {
        std::string msg;
        for (auto& d : diffs) msg += (msg.empty() ? "" : "; ") + d;
        fail(ErrorKind::InvalidInput, "{}: checkpoint does not match this job ({}); resume with the same model and flags, or start without --resume",
             platform::path_utf8(path), msg);
    }
}

}  // namespace

sampling::SamplerState load_checkpoint(const fs::path& path, const nlohmann::json& job, const sampling::Schedule& schedule) {
    CheckpointFile c = read_checkpoint_file(path);
    check_checkpoint(c, path, job, schedule);
    return c.state;
}

std::optional<ResumePoint> load_latest_checkpoint(const fs::path& dir, int image, const nlohmann::json& job,
                                                  const sampling::Schedule& schedule) {
    const auto all = list_checkpoints(dir, image);
    if (all.empty()) return std::nullopt;
    std::vector<std::string> skipped;
    for (const fs::path& path : all) {
        CheckpointFile c;
        try {
            c = read_checkpoint_file(path);
        } catch (const Error& e) {
            // a file a crash (or a full disk) left unusable: the one before it still is
            log::warn("--resume: skipping {} (unreadable: {}); trying the checkpoint before it", platform::path_utf8(path.filename()), e.what());
            skipped.push_back(platform::path_utf8(path.filename()));
            continue;
        }
        check_checkpoint(c, path, job, schedule);  // a readable checkpoint of another job is the user's mistake: refuse
        return ResumePoint{path, std::move(c.state), std::move(skipped)};
    }
    std::string names;
    for (auto& n : skipped) names += (names.empty() ? "" : ", ") + n;
    fail(ErrorKind::InvalidInput, "--resume: no readable checkpoint of image {} in {} (all {} are truncated or corrupt: {}); start without --resume",
         image + 1, platform::path_utf8(dir), skipped.size(), names);
}

// ---------------------------------------------------------------------------------------------

namespace {
std::string mib(size_t b) { return fmt::format("{:.1f} MiB", (double)b / 1048576.0); }
}  // namespace

StageMeter::StageMeter() : t0_(now_s()) { platform::reset_peak_rss(); }

size_t StageMeter::peak_rss() const { return (size_t)platform::peak_rss_bytes(); }
double StageMeter::seconds() const { return now_s() - t0_; }

ModuleBytes module_bytes(const models::Family& fam, models::Module m) {
    using placement::PModule;
    std::optional<PModule> pm;
    switch (m) {
    case models::Module::Te: pm = PModule::Te; break;
    case models::Module::Diffusion: pm = PModule::Diffusion; break;
    case models::Module::VaeDecoder: pm = PModule::Vae; break;
    case models::Module::VaeEncoder: pm = PModule::Vae; break;  // the plans of the encode stage
    }
    ModuleBytes b;
    if (pm)
        for (auto& p : fam.placement_plans()) {
            if (p.module != *pm) continue;
            // the vae module's plans: the encoder's are those of the encode stage
            if (p.module == PModule::Vae && (placement::stage_of(p) == placement::kVaeEncodeStage) != (m == models::Module::VaeEncoder)) continue;
            for (auto& s : p.segments) b.params += s.param_bytes;
            for (auto& u : p.devices) {
                b.compute = std::max<size_t>(b.compute, u.compute);
                if (std::find(b.devices.begin(), b.devices.end(), u.device) == b.devices.end()) b.devices.push_back(u.device);
            }
        }
    if (b.devices.empty()) {
        b.params = fam.param_bytes(m);
        b.compute = fam.compute_bytes(m);
    }
    return b;
}

void log_stage(const std::string& stage, const models::Family& fam, std::initializer_list<models::Module> modules,
               const StageMeter& meter) {
    std::string parts;
    for (auto m : modules) {
        const ModuleBytes b = module_bytes(fam, m);
        std::string where;
        for (auto& d : b.devices) where += (where.empty() ? " (placed on " : ", ") + d;
        if (!where.empty()) where += ")";
        parts += fmt::format("{}{} parameters {}, compute {}{}", parts.empty() ? "" : "; ", models::module_name(m), mib(b.params), mib(b.compute),
                             where);
    }
    log::info("stage {}: {:.2f} s; {}{}host peak RSS {}", stage, meter.seconds(), parts, parts.empty() ? "" : "; ", mib(meter.peak_rss()));
}

}  // namespace easel::pipeline
