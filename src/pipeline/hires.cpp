#include "pipeline/hires.h"

#include "core/error.h"
#include "core/platform.h"
#include "core/strings.h"
#include "models/flux/flux2_klein.h"
#include "pipeline/generate_params.h"
#include "sampling/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

namespace easel::pipeline {

namespace fs = std::filesystem;

namespace {

struct Builtin {
    const char* name;
    HiresUpscaler::Kind kind;
    LatentInterp mode;
    bool antialias;
};
// A1111 modules/shared_items (latent_upscale_modes) and sd.cpp's hires_upscaler_to_str.
constexpr Builtin kBuiltins[] = {
    {"Latent", HiresUpscaler::Kind::Latent, LatentInterp::Bilinear, false},
    {"Latent (nearest)", HiresUpscaler::Kind::Latent, LatentInterp::Nearest, false},
    {"Latent (nearest-exact)", HiresUpscaler::Kind::Latent, LatentInterp::NearestExact, false},
    {"Latent (antialiased)", HiresUpscaler::Kind::Latent, LatentInterp::Bilinear, true},
    {"Latent (bicubic)", HiresUpscaler::Kind::Latent, LatentInterp::Bicubic, false},
    {"Latent (bicubic antialiased)", HiresUpscaler::Kind::Latent, LatentInterp::Bicubic, true},
    {"Lanczos", HiresUpscaler::Kind::Lanczos, LatentInterp::Bilinear, false},
    {"Nearest", HiresUpscaler::Kind::Nearest, LatentInterp::Bilinear, false},
};

constexpr const char* kModelExts[] = {".pth", ".pt", ".safetensors", ".ckpt", ".bin"};

/// Shortest decimal of a double ("2", "1.5").
std::string shortest(double v) { return fmt::format("{}", v); }

// The arithmetic below follows torch's CPU kernels (ATen UpSample.h, cpu/UpSampleKernel.cpp) for
// float32 operation by operation, including where torch's release build fuses a multiply and an
// add into one FMA (GCC contracts them in its AVX2/AVX-512 kernels): std::fma marks each fused
// step, and every unfused step is its own statement so no compiler fuses it either. With that,
// every mode equals torch 2.11's CPU output bit for bit on tests/data/reference/hires (the
// antialiased bicubic downscale within 2 float ulps).

/// torch's cubic convolution taps (A = -0.75) as its non-antialiased bicubic kernel evaluates them:
/// ((A + 2) x - (A + 3)) x x + 1 for |x| <= 1 and ((A x - 5A) x + 8A) x - 4A for 1 < |x| < 2.
float cubic1_plain(float x, float A) {
    const float p = std::fma(A + 2, x, -(A + 3));
    const float q = p * x;
    const float r = q * x;
    return r + 1;
}
float cubic2_plain(float x, float A) {
    float p = std::fma(A, x, -5 * A);
    p = std::fma(p, x, 8 * A);
    const float q = p * x;
    return q - 4 * A;
}
/// The same polynomials as torch's antialiased filters evaluate them (a = -0.5, PIL's bicubic).
float cubic1_aa(float x, float A) { return std::fma(std::fma(A + 2, x, -(A + 3)) * x, x, 1.0f); }
float cubic2_aa(float x, float A) { return std::fma(std::fma(std::fma(A, x, -5 * A), x, 8 * A), x, -4 * A); }

/// area_pixel_compute_source_index (align_corners=False): scale * (dst + 0.5) - 0.5 (fused).
float source_index(float scale, int64_t dst) { return std::fma(scale, (float)dst + 0.5f, -0.5f); }

/// Taps of one output index along an axis: first source index and weights (already clamped for
/// the plain modes: indices repeat at the borders).
struct Taps {
    std::vector<int64_t> idx;
    std::vector<float> wt;
};

/// One axis's taps for every output index (in -> out).
std::vector<Taps> axis_taps(int64_t in, int64_t out, LatentInterp mode, bool antialias) {
    std::vector<Taps> r((size_t)out);
    const float scale = (float)in / (float)out;  // area_pixel_compute_scale, align_corners=False
    if (antialias && (mode == LatentInterp::Bilinear || mode == LatentInterp::Bicubic)) {
        // _compute_indices_min_size_weights_aa: interp_size 2 (bilinear) or 4 (bicubic), support
        // widened by the scale when downscaling, weights (float) normalised by their float sum
        const int interp = mode == LatentInterp::Bilinear ? 2 : 4;
        const float support = scale >= 1.0f ? (float)((interp * 0.5) * scale) : (float)(interp * 0.5);
        const float invscale = scale >= 1.0f ? (float)(1.0 / scale) : 1.0f;
        const int64_t max_taps = (int64_t)std::ceil(support) * 2 + 1;
        for (int64_t i = 0; i < out; ++i) {
            const float center = (float)(scale * (i + 0.5));
            const int64_t xmin = std::max<int64_t>((int64_t)(center - support + 0.5), 0);
            const int64_t xsize = std::clamp<int64_t>(std::min<int64_t>((int64_t)(center + support + 0.5), in) - xmin, 0, max_taps);
            Taps& t = r[(size_t)i];
            float total = 0;
            for (int64_t j = 0; j < xsize; ++j) {
                const float d = (float)(j + xmin) - center;
                const float x = std::fabs((float)((d + 0.5) * invscale));
                float f = 0;
                if (mode == LatentInterp::Bilinear) f = x < 1.0f ? 1.0f - x : 0.0f;
                else f = x < 1.0f ? cubic1_aa(x, -0.5f) : x < 2.0f ? cubic2_aa(x, -0.5f) : 0.0f;
                t.idx.push_back(xmin + j);
                t.wt.push_back(f);
                total += f;
            }
            if (total != 0.0f)
                for (float& w : t.wt) w /= total;
        }
        return r;
    }
    for (int64_t i = 0; i < out; ++i) {
        Taps& t = r[(size_t)i];
        switch (mode) {
        case LatentInterp::Nearest:
            t.idx = {std::min<int64_t>((int64_t)std::floor((float)i * scale), in - 1)};
            t.wt = {1.0f};
            break;
        case LatentInterp::NearestExact:
            t.idx = {std::min<int64_t>((int64_t)std::floor(((float)i + 0.5f) * scale), in - 1)};
            t.wt = {1.0f};
            break;
        case LatentInterp::Bilinear: {
            // compute_source_index_and_lambda (the source index clamped at 0)
            const float real = std::max(source_index(scale, i), 0.0f);
            const int64_t i0 = std::min<int64_t>((int64_t)std::floor(real), in - 1);
            const float l1 = std::min(std::max(real - (float)i0, 0.0f), 1.0f);
            t.idx = {i0, i0 + (i0 < in - 1 ? 1 : 0)};
            t.wt = {1.0f - l1, l1};
            break;
        }
        case LatentInterp::Bicubic: {
            // guard_index_and_lambda, get_cubic_upsample_coefficients
            const float real = source_index(scale, i);
            const int64_t i0 = std::min<int64_t>((int64_t)std::floor(real), in - 1);
            const float tt = std::min(std::max(real - (float)i0, 0.0f), 1.0f);
            const float A = -0.75f, x2 = 1.0f - tt;
            t.wt = {cubic2_plain(tt + 1.0f, A), cubic1_plain(tt, A), cubic1_plain(x2, A), cubic2_plain(x2 + 1.0f, A)};
            for (int k = 0; k < 4; ++k) t.idx.push_back(std::clamp<int64_t>(i0 - 1 + k, 0, in - 1));
            break;
        }
        }
    }
    return r;
}

/// sum_k v[k] * w[k] as torch's non-separable kernel computes it once its loop is unrolled:
/// fma(v0, w0, v1 * w1), then fma(v_k, w_k, acc) (one tap: v0 * w0).
template <class Get>
float tap_sum(const Taps& t, Get&& v) {
    if (t.idx.size() == 1) return v(t.idx[0]) * t.wt[0];
    const float p1 = v(t.idx[1]) * t.wt[1];
    float acc = std::fma(v(t.idx[0]), t.wt[0], p1);
    for (size_t k = 2; k < t.idx.size(); ++k) acc = std::fma(v(t.idx[k]), t.wt[k], acc);
    return acc;
}

}  // namespace

std::vector<std::string> builtin_hires_upscalers() {
    std::vector<std::string> r;
    for (const auto& b : kBuiltins) r.emplace_back(b.name);
    return r;
}

HiresUpscaler resolve_hires_upscaler(const std::string& name, const std::string& models_dir, const std::string& upscale_model) {
    const std::string lower = ascii_lower(name);
    for (const auto& b : kBuiltins) {
        if (ascii_lower(b.name) != lower) continue;
        HiresUpscaler u;
        u.kind = b.kind;
        u.mode = b.mode;
        u.antialias = b.antialias;
        u.name = b.name;
        return u;
    }
    auto model = [&](const fs::path& path) {
        HiresUpscaler u;
        u.kind = HiresUpscaler::Kind::Model;
        u.model_path = platform::path_utf8(path);
        u.name = platform::path_utf8(path.stem());
        return u;
    };
    std::error_code ec;
    const bool plain_name = !name.empty() && name.find('/') == std::string::npos && name.find('\\') == std::string::npos && name != "." &&
                            name != "..";
    if (plain_name && !models_dir.empty()) {
        for (const char* ext : kModelExts) {
            const fs::path f = platform::u8path(models_dir) / platform::u8path(name + ext);
            if (fs::is_regular_file(f, ec)) return model(f);
        }
    }
    if (!upscale_model.empty() && platform::path_utf8(platform::u8path(upscale_model).stem()) == name) return model(platform::u8path(upscale_model));
    if (!name.empty() && fs::is_regular_file(platform::u8path(name), ec)) return model(platform::u8path(name));
    std::string list;
    for (const auto& b : kBuiltins) list += fmt::format("{}\"{}\"", list.empty() ? "" : ", ", b.name);
    fail(ErrorKind::InvalidInput, "hires upscaler \"{}\": not one of {}{}", name, list,
         models_dir.empty() ? ", nor an upscaler model file (give --hires-upscalers-dir DIR to pick models by name)"
                            : fmt::format(", nor a model NAME.pth/.safetensors/... in --hires-upscalers-dir {}", models_dir));
}

HiresTarget hires_target(int W, int H, double scale, int resize_x, int resize_y, int multiple, int f) {
    if (resize_x < 0 || resize_y < 0)
        fail(ErrorKind::InvalidInput, "hires target size {}x{} must not be negative (0: from the hires scale)", resize_x, resize_y);
    HiresTarget t;
    int tw = 0, th = 0;
    if (resize_x == 0 && resize_y == 0) {
        if (!(scale > 0) || !std::isfinite(scale))
            fail(ErrorKind::InvalidInput, "hires scale {} must be a positive number (or give a hires width/height)", scale);
        t.up_width = tw = (int)std::min(1e9, (double)W * scale);
        t.up_height = th = (int)std::min(1e9, (double)H * scale);
        t.info_key = "Hires upscale";
        t.info_value = shortest(scale);
    } else {
        t.info_key = "Hires resize";
        t.info_value = fmt::format("{}x{}", resize_x, resize_y);
        if (resize_y == 0) {
            t.up_width = tw = resize_x;
            t.up_height = th = (int)((int64_t)resize_x * H / W);
        } else if (resize_x == 0) {
            t.up_width = tw = (int)((int64_t)resize_y * W / H);
            t.up_height = th = resize_y;
        } else {
            tw = resize_x;
            th = resize_y;
            // cover the target keeping the aspect ratio, then crop (A1111 truncate_x / truncate_y)
            if ((double)W / H < (double)resize_x / resize_y) {
                t.up_width = resize_x;
                t.up_height = (int)((int64_t)resize_x * H / W);
            } else {
                t.up_width = (int)((int64_t)resize_y * W / H);
                t.up_height = resize_y;
            }
        }
    }
    constexpr int kMaxSide = 16384;
    for (int v : {t.up_width, t.up_height, tw, th})
        if (v < multiple || v > kMaxSide)
            fail(ErrorKind::InvalidInput, "hires target {}x{} (upscaled {}x{}) from {}x{}: each side must be between {} and {} pixels", tw, th,
                 t.up_width, t.up_height, W, H, multiple, kMaxSide);
    t.up_width = t.up_width / multiple * multiple;
    t.up_height = t.up_height / multiple * multiple;
    t.width = tw / multiple * multiple;
    t.height = th / multiple * multiple;
    t.crop_x = (t.up_width - t.width) / f / 2;
    t.crop_y = (t.up_height - t.height) / f / 2;
    return t;
}

std::vector<float> interpolate_latent(std::span<const float> x, int64_t C, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                      LatentInterp mode, bool antialias) {
    if (C <= 0 || h <= 0 || w <= 0 || oh <= 0 || ow <= 0 || (int64_t)x.size() != C * h * w)
        fail(ErrorKind::InvalidInput, "interpolate_latent: latent [{}, {}, {}] ({} values) to {}x{}", C, h, w, x.size(), oh, ow);
    const auto tx = axis_taps(w, ow, mode, antialias), ty = axis_taps(h, oh, mode, antialias);
    std::vector<float> out((size_t)(C * oh * ow));
    if (antialias && (mode == LatentInterp::Bilinear || mode == LatentInterp::Bicubic)) {
        // separable (upsample_separable_Nd_kernel_impl): width first (into [C, h, ow]), then
        // height; each output v0 * w0, then fma(v_k, w_k, acc)
        auto sum = [](const Taps& t, auto&& v) {
            float acc = v(t.idx[0]) * t.wt[0];
            for (size_t k = 1; k < t.idx.size(); ++k) acc = std::fma(v(t.idx[k]), t.wt[k], acc);
            return acc;
        };
        std::vector<float> tmp((size_t)(C * h * ow));
        for (int64_t c = 0; c < C; ++c)
            for (int64_t y = 0; y < h; ++y) {
                const float* row = x.data() + (c * h + y) * w;
                for (int64_t i = 0; i < ow; ++i) tmp[(size_t)((c * h + y) * ow + i)] = sum(tx[(size_t)i], [&](int64_t k) { return row[k]; });
            }
        for (int64_t c = 0; c < C; ++c)
            for (int64_t j = 0; j < oh; ++j)
                for (int64_t i = 0; i < ow; ++i)
                    out[(size_t)((c * oh + j) * ow + i)] =
                        sum(ty[(size_t)j], [&](int64_t k) { return tmp[(size_t)((c * h + k) * ow + i)]; });
        return out;
    }
    if (mode == LatentInterp::Bilinear && oh + ow <= 128) {
        // torch's bilinear float kernel for small outputs (_use_channels_last_kernel_2d:
        // upsample_linear_channels_last): the four corner weights are products of the axis
        // weights, summed as fma(i11, w11, fma(i10, w10, fma(i00, w00, i01 * w01)))
        for (int64_t c = 0; c < C; ++c)
            for (int64_t j = 0; j < oh; ++j) {
                const Taps& t = ty[(size_t)j];
                const float* r0 = x.data() + (c * h + t.idx[0]) * w;
                const float* r1 = x.data() + (c * h + t.idx[1]) * w;
                for (int64_t i = 0; i < ow; ++i) {
                    const Taps& u = tx[(size_t)i];
                    const float w00 = t.wt[0] * u.wt[0], w01 = t.wt[0] * u.wt[1], w10 = t.wt[1] * u.wt[0], w11 = t.wt[1] * u.wt[1];
                    const float p01 = r0[u.idx[1]] * w01;
                    float acc = std::fma(r0[u.idx[0]], w00, p01);
                    acc = std::fma(r1[u.idx[0]], w10, acc);
                    out[(size_t)((c * oh + j) * ow + i)] = std::fma(r1[u.idx[1]], w11, acc);
                }
            }
        return out;
    }
    // the non-separable kernel (InterpolateNonSeparable: height outer, width inner)
    for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < oh; ++j) {
            const Taps& t = ty[(size_t)j];
            for (int64_t i = 0; i < ow; ++i) {
                const Taps& u = tx[(size_t)i];
                out[(size_t)((c * oh + j) * ow + i)] = tap_sum(t, [&](int64_t yk) {
                    const float* row = x.data() + (c * h + yk) * w;
                    return tap_sum(u, [&](int64_t xk) { return row[xk]; });
                });
            }
        }
    return out;
}

std::vector<float> crop_latent(std::span<const float> x, int64_t C, int64_t h, int64_t w, int64_t cx0, int64_t cy0, int64_t cw, int64_t ch) {
    if (cx0 < 0 || cy0 < 0 || cw <= 0 || ch <= 0 || cx0 + cw > w || cy0 + ch > h || (int64_t)x.size() != C * h * w)
        fail(ErrorKind::InvalidInput, "crop_latent: [{}, {}, {}] to {}x{} at ({}, {})", C, h, w, ch, cw, cy0, cx0);
    std::vector<float> r((size_t)(C * ch * cw));
    for (int64_t c = 0; c < C; ++c)
        for (int64_t y = 0; y < ch; ++y)
            std::copy_n(x.begin() + ((c * h + cy0 + y) * w + cx0), cw, r.begin() + (c * ch + y) * cw);
    return r;
}

Image resize_nearest_pil(const Image& in, int w, int h) {
    if (w <= 0 || h <= 0 || in.width <= 0 || in.height <= 0) fail(ErrorKind::InvalidInput, "resize to {}x{}: empty image", w, h);
    Image r;
    r.width = w;
    r.height = h;
    r.channels = in.channels;
    r.pixels.resize((size_t)w * h * in.channels);
    const double sx = (double)in.width / w, sy = (double)in.height / h;
    for (int y = 0; y < h; ++y) {
        const int yi = std::min(in.height - 1, (int)((y + 0.5) * sy));
        for (int x = 0; x < w; ++x) {
            const int xi = std::min(in.width - 1, (int)((x + 0.5) * sx));
            std::copy_n(in.pixels.begin() + ((size_t)yi * in.width + xi) * in.channels, in.channels,
                        r.pixels.begin() + ((size_t)y * w + x) * in.channels);
        }
    }
    return r;
}

Image resize_lanczos_pil(const Image& in, int w, int h) {
    if (in.width == w && in.height == h) return in;
    Image r;
    r.width = w;
    r.height = h;
    r.channels = in.channels;
    r.pixels = models::flux::pil_lanczos_resize(in.pixels, in.width, in.height, in.channels, w, h);
    return r;
}

HiresSchedule hires_schedule(int steps, double strength) {
    HiresSchedule s;
    s.run = std::max(1, steps);
    s.schedule_steps = std::max(s.run, (int)((double)s.run / std::min(strength, 0.999)));
    s.start = s.schedule_steps - s.run;
    return s;
}

std::vector<std::pair<std::string, std::string>> hires_infotext_fields(const HiresTarget& t, int hires_steps, const HiresUpscaler& up) {
    std::vector<std::pair<std::string, std::string>> r{{t.info_key, t.info_value}};
    if (hires_steps > 0) r.emplace_back("Hires steps", std::to_string(hires_steps));
    r.emplace_back("Hires upscaler", up.name);
    return r;
}

std::optional<HiresPassSize> hires_pass_size(const GenerateParams& p, int W, int H, int multiple, int f) {
    if (!p.hires || (!p.hires_a1111_none && ascii_lower(p.hires_upscaler) == "none")) return std::nullopt;
    check_hires_flags(p);
    // the float flag as written (0.1f -> 0.1), as generate reads it
    const double scale = std::strtod(fmt::format("{}", p.hires_scale).c_str(), nullptr);
    HiresPassSize r;
    r.up = p.hires_a1111_none ? resolve_hires_upscaler("Lanczos", "", "") : resolve_hires_upscaler(p.hires_upscaler, p.hires_upscalers_dir, p.upscale_model);
    r.target = hires_target(W, H, scale, p.hires_width, p.hires_height, multiple, f);
    r.encodes = !r.up.is_latent();
    return r;
}

void check_hires_flags(const GenerateParams& p) {
    if (!p.hires) return;
    if (!(p.hires_denoising_strength > 0.0f && p.hires_denoising_strength <= 1.0f))
        fail(ErrorKind::InvalidInput, "--hires-denoising-strength {} must be in (0, 1]; e.g. 0.7", p.hires_denoising_strength);
    if (p.hires_steps < 0) fail(ErrorKind::InvalidInput, "--hires-steps {} must be >= 0 (0: the first pass's --steps)", p.hires_steps);
    if (p.hires_width < 0 || p.hires_height < 0)
        fail(ErrorKind::InvalidInput, "--hires-width/--hires-height {}x{} must be >= 0 (0: from --hires-scale)", p.hires_width, p.hires_height);
    if (p.hires_width == 0 && p.hires_height == 0 && !(p.hires_scale > 0.0f && std::isfinite(p.hires_scale)))
        fail(ErrorKind::InvalidInput, "--hires-scale {} must be positive when --hires-width/--hires-height are not given", p.hires_scale);
    if (!p.hires_sigmas.empty()) {
        const auto s = sampling::parse_sigmas(p.hires_sigmas);
        if (s.size() < 2) fail(ErrorKind::InvalidInput, "--hires-sigmas needs at least two values (the first pass's noise level ... 0)");
    }
}

}  // namespace easel::pipeline
