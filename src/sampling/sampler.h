// Samplers with a complete, serialisable state: resuming from a saved state after step k
// gives the same bits as an uninterrupted run.
//
// Methods (sd-cli --sampling-method names plus A1111/ComfyUI/diffusers ones; the formula and the
// reference of each are in docs/sampling.md, "Samplers"):
//   euler, euler_a, heun, dpm2, dpm2_a, lms          k-diffusion (Karras et al. 2022, arXiv:2206.00364)
//   dpm++2s_a, dpm++2s, dpm++_sde, dpm++2m,           DPM-Solver++ (Lu et al. 2022, arXiv:2211.01095):
//   dpm++2m_sde, dpm++2m_sde_bt                       k-diffusion, with ComfyUI's half-log-SNR flow forms
//   dpm++2mv2, res_2s                                 sd.cpp
//   ipndm, ipndm_v                                    ComfyUI (zju-pi diff-solvers)
//   res_multistep, er_sde, euler_cfg_pp,              ComfyUI (arXiv:2308.02157, arXiv:2309.06169,
//   euler_a_cfg_pp                                    CFG++ arXiv:2406.08070)
//   uni_pc, deis, ddim, tcd, lcm, ddim_trailing       diffusers' UniPC / DEIS / DDIM / TCD schedulers,
//                                                     k-diffusion sample_lcm, sd.cpp ddim_trailing
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

enum class SamplerKind {
    Euler, EulerA, Heun, Dpm2, DpmPP2M, DpmPP2SA, Lcm, DdimTrailing,
    // added with issue 26
    Dpm2A, DpmPP2S, DpmPPSde, DpmPP2Mv2, DpmPP2MSde, DpmPP2MSdeBt, Ipndm, IpndmV, Lms, Deis, UniPc, Ddim, Tcd,
    ResMultistep, Res2s, ErSde, EulerCfgPP, EulerACfgPP,
};

/// What a method is and needs (one row per SamplerKind; sampler_info()).
struct SamplerInfo {
    SamplerKind kind;
    const char* name;          ///< the --sampling-method name
    float default_eta;         ///< eta when --eta is not given (sd.cpp resolve_eta; k-diffusion defaults)
    bool uses_eta;             ///< eta changes the method (ancestral / SDE / DDIM / TCD noise amount)
    bool flow;                 ///< has a flow-model (rectified flow) form
    bool needs_uncond;         ///< needs the unconditional prediction too (CFG++): runs the negative pass at CFG 1
    bool brownian;             ///< its noise comes from a Brownian tree (seeded from the sampler RNG)
    const char* reference;     ///< where its formula comes from (docs/sampling.md)
};
/// Every method, in SamplerKind order.
std::span<const SamplerInfo> sampler_infos();
const SamplerInfo& sampler_info(SamplerKind kind);

/// Parses an easel / sd-cli --sampling-method name (case-insensitive): the names of
/// sampler_infos(). A1111 and ComfyUI names go through resolve_sampler_name (sampling/names.h).
/// Known names of methods easel does not have (dpm++3m_sde, dpm_fast, dpm_adaptive, restart, plms,
/// euler_ge, ...) raise Error(Unsupported); unknown ones Error(InvalidInput) listing the names.
SamplerKind parse_sampler(std::string_view name);
const char* sampler_name(SamplerKind kind);
/// The eta a method uses when none is given (sd.cpp's resolve_eta): 1 for euler_a, dpm2_a, dpm++2s_a,
/// dpm++_sde, dpm++2m_sde, dpm++2m_sde_bt, er_sde and euler_a_cfg_pp, else 0.
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
    /// D of the previous step (dpm++2m, dpm++2mv2, dpm++2m_sde(_bt), res_multistep, er_sde); empty = none
    std::vector<float> old_denoised;
    /// Further multistep buffers, each prod(shape) values, oldest first: lms and ipndm(_v): the
    /// last derivatives d = (x - D)/sigma; deis: the last eps; uni_pc: the last x0 predictions and
    /// then the sample before the last predictor; er_sde: the previous first difference.
    std::vector<std::vector<float>> history;
    /// Seed of the Brownian tree of dpm++_sde / dpm++2m_sde_bt (drawn from the sampler RNG when the
    /// sampler is made); empty for the other methods.
    std::vector<int64_t> tree_seed;

    /// Flat map (keys: version (2), sampler, flow, shape, x, step, sigmas, timesteps, eta, s_noise,
    /// rng, old_denoised, history (all buffers concatenated), history_count, tree_seed). Version-1
    /// maps (no history / tree_seed) are read as empty buffers.
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

    /// The noise of one stochastic term: prod(shape) standard normals for the interval
    /// sigma -> sigma_next (k-diffusion's noise_sampler(sigma, sigma_next) contract).
    using NoiseSource = std::function<std::vector<float>(double sigma, double sigma_next)>;
    /// Replaces the method's own noise (sampler RNG or Brownian tree) with `src`, for comparisons
    /// with reference runs that record their draws. Not part of the state (not saved).
    void set_noise_source(NoiseSource src) { noise_override_ = std::move(src); }
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
    std::vector<float> den_, tmp_, tmp2_, unc_;
    NoiseSource noise_override_;
    // Brownian tree of the BT methods: w(t) for the latest few t (a pure function of the seed,
    // so not part of the state).
    std::vector<std::pair<double, std::vector<float>>> tree_cache_;

    void validate() const;
    void init_method_state();
    std::vector<float> noise();                                  // one randn(numel) on the sampler RNG
    std::vector<float> noise(double sigma, double sigma_next);  // the method's noise source
    std::vector<float> tree_w(double t);
    // the methods added with issue 26 (sampler_methods.cpp)
    void step_more(Denoiser& d);
};

/// The Brownian tree of sd.cpp's dpm++2m_sde_bt (src/runtime/denoiser.hpp BrownianTreeNoiseSampler:
/// w(t_min) = 0, w(t_max) = sqrt(t_max - t_min) z, bisection 24 levels deep with the bridge
/// midpoint (w_a + w_c)/2 + sqrt((c-m)(m-a)/(c-a)) z, node seeds by splitmix64 mixing); its node
/// draws use easel's std_default generator (sd.cpp: libstdc++'s std::default_random_engine), so the
/// values are easel's own. w(t) of one seed is the same whatever is asked before it.
/// numel: values per draw; t in [t_min, t_max] (clamped).
std::vector<float> brownian_tree_w(uint64_t seed, double t_min, double t_max, int64_t numel, double t);

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
