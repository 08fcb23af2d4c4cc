// Every sampler and scheduler against its reference (tests/data/reference/samplers/, made by
// tools/reference/sampler_refs.py: k-diffusion's sampling functions, diffusers' schedulers, and
// transcriptions of ComfyUI / sd.cpp where only those define a method), per step, on the same
// model function and the same noise draws:
//   * analytic models (the same closed form here and in the script) as eps, v and flow models;
//   * the demo model (v-prediction, zero terminal SNR) and the tiny Z-Image transformer, replayed:
//     evaluation k returns the network outputs the reference recorded at its evaluation k.
// Noise: the reference's draws in order through Sampler::set_noise_source, each request's sigma pair
// equal to the recorded one (also the zero-amplitude draws k-diffusion makes at eta 0: easel makes
// the same calls), none left over. Latents are compared in easel's form (x = x0 + sigma*noise for
// eps/v models, diffusers' VP samples divided by alpha); the error of step i is
// |x - x_ref| / max(1, S_i), S_i the
// largest |x_ref| of the states the step combines (x_i, and for a method that carries k - 1 earlier
// steps x_{i-k+1} .. x_{i-1}, history_window): easel keeps the latent in float32, and the rounding
// of those states (at sigma 4096 on the demo model: 2.4e-4) is what it carries into the step.
//
// Cost: 104 schedules and 142 sampler cases of 6-15 steps on 64-256 element latents, well under
// a second.
#include "core/error.h"
#include "io/weight_index.h"
#include "sampling/sampler.h"
#include "sampling/schedule.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

using namespace easel;
using namespace easel::sampling;

namespace {

// The counts of the committed reference (tests/data/reference/reference_notes.md): every entry of
// the file is run, none skipped; a regenerated file with other counts must update these.
constexpr int kSchedules = 104;
constexpr int kSamplerCases = 142;

// Tolerances (see the file comment for the error measure).
//  * Schedules: relative 1e-6 of the sigma (absolute below 1e-3), except where the reference's own
//    float32 arithmetic is worse conditioned (easel computes in double and rounds once, as diffusers'
//    numpy code does):
//      karras: k-diffusion computes (max^(1/rho) + r (min^(1/rho) - max^(1/rho)))^rho in float32
//        (torch): the rounding of the base (a few ulps over 3 operations) times rho: rho * 2^-21;
//      kl_optimal: ComfyUI computes tan(w atan(min) + (1 - w) atan(max)) in float32: the angle's
//        rounding (about 2 ulps of a value < pi/2: 2^-22) times d sigma/d angle = sigma^2 + 1
//        (on the zero-terminal-SNR table the first sigma comes out 4096.73 for 4096).
//  * Samplers: 5e-6 for every reference (k-diffusion and the transcriptions run in float64 from
//    float32 starts, diffusers in float32; easel's state is float32: about 8-15 roundings a step).
//    The exception is diffusers' DEISMultistepScheduler started from a nearly pure-noise sample
//    (VP alpha_s < 1e-3: sigma 0.99967 on the flow models, alpha 3.3e-4; sigma 4096 on the demo
//    model's zero-terminal-SNR table, alpha 2.4e-4). Its first step is in eps form,
//    x_t = (alpha_t/alpha_s) x - sigma_t (e^h - 1) eps, two terms 137 (flow) and 297 (zero terminal
//    SNR) times larger than the result, in float32 with h from float32 log-SNRs (|lambda_s| about 8):
//    a float32 emulation of the flow model's step reproduces the reference to the bit, 1.65e-4 from
//    the exact step (analytic flow model, max |x| 2.7; demo model 8.9e-4 from a latent of max |x| 44
//    after the step). easel takes the exact step (SamplingReference.DeisFirstStepIsExact checks it
//    for every DEIS case) and the reference keeps its error to the end: 1e-4 for those cases.
constexpr double kScheduleTol = 1e-6;
constexpr double kSamplerTol = 5e-6;
constexpr double kDeisLowAlphaTol = 1e-4;

// The tolerance of one scheduled sigma (see above).
double schedule_tol(const std::string& kind, double want) {
    const double rel = kScheduleTol * std::max(1e-3, std::abs(want));
    if (kind == "karras") return std::max(rel, 7.0 * std::ldexp(1.0, -21) * std::abs(want));
    if (kind == "kl_optimal") return rel + (want * want + 1.0) * std::ldexp(1.0, -22);
    return rel;
}

// The number of states a step combines (see the file comment): 1 for one-step methods; 2 for those
// that carry the previous step (dpm++2m, dpm++2mv2, dpm++2m_sde(_bt), res_multistep, deis, uni_pc);
// 3 for er_sde (its third stage); 4 for the 4th-order multistep methods (lms, ipndm, ipndm_v).
int history_window(SamplerKind k) {
    switch (k) {
        case SamplerKind::Lms:
        case SamplerKind::Ipndm:
        case SamplerKind::IpndmV: return 4;
        case SamplerKind::ErSde: return 3;
        case SamplerKind::DpmPP2M:
        case SamplerKind::DpmPP2Mv2:
        case SamplerKind::DpmPP2MSde:
        case SamplerKind::DpmPP2MSdeBt:
        case SamplerKind::ResMultistep:
        case SamplerKind::Deis:
        case SamplerKind::UniPc: return 2;
        default: return 1;
    }
}

const std::string kDir = std::string(EASEL_TEST_DATA) + "/reference/samplers/";

const nlohmann::json& fixture() {
    static const nlohmann::json j = [] {
        std::ifstream f(kDir + "samplers.json");
        if (!f) throw std::runtime_error("missing " + kDir + "samplers.json (tools/reference/sampler_refs.py makes it)");
        return nlohmann::json::parse(f);
    }();
    return j;
}

const io::WeightIndex& tensors() {
    static const io::WeightIndex idx = io::WeightIndex::open(kDir + "samplers.safetensors");
    return idx;
}

std::vector<float> tensor(const std::string& name) {
    const auto* t = tensors().find(name);
    if (!t) throw std::runtime_error("fixture tensor missing: " + name);
    return tensors().read_f32(*t);
}

// The script's models: DiscreteMS("eps"), DiscreteMS("v"), DiscreteMS("v", zsnr=True), FlowMS(3.0).
ModelSampling model_sampling(const std::string& model) {
    if (model == "eps" || model == "sd15") return ModelSampling::discrete(Prediction::Eps);
    if (model == "v") return ModelSampling::discrete(Prediction::V);
    if (model == "demo" || model == "zsnr") return ModelSampling::discrete(Prediction::V, 0.00085, 0.012, 1000, true);
    if (model == "flow" || model == "flow3" || model == "zimage") return ModelSampling::flow(3.0);
    throw std::runtime_error("unknown model " + model);
}

// A DEIS case started at VP alpha < 1e-3 (see kDeisLowAlphaTol).
bool is_deis_low_alpha(const nlohmann::json& c) {
    if (c.at("sampler") != "deis") return false;
    const double s0 = c.at("sigmas")[0].get<double>();
    const bool flow = model_sampling(c.at("model")).is_flow();
    return (flow ? 1.0 - s0 : 1.0 / std::sqrt(s0 * s0 + 1.0)) < 1e-3;
}

// The script's analytic model (AnalyticNet): i the flat element index, t the network timestep.
void analytic(std::span<const float> x_in, double t, Branch b, std::span<float> out) {
    for (size_t i = 0; i < x_in.size(); ++i) {
        const double x = x_in[i], k = static_cast<double>(i);
        out[i] = b == Branch::Cond ? static_cast<float>(0.5 * std::tanh(x) + 0.1 * t / 1000.0 + 0.05 * std::sin(k))
                                   : static_cast<float>(0.4 * std::tanh(x) - 0.05 * t / 1000.0 + 0.03 * std::cos(k));
    }
}

bool near_rel(double a, double b, double rel) { return std::abs(a - b) <= rel * std::max(1.0, std::abs(b)); }

struct Result {
    double max_err = 0;
    std::string where;
};

Result run_case(const nlohmann::json& c) {
    const std::string name = c.at("name");
    const auto ms = model_sampling(c.at("model"));
    const SamplerKind kind = parse_sampler(c.at("sampler").get<std::string>());
    const double eta = c.at("eta").get<double>();
    const bool replay = c.at("replay").get<bool>();
    Schedule sched;
    sched.sigmas = c.at("sigmas").get<std::vector<float>>();
    sched.timesteps = c.at("timesteps").get<std::vector<float>>();
    const auto shape = c.at("shape").get<std::vector<int64_t>>();
    const auto x_init = tensor(name + ".x_init");
    const auto x_steps = tensor(name + ".x_steps");
    const size_t n = x_init.size();
    const int steps = sched.steps();
    Result r;
    if (x_steps.size() != static_cast<size_t>(steps) * n) {
        ADD_FAILURE() << name << ": x_steps has " << x_steps.size() << " values, want " << steps << " x " << n;
        r.max_err = INFINITY;
        return r;
    }
    Sampler s(kind, sched, shape, x_init, Rng(RngKind::Cpu, 0), ms.is_flow(), static_cast<float>(eta));

    // the reference's noise draws, in order, each checked against its sigma pair
    const auto& calls = c.at("noise_calls");
    std::vector<float> noise;
    if (!calls.empty()) noise = tensor(name + ".noise");
    if (noise.size() != calls.size() * n) {
        ADD_FAILURE() << name << ": " << noise.size() << " noise values for " << calls.size() << " draws";
        r.max_err = INFINITY;
        return r;
    }
    size_t next_noise = 0;
    s.set_noise_source([&](double a, double b) {
        const size_t k = next_noise++;
        if (k >= calls.size()) {
            ADD_FAILURE() << name << ": easel asks for noise draw " << k << " (" << a << " -> " << b << "), the reference made "
                          << calls.size();
            return std::vector<float>(n, 0.0f);
        }
        const double ra = calls[k][0].get<double>(), rb = calls[k][1].get<double>();
        if (!near_rel(a, ra, 1e-6) || !near_rel(b, rb, 1e-6))
            ADD_FAILURE() << name << ": noise draw " << k << " for (" << a << " -> " << b << "), the reference's was for (" << ra
                          << " -> " << rb << ")";
        return std::vector<float>(noise.begin() + static_cast<std::ptrdiff_t>(k * n),
                                  noise.begin() + static_cast<std::ptrdiff_t>((k + 1) * n));
    });

    // the model: analytic or replayed; each evaluation's timestep is checked against the reference's
    const auto& evals = c.at("evals");
    std::vector<float> fc, fu;
    if (replay) {
        fc = tensor(name + ".f_cond");
        fu = tensor(name + ".f_uncond");
        if (fc.size() != evals.size() * n || fu.size() != evals.size() * n) {
            ADD_FAILURE() << name << ": recorded outputs do not match " << evals.size() << " evaluations";
            r.max_err = INFINITY;
            return r;
        }
    }
    size_t n_cond = 0, n_uncond = 0;
    ModelFn model = [&](std::span<const float> x_in, double t, Branch b, std::span<float> out) {
        size_t& e = b == Branch::Cond ? n_cond : n_uncond;
        if (b == Branch::Uncond && n_uncond + 1 != n_cond) ADD_FAILURE() << name << ": unconditional pass without its conditional one";
        if (e >= evals.size()) {
            ADD_FAILURE() << name << ": more evaluations than the reference's " << evals.size();
            std::fill(out.begin(), out.end(), 0.0f);
            ++e;
            return;
        }
        const double want_t = evals[e][1].get<double>();
        if (b == Branch::Cond && !near_rel(t, want_t, 2e-6 * 1000))
            ADD_FAILURE() << name << " evaluation " << e << ": timestep " << t << ", reference " << want_t << " (sigma "
                          << evals[e][0].get<double>() << ")";
        if (replay) {
            const auto& src = b == Branch::Cond ? fc : fu;
            std::copy(src.begin() + static_cast<std::ptrdiff_t>(e * n), src.begin() + static_cast<std::ptrdiff_t>((e + 1) * n), out.begin());
        } else {
            analytic(x_in, t, b, out);
        }
        ++e;
    };
    Denoiser d(ms, model, c.at("cfg_scale").get<float>());

    // |x_ref| max of each state: states[0] = x_init, states[i + 1] = after step i
    std::vector<double> states(static_cast<size_t>(steps) + 1, 0.0);
    for (float v : x_init) states[0] = std::max(states[0], std::abs(double(v)));
    for (size_t i = 0; i < static_cast<size_t>(steps); ++i)
        for (size_t k = 0; k < n; ++k) states[i + 1] = std::max(states[i + 1], std::abs(double(x_steps[i * n + k])));
    const int window = history_window(kind);
    for (int i = 0; i < steps; ++i) {
        s.step(d);
        const auto& x = s.state().x;
        double scale = 1.0;
        for (int j = std::max(0, i - window + 1); j <= i; ++j) scale = std::max(scale, states[static_cast<size_t>(j)]);
        for (size_t k = 0; k < n; ++k) {
            const double ref = x_steps[static_cast<size_t>(i) * n + k];
            const double e = std::isfinite(x[k]) ? std::abs(x[k] - ref) / scale : INFINITY;
            if (!(e <= r.max_err)) r.max_err = e, r.where = "step " + std::to_string(i) + " element " + std::to_string(k);
        }
    }
    EXPECT_EQ(n_cond, evals.size()) << name << ": evaluations (reference " << evals.size() << ")";
    EXPECT_EQ(n_uncond, evals.size()) << name << ": unconditional passes (CFG " << c.at("cfg_scale") << ")";
    EXPECT_EQ(next_noise, calls.size()) << name << ": noise draws (reference " << calls.size() << ")";
    return r;
}

}  // namespace

TEST(SamplingReference, SchedulesMatch) {
    int count = 0;
    double worst_all = 0;
    std::map<std::string, double> worst_kind;
    for (const auto& c : fixture().at("schedules")) {
        const std::string name = c.at("name"), kind = c.at("scheduler");
        const std::string ref = c.at("reference");
        ++count;
        const auto ms = model_sampling(c.at("model"));
        const int n = c.at("steps");
        Schedule s;
        try {
            s = kind == "ddim" ? ddim_schedule(ms, n, Spacing::Leading) : make_schedule(ms, parse_scheduler(kind), n);
        } catch (const std::exception& e) {
            ADD_FAILURE() << name << ": easel refuses it (" << e.what() << "), reference " << ref;
            continue;
        }
        const auto want = c.at("sigmas").get<std::vector<double>>();
        if (s.sigmas.size() != want.size()) {
            ADD_FAILURE() << name << ": " << s.sigmas.size() << " sigmas, reference (" << ref << ") " << want.size();
            continue;
        }
        double worst = 0;  // relative (absolute below 1e-3)
        for (size_t i = 0; i < want.size(); ++i) {
            const double diff = std::abs(s.sigmas[i] - want[i]);
            worst = std::max(worst, diff / std::max(1e-3, std::abs(want[i])));
            EXPECT_LE(diff, schedule_tol(kind, want[i])) << name << " sigma " << i << ": " << s.sigmas[i] << ", reference "
                                                         << want[i] << " (" << ref << ")";
        }
        worst_all = std::max(worst_all, worst);
        worst_kind[kind] = std::max(worst_kind[kind], worst);
        if (c.contains("timesteps")) {
            const auto wt = c.at("timesteps").get<std::vector<double>>();
            ASSERT_EQ(s.timesteps.size(), wt.size()) << name;
            for (size_t i = 0; i < wt.size(); ++i) EXPECT_EQ(s.timesteps[i], wt[i]) << name << " timestep " << i;
        }
    }
    for (const auto& [k, w] : worst_kind) std::printf("[ reference ] schedule %-12s max rel error %.3g\n", k.c_str(), w);
    std::printf("[ reference ] %d schedules, max rel error %.3g\n", count, worst_all);
    EXPECT_EQ(count, kSchedules) << "schedules in samplers.json";
}

TEST(SamplingReference, SamplersMatchPerStep) {
    int count = 0;
    std::map<std::string, int> seen;
    std::map<std::string, std::pair<double, double>> worst;  // sampler -> (analytic, replayed network)
    for (const auto& c : fixture().at("samplers")) {
        const std::string name = c.at("name"), sampler = c.at("sampler"), ref = c.at("reference");
        ++count;
        Result r;
        try {
            r = run_case(c);
        } catch (const std::exception& e) {
            ADD_FAILURE() << name << ": easel fails (" << e.what() << "), reference " << ref;
            continue;
        }
        const double tol = is_deis_low_alpha(c) ? kDeisLowAlphaTol : kSamplerTol;
        std::printf("[ reference ] %-26s max error %.3g (%s) vs %s\n", name.c_str(), r.max_err, r.where.c_str(), ref.c_str());
        EXPECT_LE(r.max_err, tol) << name << " at " << r.where << " vs " << ref;
        auto& w = worst[sampler + (is_deis_low_alpha(c) ? " (alpha<1e-3)" : "")];
        (c.at("replay").get<bool>() ? w.second : w.first) = std::max(c.at("replay").get<bool>() ? w.second : w.first, r.max_err);
        ++seen[sampler];
    }
    for (const auto& [k, w] : worst)
        std::printf("[ reference ] %-20s max error analytic %.3g, networks %.3g\n", k.c_str(), w.first, w.second);
    EXPECT_EQ(count, kSamplerCases) << "sampler cases in samplers.json";
    // every method is covered
    for (const auto& i : sampler_infos()) EXPECT_GT(seen[i.name], 0) << i.name << " has no reference case";
}

// diffusers' DEIS from a nearly pure-noise sample is float32-limited in the reference (see
// kDeisLowAlphaTol). Here easel's first step of every DEIS case against the exact one in double:
// first-order DEIS x_t = (alpha_t/alpha_s) x - sigma_t (e^h - 1) eps in easel's form is
// (sigma_t/sigma_s) x + (alpha_t - sigma_t alpha_s/sigma_s) D (alpha = 1 - sigma on flow models, 1
// in the variance-exploding form, where it is Euler's step), D easel's denoiser output (float32) on
// the analytic model or the recorded first evaluation.
TEST(SamplingReference, DeisFirstStepIsExact) {
    int count = 0, low_alpha = 0;
    for (const auto& c : fixture().at("samplers")) {
        if (c.at("sampler") != "deis") continue;
        ++count;
        low_alpha += is_deis_low_alpha(c);
        const std::string name = c.at("name");
        const auto ms = model_sampling(c.at("model"));
        Schedule sched;
        sched.sigmas = c.at("sigmas").get<std::vector<float>>();
        sched.timesteps = c.at("timesteps").get<std::vector<float>>();
        const auto x_init = tensor(name + ".x_init");
        const size_t n = x_init.size();
        std::vector<float> fc(n), fu(n);
        if (c.at("replay").get<bool>()) {
            const auto rc = tensor(name + ".f_cond"), ru = tensor(name + ".f_uncond");
            std::copy(rc.begin(), rc.begin() + static_cast<std::ptrdiff_t>(n), fc.begin());
            std::copy(ru.begin(), ru.begin() + static_cast<std::ptrdiff_t>(n), fu.begin());
        }
        ModelFn model = [&](std::span<const float> x_in, double t, Branch b, std::span<float> out) {
            if (!c.at("replay").get<bool>()) return analytic(x_in, t, b, out);
            const auto& src = b == Branch::Cond ? fc : fu;
            std::copy(src.begin(), src.end(), out.begin());
        };
        Denoiser d(ms, model, c.at("cfg_scale").get<float>());
        const double ss = sched.sigmas[0], sn = sched.sigmas[1];
        ASSERT_FALSE(ms.is_flow() && ss > 1.0 - 1e-6) << name << ": the 1 - 1e-6 substitution is not part of this check";
        std::vector<float> D(n);
        d.denoise(x_init, ss, sched.timesteps[0], D);
        Sampler s(SamplerKind::Deis, sched, c.at("shape").get<std::vector<int64_t>>(), x_init, Rng(RngKind::Cpu, 0), ms.is_flow(), 0.0f);
        s.step(d);
        const double a_s = ms.is_flow() ? 1.0 - ss : 1.0, a_t = ms.is_flow() ? 1.0 - sn : 1.0;
        double worst = 0, xmax = 1;
        for (size_t k = 0; k < n; ++k) {
            const double want = (sn / ss) * x_init[k] + (a_t - sn * a_s / ss) * static_cast<double>(D[k]);
            worst = std::max(worst, std::abs(s.state().x[k] - want));
            xmax = std::max(xmax, std::abs(want));
        }
        std::printf("[ reference ] %-16s first step: max |x - exact| %.3g (max |x| %.3g)\n", name.c_str(), worst, xmax);
        EXPECT_LE(worst / xmax, 5e-7) << name;
    }
    EXPECT_EQ(count, 9) << "DEIS cases";
    EXPECT_EQ(low_alpha, 3) << "flow.deis, demo.deis, zimage.deis";
}
