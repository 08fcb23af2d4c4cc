// HostTensor: a float32 image or latent batch in host memory, PyTorch layout [N, C, H, W]
// (row-major, W fastest), which is the same memory as a contiguous ggml tensor of
// ne = {W, H, C, N}.
#pragma once

#include "core/error.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace easel::vae {

/// Float32 [N, C, H, W] tensor in host memory (ggml ne = {W, H, C, N}).
struct HostTensor {
    int64_t n = 0, c = 0, h = 0, w = 0;
    std::vector<float> data;  ///< n*c*h*w values, W fastest

    HostTensor() = default;
    HostTensor(int64_t n_, int64_t c_, int64_t h_, int64_t w_, float fill = 0.0f)
        : n(n_), c(c_), h(h_), w(w_), data(size_t(n_ * c_ * h_ * w_), fill) {}

    int64_t numel() const { return n * c * h * w; }
    /// Element [in, ic, iy, ix] (no bounds check).
    float& at(int64_t in, int64_t ic, int64_t iy, int64_t ix) { return data[size_t(((in * c + ic) * h + iy) * w + ix)]; }
    float at(int64_t in, int64_t ic, int64_t iy, int64_t ix) const { return data[size_t(((in * c + ic) * h + iy) * w + ix)]; }

    /// The rows [y0, y0+hh) and columns [x0, x0+ww) of every image and channel, clipped to the
    /// tensor (as PyTorch slicing t[:, :, y0:y0+hh, x0:x0+ww] does). Throws InvalidInput when the
    /// window starts outside the tensor.
    HostTensor crop(int64_t y0, int64_t x0, int64_t hh, int64_t ww) const {
        if (y0 < 0 || x0 < 0 || y0 >= h || x0 >= w)
            fail(ErrorKind::InvalidInput, "crop window at ({}, {}) lies outside a {}x{} tensor", y0, x0, h, w);
        hh = std::min(hh, h - y0);
        ww = std::min(ww, w - x0);
        HostTensor r(n, c, hh, ww);
        for (int64_t in = 0; in < n; ++in)
            for (int64_t ic = 0; ic < c; ++ic)
                for (int64_t y = 0; y < hh; ++y)
                    for (int64_t x = 0; x < ww; ++x) r.at(in, ic, y, x) = at(in, ic, y0 + y, x0 + x);
        return r;
    }
};

}  // namespace easel::vae
