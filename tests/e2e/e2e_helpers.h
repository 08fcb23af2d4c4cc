// Helpers shared by the end-to-end parity tests against diffusers' tiny pipelines
// (Z-Image, FLUX.1, FLUX.2 Klein): reference tensors, error measures, and images as diffusers
// turns them into uint8.
#pragma once

#include "io/weight_index.h"
#include "models/vae/host_tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace easel::test {

/// Tensor `name` of a reference file as F32. Throws std::runtime_error when it is missing.
inline std::vector<float> read_f32(const io::WeightIndex& idx, const std::string& name) {
    const io::TensorInfo* t = idx.find(name);
    if (!t) throw std::runtime_error("reference tensor missing: " + name);
    return idx.read_f32(*t);
}

/// Largest |a[i]|.
inline double max_abs(std::span<const float> a) {
    double m = 0;
    for (float v : a) m = std::max(m, (double)std::fabs(v));
    return m;
}

/// Largest |a[i] - b[i]|; infinity when the sizes differ.
inline double max_abs_diff(std::span<const float> a, std::span<const float> b) {
    double m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, (double)std::fabs(a[i] - b[i]));
    return a.size() == b.size() ? m : INFINITY;
}

/// [1, 3, H, W] in about [-1, 1] -> uint8 HWC as diffusers: ((x / 2 + 0.5).clamp(0, 1) * 255).round().
inline std::vector<uint8_t> to_u8(const vae::HostTensor& img) {
    std::vector<uint8_t> r((size_t)(img.h * img.w * 3));
    for (int64_t y = 0; y < img.h; ++y)
        for (int64_t x = 0; x < img.w; ++x)
            for (int64_t c = 0; c < 3; ++c) {
                float v = std::clamp(img.at(0, c, y, x) / 2.0f + 0.5f, 0.0f, 1.0f);
                r[(size_t)((y * img.w + x) * 3 + c)] = (uint8_t)std::lround(v * 255.0f);
            }
    return r;
}

/// Largest per-channel difference of two uint8 images (256 when the sizes differ).
inline int max_pixel_diff(std::span<const uint8_t> a, std::span<const uint8_t> b) {
    if (a.size() != b.size()) return 256;
    int m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs((int)a[i] - (int)b[i]));
    return m;
}

}  // namespace easel::test
