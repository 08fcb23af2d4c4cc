// The samplers and schedulers added with issue 26: convergence orders on ODEs whose exact
// solution is known, hand-computed single steps and schedules, the noise sources (sampler RNG,
// Brownian tree, an injected source), resume for every method, and the A1111 / ComfyUI name table.
#include "core/error.h"
#include "sampling/names.h"
#include "sampling/sampler.h"
#include "sampling/schedule.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <set>

using namespace easel;
using namespace easel::sampling;

namespace {

ModelSampling sd15() { return ModelSampling::discrete(Prediction::Eps); }

Schedule manual(const ModelSampling& ms, std::vector<float> sig) {
    Schedule s;
    s.sigmas = std::move(sig);
    for (size_t i = 0; i + 1 < s.sigmas.size(); ++i) s.timesteps.push_back(static_cast<float>(ms.sigma_to_t(s.sigmas[i])));
    return s;
}

// A network whose output does not depend on the timestep: F = c * x_in (cond) and F = u * x_in
// (uncond). For an eps model D = x - sigma c x / sqrt(1 + sigma^2), so the probability-flow ODE
// dx/dsigma = (x - D)/sigma = c x / sqrt(1 + sigma^2) has x(sigma) = x(s0) exp(c (asinh sigma - asinh s0));
// for a flow model (x_in = x) D = x - sigma c x and x(sigma) = x(s0) exp(c (sigma - s0)).
ModelFn linear_model(double c, double u = 0.0) {
    return [c, u](std::span<const float> x_in, double, Branch b, std::span<float> out) {
        const double k = b == Branch::Cond ? c : u;
        for (size_t i = 0; i < x_in.size(); ++i) out[i] = static_cast<float>(k * x_in[i]);
    };
}

// Runs `kind` deterministically (eta 0) over n steps s0 -> s1, equal in sigma (or in log sigma when
// geometric), and returns the largest relative error against the exact solution.
double ode_error(SamplerKind kind, bool flow, int n, bool geometric = false) {
    const double c = flow ? 0.7 : 0.8;
    const double s0 = flow ? 0.9 : 2.0, s1 = flow ? 0.1 : 1.0;
    const ModelSampling ms = flow ? ModelSampling::flow(1.0) : sd15();
    std::vector<float> sig;
    for (int i = 0; i <= n; ++i)
        sig.push_back(static_cast<float>(geometric ? s0 * std::pow(s1 / s0, double(i) / n) : s0 + (s1 - s0) * i / n));
    Schedule sch = manual(ms, sig);
    // 4 elements: the method is elementwise, any x works
    Sampler s(kind, sch, {4}, {1.0f, -0.5f, 2.0f, 0.25f}, Rng(RngKind::Cpu, 1), flow, 0.0f);
    Denoiser d(ms, linear_model(c, c));  // cond = uncond: the CFG++ methods integrate the same ODE
    s.run(d);
    const double a0 = sig.front(), a1 = sig.back();
    const double growth = flow ? std::exp(c * (a1 - a0)) : std::exp(c * (std::asinh(a1) - std::asinh(a0)));
    const double x0[4] = {1.0, -0.5, 2.0, 0.25};
    double err = 0;
    for (int k = 0; k < 4; ++k) err = std::max(err, std::abs(s.state().x[k] - x0[k] * growth) / std::abs(x0[k] * growth));
    return err;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Convergence: the global error at 16 and 32 steps against the exact solution (float32 latents:
// errors below ~1e-6 are rounding). The observed order log2(e(16)/e(32)) must be within 0.25 of the
// method's: euler and the CFG++ methods 1; the second-order ones 2; the multistep methods started
// with Euler (lms, ipndm, ipndm_v, deis) and uni_pc (its last predictor step is first order,
// lower_order_final) 2; dpm++2mv2 1 (sd.cpp's variant weighs D with the mean of the last two log
// steps: first order where the log-sigma steps change, second order on a log-uniform ladder).
// (er_sde integrates its SDE's drift, not the probability-flow ODE, even without noise: it is
// checked against its reference instead.)

TEST(SamplingOrder, DeterministicMethodsConvergeAtTheirOrder) {
    struct Want {
        SamplerKind k;
        double min_order;
        bool flow;
    };
    const Want cases[] = {
        {SamplerKind::Euler, 0.8, false},       {SamplerKind::Heun, 1.8, false},     {SamplerKind::Dpm2, 1.8, false},
        {SamplerKind::Dpm2A, 1.8, false},       {SamplerKind::Lms, 1.8, false},      {SamplerKind::Ipndm, 1.8, false},
        {SamplerKind::IpndmV, 1.8, false},      {SamplerKind::DpmPP2M, 1.8, false},  {SamplerKind::DpmPP2Mv2, 0.8, false},
        {SamplerKind::DpmPP2S, 1.8, false},     {SamplerKind::DpmPPSde, 1.8, false}, {SamplerKind::DpmPP2MSde, 1.8, false},
        {SamplerKind::DpmPP2MSdeBt, 1.8, false}, {SamplerKind::Deis, 1.8, false},    {SamplerKind::UniPc, 1.8, false},
        {SamplerKind::ResMultistep, 1.8, false}, {SamplerKind::Res2s, 1.8, false},
        {SamplerKind::EulerCfgPP, 0.8, false},  {SamplerKind::EulerACfgPP, 0.8, false},
        // flow forms
        {SamplerKind::Euler, 0.8, true},        {SamplerKind::Heun, 1.8, true},      {SamplerKind::Dpm2A, 1.8, true},
        {SamplerKind::Lms, 1.8, true},          {SamplerKind::IpndmV, 1.8, true},    {SamplerKind::DpmPP2M, 1.8, true},
        {SamplerKind::DpmPPSde, 1.8, true},     {SamplerKind::DpmPP2MSde, 1.8, true}, {SamplerKind::Deis, 1.8, true},
        {SamplerKind::UniPc, 1.8, true},        {SamplerKind::EulerCfgPP, 0.8, true},
    };
    for (const auto& w : cases) {
        const double e1 = ode_error(w.k, w.flow, 16), e2 = ode_error(w.k, w.flow, 32);
        const double order = std::log2(e1 / e2);
        std::printf("[ order ] %-15s %-4s e(16) %.3g e(32) %.3g order %.2f\n", sampler_name(w.k), w.flow ? "flow" : "ve", e1, e2,
                    order);
        EXPECT_LT(e2, 2e-2) << sampler_name(w.k);
        EXPECT_GT(order, w.min_order - 0.05) << sampler_name(w.k) << (w.flow ? " flow" : " ve");
    }
    // dpm++2mv2 on a log-uniform ladder: second order
    const double g1 = ode_error(SamplerKind::DpmPP2Mv2, false, 16, true), g2 = ode_error(SamplerKind::DpmPP2Mv2, false, 32, true);
    std::printf("[ order ] dpm++2mv2 log-uniform e(16) %.3g e(32) %.3g order %.2f\n", g1, g2, std::log2(g1 / g2));
    EXPECT_GT(std::log2(g1 / g2), 1.75);
}

// ---------------------------------------------------------------------------------------
// Hand-computed steps

namespace {

// One sampler run over sig from x = 1 (shape [1]); the latent after every step.
std::vector<double> steps_of(SamplerKind kind, const ModelSampling& ms, std::vector<float> sig, float eta, ModelFn model,
                             float cfg = 1.0f, Sampler::NoiseSource src = {}) {
    Sampler s(kind, manual(ms, std::move(sig)), {1}, {1.0f}, Rng(RngKind::Cpu, 5), ms.is_flow(), eta);
    if (src) s.set_noise_source(std::move(src));
    Denoiser d(ms, std::move(model), cfg);
    std::vector<double> xs;
    while (!s.done()) {
        s.step(d);
        xs.push_back(s.state().x[0]);
    }
    return xs;
}

Sampler::NoiseSource constant_noise(float z, std::vector<std::pair<double, double>>* calls = nullptr) {
    return [z, calls](double a, double b) {
        if (calls) calls->push_back({a, b});
        return std::vector<float>{z};
    };
}

}  // namespace

TEST(SamplingStep, CfgPlusPlusByHand) {
    const auto ms = sd15();
    // eps model, F_cond = 0.5 x_in, F_uncond = 0.2 x_in, cfg 2: F = 0.2 + 2*(0.3) = 0.8 x_in.
    // sigma 2 -> 1 from x = 1: c_in = 1/sqrt5, D = 1 - 2*0.8/sqrt5, U = 1 - 2*0.2/sqrt5,
    // euler_cfg_pp: x = D + 1 * (1 - U)/2
    const double D = 1 - 1.6 / std::sqrt(5.0), U = 1 - 0.4 / std::sqrt(5.0);
    auto x = steps_of(SamplerKind::EulerCfgPP, ms, {2.0f, 1.0f, 0.0f}, 0, linear_model(0.5, 0.2), 2.0f);
    EXPECT_NEAR(x[0], D + (1 - U) / 2, 1e-6);
    // euler_a_cfg_pp eta 1: sigma_down 0.5, sigma_up sqrt(0.75): x = D + 0.5 (1 - U)/2 + sqrt(0.75) z
    auto xa = steps_of(SamplerKind::EulerACfgPP, ms, {2.0f, 1.0f, 0.0f}, 1.0f, linear_model(0.5, 0.2), 2.0f, constant_noise(0.3f));
    EXPECT_NEAR(xa[0], D + 0.5 * (1 - U) / 2 + std::sqrt(0.75) * 0.3, 1e-6);
    // at cfg 1 the unconditional pass still runs (CFG++ needs it)
    int uncond = 0;
    ModelFn m = [&](std::span<const float> x_in, double, Branch b, std::span<float> out) {
        uncond += b == Branch::Uncond;
        out[0] = (b == Branch::Cond ? 0.5f : 0.2f) * x_in[0];
    };
    auto x1 = steps_of(SamplerKind::EulerCfgPP, ms, {2.0f, 1.0f, 0.0f}, 0, m, 1.0f);
    EXPECT_EQ(uncond, 2);
    const double D1 = 1 - 1.0 / std::sqrt(5.0);
    EXPECT_NEAR(x1[0], D1 + (1 - U) / 2, 1e-6);
    // flow (alpha = 1 - sigma): 0.8 -> 0.4, F = 0.8 x, U uses 0.2: x = 0.6 D + 0.4 (x - 0.2 U)/0.8
    const auto fl = ModelSampling::flow(1.0);
    auto xf = steps_of(SamplerKind::EulerCfgPP, fl, {0.8f, 0.4f, 0.0f}, 0, linear_model(0.5, 0.2), 2.0f);
    const double Df = 1 - 0.8 * 0.8, Uf = 1 - 0.8 * 0.2;
    EXPECT_NEAR(xf[0], 0.6 * Df + 0.4 * (1 - 0.2 * Uf) / 0.8, 1e-6);
}

TEST(SamplingStep, Dpm2AncestralAndTcdAndDdimByHand) {
    const auto ms = sd15();
    // dpm2_a eta 1, sigma 2 -> 1, F = 0.5 x_in (eps): sigma_down 0.5, sigma_up sqrt(0.75), mid = 1;
    // d = 0.5/sqrt5 (D = x - 2*0.5 x/sqrt5), x2 = 1 + d (1 - 2), d2 = 0.5 x2/sqrt2, x = 1 + d2 (0.5 - 2) + up z
    {
        const double d = 0.5 / std::sqrt(5.0), x2 = 1 - d, d2 = 0.5 * x2 / std::sqrt(2.0);
        auto x = steps_of(SamplerKind::Dpm2A, ms, {2.0f, 1.0f, 0.0f}, 1.0f, linear_model(0.5), 1.0f, constant_noise(-0.7f));
        EXPECT_NEAR(x[0], 1 + d2 * (0.5 - 2) + std::sqrt(0.75) * -0.7, 2e-6);
        EXPECT_NEAR(x[1], x[0] - x[0] * 0.5 / std::sqrt(2.0) * 1.0, 2e-6);  // last step: Euler to 0
    }
    // tcd with table sigmas (t 999 -> 499 -> 0): eta 0 lands on sn itself: x = D + sn eps (DDIM eta 0)
    {
        const auto& tab = ms.sigmas();
        const float s = tab[999], sn = tab[499];
        auto x = steps_of(SamplerKind::Tcd, ms, {s, sn, 0.0f}, 0.0f, linear_model(0.5));
        const double c_in = 1 / std::sqrt(double(s) * s + 1), eps = 0.5 * c_in, D = 1 - s * eps;
        EXPECT_NEAR(x[0], D + sn * eps, 2e-5);
        // eta 0.5: s' = floor(0.5 * 499) = 249, x = sqrt(a_s/a_p) D + sqrt(b_s/a_p) eps, then renoised to sn
        auto y = steps_of(SamplerKind::Tcd, ms, {s, sn, 0.0f}, 0.5f, linear_model(0.5), 1.0f, constant_noise(0.4f));
        const double ss = tab[249], a_p = 1 / (double(sn) * sn + 1), a_s = 1 / (ss * ss + 1);
        const double xs = std::sqrt(a_s / a_p) * D + std::sqrt((1 - a_s) / a_p) * eps;
        EXPECT_NEAR(y[0], std::sqrt(a_p / a_s) * xs + std::sqrt(1 / a_p - 1 / a_s) * 0.4, 2e-5);
    }
    // ddim on ddim_schedule(leading): 20 steps, t = 951 ... 1, the last step to table[0]
    {
        const auto sch = ddim_schedule(ms, 20, Spacing::Leading);
        EXPECT_EQ(sch.timesteps.front(), 951.0f);
        EXPECT_EQ(sch.timesteps.back(), 1.0f);
        EXPECT_EQ(sch.sigmas[1], ms.sigmas()[901]);
        EXPECT_EQ(sch.sigmas.back(), ms.sigmas()[0]);
        Sampler sp(SamplerKind::Ddim, sch, {1}, {1.0f}, Rng(RngKind::Cpu, 1), false);
        Denoiser d(ms, linear_model(0.5));
        sp.run(d);
        // result in VP scaling (DDIM's sample at t = 0)
        const double sl = sch.sigmas.back();
        EXPECT_NEAR(sp.result()[0], sp.state().x[0] / std::sqrt(sl * sl + 1), 1e-7);
    }
}

TEST(SamplingStep, DpmPPSdeNoiseCallsAndBrownianTree) {
    const auto ms = sd15();
    // dpm++_sde draws twice per step: (sigma, sigma_mid) and (sigma, sigma_next); the midpoint in
    // log sigma for eps/v models (r = 1/2)
    std::vector<std::pair<double, double>> calls;
    steps_of(SamplerKind::DpmPPSde, ms, {4.0f, 1.0f, 0.0f}, 1.0f, linear_model(0.5), 1.0f, constant_noise(0.0f, &calls));
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_NEAR(calls[0].first, 4.0, 1e-6);
    EXPECT_NEAR(calls[0].second, 2.0, 1e-6);
    EXPECT_NEAR(calls[1].second, 1.0, 1e-6);
    // its own noise: the Brownian tree, seeded from the sampler RNG (a different RNG seed, a different tree)
    auto run = [&](uint64_t seed) {
        const auto sch = make_schedule(ms, SchedulerKind::Karras, 6);
        Sampler s(SamplerKind::DpmPPSde, sch, {8}, std::vector<float>(8, 1.0f), Rng(RngKind::Cpu, seed), false);
        Denoiser d(ms, linear_model(0.5));
        s.run(d);
        return s.result();
    };
    EXPECT_EQ(run(3), run(3));
    EXPECT_NE(run(3), run(4));
}

TEST(SamplingBrownianTree, BridgePropertiesAndDeterminism) {
    const int64_t n = 20000;
    const double t0 = 0.03, t1 = 14.6;
    const auto w0 = brownian_tree_w(42, t0, t1, n, t0);
    for (float v : w0) ASSERT_EQ(v, 0.0f);
    // the same w(t) whatever was asked before it
    const auto a = brownian_tree_w(42, t0, t1, n, 3.0);
    (void)brownian_tree_w(42, t0, t1, n, 9.0);
    EXPECT_EQ(brownian_tree_w(42, t0, t1, n, 3.0), a);
    EXPECT_NE(brownian_tree_w(43, t0, t1, n, 3.0), a);
    // increments of a Brownian motion: W(b) - W(a) ~ N(0, b - a), independent over disjoint intervals
    auto var = [&](double p, double q) {
        const auto wp = brownian_tree_w(42, t0, t1, n, p), wq = brownian_tree_w(42, t0, t1, n, q);
        double s = 0;
        for (int64_t k = 0; k < n; ++k) s += double(wq[k] - wp[k]) * (wq[k] - wp[k]);
        return s / n;
    };
    EXPECT_NEAR(var(1.0, 2.0) / 1.0, 1.0, 0.05);
    EXPECT_NEAR(var(0.2, 0.45) / 0.25, 1.0, 0.05);
    EXPECT_NEAR(var(t0, t1) / (t1 - t0), 1.0, 0.05);
    const auto w1 = brownian_tree_w(42, t0, t1, n, 1.0), w2 = brownian_tree_w(42, t0, t1, n, 2.0), w3 = brownian_tree_w(42, t0, t1, n, 3.0);
    double cov = 0;
    for (int64_t k = 0; k < n; ++k) cov += double(w2[k] - w1[k]) * (w3[k] - w2[k]);
    EXPECT_NEAR(cov / n, 0.0, 0.05);
    EXPECT_THROW(brownian_tree_w(1, 1.0, 1.0, 4, 1.0), Error);
}

// ---------------------------------------------------------------------------------------
// The methods only ComfyUI / sd.cpp define, against the transcriptions of their code in
// tools/reference/sampler_refs.py run on one scalar with plain Python floats
// (tools/reference/sampler_refs_scalar.py prints this table): eps model (sigmas 14.6 ... 0) or
// flow model (shift 3, 1 ... 0), F_cond = 0.5 tanh(x_in) + 0.05, F_uncond = 0.4 tanh(x_in) + 0.03,
// CFG 3, x = 1.3 sigma_0, the k-th noise draw sin(k). The sampler_refs.py run on the GPU machine
// checks them again on tensors, the demo model and Z-Image (sampling_reference_test.cpp).

namespace {

struct ScalarRef {
    const char* method;
    bool flow;
    float eta;
    double x[8];
};

const ScalarRef kScalarRefs[] = {
    {"euler_a", true, 1.0f, {1.32043969, 1.4047655, 0.966476021, 0.27216566, -0.133501784, -0.162717597, -0.121958125, -0.122210628}},
    {"dpm2_a", true, 1.0f, {1.32090583, 1.40633775, 0.970150752, 0.282827367, -0.117116161, -0.150502951, -0.111609485, -0.112219293}},
    {"dpm++_sde", false, 1.0f, {18.1964052, 12.082171, 8.54525301, 8.48868442, 7.9091627, 7.46427796, 7.40242681, 7.37872683}},
    {"dpm++_sde", true, 1.0f, {0.872793064, -0.289017866, -0.396972946, 0.316467182, 0.0265586543, -0.213647068, -0.111070062, -0.111698517}},
    {"dpm++2m_sde", false, 1.0f, {15.2960188, 14.4832402, 13.5211498, 12.3123113, 11.2914791, 10.6993372, 10.3268845, 10.3031845}},
    {"dpm++2m_sde", true, 1.0f, {0.828029862, 1.02731382, 0.611397263, -0.0854546418, -0.482162537, -0.556704434, -0.530214302, -0.517720231}},
    {"dpm++2mv2", false, 0.0f, {13.0924138, 10.7664179, 9.6359623, 9.16948821, 8.64215628, 8.21068942, 7.57747391, 7.55377392}},
    {"dpm++2mv2", true, 0.0f, {1.25840763, 1.18602451, 1.08159829, 0.946892912, 0.799027102, 0.641771107, 0.531740595, 0.510205728}},
    {"lcm", false, 0.0f, {14.0001779, 11.9092472, 9.81753798, 8.1817979, 7.33153285, 7.05310335, 6.97801309, 6.95431313}},
    {"lcm", true, 0.0f, {0.827390353, 0.817296934, 0.19680846, -0.400906209, -0.539662299, -0.419252455, -0.335173734, -0.328363067}},
    {"ipndm", false, 0.0f, {13.0924138, 10.5044815, 9.34466256, 8.78514214, 8.47498972, 8.32479156, 8.25369075, 8.22999076}},
    {"ipndm_v", false, 0.0f, {13.0924138, 10.5816805, 9.40005157, 8.84984701, 8.54183043, 8.39195327, 8.32078147, 8.29708147}},
    {"ipndm_v", true, 0.0f, {1.25840763, 1.19724269, 1.11095842, 0.986515125, 0.849152196, 0.727076818, 0.663820014, 0.638988514}},
    {"res_multistep", false, 0.0f, {13.0924138, 10.5098498, 9.27824862, 8.71178273, 8.39866837, 8.24649856, 8.17401087, 8.15031087}},
    {"res_multistep", true, 0.0f, {1.25840763, 1.19729647, 1.11125643, 1.00336688, 0.890351432, 0.788340426, 0.733471087, 0.707089636}},
    {"res_multistep", false, 1.0f, {15.2960188, 14.6149359, 13.859713, 12.7590548, 11.722011, 11.013936, 10.4047102, 10.3810102}},
    {"res_multistep", true, 1.0f, {1.32043969, 1.41059028, 0.9953007, 0.218721569, -0.36693069, -0.640701375, -0.81440404, -0.7953836}},
    {"res_2s", false, 0.0f, {12.8102797, 10.3161092, 9.13198247, 8.57899039, 8.2708906, 8.12079063, 8.04969064, 8.02599064}},
    {"res_2s", true, 1.0f, {1.3208869, 1.40624219, 0.969810339, 0.281234391, -0.120556283, -0.153169265, -0.113809331, -0.114343114}},
    {"er_sde", false, 1.0f, {15.3121897, 13.9792481, 12.9801609, 12.2705389, 11.8380211, 11.6520306, 11.5762393, 11.5525393}},
    {"er_sde", true, 1.0f, {0.827391746, 1.09988297, 0.978577533, 0.685618448, 0.457552685, 0.34814385, 0.311621704, 0.296554794}},
    {"euler_cfg_pp", false, 0.0f, {11.1508957, 7.74306592, 6.07282037, 5.26902221, 4.84945257, 4.6561846, 4.57429849, 4.55060298}},
    {"euler_cfg_pp", true, 0.0f, {1.25840763, 1.18064373, 1.06033116, 0.905978562, 0.748552479, 0.61986158, 0.553424578, 0.531316692}},
    {"euler_a_cfg_pp", false, 1.0f, {14.4848366, 12.646509, 10.8200741, 9.40579272, 8.64529891, 8.38945729, 8.31696604, 8.29326604}},
    {"euler_a_cfg_pp", true, 1.0f, {0.827390353, 1.02490917, 0.578968078, -0.0843810344, -0.385676059, -0.342860957, -0.276689891, -0.271745535}},
};

}  // namespace

TEST(SamplingTranscriptions, MatchTheScalarRuns) {
    const std::vector<float> ve = {14.6f, 6.1f, 2.9f, 1.4f, 0.7f, 0.31f, 0.12f, 0.03f, 0.0f};
    const std::vector<float> fl = {1.0f, 0.94f, 0.85f, 0.72f, 0.55f, 0.36f, 0.17f, 0.05f, 0.0f};
    for (const auto& r : kScalarRefs) {
        const ModelSampling ms = r.flow ? ModelSampling::flow(3.0) : sd15();
        const Schedule sch = manual(ms, r.flow ? fl : ve);
        Sampler sp(parse_sampler(r.method), sch, {1}, {1.3f * sch.sigmas[0]}, Rng(RngKind::Cpu, 1), r.flow, r.eta);
        int k = 0;
        sp.set_noise_source([&](double, double) { return std::vector<float>{static_cast<float>(std::sin(++k))}; });
        ModelFn m = [](std::span<const float> xi, double, Branch b, std::span<float> out) {
            out[0] = static_cast<float>((b == Branch::Cond ? 0.5 : 0.4) * std::tanh(double(xi[0])) + (b == Branch::Cond ? 0.05 : 0.03));
        };
        Denoiser d(ms, m, 3.0f);
        double worst = 0;
        for (int i = 0; i < 8; ++i) {
            sp.step(d);
            worst = std::max(worst, std::abs(sp.state().x[0] - r.x[i]) / std::max(1.0, std::abs(r.x[i])));
        }
        EXPECT_LT(worst, 2e-6) << r.method << (r.flow ? " flow" : " eps") << " eta " << r.eta;
    }
}

// ---------------------------------------------------------------------------------------
// Resume: every method, 10 steps straight vs 4 + state -> map -> state -> 6; what a method keeps
// (history, the tree seed, the RNG) must be in the state.

namespace {

ModelFn toy_model() {
    return [](std::span<const float> x_in, double t, Branch b, std::span<float> out) {
        for (size_t i = 0; i < x_in.size(); ++i)
            out[i] = static_cast<float>(std::tanh(x_in[i]) * (b == Branch::Cond ? 0.5 : 0.4) + 0.1 * t / 1000.0);
    };
}

std::vector<float> resume_run(SamplerKind kind, const ModelSampling& ms, const Schedule& sched, int split, SamplerState* mid = nullptr,
                              const std::function<void(SamplerState&)>& damage = {}) {
    Rng init(RngKind::Cpu, 77);
    auto x_init = noise_latent({}, init.randn(64), sched.sigmas[0], ms.is_flow());
    Denoiser d(ms, toy_model(), 3.0f);
    Sampler first(kind, sched, {1, 4, 4, 4}, x_init, init, ms.is_flow());
    for (int i = 0; i < split && !first.done(); ++i) first.step(d);
    SamplerState st = SamplerState::from_map(first.state().to_map());
    if (mid) *mid = st;
    if (damage) damage(st);
    Sampler rest(st);
    rest.run(d);
    return rest.result();
}

int bit_diffs(const std::vector<float>& a, const std::vector<float>& b) {
    int n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
    return n;
}

}  // namespace

TEST(SamplingResume, EveryMethodIsBitIdentical) {
    const auto ve = sd15();
    const auto flow = ModelSampling::flow(3.0);
    for (const auto& info : sampler_infos()) {
        for (bool fl : {false, true}) {
            if (fl && !info.flow) continue;
            const auto& ms = fl ? flow : ve;
            Schedule sched;
            if (info.kind == SamplerKind::Ddim) sched = ddim_schedule(ms, 10, Spacing::Leading);
            else if (info.kind == SamplerKind::DdimTrailing) sched = ddim_trailing_schedule(ms, 10);
            else if (info.kind == SamplerKind::Tcd) sched = make_schedule(ms, SchedulerKind::Lcm, 10);
            else sched = make_schedule(ms, fl ? SchedulerKind::Discrete : SchedulerKind::Karras, 10);
            const auto full = resume_run(info.kind, ms, sched, 10);
            SamplerState mid;
            const auto resumed = resume_run(info.kind, ms, sched, 4, &mid);
            EXPECT_EQ(bit_diffs(full, resumed), 0) << info.name << (fl ? " flow" : "");
            // what the state carries matters: without it the run differs
            if (!mid.history.empty()) {
                const auto no_hist = resume_run(info.kind, ms, sched, 4, nullptr, [](SamplerState& s) {
                    for (auto& h : s.history) std::fill(h.begin(), h.end(), 0.0f);
                });
                EXPECT_GT(bit_diffs(full, no_hist), 0) << info.name << " without its history";
            }
            if (!mid.old_denoised.empty() && info.kind != SamplerKind::DpmPP2M) {
                const auto no_old = resume_run(info.kind, ms, sched, 4, nullptr, [](SamplerState& s) {
                    std::fill(s.old_denoised.begin(), s.old_denoised.end(), 0.0f);
                });
                EXPECT_GT(bit_diffs(full, no_old), 0) << info.name << " without old_denoised";
            }
            if (info.brownian) {
                ASSERT_EQ(mid.tree_seed.size(), 1u) << info.name;
                const auto other = resume_run(info.kind, ms, sched, 4, nullptr, [](SamplerState& s) { s.tree_seed[0] ^= 0x55; });
                EXPECT_GT(bit_diffs(full, other), 0) << info.name << " with another tree";
            }
        }
    }
}

TEST(SamplingState, Version1MapsStillRead) {
    const auto ms = sd15();
    Sampler s(SamplerKind::DpmPP2M, make_schedule(ms, SchedulerKind::Karras, 5), {2}, {1.0f, 2.0f}, Rng(RngKind::Cpu, 1), false);
    auto m = s.state().to_map();
    EXPECT_EQ(std::get<std::vector<int64_t>>(m["version"])[0], 2);
    m["version"] = std::vector<int64_t>{1};
    m.erase("history");
    m.erase("history_count");
    m.erase("tree_seed");
    const auto st = SamplerState::from_map(m);
    EXPECT_TRUE(st.history.empty());
    // a Brownian-tree state without its seed is refused
    Sampler b(SamplerKind::DpmPP2MSdeBt, make_schedule(ms, SchedulerKind::Karras, 5), {2}, {1.0f, 2.0f}, Rng(RngKind::Cpu, 1), false);
    auto bm = b.state().to_map();
    bm["tree_seed"] = std::vector<int64_t>{};
    EXPECT_THROW(Sampler{SamplerState::from_map(bm)}, Error);
    auto hm = b.state().to_map();
    hm["history_count"] = std::vector<int64_t>{3};
    hm["history"] = std::vector<float>{1.0f, 2.0f};
    EXPECT_THROW(SamplerState::from_map(hm), Error);
}

// ---------------------------------------------------------------------------------------
// Schedules by hand

TEST(SamplingSchedule, AysAndGitsTables) {
    const auto ms = sd15();
    // 10 steps: NVIDIA's SD1.5 levels as they are, the last replaced by 0
    const auto a10 = make_schedule(ms, SchedulerKind::Ays, 10);
    const float want10[] = {14.6146412293f, 6.4745760956f, 3.8636745985f, 2.6946151520f, 1.8841921177f, 1.3943805092f,
                            0.9642583904f,  0.6523686016f, 0.3977456272f, 0.1515232662f, 0.0f};
    ASSERT_EQ(a10.sigmas.size(), 11u);
    for (int i = 0; i < 11; ++i) EXPECT_EQ(a10.sigmas[i], want10[i]) << i;
    // 5 steps: log-linear interpolation to 6 points lands on every second level
    const auto a5 = make_schedule(ms, SchedulerKind::Ays, 5);
    const float want5[] = {14.6146412293f, 3.8636745985f, 1.8841921177f, 0.9642583904f, 0.3977456272f, 0.0f};
    ASSERT_EQ(a5.sigmas.size(), 6u);
    for (int i = 0; i < 6; ++i) EXPECT_NEAR(a5.sigmas[i], want5[i], 2e-6 * want5[i]) << i;
    // SDXL table
    ScheduleOptions xl;
    xl.ays_table = ScheduleOptions::AysTable::Sdxl;
    EXPECT_EQ(make_schedule(ms, SchedulerKind::Ays, 10, xl).sigmas[1], 6.3184485287f);
    // GITS 8 steps: the published levels (coefficient 1.20), 0 at the end
    const auto g8 = make_schedule(ms, SchedulerKind::Gits, 8);
    ASSERT_EQ(g8.sigmas.size(), 9u);
    EXPECT_EQ(g8.sigmas[1], 5.85520077f);
    EXPECT_EQ(g8.sigmas[7], 0.09824532f);
    EXPECT_EQ(g8.sigmas[8], 0.0f);
    EXPECT_EQ(make_schedule(ms, SchedulerKind::Gits, 30).sigmas.size(), 31u);
    EXPECT_THROW(make_schedule(ms, SchedulerKind::Gits, 1), Error);
    EXPECT_THROW(make_schedule(ModelSampling::flow(3.0), SchedulerKind::Ays, 10), Error);
    EXPECT_THROW(make_schedule(ModelSampling::flow(3.0), SchedulerKind::Gits, 10), Error);
}

TEST(SamplingSchedule, KlOptimalSmoothstepBetaDdimUniformByHand) {
    const auto ms = sd15();
    const auto& tab = ms.sigmas();
    const double lo = tab.front(), hi = tab.back();
    // kl_optimal 3: tan(atan hi), tan((atan lo + atan hi)/2), lo
    const auto k = make_schedule(ms, SchedulerKind::KlOptimal, 3);
    EXPECT_NEAR(k.sigmas[0], hi, 1e-5);
    EXPECT_NEAR(k.sigmas[1], std::tan(0.5 * (std::atan(lo) + std::atan(hi))), 1e-6);
    EXPECT_NEAR(k.sigmas[2], lo, 1e-7);
    EXPECT_EQ(k.sigmas[3], 0.0f);
    // smoothstep 4: u = 1, .75, .5, .25 -> u^2 (3 - 2u) * 999 = 999, 842.9, 499.5, 156.1 -> t 999, 843, 500, 156
    const auto sm = make_schedule(ms, SchedulerKind::Smoothstep, 4);
    EXPECT_EQ(sm.sigmas[0], tab[999]);
    EXPECT_EQ(sm.sigmas[1], tab[843]);
    EXPECT_EQ(sm.sigmas[2], tab[500]);
    EXPECT_EQ(sm.sigmas[3], tab[156]);
    // beta with alpha = beta = 1/2 (the arcsine law, ppf(u) = sin^2(pi u/2)): 4 steps, u = 1, .75, .5, .25
    // -> 999, rint(999 * 0.853553) = 853, rint(499.5) = 500 (to even), rint(146.3) = 146
    ScheduleOptions o;
    o.beta_alpha = o.beta_beta = 0.5;
    const auto b = make_schedule(ms, SchedulerKind::Beta, 4, o);
    ASSERT_EQ(b.sigmas.size(), 5u);
    EXPECT_EQ(b.sigmas[0], tab[999]);
    EXPECT_EQ(b.sigmas[1], tab[853]);
    EXPECT_EQ(b.sigmas[2], tab[500]);
    EXPECT_EQ(b.sigmas[3], tab[146]);
    // ComfyUI's 0.6/0.6 is symmetric too: t(u) + t(1 - u) = 999
    const auto b6 = make_schedule(ms, SchedulerKind::Beta, 4);
    EXPECT_EQ(b6.sigmas[2], tab[500]);
    EXPECT_NEAR(ms.sigma_to_t(b6.sigmas[1]) + ms.sigma_to_t(b6.sigmas[3]), 999.0, 1e-3);
    // ddim_uniform 10: table[1 + 100 k] reversed
    const auto du = make_schedule(ms, SchedulerKind::DdimUniform, 10);
    ASSERT_EQ(du.sigmas.size(), 11u);
    EXPECT_EQ(du.sigmas[0], tab[901]);
    EXPECT_EQ(du.sigmas[9], tab[1]);
    // every new kind works on a flow model where it is defined, and gives decreasing sigmas
    const auto fl = ModelSampling::flow(3.0);
    for (auto kk : {SchedulerKind::KlOptimal, SchedulerKind::Smoothstep, SchedulerKind::Beta, SchedulerKind::DdimUniform,
                    SchedulerKind::SgmUniform, SchedulerKind::Simple}) {
        const auto s = make_schedule(fl, kk, 9);
        for (size_t i = 1; i < s.sigmas.size(); ++i) EXPECT_LT(s.sigmas[i], s.sigmas[i - 1]) << scheduler_name(kk) << " " << i;
        EXPECT_LE(s.sigmas[0], 1.0f);
    }
}

TEST(SamplingSchedule, CustomSigmas) {
    const auto ms = sd15();
    EXPECT_EQ(parse_sigmas("14.61,7.8,3.5,0.0"), (std::vector<float>{14.61f, 7.8f, 3.5f, 0.0f}));
    EXPECT_EQ(parse_sigmas("[ 1.5, 0.5 ,0 ]"), (std::vector<float>{1.5f, 0.5f, 0.0f}));
    EXPECT_THROW(parse_sigmas("1.5,abc"), Error);
    EXPECT_THROW(parse_sigmas(""), Error);
    EXPECT_THROW(parse_sigmas("1,,0"), Error);
    const auto s = custom_schedule(ms, {14.61f, 7.8f, 3.5f, 0.0f});
    EXPECT_EQ(s.steps(), 3);
    EXPECT_NEAR(s.timesteps[0], ms.sigma_to_t(14.61f), 1e-3);
    // sd.cpp takes a list that does not end in 0 as it is
    EXPECT_EQ(custom_schedule(ms, {5.0f, 1.0f}).sigmas.back(), 1.0f);
    EXPECT_THROW(custom_schedule(ms, {1.0f}), Error);
    EXPECT_THROW(custom_schedule(ms, {1.0f, 2.0f, 0.0f}), Error);
    EXPECT_THROW(custom_schedule(ms, {1.0f, 1.0f, 0.0f}), Error);
    EXPECT_THROW(custom_schedule(ms, {1.0f, -1.0f}), Error);
    EXPECT_THROW(custom_schedule(ms, {1.0f, 0.0f, 0.0f}), Error);
    EXPECT_THROW(custom_schedule(ms, {std::nanf(""), 0.0f}), Error);
    EXPECT_THROW(custom_schedule(ModelSampling::flow(3.0), {1.5f, 0.5f, 0.0f}), Error);
    EXPECT_EQ(custom_schedule(ModelSampling::flow(3.0), {1.0f, 0.5f, 0.0f}).timesteps[1], 500.0f);
    try {
        custom_schedule(ms, {3.0f, 4.0f});
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--sigmas value 2 (4) is not below"), std::string::npos) << e.what();
    }
}

// ---------------------------------------------------------------------------------------
// Names

TEST(SamplingNames, EveryMethodHasOneRowAndParses) {
    std::set<std::string> names;
    for (const auto& i : sampler_infos()) {
        EXPECT_TRUE(names.insert(i.name).second) << i.name;
        EXPECT_EQ(parse_sampler(i.name), i.kind);
        EXPECT_EQ(sampler_name(i.kind), std::string(i.name));
        EXPECT_NE(std::string(i.reference), "");
    }
    EXPECT_EQ(names.size(), 26u);
    // sd.cpp resolve_eta: 1 for euler_a, dpm++2s_a, er_sde, euler_a_cfg_pp, dpm++2m_sde(_bt); 0 for
    // ddim_trailing, tcd, res_multistep, res_2s
    for (auto k : {SamplerKind::EulerA, SamplerKind::DpmPP2SA, SamplerKind::ErSde, SamplerKind::EulerACfgPP, SamplerKind::DpmPP2MSde,
                   SamplerKind::DpmPP2MSdeBt, SamplerKind::Dpm2A, SamplerKind::DpmPPSde})
        EXPECT_EQ(default_eta(k), 1.0f) << sampler_name(k);
    for (auto k : {SamplerKind::DdimTrailing, SamplerKind::Ddim, SamplerKind::Tcd, SamplerKind::ResMultistep, SamplerKind::Res2s,
                   SamplerKind::DpmPP2S, SamplerKind::Euler})
        EXPECT_EQ(default_eta(k), 0.0f) << sampler_name(k);
    for (auto n : {"dpm++3m_sde", "dpm_fast", "restart"}) {
        try {
            parse_sampler(n);
            FAIL() << n;
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::Unsupported) << n;
        }
    }
    EXPECT_THROW(parse_sampler("nonsense"), Error);
}

TEST(SamplingNames, A1111AndComfyNamesResolve) {
    auto r = resolve_sampler_name("DPM++ 2M Karras");
    EXPECT_EQ(r.sampler, SamplerKind::DpmPP2M);
    EXPECT_EQ(r.scheduler, SchedulerKind::Karras);
    EXPECT_TRUE(r.explicit_scheduler);
    r = resolve_sampler_name("DPM++ 2M");  // A1111 1.10: automatic schedule karras
    EXPECT_EQ(r.sampler, SamplerKind::DpmPP2M);
    EXPECT_EQ(r.scheduler, SchedulerKind::Karras);
    EXPECT_FALSE(r.explicit_scheduler);
    r = resolve_sampler_name("dpm++2m");  // easel's name: the model's schedule
    EXPECT_FALSE(r.scheduler.has_value());
    EXPECT_EQ(resolve_sampler_name("Euler a").sampler, SamplerKind::EulerA);
    EXPECT_FALSE(resolve_sampler_name("Euler a").scheduler.has_value());
    EXPECT_EQ(resolve_sampler_name("k_euler_a").sampler, SamplerKind::EulerA);
    EXPECT_EQ(resolve_sampler_name("euler_ancestral").sampler, SamplerKind::EulerA);  // ComfyUI
    r = resolve_sampler_name("DPM++ 2M SDE Karras");
    EXPECT_EQ(r.sampler, SamplerKind::DpmPP2MSdeBt);
    EXPECT_EQ(r.scheduler, SchedulerKind::Karras);
    EXPECT_EQ(resolve_sampler_name("DPM++ 2M SDE").scheduler, SchedulerKind::Exponential);
    EXPECT_EQ(resolve_sampler_name("dpmpp_2m_sde").sampler, SamplerKind::DpmPP2MSdeBt);
    EXPECT_EQ(resolve_sampler_name("DPM++ SDE Karras").sampler, SamplerKind::DpmPPSde);
    EXPECT_EQ(resolve_sampler_name("UniPC").sampler, SamplerKind::UniPc);
    EXPECT_EQ(resolve_sampler_name("DDIM").sampler, SamplerKind::Ddim);
    EXPECT_EQ(resolve_sampler_name("LMS Karras").scheduler, SchedulerKind::Karras);
    EXPECT_EQ(resolve_sampler_name("DPM2 a Karras").sampler, SamplerKind::Dpm2A);
    EXPECT_EQ(resolve_sampler_name("Heun").sampler, SamplerKind::Heun);
    EXPECT_EQ(resolve_sampler_name("LCM").sampler, SamplerKind::Lcm);
    EXPECT_EQ(resolve_sampler_name("dpm++ 2m karras").sampler, SamplerKind::DpmPP2M);  // case-insensitive
    try {
        resolve_sampler_name("DPM adaptive");
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    }
    EXPECT_THROW(resolve_sampler_name("no such sampler"), Error);
    // every row that runs something names a method easel has
    for (const auto& row : sampler_name_table()) {
        if (!row.sampler) continue;
        EXPECT_EQ(resolve_sampler_name(row.label).sampler, *row.sampler) << row.label;
        for (auto a : row.aliases) {
            if (!a.empty()) {
                EXPECT_EQ(resolve_sampler_name(a).sampler, *row.sampler) << a;
            }
        }
    }
    // schedulers
    EXPECT_EQ(resolve_scheduler_name("Karras"), SchedulerKind::Karras);
    EXPECT_EQ(resolve_scheduler_name("SGM Uniform"), SchedulerKind::SgmUniform);
    EXPECT_EQ(resolve_scheduler_name("SGMUniform"), SchedulerKind::SgmUniform);
    EXPECT_EQ(resolve_scheduler_name("align_your_steps"), SchedulerKind::Ays);
    EXPECT_EQ(resolve_scheduler_name("Align Your Steps"), SchedulerKind::Ays);
    EXPECT_EQ(resolve_scheduler_name("normal"), SchedulerKind::Discrete);
    EXPECT_EQ(resolve_scheduler_name("Uniform"), SchedulerKind::Discrete);
    EXPECT_EQ(resolve_scheduler_name("KL Optimal"), SchedulerKind::KlOptimal);
    EXPECT_EQ(resolve_scheduler_name("DDIM"), SchedulerKind::DdimUniform);
    EXPECT_EQ(resolve_scheduler_name("flux2"), SchedulerKind::Flux2);
    EXPECT_FALSE(resolve_scheduler_name("Automatic").has_value());
    EXPECT_THROW(resolve_scheduler_name("bong_tangent"), Error);
    EXPECT_THROW(resolve_scheduler_name("nonsense"), Error);
    // display names back
    EXPECT_EQ(a1111_sampler_label(SamplerKind::DpmPP2M), "DPM++ 2M");
    EXPECT_EQ(a1111_sampler_label(SamplerKind::DpmPP2MSdeBt), "DPM++ 2M SDE");
    EXPECT_EQ(a1111_sampler_label(SamplerKind::DdimTrailing), "ddim_trailing");
    EXPECT_EQ(a1111_scheduler_label(SchedulerKind::Discrete), "Normal");
    EXPECT_EQ(a1111_scheduler_label(SchedulerKind::Ays), "Align Your Steps");
    EXPECT_EQ(a1111_scheduler_label(SchedulerKind::Flux), "Flux");
}
