// Denoiser: see denoiser.h for the formulas and their sources.
#include "sampling/denoiser.h"

#include "core/error.h"

#include <cmath>

namespace easel::sampling {

Denoiser::Denoiser(ModelSampling ms, ModelFn model, float cfg_scale)
    : ms_(std::move(ms)), model_(std::move(model)), cfg_scale_(cfg_scale) {
    if (!model_) fail(ErrorKind::InvalidInput, "Denoiser needs a model callback");
    if (!std::isfinite(cfg_scale_)) fail(ErrorKind::InvalidInput, "CFG scale must be finite, got {}", cfg_scale_);
}

Denoiser::Scalings Denoiser::scalings(double sigma) const {
    switch (ms_.prediction()) {
        case Prediction::Eps: return {1.0, -sigma, 1.0 / std::sqrt(sigma * sigma + 1.0)};
        case Prediction::V: {
            const double s2 = sigma * sigma + 1.0;
            return {1.0 / s2, -sigma / std::sqrt(s2), 1.0 / std::sqrt(s2)};
        }
        case Prediction::Flow: return {1.0, -sigma, 1.0};
    }
    return {1.0, -sigma, 1.0};
}

void Denoiser::denoise(std::span<const float> x, double sigma, double timestep, std::span<float> out) {
    denoise(x, sigma, timestep, out, {});
}

void Denoiser::denoise(std::span<const float> x, double sigma, double timestep, std::span<float> out, std::span<float> uncond_out) {
    const bool want_uncond = !uncond_out.empty();
    if (want_uncond && uncond_out.size() != x.size())
        fail(ErrorKind::InvalidInput, "denoise: unconditional output has {} elements, input {}", uncond_out.size(), x.size());
    if (out.size() != x.size())
        fail(ErrorKind::InvalidInput, "denoise: output has {} elements, input {}", out.size(), x.size());
    if (!std::isfinite(sigma) || sigma < 0) fail(ErrorKind::InvalidInput, "denoise: bad sigma {}", sigma);
    if (std::isnan(timestep)) timestep = ms_.sigma_to_t(sigma);
    const size_t n = x.size();
    const Scalings sc = scalings(sigma);
    x_in_.resize(n);
    if (sc.c_in == 1.0) {
        std::copy(x.begin(), x.end(), x_in_.begin());
    } else {
        const float c_in = static_cast<float>(sc.c_in);
        for (size_t i = 0; i < n; ++i) x_in_[i] = x[i] * c_in;
    }
    cond_.assign(n, 0.0f);
    model_(x_in_, timestep, Branch::Cond, cond_);
    ++calls_;
    const bool guided = cfg_scale_ != 1.0f;
    if (guided || want_uncond) {
        uncond_.assign(n, 0.0f);
        model_(x_in_, timestep, Branch::Uncond, uncond_);
        ++calls_;
    }
    const double scale = cfg_scale_;
    for (size_t i = 0; i < n; ++i) {
        double f = cond_[i];
        if (guided) f = uncond_[i] + scale * (cond_[i] - uncond_[i]);
        const double d = sc.c_skip * x[i] + sc.c_out * f;
        if (!std::isfinite(d))
            fail(ErrorKind::Internal, "the model returned a non-finite value at element {} (sigma {})", i, sigma);
        out[i] = static_cast<float>(d);
        if (want_uncond) {
            const double du = sc.c_skip * x[i] + sc.c_out * static_cast<double>(uncond_[i]);
            if (!std::isfinite(du))
                fail(ErrorKind::Internal, "the model returned a non-finite value at element {} (sigma {})", i, sigma);
            uncond_out[i] = static_cast<float>(du);
        }
    }
}

}  // namespace easel::sampling
