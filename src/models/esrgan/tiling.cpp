// Tiled upscaling (see tiling.h).
#include "models/esrgan/tiling.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace easel::esrgan {

std::vector<int64_t> tile_origins(int64_t length, int64_t tile, int64_t overlap, int64_t align) {
    if (length <= 0 || tile <= 0 || align <= 0 || overlap < 0)
        fail(ErrorKind::InvalidInput, "tiles of {} pixels overlapping by {} over {} pixels", tile, overlap, length);
    if (length <= tile) return {0};
    if (tile <= overlap) fail(ErrorKind::InvalidInput, "a tile of {} pixels must be larger than its overlap of {}", tile, overlap);
    if (tile % align || length % align)
        fail(ErrorKind::InvalidInput, "tile {} and length {} must be multiples of {}", tile, length, align);
    const int64_t n = (length - overlap + (tile - overlap) - 1) / (tile - overlap);
    std::vector<int64_t> o((size_t)n);
    for (int64_t k = 0; k < n; ++k) o[(size_t)k] = (k * (length - tile) / (n - 1)) / align * align;
    o.back() = length - tile;
    return o;
}

int64_t default_overlap(int64_t tile, int64_t align, int64_t context) {
    int64_t v = std::min(std::max({(int64_t)16, tile / 4, 4 * context}), tile / 2);
    return std::max<int64_t>(0, v / align * align);
}

namespace {

/// Weights of one axis of a tile: `len` output pixels, overlaps (input pixels) with the previous
/// and the next tile, `s` output pixels per input pixel.
std::vector<float> axis_weights(int64_t len, int64_t ov_before, int64_t ov_after, int s) {
    std::vector<float> w((size_t)len, 1.0f);
    auto ramp = [&](int64_t ov, int64_t from_edge) -> double {
        if (ov <= 0) return 1.0;
        const double v = (double)ov * s;                    // the overlap in output pixels
        const double d = (double)from_edge + 0.5 - v / 4.0;  // past the cut-off quarter
        return std::clamp(d / (v / 2.0), 0.0, 1.0);
    };
    for (int64_t i = 0; i < len; ++i) w[(size_t)i] = (float)(ramp(ov_before, i) * ramp(ov_after, len - 1 - i));
    return w;
}

}  // namespace

vae::HostTensor tiled_upscale(const vae::HostTensor& in, int64_t tile, int64_t overlap, int scale, int64_t align,
                              const std::function<vae::HostTensor(const vae::HostTensor&)>& fn, const std::function<void(int, int)>& on_tile) {
    if (in.n != 1 || in.h <= 0 || in.w <= 0) fail(ErrorKind::InvalidInput, "tiled upscale of an empty image or a batch");
    if (scale <= 0) fail(ErrorKind::InvalidInput, "upscale factor {}", scale);
    auto check = [&](const vae::HostTensor& t, const vae::HostTensor& o) {
        if (o.n != 1 || o.h != t.h * scale || o.w != t.w * scale)
            fail(ErrorKind::Internal, "the upscaler returned {}x{} for a {}x{} input at scale {}", o.w, o.h, t.w, t.h, scale);
    };
    if (tile <= 0 || (tile >= in.h && tile >= in.w)) {
        vae::HostTensor o = fn(in);
        check(in, o);
        if (on_tile) on_tile(1, 1);
        return o;
    }
    const int64_t th = std::min(tile, in.h), tw = std::min(tile, in.w);
    const auto ys = tile_origins(in.h, th, std::min(overlap, th - align), align);
    const auto xs = tile_origins(in.w, tw, std::min(overlap, tw - align), align);
    vae::HostTensor acc;
    std::vector<float> wsum((size_t)(in.h * scale * in.w * scale), 0.0f);
    const int total = (int)(ys.size() * xs.size());
    int done = 0;
    for (size_t a = 0; a < ys.size(); ++a) {
        const int64_t ob = a > 0 ? ys[a - 1] + th - ys[a] : 0, oa = a + 1 < ys.size() ? ys[a] + th - ys[a + 1] : 0;
        const auto wy = axis_weights(th * scale, ob, oa, scale);
        for (size_t b = 0; b < xs.size(); ++b) {
            const int64_t lb = b > 0 ? xs[b - 1] + tw - xs[b] : 0, la = b + 1 < xs.size() ? xs[b] + tw - xs[b + 1] : 0;
            const auto wx = axis_weights(tw * scale, lb, la, scale);
            const vae::HostTensor t = in.crop(ys[a], xs[b], th, tw);
            const vae::HostTensor o = fn(t);
            check(t, o);
            if (acc.data.empty()) acc = vae::HostTensor(1, o.c, in.h * scale, in.w * scale);
            if (o.c != acc.c) fail(ErrorKind::Internal, "the upscaler returned {} channels, then {}", acc.c, o.c);
            const int64_t y0 = ys[a] * scale, x0 = xs[b] * scale;
            for (int64_t y = 0; y < o.h; ++y)
                for (int64_t x = 0; x < o.w; ++x) {
                    const float w = wy[(size_t)y] * wx[(size_t)x];
                    if (w == 0.0f) continue;
                    wsum[(size_t)((y0 + y) * acc.w + x0 + x)] += w;
                    for (int64_t c = 0; c < o.c; ++c) acc.at(0, c, y0 + y, x0 + x) += w * o.at(0, c, y, x);
                }
            if (on_tile) on_tile(++done, total);
        }
    }
    for (int64_t y = 0; y < acc.h; ++y)
        for (int64_t x = 0; x < acc.w; ++x) {
            const float s = wsum[(size_t)(y * acc.w + x)];
            if (!(s > 0.0f)) fail(ErrorKind::Internal, "tiled upscale left pixel ({}, {}) without a tile", x, y);
            for (int64_t c = 0; c < acc.c; ++c) acc.at(0, c, y, x) /= s;
        }
    return acc;
}

vae::HostTensor pad_reflect_to_multiple(const vae::HostTensor& in, int64_t m) {
    const int64_t H = (in.h + m - 1) / m * m, W = (in.w + m - 1) / m * m;
    if (H == in.h && W == in.w) return in;
    auto src = [](int64_t i, int64_t n) {  // numpy 'reflect' index (period 2n - 2), 'edge' when n == 1
        if (n == 1) return (int64_t)0;
        const int64_t p = 2 * n - 2;
        i %= p;
        return i < n ? i : p - i;
    };
    vae::HostTensor r(in.n, in.c, H, W);
    for (int64_t n = 0; n < in.n; ++n)
        for (int64_t c = 0; c < in.c; ++c)
            for (int64_t y = 0; y < H; ++y)
                for (int64_t x = 0; x < W; ++x) r.at(n, c, y, x) = in.at(n, c, src(y, in.h), src(x, in.w));
    return r;
}

}  // namespace easel::esrgan
