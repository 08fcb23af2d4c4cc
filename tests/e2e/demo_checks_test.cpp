// Measured checks on images of the bundled demo model (issue 4): does an image show what its prompt
// ("a {size} {colour} {shape} {position}, {background} background") asks for?
//
// The analyser is a C++ port of analyse()/check() in tools/demo-model/train.py (the numbers in
// models/demo/README.md come from the Python one):
//   background = the palette colour nearest the per-channel median of a 6-pixel border;
//   object     = every pixel farther than 0.25 (RGB distance, channels in [0, 1]) from that median;
//   its colour = the palette colour nearest the per-channel median of the object pixels;
//   side       = its centroid: left cx < 0.42, right cx > 0.58, top cy < 0.42, bottom cy > 0.58,
//                centre |cx - 0.5| < 0.1 and |cy - 0.5| < 0.1 (fractions of the side, y down);
//   size       = its area: small < 6 % of the image, large > 6 %; and a small object's area is
//                less than the same prompt's large one.
// Every check is also run against a deliberately wrong expectation (other background, other
// colour, opposite side, other size), which must fail: a negative control, so that the checks
// cannot pass on noise or on an image without an object.
//
// DemoChecksAnalyser.* run in CI: they prove the analyser on images with a known answer (shapes
// drawn here the way tools/demo-model/shapes.py draws the training data, and the two diffusers
// reference images whose Python analysis is stored in tests/data/reference/demo/cases.json).
//
// DemoChecks.PromptsDrawWhatTheyAsk is the issue's model test: "for at least 8 prompts covering colour,
// shape, position, size and background, with fixed seeds, the image satisfies measured checks".
//   * Prompts: the 12 of TEST_PROMPTS in tools/demo-model/train.py, fixed before any image was seen
//     (every shape, position and size; 11 of the 12 colours as object or background; two
//     small/large pairs; no held-out colour/shape pair). Seed 1 for every prompt, fixed in advance.
//     None is chosen after seeing an image: the test asks for the issue's 8 of these 12 to pass every
//     check, and every prompt's failed checks are printed.
//   * Every image, passing or not, must fail every negative control (a check run against a wrong
//     expectation), and each small object must be smaller than its large twin.
//   * Settings: none given. The job leaves sampler, scheduler, steps, CFG scale and size to the model file's
//     recommended settings (its easel.* metadata: Euler, discrete, 20 steps, CFG 3, 256x256), as
//     `easel -p "..."` does, so this is the issue's "at the default settings"; --rng cpu, seed 1, one thread.
//   * Measured with the shipped model (GPU run 11, models/demo/README.md, 64 in-distribution prompts, diffusers):
//     background, colour, shape, side and size 1.00; the 12 test prompts with seeds 1-4 pass every check 48 of
//     48 (run 9, shipped before: 31 of 48, colour 0.73, shapes drawn as blobs). easel's images of these prompts
//     (seed 1, same settings, scored by tools/demo-model/score.py, whose bg/colour/side/size this port copies): all
//     12 pass every check, shapes included (one speck and three frames, on the prompts whose GPU images have them). The test asks for all 12 (the GPU run's figure) minus one for CPU-vs-GPU
//     rounding: at least 11. (The shapes are scored by tools/demo-model/score.py, not by this port.)
// 12 images at 256x256, one thread: about 10 s each on a quiet core (UNet 2.43 GFLOP x 40, VAE decoder 73.5 GFLOP).
#include "pipeline/generate.h"
#include "pipeline/image_io.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using easel::pipeline::Image;

namespace {

/// The training palette (tools/demo-model/shapes.py COLOURS), RGB in [0, 1].
struct PaletteColour {
    const char* name;
    double r, g, b;
};
constexpr PaletteColour kPalette[] = {
    {"red", 0.86, 0.10, 0.10},   {"green", 0.10, 0.70, 0.20}, {"blue", 0.10, 0.25, 0.90},
    {"yellow", 0.95, 0.85, 0.10}, {"orange", 1.00, 0.55, 0.00}, {"purple", 0.55, 0.15, 0.75},
    {"pink", 1.00, 0.55, 0.75},  {"white", 0.97, 0.97, 0.97}, {"black", 0.05, 0.05, 0.05},
    {"cyan", 0.10, 0.85, 0.90},  {"brown", 0.50, 0.30, 0.10}, {"grey", 0.50, 0.50, 0.50},
};

const PaletteColour& palette(const std::string& name) {
    for (const auto& p : kPalette)
        if (name == p.name) return p;
    throw std::runtime_error("not a palette colour: " + name);
}

std::string nearest_palette(const double rgb[3]) {
    const PaletteColour* best = nullptr;
    double bd = 1e30;
    for (const auto& p : kPalette) {
        const double d = (p.r - rgb[0]) * (p.r - rgb[0]) + (p.g - rgb[1]) * (p.g - rgb[1]) + (p.b - rgb[2]) * (p.b - rgb[2]);
        if (d < bd) bd = d, best = &p;
    }
    return best->name;
}

/// Lower median (torch.median's choice for an even count).
double lower_median(std::vector<double> v) {
    auto mid = v.begin() + (v.size() - 1) / 2;
    std::nth_element(v.begin(), mid, v.end());
    return *mid;
}

/// What the analyser measured on one image.
struct Analysis {
    std::string bg;                     ///< palette name of the background
    std::optional<std::string> colour;  ///< palette name of the object; empty if < 4 object pixels
    double cx = 0, cy = 0;              ///< object centroid, fractions of width / height (y down)
    double area = 0;                    ///< object pixels / all pixels
};

/// analyse() of tools/demo-model/train.py on an 8-bit RGB image (channels / 255).
Analysis analyse(const Image& img) {
    const int W = img.width, H = img.height, C = img.channels;
    auto px = [&](int x, int y, int c) { return img.pixels[((size_t)y * W + x) * C + c] / 255.0; };
    double med[3];
    for (int c = 0; c < 3; ++c) {  // rows 0..5, rows H-6..H-1, columns 0..5, columns W-6..W-1 (corners twice)
        std::vector<double> v;
        for (int y = 0; y < 6; ++y)
            for (int x = 0; x < W; ++x) v.push_back(px(x, y, c));
        for (int y = H - 6; y < H; ++y)
            for (int x = 0; x < W; ++x) v.push_back(px(x, y, c));
        for (int y = 0; y < H; ++y)
            for (int x = 0; x < 6; ++x) v.push_back(px(x, y, c));
        for (int y = 0; y < H; ++y)
            for (int x = W - 6; x < W; ++x) v.push_back(px(x, y, c));
        med[c] = lower_median(std::move(v));
    }
    Analysis a;
    a.bg = nearest_palette(med);
    std::vector<double> obj[3];
    double sx = 0, sy = 0;
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) {
            double d2 = 0;
            for (int c = 0; c < 3; ++c) d2 += (px(x, y, c) - med[c]) * (px(x, y, c) - med[c]);
            if (std::sqrt(d2) > 0.25) {
                for (int c = 0; c < 3; ++c) obj[c].push_back(px(x, y, c));
                sx += x + 0.5, sy += y + 0.5;
            }
        }
    const size_t n = obj[0].size();
    a.area = (double)n / ((double)W * H);
    if (n < 4) return a;
    double oc[3];
    for (int c = 0; c < 3; ++c) oc[c] = lower_median(obj[c]);
    a.colour = nearest_palette(oc);
    a.cx = sx / n / W;
    a.cy = sy / n / H;
    return a;
}

/// What a prompt asks for.
struct Expect {
    std::string size, colour, shape, pos, bg;
};

/// Parses "a {size} {colour} {shape} {position phrase}, {bg} background".
Expect parse_prompt(const std::string& p) {
    std::istringstream in(p);
    std::string a, size, colour, shape, w1, w2, w3, bg;
    in >> a >> size >> colour >> shape >> w1 >> w2 >> w3 >> bg;
    if (!w3.empty() && w3.back() == ',') w3.pop_back();
    return {size, colour, shape, w3 == "center" ? "centre" : w3, bg};
}

struct Checks {
    bool bg = false, colour = false, pos = false, size = false;
    bool all() const { return bg && colour && pos && size; }
};

/// check() of tools/demo-model/train.py: each attribute of `e` against the analysis.
Checks check(const Expect& e, const Analysis& a) {
    Checks k;
    k.bg = a.bg == e.bg;
    k.colour = a.colour && *a.colour == e.colour;
    if (!a.colour) return k;  // no object: side and size fail
    if (e.pos == "left") k.pos = a.cx < 0.42;
    else if (e.pos == "right") k.pos = a.cx > 0.58;
    else if (e.pos == "top") k.pos = a.cy < 0.42;
    else if (e.pos == "bottom") k.pos = a.cy > 0.58;
    else k.pos = std::abs(a.cx - 0.5) < 0.1 && std::abs(a.cy - 0.5) < 0.1;
    k.size = e.size == "small" ? a.area < 0.06 : a.area > 0.06;
    return k;
}

/// The deliberately wrong expectation of the negative controls: another background (not the
/// object colour either), another object colour (not the background), the opposite side
/// (centre -> left), the other size.
Expect wrong(const Expect& e) {
    constexpr int n = sizeof(kPalette) / sizeof(kPalette[0]);
    auto other = [&](const std::string& not1, const std::string& not2) {
        int i = 0;
        while (kPalette[i].name != not1) ++i;
        for (int k = 1; k < n; ++k) {
            const std::string c = kPalette[(i + k) % n].name;
            if (c != not1 && c != not2) return c;
        }
        return std::string();
    };
    Expect w = e;
    w.bg = other(e.bg, e.colour);
    w.colour = other(e.colour, e.bg);
    w.pos = e.pos == "left" ? "right" : e.pos == "right" ? "left" : e.pos == "top" ? "bottom" : e.pos == "bottom" ? "top" : "left";
    w.size = e.size == "small" ? "large" : "small";
    return w;
}

std::string describe(const Analysis& a) {
    std::ostringstream o;
    o << "bg " << a.bg << ", object " << (a.colour ? *a.colour : "none") << " at (" << a.cx << ", " << a.cy << "), area " << a.area;
    return o.str();
}

// ---- synthetic images: one shape on a plain background, drawn like tools/demo-model/shapes.py -------

/// Signed distance (negative inside) of `shape` with circumradius R at offset (rx, ry) from its
/// centre (y up), the shapes of shapes.render without rotation.
double shape_sdf(const std::string& shape, double R, double rx, double ry) {
    const double pi = 3.14159265358979323846;
    const double r = std::hypot(rx, ry);
    if (shape == "circle") return r - R;
    if (shape == "ring") return std::abs(r - 0.72 * R) - 0.28 * R;
    if (shape == "square") return std::max(std::abs(rx), std::abs(ry)) - 0.78 * R;
    if (shape == "cross") {
        const double w = 0.3 * R;
        return std::min(std::max(std::abs(rx) - R, std::abs(ry) - w), std::max(std::abs(rx) - w, std::abs(ry) - R));
    }
    if (shape == "triangle") {
        double d = -1e30;
        for (double ang : {-90.0, 30.0, 150.0}) d = std::max(d, rx * std::cos(ang * pi / 180) + ry * std::sin(ang * pi / 180));
        return d - 0.55 * R;
    }
    // star: five points, radius between 0.45 R and 1.1 R
    const double period = 2 * pi / 5;
    double ph = std::fmod(std::atan2(ry, rx) - pi / 2, period);
    if (ph < 0) ph += period;
    const double tri = std::abs(2 * ph / period - 1);
    return (r - R * (0.45 + 0.65 * tri)) * 0.7;
}

/// Draws `e` at size x size with anti-aliased edges and deterministic per-pixel noise of up to
/// +-noise/255 (xorshift seeded by `seed`), like a slightly imperfect generated image.
Image draw(const Expect& e, int size, uint32_t seed, int noise = 12) {
    const double cxs[] = {0.28, 0.72, 0.5, 0.5, 0.5}, cys[] = {0.5, 0.5, 0.28, 0.72, 0.5};
    const char* names[] = {"left", "right", "top", "bottom", "centre"};
    int pi = 0;
    while (e.pos != names[pi]) ++pi;
    const double R = e.size == "small" ? 0.105 : 0.22;
    const auto& fg = palette(e.colour);
    const auto& bg = palette(e.bg);
    Image img{size, size, 3, std::vector<uint8_t>((size_t)size * size * 3)};
    uint32_t s = seed * 2654435761u + 1;
    for (int y = 0; y < size; ++y)
        for (int x = 0; x < size; ++x) {
            const double dx = (x + 0.5) / size - cxs[pi], dy = -((y + 0.5) / size - cys[pi]);
            const double alpha = std::clamp(0.5 - shape_sdf(e.shape, R, dx, dy) * size, 0.0, 1.0);
            const double rgb[3] = {alpha * fg.r + (1 - alpha) * bg.r, alpha * fg.g + (1 - alpha) * bg.g,
                                   alpha * fg.b + (1 - alpha) * bg.b};
            for (int c = 0; c < 3; ++c) {
                s ^= s << 13, s ^= s >> 17, s ^= s << 5;
                const int jitter = (int)(s % (2 * noise + 1)) - noise;
                img.pixels[((size_t)y * size + x) * 3 + c] = (uint8_t)std::clamp((int)std::lround(rgb[c] * 255) + jitter, 0, 255);
            }
        }
    return img;
}

/// 60 synthetic cases: 6 shapes x 5 positions x 2 sizes; colours and backgrounds cycle through the
/// palette (never equal; yellow/orange, the closest pair at RGB distance 0.32, included).
std::vector<Expect> synthetic_cases() {
    const char* shapes[] = {"circle", "square", "triangle", "star", "ring", "cross"};
    const char* poss[] = {"left", "right", "top", "bottom", "centre"};
    std::vector<Expect> out;
    int i = 0;
    for (const char* sh : shapes)
        for (const char* pos : poss)
            for (const char* size : {"small", "large"}) {
                std::string colour = kPalette[(i * 5) % 12].name, bg = kPalette[(i * 7 + 3) % 12].name;
                if (bg == colour) bg = kPalette[(i * 7 + 4) % 12].name;
                if (i == 7) colour = "yellow", bg = "orange";
                out.push_back({size, colour, sh, pos, bg});
                ++i;
            }
    return out;
}

TEST(DemoChecksAnalyser, SyntheticShapesPassTheirChecksAndFailWrongOnes) {
    int n = 0;
    for (const auto& e : synthetic_cases()) {
        for (int size : {256, 128}) {
            const Analysis a = analyse(draw(e, size, (uint32_t)n));
            const Checks k = check(e, a);
            const std::string what = e.size + " " + e.colour + " " + e.shape + " " + e.pos + ", " + e.bg + " @" +
                                     std::to_string(size) + ": " + describe(a);
            EXPECT_TRUE(k.bg && k.colour && k.pos && k.size) << what;
            const Checks w = check(wrong(e), a);  // negative controls: each must fail
            EXPECT_FALSE(w.bg) << what;
            EXPECT_FALSE(w.colour) << what;
            EXPECT_FALSE(w.pos) << what;
            EXPECT_FALSE(w.size) << what;
            ++n;
        }
    }
    EXPECT_EQ(n, 120);
}

TEST(DemoChecksAnalyser, SmallIsSmallerThanLargeForEveryShape) {
    for (const char* sh : {"circle", "square", "triangle", "star", "ring", "cross"}) {
        const double small = analyse(draw({"small", "red", sh, "centre", "white"}, 256, 1)).area;
        const double large = analyse(draw({"large", "red", sh, "centre", "white"}, 256, 2)).area;
        EXPECT_LT(small, large) << sh;
        EXPECT_FALSE(large < small) << sh;  // the pair check's negative control
        EXPECT_LT(small, 0.06) << sh;
        EXPECT_GT(large, 0.06) << sh;
    }
}

TEST(DemoChecksAnalyser, ImagesWithoutAnObjectFailTheObjectChecks) {
    // a plain background (with the same pixel noise): no object, so colour, side and size fail
    Image plain = draw({"small", "red", "circle", "centre", "blue"}, 128, 3);
    const auto& blue = palette("blue");
    for (size_t i = 0; i < plain.pixels.size(); i += 3) {
        plain.pixels[i] = (uint8_t)std::lround(blue.r * 255);
        plain.pixels[i + 1] = (uint8_t)std::lround(blue.g * 255);
        plain.pixels[i + 2] = (uint8_t)std::lround(blue.b * 255);
    }
    Analysis a = analyse(plain);
    EXPECT_EQ(a.bg, "blue");
    EXPECT_FALSE(a.colour.has_value()) << describe(a);
    for (const char* pos : {"left", "right", "top", "bottom", "centre"})
        for (const char* size : {"small", "large"}) {
            const Checks k = check({size, "red", "circle", pos, "blue"}, a);
            EXPECT_FALSE(k.colour || k.pos || k.size) << pos << " " << size;
        }
    // uniform noise in [0, 255]: whatever it finds, it is not "a small red circle on the left"
    Image noise{128, 128, 3, std::vector<uint8_t>(128 * 128 * 3)};
    uint32_t s = 12345;
    for (auto& p : noise.pixels) s ^= s << 13, s ^= s >> 17, s ^= s << 5, p = (uint8_t)(s & 255);
    a = analyse(noise);
    EXPECT_FALSE(check({"small", "red", "circle", "left", "blue"}, a).all()) << describe(a);
    EXPECT_GT(a.area, 0.5) << describe(a);  // almost every pixel is far from the border median
}

TEST(DemoChecksAnalyser, MatchesThePythonAnalysisOfTheReferenceImages) {
    const fs::path ref = fs::path(EASEL_TEST_DATA) / "reference" / "demo";
    std::ifstream f(ref / "cases.json");
    ASSERT_TRUE(f) << ref / "cases.json";
    const auto cases = nlohmann::json::parse(f)["cases"];
    ASSERT_EQ(cases.size(), 2u);
    for (const auto& c : cases) {
        // Python analysed the float image; the PNG is that image rounded to 8 bits.
        const Analysis a = analyse(easel::pipeline::load_image(ref / c["png"].get<std::string>(), 3));
        const auto& want = c["check"];
        EXPECT_EQ(a.bg, want["bg"].get<std::string>()) << c["name"];
        ASSERT_TRUE(a.colour.has_value()) << c["name"];
        EXPECT_EQ(*a.colour, want["colour"].get<std::string>()) << c["name"];
        EXPECT_NEAR(a.cx, want["cx"].get<double>(), 0.01) << c["name"];
        EXPECT_NEAR(a.cy, want["cy"].get<double>(), 0.01) << c["name"];
        EXPECT_NEAR(a.area, want["area"].get<double>(), 0.005) << c["name"];
    }
}

// ---- the model test (see the top of this file) ----------------------------------------------------------

const char* const kPrompts[] = {
    "a large red circle in the centre, blue background",      "a small red circle in the centre, blue background",
    "a small yellow square on the left, black background",    "a large yellow square on the left, black background",
    "a large white triangle on the right, green background",  "a small cyan star at the top, purple background",
    "a large orange ring at the bottom, white background",    "a small pink cross on the right, grey background",
    "a large green square at the top, red background",        "a small black circle at the bottom, yellow background",
    "a large blue triangle on the left, orange background",   "a large purple star in the centre, cyan background",
};
constexpr int kSeed = 1;

TEST(DemoChecks, PromptsDrawWhatTheyAsk) {
    const fs::path model = fs::path(EASEL_SOURCE_DIR) / "models" / "demo" / "easel-demo-shapes.safetensors";
    std::vector<Analysis> got;
    int passed = 0;
    for (const char* prompt : kPrompts) {
        easel::pipeline::GenerateParams p;
        p.model = model.string();
        p.prompt = prompt;
        // no sampler, scheduler, steps, CFG or size: the file's recommended settings, as `easel -p` takes them
        p.steps_given = p.cfg_scale_given = p.width_given = p.height_given = false;
        p.seed = kSeed;
        p.rng = "cpu";
        // one thread: ctest runs two tests at once on CI's 2 cores, and ggml's spinning workers of two
        // processes sharing 2 cores slow each other many times over (it timed out at 600 s beside a build)
        p.threads = 1;
        p.output = (fs::path(testing::TempDir()) / ("easel_demo_checks_" + std::to_string(getpid()) + ".png")).string();
        const auto report = easel::pipeline::generate(p);
        ASSERT_EQ(report.outputs.size(), 1u);
        ASSERT_EQ(report.width, 256) << "the file's easel.width was not taken";
        ASSERT_EQ(report.height, 256) << "the file's easel.height was not taken";
        const Analysis a = analyse(easel::pipeline::load_image(report.outputs[0], 3));
        fs::remove(report.outputs[0]);
        got.push_back(a);
        const Expect e = parse_prompt(prompt);
        const Checks k = check(e, a), w = check(wrong(e), a);
        passed += k.all();
        if (!k.all())
            std::printf("demo checks: \"%s\" fails%s%s%s%s: %s\n", prompt, k.bg ? "" : " background",
                        k.colour ? "" : " colour", k.pos ? "" : " side", k.size ? "" : " size", describe(a).c_str());
        EXPECT_FALSE(w.bg || w.colour || w.pos || w.size) << prompt << " (negative control): " << describe(a);
    }
    // the (small, large) pairs: prompts 0/1 and 2/3 differ only in the size word
    EXPECT_LT(got[1].area, got[0].area);
    EXPECT_LT(got[2].area, got[3].area);
    std::printf("demo checks: %d of %zu prompts pass every check\n", passed, got.size());
    EXPECT_GE(passed, 11) << "GPU run 11's images pass every check for all 12 prompts (48 of 48 over seeds 1-4)";
}

}  // namespace
