// ESRGAN upscalers against PyTorch: the networks of tools/reference/esrgan_reference.py (RRDBNet x4 /
// x2 (pixel unshuffle) in BasicSR's keys and in the original ESRGAN keys, SRVGGNetCompact x4 / x2),
// random weights saved as Real-ESRGAN ships them (.pth: torch.save of {'params_ema': ...},
// {'params': ...} or a plain state dict), run by torch in float32 on the CPU on one 40x32 image
// (tests/data/reference/esrgan, SOURCE.md). easel reads each .pth through its restricted unpickler
// and runs the network whole on the CPU; the output must equal torch's within float rounding, and
// the same weights given as .safetensors must give the same image bit for bit.
#include "io/weight_index.h"
#include "models/esrgan/placed_upscaler.h"
#include "placement/devices.h"
#include "placement/spec.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

using namespace easel;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(EASEL_TEST_DATA) / "reference" / "esrgan";

vae::HostTensor read4(const fs::path& file, const std::string& name) {
    auto idx = io::WeightIndex::open(file);
    const io::TensorInfo* t = idx.find(name);
    if (!t || t->shape.size() != 4) throw std::runtime_error(file.string() + " lacks a 4-D " + name);
    vae::HostTensor h(t->shape[0], t->shape[1], t->shape[2], t->shape[3]);
    h.data = idx.read_f32(*t);
    return h;
}

vae::HostTensor run(const fs::path& file, const vae::HostTensor& img) {
    placement::init_backends();
    placement::PlacementFlags f;
    f.backend = "upscaler=cpu";
    auto wi = io::WeightIndex::open(file);
    esrgan::PlacedUpscaler up(wi, file.string(), placement::parse_placement(f, placement::device_names()), 1);
    return up.upscale(img, 0);
}

nlohmann::json cases() {
    std::ifstream f(kDir / "cases.json");
    if (!f) throw std::runtime_error("missing " + (kDir / "cases.json").string());
    return nlohmann::json::parse(f);
}

}  // namespace

// Every case of cases.json: the .pth's output against torch's. Measured: max |diff| <= 2.4e-6 on
// outputs of magnitude ~1 (ggml's im2col + matmul vs torch's mkldnn convolution, both float32).
TEST(EsrganTorch, EveryCaseMatchesPyTorch) {
    const vae::HostTensor in = read4(kDir / "input.safetensors", "input");
    int n = 0;
    const nlohmann::json all = cases();  // (items() of a temporary would dangle)
    for (auto& [name, c] : all.items()) {
        SCOPED_TRACE(name);
        const vae::HostTensor want = read4(kDir / (name + "_out.safetensors"), "output");
        const vae::HostTensor got = run(kDir / (name + ".pth"), in);
        ASSERT_EQ(got.c, want.c);
        ASSERT_EQ(got.h, want.h);
        ASSERT_EQ(got.w, want.w);
        ASSERT_EQ(got.h, c["output"][2].get<int64_t>());
        double m = 0, mag = 0;
        for (size_t i = 0; i < want.data.size(); ++i) {
            m = std::max(m, std::abs((double)got.data[i] - (double)want.data[i]));
            mag = std::max(mag, std::abs((double)want.data[i]));
        }
        EXPECT_GT(mag, 0.05) << "the reference output is degenerate";
        EXPECT_LT(m, 1e-4) << name << ": max |easel - torch| " << m;
        ++n;
    }
    EXPECT_EQ(n, 5);
}

// The same weights from .pth (pickle + zip) and .safetensors give the same bytes.
TEST(EsrganTorch, PthAndSafetensorsGiveTheSameImage) {
    const vae::HostTensor in = read4(kDir / "input.safetensors", "input");
    for (const char* name : {"rrdb_x4", "srvgg_x4"}) {
        SCOPED_TRACE(name);
        const vae::HostTensor a = run(kDir / (std::string(name) + ".pth"), in);
        const vae::HostTensor b = run(kDir / (std::string(name) + ".safetensors"), in);
        ASSERT_EQ(a.data.size(), b.data.size());
        EXPECT_EQ(0, std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)));
    }
}
