// The FLUX.1 / Z-Image VAE (16 latent channels, no quant_conv / post_quant_conv) in the original
// BFL / ldm layout (FLUX.1 ae.safetensors: bare "encoder.down.0.block.0..." keys; ComfyUI
// single files: under "vae."), checked against the diffusers fixture
// tests/data/reference/autoencoder_kl_flux_tiny; and a TAEF1-shaped tiny autoencoder (TAESD
// with 16 latent channels) built around the 4-channel AutoencoderTiny fixture.
#include "core/error.h"
#include "io/detect.h"
#include "io/weight_index.h"
#include "models/vae/autoencoder_kl.h"
#include "models/vae/latent_format.h"
#include "models/vae/taesd.h"

#include <ggml-backend.h>
#include <ggml-cpu.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include <unistd.h>

using namespace easel;
using vae::HostTensor;

namespace {

std::filesystem::path ref(const std::string& name) { return std::filesystem::path(EASEL_TEST_DATA) / "reference" / name; }

HostTensor read4(const io::WeightIndex& idx, const std::string& name) {
    const io::TensorInfo* t = idx.find(name);
    if (!t || t->shape.size() != 4) throw std::runtime_error("fixture lacks a 4-D " + name);
    HostTensor h(t->shape[0], t->shape[1], t->shape[2], t->shape[3]);
    h.data = idx.read_f32(*t);
    return h;
}

float max_abs_diff(const HostTensor& a, const HostTensor& b) {
    EXPECT_EQ(a.n, b.n);
    EXPECT_EQ(a.c, b.c);
    EXPECT_EQ(a.h, b.h);
    EXPECT_EQ(a.w, b.w);
    if (a.data.size() != b.data.size()) return INFINITY;
    float m = 0;
    for (size_t i = 0; i < a.data.size(); ++i) m = std::max(m, std::fabs(a.data[i] - b.data[i]));
    return m;
}

struct Backend {
    ggml_backend_t b = ggml_backend_cpu_init();
    ~Backend() { ggml_backend_free(b); }
};

struct StTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
};
void write_safetensors(const std::filesystem::path& path, const std::vector<StTensor>& ts) {
    nlohmann::json h = nlohmann::json::object();
    size_t off = 0;
    for (auto& t : ts) {
        h[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + t.data.size() * 4}}};
        off += t.data.size() * 4;
    }
    std::string hs = h.dump();
    while (hs.size() % 8) hs += ' ';
    std::ofstream f(path, std::ios::binary);
    uint64_t n = hs.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(hs.data(), std::streamsize(hs.size()));
    for (auto& t : ts) f.write(reinterpret_cast<const char*>(t.data.data()), std::streamsize(t.data.size() * 4));
}

std::filesystem::path temp(const std::string& stem) {
    return std::filesystem::temp_directory_path() / ("easel_vae_flux1_" + stem + "_" + std::to_string(::getpid()) + ".safetensors");
}

// diffusers -> ldm (BFL) names, from the ldm naming rules that diffusers'
// loaders/single_file_utils.py (convert_ldm_vae_checkpoint) undoes.
std::string to_ldm(std::string k, int n_levels) {
    std::smatch m;
    static const std::regex up_re(R"(^decoder\.up_blocks\.(\d+)\.(resnets|upsamplers)\.(\d+)\.(.*)$)");
    static const std::regex down_re(R"(^encoder\.down_blocks\.(\d+)\.(resnets|downsamplers)\.(\d+)\.(.*)$)");
    if (std::regex_match(k, m, up_re)) {
        const int lvl = n_levels - 1 - std::stoi(m[1]);
        k = m[2] == "resnets" ? "decoder.up." + std::to_string(lvl) + ".block." + std::string(m[3]) + "." + std::string(m[4])
                              : "decoder.up." + std::to_string(lvl) + ".upsample." + std::string(m[4]);
    } else if (std::regex_match(k, m, down_re)) {
        k = m[2] == "resnets" ? "encoder.down." + std::string(m[1]) + ".block." + std::string(m[3]) + "." + std::string(m[4])
                              : "encoder.down." + std::string(m[1]) + ".downsample." + std::string(m[4]);
    }
    static const std::pair<const char*, const char*> subs[] = {
        {R"(\.mid_block\.resnets\.0\.)", ".mid.block_1."},
        {R"(\.mid_block\.resnets\.1\.)", ".mid.block_2."},
        {R"(\.mid_block\.attentions\.0\.group_norm\.)", ".mid.attn_1.norm."},
        {R"(\.mid_block\.attentions\.0\.to_q\.)", ".mid.attn_1.q."},
        {R"(\.mid_block\.attentions\.0\.to_k\.)", ".mid.attn_1.k."},
        {R"(\.mid_block\.attentions\.0\.to_v\.)", ".mid.attn_1.v."},
        {R"(\.mid_block\.attentions\.0\.to_out\.0\.)", ".mid.attn_1.proj_out."},
        {R"(\.conv_shortcut\.)", ".nin_shortcut."},
        {R"(\.conv_norm_out\.)", ".norm_out."}};
    for (auto& [re, to] : subs) k = std::regex_replace(k, std::regex(re), to);
    return k;
}

const char* kFlux = "autoencoder_kl_flux_tiny.safetensors";

}  // namespace

// BFL / ldm layout of the FLUX.1 VAE: no prefix (ae.safetensors) and "vae." (ComfyUI single
// files); the attention projections as 1x1 convs [C, C, 1, 1]. No quant_conv in either: the
// configuration says so because the weights are absent.
TEST(VaeFlux1, LdmLayoutMatchesDiffusers) {
    auto idx = io::WeightIndex::open(ref(kFlux));
    for (std::string prefix : {"", "vae."}) {
        std::vector<StTensor> ts;
        for (const auto& t : idx.tensors()) {
            if (t.name.rfind("__", 0) == 0) continue;
            StTensor s{prefix + to_ldm(t.name, 2), t.shape, idx.read_f32(t)};
            if (t.name.find(".attentions.0.to_") != std::string::npos && t.shape.size() == 2) s.shape = {t.shape[0], t.shape[1], 1, 1};
            ts.push_back(std::move(s));
        }
        auto path = temp(prefix.empty() ? "bare" : "vae");
        write_safetensors(path, ts);
        auto ldm = io::WeightIndex::open(path);
        auto s = vae::find_autoencoder_kl(ldm);
        ASSERT_TRUE(s.has_value());
        EXPECT_EQ(s->prefix, prefix);
        EXPECT_EQ(s->layout, vae::KLLayout::Ldm);
        if (prefix.empty()) {
            auto det = io::detect(ldm);
            EXPECT_EQ(det.family, "FLUX VAE");
        }
        Backend be;
        vae::KLOverrides ov;
        ov.norm_num_groups = 8;  // the fixture's; real FLUX/Z-Image VAEs use diffusers' default 32
        auto m = vae::AutoencoderKLModel::load(ldm, be.b, ov);
        EXPECT_EQ(m->config().latent_channels, 16);
        EXPECT_FALSE(m->config().use_quant_conv);
        EXPECT_FALSE(m->config().use_post_quant_conv);
        auto dist = m->encode(read4(idx, "__input__.image"));
        const float e_mean = max_abs_diff(dist.mean, read4(idx, "__output__.latent_mean"));
        const float e_logvar = max_abs_diff(dist.logvar, read4(idx, "__output__.latent_logvar"));
        const float e_sample = max_abs_diff(m->decode(dist.mean), read4(idx, "__output__.sample"));
        const float e_dec = max_abs_diff(m->decode(read4(idx, "__input__.latent")), read4(idx, "__output__.decoded_latent"));
        std::printf("[flux vae, ldm layout, prefix '%s'] max abs error: latent_mean %.3g latent_logvar %.3g sample %.3g decoded_latent %.3g\n",
                    prefix.c_str(), e_mean, e_logvar, e_sample, e_dec);
        EXPECT_LT(e_mean, 1e-4f);
        EXPECT_LT(e_logvar, 1e-4f);
        EXPECT_LT(e_sample, 1e-4f);
        EXPECT_LT(e_dec, 1e-4f);
        std::filesystem::remove(path);
    }
}

// The fixture's sidecar states the FLUX.1 latent normalisation the family applies.
TEST(VaeFlux1, LatentFormatMatchesFixtureConfig) {
    std::ifstream f(ref("autoencoder_kl_flux_tiny.json"));
    auto j = nlohmann::json::parse(f);
    auto lf = vae::LatentFormat::flux1();
    EXPECT_FLOAT_EQ(lf.scaling_factor, j["config"]["scaling_factor"].get<float>());
    EXPECT_FLOAT_EQ(lf.shift_factor, j["config"]["shift_factor"].get<float>());
    EXPECT_EQ(lf.channels, j["config"]["latent_channels"].get<int64_t>());
}

// TAEF1 is TAESD with 16 latent channels. Built from the 4-channel AutoencoderTiny fixture in the
// original taesd.py layout (one file per half, decoder index 0 = Clamp): the encoder's last conv
// gets 12 more output rows (made-up values) and the decoder's first conv 12 more input columns
// of zeros. Then encode's channels 0..3 are the fixture's latents, and decoding any values in
// channels 4..15 gives the fixture's image.
TEST(VaeFlux1, Taef1ShapedTinyAutoencoder) {
    auto idx = io::WeightIndex::open(ref("autoencoder_tiny_taesd_tiny.safetensors"));
    std::vector<StTensor> enc, dec;
    int last_enc = -1;
    for (const auto& t : idx.tensors())
        if (t.name.rfind("encoder.layers.", 0) == 0) last_enc = std::max(last_enc, std::stoi(t.name.substr(15)));
    ASSERT_GT(last_enc, 0);
    const std::string lw = std::to_string(last_enc) + ".weight", lb = std::to_string(last_enc) + ".bias";
    for (const auto& t : idx.tensors()) {
        const std::string& n = t.name;
        auto v = idx.read_f32(t);
        if (n.rfind("encoder.layers.", 0) == 0) {
            std::string k = n.substr(15);
            StTensor s{k, t.shape, v};
            if (k == lw) {  // [4, C, 3, 3] -> [16, C, 3, 3]
                const size_t row = (size_t)(t.shape[1] * t.shape[2] * t.shape[3]);
                s.shape[0] = 16;
                for (size_t i = 0; i < 12 * row; ++i) s.data.push_back(0.05f * std::sin(0.37f * (float)i));
            } else if (k == lb) {
                s.shape[0] = 16;
                for (int i = 0; i < 12; ++i) s.data.push_back(0.1f * (float)i);
            }
            enc.push_back(std::move(s));
        } else if (n.rfind("decoder.layers.", 0) == 0) {
            std::string rest = n.substr(15);
            const size_t dot = rest.find('.');
            const int li = std::stoi(rest.substr(0, dot));
            StTensor s{std::to_string(li + 1) + rest.substr(dot), t.shape, v};
            if (li == 0 && rest.substr(dot) == ".weight") {  // [C, 4, 3, 3] -> [C, 16, 3, 3], zeros for the new inputs
                ASSERT_EQ(t.shape[1], 4);
                const int64_t C = t.shape[0], k2 = t.shape[2] * t.shape[3];
                s.shape[1] = 16;
                s.data.assign((size_t)(C * 16 * k2), 0.0f);
                for (int64_t o = 0; o < C; ++o)
                    for (int64_t i = 0; i < 4; ++i)
                        for (int64_t e = 0; e < k2; ++e) s.data[(size_t)((o * 16 + i) * k2 + e)] = v[(size_t)((o * 4 + i) * k2 + e)];
            }
            dec.push_back(std::move(s));
        }
    }
    auto pe = temp("taef1_encoder"), pd = temp("taef1_decoder");
    write_safetensors(pe, enc);
    write_safetensors(pd, dec);
    auto ie = io::WeightIndex::open(pe);
    auto id = io::WeightIndex::open(pd);
    Backend be;
    auto m = vae::TinyAutoencoder::load(&ie, &id, be.b);
    EXPECT_EQ(m->latent_channels(), 16);
    EXPECT_EQ(m->spatial_factor(), 8);
    HostTensor lat = m->encode(read4(idx, "__input__.image"));
    HostTensor ref_lat = read4(idx, "__output__.latents");
    ASSERT_EQ(lat.c, 16);
    float e_lat = 0;
    for (int64_t c = 0; c < 4; ++c)
        for (int64_t y = 0; y < lat.h; ++y)
            for (int64_t x = 0; x < lat.w; ++x) e_lat = std::max(e_lat, std::fabs(lat.at(0, c, y, x) - ref_lat.at(0, c, y, x)));
    HostTensor z4 = read4(idx, "__input__.latent");
    HostTensor z16(1, 16, z4.h, z4.w);
    for (int64_t c = 0; c < 16; ++c)
        for (int64_t y = 0; y < z4.h; ++y)
            for (int64_t x = 0; x < z4.w; ++x) z16.at(0, c, y, x) = c < 4 ? z4.at(0, c, y, x) : 2.5f * std::cos((float)(c * 7 + y * 3 + x));
    const float e_dec = max_abs_diff(m->decode(z16), read4(idx, "__output__.decoded_latent"));
    std::printf("[taef1-shaped] max abs error: latents 0..3 %.3g decoded %.3g\n", e_lat, e_dec);
    EXPECT_LT(e_lat, 1e-4f);
    EXPECT_LT(e_dec, 1e-4f);
    // a 4-channel latent given to the 16-channel decoder is refused
    EXPECT_THROW(m->decode(z4), Error);
    std::filesystem::remove(pe);
    std::filesystem::remove(pd);
}

// The tiny ZImagePipeline's BFL-layout single-file VAE (tests/data/reference/zimage_tiny, FLUX.1's
// 32 groups, which a single file cannot state: the default applies): decoding each case's final
// latent as the pipeline does (z / 0.3611 + 0.1159, decode, x / 2 + 0.5 clamped to [0, 1]) gives
// the case's image.
TEST(VaeFlux1, ZImageTinyPipelineDecode) {
    const std::string dir = std::string(EASEL_TEST_DATA) + "/reference/zimage_tiny/";
    auto vidx = io::WeightIndex::open(dir + "zimage_tiny_vae.safetensors");
    auto s = vae::find_autoencoder_kl(vidx);
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->layout, vae::KLLayout::Ldm);
    Backend be;
    auto m = vae::AutoencoderKLModel::load(vidx, be.b);
    EXPECT_EQ(m->config().latent_channels, 16);
    EXPECT_FALSE(m->config().use_post_quant_conv);
    const auto lf = vae::LatentFormat::flux1();
    for (std::string c : {"cat_s0_64", "circle_s1_96x64"}) {
        auto ref = io::WeightIndex::open(dir + "case_" + c + ".safetensors");
        HostTensor z = read4(ref, "final_latent");
        for (auto& v : z.data) v = v / lf.scaling_factor + lf.shift_factor;
        HostTensor img = m->decode(z);
        for (auto& v : img.data) v = std::clamp(v / 2.0f + 0.5f, 0.0f, 1.0f);
        const float e = max_abs_diff(img, read4(ref, "image"));
        std::printf("[zimage_tiny vae] %s decode max abs error %.3g\n", c.c_str(), e);
        EXPECT_LT(e, 1e-4f) << c;
    }
}
