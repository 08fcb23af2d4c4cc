// Noise schedules; formulas and sources are documented in schedule.h and docs/sampling.md.
#include "sampling/schedule.h"

#include "core/error.h"

#include <algorithm>
#include <cctype>
#include "core/strings.h"

#include <cmath>

namespace easel::sampling {

namespace {

// numpy.linspace(a, b, n) in float64 (y = i*step + a; the last value is b exactly).
std::vector<double> np_linspace(double a, double b, int n) {
    std::vector<double> y(static_cast<size_t>(n));
    if (n == 1) {
        y[0] = a;
        return y;
    }
    const double step = (b - a) / (n - 1);
    for (int i = 0; i < n; ++i) y[i] = i * step + a;
    y[n - 1] = b;
    return y;
}

// numpy.interp(x, arange(len(fp)), fp) with float32 table values.
double interp_table(const std::vector<float>& fp, double x) {
    const int n = static_cast<int>(fp.size());
    if (x <= 0) return fp[0];
    if (x >= n - 1) return fp[n - 1];
    const int j = static_cast<int>(std::floor(x));
    const double slope = (static_cast<double>(fp[j + 1]) - fp[j]);
    return slope * (x - j) + fp[j];
}

void check_steps(int steps) {
    if (steps < 1 || steps > 10000)
        fail(ErrorKind::InvalidInput, "sampling steps must be in 1..10000, got {}", steps);
}

}  // namespace

Prediction parse_prediction(std::string_view name) {
    const std::string s = ascii_lower(name);
    if (s == "eps" || s == "epsilon") return Prediction::Eps;
    if (s == "v" || s == "v_prediction") return Prediction::V;
    if (s == "flow") return Prediction::Flow;
    fail(ErrorKind::InvalidInput, "unknown prediction type '{}': use eps, v or flow", name);
}

const char* prediction_name(Prediction p) {
    switch (p) {
        case Prediction::Eps: return "eps";
        case Prediction::V: return "v";
        case Prediction::Flow: return "flow";
    }
    return "?";
}

// ---------------------------------------------------------------------------------------

ModelSampling ModelSampling::discrete(Prediction prediction, double beta_start, double beta_end, int timesteps,
                                      bool zero_terminal_snr) {
    if (prediction == Prediction::Flow)
        fail(ErrorKind::InvalidInput, "ModelSampling::discrete needs eps or v prediction; use ModelSampling::flow for flow models");
    if (timesteps < 2 || timesteps > 100000)
        fail(ErrorKind::InvalidInput, "number of training timesteps must be in 2..100000, got {}", timesteps);
    if (!(beta_start > 0) || !(beta_end > beta_start) || !(beta_end < 1))
        fail(ErrorKind::InvalidInput, "betas must satisfy 0 < beta_start < beta_end < 1, got {} .. {}", beta_start, beta_end);
    ModelSampling ms;
    ms.prediction_ = prediction;
    ms.zsnr_ = zero_terminal_snr;
    const size_t T = static_cast<size_t>(timesteps);
    // torch.linspace(beta_start**0.5, beta_end**0.5, T, dtype=float32) ** 2 (scalar kernel rule).
    const float start = static_cast<float>(std::sqrt(beta_start));
    const float end = static_cast<float>(std::sqrt(beta_end));
    const float step = (end - start) / static_cast<float>(timesteps - 1);
    const int halfway = timesteps / 2;
    std::vector<float> betas(T);
    for (int i = 0; i < timesteps; ++i) {
        const float sb = i < halfway ? start + step * static_cast<float>(i)
                                     : end - step * static_cast<float>(timesteps - i - 1);
        betas[i] = sb * sb;
    }
    // alphas_cumprod = cumprod(1 - betas): torch's CPU cumprod accumulates float in double.
    auto cumprod = [&](std::vector<float>& ac) {
        double acc = 1.0;
        ac.resize(T);
        for (size_t i = 0; i < T; ++i) {
            acc *= static_cast<double>(1.0f - betas[i]);
            ac[i] = static_cast<float>(acc);
        }
    };
    std::vector<float> ac;
    cumprod(ac);
    if (zero_terminal_snr) {
        // diffusers rescale_zero_terminal_snr, every step in float32 (torch tensors).
        std::vector<float> sq(T);
        for (size_t i = 0; i < T; ++i) sq[i] = std::sqrt(ac[i]);
        const float s0 = sq[0], sT = sq[T - 1];
        const float scale = s0 / (s0 - sT);
        for (size_t i = 0; i < T; ++i) {
            sq[i] = sq[i] - sT;
            sq[i] = sq[i] * scale;
        }
        std::vector<float> ab(T);
        for (size_t i = 0; i < T; ++i) ab[i] = sq[i] * sq[i];
        betas[0] = 1.0f - ab[0];
        for (size_t i = 1; i < T; ++i) betas[i] = 1.0f - ab[i] / ab[i - 1];
        cumprod(ac);
        ac[T - 1] = 0x1p-24f;  // EulerDiscreteScheduler: close to 0 so that the first sigma is finite
    }
    ms.table_.resize(T);
    ms.log_table_.resize(T);
    for (size_t i = 0; i < T; ++i) {
        const float sigma = std::sqrt((1.0f - ac[i]) / ac[i]);
        ms.table_[i] = sigma;
        ms.log_table_[i] = std::log(sigma);
    }
    return ms;
}

ModelSampling ModelSampling::flow(double shift, int timesteps) {
    if (!(shift > 0) || !std::isfinite(shift))
        fail(ErrorKind::InvalidInput, "flow shift must be a positive number, got {}", shift);
    if (timesteps < 2 || timesteps > 100000)
        fail(ErrorKind::InvalidInput, "number of training timesteps must be in 2..100000, got {}", timesteps);
    ModelSampling ms;
    ms.prediction_ = Prediction::Flow;
    ms.shift_ = shift;
    ms.table_.resize(static_cast<size_t>(timesteps));
    for (int i = 0; i < timesteps; ++i)
        ms.table_[i] = static_cast<float>(ms.flow_shift(static_cast<double>(i + 1) / timesteps));
    return ms;
}

ModelSampling ModelSampling::flow_dynamic(double mu, int timesteps) {
    if (!std::isfinite(mu)) fail(ErrorKind::InvalidInput, "flow mu must be finite, got {}", mu);
    ModelSampling ms = flow(1.0, timesteps);
    ms.dynamic_ = true;
    ms.mu_ = mu;
    for (int i = 0; i < timesteps; ++i)
        ms.table_[i] = static_cast<float>(ms.flow_shift(static_cast<double>(i + 1) / timesteps));
    return ms;
}

double ModelSampling::flow_shift(double s) const {
    if (dynamic_) {
        if (s <= 0) return 0.0;
        const double em = std::exp(mu_);
        return em / (em + (1.0 / s - 1.0));
    }
    return shift_ * s / (1.0 + (shift_ - 1.0) * s);
}

double ModelSampling::sigma_to_t(double sigma) const {
    if (is_flow()) return sigma * num_timesteps();
    const int n = num_timesteps();
    const double log_sigma = std::log(std::max(sigma, 1e-10));
    // largest i with log_sigmas[i] <= log_sigma (0 if none), clipped to n-2
    int low = 0;
    for (int i = 0; i < n; ++i)
        if (log_table_[i] <= log_sigma) low = i;
    low = std::min(low, n - 2);
    const double lo = log_table_[low], hi = log_table_[low + 1];
    double w = (lo - log_sigma) / (lo - hi);
    w = std::clamp(w, 0.0, 1.0);
    return (1.0 - w) * low + w * (low + 1);
}

double ModelSampling::t_to_sigma(double t) const {
    const int n = num_timesteps();
    if (is_flow()) return flow_shift(t / n);
    t = std::clamp(t, 0.0, static_cast<double>(n - 1));
    const int low = static_cast<int>(std::floor(t));
    const int high = static_cast<int>(std::ceil(t));
    const double w = t - low;
    return std::exp((1.0 - w) * log_table_[low] + w * log_table_[high]);
}

double flux_mu(double image_seq_len, double base_seq_len, double max_seq_len, double base_shift, double max_shift) {
    if (!(max_seq_len > base_seq_len))
        fail(ErrorKind::InvalidInput, "flux_mu: max_seq_len ({}) must exceed base_seq_len ({})", max_seq_len, base_seq_len);
    const double m = (max_shift - base_shift) / (max_seq_len - base_seq_len);
    const double b = base_shift - m * base_seq_len;
    return image_seq_len * m + b;
}

double flux2_empirical_mu(double image_seq_len, int num_steps) {
    if (num_steps < 1) fail(ErrorKind::InvalidInput, "flux2_empirical_mu: num_steps must be >= 1, got {}", num_steps);
    const double m200 = 0.00016927 * image_seq_len + 0.45666666;
    if (image_seq_len > 4300) return m200;
    const double m10 = 8.73809524e-05 * image_seq_len + 1.89833333;
    const double a = (m200 - m10) / 190.0;
    const double b = m200 - 200.0 * a;
    return a * num_steps + b;
}

// ---------------------------------------------------------------------------------------

SchedulerKind parse_scheduler(std::string_view name) {
    const std::string s = ascii_lower(name);
    if (s == "discrete" || s == "default") return SchedulerKind::Discrete;
    if (s == "karras") return SchedulerKind::Karras;
    if (s == "exponential") return SchedulerKind::Exponential;
    if (s == "sgm_uniform") return SchedulerKind::SgmUniform;
    if (s == "simple") return SchedulerKind::Simple;
    if (s == "lcm") return SchedulerKind::Lcm;
    if (s == "flux") return SchedulerKind::Flux;
    if (s == "flux2") return SchedulerKind::Flux2;
    if (s == "ays" || s == "gits" || s == "smoothstep" || s == "kl_optimal" || s == "bong_tangent")
        fail(ErrorKind::Unsupported,
             "scheduler '{}' (an sd-cli name) is not available in easel: use discrete, karras, exponential, sgm_uniform, simple, lcm, flux or flux2", name);
    fail(ErrorKind::InvalidInput,
         "unknown scheduler '{}': use discrete, karras, exponential, sgm_uniform, simple, lcm, flux or flux2", name);
}

const char* scheduler_name(SchedulerKind kind) {
    switch (kind) {
        case SchedulerKind::Discrete: return "discrete";
        case SchedulerKind::Karras: return "karras";
        case SchedulerKind::Exponential: return "exponential";
        case SchedulerKind::SgmUniform: return "sgm_uniform";
        case SchedulerKind::Simple: return "simple";
        case SchedulerKind::Lcm: return "lcm";
        case SchedulerKind::Flux: return "flux";
        case SchedulerKind::Flux2: return "flux2";
    }
    return "?";
}

Spacing parse_spacing(std::string_view name) {
    const std::string s = ascii_lower(name);
    if (s == "linspace") return Spacing::Linspace;
    if (s == "leading") return Spacing::Leading;
    if (s == "trailing") return Spacing::Trailing;
    fail(ErrorKind::InvalidInput, "unknown timestep spacing '{}': use linspace, leading or trailing", name);
}

namespace {

// Fills timesteps from sigma_to_t and appends the final 0.
Schedule from_sigmas(const ModelSampling& ms, const std::vector<double>& sig) {
    Schedule s;
    for (double v : sig) {
        s.sigmas.push_back(static_cast<float>(v));
        s.timesteps.push_back(static_cast<float>(ms.sigma_to_t(v)));
    }
    s.sigmas.push_back(0.0f);
    return s;
}

std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int n, double rho) {
    const auto ramp = np_linspace(0.0, 1.0, n);
    const double min_inv = std::pow(sigma_min, 1.0 / rho), max_inv = std::pow(sigma_max, 1.0 / rho);
    std::vector<double> out;
    for (double r : ramp) out.push_back(std::pow(max_inv + r * (min_inv - max_inv), rho));
    return out;
}

Schedule flow_discrete(const ModelSampling& ms, int n, bool pipeline_sigmas) {
    const int T = ms.num_timesteps();
    std::vector<double> base;
    if (pipeline_sigmas) {
        for (double v : np_linspace(1.0, 1.0 / n, n)) base.push_back(static_cast<float>(v));
    } else {
        // FlowMatchEulerDiscreteScheduler: sigma_max = 1, sigma_min = the last training sigma
        // (shifted when the shift is static, raw 1/T when dynamic); timesteps linspace in t.
        const double smin = ms.dynamic() ? static_cast<float>(1.0 / T) : ms.sigma_min();
        for (double t : np_linspace(1.0 * T, smin * T, n)) base.push_back(t / T);
    }
    Schedule s;
    for (double b : base) {
        const float sig = static_cast<float>(ms.flow_shift(b));
        s.sigmas.push_back(sig);
        s.timesteps.push_back(sig * static_cast<float>(T));
    }
    s.sigmas.push_back(0.0f);
    return s;
}

}  // namespace

Schedule make_schedule(const ModelSampling& ms, SchedulerKind kind, int n, const ScheduleOptions& opt) {
    check_steps(n);
    const int T = ms.num_timesteps();
    const auto& table = ms.sigmas();
    switch (kind) {
        case SchedulerKind::Discrete: {
            if (ms.is_flow()) return flow_discrete(ms, n, opt.flow_pipeline_sigmas);
            std::vector<double> ts;
            switch (opt.spacing) {
                case Spacing::Linspace: {
                    auto v = np_linspace(0.0, T - 1.0, n);
                    for (auto it = v.rbegin(); it != v.rend(); ++it) ts.push_back(static_cast<float>(*it));
                    break;
                }
                case Spacing::Leading: {
                    const int ratio = T / n;
                    if (ratio < 1) fail(ErrorKind::InvalidInput, "leading spacing needs steps <= {}, got {}", T, n);
                    for (int i = n - 1; i >= 0; --i) ts.push_back(static_cast<double>(i * ratio + opt.steps_offset));
                    break;
                }
                case Spacing::Trailing: {
                    const double ratio = static_cast<double>(T) / n;
                    for (int i = 0; i < n; ++i) ts.push_back(std::nearbyint(T - i * ratio) - 1.0);
                    break;
                }
            }
            Schedule s;
            for (double t : ts) {
                if (t < 0 || t > T - 1)
                    fail(ErrorKind::InvalidInput, "timestep {} out of range 0..{} (steps_offset {})", t, T - 1, opt.steps_offset);
                s.timesteps.push_back(static_cast<float>(t));
                s.sigmas.push_back(static_cast<float>(interp_table(table, t)));
            }
            s.sigmas.push_back(0.0f);
            // EulerDiscreteScheduler.init_noise_sigma: max sigma for linspace / trailing,
            // (max^2 + 1)^0.5 for leading (float32 tensor arithmetic).
            const float mx = *std::max_element(s.sigmas.begin(), s.sigmas.end());
            s.init_noise_sigma = opt.spacing == Spacing::Leading ? std::sqrt(mx * mx + 1.0f) : mx;
            return s;
        }
        case SchedulerKind::Karras:
            if (!(opt.rho > 0)) fail(ErrorKind::InvalidInput, "karras rho must be > 0, got {}", opt.rho);
            return from_sigmas(ms, karras_sigmas(ms.sigma_min(), ms.sigma_max(), n, opt.rho));
        case SchedulerKind::Exponential: {
            std::vector<double> sig;
            for (double l : np_linspace(std::log(ms.sigma_max()), std::log(ms.sigma_min()), n)) sig.push_back(std::exp(l));
            return from_sigmas(ms, sig);
        }
        case SchedulerKind::SgmUniform: {
            const double t0 = ms.is_flow() ? ms.sigma_max() * T : T - 1.0;
            const double t1 = ms.is_flow() ? ms.sigma_min() * T : 0.0;
            auto ts = np_linspace(t0, t1, n + 1);
            std::vector<double> sig;
            for (int i = 0; i < n; ++i) sig.push_back(ms.t_to_sigma(ts[i]));
            return from_sigmas(ms, sig);
        }
        case SchedulerKind::Simple: {
            const double ss = static_cast<double>(T) / n;
            std::vector<double> sig;
            for (int i = 0; i < n; ++i) sig.push_back(table[T - 1 - static_cast<int>(i * ss)]);
            return from_sigmas(ms, sig);
        }
        case SchedulerKind::Lcm: {
            if (ms.is_flow()) fail(ErrorKind::InvalidInput, "the lcm scheduler needs a discrete (eps/v) model");
            const int orig = opt.lcm_original_steps;
            if (orig < 1 || orig > T || n > orig)
                fail(ErrorKind::InvalidInput, "lcm scheduler: need 1 <= steps ({}) <= original steps ({}) <= {}", n, orig, T);
            const int k = T / orig;
            // origin timesteps (1..orig)*k - 1, reversed; pick floor(linspace(0, orig, n, endpoint=False))
            Schedule s;
            for (int i = 0; i < n; ++i) {
                const int idx = static_cast<int>(std::floor(static_cast<double>(i) * orig / n));
                const int t = (orig - idx) * k - 1;
                s.timesteps.push_back(static_cast<float>(t));
                s.sigmas.push_back(table[t]);
            }
            s.sigmas.push_back(0.0f);
            return s;
        }
        case SchedulerKind::Flux:
        case SchedulerKind::Flux2: {
            const char* nm = kind == SchedulerKind::Flux ? "flux" : "flux2";
            if (!ms.is_flow())
                fail(ErrorKind::InvalidInput, "the {} scheduler needs a flow-matching model (FLUX, Z-Image), not an eps/v model", nm);
            if (opt.image_seq_len <= 0)
                fail(ErrorKind::InvalidInput, "the {} scheduler needs the image token count (ScheduleOptions::image_seq_len)", nm);
            const double L = static_cast<double>(opt.image_seq_len);
            const double mu = kind == SchedulerKind::Flux
                                  ? flux_mu(L, opt.base_seq_len, opt.max_seq_len, opt.base_shift, opt.max_shift)
                                  : flux2_empirical_mu(L, n);
            return flow_discrete(ModelSampling::flow_dynamic(mu, T), n, true);
        }
    }
    fail(ErrorKind::Internal, "unhandled scheduler kind");
}

Schedule diffusers_dpmsolver_schedule(const ModelSampling& ms, int n, bool karras) {
    check_steps(n);
    if (ms.is_flow()) fail(ErrorKind::InvalidInput, "diffusers_dpmsolver_schedule needs a discrete (eps/v) model");
    const int T = ms.num_timesteps();
    Schedule s;
    if (karras) {
        for (double v : karras_sigmas(ms.sigma_min(), ms.sigma_max(), n, 7.0)) {
            s.sigmas.push_back(static_cast<float>(v));
            s.timesteps.push_back(static_cast<float>(std::nearbyint(ms.sigma_to_t(v))));
        }
    } else {
        auto v = np_linspace(0.0, T - 1.0, n + 1);
        for (int i = n; i >= 1; --i) {
            const double t = std::nearbyint(v[i]);
            s.timesteps.push_back(static_cast<float>(t));
            s.sigmas.push_back(static_cast<float>(interp_table(ms.sigmas(), t)));
        }
    }
    s.sigmas.push_back(0.0f);
    return s;
}

Schedule ddim_trailing_schedule(const ModelSampling& ms, int n) {
    check_steps(n);
    if (ms.is_flow()) fail(ErrorKind::InvalidInput, "ddim_trailing needs a discrete (eps/v) model, not a flow model");
    const int T = ms.num_timesteps();
    if (n > T) fail(ErrorKind::InvalidInput, "ddim_trailing: steps ({}) must not exceed {}", n, T);
    Schedule s;
    for (int i = 0; i < n; ++i) {
        const int t = static_cast<int>(std::nearbyint(T - i * (static_cast<double>(T) / n))) - 1;
        s.timesteps.push_back(static_cast<float>(t));
        s.sigmas.push_back(ms.sigmas()[t]);
    }
    const int last_prev = static_cast<int>(s.timesteps.back()) - T / n;
    s.sigmas.push_back(ms.sigmas()[std::max(last_prev, 0)]);
    return s;
}

int img2img_start_step(int steps, double strength) {
    check_steps(steps);
    if (!(strength >= 0.0 && strength <= 1.0))
        fail(ErrorKind::InvalidInput, "img2img strength must be in [0, 1], got {}", strength);
    int t_enc = static_cast<int>(steps * strength);
    if (t_enc >= steps) t_enc = steps - 1;
    return steps - t_enc - 1;
}

}  // namespace easel::sampling
