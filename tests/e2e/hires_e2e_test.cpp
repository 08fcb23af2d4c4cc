// The hires fix on the tiny SD pipeline (tests/data/reference/sd_tiny) equals, bit for bit, the
// composition of easel's own steps: a 64x64 generate (its latent saved, or its PNG), the same
// upscale done outside (interpolate_latent on the saved latent; the ESRGAN upscaler or PIL's
// Lanczos on the PNG), then an img2img from that at the same seed, with --steps int(N / strength)
// and --strength (at 0.5 diffusers' cut int(8 * 0.5) = 4 equals A1111's "run the last N = 4").
// And the PNG carries A1111's hires fields.
#include "core/error.h"
#include "pipeline/artifact.h"
#include "pipeline/generate.h"
#include "pipeline/hires.h"
#include "pipeline/image_io.h"
#include "pipeline/png_meta.h"
#include "pipeline/stages.h"
#include "pipeline/upscale.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace easel::pipeline;

namespace {

struct HiresE2E : ::testing::Test {
    fs::path data = fs::path(EASEL_TEST_DATA);
    fs::path tmp;
    void SetUp() override {
        tmp = fs::path(testing::TempDir()) / ("easel_hires_" + std::to_string(getpid()));
        fs::create_directories(tmp);
    }
    void TearDown() override { fs::remove_all(tmp); }

    /// The first pass's settings: 64x64, 4 steps of euler (deterministic), CFG 7, seed 7.
    GenerateParams base() const {
        GenerateParams p;
        p.model = (data / "reference" / "sd_tiny" / "sd_tiny.safetensors").string();
        p.prompt = "a red circle";
        p.negative_prompt = "blurry";
        p.width = p.height = 64;
        p.steps = 4;
        p.seed = 7;
        p.sampling_method = "euler_a";  // ancestral: the second pass's noise draws matter too
        p.threads = 1;
        p.no_cache = true;
        return p;
    }
    GenerateParams hires(const std::string& upscaler) const {
        GenerateParams p = base();
        p.hires = true;
        p.hires_upscaler = upscaler;
        p.hires_steps = 4;
        p.hires_denoising_strength = 0.5f;
        return p;
    }
    /// img2img of the composition: 8 steps at strength 0.5 run the last 4.
    GenerateParams second(const GenerateParams& first) const {
        GenerateParams p = first;
        p.width = p.height = 128;
        p.steps = 8;
        p.strength = 0.5f;
        return p;
    }
};

}  // namespace

TEST_F(HiresE2E, LatentEqualsTheComposition) {
    GenerateParams h = hires("Latent");
    h.output = (tmp / "hires.png").string();
    const auto rep = generate(h);
    EXPECT_EQ(rep.width, 128);
    EXPECT_EQ(rep.height, 128);

    GenerateParams low = base();
    low.output = (tmp / "low.png").string();
    low.save_latent = (tmp / "low.safetensors").string();
    generate(low);
    Artifact a = read_artifact(tmp / "low.safetensors", ArtifactKind::Latent);
    const auto* t = a.find("latent");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->shape, (std::vector<int64_t>{1, 4, 8, 8}));
    const auto up = interpolate_latent(a.f32("latent"), 4, 8, 8, 16, 16, LatentInterp::Bilinear, false);
    a.tensors.clear();
    a.add_f32("latent", {1, 4, 16, 16}, up);
    write_artifact(tmp / "up.safetensors", a);
    GenerateParams c = second(base());
    c.load_latent = (tmp / "up.safetensors").string();
    c.output = (tmp / "composed.png").string();
    generate(c);

    const Image hi = load_image(tmp / "hires.png", 3), co = load_image(tmp / "composed.png", 3);
    ASSERT_EQ(hi.width, 128);
    ASSERT_EQ(hi.height, 128);
    EXPECT_EQ(hi.pixels, co.pixels) << "the hires fix differs from generate -> interpolate -> img2img";

    const auto text = find_png_text(read_png_text(tmp / "hires.png"), "parameters");
    ASSERT_TRUE(text.has_value());
    EXPECT_NE(text->find("Size: 64x64, "), std::string::npos) << *text;
    EXPECT_NE(text->find("Denoising strength: 0.5, "), std::string::npos) << *text;
    EXPECT_NE(text->find("Hires upscale: 2, Hires steps: 4, Hires upscaler: Latent, "), std::string::npos) << *text;
}

TEST_F(HiresE2E, InitImageGivesAnImg2ImgFirstPass) {
    // -i with --hires (as sd-cli): the first pass is the img2img of the image at its size, then the
    // hires pass on its latent; equal to img2img -> interpolate -> img2img done one by one
    const std::string init = (data / "reference" / "sd_tiny" / "case_init_image.png").string();
    GenerateParams h = hires("Latent");
    h.init_img = init;
    h.strength = 0.6f;
    h.output = (tmp / "hires.png").string();
    const auto rep = generate(h);
    EXPECT_EQ(rep.width, 128);

    GenerateParams low = base();
    low.init_img = init;
    low.strength = 0.6f;
    low.output = (tmp / "low.png").string();
    low.save_latent = (tmp / "low.safetensors").string();
    generate(low);
    Artifact a = read_artifact(tmp / "low.safetensors", ArtifactKind::Latent);
    const auto up = interpolate_latent(a.f32("latent"), 4, 8, 8, 16, 16, LatentInterp::Bilinear, false);
    a.tensors.clear();
    a.add_f32("latent", {1, 4, 16, 16}, up);
    write_artifact(tmp / "up.safetensors", a);
    GenerateParams c = second(base());
    c.load_latent = (tmp / "up.safetensors").string();
    c.output = (tmp / "composed.png").string();
    generate(c);
    EXPECT_EQ(load_image(tmp / "hires.png", 3).pixels, load_image(tmp / "composed.png", 3).pixels)
        << "-i --hires differs from img2img -> interpolate -> img2img";
}

TEST_F(HiresE2E, EsrganAndLanczosEqualTheComposition) {
    const fs::path model = data / "esrgan" / "srvgg_x2_tiny.safetensors";
    GenerateParams low = base();
    low.output = (tmp / "low.png").string();
    generate(low);
    for (const std::string up : {"srvgg_x2_tiny", "Lanczos"}) {
        SCOPED_TRACE(up);
        GenerateParams h = hires(up);
        h.hires_upscalers_dir = (data / "esrgan").string();
        h.output = (tmp / "hires.png").string();
        generate(h);

        // the same upscale outside: easel upscale (x2: exactly the target) or PIL's Lanczos
        if (up == "Lanczos") {
            save_png(tmp / "up.png", resize_lanczos_pil(load_image(tmp / "low.png", 3), 128, 128), {});
        } else {
            UpscaleOptions o;
            o.model = model.string();
            o.threads = 1;
            upscale_file((tmp / "low.png").string(), (tmp / "up.png").string(), o);
        }
        GenerateParams c = second(base());
        c.init_img = (tmp / "up.png").string();
        c.output = (tmp / "composed.png").string();
        generate(c);
        const Image hi = load_image(tmp / "hires.png", 3), co = load_image(tmp / "composed.png", 3);
        ASSERT_EQ(hi.width, 128);
        EXPECT_EQ(hi.pixels, co.pixels) << "the hires fix differs from generate -> upscale -> img2img";
        const auto text = find_png_text(read_png_text(tmp / "hires.png"), "parameters");
        ASSERT_TRUE(text.has_value());
        EXPECT_NE(text->find("Hires upscaler: " + up), std::string::npos) << *text;
    }
}

TEST_F(HiresE2E, CheckpointsAndResumeOfTheSecondPass) {
    // --checkpoint-dir: the second pass's checkpoints in DIR/hires; --resume after the second
    // pass's step 2 (its later checkpoints removed, as a crash there would leave them) gives the
    // same image
    GenerateParams h = hires("Latent");
    h.checkpoint_dir = (tmp / "ckpt").string();
    h.output = (tmp / "a.png").string();
    generate(h);
    auto files = list_checkpoints(tmp / "ckpt" / "hires", 0);
    ASSERT_EQ(files.size(), 4u);  // the last 4 of 8 steps
    fs::remove(files[0]);
    fs::remove(files[1]);
    h.resume = true;
    h.output = (tmp / "b.png").string();
    generate(h);
    EXPECT_EQ(load_image(tmp / "a.png", 3).pixels, load_image(tmp / "b.png", 3).pixels);
}

TEST_F(HiresE2E, BadInputIsOneLine) {
    GenerateParams h = hires("R-ESRGAN 4x+");
    h.output = (tmp / "x.png").string();
    try {
        generate(h);
        FAIL() << "an unknown hires upscaler ran";
    } catch (const easel::Error& e) {
        EXPECT_NE(std::string(e.what()).find("hires upscaler \"R-ESRGAN 4x+\""), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(tmp / "x.png"));
    h = hires("Latent");
    h.hires_denoising_strength = 1.5f;
    EXPECT_THROW(generate(h), easel::Error);
    h = hires("Latent");
    h.hires_scale = 1000.0f;
    EXPECT_THROW(generate(h), easel::Error);
}
