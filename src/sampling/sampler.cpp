// Samplers: see sampler.h and docs/sampling.md for the methods and their sources.
#include "sampling/sampler.h"

#include "core/error.h"
#include "core/log.h"

#include <algorithm>
#include <cctype>
#include "core/strings.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

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

}  // namespace

namespace {

// name, default eta, uses eta, flow form, needs uncond, Brownian tree, reference
constexpr SamplerInfo kSamplers[] = {
    {SamplerKind::Euler, "euler", 0, false, true, false, false, "k-diffusion sample_euler"},
    {SamplerKind::EulerA, "euler_a", 1, true, true, false, false,
     "k-diffusion sample_euler_ancestral; flow: ComfyUI sample_euler_ancestral_RF"},
    {SamplerKind::Heun, "heun", 0, false, true, false, false, "k-diffusion sample_heun"},
    {SamplerKind::Dpm2, "dpm2", 0, false, true, false, false, "k-diffusion sample_dpm_2"},
    {SamplerKind::DpmPP2M, "dpm++2m", 0, false, true, false, false,
     "k-diffusion sample_dpmpp_2m; flow: diffusers DPMSolverMultistepScheduler use_flow_sigmas"},
    {SamplerKind::DpmPP2SA, "dpm++2s_a", 1, true, false, false, false, "k-diffusion sample_dpmpp_2s_ancestral"},
    {SamplerKind::Lcm, "lcm", 0, false, true, false, false, "k-diffusion / ComfyUI sample_lcm"},
    {SamplerKind::DdimTrailing, "ddim_trailing", 0, true, false, false, false,
     "DDIM (diffusers DDIMScheduler, trailing spacing); sd.cpp ddim_trailing"},
    {SamplerKind::Dpm2A, "dpm2_a", 1, true, true, false, false,
     "k-diffusion sample_dpm_2_ancestral; flow: ComfyUI sample_dpm_2_ancestral_RF"},
    {SamplerKind::DpmPP2S, "dpm++2s", 0, true, false, false, false, "k-diffusion sample_dpmpp_2s_ancestral with eta 0"},
    {SamplerKind::DpmPPSde, "dpm++_sde", 1, true, true, false, true,
     "k-diffusion sample_dpmpp_sde (r 1/2); flow: ComfyUI's half-log-SNR form"},
    {SamplerKind::DpmPP2Mv2, "dpm++2mv2", 0, false, true, false, false, "sd.cpp sample_dpmpp_2m_v2"},
    {SamplerKind::DpmPP2MSde, "dpm++2m_sde", 1, true, true, false, false,
     "k-diffusion sample_dpmpp_2m_sde (midpoint); flow: ComfyUI's half-log-SNR form"},
    {SamplerKind::DpmPP2MSdeBt, "dpm++2m_sde_bt", 1, true, true, false, true,
     "dpm++2m_sde with sd.cpp's Brownian-tree noise"},
    {SamplerKind::Ipndm, "ipndm", 0, false, true, false, false, "ComfyUI sample_ipndm (zju-pi diff-solvers)"},
    {SamplerKind::IpndmV, "ipndm_v", 0, false, true, false, false, "ComfyUI sample_ipndm_v (zju-pi diff-solvers)"},
    {SamplerKind::Lms, "lms", 0, false, true, false, false, "k-diffusion sample_lms (order 4)"},
    {SamplerKind::Deis, "deis", 0, false, true, false, false,
     "diffusers DEISMultistepScheduler (solver_order 2, logrho, lower_order_final)"},
    {SamplerKind::UniPc, "uni_pc", 0, false, true, false, false,
     "diffusers UniPCMultistepScheduler (solver_order 2, bh2, predict_x0, lower_order_final)"},
    {SamplerKind::Ddim, "ddim", 0, true, false, false, false, "diffusers DDIMScheduler (leading spacing, steps_offset 1)"},
    {SamplerKind::Tcd, "tcd", 0, true, false, false, false, "diffusers TCDScheduler; sd.cpp sample_tcd"},
    {SamplerKind::ResMultistep, "res_multistep", 0, true, true, false, false, "ComfyUI res_multistep (arXiv:2308.02157)"},
    {SamplerKind::Res2s, "res_2s", 0, true, true, false, false, "sd.cpp sample_res_2s"},
    {SamplerKind::ErSde, "er_sde", 1, true, true, false, false, "ComfyUI sample_er_sde (arXiv:2309.06169)"},
    {SamplerKind::EulerCfgPP, "euler_cfg_pp", 0, false, true, true, false, "ComfyUI sample_euler_cfg_pp (arXiv:2406.08070)"},
    {SamplerKind::EulerACfgPP, "euler_a_cfg_pp", 1, true, true, true, false, "ComfyUI sample_euler_ancestral_cfg_pp"},
};

std::string all_sampler_names() {
    std::string r;
    for (const auto& i : kSamplers) r += (r.empty() ? "" : ", ") + std::string(i.name);
    return r;
}

}  // namespace

std::span<const SamplerInfo> sampler_infos() { return kSamplers; }

const SamplerInfo& sampler_info(SamplerKind kind) {
    for (const auto& i : kSamplers)
        if (i.kind == kind) return i;
    fail(ErrorKind::Internal, "unknown sampler kind {}", static_cast<int>(kind));
}

SamplerKind parse_sampler(std::string_view name) {
    const std::string s = ascii_lower(name);
    for (const auto& i : kSamplers)
        if (s == i.name) return i.kind;
    // names used by sd.cpp, A1111, ComfyUI or diffusers for methods easel does not have
    static constexpr std::string_view kKnown[] = {"euler_ge", "dpm++3m_sde", "dpm++2m_sde_heun", "dpm_fast", "dpm_adaptive",
                                                  "restart", "plms", "ddim_cfg_pp", "heunpp2", "seeds_2", "seeds_3",
                                                  "sa_solver", "dpm++2s_a_cfg_pp", "dpm++2m_cfg_pp", "gradient_estimation"};
    for (auto k : kKnown)
        if (s == k)
            fail(ErrorKind::Unsupported, "sampling method '{}' is not available in easel: use one of {}", name, all_sampler_names());
    fail(ErrorKind::InvalidInput, "unknown sampling method '{}': use one of {}", name, all_sampler_names());
}

const char* sampler_name(SamplerKind kind) {
    for (const auto& i : kSamplers)
        if (i.kind == kind) return i.name;
    return "?";
}

float default_eta(SamplerKind kind) { return sampler_info(kind).default_eta; }

// ---------------------------------------------------------------------------------------
// State serialisation.

namespace {

constexpr int64_t kStateVersion = 2;  // 2: history, history_count, tree_seed

template <typename T>
const std::vector<T>& get(const StateMap& m, const std::string& key) {
    auto it = m.find(key);
    if (it == m.end()) fail(ErrorKind::InvalidInput, "sampler state: missing entry '{}'", key);
    const auto* v = std::get_if<std::vector<T>>(&it->second);
    if (!v) fail(ErrorKind::InvalidInput, "sampler state: entry '{}' has the wrong element type", key);
    return *v;
}

template <typename T>
T get_scalar(const StateMap& m, const std::string& key) {
    const auto& v = get<T>(m, key);
    if (v.size() != 1) fail(ErrorKind::InvalidInput, "sampler state: entry '{}' must hold 1 value, has {}", key, v.size());
    return v[0];
}

}  // namespace

StateMap SamplerState::to_map() const {
    StateMap m;
    const std::string name = sampler_name(kind);
    m["version"] = std::vector<int64_t>{kStateVersion};
    m["sampler"] = std::vector<uint8_t>(name.begin(), name.end());
    m["flow"] = std::vector<int64_t>{flow ? 1 : 0};
    m["shape"] = shape;
    m["x"] = x;
    m["step"] = std::vector<int64_t>{step};
    m["sigmas"] = sigmas;
    m["timesteps"] = timesteps;
    m["eta"] = std::vector<float>{eta};
    m["s_noise"] = std::vector<float>{s_noise};
    m["rng"] = rng;
    m["old_denoised"] = old_denoised;
    std::vector<float> flat;
    for (const auto& h : history) flat.insert(flat.end(), h.begin(), h.end());
    m["history"] = std::move(flat);
    m["history_count"] = std::vector<int64_t>{static_cast<int64_t>(history.size())};
    m["tree_seed"] = tree_seed;
    return m;
}

SamplerState SamplerState::from_map(const StateMap& m) {
    const int64_t version = get_scalar<int64_t>(m, "version");
    if (version != 1 && version != kStateVersion)
        fail(ErrorKind::InvalidInput, "sampler state has format version {}, this easel reads versions 1 and {}", version,
             kStateVersion);
    SamplerState s;
    const auto& name = get<uint8_t>(m, "sampler");
    s.kind = parse_sampler(std::string(name.begin(), name.end()));
    s.flow = get_scalar<int64_t>(m, "flow") != 0;
    s.shape = get<int64_t>(m, "shape");
    s.x = get<float>(m, "x");
    s.step = get_scalar<int64_t>(m, "step");
    s.sigmas = get<float>(m, "sigmas");
    s.timesteps = get<float>(m, "timesteps");
    s.eta = get_scalar<float>(m, "eta");
    s.s_noise = get_scalar<float>(m, "s_noise");
    s.rng = get<int64_t>(m, "rng");
    s.old_denoised = get<float>(m, "old_denoised");
    if (version >= 2) {
        const auto& flat = get<float>(m, "history");
        const int64_t count = get_scalar<int64_t>(m, "history_count");
        if (count < 0 || count > 16)
            fail(ErrorKind::InvalidInput, "sampler state: history_count {} out of range 0..16", count);
        if (count > 0) {
            if (flat.size() % static_cast<size_t>(count) != 0)
                fail(ErrorKind::InvalidInput, "sampler state: history has {} values, not a multiple of {} buffers", flat.size(), count);
            const size_t each = flat.size() / static_cast<size_t>(count);
            for (int64_t k = 0; k < count; ++k)
                s.history.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(k * each),
                                       flat.begin() + static_cast<std::ptrdiff_t>((k + 1) * each));
        } else if (!flat.empty()) {
            fail(ErrorKind::InvalidInput, "sampler state: history has {} values but history_count is 0", flat.size());
        }
        s.tree_seed = get<int64_t>(m, "tree_seed");
    }
    return s;
}

// ---------------------------------------------------------------------------------------

Sampler::Sampler(SamplerKind kind, const Schedule& schedule, std::vector<int64_t> shape, std::vector<float> x_init,
                 Rng rng, bool flow, float eta, float s_noise)
    : rng_(std::move(rng)) {
    st_.kind = kind;
    st_.flow = flow;
    st_.shape = std::move(shape);
    st_.x = std::move(x_init);
    st_.sigmas = schedule.sigmas;
    st_.timesteps = schedule.timesteps;
    st_.eta = eta < 0 ? default_eta(kind) : eta;
    st_.s_noise = s_noise;
    validate();
    init_method_state();
    st_.rng = rng_.save();
    // Once per distinct message (a batch builds one sampler per image).
    if (auto w = zsnr_step_warning(kind, st_.sigmas, flow); !w.empty()) {
        static std::mutex mu;
        static std::string last;
        std::lock_guard<std::mutex> lock(mu);
        if (w != last) log::warn("{}", w);
        last = std::move(w);
    }
}

Sampler::Sampler(SamplerState state) : st_(std::move(state)), rng_(Rng::restore(st_.rng)) {
    validate();
    if (sampler_info(st_.kind).brownian && st_.tree_seed.size() != 1)
        fail(ErrorKind::InvalidInput, "sampler state of {} has no Brownian tree seed", sampler_name(st_.kind));
}

void Sampler::validate() const {
    const auto& s = st_;
    int64_t numel = 1;
    if (s.shape.empty() || s.shape.size() > 8) fail(ErrorKind::InvalidInput, "sampler: latent shape must have 1..8 dims");
    for (int64_t d : s.shape) {
        if (d <= 0 || d > (int64_t(1) << 31)) fail(ErrorKind::InvalidInput, "sampler: bad latent dimension {}", d);
        numel *= d;
        if (numel > (int64_t(1) << 34)) fail(ErrorKind::InvalidInput, "sampler: latent too large");
    }
    if (static_cast<int64_t>(s.x.size()) != numel)
        fail(ErrorKind::InvalidInput, "sampler: latent has {} values, its shape needs {}", s.x.size(), numel);
    const size_t n = s.timesteps.size();
    if (n < 1 || s.sigmas.size() != n + 1)
        fail(ErrorKind::InvalidInput, "sampler: schedule needs steps+1 sigmas for steps >= 1 timesteps (got {} and {})",
             s.sigmas.size(), n);
    for (size_t i = 0; i < s.sigmas.size(); ++i) {
        const float v = s.sigmas[i];
        if (!std::isfinite(v) || v < 0 || (i < n && v <= 0) || (s.flow && v > 1.0f))
            fail(ErrorKind::InvalidInput, "sampler: sigma {} = {} is out of range{}", i, v, s.flow ? " (flow: (0, 1])" : "");
        if (i > 0 && v > s.sigmas[i - 1])
            fail(ErrorKind::InvalidInput, "sampler: sigmas must not increase (sigma {} = {} > {})", i, v, s.sigmas[i - 1]);
    }
    for (float t : s.timesteps)
        if (!std::isfinite(t)) fail(ErrorKind::InvalidInput, "sampler: non-finite timestep");
    if (s.step < 0 || s.step > static_cast<int64_t>(n))
        fail(ErrorKind::InvalidInput, "sampler: step {} out of range 0..{}", s.step, n);
    if (!std::isfinite(s.eta) || s.eta < 0 || !std::isfinite(s.s_noise))
        fail(ErrorKind::InvalidInput, "sampler: eta ({}) must be >= 0 and s_noise ({}) finite", s.eta, s.s_noise);
    if (!s.old_denoised.empty() && s.old_denoised.size() != s.x.size())
        fail(ErrorKind::InvalidInput, "sampler: history has {} values, latent {}", s.old_denoised.size(), s.x.size());
    for (const auto& h : s.history)
        if (h.size() != s.x.size())
            fail(ErrorKind::InvalidInput, "sampler: a history buffer has {} values, latent {}", h.size(), s.x.size());
    const SamplerInfo& info = sampler_info(s.kind);
    if (s.flow && !info.flow) {
        std::string ok;
        for (const auto& i : sampler_infos())
            if (i.flow) ok += (ok.empty() ? "" : ", ") + std::string(i.name);
        fail(ErrorKind::InvalidInput, "sampling method {} has no flow form here: use one of {} with flow models",
             sampler_name(s.kind), ok);
    }
    if (s.tree_seed.size() > 1 || (!info.brownian && !s.tree_seed.empty()))
        fail(ErrorKind::InvalidInput, "sampler: tree_seed must be empty or hold one value for the Brownian-tree methods");
}

void Sampler::init_method_state() {
    if (!sampler_info(st_.kind).brownian || !st_.tree_seed.empty()) return;
    // sd.cpp sample_dpmpp_2m_sde_bt: the tree seed is the bits of two floats drawn from the sampler RNG.
    const auto draw = rng_.randn(2);
    uint64_t seed = 0;
    std::memcpy(&seed, draw.data(), sizeof(seed));
    st_.tree_seed = {static_cast<int64_t>(seed)};
}

std::vector<float> Sampler::noise() { return rng_.randn(static_cast<int64_t>(st_.x.size())); }

namespace {

// splitmix64's finaliser over v + salt (sd.cpp BrownianTreeNoiseSampler::mix64).
uint64_t mix64(uint64_t v, uint64_t salt) {
    uint64_t z = v + salt;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// The node draw: std_default seeded with the 64-bit node seed folded to the 32 bits MT19937 takes.
std::vector<float> node_randn(uint64_t seed, int64_t n) {
    Rng r(RngKind::StdDefault, (seed ^ (seed >> 32)) & 0xFFFFFFFFULL);
    return r.randn(n);
}

}  // namespace

std::vector<float> brownian_tree_w(uint64_t seed, double t_min, double t_max, int64_t numel, double t) {
    if (numel < 0) fail(ErrorKind::InvalidInput, "brownian_tree_w: numel {} < 0", numel);
    if (!(t_max > t_min) || !std::isfinite(t_min) || !std::isfinite(t_max))
        fail(ErrorKind::InvalidInput, "brownian_tree_w: bad interval [{}, {}]", t_min, t_max);
    const size_t n = static_cast<size_t>(numel);
    t = std::clamp(t, t_min, t_max);
    std::vector<float> wa(n, 0.0f), wc = node_randn(mix64(seed, 0xBF58476D1CE4E5B9ULL), numel);
    const float root_scale = static_cast<float>(std::sqrt(t_max - t_min));
    for (auto& v : wc) v *= root_scale;
    double a = t_min, c = t_max;
    uint64_t node = mix64(seed, 0x9E3779B97F4A7C15ULL);
    for (int depth = 24;; --depth) {
        if (depth <= 0 || c - a < 1e-9) {
            const float alpha = c > a ? static_cast<float>((t - a) / (c - a)) : 0.5f;
            std::vector<float> w(n);
            for (size_t k = 0; k < n; ++k) w[k] = (1.0f - alpha) * wa[k] + alpha * wc[k];
            return w;
        }
        const double m = 0.5 * (a + c);
        const float sd = static_cast<float>(std::sqrt((c - m) * (m - a) / (c - a)));
        const auto z = node_randn(node, numel);
        std::vector<float> wm(n);
        for (size_t k = 0; k < n; ++k) wm[k] = 0.5f * (wa[k] + wc[k]) + sd * z[k];
        if (t == m) return wm;
        if (t < m) {
            c = m;
            wc = std::move(wm);
            node = mix64(node, 1);
        } else {
            a = m;
            wa = std::move(wm);
            node = mix64(node, 2);
        }
    }
}

std::vector<float> Sampler::tree_w(double t) {
    for (const auto& [k, v] : tree_cache_)
        if (k == t) return v;
    double t_min = std::numeric_limits<double>::infinity(), t_max = 0;
    for (float v : st_.sigmas)
        if (v > 0) t_min = std::min(t_min, static_cast<double>(v)), t_max = std::max(t_max, static_cast<double>(v));
    auto w = brownian_tree_w(static_cast<uint64_t>(st_.tree_seed.at(0)), t_min, t_max, static_cast<int64_t>(st_.x.size()), t);
    if (tree_cache_.size() >= 4) tree_cache_.erase(tree_cache_.begin());
    tree_cache_.emplace_back(t, w);
    return w;
}

std::vector<float> Sampler::noise(double sigma, double sigma_next) {
    const size_t n = st_.x.size();
    if (noise_override_) {
        auto z = noise_override_(sigma, sigma_next);
        if (z.size() != n) fail(ErrorKind::InvalidInput, "sampler noise source gave {} values, the latent has {}", z.size(), n);
        return z;
    }
    if (!sampler_info(st_.kind).brownian) return noise();
    // sd.cpp BrownianTreeNoiseSampler::operator(): (w(hi) - w(lo)) / sqrt(|sigma_next - sigma|)
    double t_min = std::numeric_limits<double>::infinity(), t_max = 0;
    for (float v : st_.sigmas)
        if (v > 0) t_min = std::min(t_min, static_cast<double>(v)), t_max = std::max(t_max, static_cast<double>(v));
    if (!(t_max > t_min)) return std::vector<float>(n, 0.0f);  // one positive sigma: sd.cpp returns x unchanged
    const double lo = std::clamp(std::min(sigma, sigma_next), t_min, t_max), hi = std::clamp(std::max(sigma, sigma_next), t_min, t_max);
    const auto wl = tree_w(lo), wh = tree_w(hi);
    const float scale = 1.0f / std::sqrt(static_cast<float>(std::max(std::abs(sigma_next - sigma), 1e-12)));
    std::vector<float> z(n);
    for (size_t k = 0; k < n; ++k) z[k] = (wh[k] - wl[k]) * scale;
    return z;
}

void Sampler::step(Denoiser& d) {
    if (done()) fail(ErrorKind::InvalidInput, "sampler: all {} steps are done", steps());
    if (d.model_sampling().is_flow() != st_.flow)
        fail(ErrorKind::InvalidInput, "sampler state is in {} form but the denoiser's model is {}",
             st_.flow ? "flow" : "variance-exploding", d.model_sampling().is_flow() ? "a flow model" : "an eps/v model");
    switch (st_.kind) {
        case SamplerKind::Euler: case SamplerKind::EulerA: case SamplerKind::Heun: case SamplerKind::Dpm2:
        case SamplerKind::DpmPP2M: case SamplerKind::DpmPP2SA: case SamplerKind::DpmPP2S: case SamplerKind::Lcm:
        case SamplerKind::DdimTrailing: case SamplerKind::Ddim:
            break;
        default:
            step_more(d);
            ++st_.step;
            return;
    }
    const int64_t i = st_.step;
    const double s = st_.sigmas[i], sn = st_.sigmas[i + 1];
    const double t = st_.timesteps[i];
    auto& x = st_.x;
    const size_t n = x.size();
    den_.resize(n);
    d.denoise(x, s, t, den_);

    switch (st_.kind) {
        case SamplerKind::Euler: {
            for (size_t k = 0; k < n; ++k) {
                const double dk = (x[k] - static_cast<double>(den_[k])) / s;
                x[k] = static_cast<float>(x[k] + dk * (sn - s));
            }
            break;
        }
        case SamplerKind::EulerA: {
            if (!st_.flow) {
                const auto [down, up] = ancestral_step(s, sn, st_.eta);
                for (size_t k = 0; k < n; ++k) {
                    const double dk = (x[k] - static_cast<double>(den_[k])) / s;
                    x[k] = static_cast<float>(x[k] + dk * (down - s));
                }
                if (sn > 0) {
                    const auto z = noise(s, sn);
                    const double c = static_cast<double>(st_.s_noise) * up;
                    for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(x[k] + z[k] * c);
                }
            } else if (sn == 0) {
                x = den_;
            } else {
                // ComfyUI sample_euler_ancestral_RF
                const double eta = st_.eta;
                const double down = sn * (1.0 + (sn / s - 1.0) * eta);
                const double alpha_n = 1.0 - sn, alpha_down = 1.0 - down;
                const double renoise = std::sqrt(std::max(0.0, sn * sn - down * down * alpha_n * alpha_n / (alpha_down * alpha_down)));
                const double ratio = down / s;
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(ratio * x[k] + (1.0 - ratio) * den_[k]);
                if (eta > 0) {
                    const auto z = noise(s, sn);
                    const double a = alpha_n / alpha_down, c = static_cast<double>(st_.s_noise) * renoise;
                    for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(a * x[k] + z[k] * c);
                }
            }
            break;
        }
        case SamplerKind::Heun: {
            if (sn == 0) {
                for (size_t k = 0; k < n; ++k) {
                    const double dk = (x[k] - static_cast<double>(den_[k])) / s;
                    x[k] = static_cast<float>(x[k] + dk * (sn - s));
                }
                break;
            }
            tmp_.resize(n);  // x2
            for (size_t k = 0; k < n; ++k) {
                const double dk = (x[k] - static_cast<double>(den_[k])) / s;
                tmp_[k] = static_cast<float>(x[k] + dk * (sn - s));
            }
            tmp2_.resize(n);
            d.denoise(tmp_, sn, st_.timesteps.size() > static_cast<size_t>(i + 1) ? st_.timesteps[i + 1] : kNaN, tmp2_);
            for (size_t k = 0; k < n; ++k) {
                const double d1 = (x[k] - static_cast<double>(den_[k])) / s;
                const double d2 = (tmp_[k] - static_cast<double>(tmp2_[k])) / sn;
                x[k] = static_cast<float>(x[k] + (d1 + d2) / 2.0 * (sn - s));
            }
            break;
        }
        case SamplerKind::Dpm2: {
            if (sn == 0) {
                for (size_t k = 0; k < n; ++k) {
                    const double dk = (x[k] - static_cast<double>(den_[k])) / s;
                    x[k] = static_cast<float>(x[k] + dk * (sn - s));
                }
                break;
            }
            const double mid = std::exp(0.5 * (std::log(s) + std::log(sn)));
            tmp_.resize(n);
            for (size_t k = 0; k < n; ++k) {
                const double dk = (x[k] - static_cast<double>(den_[k])) / s;
                tmp_[k] = static_cast<float>(x[k] + dk * (mid - s));
            }
            tmp2_.resize(n);
            d.denoise(tmp_, mid, kNaN, tmp2_);
            for (size_t k = 0; k < n; ++k) {
                const double d2 = (tmp_[k] - static_cast<double>(tmp2_[k])) / mid;
                x[k] = static_cast<float>(x[k] + d2 * (sn - s));
            }
            break;
        }
        case SamplerKind::DpmPP2M: {
            // x_next = (sn/s) x - alpha_n expm1(-h) D', lambda = log(alpha/sigma),
            // alpha = 1 (VE) or 1 - sigma (flow); D' = (1 + 1/(2r)) D - 1/(2r) D_prev, r = h_last/h.
            auto lambda = [&](double sig) { return std::log(st_.flow ? 1.0 - sig : 1.0) - std::log(sig); };
            if (sn == 0) {
                x = den_;
            } else {
                const double alpha_n = st_.flow ? 1.0 - sn : 1.0;
                const double h = lambda(sn) - lambda(s);
                const double ratio = sn / s, coef = -alpha_n * std::expm1(-h);
                double c_cur = 1.0, c_old = 0.0;
                if (!st_.old_denoised.empty() && i > 0) {
                    const double h_last = lambda(s) - lambda(st_.sigmas[i - 1]);
                    if (std::isfinite(h_last) && h_last > 0) {
                        const double r = h_last / h;
                        c_cur = 1.0 + 1.0 / (2.0 * r);
                        c_old = -1.0 / (2.0 * r);
                    }
                }
                for (size_t k = 0; k < n; ++k) {
                    const double dd = c_cur * den_[k] + (c_old != 0.0 ? c_old * st_.old_denoised[k] : 0.0);
                    x[k] = static_cast<float>(ratio * x[k] + coef * dd);
                }
            }
            st_.old_denoised = den_;
            break;
        }
        case SamplerKind::DpmPP2SA:
        case SamplerKind::DpmPP2S: {
            const auto [down, up] = ancestral_step(s, sn, st_.eta);
            if (down == 0) {
                for (size_t k = 0; k < n; ++k) {
                    const double dk = (x[k] - static_cast<double>(den_[k])) / s;
                    x[k] = static_cast<float>(x[k] + dk * (down - s));
                }
            } else {
                // t = -log sigma; s_mid = t + h/2; sigma_fn(t) = exp(-t)
                const double tt = -std::log(s), tn = -std::log(down);
                const double h = tn - tt;
                const double smid = std::exp(-(tt + 0.5 * h));
                tmp_.resize(n);
                const double r1 = smid / s, c1 = -std::expm1(-0.5 * h);
                for (size_t k = 0; k < n; ++k) tmp_[k] = static_cast<float>(r1 * x[k] + c1 * den_[k]);
                tmp2_.resize(n);
                d.denoise(tmp_, smid, kNaN, tmp2_);
                const double r2 = down / s, c2 = -std::expm1(-h);
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(r2 * x[k] + c2 * tmp2_[k]);
            }
            if (sn > 0) {
                const auto z = noise(s, sn);
                const double c = static_cast<double>(st_.s_noise) * up;
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(x[k] + z[k] * c);
            }
            break;
        }
        case SamplerKind::Lcm: {
            x = den_;
            if (sn > 0) {
                const auto z = noise(s, sn);
                for (size_t k = 0; k < n; ++k)
                    x[k] = st_.flow ? static_cast<float>((1.0 - sn) * x[k] + sn * z[k])
                                    : static_cast<float>(x[k] + sn * z[k]);
            }
            break;
        }
        case SamplerKind::DdimTrailing:
        case SamplerKind::Ddim: {
            // VE form of DDIM: x = D + sqrt(sn^2 - su^2) eps + su z, eps = (x - D)/s,
            // su = eta sqrt(sn^2 (s^2 - sn^2)/s^2) (= DDIM's sigma_t / sqrt(alpha_prev)).
            const double su = (s > sn) ? st_.eta * std::sqrt(sn * sn * (s * s - sn * sn) / (s * s)) : 0.0;
            const double dir = std::sqrt(std::max(0.0, sn * sn - su * su));
            for (size_t k = 0; k < n; ++k) {
                const double eps = (x[k] - static_cast<double>(den_[k])) / s;
                x[k] = static_cast<float>(den_[k] + dir * eps);
            }
            if (st_.eta > 0) {
                const auto z = noise(s, sn);
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(x[k] + su * z[k]);
            }
            break;
        }
        default:
            break;  // the methods of step_more
    }
    ++st_.step;
}

void Sampler::run(Denoiser& d, const std::function<void(const SamplerState&)>& after_step) {
    while (!done()) {
        step(d);
        if (after_step) after_step(state());
    }
}

SamplerState Sampler::state() const {
    SamplerState s = st_;
    s.rng = rng_.save();
    return s;
}

std::vector<float> Sampler::result() const {
    if ((st_.kind == SamplerKind::DdimTrailing || st_.kind == SamplerKind::Ddim) && done()) {
        const double sl = st_.sigmas.back();
        const double c = 1.0 / std::sqrt(sl * sl + 1.0);
        std::vector<float> out(st_.x.size());
        for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(st_.x[k] * c);
        return out;
    }
    return st_.x;
}

std::string zsnr_step_warning(SamplerKind kind, std::span<const float> sigmas, bool flow) {
    const bool heun_like = kind == SamplerKind::Heun || kind == SamplerKind::Dpm2;
    if ((!heun_like && kind != SamplerKind::DpmPP2M) || flow || sigmas.size() < 2 || !(sigmas[0] >= 1000.0f)) return {};
    const double limit = heun_like ? kZsnrMaxLogStepHeun : kZsnrMaxLogStep;
    double worst = 0.0, at = 0.0;
    for (size_t i = 0; i + 1 < sigmas.size(); ++i) {
        const double s = sigmas[i], sn = sigmas[i + 1];
        // heun's corrector evaluates D at sn: a step landing in the band counts even from above it
        // (linspace's first step 4096 -> 38, corrector weight (s/sn - 1)/2 = 53); dpm2's midpoint and
        // dpm++2m's history damp that (r = h_last/h is large after a long first step).
        const bool in_band = kind == SamplerKind::Heun ? (s >= 3.0 && sn <= 100.0) : (s >= 3.0 && s <= 100.0);
        if (!(sn > 0.0) || !in_band) continue;
        const double h = std::log(s / sn);
        if (h > worst) worst = h, at = s;
    }
    if (worst <= limit) return {};
    return fmt::format("{} on this zero-terminal-SNR schedule (from sigma {:.0f}) takes a step of {:.2f} in log sigma at sigma "
                       "{:.4g} (measured safe: <= {}): the image can end in noise, as it does in diffusers; use more steps{}",
                       sampler_name(kind), sigmas[0], worst, at, limit,
                       heun_like ? " or --sampling-method euler" : ", --scheduler discrete or --sampling-method euler");
}

std::vector<float> noise_latent(std::span<const float> x0, std::span<const float> noise, double sigma, bool flow) {
    if (!x0.empty() && x0.size() != noise.size())
        fail(ErrorKind::InvalidInput, "noise_latent: latent has {} values, noise {}", x0.size(), noise.size());
    if (!std::isfinite(sigma) || sigma < 0 || (flow && sigma > 1))
        fail(ErrorKind::InvalidInput, "noise_latent: sigma {} out of range", sigma);
    std::vector<float> out(noise.size());
    for (size_t k = 0; k < out.size(); ++k) {
        const double a = x0.empty() ? 0.0 : x0[k];
        out[k] = flow ? static_cast<float>((1.0 - sigma) * a + sigma * noise[k]) : static_cast<float>(a + sigma * noise[k]);
    }
    return out;
}

void inpaint_blend(std::span<float> x, std::span<const float> known, std::span<const float> mask,
                   std::span<const int64_t> shape) {
    if (known.size() != x.size())
        fail(ErrorKind::InvalidInput, "inpaint_blend: known latent has {} values, latent {}", known.size(), x.size());
    const size_t n = x.size();
    if (mask.size() == n) {
        for (size_t k = 0; k < n; ++k) x[k] = mask[k] * x[k] + (1.0f - mask[k]) * known[k];
        return;
    }
    if (shape.size() < 2) fail(ErrorKind::InvalidInput, "inpaint_blend: a broadcast mask needs the latent shape [N, C, ...]");
    size_t numel = 1;
    for (int64_t d : shape) {
        if (d <= 0) fail(ErrorKind::InvalidInput, "inpaint_blend: bad latent dimension {}", d);
        numel *= static_cast<size_t>(d);
    }
    const size_t batch = static_cast<size_t>(shape[0]), channels = static_cast<size_t>(shape[1]);
    const size_t plane = numel / (batch * channels);
    if (numel != n || mask.size() != batch * plane)
        fail(ErrorKind::InvalidInput, "inpaint_blend: mask has {} values; need {} (full) or {} ([N, 1, ...])", mask.size(),
             n, batch * plane);
    for (size_t b = 0; b < batch; ++b)
        for (size_t c = 0; c < channels; ++c) {
            const size_t off = (b * channels + c) * plane;
            const float* m = mask.data() + b * plane;
            for (size_t p = 0; p < plane; ++p) x[off + p] = m[p] * x[off + p] + (1.0f - m[p]) * known[off + p];
        }
}

void inpaint_blend(std::span<float> x, std::span<const float> known, std::span<const float> mask, int64_t channels) {
    if (channels < 1) fail(ErrorKind::InvalidInput, "inpaint_blend: channels must be >= 1, got {}", channels);
    const int64_t shape[3] = {1, channels, static_cast<int64_t>(mask.size())};
    inpaint_blend(x, known, mask, std::span<const int64_t>(shape, 3));
}

}  // namespace easel::sampling
