// Noise schedules; formulas and sources are documented in schedule.h and docs/sampling.md.
#include "sampling/schedule.h"

#include "core/error.h"

#include <algorithm>
#include <cctype>
#include "core/strings.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

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

// ComfyUI / sd.cpp loglinear_interp: resample a decreasing list to num points, linear in log
// sigma over an even grid (float64 as numpy; np.interp).
std::vector<double> loglinear_interp(const std::vector<double>& levels, int num) {
    const int m = static_cast<int>(levels.size());
    const auto xs = np_linspace(0.0, 1.0, m);
    std::vector<double> ys(static_cast<size_t>(m));
    for (int k = 0; k < m; ++k) ys[k] = std::log(levels[static_cast<size_t>(m - 1 - k)]);
    const auto nx = np_linspace(0.0, 1.0, num);
    std::vector<double> out(static_cast<size_t>(num));
    for (int k = 0; k < num; ++k) {
        const double v = nx[k];
        double y;
        if (v <= xs[0]) y = ys[0];
        else if (v >= xs[m - 1]) y = ys[m - 1];
        else {
            int j = 0;
            while (j + 1 < m - 1 && xs[j + 1] <= v) ++j;
            const double slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j]);
            y = slope * (v - xs[j]) + ys[j];
        }
        out[static_cast<size_t>(num - 1 - k)] = std::exp(y);
    }
    return out;
}

// The regularised incomplete beta function I_x(a, b): the continued fraction (modified Lentz)
// on the side where it converges fast.
double incomplete_beta(double x, double a, double b) {
    if (x <= 0) return 0.0;
    if (x >= 1) return 1.0;
    auto cf = [](double x, double a, double b) {
        const double tiny = 1e-300;
        double c = 1.0, d = 1.0 - (a + b) * x / (a + 1.0);
        if (std::abs(d) < tiny) d = tiny;
        d = 1.0 / d;
        double h = d;
        for (int m = 1; m <= 1000; ++m) {
            const double m2 = 2.0 * m;
            double aa = m * (b - m) * x / ((a - 1.0 + m2) * (a + m2));
            d = 1.0 + aa * d;
            if (std::abs(d) < tiny) d = tiny;
            c = 1.0 + aa / c;
            if (std::abs(c) < tiny) c = tiny;
            d = 1.0 / d;
            h *= d * c;
            aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + 1.0 + m2));
            d = 1.0 + aa * d;
            if (std::abs(d) < tiny) d = tiny;
            c = 1.0 + aa / c;
            if (std::abs(c) < tiny) c = tiny;
            d = 1.0 / d;
            const double del = d * c;
            h *= del;
            if (std::abs(del - 1.0) < 1e-16) break;
        }
        return h;
    };
    const double lbeta = std::lgamma(a) + std::lgamma(b) - std::lgamma(a + b);
    const double front = std::exp(a * std::log(x) + b * std::log1p(-x) - lbeta);
    if (x < (a + 1.0) / (a + b + 2.0)) return front * cf(x, a, b) / a;
    return 1.0 - front * cf(1.0 - x, b, a) / b;
}

// The Beta(a, b) quantile (scipy.stats.beta.ppf) by bisection on I_x to double precision. The
// median of a symmetric law is 1/2 exactly (bisection would land an ulp off, and rint(ppf * 999)
// of ComfyUI's beta schedule sits on that tie at every even step count).
double beta_ppf(double u, double a, double b) {
    if (u <= 0) return 0.0;
    if (u >= 1) return 1.0;
    if (a == b && u == 0.5) return 0.5;
    double lo = 0.0, hi = 1.0;
    for (int it = 0; it < 200 && hi - lo > 0; ++it) {
        const double mid = 0.5 * (lo + hi);
        if (mid <= lo || mid >= hi) break;
        if (incomplete_beta(mid, a, b) < u) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

// Align Your Steps noise levels for 10 steps (NVIDIA, research.nvidia.com/labs/toronto-ai/AlignYourSteps;
// the values ComfyUI's AlignYourStepsScheduler and sd.cpp carry).
constexpr double kAysSd15[] = {14.6146412293, 6.4745760956, 3.8636745985, 2.6946151520, 1.8841921177, 1.3943805092,
                               0.9642583904,  0.6523686016, 0.3977456272, 0.1515232662, 0.0291671582};
constexpr double kAysSdxl[] = {14.6146412293, 6.3184485287, 3.7681790315, 2.1811480769, 1.3405244945, 0.8620721141,
                               0.5550693289,  0.3798540708, 0.2332364134, 0.1114188177, 0.0291671582};
constexpr double kAysSvd[] = {700.00, 54.5, 15.886, 7.977, 4.248, 1.789, 0.981, 0.403, 0.173, 0.034, 0.002};

// GITS noise levels, coefficient 1.20, for 2..20 steps (zju-pi/diff-sampler gits-main; ComfyUI
// GITSScheduler's NOISE_LEVELS[1.20], sd.cpp GITS_NOISE_1_20).
const std::vector<std::vector<double>>& gits_levels() {
    static const std::vector<std::vector<double>> t = {
        {14.61464119, 0.80330700, 0.02916753},
        {14.61464119, 1.56271636, 0.52423614, 0.02916753},
        {14.61464119, 2.36326075, 0.92192322, 0.36617002, 0.02916753},
        {14.61464119, 2.84484982, 1.24153244, 0.59516323, 0.25053367, 0.02916753},
        {14.61464119, 5.85520077, 2.05039096, 0.95350921, 0.45573691, 0.17026083, 0.02916753},
        {14.61464119, 5.85520077, 2.45070267, 1.24153244, 0.64427125, 0.29807833, 0.09824532, 0.02916753},
        {14.61464119, 5.85520077, 2.45070267, 1.36964464, 0.80330700, 0.45573691, 0.25053367, 0.09824532, 0.02916753},
        {14.61464119, 5.85520077, 2.84484982, 1.61558151, 0.95350921, 0.59516323, 0.36617002, 0.19894916, 0.09824532,
         0.02916753},
        {14.61464119, 5.85520077, 2.84484982, 1.67050016, 1.08895338, 0.74807048, 0.50118381, 0.32104823, 0.19894916,
         0.09824532, 0.02916753},
        {14.61464119, 5.85520077, 2.95596409, 1.84880662, 1.24153244, 0.83188516, 0.59516323, 0.41087446, 0.27464288,
         0.17026083, 0.09824532, 0.02916753},
        {14.61464119, 5.85520077, 3.07277966, 1.98035145, 1.36964464, 0.95350921, 0.69515091, 0.50118381, 0.36617002,
         0.25053367, 0.17026083, 0.09824532, 0.02916753},
        {14.61464119, 6.77309084, 3.46139455, 2.36326075, 1.56271636, 1.08895338, 0.80330700, 0.59516323, 0.45573691,
         0.34370604, 0.25053367, 0.17026083, 0.09824532, 0.02916753},
        {14.61464119, 6.77309084, 3.46139455, 2.45070267, 1.61558151, 1.16286600, 0.86115354, 0.64427125, 0.50118381,
         0.38853383, 0.29807833, 0.22545385, 0.17026083, 0.09824532, 0.02916753},
        {14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.12350607, 1.51179266, 1.08895338, 0.83188516, 0.64427125,
         0.50118381, 0.38853383, 0.29807833, 0.22545385, 0.17026083, 0.09824532, 0.02916753},
        {14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.12350607, 1.51179266, 1.08895338, 0.83188516, 0.64427125,
         0.50118381, 0.41087446, 0.32104823, 0.25053367, 0.19894916, 0.13792117, 0.09824532, 0.02916753},
        {14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.12350607, 1.51179266, 1.08895338, 0.83188516, 0.64427125,
         0.50118381, 0.41087446, 0.34370604, 0.27464288, 0.22545385, 0.17026083, 0.13792117, 0.09824532, 0.02916753},
        {14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.19988537, 1.61558151, 1.20157266, 0.92192322, 0.72133851,
         0.57119018, 0.45573691, 0.36617002, 0.29807833, 0.25053367, 0.19894916, 0.17026083, 0.13792117, 0.09824532,
         0.02916753},
        {14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.19988537, 1.61558151, 1.24153244, 0.95350921, 0.74807048,
         0.59516323, 0.47836450, 0.38853383, 0.32104823, 0.27464288, 0.22545385, 0.19894916, 0.17026083, 0.13792117,
         0.09824532, 0.02916753},
        {14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.19988537, 1.61558151, 1.24153244, 0.95350921, 0.74807048,
         0.59516323, 0.50118381, 0.41087446, 0.34370604, 0.29807833, 0.25053367, 0.22545385, 0.19894916, 0.17026083,
         0.13792117, 0.09824532, 0.02916753},
    };
    return t;
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

namespace {

struct SchedName {
    SchedulerKind kind;
    const char* name;
};
constexpr SchedName kSchedulers[] = {
    {SchedulerKind::Discrete, "discrete"},     {SchedulerKind::Karras, "karras"},
    {SchedulerKind::Exponential, "exponential"}, {SchedulerKind::Ays, "ays"},
    {SchedulerKind::Gits, "gits"},             {SchedulerKind::SgmUniform, "sgm_uniform"},
    {SchedulerKind::Simple, "simple"},         {SchedulerKind::Smoothstep, "smoothstep"},
    {SchedulerKind::KlOptimal, "kl_optimal"},  {SchedulerKind::Lcm, "lcm"},
    {SchedulerKind::Beta, "beta"},             {SchedulerKind::DdimUniform, "ddim_uniform"},
    {SchedulerKind::Flux, "flux"},             {SchedulerKind::Flux2, "flux2"},
};

}  // namespace

std::string scheduler_names() {
    std::string r;
    for (const auto& k : kSchedulers) r += (r.empty() ? "" : ", ") + std::string(k.name);
    return r;
}

SchedulerKind parse_scheduler(std::string_view name) {
    const std::string s = ascii_lower(name);
    if (s == "default" || s == "normal") return SchedulerKind::Discrete;
    for (const auto& k : kSchedulers)
        if (s == k.name) return k.kind;
    if (s == "bong_tangent" || s == "ltx2" || s == "logit_normal" || s == "polyexponential" || s == "linear_quadratic" ||
        s == "karras_exponential" || s == "laplace" || s == "vp")
        fail(ErrorKind::Unsupported, "scheduler '{}' is not available in easel: use one of {}", name, scheduler_names());
    fail(ErrorKind::InvalidInput, "unknown scheduler '{}': use one of {}", name, scheduler_names());
}

const char* scheduler_name(SchedulerKind kind) {
    for (const auto& k : kSchedulers)
        if (k.kind == kind) return k.name;
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
        case SchedulerKind::Ays:
        case SchedulerKind::Gits: {
            const bool ays = kind == SchedulerKind::Ays;
            if (ms.is_flow())
                fail(ErrorKind::InvalidInput, "the {} scheduler's noise levels are for SD1.x/SDXL (eps/v) models, not flow models: "
                     "use discrete, simple, beta or kl_optimal", ays ? "ays" : "gits");
            std::vector<double> lv;
            if (ays) {
                const double* tab = opt.ays_table == ScheduleOptions::AysTable::Sdxl ? kAysSdxl
                                    : opt.ays_table == ScheduleOptions::AysTable::Svd ? kAysSvd
                                                                                      : kAysSd15;
                lv.assign(tab, tab + 11);
                if (n + 1 != 11) lv = loglinear_interp(lv, n + 1);
            } else {
                if (n < 2) fail(ErrorKind::InvalidInput, "the gits scheduler needs at least 2 steps, got {}", n);
                const auto& g = gits_levels();
                lv = n <= 20 ? g[static_cast<size_t>(n - 2)] : loglinear_interp(g.back(), n + 1);
            }
            lv.pop_back();  // the last level becomes 0
            return from_sigmas(ms, lv);
        }
        case SchedulerKind::Smoothstep: {
            // sd.cpp SmoothStepScheduler (float arithmetic as there); t_to_sigma of its integer t
            // is the table entry (sd.cpp's flow t_to_sigma(t) is shift((t+1)/T) = table[t])
            const int t_max = T - 1;
            std::vector<double> sig;
            if (n == 1) {
                sig.push_back(table[static_cast<size_t>(t_max)]);
            } else {
                for (int i = 0; i < n; ++i) {
                    const float u = 1.f - float(i) / float(n);
                    const float sm = u * u * (3.0f - 2.0f * u);
                    sig.push_back(table[static_cast<size_t>(std::round(sm * static_cast<float>(t_max)))]);
                }
            }
            return from_sigmas(ms, sig);
        }
        case SchedulerKind::KlOptimal: {
            // ComfyUI kl_optimal_scheduler / sd.cpp KLOptimalScheduler
            double smin = ms.sigma_min(), smax = ms.sigma_max();
            if (smin <= 1e-6) smin = 1e-6;
            std::vector<double> sig;
            if (n == 1) {
                sig.push_back(smax);
            } else {
                const double amin = std::atan(smin), amax = std::atan(smax);
                for (int i = 0; i < n; ++i) {
                    const double w = static_cast<double>(i) / (n - 1);
                    sig.push_back(std::tan(w * amin + (1.0 - w) * amax));
                }
            }
            return from_sigmas(ms, sig);
        }
        case SchedulerKind::Beta: {
            // ComfyUI beta_scheduler: ts = 1 - linspace(0, 1, n, endpoint=False), t = rint(ppf(ts) (T-1)),
            // sigma = table[t], repeated t dropped
            if (!(opt.beta_alpha > 0) || !(opt.beta_beta > 0))
                fail(ErrorKind::InvalidInput, "beta scheduler: alpha and beta must be > 0, got {} and {}", opt.beta_alpha, opt.beta_beta);
            std::vector<double> sig;
            double last_t = -1;
            const double step = 1.0 / n;
            for (int i = 0; i < n; ++i) {
                const double u = 1.0 - (i * step);
                const double tt = std::nearbyint(beta_ppf(u, opt.beta_alpha, opt.beta_beta) * (T - 1));
                if (tt != last_t) sig.push_back(table[static_cast<size_t>(std::clamp(tt, 0.0, T - 1.0))]);
                last_t = tt;
            }
            return from_sigmas(ms, sig);
        }
        case SchedulerKind::DdimUniform: {
            // ComfyUI ddim_scheduler (A1111 "DDIM" schedule type)
            int steps = n;
            const bool zero_at_1 = std::abs(table[1]) <= 1e-5;
            if (zero_at_1) ++steps;
            const int ss = std::max(T / steps, 1);
            std::vector<double> sig;
            for (int x = 1; x < T; x += ss) sig.push_back(table[static_cast<size_t>(x)]);
            std::reverse(sig.begin(), sig.end());
            if (zero_at_1 && !sig.empty()) sig.pop_back();  // ComfyUI: that ~0 sigma is the last (no 0 appended)
            return from_sigmas(ms, sig);
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

Schedule ddim_schedule(const ModelSampling& ms, int n, Spacing spacing) {
    if (spacing == Spacing::Trailing) return ddim_trailing_schedule(ms, n);
    check_steps(n);
    if (ms.is_flow()) fail(ErrorKind::InvalidInput, "ddim needs a discrete (eps/v) model, not a flow model");
    const int T = ms.num_timesteps();
    if (n > T) fail(ErrorKind::InvalidInput, "ddim: steps ({}) must not exceed {}", n, T);
    const int ratio = T / n;
    Schedule s;
    if (spacing == Spacing::Leading) {
        // DDIMScheduler.set_timesteps "leading": (arange(0, n) * (T // n)).round()[::-1] + steps_offset (1)
        for (int i = n - 1; i >= 0; --i) s.timesteps.push_back(static_cast<float>(i * ratio + 1));
    } else {
        const auto v = np_linspace(0.0, T - 1.0, n);
        for (int i = n - 1; i >= 0; --i) s.timesteps.push_back(static_cast<float>(std::nearbyint(v[i])));
    }
    for (float t : s.timesteps) s.sigmas.push_back(ms.sigmas()[static_cast<size_t>(t)]);
    const int last_prev = static_cast<int>(s.timesteps.back()) - ratio;
    s.sigmas.push_back(ms.sigmas()[static_cast<size_t>(std::max(last_prev, 0))]);
    return s;
}

Schedule custom_schedule(const ModelSampling& ms, const std::vector<float>& v) {
    if (v.size() < 2)
        fail(ErrorKind::InvalidInput, "--sigmas needs at least 2 values (one step: the start sigma and the end sigma), got {}", v.size());
    if (v.size() > 10001) fail(ErrorKind::InvalidInput, "--sigmas gives {} steps; at most 10000", v.size() - 1);
    for (size_t i = 0; i < v.size(); ++i) {
        if (!std::isfinite(v[i]) || v[i] < 0)
            fail(ErrorKind::InvalidInput, "--sigmas value {} ({}) is not a finite number >= 0", i + 1, v[i]);
        if (ms.is_flow() && v[i] > 1.0f)
            fail(ErrorKind::InvalidInput, "--sigmas value {} ({}) is above 1: a flow model's sigmas run from 1 to 0", i + 1, v[i]);
        if (i > 0 && !(v[i] < v[i - 1]))
            fail(ErrorKind::InvalidInput, "--sigmas value {} ({}) is not below the one before it ({}): give a decreasing list, e.g. 14.61,7.8,3.5,0",
                 i + 1, v[i], v[i - 1]);
    }
    Schedule s;
    s.sigmas = v;
    for (size_t i = 0; i + 1 < v.size(); ++i) s.timesteps.push_back(static_cast<float>(ms.sigma_to_t(v[i])));
    return s;
}

std::vector<float> parse_sigmas(std::string_view text) {
    std::string t(text);
    auto trim = [](std::string& x) {
        const auto a = x.find_first_not_of(" \t\n\r\f\v");
        if (a == std::string::npos) {
            x.clear();
            return;
        }
        x = x.substr(a, x.find_last_not_of(" \t\n\r\f\v") - a + 1);
    };
    trim(t);
    if (!t.empty() && t.front() == '[') t.erase(0, 1);
    if (!t.empty() && t.back() == ']') t.pop_back();
    std::vector<float> out;
    size_t pos = 0;
    while (pos <= t.size()) {
        size_t comma = t.find(',', pos);
        if (comma == std::string::npos) comma = t.size();
        std::string item = t.substr(pos, comma - pos);
        trim(item);
        if (!item.empty()) {
            char* end = nullptr;
            errno = 0;
            const double d = std::strtod(item.c_str(), &end);
            if (end != item.c_str() + item.size() || errno == ERANGE || !std::isfinite(d) || std::abs(d) > 3.0e38)
                fail(ErrorKind::InvalidInput, "--sigmas: '{}' is not a number; give comma-separated sigmas, e.g. 14.61,7.8,3.5,0", item);
            out.push_back(static_cast<float>(d));
        } else if (comma != t.size()) {
            fail(ErrorKind::InvalidInput, "--sigmas '{}': an empty value between commas; give comma-separated sigmas, e.g. 14.61,7.8,3.5,0", text);
        }
        pos = comma + 1;
    }
    if (out.empty()) fail(ErrorKind::InvalidInput, "--sigmas '{}' holds no number; give comma-separated sigmas, e.g. 14.61,7.8,3.5,0", text);
    return out;
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
