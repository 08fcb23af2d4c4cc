// A plain double-precision RRDBNet and SRVGGNetCompact for the tests, written from the published
// definitions (ESRGAN / Real-ESRGAN papers; BasicSR rrdbnet_arch.py and Real-ESRGAN srvgg_arch.py
// as esrgan.h summarises them) with loops, no ggml: what easel's graphs are compared with.
#pragma once

#include "io/weight_index.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace easel::test {

/// [C, H, W] in double.
struct RefImage {
    int c = 0, h = 0, w = 0;
    std::vector<double> v;
    RefImage() = default;
    RefImage(int c_, int h_, int w_) : c(c_), h(h_), w(w_), v((size_t)c_ * h_ * w_, 0.0) {}
    double& at(int k, int y, int x) { return v[((size_t)k * h + y) * w + x]; }
    double at(int k, int y, int x) const { return v[((size_t)k * h + y) * w + x]; }
};

/// Weights by name (BasicSR names for RRDBNet, body.N for SRVGGNetCompact).
using RefWeights = std::function<std::vector<float>(const std::string&)>;

inline RefWeights ref_weights(const io::WeightIndex& wi, const std::string& prefix = "") {
    return [&wi, prefix](const std::string& n) {
        const io::TensorInfo* t = wi.find(prefix + n);
        if (!t) throw std::runtime_error("reference: no tensor " + n);
        return wi.read_f32(*t);
    };
}

/// 3x3 convolution, stride 1, zero padding 1: out[o][y][x] = b[o] + sum_{c,ky,kx} w[o][c][ky][kx] x[c][y+ky-1][x+kx-1].
inline RefImage ref_conv(const RefWeights& W, const std::string& name, const RefImage& x, int out) {
    const auto w = W(name + ".weight"), b = W(name + ".bias");
    RefImage y(out, x.h, x.w);
    for (int o = 0; o < out; ++o)
        for (int yy = 0; yy < x.h; ++yy)
            for (int xx = 0; xx < x.w; ++xx) {
                double s = b[(size_t)o];
                for (int c = 0; c < x.c; ++c)
                    for (int ky = 0; ky < 3; ++ky) {
                        const int sy = yy + ky - 1;
                        if (sy < 0 || sy >= x.h) continue;
                        for (int kx = 0; kx < 3; ++kx) {
                            const int sx = xx + kx - 1;
                            if (sx < 0 || sx >= x.w) continue;
                            s += (double)w[(((size_t)o * x.c + c) * 3 + ky) * 3 + kx] * x.at(c, sy, sx);
                        }
                    }
                y.at(o, yy, xx) = s;
            }
    return y;
}

inline RefImage ref_lrelu(RefImage x) {
    for (auto& e : x.v) e = e > 0 ? e : 0.2 * e;
    return x;
}

inline RefImage ref_cat(const RefImage& a, const RefImage& b) {
    RefImage r(a.c + b.c, a.h, a.w);
    std::copy(a.v.begin(), a.v.end(), r.v.begin());
    std::copy(b.v.begin(), b.v.end(), r.v.begin() + (ptrdiff_t)a.v.size());
    return r;
}

/// y = a * s + b (elementwise).
inline RefImage ref_axpy(const RefImage& a, double s, const RefImage& b) {
    RefImage r = b;
    for (size_t i = 0; i < r.v.size(); ++i) r.v[i] = a.v[i] * s + b.v[i];
    return r;
}

inline RefImage ref_nearest(const RefImage& x, int s) {
    RefImage r(x.c, x.h * s, x.w * s);
    for (int c = 0; c < x.c; ++c)
        for (int y = 0; y < r.h; ++y)
            for (int xx = 0; xx < r.w; ++xx) r.at(c, y, xx) = x.at(c, y / s, xx / s);
    return r;
}

inline RefImage ref_unshuffle(const RefImage& x, int u) {
    RefImage r(x.c * u * u, x.h / u, x.w / u);
    for (int c = 0; c < x.c; ++c)
        for (int i = 0; i < u; ++i)
            for (int j = 0; j < u; ++j)
                for (int y = 0; y < r.h; ++y)
                    for (int xx = 0; xx < r.w; ++xx) r.at((c * u + i) * u + j, y, xx) = x.at(c, y * u + i, xx * u + j);
    return r;
}

inline RefImage ref_shuffle(const RefImage& x, int s) {
    RefImage r(x.c / (s * s), x.h * s, x.w * s);
    for (int c = 0; c < r.c; ++c)
        for (int i = 0; i < s; ++i)
            for (int j = 0; j < s; ++j)
                for (int y = 0; y < x.h; ++y)
                    for (int xx = 0; xx < x.w; ++xx) r.at(c, y * s + i, xx * s + j) = x.at((c * s + i) * s + j, y, xx);
    return r;
}

/// RRDBNet (BasicSR): feat, grow, blocks, upsampling stages and the unshuffle factor u.
inline RefImage ref_rrdbnet(const RefWeights& W, const RefImage& img, int feat, int grow, int blocks, int ups, int u) {
    RefImage x = u > 1 ? ref_unshuffle(img, u) : img;
    const RefImage first = ref_conv(W, "conv_first", x, feat);
    RefImage h = first;
    for (int n = 0; n < blocks; ++n) {
        RefImage in = h;
        for (int r = 1; r <= 3; ++r) {
            const std::string p = "body." + std::to_string(n) + ".rdb" + std::to_string(r) + ".conv";
            RefImage cat = h;
            for (int c = 1; c <= 4; ++c) cat = ref_cat(cat, ref_lrelu(ref_conv(W, p + std::to_string(c), cat, grow)));
            h = ref_axpy(ref_conv(W, p + "5", cat, feat), 0.2, h);
        }
        h = ref_axpy(h, 0.2, in);
    }
    RefImage feat_map = ref_axpy(ref_conv(W, "conv_body", h, feat), 1.0, first);
    for (int k = 1; k <= ups; ++k) feat_map = ref_lrelu(ref_conv(W, "conv_up" + std::to_string(k), ref_nearest(feat_map, 2), feat));
    return ref_conv(W, "conv_last", ref_lrelu(ref_conv(W, "conv_hr", feat_map, feat)), 3);
}

/// SRVGGNetCompact (PReLU): feat, num_conv, scale.
inline RefImage ref_srvgg(const RefWeights& W, const RefImage& img, int feat, int num_conv, int scale) {
    RefImage h = img;
    for (int k = 0; k <= num_conv; ++k) {
        h = ref_conv(W, "body." + std::to_string(2 * k), h, feat);
        const auto a = W("body." + std::to_string(2 * k + 1) + ".weight");
        for (int c = 0; c < h.c; ++c)
            for (int y = 0; y < h.h; ++y)
                for (int x = 0; x < h.w; ++x) {
                    double& e = h.at(c, y, x);
                    e = std::max(0.0, e) + a[(size_t)c] * std::min(0.0, e);
                }
    }
    h = ref_conv(W, "body." + std::to_string(2 * num_conv + 2), h, 3 * scale * scale);
    return ref_axpy(ref_shuffle(h, scale), 1.0, ref_nearest(img, scale));
}

/// A deterministic test image: smooth gradients plus a pattern, values in [0, 1].
inline RefImage ref_test_image(int h, int w, int seed = 0) {
    RefImage r(3, h, w);
    for (int c = 0; c < 3; ++c)
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x)
                r.at(c, y, x) = 0.5 + 0.35 * std::sin(0.37 * x + 0.23 * y * (c + 1) + seed) * std::cos(0.11 * (x - y) + c);
    return r;
}

}  // namespace easel::test
