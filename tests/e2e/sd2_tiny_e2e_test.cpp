// SD2.x (v-prediction) end to end against diffusers: the tiny SD2.x pipeline of
// tests/data/reference/sd2_tiny (tools/reference/make_sd2_pipeline.py: OpenCLIP-style text
// encoder with gelu and head size 64, UNet with Linear projections and per-block head counts of
// head size 64, v_prediction scheduler; a diffusers folder and an original-layout single file with
// OpenCLIP names, fused in_proj and one more text-encoder layer than the folder, as real SD2.x
// checkpoints have relative to their diffusers conversion).
//
// The repository keeps the single file and the folder's JSON files only (the test-data budget):
// the folder's weights are rebuilt here from the single file, as diffusers' conversion
// (loaders/single_file_utils.py convert_open_clip_checkpoint and the UNet/VAE maps) makes them:
// text encoder under transformers 5's CLIPTextModel names (embeddings.*, encoder.layers.N.*,
// final_layer_norm.*), in_proj rows split into q/k/v, the last OpenCLIP layer dropped; UNet and
// VAE under diffusers names (easel's own ldm name maps, unet_ldm_key / kl_canonical_to_ldm, run
// over the canonical names; VAE attention [C, C, 1, 1] -> [C, C]).
//
// `easel generate --rng cpu` must give diffusers' PNGs within 2/255 from
//   * the folder (-m diffusers): prediction type from scheduler_config.json, default clip skip 1
//     (diffusers' conversion dropped OpenCLIP's last layer; the pipeline uses the last output);
//   * the single file (-m sd2_tiny.safetensors --prediction v): default clip skip 2, the penultimate
//     layer, which ldm's FrozenOpenCLIPEmbedder(layer="penultimate"), A1111 and sd.cpp use for SD2.x.
// The clip-skip defaults are checked on the family object, and the single file run with
// --clip-skip 1 must differ from diffusers' image (so the default is what makes it match).
#include "io/weight_index.h"
#include "models/sd/stable_diffusion.h"
#include "models/sd/unet.h"
#include "models/sd/unet_config.h"
#include "models/vae/autoencoder_kl.h"
#include "pipeline/image_io.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <string>

namespace fs = std::filesystem;
using namespace easel;

namespace {

/// tests/data/reference/sd2_tiny, or the folder named by EASEL_SD2_TINY_DIR (another pipeline made by
/// tools/reference/make_sd2_pipeline.py).
const fs::path kDir = std::getenv("EASEL_SD2_TINY_DIR") ? fs::path(std::getenv("EASEL_SD2_TINY_DIR"))
                                                        : fs::path(EASEL_TEST_DATA) / "reference" / "sd2_tiny";

std::string quote(const std::string& s) {
    std::string r = "'";
    for (char c : s) {
        if (c == '\'') r += "'\\''";
        else r += c;
    }
    return r + "'";
}

/// One tensor of a safetensors file being written: dtype name, PyTorch shape, raw bytes.
struct StTensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
};

void write_safetensors(const fs::path& path, const std::map<std::string, StTensor>& ts) {
    nlohmann::json h = nlohmann::json::object();
    uint64_t off = 0;
    for (auto& [name, t] : ts) {
        h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.data.size()}}};
        off += t.data.size();
    }
    std::string hs = h.dump();
    while (hs.size() % 8) hs += ' ';
    std::ofstream f(path, std::ios::binary);
    const uint64_t len = hs.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(hs.data(), (std::streamsize)hs.size());
    for (auto& [name, t] : ts) f.write(reinterpret_cast<const char*>(t.data.data()), (std::streamsize)t.data.size());
    if (!f) throw std::runtime_error("cannot write " + path.string());
}

StTensor copy_of(const io::WeightIndex& idx, const std::string& name) {
    const io::TensorInfo* t = idx.find(name);
    if (!t) throw std::runtime_error("single file lacks " + name);
    auto b = idx.bytes(*t);
    return StTensor{io::dtype_name(t->dtype), t->shape, std::vector<uint8_t>(b.begin(), b.end())};
}

/// Rows [r0, r1) of a 2-D (or 1-D) tensor.
StTensor rows_of(const StTensor& t, int64_t r0, int64_t r1) {
    const size_t row = t.data.size() / (size_t)t.shape[0];
    StTensor r{t.dtype, t.shape, {}};
    r.shape[0] = r1 - r0;
    r.data.assign(t.data.begin() + (ptrdiff_t)(row * (size_t)r0), t.data.begin() + (ptrdiff_t)(row * (size_t)r1));
    return r;
}

/// The diffusers folder of the tiny SD2 pipeline: the committed JSON files plus weights converted
/// from sd2_tiny.safetensors (see the file comment). Built once per process into a temp folder.
fs::path diffusers_folder() {
    static std::once_flag once;
    static fs::path dir;
    std::call_once(once, [] {
        dir = fs::path(testing::TempDir()) / ("easel_sd2_tiny_diffusers_" + std::to_string(getpid()));
        fs::remove_all(dir);
        fs::copy(kDir / "diffusers", dir, fs::copy_options::recursive);
        auto idx = io::WeightIndex::open(kDir / "sd2_tiny.safetensors");

        // text encoder: OpenCLIP -> transformers CLIPTextModel, last layer dropped
        const std::string P = "cond_stage_model.model.";
        int layers = 0;
        while (idx.find(P + "transformer.resblocks." + std::to_string(layers) + ".ln_1.weight")) ++layers;
        std::map<std::string, StTensor> te;
        te["embeddings.token_embedding.weight"] = copy_of(idx, P + "token_embedding.weight");
        te["embeddings.position_embedding.weight"] = copy_of(idx, P + "positional_embedding");
        te["final_layer_norm.weight"] = copy_of(idx, P + "ln_final.weight");
        te["final_layer_norm.bias"] = copy_of(idx, P + "ln_final.bias");
        for (int l = 0; l + 1 < layers; ++l) {
            const std::string s = P + "transformer.resblocks." + std::to_string(l) + ".", d = "encoder.layers." + std::to_string(l) + ".";
            for (const char* wb : {"weight", "bias"}) {
                const std::string w = wb;
                te[d + "layer_norm1." + w] = copy_of(idx, s + "ln_1." + w);
                te[d + "layer_norm2." + w] = copy_of(idx, s + "ln_2." + w);
                te[d + "self_attn.out_proj." + w] = copy_of(idx, s + "attn.out_proj." + w);
                te[d + "mlp.fc1." + w] = copy_of(idx, s + "mlp.c_fc." + w);
                te[d + "mlp.fc2." + w] = copy_of(idx, s + "mlp.c_proj." + w);
                StTensor in = copy_of(idx, s + "attn.in_proj_" + w);
                const int64_t width = in.shape[0] / 3;
                te[d + "self_attn.q_proj." + w] = rows_of(in, 0, width);
                te[d + "self_attn.k_proj." + w] = rows_of(in, width, 2 * width);
                te[d + "self_attn.v_proj." + w] = rows_of(in, 2 * width, 3 * width);
            }
        }
        write_safetensors(dir / "text_encoder" / "model.safetensors", te);

        // UNet: canonical (diffusers) names of the inferred structure, read through the ldm map
        const auto ucfg = models::sd::infer_unet_config(idx);
        std::map<std::string, StTensor> unet;
        models::sd::UNet2DCondition net(ucfg);
        net.visit_params("", [&](const std::string& name, const nn::Param&) {
            unet[name] = copy_of(idx, "model.diffusion_model." + models::sd::unet_ldm_key(ucfg, name));
        });
        write_safetensors(dir / "unet" / "diffusion_pytorch_model.safetensors", unet);

        // VAE: the same through kl_canonical_to_ldm; attention 1x1 convs -> Linear shapes
        auto src = vae::find_autoencoder_kl(idx);
        if (!src) throw std::runtime_error("single file has no VAE");
        const auto kcfg = vae::infer_autoencoder_kl_config(idx, *src);
        std::map<std::string, StTensor> v;
        vae::AutoencoderKL kl(kcfg);
        kl.visit_params("", [&](const std::string& name, const nn::Param&) {
            StTensor t = copy_of(idx, "first_stage_model." + vae::kl_canonical_to_ldm(name, (int)kcfg.block_out_channels.size()));
            if (name.find(".attentions.") != std::string::npos && t.shape.size() == 4) t.shape.resize(2);
            v[name] = std::move(t);
        });
        write_safetensors(dir / "vae" / "diffusion_pytorch_model.safetensors", v);
    });
    return dir;
}

nlohmann::json cases_json() {
    std::ifstream f(kDir / "cases.json");
    return nlohmann::json::parse(f);
}

struct Case {
    nlohmann::json j;
    bool folder;
};

std::vector<Case> all_cases() {
    std::vector<Case> r;
    if (!fs::exists(kDir / "cases.json")) return r;
    const auto cj = cases_json();
    for (auto& c : cj["cases"])
        for (bool folder : {false, true}) r.push_back({c, folder});
    return r;
}

/// Runs `easel generate` on case c and returns the max |pixel difference| to diffusers' PNG.
int run_case(const nlohmann::json& c, bool folder, const std::string& extra, const std::string& tag) {
    const fs::path out = fs::path(testing::TempDir()) / ("easel_sd2_" + c["name"].get<std::string>() + "_" + tag + "_" +
                                                         std::to_string(getpid()) + ".png");
    std::string cmd = std::string(EASEL_BINARY) + " generate -t 1 -m " +
                      quote((folder ? diffusers_folder() : kDir / "sd2_tiny.safetensors").string()) + (folder ? "" : " --prediction v") +
                      " -p " + quote(c["prompt"]) + " -n " + quote(c["negative_prompt"]) + " -W " + std::to_string(c["width"].get<int>()) +
                      " -H " + std::to_string(c["height"].get<int>()) + " --steps " + std::to_string(c["steps"].get<int>()) +
                      " --cfg-scale " + c["cfg_scale"].dump() + " -s " + std::to_string(c["seed"].get<int64_t>()) +
                      " --sampling-method " + c["sampling_method"].get<std::string>() + " --scheduler " +
                      c["scheduler"].get<std::string>() + " --rng " + c["rng"].get<std::string>() + " --no-cache " + extra + " -o " +
                      quote(out.string()) + " > /dev/null 2>&1";
    fs::remove(out);
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto got = pipeline::load_image(out, 3);
    auto want = pipeline::load_image(kDir / c["png"].get<std::string>(), 3);
    fs::remove(out);
    if (got.width != want.width || got.height != want.height) return 256;
    int m = 0;
    for (size_t i = 0; i < got.pixels.size(); ++i) m = std::max(m, std::abs((int)got.pixels[i] - (int)want.pixels[i]));
    return m;
}

}  // namespace

class Sd2TinyE2E : public ::testing::TestWithParam<Case> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Sd2TinyE2E);

TEST_P(Sd2TinyE2E, MatchesDiffusersWithin2Of255) {
    const auto& c = GetParam().j;
    const int d = run_case(c, GetParam().folder, "", GetParam().folder ? "folder" : "single");
    std::printf("[sd2 e2e] %s %s: max pixel diff %d/255\n", c["name"].get<std::string>().c_str(), GetParam().folder ? "folder" : "single file", d);
    EXPECT_LE(d, 2);
}

INSTANTIATE_TEST_SUITE_P(Cases, Sd2TinyE2E, ::testing::ValuesIn(all_cases()), [](const auto& info) {
    std::string n = info.param.j["name"].template get<std::string>() + (info.param.folder ? "_folder" : "_single");
    for (auto& ch : n)
        if (!isalnum((unsigned char)ch)) ch = '_';
    return n;
});

// SD2.x defaults: both forms are SD2.x (Linear projections), v-prediction in the folder from its
// scheduler config; clip skip 1 for the folder's pre-truncated text encoder, 2 for the file.
TEST(Sd2TinyFamily, ClipSkipAndPredictionDefaults) {
    ASSERT_TRUE(fs::exists(kDir / "cases.json")) << kDir << " is missing (tools/reference/make_sd2_pipeline.py makes it)";
    models::ModelFiles folder, single;
    folder.model = diffusers_folder().string();
    single.model = (kDir / "sd2_tiny.safetensors").string();
    auto f = models::sd::StableDiffusion::open(folder, {});
    auto s = models::sd::StableDiffusion::open(single, {});
    EXPECT_TRUE(f->is_sd2());
    EXPECT_TRUE(s->is_sd2());
    EXPECT_EQ(f->name(), "SD2.x");
    EXPECT_EQ(f->defaults().clip_skip, 1);
    EXPECT_EQ(s->defaults().clip_skip, 2);
    EXPECT_EQ(f->model_sampling().prediction(), sampling::Prediction::V);
    models::FamilyOptions o;
    o.prediction = "v";
    EXPECT_EQ(models::sd::StableDiffusion::open(single, o)->model_sampling().prediction(), sampling::Prediction::V);
    // the same prompt gives the same conditioning from both forms under their defaults
    const auto c0 = cases_json()["cases"][0];
    auto cf = f->encode_prompt(c0["prompt"].get<std::string>(), 0);
    auto cs = s->encode_prompt(c0["prompt"].get<std::string>(), 0);
    ASSERT_EQ(cf.context.size(), cs.context.size());
    double m = 0;
    for (size_t i = 0; i < cf.context.size(); ++i) m = std::max(m, (double)std::fabs(cf.context[i] - cs.context[i]));
    EXPECT_LT(m, 1e-5) << "folder (clip skip 1 of 2 layers) vs single file (clip skip 2 of 3 layers)";
}

// The default matters: the single file with --clip-skip 1 (the last of its 3 layers) does not give
// diffusers' image.
TEST(Sd2TinyFamily, SingleFileWithClipSkip1DiffersFromDiffusers) {
    ASSERT_TRUE(fs::exists(kDir / "cases.json")) << kDir << " is missing (tools/reference/make_sd2_pipeline.py makes it)";
    const auto c0 = cases_json()["cases"][0];
    const int d = run_case(c0, false, "--clip-skip 1", "cs1");
    std::printf("[sd2] single file with --clip-skip 1: max pixel diff %d/255 to diffusers\n", d);
    EXPECT_GT(d, 8);
}
