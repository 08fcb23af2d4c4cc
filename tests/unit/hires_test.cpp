// The hires fix's pieces without a model (pipeline/hires.h): latent interpolation against values
// computed by hand from torch.nn.functional.interpolate's formulas, the target size and crop of
// A1111's calculate_target_resolution, the second pass's schedule cut, the upscaler names and
// the infotext fields.
#include "core/error.h"
#include "pipeline/generate_params.h"
#include "pipeline/hires.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace easel::pipeline;
namespace fs = std::filesystem;

namespace {

std::vector<float> interp1(std::vector<float> row, int64_t out, LatentInterp m, bool aa = false) {
    return interpolate_latent(row, 1, 1, (int64_t)row.size(), 1, out, m, aa);
}

}  // namespace

TEST(Hires, BilinearMatchesTorchByHand) {
    // F.interpolate([[0, 1], [2, 3]], size=(4, 4), mode="bilinear"): source x = 0.5 (i + 0.5) - 0.5
    // clamped at 0 -> 0, 0.25, 0.75, 1 (the last tap repeats the edge)
    const std::vector<float> x{0, 1, 2, 3};
    const auto y = interpolate_latent(x, 1, 2, 2, 4, 4, LatentInterp::Bilinear, false);
    const std::vector<float> want{0, 0.25f, 0.75f, 1, 0.5f, 0.75f, 1.25f, 1.5f, 1.5f, 1.75f, 2.25f, 2.5f, 2, 2.25f, 2.75f, 3};
    EXPECT_EQ(y, want);
    // antialias changes nothing when upscaling (the triangle's support is one source pixel)
    EXPECT_EQ(interpolate_latent(x, 1, 2, 2, 4, 4, LatentInterp::Bilinear, true), want);
    // two channels are interpolated independently
    const std::vector<float> x2{0, 1, 2, 3, 10, 10, 10, 10};
    const auto y2 = interpolate_latent(x2, 2, 2, 2, 4, 4, LatentInterp::Bilinear, false);
    EXPECT_EQ(std::vector<float>(y2.begin(), y2.begin() + 16), want);
    for (size_t i = 16; i < 32; ++i) EXPECT_EQ(y2[i], 10.0f);
}

TEST(Hires, NearestModes) {
    // 3 -> 4: nearest floor(i * 0.75) = 0, 0, 1, 2; nearest-exact floor((i + 0.5) * 0.75) = 0, 1, 1, 2
    EXPECT_EQ(interp1({5, 6, 7}, 4, LatentInterp::Nearest), (std::vector<float>{5, 5, 6, 7}));
    EXPECT_EQ(interp1({5, 6, 7}, 4, LatentInterp::NearestExact), (std::vector<float>{5, 6, 6, 7}));
    EXPECT_EQ(interp1({5, 6}, 4, LatentInterp::Nearest), (std::vector<float>{5, 5, 6, 6}));
}

TEST(Hires, BicubicMatchesTorchByHand) {
    // A = -0.75; [0, 1] -> 4: source -0.25, 0.25, 0.75, 1.25, taps clamped to the edges:
    // w(t=0.25) = [-0.10546875, 0.87890625, 0.26171875, -0.03515625]
    const auto y = interp1({0, 1}, 4, LatentInterp::Bicubic);
    EXPECT_EQ(y, (std::vector<float>{-0.10546875f, 0.2265625f, 0.7734375f, 1.10546875f}));
}

TEST(Hires, AntialiasedDownscaleMatchesTorchByHand) {
    // bilinear, antialias, [0, 1, 2, 3] -> 2: support 2, weights [3, 3, 1] / 7 and [1, 3, 3] / 7
    const auto y = interp1({0, 1, 2, 3}, 2, LatentInterp::Bilinear, true);
    ASSERT_EQ(y.size(), 2u);
    EXPECT_NEAR(y[0], 5.0 / 7.0, 1e-6);
    EXPECT_NEAR(y[1], 16.0 / 7.0, 1e-6);
    // bicubic antialias (a = -0.5) keeps a constant constant and is symmetric
    const auto c = interp1({2, 2, 2, 2, 2, 2}, 4, LatentInterp::Bicubic, true);
    for (float v : c) EXPECT_NEAR(v, 2.0f, 1e-6);
    const auto r = interp1({0, 1, 2, 3, 4, 5}, 3, LatentInterp::Bicubic, true);
    EXPECT_NEAR(r[1], 2.5f, 1e-6);
    EXPECT_NEAR(r[0] + r[2], 5.0f, 1e-5);
}

TEST(Hires, CropLatent) {
    std::vector<float> x(2 * 3 * 4);
    for (size_t i = 0; i < x.size(); ++i) x[i] = (float)i;
    const auto c = crop_latent(x, 2, 3, 4, 1, 1, 2, 2);
    EXPECT_EQ(c, (std::vector<float>{5, 6, 9, 10, 17, 18, 21, 22}));
    EXPECT_THROW(crop_latent(x, 2, 3, 4, 3, 0, 2, 2), easel::Error);
}

TEST(Hires, TargetAsA1111) {
    auto t = hires_target(512, 512, 2.0, 0, 0, 8, 8);
    EXPECT_EQ(t.width, 1024);
    EXPECT_EQ(t.height, 1024);
    EXPECT_EQ(t.up_width, 1024);
    EXPECT_EQ(t.crop_x + t.crop_y, 0);
    EXPECT_EQ(t.info_key, "Hires upscale");
    EXPECT_EQ(t.info_value, "2");
    t = hires_target(512, 768, 1.5, 0, 0, 8, 8);
    EXPECT_EQ(t.width, 768);
    EXPECT_EQ(t.height, 1152);
    EXPECT_EQ(t.info_value, "1.5");
    // one side: the other from the aspect ratio
    t = hires_target(512, 768, 2.0, 1024, 0, 8, 8);
    EXPECT_EQ(t.width, 1024);
    EXPECT_EQ(t.height, 1536);
    EXPECT_EQ(t.info_key, "Hires resize");
    EXPECT_EQ(t.info_value, "1024x0");
    // both: cover 1024x1024 (1024x1536), then a centre crop of (1536 - 1024) / 8 = 64 cells in y
    t = hires_target(512, 768, 2.0, 1024, 1024, 8, 8);
    EXPECT_EQ(t.up_width, 1024);
    EXPECT_EQ(t.up_height, 1536);
    EXPECT_EQ(t.width, 1024);
    EXPECT_EQ(t.height, 1024);
    EXPECT_EQ(t.crop_x, 0);
    EXPECT_EQ(t.crop_y, 32);
    // rounded down to the model's multiple (FLUX: 16)
    t = hires_target(512, 512, 1.3, 0, 0, 16, 8);
    EXPECT_EQ(t.width, 656);  // int(665.6) = 665 -> 656
    EXPECT_THROW(hires_target(512, 512, 0.0, 0, 0, 8, 8), easel::Error);
    EXPECT_THROW(hires_target(512, 512, 64.0, 0, 0, 8, 8), easel::Error);  // 32768 px
    EXPECT_THROW(hires_target(512, 512, 2.0, -1, 0, 8, 8), easel::Error);
}

TEST(Hires, ScheduleRunsTheHiresStepsAsA1111) {
    // setup_img2img_steps with steps given: int(N / min(strength, 0.999)) steps, the last N run
    auto s = hires_schedule(20, 0.7);
    EXPECT_EQ(s.schedule_steps, 28);
    EXPECT_EQ(s.start, 8);
    EXPECT_EQ(s.run, 20);
    s = hires_schedule(4, 0.5);
    EXPECT_EQ(s.schedule_steps, 8);
    EXPECT_EQ(s.start, 4);
    s = hires_schedule(10, 1.0);  // 10 / 0.999 = 10.01
    EXPECT_EQ(s.schedule_steps, 10);
    EXPECT_EQ(s.start, 0);
    s = hires_schedule(7, 0.7);  // 7 / 0.7 = 10.000000000000002 in double, as Python
    EXPECT_EQ(s.schedule_steps, 10);
}

TEST(Hires, UpscalerNames) {
    auto u = resolve_hires_upscaler("latent (bicubic antialiased)", "", "");
    EXPECT_TRUE(u.is_latent());
    EXPECT_EQ(u.mode, LatentInterp::Bicubic);
    EXPECT_TRUE(u.antialias);
    EXPECT_EQ(u.name, "Latent (bicubic antialiased)");
    EXPECT_EQ(resolve_hires_upscaler("Latent", "", "").mode, LatentInterp::Bilinear);
    EXPECT_EQ(resolve_hires_upscaler("Lanczos", "", "").kind, HiresUpscaler::Kind::Lanczos);
    EXPECT_EQ(resolve_hires_upscaler("Nearest", "", "").kind, HiresUpscaler::Kind::Nearest);
    EXPECT_EQ(builtin_hires_upscalers().size(), 8u);
    // a model by name in the folder, or the --upscale-model file by its stem
    const fs::path dir = fs::path(EASEL_TEST_DATA) / "esrgan";
    u = resolve_hires_upscaler("srvgg_x2_tiny", dir.string(), "");
    EXPECT_EQ(u.kind, HiresUpscaler::Kind::Model);
    EXPECT_EQ(u.name, "srvgg_x2_tiny");
    EXPECT_EQ(fs::path(u.model_path).filename(), "srvgg_x2_tiny.safetensors");
    u = resolve_hires_upscaler("rrdb_x2_tiny", "", (dir / "rrdb_x2_tiny.pth").string());
    EXPECT_EQ(u.kind, HiresUpscaler::Kind::Model);
    try {
        resolve_hires_upscaler("R-ESRGAN 4x+", dir.string(), "");
        FAIL() << "an unknown name was accepted";
    } catch (const easel::Error& e) {
        EXPECT_NE(std::string(e.what()).find("hires upscaler \"R-ESRGAN 4x+\": not one of \"Latent\""), std::string::npos) << e.what();
    }
    // a name cannot climb out of the folder
    EXPECT_THROW(resolve_hires_upscaler("../esrgan/srvgg_x2_tiny", dir.string(), ""), easel::Error);
}

TEST(Hires, InfotextFields) {
    const auto t = hires_target(64, 64, 2.0, 0, 0, 8, 8);
    auto f = hires_infotext_fields(t, 4, resolve_hires_upscaler("Latent", "", ""));
    ASSERT_EQ(f.size(), 3u);
    EXPECT_EQ(f[0], (std::pair<std::string, std::string>{"Hires upscale", "2"}));
    EXPECT_EQ(f[1], (std::pair<std::string, std::string>{"Hires steps", "4"}));
    EXPECT_EQ(f[2], (std::pair<std::string, std::string>{"Hires upscaler", "Latent"}));
    f = hires_infotext_fields(t, 0, resolve_hires_upscaler("Lanczos", "", ""));
    ASSERT_EQ(f.size(), 2u);  // no "Hires steps" when the first pass's are reused
}

TEST(Hires, FlagChecks) {
    GenerateParams p;
    p.hires = true;
    EXPECT_NO_THROW(check_hires_flags(p));
    p.hires_denoising_strength = 0;
    EXPECT_THROW(check_hires_flags(p), easel::Error);
    p.hires_denoising_strength = 0.7f;
    p.hires_scale = -1;
    EXPECT_THROW(check_hires_flags(p), easel::Error);
    p.hires_width = 1024;  // a size makes the scale unused
    EXPECT_NO_THROW(check_hires_flags(p));
    p.hires_sigmas = "0.5";
    EXPECT_THROW(check_hires_flags(p), easel::Error);
    p.hires_sigmas = "0.5,0.2,0";
    EXPECT_NO_THROW(check_hires_flags(p));
}
