// GGUF SD checkpoints: the tiny SD pipeline's single file rewritten as GGUF (same ldm tensor
// names, some longer than ggml's default 64-byte limit, as in real SD1.x GGUF files) must
// generate the diffusers image: exactly (within 2/255) when every tensor is stored as F16 and
// computed in F32 (--type f32), and closely when the UNet's matmul weights are Q8_0.
#include "io/weight_index.h"
#include "pipeline/image_io.h"

#include <ggml.h>
#include <gguf.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(EASEL_TEST_DATA) / "reference" / "sd_tiny";

/// Writes every tensor of `src` into a GGUF file: F16, or Q8_0 for 2-D UNet weights whose rows
/// are a multiple of 32 when `q8` is set.
void write_gguf(const easel::io::WeightIndex& src, const fs::path& out, bool q8) {
    size_t bytes = 0;
    for (auto& t : src.tensors()) bytes += (size_t)t.numel() * 4 + 1024;
    ggml_init_params ip{bytes, nullptr, false};
    ggml_context* ctx = ggml_init(ip);
    gguf_context* g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", "stable-diffusion");
    for (auto& t : src.tensors()) {
        auto ne = t.ggml_ne();
        int nd = std::max<int>(1, (int)t.shape.size());
        const bool quant = q8 && t.shape.size() == 2 && t.name.rfind("model.diffusion_model.", 0) == 0 && ne[0] % 32 == 0;
        ggml_type type = quant ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
        ggml_tensor* x = ggml_new_tensor(ctx, type, nd, ne.data());
        ggml_set_name(x, t.name.c_str());
        std::vector<float> v = src.read_f32(t);
        if (quant) ggml_quantize_chunk(type, v.data(), x->data, 0, ne[1], ne[0], nullptr);
        else ggml_fp32_to_fp16_row(v.data(), (ggml_fp16_t*)x->data, (int64_t)v.size());
        gguf_add_tensor(g, x);
    }
    ASSERT_TRUE(gguf_write_to_file(g, out.string().c_str(), false));
    gguf_free(g);
    ggml_free(ctx);
}

int max_abs_diff(const easel::pipeline::Image& a, const easel::pipeline::Image& b, double* mean) {
    int m = 0;
    double s = 0;
    for (size_t i = 0; i < a.pixels.size(); ++i) {
        int d = std::abs((int)a.pixels[i] - (int)b.pixels[i]);
        m = std::max(m, d);
        s += d;
    }
    *mean = s / (double)a.pixels.size();
    return m;
}

easel::pipeline::Image run_case0(const fs::path& model, const std::string& extra, const std::string& tag) {
    std::ifstream f(kDir / "cases.json");
    auto c = nlohmann::json::parse(f)["cases"][0];
    // unique per test and process: ctest runs tests in parallel processes
    const fs::path out = fs::path(testing::TempDir()) / ("easel_gguf_case0_" + tag + "_" + std::to_string(getpid()) + ".png");
    fs::remove(out);
    std::string cmd = std::string(EASEL_BINARY) + " generate -t 1 -m '" + model.string() + "' -p '" + c["prompt"].get<std::string>() +
                      "' -W 64 -H 64 --steps " + std::to_string(c["steps"].get<int>()) + " --cfg-scale " + c["cfg_scale"].dump() +
                      " -s " + std::to_string(c["seed"].get<int>()) + " --sampling-method " + c["sampling_method"].get<std::string>() +
                      " --scheduler " + c["scheduler"].get<std::string>() + " --rng cpu " + extra + " -o '" + out.string() + "' > /dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return easel::pipeline::load_image(out, 3);
}

TEST(SdTinyGguf, F16GgufWithLongNamesMatchesDiffusers) {
    auto idx = easel::io::WeightIndex::open(kDir / "sd_tiny.safetensors");
    size_t longest = 0;
    for (auto& t : idx.tensors()) longest = std::max(longest, t.name.size());
    ASSERT_GT(longest, 63u) << "the test needs names past ggml's default limit";
    const fs::path g = fs::path(testing::TempDir()) / ("sd_tiny_f16_" + std::to_string(getpid()) + ".gguf");
    write_gguf(idx, g, false);
    auto got = run_case0(g, "--type f32", "f16");
    auto want = easel::pipeline::load_image(kDir / "case_euler_discrete_a_s0.png", 3);
    double mean = 0;
    EXPECT_LE(max_abs_diff(got, want, &mean), 2);
    fs::remove(g);
}

TEST(SdTinyGguf, Q8UnetGgufStaysClose) {
    auto idx = easel::io::WeightIndex::open(kDir / "sd_tiny.safetensors");
    const fs::path g = fs::path(testing::TempDir()) / ("sd_tiny_q8_" + std::to_string(getpid()) + ".gguf");
    write_gguf(idx, g, true);
    auto gi = easel::io::WeightIndex::open(g);
    int q8 = 0;
    for (auto& t : gi.tensors()) q8 += t.gtype == GGML_TYPE_Q8_0;
    ASSERT_GT(q8, 10) << "no UNet weight was stored as Q8_0";
    auto got = run_case0(g, "", "q8");
    auto want = easel::pipeline::load_image(kDir / "case_euler_discrete_a_s0.png", 3);
    double mean = 0;
    int mx = max_abs_diff(got, want, &mean);
    // Q8_0 weights (and F16 activations in F16 matmuls) move pixels a little: measured mean 0.21,
    // max 2 levels. Two seeds of the same prompt differ by a mean of 4.3 levels, and a wrong
    // dequantisation or layout by tens: the bounds are about twice what was measured.
    std::printf("Q8_0 UNet vs diffusers' F32 image: mean |diff| %.3f, max %d (of 255)\n", mean, mx);
    EXPECT_LE(mean, 0.5) << "max " << mx;
    EXPECT_LE(mx, 4) << "mean " << mean;
    fs::remove(g);
}

}  // namespace
