// FLUX.2 VAE latent space (see flux2_vae.h).
#include "models/flux/flux2_vae.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <cmath>

namespace easel::models::flux {

Flux2LatentStats Flux2LatentStats::load(const io::WeightIndex& index) {
    for (const char* p : {"", "vae.", "first_stage_model."}) {
        const io::TensorInfo* m = index.find(std::string(p) + "bn.running_mean");
        const io::TensorInfo* v = index.find(std::string(p) + "bn.running_var");
        if (!m || !v) continue;
        Flux2LatentStats s;
        s.mean = index.read_f32(*m);
        s.var = index.read_f32(*v);
        if (s.mean.empty() || s.mean.size() != s.var.size() || s.mean.size() % 4 != 0)
            fail(ErrorKind::ModelMismatch, "FLUX.2 VAE: bn.running_mean ({}) and bn.running_var ({}) must have one equal size, a multiple of 4",
                 s.mean.size(), s.var.size());
        if (const nlohmann::json* cfg = index.config(); cfg && cfg->contains("batch_norm_eps")) {
            const auto& e = (*cfg)["batch_norm_eps"];
            if (!e.is_number() || e.get<double>() < 0)
                fail(ErrorKind::InvalidInput, "FLUX.2 VAE config: batch_norm_eps must be a non-negative number");
            s.eps = e.get<float>();
        }
        return s;
    }
    fail(ErrorKind::ModelMismatch,
         "FLUX.2 VAE: the BatchNorm statistics 'bn.running_mean' / 'bn.running_var' are missing; this is not a FLUX.2 VAE");
}

vae::HostTensor patchify_2x2(const vae::HostTensor& z) {
    if (z.h % 2 != 0 || z.w % 2 != 0) fail(ErrorKind::InvalidInput, "FLUX.2 patchify: latent size {}x{} must be even", z.w, z.h);
    vae::HostTensor o(z.n, z.c * 4, z.h / 2, z.w / 2);
    for (int64_t n = 0; n < z.n; ++n)
        for (int64_t c = 0; c < z.c; ++c)
            for (int64_t y = 0; y < z.h; ++y)
                for (int64_t x = 0; x < z.w; ++x) o.at(n, c * 4 + (y % 2) * 2 + (x % 2), y / 2, x / 2) = z.at(n, c, y, x);
    return o;
}

vae::HostTensor unpatchify_2x2(const vae::HostTensor& z) {
    if (z.c % 4 != 0) fail(ErrorKind::InvalidInput, "FLUX.2 unpatchify: {} channels are not a multiple of 4", z.c);
    vae::HostTensor o(z.n, z.c / 4, z.h * 2, z.w * 2);
    for (int64_t n = 0; n < o.n; ++n)
        for (int64_t c = 0; c < o.c; ++c)
            for (int64_t y = 0; y < o.h; ++y)
                for (int64_t x = 0; x < o.w; ++x) o.at(n, c, y, x) = z.at(n, c * 4 + (y % 2) * 2 + (x % 2), y / 2, x / 2);
    return o;
}

vae::HostTensor flux2_vae_to_diffusion(const vae::HostTensor& z, const Flux2LatentStats& s) {
    if (int64_t(s.mean.size()) != z.c * 4)
        fail(ErrorKind::InvalidInput, "FLUX.2 latent: {} VAE channels do not match statistics of {} patchified channels", z.c,
             s.mean.size());
    vae::HostTensor p = patchify_2x2(z);
    const int64_t hw = p.h * p.w;
    for (int64_t n = 0; n < p.n; ++n)
        for (int64_t c = 0; c < p.c; ++c) {
            const float m = s.mean[size_t(c)], sd = std::sqrt(s.var[size_t(c)] + s.eps);
            float* d = p.data.data() + (n * p.c + c) * hw;
            for (int64_t i = 0; i < hw; ++i) d[i] = (d[i] - m) / sd;
        }
    return p;
}

vae::HostTensor flux2_diffusion_to_vae(const vae::HostTensor& x, const Flux2LatentStats& s) {
    if (int64_t(s.mean.size()) != x.c)
        fail(ErrorKind::InvalidInput, "FLUX.2 latent: {} channels do not match the VAE statistics ({})", x.c, s.mean.size());
    vae::HostTensor p = x;
    const int64_t hw = p.h * p.w;
    for (int64_t n = 0; n < p.n; ++n)
        for (int64_t c = 0; c < p.c; ++c) {
            const float m = s.mean[size_t(c)], sd = std::sqrt(s.var[size_t(c)] + s.eps);
            float* d = p.data.data() + (n * p.c + c) * hw;
            for (int64_t i = 0; i < hw; ++i) d[i] = d[i] * sd + m;
        }
    return unpatchify_2x2(p);
}

std::vector<float> flux2_pack_tokens(const vae::HostTensor& x) {
    std::vector<float> t(x.data.size());
    const int64_t hw = x.h * x.w;
    for (int64_t n = 0; n < x.n; ++n)
        for (int64_t c = 0; c < x.c; ++c)
            for (int64_t i = 0; i < hw; ++i) t[size_t((n * hw + i) * x.c + c)] = x.data[size_t((n * x.c + c) * hw + i)];
    return t;
}

vae::HostTensor flux2_unpack_tokens(const std::vector<float>& tokens, int64_t n, int64_t c, int64_t h, int64_t w) {
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0 || int64_t(tokens.size()) != n * c * h * w)
        fail(ErrorKind::InvalidInput, "FLUX.2 tokens: {} values are not [{}, {}x{}, {}]", tokens.size(), n, h, w, c);
    vae::HostTensor x(n, c, h, w);
    const int64_t hw = h * w;
    for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < c; ++ch)
            for (int64_t i = 0; i < hw; ++i) x.data[size_t((b * c + ch) * hw + i)] = tokens[size_t((b * hw + i) * c + ch)];
    return x;
}

}  // namespace easel::models::flux
