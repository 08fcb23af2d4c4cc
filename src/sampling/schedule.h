// Noise schedules: the model's noise process (ModelSampling) and the sigma schedules that
// samplers walk (Schedule), with sd-cli's --scheduler names.
//
// Conventions (k-diffusion, Karras et al. 2022 "Elucidating the Design Space of
// Diffusion-Based Generative Models", arXiv:2206.00364):
//   * discrete (SD1.x/2.x/SDXL) models are seen in variance-exploding form: x = x0 + sigma*noise,
//     sigma(t) = sqrt((1 - alphas_cumprod[t]) / alphas_cumprod[t]);
//   * flow (rectified-flow: SD3, FLUX, Z-Image) models: x = (1 - sigma)*x0 + sigma*noise,
//     sigma in [0, 1].
// A Schedule holds steps+1 descending sigmas ending in 0, and for every step the timestep
// passed to the network.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace easel::sampling {

/// What the network predicts: noise (eps), v (Salimans & Ho 2022, arXiv:2202.00512), or the
/// rectified-flow velocity noise - x0 (flow).
enum class Prediction { Eps, V, Flow };

/// Parses "eps" / "epsilon", "v" / "v_prediction", "flow". Throws Error(InvalidInput).
Prediction parse_prediction(std::string_view name);
const char* prediction_name(Prediction p);

/// The model's noise process (k-diffusion's model_sampling).
class ModelSampling {
public:
    /// A DDPM-trained model (SD1.x/2.x/SDXL) with "scaled_linear" betas:
    /// betas = linspace(sqrt(beta_start), sqrt(beta_end), timesteps)^2 in float32 (torch),
    /// alphas_cumprod = cumprod(1 - betas) (float64 accumulation, stored float32),
    /// sigmas = sqrt((1 - ac)/ac) in float32, as diffusers' EulerDiscreteScheduler.__init__.
    /// prediction must be Eps or V. Throws Error(InvalidInput) on bad arguments.
    ///
    /// zero_terminal_snr: the betas rescaled so that the last timestep has zero SNR (Lin et al.
    /// 2023, "Common Diffusion Noise Schedules and Sample Steps are Flawed", arXiv:2305.08891,
    /// algorithm 1), in float32 as diffusers' rescale_zero_terminal_snr
    /// (schedulers/scheduling_euler_discrete.py): sqrt(alphas_cumprod) shifted so its last value
    /// is 0 and scaled so its first is unchanged, betas recovered from the ratios; then, as
    /// EulerDiscreteScheduler.__init__ does, alphas_cumprod[T-1] = 2^-24 so that sigma_max is
    /// finite (4095.9998 for T = 1000). Such models are trained with v-prediction.
    static ModelSampling discrete(Prediction prediction = Prediction::Eps, double beta_start = 0.00085,
                                  double beta_end = 0.012, int timesteps = 1000, bool zero_terminal_snr = false);
    /// A rectified-flow model with a static shift (SD3: 3.0, Z-Image: 3.0, FLUX schnell: 1.0):
    /// sigma(t) = shift*s / (1 + (shift-1)*s), s = t/timesteps
    /// (diffusers FlowMatchEulerDiscreteScheduler, ComfyUI time_snr_shift).
    static ModelSampling flow(double shift = 1.0, int timesteps = 1000);
    /// A rectified-flow model with resolution-dependent ("dynamic") shift mu (FLUX.1-dev):
    /// sigma(t) = exp(mu) / (exp(mu) + (1/s - 1)), s = t/timesteps
    /// (diffusers _time_shift_exponential with sigma = 1). See flux_mu().
    static ModelSampling flow_dynamic(double mu, int timesteps = 1000);

    Prediction prediction() const { return prediction_; }
    /// True for a discrete model whose betas were rescaled to zero terminal SNR.
    bool zero_terminal_snr() const { return zsnr_; }
    bool is_flow() const { return prediction_ == Prediction::Flow; }
    int num_timesteps() const { return static_cast<int>(table_.size()); }
    bool dynamic() const { return dynamic_; }
    double shift() const { return shift_; }
    double mu() const { return mu_; }

    /// The training sigma table. Discrete: sigma for t = 0..T-1 (ascending). Flow: the shifted
    /// sigma of s = (t+1)/T for t = 0..T-1 (ComfyUI ModelSamplingDiscreteFlow.sigmas).
    const std::vector<float>& sigmas() const { return table_; }
    /// log of the discrete table in float32 (diffusers' log_sigmas); empty for flow.
    const std::vector<float>& log_sigmas() const { return log_table_; }
    float sigma_min() const { return table_.front(); }
    float sigma_max() const { return table_.back(); }

    /// The network timestep for a sigma. Discrete: diffusers' _sigma_to_t (linear
    /// interpolation of the index in log-sigma, fractional, clamped to [0, T-1]). Flow:
    /// sigma * T (what diffusers' FlowMatch schedulers pass; families convert further).
    double sigma_to_t(double sigma) const;
    /// Inverse of sigma_to_t. Discrete: log-linear interpolation of the table at a fractional
    /// t (k-diffusion / ComfyUI / sd.cpp t_to_sigma). Flow: the shift applied to t/T.
    double t_to_sigma(double t) const;
    /// Flow only: the time shift applied to an unshifted sigma s in (0, 1].
    double flow_shift(double s) const;

private:
    Prediction prediction_ = Prediction::Eps;
    bool dynamic_ = false;
    bool zsnr_ = false;
    double shift_ = 1.0, mu_ = 0.0;
    std::vector<float> table_, log_table_;
};

/// calculate_shift of diffusers' FluxPipeline: mu linear in the image token count,
/// mu = image_seq_len * m + b with m = (max_shift - base_shift)/(max_seq - base_seq),
/// b = base_shift - m*base_seq. 1024x1024 FLUX.1 (4096 tokens) gives 1.15.
double flux_mu(double image_seq_len, double base_seq_len = 256, double max_seq_len = 4096,
               double base_shift = 0.5, double max_shift = 1.15);

/// compute_empirical_mu of diffusers' Flux2Pipeline / Flux2KleinPipeline (pipeline_flux2.py):
/// with m200(L) = 0.00016927*L + 0.45666666 and m10(L) = 8.73809524e-05*L + 1.89833333,
/// mu = m200(L) for L > 4300, else the line through (10, m10) and (200, m200) at num_steps:
/// a = (m200 - m10)/190, mu = a*num_steps + (m200 - 200*a). 1024x1024 (4096 tokens), 20 steps
/// gives 2.19802. Throws Error(InvalidInput) for num_steps < 1.
double flux2_empirical_mu(double image_seq_len, int num_steps);

/// sd-cli --scheduler values, plus the resolution-dependent flow schedules of diffusers' FLUX
/// pipelines (Flux: FluxPipeline's calculate_shift; Flux2: Flux2Pipeline's compute_empirical_mu)
/// and ComfyUI's ddim_uniform.
enum class SchedulerKind {
    Discrete, Karras, Exponential, SgmUniform, Simple, Lcm, Flux, Flux2,
    // added with issue 26
    Ays, Gits, Smoothstep, KlOptimal, Beta, DdimUniform,
};

/// Parses a --scheduler name (case-insensitive): discrete (also "normal", sd.cpp's alias, and
/// "default"), karras, exponential, ays, gits, sgm_uniform, simple, smoothstep, kl_optimal, lcm,
/// beta, ddim_uniform, flux, flux2. Known names of schedules easel does not have (bong_tangent,
/// ltx2, logit_normal, polyexponential, ...) raise Error(Unsupported); others Error(InvalidInput).
SchedulerKind parse_scheduler(std::string_view name);
const char* scheduler_name(SchedulerKind kind);
/// The --scheduler names, comma-separated (for messages and --help).
std::string scheduler_names();

/// The "discrete" timestep spacing of a discrete model (diffusers' timestep_spacing).
enum class Spacing { Linspace, Leading, Trailing };
Spacing parse_spacing(std::string_view name);

/// A sigma schedule for n steps.
struct Schedule {
    std::vector<float> sigmas;     ///< n+1 values, non-increasing, sigmas[n] = 0 (float32 as diffusers)
    std::vector<float> timesteps;  ///< n network timesteps, timesteps[i] for sigmas[i]
    /// The scale of the initial pure-noise latent (x = init_noise_sigma * noise; diffusers'
    /// scheduler.init_noise_sigma). make_schedule sets it: for Discrete on a discrete model as
    /// EulerDiscreteScheduler.init_noise_sigma, max(sigmas) for linspace / trailing spacing and
    /// sqrt(max(sigmas)^2 + 1) for leading; sigmas[0] for every other kind. 0 = sigmas[0].
    float init_noise_sigma = 0.0f;
    int steps() const { return static_cast<int>(timesteps.size()); }
    /// init_noise_sigma, or sigmas[0] when it is 0 (0 for an empty schedule).
    float initial_sigma() const { return init_noise_sigma > 0 ? init_noise_sigma : (sigmas.empty() ? 0.0f : sigmas[0]); }
};

/// Knobs of make_schedule.
struct ScheduleOptions {
    Spacing spacing = Spacing::Linspace;  ///< Discrete on discrete models
    int steps_offset = 1;                 ///< Leading spacing (SD configs use 1)
    double rho = 7.0;                     ///< Karras
    /// Discrete on flow models: false = FlowMatchEulerDiscreteScheduler.set_timesteps(n)
    /// (SD3: linspace of timesteps between the shifted sigma_max and sigma_min, then shifted);
    /// true = sigmas linspace(1, 1/n, n) then shifted, as FluxPipeline / ZImagePipeline pass.
    bool flow_pipeline_sigmas = false;
    int lcm_original_steps = 50;          ///< Lcm (LCMScheduler original_inference_steps)
    /// Flux / Flux2: the image token count (diffusers' image_seq_len = latents.shape[1] after
    /// 2x2 packing, i.e. (H/16)*(W/16) pixels for FLUX.1 and FLUX.2). 0 = unknown: Flux/Flux2
    /// raise Error(InvalidInput). The pipeline fills it from Family::image_seq_len().
    int64_t image_seq_len = 0;
    /// Flux: calculate_shift's parameters (a diffusers folder's scheduler_config.json
    /// base_image_seq_len, max_image_seq_len, base_shift, max_shift).
    double base_seq_len = 256, max_seq_len = 4096, base_shift = 0.5, max_shift = 1.15;
    /// Ays: which Align Your Steps table (NVIDIA's published noise levels; SD1.x is also what
    /// A1111 uses for SD2.x). SDXL families set Sdxl.
    enum class AysTable { Sd15, Sdxl, Svd } ays_table = AysTable::Sd15;
    double beta_alpha = 0.6, beta_beta = 0.6;  ///< Beta: ComfyUI's defaults
};

/// Builds the n-step schedule of the given kind.
///  * Discrete, discrete model: diffusers EulerDiscreteScheduler.set_timesteps: timesteps by
///    spacing (linspace: np.linspace(0, T-1, n) reversed; leading: arange(n)*(T//n) reversed +
///    steps_offset; trailing: round(arange(T, 0, -T/n)) - 1), sigmas = linear interpolation of
///    the table at those timesteps.
///  * Discrete, flow model: diffusers FlowMatchEulerDiscreteScheduler.set_timesteps (see
///    ScheduleOptions::flow_pipeline_sigmas); timesteps = sigma * T.
///  * Karras: k-diffusion get_sigmas_karras, (max^(1/rho) + i/(n-1)*(min^(1/rho) -
///    max^(1/rho)))^rho, sigma_min/max from the model (diffusers use_karras_sigmas).
///  * Exponential: k-diffusion get_sigmas_exponential, exp(linspace(log max, log min, n)).
///  * SgmUniform: ComfyUI normal_scheduler(sgm=True) / sd.cpp: timesteps
///    linspace(t(sigma_max), t(sigma_min), n+1)[:-1], sigma = t_to_sigma.
///  * Simple: ComfyUI simple_scheduler: table[T-1 - int(i*T/n)].
///  * Lcm: LCMScheduler.set_timesteps timesteps (discrete models only).
///  * Flux: FluxPipeline + FlowMatchEulerDiscreteScheduler(use_dynamic_shifting): sigmas
///    s = linspace(1, 1/n, n) in float32, mu = flux_mu(opt.image_seq_len, opt.base_seq_len,
///    opt.max_seq_len, opt.base_shift, opt.max_shift), sigma = exp(mu)/(exp(mu) + (1/s - 1))
///    (_time_shift_exponential), timesteps = sigma * T. Flow models only; the model's own shift
///    is not applied (the dynamic shift replaces it, as in diffusers).
///  * Flux2: the same with mu = flux2_empirical_mu(opt.image_seq_len, n) (Flux2Pipeline,
///    Flux2KleinPipeline).
///  * Ays: Align Your Steps (Sabour et al. 2024, arXiv:2404.14507): NVIDIA's 10-step noise levels
///    (opt.ays_table), for other step counts log-linearly interpolated to n+1 points (xs =
///    linspace(0, 1, 11), ys = log of the reversed levels, np.interp at linspace(0, 1, n+1)), the
///    last replaced by 0 (ComfyUI AlignYourStepsScheduler, sd.cpp AYSScheduler). Discrete models.
///  * Gits: GITS (Chen et al. 2024, arXiv:2405.11326) coefficient 1.20: the published n+1 levels for
///    2 <= n <= 20, beyond that the 20-step levels log-linearly interpolated; last 0 (ComfyUI
///    GITSScheduler, sd.cpp GITSScheduler). Discrete models; n >= 2.
///  * Smoothstep: sd.cpp SmoothStepScheduler: t = round(u^2 (3 - 2u) (T-1)), u = 1 - i/n, sigma = t_to_sigma(t).
///  * KlOptimal: tan(w atan(sigma_min) + (1 - w) atan(sigma_max)), w = i/(n-1) (ComfyUI
///    kl_optimal_scheduler, sd.cpp; Teng et al. 2024 arXiv:2404.14507 App.); n = 1: sigma_max.
///  * Beta: ComfyUI beta_scheduler (Lee et al. 2024, arXiv:2407.12173): t = rint(ppf_Beta(a, b)(1 - i/n)
///    (T-1)), sigma = table[t]; repeated t are dropped, so the schedule can have fewer steps.
///  * DdimUniform: ComfyUI ddim_scheduler (A1111 "DDIM" schedule type): table[1 + k*max(T//n, 1)]
///    reversed (can give a step more than n).
/// Timesteps of Karras/Exponential/SgmUniform/Simple and the added kinds come from sigma_to_t.
/// Throws Error(InvalidInput) for steps < 1 or an impossible combination.
Schedule make_schedule(const ModelSampling& ms, SchedulerKind kind, int steps,
                       const ScheduleOptions& opt = {});

/// diffusers DPMSolverMultistepScheduler.set_timesteps (timestep_spacing "linspace",
/// final_sigmas_type "zero") on a discrete model: integer timesteps
/// round(linspace(0, T-1, n+1))[::-1][:-1]; with karras, sigmas from get_sigmas_karras over
/// the full table and timesteps round(sigma_to_t). For parity with diffusers pipelines.
Schedule diffusers_dpmsolver_schedule(const ModelSampling& ms, int steps, bool karras);

/// The schedule of sd.cpp's ddim_trailing sampler (and diffusers DDIMScheduler with
/// timestep_spacing "trailing", set_alpha_to_one False): integer timesteps
/// round(T - i*T/n) - 1, sigma = table[t]; the final sigma is table[0] (alphas_cumprod[0]),
/// not 0. Discrete models only; throws Error(InvalidInput) otherwise.
Schedule ddim_trailing_schedule(const ModelSampling& ms, int steps);

/// DDIM (diffusers DDIMScheduler, set_alpha_to_one False, as SD configs) for the given timestep
/// spacing: leading (steps_offset 1; A1111's DDIM) t_i = (n-1-i)*(T//n) + 1, trailing as
/// ddim_trailing_schedule, linspace round(linspace(0, T-1, n)) reversed; sigma = table[t], the final
/// sigma is table[t_last - T//n] or table[0] when that is below 0 (alphas_cumprod[0], not 0).
/// Discrete models only; throws Error(InvalidInput) otherwise.
Schedule ddim_schedule(const ModelSampling& ms, int steps, Spacing spacing);

/// A schedule given by hand (sd-cli --sigmas): the values as they are, steps = values - 1,
/// timesteps from sigma_to_t. Validated: at least 2 values, finite, >= 0, strictly decreasing
/// (0 only as the last value), <= 1 on flow models. sd.cpp takes the list as it is and does not
/// append a 0: neither does easel (a list ending above 0 leaves that much noise in the result).
/// Throws Error(InvalidInput) naming the bad value and the fix.
Schedule custom_schedule(const ModelSampling& ms, const std::vector<float>& sigmas);
/// Parses sd-cli's --sigmas text: comma-separated numbers, optional [ ] around them, spaces
/// allowed ("14.61,7.8,3.5,0.0"). Throws Error(InvalidInput) on anything that is not a number.
std::vector<float> parse_sigmas(std::string_view text);

/// img2img: the first step to run for a strength in [0, 1], as sd.cpp does:
/// t_enc = int(steps * strength) (at most steps - 1), start = steps - t_enc - 1, so that
/// t_enc + 1 steps run from sigmas[start]. Throws Error(InvalidInput) outside [0, 1].
int img2img_start_step(int steps, double strength);

}  // namespace easel::sampling
