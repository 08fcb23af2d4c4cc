// The hires fix against diffusers (issue 23): on the tiny SD pipeline (tests/data/reference/sd_tiny),
// easel's `--hires` run equals diffusers' equivalent two passes within 2/255 per pixel:
// StableDiffusionPipeline txt2img to the latent, torch.nn.functional.interpolate of it (A1111's
// latent upscale modes), StableDiffusionImg2ImgPipeline on that latent at the hires strength with
// int(N / strength) steps (diffusers' cut then runs the last N, as easel's hires schedule) and the
// same seed (its one draw, the noise at the new size, is the first draw of that seed, as easel's
// second pass). References: tests/data/reference/hires/hires_cases.json and hires_<case>.{png,
// safetensors}, made by tools/reference/hires_diffusers_reference.py (SOURCE.md there).
#include "e2e_helpers.h"
#include "io/weight_index.h"
#include "pipeline/artifact.h"
#include "pipeline/generate.h"
#include "pipeline/hires.h"
#include "pipeline/image_io.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace easel;
using namespace easel::pipeline;

namespace {

const fs::path kDir = fs::path(EASEL_TEST_DATA) / "reference" / "hires";
const fs::path kModel = fs::path(EASEL_TEST_DATA) / "reference" / "sd_tiny" / "sd_tiny.safetensors";

std::vector<nlohmann::json> all_cases() {
    std::ifstream f(kDir / "hires_cases.json");
    if (!f) return {nlohmann::json{{"name", "missing_hires_cases_json"}}};  // fails in the test body
    const auto j = nlohmann::json::parse(f);
    return {j["cases"].begin(), j["cases"].end()};
}

LatentInterp interp_mode(const std::string& m) {
    if (m == "nearest") return LatentInterp::Nearest;
    if (m == "nearest-exact") return LatentInterp::NearestExact;
    if (m == "bicubic") return LatentInterp::Bicubic;
    return LatentInterp::Bilinear;
}

class HiresDiffusers : public ::testing::TestWithParam<nlohmann::json> {};

}  // namespace

TEST_P(HiresDiffusers, EqualsDiffusersTwoPassWithin2Of255) {
    const nlohmann::json& c = GetParam();
    ASSERT_TRUE(c.contains("png")) << "missing " << (kDir / "hires_cases.json");
    const auto ref = io::WeightIndex::open(kDir / c["tensors"].get<std::string>());

    // the latent upscale itself: interpolate_latent on diffusers' first-pass latent equals torch's
    const auto low = test::read_f32(ref, "lowres_latent"), up_ref = test::read_f32(ref, "upscaled_latent");
    const int64_t h = c["height"].get<int>() / 8, w = c["width"].get<int>() / 8;
    const int64_t uh = c["interpolate"]["size"][0].get<int>(), uw = c["interpolate"]["size"][1].get<int>();
    const auto up = interpolate_latent(low, 4, h, w, uh, uw, interp_mode(c["interpolate"]["mode"]), c["interpolate"]["antialias"].get<bool>());
    EXPECT_EQ(test::max_abs_diff(up, up_ref), 0.0) << "interpolate_latent vs torch (bit for bit: tests/unit/hires_interp_torch_test.cpp)";

    // the whole hires job
    GenerateParams p;
    p.model = kModel.string();
    p.prompt = c["prompt"];
    p.negative_prompt = c["negative_prompt"];
    p.width = c["width"];
    p.height = c["height"];
    p.steps = c["steps"];
    p.cfg_scale = c["cfg_scale"].get<float>();
    p.seed = c["seed"];
    p.sampling_method = c["sampler"];
    p.scheduler = c["scheduler"];
    p.rng = c["rng"];
    p.threads = 1;
    p.no_cache = true;
    p.hires = true;
    p.hires_upscaler = c["hires_upscaler"];
    p.hires_scale = c["hires_scale"].get<float>();
    p.hires_steps = c["hires_steps"];
    p.hires_denoising_strength = c["hires_denoising_strength"].get<float>();
    const fs::path tmp = fs::path(testing::TempDir()) / ("easel_hires_diffusers_" + c["name"].get<std::string>() + "_" + std::to_string(getpid()));
    fs::create_directories(tmp);
    p.output = (tmp / "out.png").string();
    p.save_latent = (tmp / "final.safetensors").string();
    const GenerateReport rep = generate(p);
    EXPECT_EQ(rep.width, c["hires_width"].get<int>());
    EXPECT_EQ(rep.height, c["hires_height"].get<int>());

    // the final latent (before the VAE), reported beside the image check
    const Artifact a = read_artifact(tmp / "final.safetensors", ArtifactKind::Latent);
    const auto fin = a.f32("latent"), fin_ref = test::read_f32(ref, "final_latent");
    const double dlat = test::max_abs_diff(fin, fin_ref);
    const Image got = load_image(tmp / "out.png", 3), want = load_image(kDir / c["png"].get<std::string>(), 3);
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    int maxdiff = 0;
    for (size_t i = 0; i < got.pixels.size(); ++i) maxdiff = std::max(maxdiff, std::abs((int)got.pixels[i] - (int)want.pixels[i]));
    EXPECT_LE(maxdiff, 2) << c["name"] << ": final latent max |diff| " << dlat << " (of " << test::max_abs(fin_ref) << ")";
    std::printf("%s: image max |diff| %d/255, final latent max |diff| %.3g (of %.3g)\n", c["name"].get<std::string>().c_str(), maxdiff, dlat,
                test::max_abs(fin_ref));
    fs::remove_all(tmp);
}

INSTANTIATE_TEST_SUITE_P(Cases, HiresDiffusers, ::testing::ValuesIn(all_cases()), [](const auto& info) {
    std::string n = info.param["name"].template get<std::string>();
    for (auto& ch : n)
        if (!isalnum((unsigned char)ch)) ch = '_';
    return n;
});
