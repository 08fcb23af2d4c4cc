// Zero-terminal-SNR schedules (Lin et al. 2023, arXiv:2305.08891): ModelSampling::discrete with
// zero_terminal_snr against diffusers' EulerDiscreteScheduler(rescale_betas_zero_snr=True,
// prediction_type="v_prediction") (tests/data/reference/schedulers_zsnr.json, see
// schedulers_zsnr.md): the training table, and for linspace / trailing / leading spacing the
// 1-, 4- and 20-step timesteps, sigmas and init_noise_sigma. Then every sampler on every
// scheduler starting at sigma_max = 4096: with the exact denoiser of a point-mass data set
// (D = c) each must end at c (DDIM trailing at its closed form), with no NaN or inf.
#include "core/error.h"
#include "sampling/sampler.h"
#include "sampling/schedule.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string>

using namespace easel;
using namespace easel::sampling;

namespace {

const nlohmann::json& fixture() {
    static const nlohmann::json j = [] {
        std::ifstream f(std::string(EASEL_TEST_DATA) + "/reference/schedulers_zsnr.json");
        if (!f) throw std::runtime_error("missing tests/data/reference/schedulers_zsnr.json");
        return nlohmann::json::parse(f);
    }();
    return j;
}

ModelSampling zsnr() { return ModelSampling::discrete(Prediction::V, 0.00085, 0.012, 1000, true); }

}  // namespace

TEST(SamplingZsnrSchedule, TrainingTableMatchesDiffusers) {
    const auto ms = zsnr();
    EXPECT_TRUE(ms.zero_terminal_snr());
    EXPECT_FALSE(ModelSampling::discrete(Prediction::V).zero_terminal_snr());
    // diffusers' scheduler.sigmas before set_timesteps: the table descending, then 0.
    const auto want = fixture()["spacings"]["linspace"]["train_sigmas"].get<std::vector<double>>();
    ASSERT_EQ(want.size(), 1001u);
    ASSERT_EQ(ms.sigmas().size(), 1000u);
    double err = 0, rel = 0;
    for (size_t i = 0; i < 1000; ++i) {
        const double w = want[999 - i], g = ms.sigmas()[i];
        err = std::max(err, std::abs(g - w));
        rel = std::max(rel, std::abs(g - w) / w);
    }
    std::printf("[ zsnr ] training sigmas: max |d| %.3g, max rel %.3g\n", err, rel);
    EXPECT_LE(rel, 1e-6);
    EXPECT_FLOAT_EQ(ms.sigma_max(), 4095.999755859375f);  // sqrt((1 - 2^-24) / 2^-24) in float32
    EXPECT_EQ(ms.sigma_max(), static_cast<float>(want[0]));
    EXPECT_EQ(ms.sigma_min(), static_cast<float>(want[999]));
    // The alphas_cumprod behind it: 1 / (sigma^2 + 1).
    const auto ac = fixture()["spacings"]["linspace"]["alphas_cumprod"].get<std::vector<double>>();
    EXPECT_DOUBLE_EQ(ac[999], std::ldexp(1.0, -24));
    for (int i : {0, 1, 500, 998})
        EXPECT_NEAR(1.0 / (1.0 + double(ms.sigmas()[i]) * ms.sigmas()[i]), ac[i], 2e-6 * ac[i]) << i;
    // Without the rescale the first sigma is unchanged (rescaling keeps alphas_cumprod[0]) and
    // the last is SD's 14.6.
    const auto plain = ModelSampling::discrete(Prediction::V);
    EXPECT_NEAR(plain.sigma_min(), ms.sigma_min(), 1e-6);
    EXPECT_NEAR(plain.sigma_max(), 14.6146, 1e-3);
}

TEST(SamplingZsnrSchedule, EulerDiscreteSpacingsMatchDiffusers) {
    const auto ms = zsnr();
    double es = 0, et = 0, ei = 0;
    int cases = 0;
    for (const auto& [name, spacing] : {std::pair{"linspace", Spacing::Linspace}, std::pair{"trailing", Spacing::Trailing},
                                        std::pair{"leading", Spacing::Leading}}) {
        ScheduleOptions so;
        so.spacing = spacing;
        so.steps_offset = 1;
        for (int n : {1, 4, 20}) {
            const auto& e = fixture()["spacings"][name]["steps" + std::to_string(n)];
            const auto ts = e["timesteps"].get<std::vector<double>>();
            const auto sg = e["sigmas"].get<std::vector<double>>();
            const Schedule s = make_schedule(ms, SchedulerKind::Discrete, n, so);
            ASSERT_EQ(s.timesteps.size(), ts.size()) << name << " " << n;
            ASSERT_EQ(s.sigmas.size(), sg.size()) << name << " " << n;
            for (size_t i = 0; i < ts.size(); ++i) {
                et = std::max(et, std::abs(s.timesteps[i] - ts[i]));
                EXPECT_EQ(s.timesteps[i], static_cast<float>(ts[i])) << name << " " << n << " timestep " << i;
            }
            for (size_t i = 0; i < sg.size(); ++i) {
                es = std::max(es, std::abs(s.sigmas[i] - sg[i]));
                EXPECT_NEAR(s.sigmas[i], sg[i], std::max(1e-7, 1e-6 * sg[i])) << name << " " << n << " sigma " << i;
            }
            const double init = e["init_noise_sigma"].get<double>();
            ei = std::max(ei, std::abs(s.initial_sigma() - init));
            EXPECT_NEAR(s.initial_sigma(), init, 1e-6 * init) << name << " " << n;
            ++cases;
        }
    }
    std::printf("[ zsnr ] %d schedules: max |dsigma| %.3g, max |dt| %.3g, max |d init_noise_sigma| %.3g\n", cases, es, et, ei);
    // Leading spacing scales the initial noise by sqrt(sigma_0^2 + 1) (diffusers' rule), the
    // others by sigma_0.
    ScheduleOptions lead;
    lead.spacing = Spacing::Leading;
    const auto sl = make_schedule(ms, SchedulerKind::Discrete, 20, lead);
    EXPECT_FLOAT_EQ(sl.initial_sigma(), std::sqrt(sl.sigmas[0] * sl.sigmas[0] + 1.0f));
    EXPECT_EQ(make_schedule(ms, SchedulerKind::Karras, 20).initial_sigma(), ms.sigma_max());
}

// Every sampler on every scheduler from sigma_max = 4096, on the exact v-prediction network of
// a point-mass data set x0 = c: the denoiser gives D(x; sigma) = c at every sigma, so every
// method must end exactly at c (its last step lands on sigma = 0 with x = D), and DDIM trailing
// at its closed form. NaN/inf anywhere fails.
TEST(SamplingZsnrSchedule, EverySamplerCopesWithSigmaMax4096) {
    const auto ms = zsnr();
    const int n = 64;
    std::vector<float> c(n);
    for (int i = 0; i < n; ++i) c[i] = 0.8f * std::sin(0.37f * i) + 0.1f;
    const std::vector<SamplerKind> kinds = {SamplerKind::Euler, SamplerKind::EulerA, SamplerKind::Heun, SamplerKind::Dpm2,
                                            SamplerKind::DpmPP2M, SamplerKind::DpmPP2SA, SamplerKind::Lcm};
    const std::vector<SchedulerKind> scheds = {SchedulerKind::Discrete, SchedulerKind::Karras, SchedulerKind::Exponential,
                                               SchedulerKind::SgmUniform, SchedulerKind::Simple, SchedulerKind::Lcm};
    auto run = [&](SamplerKind kind, const Schedule& sched, const std::string& label) {
        // The network: v = alpha*eps - sigma_vp*x0 with x_in = alpha*x0 + sigma_vp*eps,
        // alpha = 1/sqrt(s^2+1), sigma_vp = s/sqrt(s^2+1); s found from the timestep (the
        // schedule's own sigma for its timesteps, else t_to_sigma, for the midpoints).
        ModelFn model = [&](std::span<const float> x_in, double t, Branch, std::span<float> out) {
            double s = -1;
            for (int i = 0; i < sched.steps(); ++i)
                if (sched.timesteps[i] == static_cast<float>(t)) s = sched.sigmas[i];
            if (s < 0) s = ms.t_to_sigma(t);
            const double a = 1.0 / std::sqrt(s * s + 1.0), sv = s * a;
            for (size_t i = 0; i < x_in.size(); ++i) {
                const double eps = (x_in[i] - a * c[i]) / sv;
                out[i] = static_cast<float>(a * eps - sv * c[i]);
            }
        };
        Denoiser den(ms, model, 1.0f);
        Rng rng(RngKind::Cpu, 7);
        auto noise = rng.randn(n);
        auto x = noise_latent({}, noise, sched.initial_sigma(), false);
        Sampler sampler(kind, sched, {1, 1, 8, 8}, x, Rng(RngKind::Cpu, 8), false);
        bool finite = true;
        sampler.run(den, [&](const SamplerState& st) {
            for (float v : st.x) finite &= std::isfinite(v);
        });
        EXPECT_TRUE(finite) << label;
        const auto r = sampler.result();
        double err = 0;
        for (int i = 0; i < n; ++i) err = std::max(err, std::abs(double(r[i]) - c[i]));
        EXPECT_LE(err, 2e-4) << label;
        return err;
    };
    double worst = 0;
    int runs = 0;
    for (auto k : kinds)
        for (auto sk : scheds) {
            for (int steps : {1, 4, 20}) {
                ScheduleOptions so;
                so.spacing = Spacing::Trailing;  // starts at t = 999, sigma 4096 (linspace's 1 step is t = 0)
                const Schedule sched = make_schedule(ms, sk, steps, so);
                EXPECT_FLOAT_EQ(sched.sigmas[0], ms.sigma_max()) << scheduler_name(sk) << " " << steps;
                worst = std::max(worst, run(k, sched, std::string(sampler_name(k)) + "/" + scheduler_name(sk) + "/" + std::to_string(steps)));
                ++runs;
            }
        }
    for (bool karras : {false, true}) {
        const Schedule sched = diffusers_dpmsolver_schedule(ms, 20, karras);
        EXPECT_FLOAT_EQ(sched.sigmas[0], karras ? ms.sigma_max() : ms.sigmas()[999]);
        worst = std::max(worst, run(SamplerKind::DpmPP2M, sched, karras ? "dpm++2m/diffusers karras" : "dpm++2m/diffusers"));
        ++runs;
    }
    std::printf("[ zsnr ] %d sampler/scheduler runs from sigma_max: max |x - c| %.3g\n", runs, worst);

    // DDIM trailing: from x_T = 4096*noise with D = c every step keeps x = c + sigma*(x_T - c)/4096,
    // ending at sigma = table[0] and returned in VP scale x / sqrt(table[0]^2 + 1).
    const Schedule dd = ddim_trailing_schedule(ms, 10);
    ASSERT_EQ(dd.sigmas[0], ms.sigma_max());
    ModelFn model = [&](std::span<const float> x_in, double t, Branch, std::span<float> out) {
        const double s = ms.t_to_sigma(t), a = 1.0 / std::sqrt(s * s + 1.0), sv = s * a;
        for (size_t i = 0; i < x_in.size(); ++i) out[i] = static_cast<float>(a * (x_in[i] - a * c[i]) / sv - sv * c[i]);
    };
    Denoiser den(ms, model, 1.0f);
    auto noise = Rng(RngKind::Cpu, 3).randn(n);
    auto x = noise_latent({}, noise, dd.sigmas[0], false);
    Sampler sampler(SamplerKind::DdimTrailing, dd, {1, 1, 8, 8}, x, Rng(RngKind::Cpu, 4), false);
    sampler.run(den);
    const auto r = sampler.result();
    const double s_end = ms.sigmas()[0];
    double err = 0;
    for (int i = 0; i < n; ++i) {
        const double want = (c[i] + s_end * (double(x[i]) - c[i]) / dd.sigmas[0]) / std::sqrt(s_end * s_end + 1.0);
        err = std::max(err, std::abs(r[i] - want));
    }
    std::printf("[ zsnr ] ddim_trailing from 4096: max |x - closed form| %.3g\n", err);
    EXPECT_LE(err, 2e-4);
}

// zsnr_step_warning (tryout F19): the combinations measured on the demo model (CFG 5, --rng cpu,
// seeds 1, 2, 3, 42; tools/demo-model/README.md, "Second-order samplers at few steps") that drew
// noise for some seed warn, those right for every seed tried do not, and no ordinary (sigma_max
// 14.6) or flow schedule warns. The longest steps in 3 <= sigma <= 100 by hand from the ladders:
// karras 10 steps 3.554 -> 0.4823 (h = 2.00); exponential 6 steps h = log(4096/0.02917)/5 = 2.37.
TEST(SamplingZsnrSchedule, SecondOrderStepWarningAsMeasured) {
    const auto ms = zsnr();
    auto warns = [](SamplerKind k, const Schedule& s) { return !zsnr_step_warning(k, s.sigmas, false).empty(); };
    // dpm++2m (easel runs it on diffusers' DPMSolverMultistep ladders for discrete/karras): karras
    // 10/12/14 and exponential 6/10 drew noise for some seed; karras 16/20 and linspace 10 never.
    for (int n : {10, 12, 14}) EXPECT_TRUE(warns(SamplerKind::DpmPP2M, diffusers_dpmsolver_schedule(ms, n, true))) << n;
    for (int n : {16, 20}) EXPECT_FALSE(warns(SamplerKind::DpmPP2M, diffusers_dpmsolver_schedule(ms, n, true))) << n;
    EXPECT_FALSE(warns(SamplerKind::DpmPP2M, diffusers_dpmsolver_schedule(ms, 10, false)));
    for (int n : {6, 10}) EXPECT_TRUE(warns(SamplerKind::DpmPP2M, make_schedule(ms, SchedulerKind::Exponential, n))) << n;
    // heun: exponential 6/10/12, discrete 6/10/20 (20: its first step 4096 -> 38.2 ends in the band),
    // karras 10 wrong; exponential 16/20, karras 20 right.
    // dpm2: karras 10/14 wrong, 20 right.
    for (int n : {6, 10, 12}) EXPECT_TRUE(warns(SamplerKind::Heun, make_schedule(ms, SchedulerKind::Exponential, n))) << n;
    for (int n : {16, 20}) EXPECT_FALSE(warns(SamplerKind::Heun, make_schedule(ms, SchedulerKind::Exponential, n))) << n;
    for (int n : {6, 10, 20}) EXPECT_TRUE(warns(SamplerKind::Heun, make_schedule(ms, SchedulerKind::Discrete, n))) << n;
    EXPECT_TRUE(warns(SamplerKind::Heun, make_schedule(ms, SchedulerKind::Karras, 10)));
    EXPECT_FALSE(warns(SamplerKind::Heun, make_schedule(ms, SchedulerKind::Karras, 20)));
    for (int n : {10, 14}) EXPECT_TRUE(warns(SamplerKind::Dpm2, make_schedule(ms, SchedulerKind::Karras, n))) << n;
    EXPECT_FALSE(warns(SamplerKind::Dpm2, make_schedule(ms, SchedulerKind::Karras, 20)));
    // The step counts docs/sampling.md quotes: dpm++2m warns below 16 karras / 12 exponential steps,
    // heun and dpm2 below 20 karras / 15 exponential steps, heun below 48 linspace (discrete) steps.
    auto first_quiet = [&](SamplerKind k, SchedulerKind sk) {  // one past the largest step count that warns
        int last = 0;
        for (int n = 1; n <= 60; ++n) {
            const Schedule s = (k == SamplerKind::DpmPP2M && sk == SchedulerKind::Karras) ? diffusers_dpmsolver_schedule(ms, n, true)
                                                                                       : make_schedule(ms, sk, n);
            if (warns(k, s)) last = n;
        }
        return last + 1;
    };
    EXPECT_EQ(first_quiet(SamplerKind::DpmPP2M, SchedulerKind::Karras), 16);
    EXPECT_EQ(first_quiet(SamplerKind::DpmPP2M, SchedulerKind::Exponential), 12);
    EXPECT_EQ(first_quiet(SamplerKind::Heun, SchedulerKind::Karras), 20);
    EXPECT_EQ(first_quiet(SamplerKind::Heun, SchedulerKind::Exponential), 15);
    EXPECT_EQ(first_quiet(SamplerKind::Dpm2, SchedulerKind::Karras), 20);
    EXPECT_EQ(first_quiet(SamplerKind::Heun, SchedulerKind::Discrete), 48);  // linspace: first step 4096 -> sigma(t = 999 - 999/(n-1))
    // Euler (any ladder) and the other methods: never.
    for (auto k : {SamplerKind::Euler, SamplerKind::EulerA, SamplerKind::Lcm, SamplerKind::DpmPP2SA})
        for (auto sk : {SchedulerKind::Karras, SchedulerKind::Exponential})
            EXPECT_FALSE(warns(k, make_schedule(ms, sk, 6))) << sampler_name(k);
    // Ordinary SD table (sigma_max 14.6) and flow: never, even for heun exponential 6.
    const auto sd = ModelSampling::discrete(Prediction::Eps);
    EXPECT_FALSE(warns(SamplerKind::Heun, make_schedule(sd, SchedulerKind::Exponential, 6)));
    EXPECT_FALSE(warns(SamplerKind::DpmPP2M, diffusers_dpmsolver_schedule(sd, 10, true)));
    const auto fl = ModelSampling::flow(3.0);
    EXPECT_TRUE(zsnr_step_warning(SamplerKind::Heun, make_schedule(fl, SchedulerKind::Discrete, 4).sigmas, true).empty());
    // The text names the method, the step and where it is, and what to use.
    const auto k10 = diffusers_dpmsolver_schedule(ms, 10, true);
    const std::string w = zsnr_step_warning(SamplerKind::DpmPP2M, k10.sigmas, false);
    const double h = std::log(double(k10.sigmas[7]) / k10.sigmas[8]);
    EXPECT_NEAR(h, 2.00, 0.005);
    EXPECT_NE(w.find("dpm++2m"), std::string::npos) << w;
    EXPECT_NE(w.find(fmt::format("step of {:.2f}", h)), std::string::npos) << w;
    EXPECT_NE(w.find("at sigma 3.554 "), std::string::npos) << w;
    EXPECT_NE(w.find("--scheduler discrete"), std::string::npos) << w;
    const auto e6 = make_schedule(ms, SchedulerKind::Exponential, 6);
    const std::string we = zsnr_step_warning(SamplerKind::Heun, e6.sigmas, false);
    EXPECT_NE(we.find(fmt::format("step of {:.2f}", std::log(double(ms.sigma_max()) / ms.sigma_min()) / 5)), std::string::npos) << we;
    EXPECT_EQ(we.find("--scheduler discrete"), std::string::npos) << we;  // heun is wrong on discrete too
}
