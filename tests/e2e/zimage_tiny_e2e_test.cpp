// Z-Image parity with diffusers' ZImagePipeline on the tiny pipeline of
// tests/data/reference/zimage_tiny (tools/reference/make_zimage_pipeline.py: real Qwen3
// tokenizer, tiny Qwen3 text encoder / ZImageTransformer2DModel / FLUX-style AutoencoderKL,
// FlowMatchEulerDiscreteScheduler shift 3), in both forms users have: the diffusers folder (-m)
// and single files (--diffusion-model original layout, --llm, --vae ae layout).
//
//  * ZImageFamily.*: the family object alone (models::zimage::ZImage): token ids, the prompt
//    embeddings (hidden_states[-2]), the first transformer call, and the whole generation
//    (Euler over the ZImagePipeline schedule + VAE decode) against the diffusers PNGs;
//    refusal of a text encoder that does not fit the transformer.
//  * ZImageTinyE2E.*: `easel generate --rng cpu` (the binary) against the same PNGs.
// Pass criterion for images: max |pixel - diffusers pixel| <= 2 (of 255) on every case.
#include "core/error.h"
#include "e2e_helpers.h"
#include "io/weight_index.h"
#include "models/zimage/z_image.h"
#include "pipeline/image_io.h"
#include "sampling/denoiser.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "sampling/schedule.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using namespace easel;
using namespace easel::test;
using easel::models::zimage::ZImage;

namespace {

const fs::path kDir = fs::path(EASEL_TEST_DATA) / "reference" / "zimage_tiny";

nlohmann::json cases_json() {
    std::ifstream f(kDir / "cases.json");
    return nlohmann::json::parse(f);
}

enum class Form { Folder, Single };

models::ModelFiles files_for(Form form) {
    models::ModelFiles f;
    if (form == Form::Folder) {
        f.model = (kDir / "diffusers").string();
    } else {
        f.diffusion_model = (kDir / "zimage_tiny_transformer.safetensors").string();
        f.llm = (kDir / "diffusers" / "text_encoder" / "model.safetensors").string();
        f.vae = (kDir / "zimage_tiny_vae.safetensors").string();
    }
    return f;
}

/// Weights converted to F32 on load (ggml's CPU matmul rounds activations to F16 for F16
/// weights), for the tight numeric checks; the image tests use the stored F16 weights.
models::FamilyOptions f32_weights() {
    models::FamilyOptions o;
    o.weight_type = "f32";
    return o;
}

struct Param {
    int case_index;
    Form form;
};

std::string param_name(const Param& p) {
    std::string n = cases_json()["cases"][p.case_index]["name"].get<std::string>() + (p.form == Form::Folder ? "_folder" : "_single");
    for (auto& ch : n)
        if (!isalnum((unsigned char)ch)) ch = '_';
    return n;
}

std::vector<Param> all_params() {
    std::vector<Param> r;
    const size_t n = cases_json()["cases"].size();
    for (size_t i = 0; i < n; ++i)
        for (Form f : {Form::Folder, Form::Single}) r.push_back({(int)i, f});
    return r;
}

}  // namespace

// Tokenizer + chat template: the ids diffusers fed the text encoder (cases.json cond_ids /
// uncond_ids; they include <|im_start|>, "user", "\n", ..., "assistant", "\n").
TEST(ZImageFamily, PromptIdsMatchDiffusers) {
    auto fam = ZImage::open(files_for(Form::Folder), {});
    const auto cj = cases_json();
    for (auto& c : cj["cases"]) {
        auto want = c["cond_ids"].get<std::vector<int32_t>>();
        EXPECT_EQ(fam->prompt_ids(c["prompt"].get<std::string>()), want) << c["name"];
        if (c.contains("uncond_ids")) {
            EXPECT_EQ(fam->prompt_ids(c["negative_prompt"].get<std::string>()), c["uncond_ids"].get<std::vector<int32_t>>()) << c["name"];
        }
    }
    EXPECT_FALSE(fam->loaded(models::Module::Te));  // ids need no text encoder
}

// encode_prompt: hidden_states[-2] of the real tokens (diffusers padded to 512 and dropped the
// padding) equals the reference embeddings; both forms.
TEST(ZImageFamily, PromptEmbeddingsMatchDiffusers) {
    for (Form form : {Form::Folder, Form::Single}) {
        auto fam = ZImage::open(files_for(form), f32_weights());
        const auto cj = cases_json();
        for (auto& c : cj["cases"]) {
            auto ref = io::WeightIndex::open(kDir / c["tensors"].get<std::string>());
            auto cond = fam->encode_prompt(c["prompt"].get<std::string>(), 0);
            auto want = read_f32(ref, "cond");
            ASSERT_EQ(cond.dim, 12);
            ASSERT_EQ(cond.tokens * cond.dim, (int64_t)want.size()) << c["name"];
            EXPECT_LT(max_abs_diff(cond.context, want), 1e-4) << c["name"];  // measured 2.8e-5 (values up to 0.62); qwen3 tests use 1e-4

            if (c["cfg_active"].get<bool>()) {
                auto un = fam->encode_prompt(c["negative_prompt"].get<std::string>(), 0);
                EXPECT_LT(max_abs_diff(un.context, read_f32(ref, "uncond")), 1e-4) << c["name"];
            }
        }
        // hidden_states.2 (= [-2] of 3 layers) of te_hidden_states.safetensors, the debug dump
        auto hs = io::WeightIndex::open(kDir / "te_hidden_states.safetensors");
        auto c0 = fam->encode_prompt(cases_json()["cases"][0]["prompt"].get<std::string>(), 0);
        EXPECT_LT(max_abs_diff(c0.context, read_f32(hs, "hidden_states.2")), 1e-4);
    }
}

// One diffusion() call = -(transformer output) at t = 1 - sigma, for the first step of every case.
TEST(ZImageFamily, FirstTransformerCallMatchesDiffusers) {
    for (Form form : {Form::Folder, Form::Single}) {
        auto fam = ZImage::open(files_for(form), f32_weights());
        const auto cj = cases_json();
        for (auto& c : cj["cases"]) {
            auto ref = io::WeightIndex::open(kDir / c["tensors"].get<std::string>());
            const int64_t h = c["latent_shape"][1].get<int64_t>(), w = c["latent_shape"][2].get<int64_t>();
            const int64_t n = 16 * h * w;
            auto x = read_f32(ref, "dit0_x");      // [B, 16, 1, h, w] (B = 2 with CFG: cond, uncond)
            auto out = read_f32(ref, "dit0_out");  // model convention (not negated)
            auto t = read_f32(ref, "dit0_t");
            const float sigma0 = c["sigmas"][0].get<float>();
            EXPECT_NEAR(t[0], 1.0f - sigma0, 1e-6);
            models::Conditioning cond;
            cond.context = read_f32(ref, "cond");
            cond.dim = 12;
            cond.tokens = (int64_t)cond.context.size() / 12;
            std::vector<float> got((size_t)n);
            fam->diffusion(std::span<const float>(x.data(), (size_t)n), {}, h, w, c["timesteps"][0].get<double>(), cond, got);
            std::vector<float> want(out.begin(), out.begin() + n);
            for (auto& v : want) v = -v;
            double scale = 0;
            for (float v : want) scale = std::max(scale, (double)std::fabs(v));
            EXPECT_LT(max_abs_diff(got, want), 1e-4 * std::max(1.0, scale)) << c["name"];
        }
    }
}

class ZImageFamilyGen : public ::testing::TestWithParam<Param> {};

// The whole generation through the family object: noise from the CPU RNG (torch.randn),
// the ZImagePipeline schedule, Euler, CFG with scale 1 + guidance_scale, decode.
TEST_P(ZImageFamilyGen, ImageMatchesDiffusersWithin2Of255) {
    const auto c = cases_json()["cases"][GetParam().case_index];
    auto fam = ZImage::open(files_for(GetParam().form), {});
    const int64_t h = c["latent_shape"][1].get<int64_t>(), w = c["latent_shape"][2].get<int64_t>();
    const auto lf = fam->latent_format();
    ASSERT_EQ(lf.channels, 16);
    ASSERT_EQ(h, c["height"].get<int64_t>() / lf.spatial_factor);
    ASSERT_EQ(w, c["width"].get<int64_t>() / lf.spatial_factor);
    EXPECT_DOUBLE_EQ(fam->model_sampling().shift(), 3.0);

    const sampling::ScheduleOptions so = fam->schedule_options();
    EXPECT_TRUE(so.flow_pipeline_sigmas);
    auto sched = sampling::make_schedule(fam->model_sampling(), sampling::parse_scheduler(c["scheduler"].get<std::string>()),
                                         c["steps"].get<int>(), so);
    ASSERT_EQ(sched.sigmas.size(), c["sigmas"].size());
    for (size_t i = 0; i < sched.sigmas.size(); ++i) EXPECT_NEAR(sched.sigmas[i], c["sigmas"][i].get<float>(), 1e-6);

    auto cond = fam->encode_prompt(c["prompt"].get<std::string>(), 0);
    models::Conditioning uncond;
    const float cfg = c["cfg_scale"].get<float>();
    if (cfg != 1.0f) uncond = fam->encode_prompt(c["negative_prompt"].get<std::string>(), 0);

    sampling::Rng rng(sampling::parse_rng_kind(c["rng"].get<std::string>()), c["seed"].get<uint64_t>());
    auto noise = rng.randn(16 * h * w);
    auto ref = io::WeightIndex::open(kDir / c["tensors"].get<std::string>());
    EXPECT_LT(max_abs_diff(noise, read_f32(ref, "noise")), 1e-6);
    auto x0 = sampling::noise_latent({}, noise, sched.sigmas[0], true);

    sampling::Denoiser den(fam->model_sampling(),
                           [&](std::span<const float> x_in, double t, sampling::Branch b, std::span<float> out) {
                               fam->diffusion(x_in, {}, h, w, t, b == sampling::Branch::Cond ? cond : uncond, out);
                           },
                           cfg);
    sampling::Sampler smp(sampling::parse_sampler(c["sampling_method"].get<std::string>()), sched, {1, 16, h, w}, x0,
                          sampling::Rng(sampling::RngKind::Cpu, 0), true);
    smp.run(den);
    auto lat = smp.result();
    auto want_lat = read_f32(ref, "final_latent");
    const double lat_err = max_abs_diff(lat, want_lat);
    EXPECT_LT(lat_err, 3e-3) << "final latent (F16 weights: ggml rounds the matmul activations to F16)";

    vae::HostTensor z(1, 16, h, w);
    z.data = lat;
    auto img = fam->decode(z, {});
    ASSERT_EQ(img.w, c["width"].get<int64_t>());
    ASSERT_EQ(img.h, c["height"].get<int64_t>());
    auto got = to_u8(img);
    auto want = pipeline::load_image(kDir / c["png"].get<std::string>(), 3);
    const int d = max_pixel_diff(got, want.pixels);
    std::printf("[zimage] %s %s: final latent max err %.3g, max pixel diff %d/255\n", c["name"].get<std::string>().c_str(),
                GetParam().form == Form::Folder ? "folder" : "single files", lat_err, d);
    EXPECT_LE(d, 2);
}

INSTANTIATE_TEST_SUITE_P(Cases, ZImageFamilyGen, ::testing::ValuesIn(all_params()),
                         [](const auto& info) { return param_name(info.param); });

namespace {

/// Writes a safetensors file of F32 zeros with the given tensors (name -> PyTorch shape).
void write_zero_safetensors(const fs::path& path, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
    nlohmann::json h = nlohmann::json::object();
    uint64_t off = 0;
    for (auto& [name, shape] : tensors) {
        uint64_t n = 1;
        for (auto s : shape) n *= (uint64_t)s;
        h[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {off, off + 4 * n}}};
        off += 4 * n;
    }
    std::string hs = h.dump();
    while (hs.size() % 8) hs += ' ';
    std::ofstream f(path, std::ios::binary);
    uint64_t len = hs.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(hs.data(), (std::streamsize)hs.size());
    std::string zeros(off, '\0');
    f.write(zeros.data(), (std::streamsize)zeros.size());
}

/// A Qwen3ForCausalLM-layout model of hidden size `hidden` (2 layers, vocab 64), all zeros.
void write_qwen3(const fs::path& path, int64_t hidden) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> t{{"model.embed_tokens.weight", {64, hidden}},
                                                                {"model.norm.weight", {hidden}}};
    for (int l = 0; l < 2; ++l) {
        const std::string p = std::string("model.layers.") + std::to_string(l) + ".";
        t.push_back({p + "input_layernorm.weight", {hidden}});
        t.push_back({p + "post_attention_layernorm.weight", {hidden}});
        t.push_back({p + "self_attn.q_proj.weight", {16, hidden}});
        t.push_back({p + "self_attn.k_proj.weight", {8, hidden}});
        t.push_back({p + "self_attn.v_proj.weight", {8, hidden}});
        t.push_back({p + "self_attn.o_proj.weight", {hidden, 16}});
        t.push_back({p + "self_attn.q_norm.weight", {8}});
        t.push_back({p + "self_attn.k_norm.weight", {8}});
        t.push_back({p + "mlp.gate_proj.weight", {32, hidden}});
        t.push_back({p + "mlp.up_proj.weight", {32, hidden}});
        t.push_back({p + "mlp.down_proj.weight", {hidden, 32}});
    }
    write_zero_safetensors(path, t);
}

std::string error_of(const std::function<void()>& f, ErrorKind* kind) {
    try {
        f();
    } catch (const Error& e) {
        *kind = e.kind();
        return e.what();
    }
    return "";
}

}  // namespace

// A text encoder that does not fit the transformer is refused at load(Te), before any weight
// is loaded or any graph built, with a message naming the encoder the transformer expects.
TEST(ZImageFamily, RefusesTextEncoderThatDoesNotFit) {
    const fs::path tmp = fs::path(testing::TempDir()) / (std::string("zimage_te_") + std::to_string(getpid()));
    fs::create_directories(tmp);
    auto files = files_for(Form::Single);

    // a Qwen3 model of the wrong width (hidden 8; the transformer's cap_feat_dim is 16)
    write_qwen3(tmp / "qwen3_h8.safetensors", 8);
    files.llm = (tmp / "qwen3_h8.safetensors").string();
    auto fam = ZImage::open(files, {});  // the te file is not read at open
    ErrorKind k = ErrorKind::Internal;
    std::string msg = error_of([&] { fam->encode_prompt("a cat", 0); }, &k);
    EXPECT_EQ(k, ErrorKind::ModelMismatch);
    EXPECT_NE(msg.find("hidden size 8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hidden size 12"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--llm"), std::string::npos) << msg;
    EXPECT_FALSE(fam->loaded(models::Module::Te));
    EXPECT_EQ(fam->param_bytes(models::Module::Te), 0u);

    // not an LLM at all: the VAE file passed as --llm
    files.llm = (kDir / "zimage_tiny_vae.safetensors").string();
    fam = ZImage::open(files, {});
    msg = error_of([&] { fam->load(models::Module::Te); }, &k);
    EXPECT_EQ(k, ErrorKind::ModelMismatch);
    EXPECT_NE(msg.find("no Qwen3 text encoder"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hidden size 12"), std::string::npos) << msg;
    EXPECT_FALSE(fam->loaded(models::Module::Te));

    // the right one loads
    files.llm = files_for(Form::Single).llm;
    fam = ZImage::open(files, {});
    fam->load(models::Module::Te);
    EXPECT_TRUE(fam->loaded(models::Module::Te));
    EXPECT_GT(fam->param_bytes(models::Module::Te), 0u);
    fs::remove_all(tmp);
}

// Files of the wrong kind are refused at open: a VAE as the diffusion model, a Z-Image
// transformer as the VAE.
TEST(ZImageFamily, RefusesWrongFilesAtOpen) {
    auto files = files_for(Form::Single);
    files.diffusion_model = files.vae;
    ErrorKind k = ErrorKind::Internal;
    std::string msg = error_of([&] { ZImage::open(files, {}); }, &k);
    EXPECT_EQ(k, ErrorKind::ModelMismatch);
    EXPECT_NE(msg.find("--diffusion-model"), std::string::npos) << msg;

    files = files_for(Form::Single);
    files.vae = files.diffusion_model;
    msg = error_of([&] { ZImage::open(files, {}); }, &k);
    EXPECT_EQ(k, ErrorKind::ModelMismatch);
    EXPECT_NE(msg.find("--vae"), std::string::npos) << msg;

    auto fam = ZImage::open(files_for(Form::Folder), {});
    EXPECT_EQ(fam->name(), "Z-Image");
    auto d = fam->defaults();
    EXPECT_EQ(d.sampler, "euler");
    EXPECT_EQ(d.steps, 8);
    EXPECT_FLOAT_EQ(d.cfg_scale, 1.0f);
    const auto lf = fam->latent_format();
    EXPECT_FLOAT_EQ(lf.scaling_factor, 0.3611f);
    EXPECT_FLOAT_EQ(lf.shift_factor, 0.1159f);
    EXPECT_EQ(lf.spatial_factor, 8);
    models::FamilyOptions o;
    o.flow_shift = 2.5f;
    EXPECT_DOUBLE_EQ(ZImage::open(files_for(Form::Folder), o)->model_sampling().shift(), 2.5);
}

namespace {

std::string quote(const std::string& s) {
    std::string r = "'";
    for (char c : s) {
        if (c == '\'') r += "'\\''";
        else r += c;
    }
    return r + "'";
}

}  // namespace

class ZImageTinyE2E : public ::testing::TestWithParam<Param> {};

// `easel generate --rng cpu` with the flags of cases.json (euler, discrete, --cfg-scale 1 + g).
TEST_P(ZImageTinyE2E, MatchesDiffusersWithin2Of255) {
    const auto c = cases_json()["cases"][GetParam().case_index];
    const bool folder = GetParam().form == Form::Folder;
    const fs::path out = fs::path(testing::TempDir()) /
                         ("easel_zimage_" + c["name"].get<std::string>() + (folder ? "_folder" : "_single") + std::string("_") + std::to_string(getpid()) + ".png");
    const auto files = files_for(GetParam().form);
    std::string cmd = std::string(EASEL_BINARY) + " generate -t 1";
    if (folder) cmd += " -m " + quote(files.model);
    else cmd += " --diffusion-model " + quote(files.diffusion_model) + " --llm " + quote(files.llm) + " --vae " + quote(files.vae);
    cmd += " -p " + quote(c["prompt"]) + " -n " + quote(c["negative_prompt"]) + std::string(" -W ") + std::to_string(c["width"].get<int>()) +
           std::string(" -H ") + std::to_string(c["height"].get<int>()) + std::string(" --steps ") + std::to_string(c["steps"].get<int>()) +
           " --cfg-scale " + c["cfg_scale"].dump() + std::string(" -s ") + std::to_string(c["seed"].get<int64_t>()) +
           " --sampling-method " + c["sampling_method"].get<std::string>() + " --scheduler " + c["scheduler"].get<std::string>() +
           " --rng " + c["rng"].get<std::string>() + " --no-cache -o " + quote(out.string()) + " > /dev/null 2>&1";
    fs::remove(out);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto got = pipeline::load_image(out, 3);
    auto want = pipeline::load_image(kDir / c["png"].get<std::string>(), 3);
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    const int d = max_pixel_diff(got.pixels, want.pixels);
    std::printf("[zimage e2e] %s %s: max pixel diff %d/255\n", c["name"].get<std::string>().c_str(), folder ? "folder" : "single files", d);
    EXPECT_LE(d, 2);
    fs::remove(out);
}

INSTANTIATE_TEST_SUITE_P(Cases, ZImageTinyE2E, ::testing::ValuesIn(all_params()),
                         [](const auto& info) { return param_name(info.param); });

// Image sides that are not multiples of 16 (VAE factor 8 x patch 2) are rounded down, as SD's are
// to 8: -W 104 -H 70 runs the 96x64 case and must give diffusers' 96x64 image.
TEST(ZImageTinyE2ESizes, SidesRoundDownToMultiplesOf16) {
    const auto cs = cases_json()["cases"];
    const nlohmann::json* cp = nullptr;
    for (const auto& c : cs)
        if (c["width"].get<int>() == 96 && c["height"].get<int>() == 64) cp = &c;
    ASSERT_NE(cp, nullptr) << "cases.json has no 96x64 case";
    const auto& c = *cp;
    const fs::path out = fs::path(testing::TempDir()) / (std::string("easel_zimage_round_") + std::to_string(getpid()) + ".png");
    const auto files = files_for(Form::Folder);
    std::string cmd = std::string(EASEL_BINARY) + " generate -t 1 -m " + quote(files.model) + " -p " + quote(c["prompt"]) + " -n " +
                      quote(c["negative_prompt"]) + std::string(" -W 104 -H 70 --steps ") + std::to_string(c["steps"].get<int>()) +
                      " --cfg-scale " + c["cfg_scale"].dump() + std::string(" -s ") + std::to_string(c["seed"].get<int64_t>()) +
                      " --sampling-method " + c["sampling_method"].get<std::string>() + " --scheduler " +
                      c["scheduler"].get<std::string>() + " --rng " + c["rng"].get<std::string>() + " --no-cache -o " +
                      quote(out.string()) + " > /dev/null 2>&1";
    fs::remove(out);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto got = pipeline::load_image(out, 3);
    auto want = pipeline::load_image(kDir / c["png"].get<std::string>(), 3);
    ASSERT_EQ(got.width, 96);
    ASSERT_EQ(got.height, 64);
    EXPECT_LE(max_pixel_diff(got.pixels, want.pixels), 2);
    fs::remove(out);
}

// ---------------------------------------------------------------- img2img

namespace {

struct I2iParam {
    int case_index;
    Form form;
};

std::vector<I2iParam> img2img_params() {
    std::vector<I2iParam> r;
    const auto cj = cases_json();
    if (!cj.contains("img2img_cases")) return r;
    for (size_t i = 0; i < cj["img2img_cases"].size(); ++i)
        for (Form f : {Form::Folder, Form::Single}) r.push_back({(int)i, f});
    return r;
}

}  // namespace

class ZImageTinyImg2Img : public ::testing::TestWithParam<I2iParam> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ZImageTinyImg2Img);

// `easel generate -i INIT --strength S --rng cpu` against diffusers' ZImageImg2ImgPipeline
// (tools/reference/make_zimage_pipeline.py "img2img_cases"): the init image's posterior sampled
// with the seed's first draw, (z - shift) * scale, noise from the second draw, scale_noise at
// sigmas[t_start] with t_start = int(steps - steps * strength), Euler over sigmas[t_start:].
TEST_P(ZImageTinyImg2Img, MatchesDiffusersWithin2Of255) {
    const auto c = cases_json()["img2img_cases"][GetParam().case_index];
    const bool folder = GetParam().form == Form::Folder;
    const fs::path out = fs::path(testing::TempDir()) /
                         ("easel_zimage_i2i_" + c["name"].get<std::string>() + (folder ? "_folder" : "_single") + std::string("_") + std::to_string(getpid()) + ".png");
    const auto files = files_for(GetParam().form);
    std::string cmd = std::string(EASEL_BINARY) + " generate -t 1";
    if (folder) cmd += " -m " + quote(files.model);
    else cmd += " --diffusion-model " + quote(files.diffusion_model) + " --llm " + quote(files.llm) + " --vae " + quote(files.vae);
    cmd += " -p " + quote(c["prompt"]) + " -n " + quote(c["negative_prompt"]) + std::string(" -W ") + std::to_string(c["width"].get<int>()) +
           std::string(" -H ") + std::to_string(c["height"].get<int>()) + std::string(" --steps ") + std::to_string(c["steps"].get<int>()) +
           " --cfg-scale " + c["cfg_scale"].dump() + std::string(" -s ") + std::to_string(c["seed"].get<int64_t>()) +
           " --sampling-method " + c["sampling_method"].get<std::string>() + " --scheduler " + c["scheduler"].get<std::string>() +
           " --rng " + c["rng"].get<std::string>() + " -i " + quote((kDir / c["init_image"].get<std::string>()).string()) +
           " --strength " + c["strength"].dump() + " --no-cache -o " + quote(out.string()) + " > /dev/null 2>&1";
    fs::remove(out);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto got = pipeline::load_image(out, 3);
    auto want = pipeline::load_image(kDir / c["png"].get<std::string>(), 3);
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    const int d = max_pixel_diff(got.pixels, want.pixels);
    std::printf("[zimage img2img] %s %s: max pixel diff %d/255\n", c["name"].get<std::string>().c_str(), folder ? "folder" : "single files", d);
    EXPECT_LE(d, 2);
    fs::remove(out);
}

INSTANTIATE_TEST_SUITE_P(Cases, ZImageTinyImg2Img, ::testing::ValuesIn(img2img_params()), [](const auto& info) {
    std::string n = cases_json()["img2img_cases"][info.param.case_index]["name"].template get<std::string>() +
                    (info.param.form == Form::Folder ? "_folder" : "_single");
    for (auto& ch : n)
        if (!isalnum((unsigned char)ch)) ch = '_';
    return n;
});

// Text encoders of other families given as --llm are refused at load(Te) with the encoder the
// transformer expects: a CLIP text encoder (SD1.x-style) and a T5 encoder.
TEST(ZImageFamily, RefusesClipAndT5AsLlm) {
    for (const char* f : {"clip_text_sd15_tiny.safetensors", "t5_encoder_tiny.safetensors"}) {
        auto files = files_for(Form::Single);
        files.llm = (fs::path(EASEL_TEST_DATA) / "reference" / f).string();
        auto fam = ZImage::open(files, {});
        ErrorKind k = ErrorKind::Internal;
        const std::string msg = error_of([&] { fam->encode_prompt("a cat", 0); }, &k);
        EXPECT_EQ(k, ErrorKind::ModelMismatch) << f;
        EXPECT_NE(msg.find("no Qwen3 text encoder"), std::string::npos) << f << ": " << msg;
        EXPECT_NE(msg.find("hidden size 12"), std::string::npos) << f << ": " << msg;
        EXPECT_NE(msg.find("--llm"), std::string::npos) << f << ": " << msg;
        EXPECT_FALSE(fam->loaded(models::Module::Te)) << f;
    }
}
