#include "server/preview.h"

#include "core/error.h"
#include "core/strings.h"

#include <algorithm>
#include <cmath>

namespace easel::server {

PreviewMethod parse_preview_method(const std::string& name) {
    const std::string n = ascii_lower(name);
    if (n == "none") return PreviewMethod::None;
    if (n == "proj") return PreviewMethod::Proj;
    if (n == "vae" || n == "tae") return PreviewMethod::Vae;
    if (n == "auto") return PreviewMethod::Auto;
    fail(ErrorKind::InvalidInput, "--preview {}: use none, proj, vae (the model's decoder; TAESD when --taesd is given) or auto", name);
}

std::optional<pipeline::Image> proj_preview(std::span<const float> latent, int64_t channels, int64_t h, int64_t w) {
    // AUTOMATIC1111 sd_vae_approx.cheap_approximation, SD1.x/SD2.x latent: rows = latent
    // channels, columns = R, G, B; applied to the scaled (diffusion-space) latent.
    static constexpr float kSd[4][3] = {
        {0.298f, 0.207f, 0.208f},
        {0.187f, 0.286f, 0.173f},
        {-0.158f, 0.189f, 0.264f},
        {-0.184f, -0.271f, -0.473f},
    };
    if (channels != 4 || h <= 0 || w <= 0 || (int64_t)latent.size() < channels * h * w) return std::nullopt;
    pipeline::Image img;
    img.width = (int)w;
    img.height = (int)h;
    img.channels = 3;
    img.pixels.resize((size_t)(h * w * 3));
    const size_t plane = (size_t)(h * w);
    for (size_t i = 0; i < plane; ++i)
        for (int c = 0; c < 3; ++c) {
            float v = 0;
            for (int k = 0; k < 4; ++k) v += latent[k * plane + i] * kSd[k][c];
            const float u = std::clamp((v + 1.0f) * 0.5f, 0.0f, 1.0f);
            img.pixels[i * 3 + c] = (uint8_t)std::lround(u * 255.0f);
        }
    return img;
}

}  // namespace easel::server
