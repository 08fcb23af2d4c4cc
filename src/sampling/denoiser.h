// The denoiser: wraps the network call (a callback) and classifier-free guidance into
// k-diffusion's D(x; sigma), the estimate of the clean latent x0.
//
// Scalings (Karras et al. 2022, arXiv:2206.00364, Table 1; k-diffusion external.py
// DiscreteEpsDDPMDenoiser / DiscreteVDDPMDenoiser; ComfyUI model_sampling.py CONST):
//   eps:  c_in = 1/sqrt(sigma^2+1), c_skip = 1,                c_out = -sigma
//   v:    c_in = 1/sqrt(sigma^2+1), c_skip = 1/(sigma^2+1),    c_out = -sigma/sqrt(sigma^2+1)
//   flow: c_in = 1,                 c_skip = 1,                c_out = -sigma
//   D(x; sigma) = c_skip*x + c_out*F(c_in*x, t(sigma))
// CFG (Ho & Salimans 2022, arXiv:2207.12598): F = F_uncond + cfg_scale*(F_cond - F_uncond);
// with cfg_scale == 1 only the conditional pass runs.
#pragma once

#include "sampling/schedule.h"

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace easel::sampling {

/// Which conditioning a network call uses.
enum class Branch { Cond, Uncond };

/// The network: given the scaled input x_in (the latent layout of the sampler, e.g.
/// [N, C, H, W], ggml ne {W, H, C, N}) and the timestep (ModelSampling::sigma_to_t units:
/// 0..T-1 for discrete models, sigma*T for flow models), writes the raw prediction (eps, v or
/// flow velocity), same shape as x_in, into out (out.size() == x_in.size()).
using ModelFn = std::function<void(std::span<const float> x_in, double timestep, Branch branch, std::span<float> out)>;

/// D(x; sigma) over a model callback, with CFG.
class Denoiser {
public:
    /// cfg_scale: guidance scale (1 = no guidance, one call per evaluation). Throws
    /// Error(InvalidInput) if model is empty or cfg_scale is not finite.
    Denoiser(ModelSampling ms, ModelFn model, float cfg_scale = 1.0f);

    struct Scalings {
        double c_skip, c_out, c_in;
    };
    /// The scalings for sigma (see the file comment).
    Scalings scalings(double sigma) const;

    /// Writes D(x; sigma) into out (same size as x). timestep: the network timestep for
    /// sigma; pass NaN to use model_sampling().sigma_to_t(sigma). Throws Error(InvalidInput)
    /// on size mismatch or a non-finite / negative sigma, Error(Internal) if the model callback
    /// returns non-finite values.
    void denoise(std::span<const float> x, double sigma, double timestep, std::span<float> out);
    /// As denoise, and also writes the unconditional estimate D_uncond(x; sigma) =
    /// c_skip*x + c_out*F_uncond into uncond_out (same size as x), for the CFG++ samplers
    /// (Chung et al. 2024, arXiv:2406.08070; ComfyUI's post-CFG uncond_denoised). At cfg_scale 1
    /// the unconditional pass still runs (ComfyUI's disable_cfg1_optimization), and out is D_cond.
    void denoise(std::span<const float> x, double sigma, double timestep, std::span<float> out, std::span<float> uncond_out);

    const ModelSampling& model_sampling() const { return ms_; }
    float cfg_scale() const { return cfg_scale_; }
    /// Number of network calls made so far (two per evaluation with CFG).
    int64_t model_calls() const { return calls_; }

private:
    ModelSampling ms_;
    ModelFn model_;
    float cfg_scale_;
    int64_t calls_ = 0;
    std::vector<float> x_in_, cond_, uncond_;
};

}  // namespace easel::sampling
