// Sigma schedules against diffusers (tests/data/reference/schedulers.json, made with diffusers
// 0.40.0.dev0 / torch 2.11) and against hand-computed values.
#include "core/error.h"
#include "sampling/schedule.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>

using namespace easel;
using namespace easel::sampling;

namespace {

const nlohmann::json& fixture() {
    static const nlohmann::json j = [] {
        std::ifstream f(std::string(EASEL_TEST_DATA) + "/reference/schedulers.json");
        if (!f) throw std::runtime_error("missing tests/data/reference/schedulers.json");
        std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        // Python's json writes -Infinity (lambda_min_clipped), which is not JSON.
        for (const std::string bad : {"-Infinity", "Infinity", "NaN"})
            for (size_t p = text.find(bad); p != std::string::npos; p = text.find(bad, p))
                text.replace(p, bad.size(), "null");
        return nlohmann::json::parse(text);
    }();
    return j;
}

// Compares a schedule with a fixture entry: sigmas (relative 2e-6 or absolute 1e-7) and
// timesteps (absolute 2e-4, i.e. float32 resolution at ~1000). Returns the max abs errors.
std::pair<double, double> expect_matches(const Schedule& s, const std::string& name, bool check_sigmas = true) {
    const auto& e = fixture()["schedulers"][name];
    const auto ts = e["timesteps"].get<std::vector<double>>();
    EXPECT_EQ(s.timesteps.size(), ts.size()) << name;
    double et = 0, es = 0;
    for (size_t i = 0; i < std::min(ts.size(), s.timesteps.size()); ++i) {
        et = std::max(et, std::abs(s.timesteps[i] - ts[i]));
        EXPECT_NEAR(s.timesteps[i], ts[i], 2e-4) << name << " timestep " << i;
    }
    if (check_sigmas) {
        const auto sg = e["sigmas"].get<std::vector<double>>();
        EXPECT_EQ(s.sigmas.size(), sg.size()) << name;
        for (size_t i = 0; i < std::min(sg.size(), s.sigmas.size()); ++i) {
            es = std::max(es, std::abs(s.sigmas[i] - sg[i]));
            EXPECT_NEAR(s.sigmas[i], sg[i], std::max(1e-7, 2e-6 * std::abs(sg[i]))) << name << " sigma " << i;
        }
    }
    std::printf("[ schedule ] %-38s max |dsigma| %.3g  max |dt| %.3g\n", name.c_str(), es, et);
    return {es, et};
}

ModelSampling sd15() { return ModelSampling::discrete(Prediction::Eps, 0.00085, 0.012, 1000); }

}  // namespace

TEST(SamplingSchedule, TrainingSigmasMatchDiffusers) {
    // The training table's ends are the first/last sigmas of the karras fixture.
    const auto ms = sd15();
    const auto& sg = fixture()["schedulers"]["euler_sd15_karras"]["sigmas"];
    EXPECT_NEAR(ms.sigma_max(), sg[0].get<double>(), 2e-6 * 14.6);
    EXPECT_NEAR(ms.sigma_min(), sg[19].get<double>(), 1e-8);
    EXPECT_EQ(ms.num_timesteps(), 1000);
}

TEST(SamplingSchedule, EulerLinspaceSd15) {
    expect_matches(make_schedule(sd15(), SchedulerKind::Discrete, 20), "euler_sd15");
    expect_matches(make_schedule(sd15(), SchedulerKind::Discrete, 20), "euler_ancestral_sd15");
}

TEST(SamplingSchedule, EulerKarrasSd15FractionalTimesteps) {
    expect_matches(make_schedule(sd15(), SchedulerKind::Karras, 20), "euler_sd15_karras");
}

TEST(SamplingSchedule, EulerLeadingSdxl) {
    ScheduleOptions o;
    o.spacing = Spacing::Leading;
    o.steps_offset = 1;
    expect_matches(make_schedule(sd15(), SchedulerKind::Discrete, 20, o), "euler_sdxl_leading");
}

TEST(SamplingSchedule, TrailingSpacingByHand) {
    // trailing, 4 steps over 1000: round(1000 - i*250) - 1 = 999, 749, 499, 249
    ScheduleOptions o;
    o.spacing = Spacing::Trailing;
    const auto ms = sd15();
    const auto s = make_schedule(ms, SchedulerKind::Discrete, 4, o);
    const float want[4] = {999, 749, 499, 249};
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(s.timesteps[i], want[i]);
        EXPECT_EQ(s.sigmas[i], ms.sigmas()[static_cast<int>(want[i])]);  // integer t: exact table value
    }
    EXPECT_EQ(s.sigmas[4], 0.0f);
}

TEST(SamplingSchedule, DpmSolverSd15) {
    expect_matches(diffusers_dpmsolver_schedule(sd15(), 20, false), "dpmpp_2m_sd15");
    expect_matches(diffusers_dpmsolver_schedule(sd15(), 20, true), "dpmpp_2m_karras_sd15");
}

TEST(SamplingSchedule, LcmTimesteps) {
    expect_matches(make_schedule(sd15(), SchedulerKind::Lcm, 4), "lcm_sd15_4steps", /*check_sigmas=*/false);
}

TEST(SamplingSchedule, FlowMatchShift3Sd3) {
    expect_matches(make_schedule(ModelSampling::flow(3.0), SchedulerKind::Discrete, 20), "flowmatch_shift3");
}

TEST(SamplingSchedule, FlowMatchShift3ZImagePipelineSigmas) {
    ScheduleOptions o;
    o.flow_pipeline_sigmas = true;
    expect_matches(make_schedule(ModelSampling::flow(3.0), SchedulerKind::Discrete, 20, o),
                   "flowmatch_shift3_zimage_pipeline");
}

TEST(SamplingSchedule, FlowMatchDynamicFlux1) {
    const double mu = flux_mu(4096);
    EXPECT_NEAR(mu, 1.15, 1e-12);
    EXPECT_NEAR(flux_mu(256), 0.5, 1e-12);
    ScheduleOptions o;
    o.flow_pipeline_sigmas = true;
    expect_matches(make_schedule(ModelSampling::flow_dynamic(mu), SchedulerKind::Discrete, 20, o),
                   "flowmatch_dynamic_flux1_1024");
}

TEST(SamplingSchedule, FlowMatchDynamicFlux2Klein) {
    ScheduleOptions o;
    o.flow_pipeline_sigmas = true;
    expect_matches(make_schedule(ModelSampling::flow_dynamic(2.1980220725551165), SchedulerKind::Discrete, 20, o),
                   "flowmatch_dynamic_flux2_klein_1024");
}

TEST(SamplingSchedule, FlowShiftFormulasByHand) {
    // shift 3 at s = 0.5: 1.5 / (1 + 2*0.5) = 0.75; dynamic mu = ln 3 at s = 0.5: 3 / (3 + 1) = 0.75
    EXPECT_NEAR(ModelSampling::flow(3.0).flow_shift(0.5), 0.75, 1e-15);
    EXPECT_NEAR(ModelSampling::flow_dynamic(std::log(3.0)).flow_shift(0.5), 0.75, 1e-15);
    const auto ms = ModelSampling::flow(3.0);
    EXPECT_NEAR(ms.sigma_to_t(0.25), 250.0, 1e-12);
    EXPECT_NEAR(ms.t_to_sigma(500.0), 0.75, 1e-12);
    EXPECT_FLOAT_EQ(ms.sigma_max(), 1.0f);
}

TEST(SamplingSchedule, ExponentialIsGeometric) {
    const auto ms = sd15();
    const int n = 5;
    const auto s = make_schedule(ms, SchedulerKind::Exponential, n);
    ASSERT_EQ(s.sigmas.size(), 6u);
    const double ratio = std::pow(static_cast<double>(ms.sigma_min()) / ms.sigma_max(), 1.0 / (n - 1));
    EXPECT_NEAR(s.sigmas[0], ms.sigma_max(), 1e-5);
    for (int i = 1; i < n; ++i) EXPECT_NEAR(s.sigmas[i], s.sigmas[i - 1] * ratio, 2e-6 * s.sigmas[i - 1]);
    EXPECT_NEAR(s.sigmas[n - 1], ms.sigma_min(), 1e-7);
    EXPECT_EQ(s.sigmas[n], 0.0f);
}

TEST(SamplingSchedule, SimpleAndSgmUniformByHand) {
    const auto ms = sd15();
    const auto& tab = ms.sigmas();
    // simple, 4 steps: table[999 - int(i*250)] = t 999, 749, 499, 249
    const auto s = make_schedule(ms, SchedulerKind::Simple, 4);
    const int idx[4] = {999, 749, 499, 249};
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(s.sigmas[i], tab[idx[i]]);
        EXPECT_NEAR(s.timesteps[i], idx[i], 1e-3);
    }
    // sgm_uniform, 4 steps: t = linspace(999, 0, 5)[:-1] = 999, 749.25, 499.5, 249.75,
    // sigma = exp of the log-sigma interpolation
    const auto g = make_schedule(ms, SchedulerKind::SgmUniform, 4);
    const double ts[4] = {999, 749.25, 499.5, 249.75};
    for (int i = 0; i < 4; ++i) {
        const int lo = static_cast<int>(ts[i]);
        const double w = ts[i] - lo;
        const double want = std::exp((1 - w) * std::log(static_cast<double>(tab[lo])) +
                                     w * std::log(static_cast<double>(tab[std::min(lo + 1, 999)])));
        EXPECT_NEAR(g.sigmas[i], want, 2e-6 * want) << i;
        EXPECT_NEAR(g.timesteps[i], ts[i], 2e-3) << i;  // sigma_to_t inverts the interpolation
    }
}

TEST(SamplingSchedule, SigmaToTimestepRoundTrip) {
    const auto ms = sd15();
    for (double t : {0.0, 0.5, 10.25, 500.0, 777.75, 998.5, 999.0}) {
        EXPECT_NEAR(ms.sigma_to_t(ms.t_to_sigma(t)), t, 2e-3) << t;
    }
    // beyond the table: clamped
    EXPECT_NEAR(ms.sigma_to_t(1000.0), 999.0, 1e-9);
    EXPECT_NEAR(ms.sigma_to_t(1e-5), 0.0, 1e-9);
}

TEST(SamplingSchedule, Img2ImgStartStep) {
    EXPECT_EQ(img2img_start_step(20, 0.75), 4);  // t_enc 15: 16 steps from sigma[4]
    EXPECT_EQ(img2img_start_step(20, 1.0), 0);
    EXPECT_EQ(img2img_start_step(20, 0.0), 19);
    EXPECT_THROW(img2img_start_step(20, 1.5), Error);
}

TEST(SamplingSchedule, DdimTrailingEndsAtFirstTrainingSigma) {
    const auto ms = sd15();
    const auto s = ddim_trailing_schedule(ms, 20);
    EXPECT_EQ(s.timesteps[0], 999.0f);
    EXPECT_EQ(s.timesteps[1], 949.0f);
    EXPECT_EQ(s.timesteps[19], 49.0f);
    EXPECT_EQ(s.sigmas[20], ms.sigmas()[0]);
}

TEST(SamplingSchedule, BadInputIsRejected) {
    EXPECT_THROW(make_schedule(sd15(), SchedulerKind::Karras, 0), Error);
    EXPECT_THROW(ModelSampling::flow(-1.0), Error);
    EXPECT_THROW(ModelSampling::discrete(Prediction::Flow), Error);
    EXPECT_THROW(make_schedule(ModelSampling::flow(3.0), SchedulerKind::Lcm, 4), Error);
    EXPECT_EQ(parse_scheduler("Karras"), SchedulerKind::Karras);
    try {
        parse_scheduler("bong_tangent");  // (ays was here before it was implemented)
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    }
    EXPECT_THROW(parse_scheduler("nonsense"), Error);
}

// --scheduler flux: FluxPipeline's calculate_shift + _time_shift_exponential on sigmas
// linspace(1, 1/n, n). By hand: 512x512 = 32x32 tokens = 1024; m = (1.15 - 0.5)/(4096 - 256) =
// 0.65/3840, b = 0.5 - 256*m, mu = 1024*m + b = 0.5 + 768*0.65/3840 = 0.63. With n = 4 the base
// sigmas are 1, 0.75, 0.5, 0.25 and sigma = e^0.63/(e^0.63 + 1/s - 1), e^0.63 = 1.8776106:
// 1, 1.8776106/2.2109439 = 0.8492348, 1.8776106/2.8776106 = 0.6524895, 1.8776106/4.8776106 =
// 0.3849447; timesteps = 1000 * sigma.
TEST(SamplingSchedule, FluxSchedulerByHand) {
    EXPECT_NEAR(flux_mu(1024), 0.63, 1e-12);
    ScheduleOptions o;
    o.image_seq_len = 1024;
    const Schedule s = make_schedule(ModelSampling::flow(1.0), parse_scheduler("flux"), 4, o);
    const double want[] = {1.0, 0.8492348, 0.6524895, 0.3849447, 0.0};
    ASSERT_EQ(s.sigmas.size(), 5u);
    ASSERT_EQ(s.timesteps.size(), 4u);
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(s.sigmas[i], want[i], 2e-7) << i;
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(s.timesteps[i], 1000.0 * want[i], 2e-4) << i;
    // The model's static shift does not apply on top (diffusers: use_dynamic_shifting replaces it).
    const Schedule s3 = make_schedule(ModelSampling::flow(3.0), SchedulerKind::Flux, 4, o);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(s3.sigmas[i], s.sigmas[i]);
    // Other calculate_shift parameters (scheduler_config.json): base 0.5, max 1.15 over 256..4096
    // becomes mu = 0.5 at 256 tokens whatever max_shift is.
    o.image_seq_len = 256;
    o.max_shift = 3.0;
    const Schedule s256 = make_schedule(ModelSampling::flow(1.0), SchedulerKind::Flux, 4, o);
    // mu = 0.5: e^0.5 = 1.6487213; s = 0.5: 1.6487213/2.6487213 = 0.6224593
    EXPECT_NEAR(s256.sigmas[2], 0.6224593, 2e-7);
}

// At 1024x1024 (4096 tokens), 20 steps, --scheduler flux equals diffusers' FluxPipeline
// schedule and flux2 equals Flux2KleinPipeline's (schedulers.json, made by diffusers).
TEST(SamplingSchedule, FluxSchedulersMatchDiffusersAt1024) {
    ScheduleOptions o;
    o.image_seq_len = 4096;
    expect_matches(make_schedule(ModelSampling::flow(1.0), SchedulerKind::Flux, 20, o), "flowmatch_dynamic_flux1_1024");
    expect_matches(make_schedule(ModelSampling::flow(1.0), SchedulerKind::Flux2, 20, o),
                   "flowmatch_dynamic_flux2_klein_1024");
}

// --scheduler flux2: compute_empirical_mu. By hand at 1024 tokens, 4 steps:
// m200 = 0.00016927*1024 + 0.45666666 = 0.62999914, m10 = 8.73809524e-05*1024 + 1.89833333 =
// 1.98781143, a = (m200 - m10)/190 = -0.00714638, mu = 4a + m200 - 200a = m200 - 196a = 2.0306897.
// e^mu = 7.6198...; s = 0.5: e^mu/(e^mu + 1) = 0.8839818; s = 0.25: e^mu/(e^mu + 3) = 0.7174966.
// Above 4300 tokens mu = m200 only: 4356 tokens -> 0.00016927*4356 + 0.45666666 = 1.19400678.
TEST(SamplingSchedule, Flux2SchedulerByHand) {
    EXPECT_NEAR(flux2_empirical_mu(1024, 4), 2.0306897, 1e-6);
    EXPECT_NEAR(flux2_empirical_mu(4096, 20), 2.1980220725551165, 1e-9);
    EXPECT_NEAR(flux2_empirical_mu(4356, 4), 1.19400678, 1e-9);
    EXPECT_NEAR(flux2_empirical_mu(4356, 50), 1.19400678, 1e-9);
    ScheduleOptions o;
    o.image_seq_len = 1024;
    const Schedule s = make_schedule(ModelSampling::flow(1.0), parse_scheduler("flux2"), 4, o);
    const double want[] = {1.0, 0.9580854, 0.8839818, 0.7174966, 0.0};
    ASSERT_EQ(s.sigmas.size(), 5u);
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(s.sigmas[i], want[i], 2e-7) << i;
    EXPECT_STREQ(scheduler_name(SchedulerKind::Flux2), "flux2");
    EXPECT_STREQ(scheduler_name(SchedulerKind::Flux), "flux");
}

TEST(SamplingSchedule, FluxSchedulersRejectBadInput) {
    ScheduleOptions o;  // image_seq_len unknown
    EXPECT_THROW(make_schedule(ModelSampling::flow(1.0), SchedulerKind::Flux, 4, o), Error);
    o.image_seq_len = 1024;
    EXPECT_THROW(make_schedule(ModelSampling::discrete(), SchedulerKind::Flux, 4, o), Error);
    EXPECT_THROW(make_schedule(ModelSampling::discrete(), SchedulerKind::Flux2, 4, o), Error);
    EXPECT_THROW(flux2_empirical_mu(1024, 0), Error);
}
