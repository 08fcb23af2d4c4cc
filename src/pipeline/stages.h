// The pipeline as stages over models::Family, each with a file form (artifact.h):
//
//   encode prompt   prompt, negative prompt          -> PromptConditioning   (loads: te)
//   encode image    image [H, W, 3]                  -> posterior latent     (loads: vae encoder)
//   denoise         conditioning [+ init latent]     -> final latent         (loads: diffusion)
//                   with a checkpoint after every step, and resume from one
//   decode          final latent                     -> image                (loads: vae decoder)
//
// `generate` (generate.h) composes the same functions in one process, so a job run stage by
// stage in separate processes gives the same bits as one `easel generate`.
// Latents are [1, C, h, w] row-major (w fastest), C = Family::latent_format().channels,
// h = H / f, w = W / f with f = latent_format().spatial_factor.
#pragma once

#include "models/family.h"
#include "pipeline/artifact.h"
#include "pipeline/image_io.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "sampling/schedule.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace easel::pipeline {

// ---------------------------------------------------------------------------------------------
// Prompt conditioning

/// The conditioning of a job: positive and (for CFG) negative prompt.
struct PromptConditioning {
    models::Conditioning positive, negative;
    bool has_negative = false;    ///< false when encoded with CFG scale 1 (no negative pass)
    std::string prompt, negative_prompt;
    int clip_skip = 0;            ///< the clip skip used (after the family default)
    std::string family;           ///< Family::name() of the producer, without " inpainting"
    std::string model_fingerprint;  ///< of the text encoder files ("" when unknown)
    double encode_s = 0;          ///< seconds the encoding took (reported as saved on cache hits)
};

/// Encodes prompt and (when need_negative) negative prompt with the family's text encoders.
/// LoRA tags are removed from both first (the LoRAs are applied to the model by the caller). clip_skip <= 0: the
/// family default.
PromptConditioning encode_prompts(models::Family& fam, const std::string& prompt, const std::string& negative_prompt,
                                  int clip_skip, bool need_negative);

/// Artifact kind conditioning: tensors positive.* and negative.* (context [L, D] F32, pooled [P]
/// F32, mask [L] U8, token_ids [T] I32, token_weights [T] F32; empty fields omitted) and
/// metadata model, model_fingerprint, params {prompt, negative_prompt, clip_skip, has_negative},
/// encode_seconds.
Artifact conditioning_artifact(const PromptConditioning& c);
/// Inverse of conditioning_artifact; validates shapes. Throws Error(InvalidInput) naming `what`.
PromptConditioning conditioning_from_artifact(const Artifact& a, const std::string& what);
/// Hash of the conditioning data (artifact_data_hash of conditioning_artifact).
std::string conditioning_hash(const PromptConditioning& c);
/// The family name without the " inpainting" suffix (conditioning does not depend on it).
std::string family_base_name(const std::string& family);

// ---------------------------------------------------------------------------------------------
// Latents

/// An image's VAE posterior (raw VAE space, before scaling): mean and logvar [1, C, h, w].
/// Artifact kind latent with latent_space "posterior" (tensors mean, logvar).
Artifact posterior_artifact(const vae::LatentDist& d, const models::Family& fam, const nlohmann::json& params);
/// A diffusion-space latent [1, C, h, w] (the denoiser's output, input of decode).
/// Artifact kind latent with latent_space "diffusion" (tensor latent).
Artifact latent_artifact(std::span<const float> z, int64_t C, int64_t h, int64_t w, const models::Family& fam,
                         const nlohmann::json& params);

/// A latent read from an artifact.
struct LoadedLatent {
    std::string space;                 ///< "posterior" or "diffusion"
    int64_t c = 0, h = 0, w = 0;
    std::optional<vae::LatentDist> posterior;  ///< space posterior
    std::vector<float> latent;         ///< space diffusion
    std::string hash;                  ///< artifact_data_hash
};
/// Reads and checks a latent artifact against the family (channels). Throws Error(InvalidInput)
/// naming the file and the mismatch.
LoadedLatent load_latent(const std::filesystem::path& path, const models::Family& fam);

/// Encodes an image (pixels 0..255, channels 3) to its posterior; loads the VAE encoder.
vae::LatentDist encode_image(models::Family& fam, const Image& img, const vae::TilingOptions& tiling);
/// Decodes a diffusion-space latent [1, C, h, w] to an image; loads the VAE decoder (or TAESD).
Image decode_latent(models::Family& fam, std::span<const float> z, int64_t h, int64_t w, const vae::TilingOptions& tiling);

// ---------------------------------------------------------------------------------------------
// Denoise

/// The sampling settings of one image.
struct DenoiseJob {
    sampling::SamplerKind method = sampling::SamplerKind::EulerA;
    sampling::SchedulerKind scheduler = sampling::SchedulerKind::Discrete;
    int steps = 20;
    float cfg_scale = 7.0f;
    float eta = -1.0f;  ///< < 0: the method's default (sampling::default_eta); 0 is a value
    /// --sigmas: the schedule given by hand (sampling::custom_schedule; steps = size - 1); empty:
    /// the scheduler's
    std::vector<float> sigmas;
    sampling::RngKind rng = sampling::RngKind::Cuda, sampler_rng = sampling::RngKind::Cuda;
    int64_t seed = 42;  ///< this image's seed
    int width = 0, height = 0;  ///< pixels (multiples of the latent factor)
    float strength = 0.75f;     ///< img2img strength (used with an init latent)
    /// img2img: the first step of the schedule, overriding the cut from `strength` (the hires fix's
    /// second pass runs the last steps of its schedule, pipeline/hires.h); -1: from strength.
    int start_step = -1;
};

/// The schedule the job samples on: job.sigmas when given (--sigmas), else the method's schedule
/// over the family's noise process and schedule_options() (DPM++ 2M, UniPC and DEIS of discrete
/// models with the discrete or karras scheduler on diffusers' DPMSolver / UniPC / DEIS timesteps,
/// ddim_trailing and ddim their own DDIM timesteps), cut at diffusers' img2img start when has_init.
/// job.start_step >= 0 replaces that cut (at most the last step).
/// Returns the cut schedule; `start` (if non-null) gets the first step's index.
sampling::Schedule job_schedule(const models::Family& fam, const DenoiseJob& job, bool has_init, int* start = nullptr);

/// What denoise works on.
struct DenoiseInputs {
    const PromptConditioning* cond = nullptr;
    const vae::LatentDist* init_posterior = nullptr;  ///< img2img/inpainting: the image's posterior
    const std::vector<float>* init_latent = nullptr;   ///< or a diffusion-space init latent (no draw)
    const std::vector<float>* mask = nullptr;          ///< [h*w], 1 = repaint (inpainting)
    const vae::LatentDist* masked_posterior = nullptr; ///< in-painting UNets: the masked image
};

/// Checkpoints and resume.
struct DenoiseControl {
    std::filesystem::path checkpoint_dir;  ///< empty: no checkpoints
    int image = 0;                         ///< batch index (names the checkpoint files)
    nlohmann::json job;                    ///< job_params(): stored in checkpoints, checked on resume
    std::optional<sampling::SamplerState> resume;  ///< continue from this state
    std::function<void(int step, int steps, double seconds)> progress;
    /// Called after every step (after its checkpoint is written and progress is reported) with
    /// the sampler: returning false ends the sampling there, the current latent
    /// (Sampler::result()) becoming the result (DenoiseResult::stopped; A1111's interrupt). An
    /// exception it throws leaves denoise() as is (the step's checkpoint is on the disk once it has left).
    std::function<bool(const sampling::Sampler&)> on_step;
};

/// Result of denoise.
struct DenoiseResult {
    std::vector<float> latent;   ///< [1, C, h, w] diffusion space
    std::vector<double> step_s;  ///< seconds per step run here
    int64_t resumed_at = -1;     ///< step the run resumed after (-1: fresh)
    bool stopped = false;        ///< control.on_step ended the sampling before the last step
};

/// Samples one image: draws the noise from job.seed in diffusers' order (init posterior sample,
/// noise, masked-image posterior), runs the sampler with CFG, applies the inpainting blend for
/// ordinary models, writes a checkpoint after every step when control.checkpoint_dir is set (on a
/// thread of its own while the next step computes; all are on the disk when it returns or throws,
/// and a failed write throws its Error(Io) at the next step or at the end).
/// Loads the diffusion model (and nothing else). Throws Error(InvalidInput) on inconsistent
/// inputs (missing negative conditioning with CFG, sizes). Resume (control.resume) redraws the
/// noise of the inputs from the seed as a fresh run does, so it is bit-identical also for
/// inpainting, whose blend inputs are not stored (the job's init_hash must cover the mask).
DenoiseResult denoise(models::Family& fam, const DenoiseJob& job, const DenoiseInputs& in, const DenoiseControl& control);

/// The parameters a checkpoint must agree with to be resumed (JSON object): family,
/// model_fingerprint, sampler, scheduler, steps, seed, width, height, cfg_scale, eta, rng,
/// sampler_rng, strength (with init), conditioning_hash, init_hash, sigmas (only when given) and
/// start_step (only when >= 0).
nlohmann::json job_params(const DenoiseJob& job, const std::string& family, const std::string& model_fingerprint,
                          const std::string& conditioning_hash, const std::string& init_hash);

/// dir/image<i+1>-step<NNNN>.safetensors: the state after `step` steps of image i.
std::filesystem::path checkpoint_path(const std::filesystem::path& dir, int image, int64_t step);
/// The checkpoint of image i after `step` steps, or (step < 0) the one with the most steps;
/// nullopt when none.
std::optional<std::filesystem::path> find_checkpoint(const std::filesystem::path& dir, int image, int64_t step = -1);
/// Every checkpoint file of image i in `dir` (named as checkpoint_path makes them), the one with
/// the most steps first; empty when none (or no such folder).
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& dir, int image);
/// Writes the sampler state and the job as a checkpoint artifact (atomic).
void write_checkpoint(const std::filesystem::path& path, const sampling::SamplerState& st, const nlohmann::json& job);
/// The checkpoint artifact write_checkpoint writes (the state's tensors, the job's params).
Artifact checkpoint_artifact(const sampling::SamplerState& st, const nlohmann::json& job);
/// Reads a checkpoint and checks it against the job and the schedule: every differing
/// parameter is named in one Error(InvalidInput) message ("seed: checkpoint 1, now 2; ...");
/// sigmas are compared bit for bit.
sampling::SamplerState load_checkpoint(const std::filesystem::path& path, const nlohmann::json& job,
                                       const sampling::Schedule& schedule);

/// Where --resume continues: the checkpoint file, its state, and the newer files skipped.
struct ResumePoint {
    std::filesystem::path path;
    sampling::SamplerState state;
    std::vector<std::string> skipped;  ///< file names of newer checkpoints that could not be read
};
/// --resume: the newest checkpoint of image i that can be read, checked against the job as
/// load_checkpoint does. A checkpoint that is truncated or corrupt (a crash or a full disk
/// mid-write; read_artifact's checks or the sampler state's validation fail) is skipped with a
/// warning naming the file and the reason, and the one before it is tried. A readable
/// checkpoint of another job stops the search with load_checkpoint's Error(InvalidInput).
/// nullopt when image i has no checkpoint; Error(InvalidInput) naming them when none is readable.
std::optional<ResumePoint> load_latest_checkpoint(const std::filesystem::path& dir, int image, const nlohmann::json& job,
                                                  const sampling::Schedule& schedule);

// ---------------------------------------------------------------------------------------------
// Measuring a stage

/// Peak host memory of a stage: resets the kernel's high-water mark (VmHWM, via
/// /proc/self/clear_refs) at construction; peak_rss() reads it.
class StageMeter {
public:
    StageMeter();
    /// Peak resident set size since construction, in bytes (the process peak when the
    /// high-water mark could not be reset).
    size_t peak_rss() const;
    double seconds() const;

private:
    double t0_;
};

/// Parameter and compute-buffer bytes of one module of a job.
struct ModuleBytes {
    size_t params = 0;   ///< parameter bytes (placed: every segment's, on whichever device or in RAM)
    size_t compute = 0;  ///< largest compute buffer (placed: the largest of its devices')
    std::vector<std::string> devices;  ///< placed: the devices its plans ran on; empty otherwise
};

/// The bytes of module `m`: when it ran under placement plans (Family::placement_plans() holds
/// plans of it: FLUX.1's te has two, T5 and CLIP-L), from those plans, whose figures are the
/// module's own (the family's param_bytes / compute_bytes count only modules loaded whole and
/// are 0 for placed ones); else from the family (loaded modules only).
ModuleBytes module_bytes(const models::Family& fam, models::Module m);

/// One log line: "<stage>: <s> s; <module> parameters X MiB, compute Y MiB; host peak RSS Z MiB"
/// (module_bytes; a placed module's line names its devices).
void log_stage(const std::string& stage, const models::Family& fam, std::initializer_list<models::Module> modules,
               const StageMeter& meter);

}  // namespace easel::pipeline
