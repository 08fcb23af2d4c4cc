// ESRGAN upscalers (models/esrgan, models/esrgan/placed_upscaler.h): configs inferred from every key layout,
// the ggml networks against a double-precision implementation written from the published
// definitions (esrgan_reference.h) on the random-weight files of tests/data/esrgan (made by
// tools/make-malformed/esrgan_files.py), the old ESRGAN keys giving the BasicSR ones' image bit
// for bit, tiled equal to whole, pixel (un)shuffle, refusals, and the placement module's
// measured peak against its plan.
#include "core/error.h"
#include "esrgan_reference.h"
#include "io/weight_index.h"
#include "models/esrgan/esrgan.h"
#include "models/esrgan/tiling.h"
#include "placement/devices.h"
#include "models/esrgan/placed_upscaler.h"
#include "placement_test_support.h"
#include "runtime/graph_runner.h"

#include <gtest/gtest.h>

#include <filesystem>

using namespace easel;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(EASEL_TEST_DATA) / "esrgan";

vae::HostTensor to_host(const test::RefImage& r) {
    vae::HostTensor t(1, r.c, r.h, r.w);
    for (size_t i = 0; i < r.v.size(); ++i) t.data[i] = (float)r.v[i];
    return t;
}

double max_diff(const vae::HostTensor& a, const test::RefImage& b) {
    EXPECT_EQ(a.c, b.c);
    EXPECT_EQ(a.h, b.h);
    EXPECT_EQ(a.w, b.w);
    if (a.c != b.c || a.h != b.h || a.w != b.w) return 1e9;
    double m = 0;
    for (size_t i = 0; i < b.v.size(); ++i) m = std::max(m, std::abs((double)a.data[i] - b.v[i]));
    return m;
}

double max_diff(const vae::HostTensor& a, const vae::HostTensor& b) {
    EXPECT_EQ(a.data.size(), b.data.size());
    if (a.data.size() != b.data.size()) return 1e9;
    double m = 0;
    for (size_t i = 0; i < a.data.size(); ++i) m = std::max(m, std::abs((double)a.data[i] - (double)b.data[i]));
    return m;
}

placement::PlacementSpec cpu_spec(const std::string& params = "") {
    placement::init_backends();
    placement::PlacementFlags f;
    f.backend = "upscaler=cpu";
    f.params_backend = params;
    return placement::parse_placement(f, placement::device_names());
}

/// The file's network on the CPU, whole or in tiles.
vae::HostTensor run_file(const fs::path& file, const vae::HostTensor& img, int tile = 0, int overlap = -1) {
    auto wi = io::WeightIndex::open(file);
    esrgan::PlacedUpscaler up(wi, file.string(), cpu_spec(), 1);
    return up.upscale(img, tile, overlap);
}

test::RefImage crop(const test::RefImage& x, int h, int w) {
    test::RefImage r(x.c, h, w);
    for (int c = 0; c < x.c; ++c)
        for (int y = 0; y < h; ++y)
            for (int xx = 0; xx < w; ++xx) r.at(c, y, xx) = x.at(c, y, xx);
    return r;
}

/// numpy 'reflect' padding at the bottom / right to multiples of m.
test::RefImage pad_reflect(const test::RefImage& x, int m) {
    const int H = (x.h + m - 1) / m * m, W = (x.w + m - 1) / m * m;
    test::RefImage r(x.c, H, W);
    auto src = [](int i, int n) { return i < n ? i : 2 * n - 2 - i; };
    for (int c = 0; c < x.c; ++c)
        for (int y = 0; y < H; ++y)
            for (int xx = 0; xx < W; ++xx) r.at(c, y, xx) = x.at(c, src(y, x.h), src(xx, x.w));
    return r;
}

}  // namespace

TEST(Esrgan, InfersTheConfigOfEveryLayout) {
    struct Case {
        const char* file;
        esrgan::Arch arch;
        int scale, unshuffle, blocks;
        bool old;
    };
    for (const Case& c : {Case{"rrdb_x4_tiny.safetensors", esrgan::Arch::RRDBNet, 4, 1, 2, false},
                          Case{"rrdb_x4_tiny_esrgan.pth", esrgan::Arch::RRDBNet, 4, 1, 2, true},
                          Case{"rrdb_x4_tiny_trunk.pth", esrgan::Arch::RRDBNet, 4, 1, 2, false},
                          Case{"rrdb_x2_tiny.pth", esrgan::Arch::RRDBNet, 2, 2, 2, false},
                          Case{"srvgg_x4_tiny.pth", esrgan::Arch::SRVGGNetCompact, 4, 1, 3, false},
                          Case{"srvgg_x2_tiny.safetensors", esrgan::Arch::SRVGGNetCompact, 2, 1, 2, false}}) {
        SCOPED_TRACE(c.file);
        auto wi = io::WeightIndex::open(kDir / c.file);
        const auto cfg = esrgan::infer_config(wi, c.file);
        EXPECT_EQ(cfg.arch, c.arch);
        EXPECT_EQ(cfg.scale, c.scale);
        EXPECT_EQ(cfg.unshuffle, c.unshuffle);
        EXPECT_EQ(cfg.num_block, c.blocks);
        EXPECT_EQ(cfg.layout == esrgan::EsrganConfig::Layout::EsrganOld, c.old);
        EXPECT_EQ(cfg.num_feat, 8);
        if (c.arch == esrgan::Arch::RRDBNet) { EXPECT_EQ(cfg.num_grow, 4); }
    }
    auto wi = io::WeightIndex::open(kDir / "rrdb_x2_tiny.pth");
    EXPECT_EQ(esrgan::infer_config(wi, "x").describe(), "RRDBNet x2 (2 blocks, 8 features, grow 4, pixel unshuffle 2, BasicSR keys)");
}

// The x4 RRDBNet equals the double-precision definition within 1e-4 (float32 accumulation over
// 36 convolutions; 1/255 = 4e-3), on an odd-sized image; the two ESRGAN key layouts hold the same
// weights and give the same image bit for bit.
TEST(Esrgan, RRDBNetMatchesTheDefinition) {
    auto wi = io::WeightIndex::open(kDir / "rrdb_x4_tiny.safetensors");
    const test::RefImage img = test::ref_test_image(11, 13);
    const test::RefImage want = test::ref_rrdbnet(test::ref_weights(wi), img, 8, 4, 2, 2, 1);
    const vae::HostTensor got = run_file(kDir / "rrdb_x4_tiny.safetensors", to_host(img));
    EXPECT_LT(max_diff(got, want), 1e-4);
    // the original ESRGAN key layout (legacy torch.save) holds the same weights: the same image
    const vae::HostTensor old = run_file(kDir / "rrdb_x4_tiny_esrgan.pth", to_host(img));
    EXPECT_EQ(max_diff(old, got), 0.0);
    // ... and so does the ESRGAN repo's 2019 layout (RRDB_trunk, upconv1/2, HRconv)
    const vae::HostTensor trunk = run_file(kDir / "rrdb_x4_tiny_trunk.pth", to_host(img));
    EXPECT_EQ(max_diff(trunk, got), 0.0);
}

// x2 with pixel unshuffle: an odd-sized input is reflect-padded to even (as Real-ESRGAN does),
// run, and the output cropped back to 2x the input.
TEST(Esrgan, RRDBNetX2PixelUnshuffleMatchesTheDefinition) {
    auto wi = io::WeightIndex::open(kDir / "rrdb_x2_tiny.pth");
    const test::RefImage img = test::ref_test_image(9, 13, 1);
    const test::RefImage padded = pad_reflect(img, 2);
    const test::RefImage want = crop(test::ref_rrdbnet(test::ref_weights(wi), padded, 8, 4, 2, 2, 2), 18, 26);
    const vae::HostTensor got = run_file(kDir / "rrdb_x2_tiny.pth", to_host(img));
    EXPECT_LT(max_diff(got, want), 1e-4);
}

TEST(Esrgan, SRVGGNetCompactMatchesTheDefinition) {
    {
        auto wi = io::WeightIndex::open(kDir / "srvgg_x4_tiny.pth");
        const test::RefImage img = test::ref_test_image(10, 7, 2);
        const vae::HostTensor got = run_file(kDir / "srvgg_x4_tiny.pth", to_host(img));
        EXPECT_LT(max_diff(got, test::ref_srvgg(test::ref_weights(wi), img, 8, 3, 4)), 1e-5);
    }
    {
        auto wi = io::WeightIndex::open(kDir / "srvgg_x2_tiny.safetensors");
        const test::RefImage img = test::ref_test_image(9, 12, 3);
        const vae::HostTensor got = run_file(kDir / "srvgg_x2_tiny.safetensors", to_host(img));
        EXPECT_LT(max_diff(got, test::ref_srvgg(test::ref_weights(wi), img, 8, 2, 2)), 1e-5);
    }
}

TEST(Esrgan, TileOrigins) {
    EXPECT_EQ(esrgan::tile_origins(100, 128, 32), (std::vector<int64_t>{0}));
    EXPECT_EQ(esrgan::tile_origins(100, 40, 10), (std::vector<int64_t>{0, 30, 60}));
    EXPECT_EQ(esrgan::tile_origins(101, 40, 10), (std::vector<int64_t>{0, 20, 40, 61}));
    EXPECT_EQ(esrgan::tile_origins(100, 40, 10, 4), (std::vector<int64_t>{0, 28, 60}));
    EXPECT_THROW(esrgan::tile_origins(100, 10, 10), Error);
    EXPECT_EQ(esrgan::default_overlap(128), 32);
    EXPECT_EQ(esrgan::default_overlap(32), 16);
    EXPECT_EQ(esrgan::default_overlap(512, 1, 18), 128);  // animevideov3's context 18: 4 x 18 = 72 < 512/4
    EXPECT_EQ(esrgan::default_overlap(192, 1, 18), 72);
    EXPECT_EQ(esrgan::default_overlap(128, 1, 18), 64);   // at most half the tile
    EXPECT_EQ(esrgan::default_overlap(96, 4, 18), 48);
}

// Tiled equals whole. The compact x4 model has 5 convolutions: each output pixel depends on the
// input within 5 pixels, and a tile contributes only pixels at least overlap/4 = 5 from its cut
// edges, so tiles give the whole-image result up to float rounding. RRDBNet's receptive field
// (about 35 pixels here) is wider than the 4-pixel margin of 32-pixel tiles (overlap 16): within 1/255.
TEST(Esrgan, TiledEqualsWhole) {
    const test::RefImage img = test::ref_test_image(54, 70, 4);
    {
        const vae::HostTensor whole = run_file(kDir / "srvgg_x4_tiny.pth", to_host(img));
        const vae::HostTensor tiled = run_file(kDir / "srvgg_x4_tiny.pth", to_host(img), 24, 20);
        EXPECT_LT(max_diff(tiled, whole), 1e-5);
    }
    {
        const vae::HostTensor whole = run_file(kDir / "rrdb_x4_tiny.safetensors", to_host(img));
        const vae::HostTensor tiled = run_file(kDir / "rrdb_x4_tiny.safetensors", to_host(img), 32, -1);
        const double d = max_diff(tiled, whole);
        EXPECT_LT(d, 1.0 / 255) << "RRDBNet tiles of 32 px";
        std::printf("  RRDBNet x4 tiny, 70x54 in 32-px tiles (overlap 16): max |tiled - whole| = %.2e\n", d);
    }
    {  // pixel unshuffle: tiles and their origins stay on even pixels
        const test::RefImage odd = test::ref_test_image(41, 37, 5);
        const vae::HostTensor whole = run_file(kDir / "rrdb_x2_tiny.pth", to_host(odd));
        const vae::HostTensor tiled = run_file(kDir / "rrdb_x2_tiny.pth", to_host(odd), 33, -1);
        EXPECT_EQ(tiled.w, 74);
        EXPECT_EQ(tiled.h, 82);
        EXPECT_LT(max_diff(tiled, whole), 1.0 / 255);
    }
}

// pixel_unshuffle and pixel_shuffle as torch defines them, on a 4x6 image of 2 channels.
TEST(Esrgan, PixelShuffleOps) {
    runtime::GraphRunner run;
    std::vector<float> v(2 * 4 * 6);
    for (size_t i = 0; i < v.size(); ++i) v[i] = (float)i;
    auto out = run.run([&](runtime::GraphBuilder& g) {
        ggml_tensor* x = g.input_f32("x", {6, 4, 2, 1}, v);
        ggml_tensor* u = esrgan::pixel_unshuffle(g.ctx(), x, 2);
        return std::vector<ggml_tensor*>{u, esrgan::pixel_shuffle(g.ctx(), u, 2)};
    });
    ASSERT_EQ(out[0].ne[0], 3);
    ASSERT_EQ(out[0].ne[1], 2);
    ASSERT_EQ(out[0].ne[2], 8);
    // unshuffle[c*4 + i*2 + j][y][x] = x[c][2y + i][2x + j]
    for (int c = 0; c < 2; ++c)
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j)
                for (int y = 0; y < 2; ++y)
                    for (int x = 0; x < 3; ++x)
                        EXPECT_EQ(out[0].data[(((size_t)(c * 4 + i * 2 + j)) * 2 + y) * 3 + x], v[((size_t)c * 4 + 2 * y + i) * 6 + 2 * x + j]);
    EXPECT_EQ(out[1].data, v);
}

TEST(Esrgan, RefusesWhatIsNotAnUpscaler) {
    auto vae_file = io::WeightIndex::open(fs::path(EASEL_TEST_DATA) / "reference" / "autoencoder_kl_sd_tiny.safetensors");
    try {
        esrgan::infer_config(vae_file, "vae.safetensors");
        FAIL() << "a VAE was taken for an upscaler";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::ModelMismatch);
        const std::string m = e.what();
        EXPECT_NE(m.find("not an ESRGAN upscaler"), std::string::npos) << m;
        EXPECT_NE(m.find("VAE"), std::string::npos) << m;
    }
}

// The upscaler under placements on the CPU (weights on the device, in host RAM, on disk): the
// same image, and the measured peak within 10% of the plan's prediction.
TEST(Esrgan, PlacedUpscalerPeaksMatchThePlan) {
    auto wi = io::WeightIndex::open(kDir / "rrdb_x4_tiny.safetensors");
    const test::RefImage img = test::ref_test_image(40, 48, 6);
    vae::HostTensor first;
    for (const char* params : {"", "upscaler=cpu", "upscaler=disk"}) {
        SCOPED_TRACE(params);
        esrgan::PlacedUpscaler up(wi, "rrdb", cpu_spec(params), 1);
        const vae::HostTensor out = up.upscale(to_host(img), 24);
        if (first.data.empty()) first = out;
        else EXPECT_EQ(max_diff(out, first), 0.0);
        test_support::expect_peaks_within_10_percent({up.current_plan()}, up.peaks(), std::string("upscaler params ") + params);
        EXPECT_GT(up.param_bytes(), 0u);
    }
}
