// An SD1.x .ckpt works like its .safetensors: the tiny SD pipeline's single file
// (tests/data/reference/sd_tiny/sd_tiny.safetensors) saved as a Lightning-style PyTorch checkpoint
// ({'state_dict': ..., 'global_step': N}, zip format, by tests/unit/torch_writer.h), then
// `easel generate -m model.ckpt` must give the PNG diffusers gave within 2/255 (the safetensors
// file's bound in sd_tiny_e2e_test.cpp) and exactly the PNG the safetensors file gives.
#include "io/weight_index.h"
#include "pipeline/image_io.h"
#include "../unit/torch_writer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using easel::pipeline::load_image;

namespace {

std::string quote(const std::string& s) {
    std::string r = "'";
    for (char ch : s) r += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return r + "'";
}

}  // namespace

TEST(SdTinyCkpt, GeneratesLikeTheSafetensorsFile) {
    const fs::path dir = fs::path(EASEL_TEST_DATA) / "reference" / "sd_tiny";
    const fs::path tmp = fs::path(testing::TempDir()) / ("easel_sd_ckpt_" + std::to_string(getpid()));
    fs::create_directories(tmp);
    {
        auto st = easel::io::WeightIndex::open(dir / "sd_tiny.safetensors");
        easel::test::torch_save_file(tmp / "sd_tiny.ckpt", easel::test::tensors_of(st), "state_dict", false, {{"global_step", 470000}});
    }
    const auto cases = nlohmann::json::parse(std::ifstream(dir / "cases.json"));
    const auto& c = cases["cases"][0];  // euler_discrete_a_s0: 64x64, 10 steps
    auto run = [&](const fs::path& model, const fs::path& out) {
        const std::string cmd = std::string(EASEL_BINARY) + " generate -t 1 -m " + quote(model.string()) + " -p " + quote(c["prompt"]) +
                                " -n " + quote(c["negative_prompt"]) + " -W " + std::to_string(c["width"].get<int>()) + " -H " +
                                std::to_string(c["height"].get<int>()) + " --steps " + std::to_string(c["steps"].get<int>()) + " --cfg-scale " +
                                c["cfg_scale"].dump() + " -s " + std::to_string(c["seed"].get<int64_t>()) + " --sampling-method " +
                                c["sampling_method"].get<std::string>() + " --scheduler " + c["scheduler"].get<std::string>() + " --rng " +
                                c["rng"].get<std::string>() + " --no-cache -o " + quote(out.string()) + " > /dev/null 2>&1";
        return std::system(cmd.c_str());
    };
    ASSERT_EQ(run(tmp / "sd_tiny.ckpt", tmp / "ckpt.png"), 0);
    ASSERT_EQ(run(dir / "sd_tiny.safetensors", tmp / "st.png"), 0);
    const auto got = load_image(tmp / "ckpt.png", 3), st = load_image(tmp / "st.png", 3), want = load_image(dir / c["png"].get<std::string>(), 3);
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    int md = 0;
    for (size_t i = 0; i < got.pixels.size(); ++i) md = std::max(md, std::abs((int)got.pixels[i] - (int)want.pixels[i]));
    EXPECT_LE(md, 2);
    EXPECT_EQ(got.pixels, st.pixels);
    fs::remove_all(tmp);
}
