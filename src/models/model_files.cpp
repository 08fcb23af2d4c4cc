#include "models/model_files.h"
#include "core/platform.h"

#include "core/error.h"
#include "core/strings.h"

#include <fstream>

namespace easel::models {

namespace fs = std::filesystem;

std::unique_ptr<io::WeightIndex> open_index(const std::string& path, const std::string& flag) {
    std::error_code ec;
    const fs::path p = platform::u8path(path);
    if (!fs::exists(p, ec)) fail(ErrorKind::Io, "{} {}: no such file or folder", flag, path);
    return std::make_unique<io::WeightIndex>(io::WeightIndex::open(p));
}

std::optional<nlohmann::json> read_json(const fs::path& p) {
    std::ifstream f(p);
    if (!f) return std::nullopt;
    try {
        return nlohmann::json::parse(f);
    } catch (const std::exception& e) {
        fail(ErrorKind::InvalidInput, "{}: not valid JSON ({})", platform::path_utf8(p), e.what());
    }
}

ggml_type parse_weight_type(const std::string& name) {
    if (name.empty()) return GGML_TYPE_COUNT;
    const std::string want = ascii_lower(name);
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char* tn = ggml_type_name((ggml_type)t);
        const auto* tr = ggml_get_type_traits((ggml_type)t);
        if (!tn || tr->blck_size == 0 || ascii_lower(tn) != want) continue;
        if (!tr->is_quantized || tr->from_float_ref) return (ggml_type)t;
    }
    fail(ErrorKind::InvalidInput, "--type {}: unknown weight type (use f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1, q2_K, q3_K, q4_K, q5_K, q6_K)", name);
}

size_t bound_bytes(const nn::Block& root) {
    size_t n = 0;
    root.visit_params("", [&](const std::string&, const nn::Param& p) {
        if (p.tensor) n += ggml_nbytes(p.tensor);
    });
    return n;
}

int64_t kl_latent_channels(const io::WeightIndex& index, const vae::KLSource& src) {
    if (const io::TensorInfo* t = index.find(src.prefix + "decoder.conv_in.weight"); t && t->shape.size() == 4) return t->shape[1];
    if (const io::TensorInfo* t = index.find(src.prefix + "encoder.conv_out.weight"); t && t->shape.size() == 4) return t->shape[0] / 2;
    return 0;
}

void check_vae_kind(const io::WeightIndex& index, const vae::KLSource& src, int64_t want, const std::string& flag_and_path,
                    const std::string& family, const std::string& needed) {
    const int64_t c = kl_latent_channels(index, src);
    if (c == 0 || c == want) return;
    // the VAEs of the families easel runs, by latent channels
    const std::string kind = c == 4    ? "an SD VAE (4 latent channels)"
                             : c == 16 ? "a FLUX.1 / Z-Image VAE (16 latent channels)"
                             : c == 32 ? "a FLUX.2 VAE (32 latent channels)"
                                       : fmt::format("a VAE with {} latent channels", c);
    fail(ErrorKind::ModelMismatch, "{}: {}; {} needs {}", flag_and_path, kind, family, needed);
}

}  // namespace easel::models
