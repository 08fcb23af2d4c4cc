// End-to-end parity: `easel generate --rng cpu` on the tiny SD pipeline of
// tests/data/reference/sd_tiny (made by tools/reference/make_sd_pipeline.py with diffusers'
// StableDiffusionPipeline / Img2Img / Inpaint pipelines) must give the PNGs diffusers gave,
// within 2/255 per pixel, from the original-layout single file and from the diffusers folder.
#include "pipeline/image_io.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using easel::pipeline::load_image;

namespace {

const fs::path kDir = fs::path(EASEL_TEST_DATA) / "reference" / "sd_tiny";

std::string quote(const std::string& s) {
    std::string r = "'";
    for (char c : s) {
        if (c == '\'') r += "'\\''";
        else r += c;
    }
    return r + "'";
}

struct Case {
    nlohmann::json j;
    std::string model;  // "sd_tiny.safetensors" or "diffusers"
};

class SdTinyE2E : public ::testing::TestWithParam<Case> {};

std::vector<Case> all_cases() {
    std::ifstream f(kDir / "cases.json");
    auto j = nlohmann::json::parse(f);
    std::vector<Case> r;
    for (auto& c : j["cases"])
        for (const char* m : {"sd_tiny.safetensors", "diffusers"}) r.push_back({c, m});
    return r;
}

TEST_P(SdTinyE2E, MatchesDiffusersWithin2Of255) {
    const auto& c = GetParam().j;
    // one file per case and form: ctest runs the tests in parallel processes
    const fs::path out = fs::path(testing::TempDir()) /
                         ("easel_e2e_" + c["name"].get<std::string>() + (GetParam().model == "diffusers" ? "_folder" : "_single") + "_" + std::to_string(getpid()) + ".png");
    std::string cmd = std::string(EASEL_BINARY) + " generate -t 1 -m " + quote((kDir / GetParam().model).string()) +
                      " -p " + quote(c["prompt"]) + " -n " + quote(c["negative_prompt"]) +
                      " -W " + std::to_string(c["width"].get<int>()) + " -H " + std::to_string(c["height"].get<int>()) +
                      " --steps " + std::to_string(c["steps"].get<int>()) + " --cfg-scale " + c["cfg_scale"].dump() +
                      " -s " + std::to_string(c["seed"].get<int64_t>()) + " --sampling-method " + c["sampling_method"].get<std::string>() +
                      " --scheduler " + c["scheduler"].get<std::string>() + " --rng " + c["rng"].get<std::string>() +
                      " -o " + quote(out.string());
    if (c.contains("init_image")) cmd += " -i " + quote((kDir / c["init_image"].get<std::string>()).string());
    if (c.contains("mask_image")) cmd += " --mask " + quote((kDir / c["mask_image"].get<std::string>()).string());
    if (c.contains("strength")) cmd += " --strength " + c["strength"].dump();
    cmd += " > /dev/null 2>&1";
    fs::remove(out);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto got = load_image(out, 3);
    auto want = load_image(kDir / c["png"].get<std::string>(), 3);
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    int maxdiff = 0;
    for (size_t i = 0; i < got.pixels.size(); ++i) maxdiff = std::max(maxdiff, std::abs((int)got.pixels[i] - (int)want.pixels[i]));
    EXPECT_LE(maxdiff, 2) << c["name"] << " from " << GetParam().model;
    fs::remove(out);
}

INSTANTIATE_TEST_SUITE_P(Cases, SdTinyE2E, ::testing::ValuesIn(all_cases()), [](const auto& info) {
    std::string n = info.param.j["name"].template get<std::string>() + (info.param.model == "diffusers" ? "_folder" : "_single");
    for (auto& ch : n)
        if (!isalnum((unsigned char)ch)) ch = '_';
    return n;
});

}  // namespace
