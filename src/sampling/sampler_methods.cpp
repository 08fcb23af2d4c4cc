// The sampling methods added with issue 26 (Sampler::step_more). Every formula names its
// reference; docs/sampling.md has the table. Arithmetic is in double per element, stored as
// float32, as in sampler.cpp.
//
// Notation: s = sigmas[i], sn = sigmas[i+1], D = D(x; s), d = (x - D)/s. For flow models the
// half-log-SNR is lambda(sigma) = log((1 - sigma)/sigma) and alpha(sigma) = 1 - sigma; for eps/v
// models lambda = -log sigma and alpha = 1 (ComfyUI sigma_to_half_log_snr / half_log_snr_to_sigma).
#include "sampling/sampler.h"

#include "core/error.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace easel::sampling {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// k-diffusion get_ancestral_step: (sigma_down, sigma_up).
std::pair<double, double> ancestral_step(double s, double sn, double eta) {
    if (eta == 0.0 || sn == 0.0) return {sn, 0.0};
    const double up = std::min(sn, eta * std::sqrt(sn * sn * (s * s - sn * sn) / (s * s)));
    const double down = std::sqrt(sn * sn - up * up);
    return {down, up};
}

// sd.cpp get_ancestral_step_flow (= ComfyUI's RF renoise): (sigma_down, sigma_up, alpha_scale).
struct FlowAncestral {
    double down, up, alpha_scale;
};
FlowAncestral ancestral_step_flow(double s, double sn, double eta) {
    if (eta <= 0.0 || s <= 0.0 || sn <= 0.0) return {sn, 0.0, 1.0};
    eta = std::min(eta, 1.0);
    double down = sn * (1.0 + (sn / s - 1.0) * eta);
    down = std::clamp(down, 0.0, sn);
    const double denom = 1.0 - down;
    if (denom <= 0.0) return {sn, 0.0, 1.0};
    const double alpha_scale = (1.0 - sn) / denom;
    const double term = std::clamp((down / sn) * alpha_scale, -1.0, 1.0);
    return {down, sn * std::sqrt(std::max(1.0 - term * term, 0.0)), alpha_scale};
}

// sd.cpp get_ancestral_step(sigma_from, sigma_to, eta, is_flow).
FlowAncestral ancestral_any(double s, double sn, double eta, bool flow) {
    if (flow) return ancestral_step_flow(s, sn, eta);
    const auto [down, up] = ancestral_step(s, sn, eta);
    return {down, up, 1.0};
}

// sd.cpp res_multistep / res_2s phi functions (series near 0).
double phi1(double t) { return std::abs(t) < 1e-6 ? 1.0 + t * 0.5 + t * t / 6.0 : std::expm1(t) / t; }
double phi2(double t) { return std::abs(t) < 1e-6 ? 0.5 + t / 6.0 + t * t / 24.0 : (phi1(t) - 1.0) / t; }

// Solves the k x k system a * x = b (k <= 3) by Gaussian elimination with partial pivoting.
template <size_t K>
std::array<double, K> solve(std::array<std::array<double, K>, K> a, std::array<double, K> b, size_t k) {
    for (size_t c = 0; c < k; ++c) {
        size_t p = c;
        for (size_t r = c + 1; r < k; ++r)
            if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
        std::swap(a[c], a[p]);
        std::swap(b[c], b[p]);
        for (size_t r = c + 1; r < k; ++r) {
            const double f = a[r][c] / a[c][c];
            for (size_t j = c; j < k; ++j) a[r][j] -= f * a[c][j];
            b[r] -= f * b[c];
        }
    }
    std::array<double, K> x{};
    for (size_t c = k; c-- > 0;) {
        double v = b[c];
        for (size_t j = c + 1; j < k; ++j) v -= a[c][j] * x[j];
        x[c] = v / a[c][c];
    }
    return x;
}

// The integral over [a, b] of the Lagrange basis polynomial of node j over nodes t[0..order-1]
// (k-diffusion linear_multistep_coeff: scipy quad of a polynomial of degree <= 3, which the
// 4-point Gauss-Legendre rule integrates exactly).
double lms_coeff(int order, const double* nodes, int j, double a, double b) {
    static constexpr double kX[4] = {-0.8611363115940526, -0.3399810435848563, 0.3399810435848563, 0.8611363115940526};
    static constexpr double kW[4] = {0.3478548451374538, 0.6521451548625461, 0.6521451548625461, 0.3478548451374538};
    const double half = 0.5 * (b - a), mid = 0.5 * (a + b);
    double sum = 0;
    for (int q = 0; q < 4; ++q) {
        const double tau = mid + half * kX[q];
        double prod = 1.0;
        for (int k = 0; k < order; ++k)
            if (k != j) prod *= (tau - nodes[k]) / (nodes[j] - nodes[k]);
        sum += kW[q] * prod;
    }
    return sum * half;
}

// diffusers DEISMultistepScheduler ind_fn (order 2): the antiderivative of
// (log t - log c)/(log b - log c); t log t -> 0 as t -> 0 (a schedule ending in 0).
double deis_ind2(double t, double b, double c) {
    if (t == 0.0) return 0.0;
    return t * (-std::log(c) + std::log(t) - 1.0) / (std::log(b) - std::log(c));
}

constexpr int kUniPcOrder = 2;  // diffusers UniPCMultistepScheduler solver_order default
constexpr int kDeisOrder = 2;   // diffusers DEISMultistepScheduler solver_order default

}  // namespace

void Sampler::step_more(Denoiser& d) {
    const SamplerInfo& info = sampler_info(st_.kind);
    const ModelSampling& ms = d.model_sampling();
    const bool flow = st_.flow;
    const int64_t i = st_.step;
    const int64_t N = steps();
    auto& x = st_.x;
    const size_t n = x.size();
    const double eta = st_.eta, s_noise = st_.s_noise;

    // ComfyUI offset_first_sigma_for_snr (dpm++_sde, dpm++2m_sde, er_sde): on a flow model a first
    // sigma >= 1 (log-SNR -inf) becomes percent_to_sigma(1e-4), for the step and its evaluation.
    const bool snr_offset = flow && (st_.kind == SamplerKind::DpmPPSde || st_.kind == SamplerKind::DpmPP2MSde ||
                                     st_.kind == SamplerKind::DpmPP2MSdeBt || st_.kind == SamplerKind::ErSde);
    auto sig = [&](int64_t j) -> double {
        const double v = st_.sigmas[static_cast<size_t>(j)];
        if (snr_offset && j == 0 && v >= 1.0) return ms.flow_shift(1.0 - 1e-4);
        return v;
    };
    auto lam = [&](double v) { return flow ? std::log((1.0 - v) / v) : -std::log(v); };         // half-log-SNR
    auto sig_of_lam = [&](double l) { return flow ? 1.0 / (1.0 + std::exp(l)) : std::exp(-l); };  // its inverse
    auto alpha_of = [&](double v) { return flow ? 1.0 - v : 1.0; };

    const double s = sig(i), sn = st_.sigmas[static_cast<size_t>(i + 1)];
    const double t = s == st_.sigmas[static_cast<size_t>(i)] ? static_cast<double>(st_.timesteps[static_cast<size_t>(i)]) : kNaN;
    den_.resize(n);
    if (info.needs_uncond) {
        unc_.resize(n);
        d.denoise(x, s, t, den_, unc_);
    } else {
        d.denoise(x, s, t, den_);
    }
    const auto& D = den_;
    auto dk = [&](size_t k) { return (x[k] - static_cast<double>(D[k])) / s; };

    switch (st_.kind) {
        case SamplerKind::Dpm2A: {
            // k-diffusion sample_dpm_2_ancestral; flow: ComfyUI sample_dpm_2_ancestral_RF
            double down, up, renoise_a = 1.0;
            if (!flow) {
                std::tie(down, up) = ancestral_step(s, sn, eta);
            } else {
                down = sn * (1.0 + (sn / s - 1.0) * eta);
                const double a_n = 1.0 - sn, a_down = 1.0 - down;
                up = std::sqrt(std::max(0.0, sn * sn - down * down * a_n * a_n / (a_down * a_down)));
                renoise_a = a_n / a_down;
            }
            if (down == 0) {
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(x[k] + dk(k) * (down - s));
                break;
            }
            const double mid = std::exp(std::log(s) + 0.5 * (std::log(down) - std::log(s)));  // torch lerp in log sigma
            tmp_.resize(n);
            for (size_t k = 0; k < n; ++k) tmp_[k] = static_cast<float>(x[k] + dk(k) * (mid - s));
            tmp2_.resize(n);
            d.denoise(tmp_, mid, kNaN, tmp2_);
            for (size_t k = 0; k < n; ++k) {
                const double d2 = (tmp_[k] - static_cast<double>(tmp2_[k])) / mid;
                x[k] = static_cast<float>(x[k] + d2 * (down - s));
            }
            const auto z = noise(st_.sigmas[static_cast<size_t>(i)], sn);
            const double c = s_noise * up;
            for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(renoise_a * x[k] + z[k] * c);
            break;
        }
        case SamplerKind::DpmPPSde: {
            // k-diffusion sample_dpmpp_sde (r = 1/2) in ComfyUI's half-log-SNR form
            if (sn == 0) {
                x = D;
                break;
            }
            const double r = 0.5, fac = 1.0 / (2.0 * r);
            const double ls = lam(s), lt = lam(sn), h = lt - ls, ls1 = ls + r * h;
            const double s1 = sig_of_lam(ls1);
            const double a_s = s * std::exp(ls), a_s1 = s1 * std::exp(ls1), a_t = sn * std::exp(lt);
            const bool noisy = eta > 0 && s_noise > 0;
            // step 1
            auto [sd1, su1] = ancestral_step(std::exp(-ls), std::exp(-ls1), eta);
            double h_ = -std::log(sd1) - ls;
            tmp_.resize(n);
            {
                const double c1 = (a_s1 / a_s) * std::exp(-h_), c2 = -a_s1 * std::expm1(-h_);
                for (size_t k = 0; k < n; ++k) tmp_[k] = static_cast<float>(c1 * x[k] + c2 * D[k]);
            }
            if (noisy) {
                const auto z = noise(s, s1);
                const double c = a_s1 * s_noise * su1;
                for (size_t k = 0; k < n; ++k) tmp_[k] = static_cast<float>(tmp_[k] + z[k] * c);
            }
            tmp2_.resize(n);
            d.denoise(tmp_, s1, kNaN, tmp2_);
            // step 2
            auto [sd2, su2] = ancestral_step(std::exp(-ls), std::exp(-lt), eta);
            h_ = -std::log(sd2) - ls;
            {
                const double c1 = (a_t / a_s) * std::exp(-h_), c2 = -a_t * std::expm1(-h_);
                for (size_t k = 0; k < n; ++k) {
                    const double dd = (1.0 - fac) * D[k] + fac * static_cast<double>(tmp2_[k]);
                    x[k] = static_cast<float>(c1 * x[k] + c2 * dd);
                }
            }
            if (noisy) {
                const auto z = noise(s, sn);
                const double c = a_t * s_noise * su2;
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(x[k] + z[k] * c);
            }
            break;
        }
        case SamplerKind::DpmPP2MSde:
        case SamplerKind::DpmPP2MSdeBt: {
            // k-diffusion sample_dpmpp_2m_sde (midpoint) in ComfyUI's half-log-SNR form
            if (sn == 0) {
                x = D;
            } else {
                const double ls = lam(s), lt = lam(sn), h = lt - ls, h_eta = h * (eta + 1.0);
                const double a_t = sn * std::exp(lt);
                const double c_x = sn / s * std::exp(-h * eta), c_d = -a_t * std::expm1(-h_eta);
                double c_old = 0.0;
                if (i > 0 && !st_.old_denoised.empty()) {
                    const double h_last = ls - lam(sig(i - 1));
                    c_old = 0.5 * (-a_t * std::expm1(-h_eta)) * (h / h_last);
                }
                for (size_t k = 0; k < n; ++k) {
                    double v = c_x * x[k] + c_d * D[k];
                    if (c_old != 0.0) v += c_old * (static_cast<double>(D[k]) - st_.old_denoised[k]);
                    x[k] = static_cast<float>(v);
                }
                if (eta > 0 && s_noise > 0) {
                    const auto z = noise(s, sn);
                    const double c = sn * std::sqrt(-std::expm1(-2.0 * h * eta)) * s_noise;
                    for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(x[k] + z[k] * c);
                }
            }
            st_.old_denoised = D;
            break;
        }
        case SamplerKind::DpmPP2Mv2: {
            // sd.cpp sample_dpmpp_2m_v2 (t = -log sigma on every model)
            if (sn == 0) {
                x = D;
            } else {
                const double tt = -std::log(s), tn = -std::log(sn), h = tn - tt, a = sn / s;
                if (i == 0 || st_.old_denoised.empty()) {
                    const double b = std::exp(-h) - 1.0;
                    for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(a * x[k] - b * D[k]);
                } else {
                    const double h_last = tt + std::log(st_.sigmas[static_cast<size_t>(i - 1)]);
                    const double h_min = std::min(h_last, h), h_max = std::max(h_last, h);
                    const double r = h_max / h_min, h_d = (h_max + h_min) / 2.0, b = std::exp(-h_d) - 1.0;
                    const double c_cur = 1.0 + 1.0 / (2.0 * r), c_old = -1.0 / (2.0 * r);
                    for (size_t k = 0; k < n; ++k)
                        x[k] = static_cast<float>(a * x[k] - b * (c_cur * D[k] + c_old * st_.old_denoised[k]));
                }
            }
            st_.old_denoised = D;
            break;
        }
        case SamplerKind::Ipndm:
        case SamplerKind::IpndmV: {
            // ComfyUI sample_ipndm / sample_ipndm_v (zju-pi diff-solvers), max order 4; history = the
            // last <= 3 derivatives, oldest first
            auto& hist = st_.history;
            const int order = std::min<int>(4, static_cast<int>(hist.size()) + 1);
            std::vector<float> dcur(n);
            for (size_t k = 0; k < n; ++k) dcur[k] = static_cast<float>(dk(k));
            auto hb = [&](int back, size_t k) { return static_cast<double>(hist[hist.size() - static_cast<size_t>(back)][k]); };
            if (sn == 0) {
                x = D;
            } else if (order == 1) {
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(x[k] + (sn - s) * dcur[k]);
            } else if (st_.kind == SamplerKind::Ipndm) {
                for (size_t k = 0; k < n; ++k) {
                    double v;
                    if (order == 2) v = (3.0 * dcur[k] - hb(1, k)) / 2.0;
                    else if (order == 3) v = (23.0 * dcur[k] - 16.0 * hb(1, k) + 5.0 * hb(2, k)) / 12.0;
                    else v = (55.0 * dcur[k] - 59.0 * hb(1, k) + 37.0 * hb(2, k) - 9.0 * hb(3, k)) / 24.0;
                    x[k] = static_cast<float>(x[k] + (sn - s) * v);
                }
            } else {
                auto ts = [&](int64_t j) { return static_cast<double>(st_.sigmas[static_cast<size_t>(j)]); };
                const double h_n = sn - s, h_n_1 = s - ts(i - 1);
                double c1, c2, c3 = 0, c4 = 0;
                if (order == 2) {
                    c1 = (2.0 + (h_n / h_n_1)) / 2.0;
                    c2 = -(h_n / h_n_1) / 2.0;
                } else if (order == 3) {
                    const double h_n_2 = ts(i - 1) - ts(i - 2);
                    const double temp = (1.0 - h_n / (3.0 * (h_n + h_n_1)) * (h_n * (h_n + h_n_1)) / (h_n_1 * (h_n_1 + h_n_2))) / 2.0;
                    c1 = (2.0 + (h_n / h_n_1)) / 2.0 + temp;
                    c2 = -(h_n / h_n_1) / 2.0 - (1.0 + h_n_1 / h_n_2) * temp;
                    c3 = temp * h_n_1 / h_n_2;
                } else {
                    const double h_n_2 = ts(i - 1) - ts(i - 2), h_n_3 = ts(i - 2) - ts(i - 3);
                    const double temp1 = (1.0 - h_n / (3.0 * (h_n + h_n_1)) * (h_n * (h_n + h_n_1)) / (h_n_1 * (h_n_1 + h_n_2))) / 2.0;
                    const double temp2 = ((1.0 - h_n / (3.0 * (h_n + h_n_1))) / 2.0 +
                                          (1.0 - h_n / (2.0 * (h_n + h_n_1))) * h_n / (6.0 * (h_n + h_n_1 + h_n_2))) *
                                         (h_n * (h_n + h_n_1) * (h_n + h_n_1 + h_n_2)) /
                                         (h_n_1 * (h_n_1 + h_n_2) * (h_n_1 + h_n_2 + h_n_3));
                    const double q = h_n_1 * (h_n_1 + h_n_2) / (h_n_2 * (h_n_2 + h_n_3));
                    c1 = (2.0 + (h_n / h_n_1)) / 2.0 + temp1 + temp2;
                    c2 = -(h_n / h_n_1) / 2.0 - (1.0 + h_n_1 / h_n_2) * temp1 - (1.0 + (h_n_1 / h_n_2) + q) * temp2;
                    c3 = temp1 * h_n_1 / h_n_2 + ((h_n_1 / h_n_2) + q * (1.0 + h_n_2 / h_n_3)) * temp2;
                    c4 = -temp2 * q * h_n_1 / h_n_2;
                }
                for (size_t k = 0; k < n; ++k) {
                    double v = c1 * dcur[k] + c2 * hb(1, k);
                    if (order >= 3) v += c3 * hb(2, k);
                    if (order >= 4) v += c4 * hb(3, k);
                    x[k] = static_cast<float>(x[k] + (sn - s) * v);
                }
            }
            if (hist.size() == 3) hist.erase(hist.begin());
            hist.push_back(std::move(dcur));
            break;
        }
        case SamplerKind::Lms: {
            // k-diffusion sample_lms, order 4: x += sum_j c_j d_{i-j}, c_j = the integral over
            // [sigma_i, sigma_i+1] of the Lagrange basis of sigma_{i-j} on sigma_i .. sigma_{i-order+1}
            auto& hist = st_.history;  // the last <= 3 derivatives, oldest first
            std::vector<float> dcur(n);
            for (size_t k = 0; k < n; ++k) dcur[k] = static_cast<float>(dk(k));
            const int order = std::min<int>(4, static_cast<int>(hist.size()) + 1);
            double nodes[4];
            for (int k = 0; k < order; ++k) nodes[k] = st_.sigmas[static_cast<size_t>(i - k)];
            double c[4];
            for (int j = 0; j < order; ++j) c[j] = lms_coeff(order, nodes, j, st_.sigmas[static_cast<size_t>(i)], sn);
            for (size_t k = 0; k < n; ++k) {
                double v = c[0] * dcur[k];
                for (int j = 1; j < order; ++j) v += c[j] * hist[hist.size() - static_cast<size_t>(j)][k];
                x[k] = static_cast<float>(x[k] + v);
            }
            if (hist.size() == 3) hist.erase(hist.begin());
            hist.push_back(std::move(dcur));
            break;
        }
        case SamplerKind::Deis: {
            // diffusers DEISMultistepScheduler (deis, logrho, solver_order 2) in rho = sigma/alpha:
            // x_t/alpha_t = x_s/alpha_s + sum c_j eps_j, eps = (x - alpha D)/sigma (VP x for flow)
            auto rho_of = [&](double v) {
                if (flow && std::abs(v - 1.0) < 1e-6) v -= 1e-6;  // diffusers: sigma 1 -> 1 - 1e-6
                return flow ? v / (1.0 - v) : v;
            };
            auto a_of = [&](double v) {
                if (flow && std::abs(v - 1.0) < 1e-6) v -= 1e-6;
                return flow ? 1.0 - v : 1.0;
            };
            const double s_raw = st_.sigmas[static_cast<size_t>(i)];
            const double rho_s = rho_of(s_raw), rho_t = rho_of(sn), a_s = a_of(s_raw), a_t = a_of(sn);
            const double sig_s = flow ? (std::abs(s_raw - 1.0) < 1e-6 ? s_raw - 1e-6 : s_raw) : s;
            // eps; VE: (x - D)/sigma, flow: (x - (1-sigma) D)/sigma. The step uses it in double: on a
            // flow model's first step (alpha_s ~ 3e-4) x/alpha_s and c*eps cancel to 2-3 digits, and
            // a float32 eps would cost 2e-5 (the float32 copy is what the next step reads)
            auto eps = [&](size_t k) { return (x[k] - a_s * static_cast<double>(D[k])) / sig_s; };
            std::vector<float> m(n);
            for (size_t k = 0; k < n; ++k) m[k] = static_cast<float>(eps(k));
            auto& hist = st_.history;  // [eps of the previous step]
            const bool lof = N < 15 && i == N - 1;  // lower_order_final
            const int lower_order_nums = static_cast<int>(std::min<int64_t>(i, kDeisOrder));
            if (lower_order_nums < 1 || lof || hist.empty()) {
                const double c = rho_t - rho_s;
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(a_t * (x[k] / a_s + c * eps(k)));
            } else {
                const double rho_s1 = rho_of(st_.sigmas[static_cast<size_t>(i - 1)]);
                const double c1 = deis_ind2(rho_t, rho_s, rho_s1) - deis_ind2(rho_s, rho_s, rho_s1);
                const double c2 = deis_ind2(rho_t, rho_s1, rho_s) - deis_ind2(rho_s, rho_s1, rho_s);
                const auto& m1 = hist.back();
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(a_t * (x[k] / a_s + c1 * eps(k) + c2 * m1[k]));
            }
            hist.assign(1, std::move(m));
            break;
        }
        case SamplerKind::UniPc: {
            // diffusers UniPCMultistepScheduler (bh2, predict_x0, solver_order 2, lower_order_final):
            // corrector UniC on the previous predictor's output, then predictor UniP. Samples in VP
            // form (alpha x for eps/v models, x for flow); x0 predictions are D.
            // history: the last <= 2 x0 predictions (oldest first), then the sample before the last
            // predictor (variance-exploding / flow form, as x).
            auto sg = [&](int64_t j) {
                double v = st_.sigmas[static_cast<size_t>(j)];
                if (flow && std::abs(v - 1.0) < 1e-6) v -= 1e-6;  // diffusers set_timesteps
                return v;
            };
            auto al = [&](double v) { return flow ? 1.0 - v : 1.0 / std::sqrt(v * v + 1.0); };
            auto sgt = [&](double v) { return flow ? v : v / std::sqrt(v * v + 1.0); };
            auto lm = [&](double v) { return std::log(al(v)) - std::log(sgt(v)); };
            auto& hist = st_.history;
            const int prev_outputs = i > 0 && !hist.empty() ? static_cast<int>(hist.size()) - 1 : 0;
            std::vector<std::vector<float>> outs(hist.begin(), hist.begin() + prev_outputs);  // m_{i-k}, oldest first
            // The UniPC coefficients for order p (b, rhos) with rk = (lambda_{s_k} - lambda_s0)/h.
            struct Coeffs {
                double h_phi_1, B_h;
                std::array<double, 3> rhos{};
            };
            auto coeffs = [&](double h, const std::vector<double>& rks, int p, bool corrector) {
                Coeffs c;
                const double hh = -h;
                c.h_phi_1 = std::expm1(hh);
                double h_phi_k = c.h_phi_1 / hh - 1.0, fact = 1.0;
                c.B_h = std::expm1(hh);
                std::array<std::array<double, 3>, 3> R{};
                std::array<double, 3> b{};
                std::vector<double> r = rks;
                r.push_back(1.0);
                for (int k = 1; k <= p; ++k) {
                    for (size_t j = 0; j < r.size(); ++j) R[static_cast<size_t>(k - 1)][j] = std::pow(r[j], k - 1);
                    b[static_cast<size_t>(k - 1)] = h_phi_k * fact / c.B_h;
                    fact *= k + 1;
                    h_phi_k = h_phi_k / hh - 1.0 / fact;
                }
                if (corrector) {
                    if (p == 1) c.rhos[0] = 0.5;
                    else c.rhos = solve<3>(R, b, static_cast<size_t>(p));
                } else if (p >= 2) {
                    if (p == 2) c.rhos[0] = 0.5;
                    else c.rhos = solve<3>(R, b, static_cast<size_t>(p - 1));
                }
                return c;
            };
            // UniC: correct x (at sigma_i) with D, using the sample before the last predictor.
            if (i > 0 && prev_outputs > 0) {
                const int64_t prev = i - 1;
                const int prev_order = static_cast<int>(std::min<int64_t>(
                    std::min<int64_t>(kUniPcOrder, N - prev), std::min<int64_t>(prev, kUniPcOrder) + 1));
                const double st_v = sg(i), ss0 = sg(prev);
                const double a_t = al(st_v), s_t = sgt(st_v), a_s0 = al(ss0), s_s0 = sgt(ss0);
                const double h = lm(st_v) - lm(ss0);
                std::vector<double> rks;
                const auto& m0 = outs.back();
                for (int k = 1; k < prev_order; ++k) rks.push_back((lm(sg(prev - k)) - lm(ss0)) / h);
                const Coeffs c = coeffs(h, rks, prev_order, true);
                const auto& last = hist.back();  // x before the last predictor, at sigma_{i-1}
                const double a_last = flow ? 1.0 : al(ss0), a_x = flow ? 1.0 : a_t;
                for (size_t k = 0; k < n; ++k) {
                    const double xs = a_last * last[k];
                    double v = s_t / s_s0 * xs - a_t * c.h_phi_1 * m0[k];
                    double corr = 0;
                    for (int j = 1; j < prev_order; ++j) {
                        const double mj = outs[outs.size() - 1 - static_cast<size_t>(j)][k];
                        corr += c.rhos[static_cast<size_t>(j - 1)] * (mj - m0[k]) / rks[static_cast<size_t>(j - 1)];
                    }
                    const double d1t = static_cast<double>(D[k]) - m0[k];
                    v -= a_t * c.B_h * (corr + c.rhos[static_cast<size_t>(prev_order - 1)] * d1t);
                    x[k] = static_cast<float>(v / a_x);
                }
                (void)a_s0;
            }
            // history: append D (keep kUniPcOrder), remember x as the sample before this predictor
            outs.push_back(D);
            if (outs.size() > static_cast<size_t>(kUniPcOrder)) outs.erase(outs.begin());
            const int order = static_cast<int>(std::min<int64_t>(std::min<int64_t>(kUniPcOrder, N - i), std::min<int64_t>(i, kUniPcOrder) + 1));
            // UniP from x at sigma_i to sigma_i+1
            {
                const double ss0 = sg(i), stn = sn;
                const double a_t = al(stn), s_t = sgt(stn), s_s0 = sgt(ss0), a_s0 = al(ss0);
                const double h = lm(stn) - lm(ss0);
                std::vector<double> rks;
                for (int k = 1; k < order; ++k) rks.push_back((lm(sg(i - k)) - lm(ss0)) / h);
                const Coeffs c = coeffs(h, rks, order, false);
                const auto& m0 = outs.back();
                const double a_in = flow ? 1.0 : a_s0, a_out = flow ? 1.0 : a_t;
                std::vector<float> xnew(n);
                for (size_t k = 0; k < n; ++k) {
                    const double xs = a_in * x[k];
                    double v = (s_t == 0.0 ? 0.0 : s_t / s_s0 * xs) - a_t * c.h_phi_1 * m0[k];
                    double pred = 0;
                    for (int j = 1; j < order; ++j) {
                        const double mj = outs[outs.size() - 1 - static_cast<size_t>(j)][k];
                        pred += c.rhos[static_cast<size_t>(j - 1)] * (mj - m0[k]) / rks[static_cast<size_t>(j - 1)];
                    }
                    v -= a_t * c.B_h * pred;
                    xnew[k] = static_cast<float>(v / a_out);
                }
                hist = std::move(outs);
                hist.push_back(x);  // the (corrected) sample before this predictor
                x = std::move(xnew);
            }
            break;
        }
        case SamplerKind::Tcd: {
            // diffusers TCDScheduler.step / sd.cpp sample_tcd with gamma = eta: the predicted noised
            // sample at s' = floor((1 - eta) t_prev), then (eta > 0, not the last step) renoised to t_prev
            const auto& table = ms.sigmas();
            const int T = static_cast<int>(table.size());
            // sd.cpp get_timestep_from_sigma: the table index nearest to sn
            int t_prev = 0;
            {
                const auto it = std::lower_bound(table.begin(), table.end(), static_cast<float>(sn));
                if (it == table.begin()) t_prev = 0;
                else if (it == table.end()) t_prev = T - 1;
                else {
                    const int hi = static_cast<int>(it - table.begin()), lo = hi - 1;
                    t_prev = std::abs(table[static_cast<size_t>(hi)] - sn) < std::abs(table[static_cast<size_t>(lo)] - sn) ? hi : lo;
                }
            }
            const int ts = static_cast<int>(std::floor((1.0 - eta) * t_prev));
            const double sig_s = table[static_cast<size_t>(ts)];
            const double a_p = 1.0 / (sn * sn + 1.0), a_s = 1.0 / (sig_s * sig_s + 1.0), b_s = 1.0 - a_s;
            const double c_d = std::sqrt(a_s / a_p), c_e = std::sqrt(b_s / a_p);
            for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(c_d * D[k] + c_e * dk(k));
            if (eta > 0 && sn > 0) {
                const auto z = noise(s, sn);
                const double c1 = std::sqrt(a_p / a_s), c2 = std::sqrt(std::max(0.0, 1.0 / a_p - 1.0 / a_s));
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(c1 * x[k] + c2 * z[k]);
            }
            break;
        }
        case SamplerKind::ResMultistep: {
            // ComfyUI res_multistep (eta 0: sample_res_multistep); ancestral noise as sd.cpp (flow:
            // get_ancestral_step_flow); t = -log sigma on every model
            const FlowAncestral an = ancestral_any(s, sn, eta, flow);
            const bool have_old = i > 0 && !st_.old_denoised.empty();
            if (an.down == 0 || !have_old) {
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(x[k] + dk(k) * (an.down - s));
            } else {
                const double old_down = ancestral_any(st_.sigmas[static_cast<size_t>(i - 1)], s, eta, flow).down;
                const double tt = -std::log(s), t_old = -std::log(old_down), t_next = -std::log(an.down);
                const double t_prev = -std::log(st_.sigmas[static_cast<size_t>(i - 1)]);
                const double h = t_next - tt, c2 = (t_prev - t_old) / h;
                const double p1 = std::expm1(-h) / -h, p2 = (p1 - 1.0) / -h;
                double b1 = p1 - p2 / c2, b2 = p2 / c2;
                if (std::isnan(b1)) b1 = 0.0;
                if (std::isnan(b2)) b2 = 0.0;
                const double e = std::exp(-h);
                for (size_t k = 0; k < n; ++k)
                    x[k] = static_cast<float>(e * x[k] + h * (b1 * D[k] + b2 * st_.old_denoised[k]));
            }
            if (sn > 0) {
                const auto z = noise(s, sn);
                const double a = flow && an.up > 0 ? an.alpha_scale : 1.0, c = s_noise * an.up;
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(a * x[k] + z[k] * c);
            }
            st_.old_denoised = D;
            break;
        }
        case SamplerKind::Res2s: {
            // sd.cpp sample_res_2s (c2 = 1/2)
            const FlowAncestral an = ancestral_any(s, sn, eta, flow);
            if (an.down == 0) {
                x = D;
            } else {
                const double c2 = 0.5, tt = -std::log(s), t_next = -std::log(an.down), h = t_next - tt;
                const double a21 = c2 * phi1(-h * c2), b2 = phi2(-h) / c2, b1 = phi1(-h) - b2;
                const double sigma_c2 = std::exp(-(tt + h * c2));
                tmp_.resize(n);
                for (size_t k = 0; k < n; ++k) tmp_[k] = static_cast<float>(x[k] + (D[k] - static_cast<double>(x[k])) * (h * a21));
                tmp2_.resize(n);
                d.denoise(tmp_, sigma_c2, kNaN, tmp2_);
                for (size_t k = 0; k < n; ++k) {
                    const double x0 = x[k], e1 = D[k] - x0, e2 = tmp2_[k] - x0;
                    x[k] = static_cast<float>(x0 + h * (b1 * e1 + b2 * e2));
                }
            }
            if (sn > 0 && an.up > 0) {
                const auto z = noise(s, sn);
                const double a = flow ? an.alpha_scale : 1.0, c = s_noise * an.up;
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(a * x[k] + z[k] * c);
            }
            break;
        }
        case SamplerKind::ErSde: {
            // ComfyUI sample_er_sde (VP ER-SDE-Solver-3, noise_scaler x (e^{x^0.3} + 10)); sd.cpp's
            // noise amount s_noise = eta
            auto er_lambda = [&](int64_t j) { return std::exp(-lam(sig(j))); };  // sigma / alpha
            auto scaler = [](double v) { return v * (std::exp(std::pow(v, 0.3)) + 10.0); };
            const int stage = static_cast<int>(std::min<int64_t>(3, i + 1));
            const double noise_amount = eta * s_noise;
            if (sn == 0) {
                x = D;
            } else {
                const double ls = er_lambda(i), lt = er_lambda(i + 1);
                const double a_s = s / ls, a_t = sn / lt, r_alpha = a_t / a_s, r = scaler(lt) / scaler(ls);
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(r_alpha * r * x[k] + a_t * (1.0 - r) * D[k]);
                if (stage >= 2 && !st_.old_denoised.empty()) {
                    const double dt = lt - ls, step = -dt / 200.0;
                    double S = 0, Su = 0;
                    for (int p = 0; p < 200; ++p) {
                        const double pos = lt + p * step, sc = scaler(pos);
                        S += 1.0 / sc;
                        Su += (pos - ls) / sc;
                    }
                    S *= step;
                    Su *= step;
                    const double den_d = ls - er_lambda(i - 1);
                    std::vector<float> dd(n);
                    for (size_t k = 0; k < n; ++k) dd[k] = static_cast<float>((static_cast<double>(D[k]) - st_.old_denoised[k]) / den_d);
                    const double c2 = a_t * (dt + S * scaler(lt));
                    for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(x[k] + c2 * dd[k]);
                    if (stage >= 3 && !st_.history.empty()) {
                        const double den_u = (ls - er_lambda(i - 2)) / 2.0;
                        const double c3 = a_t * ((dt * dt) / 2.0 + Su * scaler(lt));
                        const auto& od = st_.history.back();
                        for (size_t k = 0; k < n; ++k) {
                            const double du = (static_cast<double>(dd[k]) - od[k]) / den_u;
                            x[k] = static_cast<float>(x[k] + c3 * du);
                        }
                    }
                    st_.history.assign(1, std::move(dd));
                }
                if (noise_amount > 0) {
                    const auto z = noise(s, sn);
                    double q = lt * lt - ls * ls * r * r;
                    const double c = a_t * noise_amount * (q > 0 ? std::sqrt(q) : 0.0);
                    for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(x[k] + z[k] * c);
                }
            }
            st_.old_denoised = D;
            break;
        }
        case SamplerKind::EulerCfgPP:
        case SamplerKind::EulerACfgPP: {
            // ComfyUI sample_euler_ancestral_cfg_pp (euler_cfg_pp: eta 0): the step direction from
            // the unconditional D, the landing point from the guided one
            if (sn == 0) {
                x = D;
                break;
            }
            const double a_s = alpha_of(s), a_t = alpha_of(sn);
            const double e = st_.kind == SamplerKind::EulerCfgPP ? 0.0 : eta;
            auto [down, up] = ancestral_step(s / a_s, sn / a_t, e);
            down *= a_t;
            for (size_t k = 0; k < n; ++k) {
                const double dd = (x[k] - a_s * static_cast<double>(unc_[k])) / s;
                x[k] = static_cast<float>(a_t * D[k] + down * dd);
            }
            if (e > 0 && s_noise > 0) {
                const auto z = noise(s, sn);
                const double c = a_t * s_noise * up;
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(x[k] + z[k] * c);
            }
            break;
        }
        default:
            fail(ErrorKind::Internal, "sampler: method {} has no step", sampler_name(st_.kind));
    }
}

}  // namespace easel::sampling
