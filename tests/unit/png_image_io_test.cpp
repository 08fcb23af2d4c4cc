// Image decoding/encoding (stb_image, libpng) and float conversions.
#include "core/error.h"
#include "pipeline/image_io.h"

#include <gtest/gtest.h>

#include <filesystem>

using namespace easel::pipeline;

namespace {
std::filesystem::path data(const std::string& name) { return std::filesystem::path(EASEL_TEST_DATA) / "png" / name; }
}  // namespace

TEST(ImageIo, DecodesKnownPixels) {
    // tests/data/png/README.md: the cropped files are 8x8 RGB with pixel (x, y) = (32x, 32y, 128).
    const auto img = load_image(data("sdcpp_with_lcm_cropped.png"));
    ASSERT_EQ(img.width, 8);
    ASSERT_EQ(img.height, 8);
    ASSERT_EQ(img.channels, 3);
    for (int y = 0; y < 8; ++y)
        for (int x = 0; x < 8; ++x) {
            const uint8_t* p = &img.pixels[(y * 8 + x) * 3];
            EXPECT_EQ(p[0], 32 * x);
            EXPECT_EQ(p[1], 32 * y);
            EXPECT_EQ(p[2], 128);
        }
    // RGBA request: alpha is opaque; gray: ITU-R 601 luma as stb computes it ((77r + 150g + 29b) >> 8).
    const auto rgba = load_image(data("sdcpp_with_lcm_cropped.png"), 4);
    EXPECT_EQ(rgba.pixels[(2 * 8 + 3) * 4 + 3], 255);
    const auto gray = load_image(data("sdcpp_with_lcm_cropped.png"), 1);
    EXPECT_EQ(gray.pixels[2 * 8 + 3], (77 * 96 + 150 * 64 + 29 * 128) >> 8);
}

TEST(ImageIo, DecodesJpeg) {
    const auto img = load_image(data("sdparsers_automatic1111_cropped.jpg"));
    EXPECT_EQ(img.width, 1);
    EXPECT_EQ(img.height, 1);
    EXPECT_EQ(img.pixels.size(), 3u);
}

TEST(ImageIo, Errors) {
    try {
        load_image(data("sdparsers_bad_empty_file.png"));
        FAIL() << "no error";
    } catch (const easel::Error& e) {
        EXPECT_EQ(e.kind(), easel::ErrorKind::InvalidInput);
        EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos);
    }
    try {
        load_image(data("missing.png"));
        FAIL() << "no error";
    } catch (const easel::Error& e) {
        EXPECT_EQ(e.kind(), easel::ErrorKind::Io);
    }
    const std::vector<uint8_t> junk{'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'};
    EXPECT_THROW(decode_image(junk), easel::Error);
    EXPECT_THROW(decode_image(junk, 5), easel::Error);
    Image bad;
    bad.width = 2;
    bad.height = 2;
    bad.channels = 3;
    bad.pixels.resize(11);
    EXPECT_THROW(encode_png(bad), easel::Error);
}

TEST(ImageIo, PlanarConversions) {
    Image img;
    img.width = 2;
    img.height = 1;
    img.channels = 3;
    img.pixels = {0, 51, 255, 102, 204, 153};
    const auto f = image_to_planar(img, -1.0f, 1.0f);  // [C, H, W]
    ASSERT_EQ(f.size(), 6u);
    EXPECT_FLOAT_EQ(f[0], -1.0f);                 // R of pixel 0
    EXPECT_FLOAT_EQ(f[1], -1.0f + 2 * 102 / 255.0f);  // R of pixel 1
    EXPECT_FLOAT_EQ(f[2], -1.0f + 2 * 51 / 255.0f);   // G of pixel 0
    EXPECT_FLOAT_EQ(f[4], 1.0f);                  // B of pixel 0
    EXPECT_EQ(image_from_planar(f, 2, 1, 3, -1.0f, 1.0f).pixels, img.pixels);
    // Rounding to nearest and clamping; NaN -> 0.
    const std::vector<float> v{0.5f / 255, 1.49f / 255, 2.0f, -3.0f, std::nanf(""), 254.5f / 255};
    EXPECT_EQ(image_from_planar(v, 6, 1, 1).pixels, (std::vector<uint8_t>{1, 1, 255, 0, 0, 255}));
    EXPECT_THROW(image_from_planar(v, 5, 1, 1), easel::Error);
}

TEST(ImageIo, SavePngAtomically) {
    Image img;
    img.width = 4;
    img.height = 4;
    img.channels = 4;
    for (int i = 0; i < 64; ++i) img.pixels.push_back(static_cast<uint8_t>(i * 4));
    const auto dir = std::filesystem::temp_directory_path() / "easel_png_io_test";
    std::filesystem::create_directories(dir);
    const auto path = dir / "out.png";
    save_png(path, img);
    EXPECT_FALSE(std::filesystem::exists(dir / "out.png.tmp"));
    const auto back = load_image(path, 4);
    EXPECT_EQ(back.pixels, img.pixels);
    std::filesystem::remove_all(dir);
    EXPECT_THROW(save_png("/nonexistent-dir/x.png", img), easel::Error);
}
