// Samplers with a complete, serialisable state: resuming from a saved state after step k
// gives the same bits as an uninterrupted run.
//
// Methods (sd-cli --sampling-method names; k-diffusion sampling.py semantics, Karras et al.
// 2022 arXiv:2206.00364; formulas in docs/sampling.md):
//   euler          Euler on the probability-flow ODE dx/dsigma = (x - D)/sigma
//   euler_a        Euler ancestral, eta (default 1); flow form: ComfyUI sample_euler_ancestral_RF
//   heun           Heun's 2nd order (Euler on the last step)
//   dpm2           DPM2 (midpoint in log sigma; Euler on the last step)
//   dpm++2m        DPM-Solver++(2M) (Lu et al. 2022, arXiv:2211.01095); flow form with
//                  alpha = 1 - sigma (diffusers DPMSolverMultistepScheduler use_flow_sigmas)
//   dpm++2s_a      DPM-Solver++(2S) ancestral, eta (default 1); not for flow models
//   lcm            LCM multistep (k-diffusion sample_lcm: x = D, then re-noise to the next sigma)
//   ddim_trailing  DDIM (Song et al. 2020, arXiv:2010.02502) on ddim_trailing_schedule(), eta
//                  (default 0); the result is returned in the VP scaling DDIM ends in
// Latents are float32 in the sampler's variance-exploding form (x = x0 + sigma*noise) for
// eps/v models and in flow form (x = (1-sigma)*x0 + sigma*noise) for flow models.
#pragma once

#include "sampling/denoiser.h"
#include "sampling/rng.h"
#include "sampling/schedule.h"

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace easel::sampling {

enum class SamplerKind { Euler, EulerA, Heun, Dpm2, DpmPP2M, DpmPP2SA, Lcm, DdimTrailing };

/// Parses a --sampling-method name: euler, euler_a, heun, dpm2, dpm++2m, dpm++2s_a, lcm,
/// ddim_trailing (case-insensitive; the per-family default is the pipeline's choice). Other sd-cli names
/// (dpm++2mv2, ipndm, ipndm_v, tcd, ...) raise Error(Unsupported), unknown ones Error(InvalidInput).
SamplerKind parse_sampler(std::string_view name);
const char* sampler_name(SamplerKind kind);
/// The eta a method uses when none is given (sd.cpp): 1 for euler_a and dpm++2s_a, else 0.
float default_eta(SamplerKind kind);

/// One serialised value: float32, int64 or raw bytes (strings as UTF-8).
using StateValue = std::variant<std::vector<float>, std::vector<int64_t>, std::vector<uint8_t>>;
/// name -> value; the artifact layer stores each entry as one safetensors tensor
/// (F32 / I64 / U8, 1-D).
using StateMap = std::map<std::string, StateValue>;

/// Everything a sampler needs to continue: plain data.
struct SamplerState {
    SamplerKind kind = SamplerKind::Euler;
    bool flow = false;                ///< x in flow form (flow models)
    std::vector<int64_t> shape;       ///< latent shape, outermost first, e.g. [N, C, H, W]
    std::vector<float> x;             ///< current latent, prod(shape) values, row-major
    int64_t step = 0;                 ///< steps completed (0..steps)
    std::vector<float> sigmas;        ///< schedule, steps+1 values
    std::vector<float> timesteps;     ///< steps values
    float eta = 0.0f;                 ///< ancestral / DDIM noise amount
    float s_noise = 1.0f;             ///< noise multiplier of ancestral samplers
    std::vector<int64_t> rng;         ///< Rng::save()
    std::vector<float> old_denoised;  ///< dpm++2m history (D of the previous step); empty = none

    /// Flat map (keys: sampler, flow, shape, x, step, sigmas, timesteps, eta, s_noise, rng,
    /// old_denoised, version).
    StateMap to_map() const;
    /// Inverse of to_map; validates every entry. Throws Error(InvalidInput) naming the bad key.
    static SamplerState from_map(const StateMap& m);
};

/// Runs a sampling method over a schedule, one step at a time.
class Sampler {
public:
    /// x_init: the starting latent (txt2img: noise_latent(zeros, noise, sigmas[0], flow);
    /// img2img: noise_latent(x0, noise, sigmas[start], flow) on a schedule cut at start), with
    /// prod(shape) values. eta < 0 picks default_eta(kind). Throws Error(InvalidInput) on
    /// inconsistent sizes, a malformed schedule, or a method that has no flow form.
    Sampler(SamplerKind kind, const Schedule& schedule, std::vector<int64_t> shape, std::vector<float> x_init,
            Rng rng, bool flow, float eta = -1.0f, float s_noise = 1.0f);
    /// Resumes from a saved state (validated as the constructor does).
    explicit Sampler(SamplerState state);

    int steps() const { return static_cast<int>(st_.timesteps.size()); }
    int64_t step_index() const { return st_.step; }
    bool done() const { return st_.step >= steps(); }

    /// Runs one step. Throws Error(InvalidInput) if done(), or if the denoiser's model
    /// sampling is flow while the state is not (or the reverse).
    void step(Denoiser& d);
    /// Runs the remaining steps; after_step (if set) sees the state after each step.
    void run(Denoiser& d, const std::function<void(const SamplerState&)>& after_step = {});

    /// The complete state (x, step, schedule, RNG state, history).
    SamplerState state() const;
    /// The denoised estimate D(x; sigma) of the last step's model evaluation, [prod(shape)] in
    /// the latent's space (empty before the first step of this object): what live previews show.
    const std::vector<float>& denoised() const { return den_; }
    /// The current latent; for ddim_trailing after its last step the VP-scaled sample
    /// x / sqrt(sigma_last^2 + 1) that diffusers' DDIMScheduler and sd.cpp return.
    std::vector<float> result() const;

private:
    SamplerState st_;
    Rng rng_;
    std::vector<float> den_, tmp_, tmp2_;

    void validate() const;
    std::vector<float> noise();
};

/// The step-size warning for second-order methods on zero-terminal-SNR ladders (tryout finding
/// F19; evidence in tools/demo-model/README.md, "Second-order samplers at few steps"). heun and
/// dpm2 correct an Euler step by the change of D(x; sigma) between two evaluations (heun weighs
/// D(x2; sn) - D(x; s) by (e^h - 1)/2), dpm++2m extrapolates D from its history (weight 1/(2r)).
/// On a zero-terminal-SNR model the guided D at sigma >= 100 is far from the final latent (the
/// demo model at CFG 5: RMS 3.2 against 0.9) and moves to it between sigma ~60 and ~3; karras
/// and exponential ladders from sigma 4096 cross that band in few, long steps (h = log(s/sn) up
/// to 2.4), the correction overshoots and the image ends in noise. diffusers'
/// DPMSolverMultistepScheduler and HeunDiscreteScheduler use the same formulas and do the same.
/// Returns one line naming the method, its longest step in the band and what to use instead, or
/// "" when: the method is not heun, dpm2 or dpm++2m; flow is true; sigmas[0] < 1000 (not a
/// zero-terminal-SNR ladder: ordinary SD tables end at 14.6); or every step i with
/// sigmas[i+1] > 0 and 3 <= sigmas[i] <= 100 (heun: any step with sigmas[i] >= 3 and
/// 0 < sigmas[i+1] <= 100, since its corrector evaluates D at sigmas[i+1]) has h <= kZsnrMaxLogStep
/// (dpm++2m) or kZsnrMaxLogStepHeun (heun, dpm2). sigmas: the schedule, descending, ending in 0
/// (not validated).
std::string zsnr_step_warning(SamplerKind kind, std::span<const float> sigmas, bool flow);
/// Thresholds of zsnr_step_warning (longest log-sigma step in 3 <= sigma <= 100, nats), fitted to
/// the demo model at CFG 5, --rng cpu (seeds 1, 2, 3, 42): dpm++2m karras 10/12/14 steps
/// (longest 2.00/1.41/1.29) and exponential 6/10 (2.37/1.32) drew noise for some seeds, karras
/// 16/20 (1.02/0.80) and DPMSolverMultistep linspace 10 (0.89) never; heun exponential 6/10/12
/// (2.37/1.32/1.08), discrete 6/10/20 (first step 4096 -> 7.4/16/38: h 6.3/5.5/4.7), karras 10 and
/// dpm2 karras 10/14 wrong, heun exponential 16/20 (0.79/0.62) and heun/dpm2 karras 20 (0.80) right.
inline constexpr double kZsnrMaxLogStep = 1.15;
inline constexpr double kZsnrMaxLogStepHeun = 0.85;

/// Noises a clean latent to sigma: x0 + sigma*noise (variance exploding) or
/// (1 - sigma)*x0 + sigma*noise (flow). x0 may be empty (a zero latent). Throws
/// Error(InvalidInput) on a size mismatch.
std::vector<float> noise_latent(std::span<const float> x0, std::span<const float> noise, double sigma, bool flow);

/// Latent-mask inpainting for ordinary models (the blend applied after every step):
/// x = mask*x + (1 - mask)*known, where known is the original latent noised to the current
/// sigma (noise_latent) and mask = 1 where new content is generated. mask has x.size()
/// values, or one value per pixel broadcast over the channels (mask [N, 1, H, W] for a latent
/// of shape [N, C, H, W], given in shape). Throws Error(InvalidInput) on size mismatches.
void inpaint_blend(std::span<float> x, std::span<const float> known, std::span<const float> mask,
                   std::span<const int64_t> shape = {});
/// inpaint_blend for a single latent [1, C, H, W] with a mask [1, 1, H, W]: mask.size() *
/// channels must equal x.size() (or mask.size() == x.size()).
void inpaint_blend(std::span<float> x, std::span<const float> known, std::span<const float> mask, int64_t channels);

}  // namespace easel::sampling
