// tryout finding F19: easel's dpm++2m (karras, 10 steps) and heun (exponential, 6 steps) on the
// zero-terminal-SNR v-prediction schedule of the demo model against diffusers'
// DPMSolverMultistepScheduler(algorithm_type "dpmsolver++", solver_order 2, use_karras_sigmas,
// rescale_betas_zero_snr, final_sigmas_type "zero", lower_order_final) and HeunDiscreteScheduler
// (use_exponential_sigmas, the same betas) in StableDiffusionPipeline (tools/reference/dpm_check.py,
// GPU-machine run device_call_dpm.sh, CPU float32, noise torch.Generator("cpu").manual_seed(42)).
// The network is replayed: at its k-th evaluation the model callback returns the v for which
// D(x; sigma_k) equals diffusers' x0 prediction of that evaluation, so the test checks easel's
// schedule, initial latent, c_skip/c_out and update formulas (k-diffusion sample_dpmpp_2m /
// sample_heun) against diffusers' per-step latents. Both runs end in noise in diffusers too (the
// images are easel's within 1/255, tools/demo-model/README.md); the elements are 12 of the
// [1, 4, 32, 32] latent (every method is elementwise).
#include "sampling/sampler.h"
#include "sampling/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using namespace easel::sampling;

namespace {

// tools/reference/dpm_check.py --emit-cpp: elements [0, 341, 682, 1023, 1364, 1705, 2046, 2387, 2728, 3069, 3410, 3751] of the [1, 4, 32, 32] latent
// dpm_karras_10: sigmas [4095.999755859375, 2105.693115234375, 1009.3702392578125, 443.79229736328125, 174.89376831054688, 59.730552673339844, 16.780120849609375, 3.554028272628784, 0.48227643966674805, 0.029167532920837402, 0.0]
const std::vector<float> kDpmNoise = {1.92691529f, -0.709762335f, 0.52352196f, 1.58175027f, -0.824846566f, -1.54334867f, -0.827649534f, 0.258512169f, -1.15670729f, -2.38911915f, -0.306021363f, 0.143046632f};
const std::vector<float> kDpmX0 = {-0.73185122f, 1.63235188f, 1.15014005f, 0.57005924f, -2.50841188f, -2.28166342f, -2.50483227f, 3.35468125f, 3.69667625f, 2.52075434f, -1.48012841f, -0.461455584f, -0.74245429f, 1.63425314f, 1.16043186f, 0.571244061f, -2.50946975f, -2.28268099f, -2.51048732f, 3.36394358f, 3.69770479f, 2.52753782f, -1.46366107f, -0.46534121f, -0.762122691f, 1.64169669f, 1.17594111f, 0.575374007f, -2.51215196f, -2.29141212f, -2.52407742f, 3.3829875f, 3.70709419f, 2.54009199f, -1.43888009f, -0.472031415f, -0.721534729f, 1.66055942f, 1.14887631f, 0.582086265f, -2.51357269f, -2.30426145f, -2.55168509f, 3.33312249f, 3.71338177f, 2.56929445f, -1.54960918f, -0.466945559f, -0.804797649f, 1.64902329f, 1.13719535f, 0.600422263f, -2.50343466f, -2.33061004f, -2.59345675f, 3.36466384f, 3.74991989f, 2.6164434f, -1.45767927f, -0.470208883f, -1.03046548f, 1.68169177f, 1.08198655f, 0.659542799f, -2.34354949f, -2.30382347f, -2.60169721f, 3.32422233f, 3.60468388f, 2.64186168f, -0.984950244f, -0.555266201f, 0.764682531f, 0.797285795f, 0.838509202f, 0.303418785f, -0.909078777f, -1.09145045f, -1.12558234f, 1.28986478f, 1.41681159f, 1.39514863f, -0.449082255f, -0.492056578f, -2.41089535f, -2.16649628f, -1.42790294f, -0.344446212f, 1.74862742f, 1.822438f, -0.246612638f, -2.53789377f, -3.19946599f, -1.94573033f, 0.58624208f, 0.989369214f, -1.10030127f, -2.27271748f, -1.06257796f, 0.183502018f, 1.05554962f, 0.871586919f, -0.566534638f, -2.01221943f, -3.34132171f, -3.01312041f, 0.395913869f, 0.885631144f, -0.258481145f, -2.36713386f, -0.831927776f, 0.548672736f, 0.613313317f, 0.254295319f, -0.796498597f, -1.6871295f, -3.46415377f, -3.74560022f, 0.27637291f, 0.830945134f};
const std::vector<float> kDpmLatents = {1.92674613f, -0.709385574f, 0.52378732f, 1.58188164f, -0.825425267f, -1.54387498f, -0.82822746f, 0.259286284f, -1.15585411f, -2.38853717f, -0.306362897f, 0.142940134f, 1.92635942f, -0.708541811f, 0.524388611f, 1.58217609f, -0.826719701f, -1.54505205f, -0.829523742f, 0.261024028f, -1.15394616f, -2.38723063f, -0.307113081f, 0.142698959f, 1.92537928f, -0.706462264f, 0.525883257f, 1.58290207f, -0.829891682f, -1.54794812f, -0.832718492f, 0.265308231f, -1.14925659f, -2.38400984f, -0.308911681f, 0.14209795f, 1.92293286f, -0.700662732f, 0.529803097f, 1.58491015f, -0.838591099f, -1.55593503f, -0.841601253f, 0.276753962f, -1.13636386f, -2.37501884f, -0.314493269f, 0.140488297f, 1.91329432f, -0.682472885f, 0.542198002f, 1.59144855f, -0.866016924f, -1.581599f, -0.870349109f, 0.314007431f, -1.09465706f, -2.34558511f, -0.32993713f, 0.135267228f, 1.86038959f, -0.608596921f, 0.586201847f, 1.61856019f, -0.960812032f, -1.67689192f, -0.98042959f, 0.454671919f, -0.942346573f, -2.22810674f, -0.359582782f, 0.109144241f, 2.19152665f, -0.532084405f, 0.712530017f, 1.57912838f, -0.933429062f, -1.69188082f, -0.993133247f, 0.448356748f, -0.8917588f, -2.01346564f, -0.372703046f, 0.00845166203f, -2.47855449f, -3.41127253f, -1.92531884f, 0.119940668f, 2.27131605f, 2.11483598f, -0.199877948f, -3.69073009f, -5.20547581f, -4.09678984f, 0.806791544f, 1.5160774f, -0.335264266f, -2.43336868f, -0.886159778f, 0.528589666f, 0.686611533f, 0.333331108f, -0.756465018f, -1.79071808f, -3.5808413f, -3.80864668f, 0.300428987f, 0.865048409f, -0.258481145f, -2.36713386f, -0.831927776f, 0.548672736f, 0.613313317f, 0.254295319f, -0.796498597f, -1.6871295f, -3.46415377f, -3.74560022f, 0.27637291f, 0.830945134f};
// heun_exp_6: sigmas [4095.999755859375, 382.7082824707031, 382.7082824707031, 35.758216857910156, 35.758216857910156, 3.3410563468933105, 3.3410563468933105, 0.3121704161167145, 0.3121704161167145, 0.029167532920837402, 0.029167532920837402, 0.0]
const std::vector<float> kHeunNoise = {1.92691529f, -0.709762335f, 0.52352196f, 1.58175027f, -0.824846566f, -1.54334867f, -0.827649534f, 0.258512169f, -1.15670729f, -2.38911915f, -0.306021363f, 0.143046632f};
const std::vector<float> kHeunX0 = {-2.24782419f, -2.34922171f, -0.497709721f, -0.588710487f, 1.35885274f, 0.876070917f, 0.168831795f, -0.806648433f, -0.599151433f, 0.438418597f, 1.03118062f, -0.0564540215f, -2.20549583f, -2.32446313f, -0.495198876f, -0.586000621f, 1.34533405f, 0.876719594f, 0.154524282f, -0.792095065f, -0.615395129f, 0.457584858f, 1.02267468f, -0.0513625741f, -2.20649457f, -2.32391596f, -0.494768709f, -0.586089015f, 1.3457166f, 0.876460314f, 0.154772654f, -0.79298979f, -0.615103066f, 0.456741393f, 1.02217221f, -0.0517751686f, -2.2133882f, -3.22839689f, -0.116697319f, -0.485429168f, 1.855937f, 0.8661533f, 0.0582571477f, -1.47001207f, -0.829746604f, 0.371263891f, 1.27665544f, -0.337841541f, -1.92976987f, -3.09239364f, -0.0603243746f, -0.553441226f, 1.94900918f, 0.720020771f, 0.0105660185f, -1.54484057f, -0.583940864f, 0.410162866f, 1.26111722f, -0.3280707f, 0.122419909f, -1.86106277f, 0.196885139f, -0.22492975f, 1.41801322f, 0.205114901f, -0.321821004f, -1.91270375f, -0.693597913f, 0.0896183848f, 1.32723844f, -0.530214608f, 1.15183902f, -0.526537836f, -0.501374841f, -0.414357603f, 1.04802644f, 1.21312523f, 0.216896266f, -1.92974508f, -2.06156635f, -1.39293289f, -0.291554719f, -0.466509432f, 2.40035725f, 0.43292585f, 0.543625176f, 0.876345873f, -0.499501824f, -0.549962521f, -0.601010203f, -0.52474463f, -0.73860383f, -1.1857022f, -0.401758283f, -0.852966905f, 7.28694963f, 3.54356313f, 4.36351538f, 5.40528965f, -5.4261117f, -6.7446909f, -3.50732422f, 3.60011959f, 2.90853667f, -0.785244167f, -0.768932402f, -2.09910178f, 7.343894f, 3.57620025f, 4.4102993f, 5.44783258f, -5.47879839f, -6.79958868f, -3.53060436f, 3.6378293f, 2.9473536f, -0.793973982f, -0.773741841f, -2.12308693f, 7.62215328f, 3.73523021f, 4.63837194f, 5.65500116f, -5.73424292f, -7.07190084f, -3.64745331f, 3.82120156f, 3.13822508f, -0.833242357f, -0.798933625f, -2.23962903f};
const std::vector<float> kHeunLatents = {735.408203f, -273.761475f, 199.904785f, 604.814941f, -314.443604f, -589.85791f, -316.595215f, 98.2034302f, -443.224121f, -913.9375f, -116.182129f, 54.6939087f, 735.616211f, -273.642334f, 199.918091f, 604.82959f, -314.509766f, -589.855957f, -316.664795f, 98.274231f, -443.305176f, -913.848633f, -116.223022f, 54.718811f, 66.7316895f, -27.6744385f, 18.2307434f, 55.9807739f, -28.1661377f, -54.3184204f, -29.4471436f, 8.46331787f, -41.9776917f, -84.9710083f, -9.9325943f, 5.0656929f, 66.6983643f, -32.0624695f, 20.0648499f, 56.468811f, -25.6908264f, -54.3684082f, -29.9154053f, 5.17888641f, -43.0189819f, -85.3860474f, -8.69799805f, 3.67790604f, 4.48247528f, -5.79920197f, 1.82006454f, 4.77441406f, -0.633508682f, -4.42714691f, -2.78555489f, -0.916611671f, -4.5488472f, -7.60617828f, 0.330590248f, 0.046226263f, 14.4383354f, 0.1743927f, 3.067873f, 6.36812592f, -3.20955086f, -6.92512894f, -4.39808464f, -2.70123768f, -5.08081055f, -9.16123962f, 0.651370049f, -0.934440613f, 2.39325905f, -0.461046636f, -0.167883158f, 0.219361305f, 0.650221109f, 0.452730179f, -0.214303017f, -2.00182915f, -2.34366846f, -2.11876202f, -0.203452766f, -0.510230422f, 8.45023346f, 4.19363213f, 4.90175962f, 6.48099518f, -6.85735512f, -8.10059643f, -4.18223953f, 4.81429672f, 4.0744648f, -1.11341572f, -0.738087654f, -2.3850646f, 7.39564085f, 3.60430217f, 4.41380596f, 5.50579786f, -5.55983925f, -6.87137938f, -3.57038474f, 3.71356583f, 3.01747465f, -0.815906763f, -0.766050458f, -2.12582064f, 7.67189598f, 3.76263523f, 4.64077091f, 5.71218777f, -5.81544113f, -7.13770723f, -3.68332434f, 3.89650822f, 3.20578909f, -0.858258009f, -0.789382517f, -2.24218059f, 7.62215328f, 3.73523021f, 4.63837194f, 5.65500116f, -5.73424292f, -7.07190084f, -3.64745331f, 3.82120156f, 3.13822508f, -0.833242357f, -0.798933625f, -2.23962903f};

// max_rel: the error of each step over the largest |x| of the step before it (diffusers computes
// in float32, so its own rounding is a few ulp of that: x ~ 4096*noise on the first step).
struct Replay {
    double max_abs = 0, max_rel = 0;
};

// Runs kind on sched from x = sigma_0*noise with the replayed network; eval_sigmas[k] is the sigma
// of evaluation k, x0 the reference x0 of every evaluation ([evals, 12]), want the reference latent
// after every step ([steps, 12]), vp: diffusers keeps alpha*x (DPM-Solver), else x itself.
Replay replay(SamplerKind kind, const Schedule& sched, const std::vector<double>& eval_sigmas, const std::vector<float>& noise,
              const std::vector<float>& x0, const std::vector<float>& want, bool vp) {
    const auto ms = ModelSampling::discrete(Prediction::V, 0.00085, 0.012, 1000, true);
    const size_t n = noise.size();
    EXPECT_EQ(x0.size(), eval_sigmas.size() * n);
    EXPECT_EQ(want.size(), static_cast<size_t>(sched.steps()) * n);
    size_t k = 0;
    Denoiser* dp = nullptr;
    ModelFn model = [&](std::span<const float> x_in, double, Branch, std::span<float> out) {
        ASSERT_LT(k, eval_sigmas.size());
        const auto sc = dp->scalings(eval_sigmas[k]);
        for (size_t i = 0; i < n; ++i) {
            const double x = x_in[i] / sc.c_in;
            out[i] = static_cast<float>((x0[k * n + i] - sc.c_skip * x) / sc.c_out);
        }
        ++k;
    };
    Denoiser den(ms, model, 1.0f);
    dp = &den;
    Sampler s(kind, sched, {1, 1, 1, static_cast<int64_t>(n)}, noise_latent({}, noise, sched.initial_sigma(), false),
              Rng(RngKind::Cpu, 0), false);
    Replay r;
    int step = 0;
    double scale = 0;  // largest |x| before the step
    for (float v : s.state().x) scale = std::max(scale, std::abs(double(v)));
    s.run(den, [&](const SamplerState& st) {
        const double sn = st.sigmas[static_cast<size_t>(st.step)];
        double next_scale = 0;
        for (size_t i = 0; i < n; ++i) {
            const double ref = want[static_cast<size_t>(step) * n + i] * (vp ? std::sqrt(sn * sn + 1.0) : 1.0);
            const double e = std::abs(st.x[i] - ref);
            r.max_abs = std::max(r.max_abs, e);
            r.max_rel = std::max(r.max_rel, e / std::max(1.0, scale));
            next_scale = std::max(next_scale, std::abs(ref));
        }
        scale = next_scale;
        ++step;
    });
    EXPECT_EQ(k, eval_sigmas.size());
    return r;
}

}  // namespace

TEST(SamplingZsnrDiffusers, DpmPP2MKarras10MatchesDiffusers) {
    const auto ms = ModelSampling::discrete(Prediction::V, 0.00085, 0.012, 1000, true);
    const Schedule sched = diffusers_dpmsolver_schedule(ms, 10, true);  // what easel's pipeline runs for dpm++2m karras
    std::vector<double> ev(sched.sigmas.begin(), sched.sigmas.end() - 1);
    const Replay r = replay(SamplerKind::DpmPP2M, sched, ev, kDpmNoise, kDpmX0, kDpmLatents, true);
    std::printf("[ zsnr/diffusers ] dpm++2m karras 10: max |x - diffusers| %.3g (%.3g of the largest |x| before the step)\n", r.max_abs, r.max_rel);
    EXPECT_LE(r.max_rel, 2e-6);
}

TEST(SamplingZsnrDiffusers, HeunExponential6MatchesDiffusers) {
    const auto ms = ModelSampling::discrete(Prediction::V, 0.00085, 0.012, 1000, true);
    const Schedule sched = make_schedule(ms, SchedulerKind::Exponential, 6);
    // Heun evaluates at sigma_0, then (predictor, next step) at every later sigma but the last 0.
    std::vector<double> ev{sched.sigmas[0]};
    for (int i = 1; i < sched.steps(); ++i) ev.insert(ev.end(), {sched.sigmas[i], sched.sigmas[i]});
    // diffusers returns a latent after every evaluation: the full steps are the corrector outputs
    // (odd indices) and the last (Euler to 0).
    std::vector<float> full;
    const size_t n = kHeunNoise.size(), evals = kHeunLatents.size() / n;
    for (size_t e = 0; e < evals; ++e)
        if (e % 2 == 1 || e + 1 == evals) full.insert(full.end(), kHeunLatents.begin() + e * n, kHeunLatents.begin() + (e + 1) * n);
    const Replay r = replay(SamplerKind::Heun, sched, ev, kHeunNoise, kHeunX0, full, false);
    std::printf("[ zsnr/diffusers ] heun exponential 6: max |x - diffusers| %.3g (%.3g of the largest |x| before the step)\n", r.max_abs, r.max_rel);
    EXPECT_LE(r.max_rel, 2e-6);
}
