// FLUX.1 parity with diffusers' FluxPipeline on the tiny pipelines of
// tests/data/reference/flux1_tiny (tools/reference/make_flux_pipeline.py: real CLIP and T5
// tokenizers, tiny CLIPTextModel / T5EncoderModel / FluxTransformer2DModel dev (guidance
// embedder) and schnell (none) / FLUX-style AutoencoderKL, the FLUX.1-dev and -schnell scheduler
// configs), in the forms users have: the diffusers folder (-m, dev) and single files
// (--diffusion-model in the BFL / ComfyUI layout, --t5xxl, --clip_l, --vae in the ae layout).
//
//  * Flux1Family.*: the family object (models::flux::Flux1): token ids, prompt embeddings (T5
//    context + CLIP pooled), the schedule, the first DiT call, and the whole generation (Euler +
//    VAE decode) against the diffusers PNGs; refusal of text encoders that do not fit.
//  * Flux1TinyE2E.*: `easel generate --rng cpu` (the binary) against the same PNGs, and its
//    one-line refusals.
// Pass criterion for images: max |pixel - diffusers pixel| <= 2 (of 255) on every case.
#include "core/error.h"
#include "e2e_helpers.h"
#include "io/weight_index.h"
#include "models/flux/flux1.h"
#include "models/flux/flux_common.h"
#include "pipeline/image_io.h"
#include "sampling/denoiser.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "sampling/schedule.h"
#include "text/clip_tokenizer.h"
#include "text/t5_tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

namespace fs = std::filesystem;
using namespace easel;
using namespace easel::test;
using easel::models::flux::Flux1;

namespace {

const fs::path kDir = fs::path(EASEL_TEST_DATA) / "reference" / "flux1_tiny";

const nlohmann::json& cases_json() {
    static const nlohmann::json j = [] {
        std::ifstream f(kDir / "cases.json");
        if (!f) throw std::runtime_error("missing tests/data/reference/flux1_tiny/cases.json");
        return nlohmann::json::parse(f);
    }();
    return j;
}

enum class Form { Folder, Single };

bool is_dev(const nlohmann::json& c) { return c["variant"].get<std::string>() == "dev"; }

models::ModelFiles files_for(Form form, bool dev = true) {
    models::ModelFiles f;
    if (form == Form::Folder) {
        f.model = (kDir / "diffusers").string();
    } else {
        f.diffusion_model = (kDir / (dev ? "flux1_dev_tiny_transformer.safetensors" : "flux1_schnell_tiny_transformer.safetensors")).string();
        f.t5xxl = (kDir / "diffusers" / "text_encoder_2" / "model.safetensors").string();
        // the CLIP folder, not its model.safetensors: a bare CLIP file carries no head count and
        // easel assumes width / 64 (12 for CLIP-L's 768); the tiny CLIP has 2 heads of 4.
        f.clip_l = (kDir / "diffusers" / "text_encoder").string();
        f.vae = (kDir / "flux1_tiny_vae.safetensors").string();
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

/// Every case with single files; dev cases also from the folder (the folder holds the dev pipeline).
std::vector<Param> all_params() {
    std::vector<Param> r;
    if (!fs::exists(kDir / "cases.json")) return r;  // the non-parameterised tests report the missing data
    const auto& cs = cases_json()["cases"];
    for (size_t i = 0; i < cs.size(); ++i) {
        if (is_dev(cs[i])) r.push_back({(int)i, Form::Folder});
        r.push_back({(int)i, Form::Single});
    }
    return r;
}

models::Conditioning cond_from(const io::WeightIndex& ref, const char* ctx, const char* pooled, int64_t dim) {
    models::Conditioning c;
    c.context = read_f32(ref, ctx);
    c.dim = dim;
    c.tokens = (int64_t)c.context.size() / dim;
    c.pooled = read_f32(ref, pooled);
    return c;
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

std::string quote(const std::string& s) {
    std::string r = "'";
    for (char c : s) {
        if (c == '\'') r += "'\\''";
        else r += c;
    }
    return r + "'";
}

}  // namespace

// Both tokenizers give the ids diffusers fed the encoders: T5 (tokens + </s>, then <pad> up to
// 512) and CLIP (one 77-token window padded with </s>). Needs no loaded module.
TEST(Flux1Family, TokenIdsMatchDiffusers) {
    for (const auto& c : cases_json()["cases"]) {
        const std::string p = c["prompt"].get<std::string>();
        auto t5 = text::T5Tokenizer::builtin().encode_padded(p, (int)models::flux::kFlux1T5Tokens);
        std::vector<int32_t> t5_real;
        for (int32_t id : t5)
            if (id != 0) t5_real.push_back(id);
        EXPECT_EQ(t5_real, c["t5_ids_unpadded"].get<std::vector<int32_t>>()) << c["name"];
        EXPECT_EQ(t5.size(), 512u);
        EXPECT_EQ(text::ClipTokenizer::builtin().encode_window(p, text::ClipTokenizer::kEos), c["clip_ids"].get<std::vector<int32_t>>())
            << c["name"];
    }
}

// encode_prompt: T5 last_hidden_state over the 512 padded tokens (no mask) and CLIP
// pooler_output equal the reference embeddings, from the folder and from the single files.
TEST(Flux1Family, PromptEmbeddingsMatchDiffusers) {
    for (Form form : {Form::Folder, Form::Single}) {
        auto fam = Flux1::open(files_for(form), f32_weights());
        EXPECT_FALSE(fam->loaded(models::Module::Te));
        for (const auto& c : cases_json()["cases"]) {
            auto ref = io::WeightIndex::open(kDir / c["tensors"].get<std::string>());
            auto cond = fam->encode_prompt(c["prompt"].get<std::string>(), 0);
            auto want = read_f32(ref, "cond");
            ASSERT_EQ(cond.dim, 16);
            ASSERT_EQ(cond.tokens, 512);
            ASSERT_EQ((int64_t)want.size(), 512 * 16) << c["name"];
            const double ec = max_abs_diff(cond.context, want), ep = max_abs_diff(cond.pooled, read_f32(ref, "pooled"));
            std::printf("[flux1] %s %s: T5 context max err %.3g (max |v| %.3g), CLIP pooled max err %.3g\n", c["name"].get<std::string>().c_str(),
                        form == Form::Folder ? "folder" : "single", ec, max_abs(want), ep);
            EXPECT_LT(ec, 1e-4) << c["name"];
            EXPECT_LT(ep, 1e-4) << c["name"];
            if (c["cfg_active"].get<bool>()) {
                auto un = fam->encode_prompt(c["negative_prompt"].get<std::string>(), 0);
                EXPECT_LT(max_abs_diff(un.context, read_f32(ref, "uncond")), 1e-4) << c["name"];
                EXPECT_LT(max_abs_diff(un.pooled, read_f32(ref, "uncond_pooled")), 1e-4) << c["name"];
            }
        }
    }
}

// The schedule the family asks for (dev: flux with the image's token count; schnell: discrete
// with the pipeline's sigmas) equals the FlowMatchEulerDiscreteScheduler's of the run.
TEST(Flux1Family, ScheduleMatchesDiffusers) {
    for (const auto& c : cases_json()["cases"]) {
        auto fam = Flux1::open(files_for(is_dev(c) ? Form::Folder : Form::Single, is_dev(c)), {});
        EXPECT_EQ(fam->defaults().scheduler, c["scheduler"].get<std::string>()) << c["name"];
        sampling::ScheduleOptions so = fam->schedule_options();
        so.image_seq_len = fam->image_seq_len(c["width"].get<int>(), c["height"].get<int>());
        EXPECT_EQ(so.image_seq_len, c["image_seq_len"].get<int64_t>());
        auto s = sampling::make_schedule(fam->model_sampling(), sampling::parse_scheduler(c["scheduler"].get<std::string>()),
                                         c["steps"].get<int>(), so);
        ASSERT_EQ(s.sigmas.size(), c["sigmas"].size()) << c["name"];
        for (size_t i = 0; i < s.sigmas.size(); ++i) EXPECT_NEAR(s.sigmas[i], c["sigmas"][i].get<float>(), 1e-6) << c["name"] << " " << i;
        for (size_t i = 0; i < s.timesteps.size(); ++i)
            EXPECT_NEAR(s.timesteps[i], c["timesteps"][i].get<float>(), 2e-4) << c["name"] << " " << i;
    }
}

// One diffusion() call = the DiT's velocity for the packed noise at the first timestep (dev: with
// the guidance), for every case and form.
TEST(Flux1Family, FirstDiTCallMatchesDiffusers) {
    for (const auto& p : all_params()) {
        const auto& c = cases_json()["cases"][p.case_index];
        auto fam = Flux1::open(files_for(p.form, is_dev(c)), [&] {
            auto o = f32_weights();
            if (is_dev(c)) o.guidance = c["guidance"].get<float>();
            return o;
        }());
        EXPECT_EQ(fam->has_guidance(), is_dev(c));
        EXPECT_EQ(fam->name(), is_dev(c) ? "FLUX.1 dev" : "FLUX.1 schnell");
        auto ref = io::WeightIndex::open(kDir / c["tensors"].get<std::string>());
        const int64_t h = c["latent_shape"][1].get<int64_t>(), w = c["latent_shape"][2].get<int64_t>();
        auto x = models::flux::unpack_latents(read_f32(ref, "dit0_x"), 1, 16, h, w);
        auto want = models::flux::unpack_latents(read_f32(ref, "dit0_out"), 1, 16, h, w);
        EXPECT_LT(max_abs_diff(x, read_f32(ref, "noise")), 1e-6);  // the first input is the packed noise
        EXPECT_NEAR(read_f32(ref, "dit0_t")[0], c["sigmas"][0].get<float>(), 1e-6);
        if (is_dev(c)) {
            EXPECT_FLOAT_EQ(read_f32(ref, "dit0_guidance")[0], c["guidance"].get<float>());
        }
        auto cond = cond_from(ref, "cond", "pooled", 16);
        std::vector<float> got(x.size());
        fam->diffusion(x, {}, h, w, c["timesteps"][0].get<double>(), cond, got);
        const double e = max_abs_diff(got, want);
        std::printf("[flux1] %s: first DiT call max err %.3g (max |v| %.3g)\n", param_name(p).c_str(), e, max_abs(want));
        EXPECT_LT(e, 1e-4 * std::max(1.0, max_abs(want))) << param_name(p);
    }
}

class Flux1FamilyGen : public ::testing::TestWithParam<Param> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Flux1FamilyGen);

// The whole generation through the family object: noise from the CPU RNG (torch.randn), the
// pipeline's schedule, Euler, true CFG where the case has it, decode.
TEST_P(Flux1FamilyGen, ImageMatchesDiffusersWithin2Of255) {
    const auto& c = cases_json()["cases"][GetParam().case_index];
    models::FamilyOptions o;
    if (is_dev(c)) o.guidance = c["guidance"].get<float>();
    auto fam = Flux1::open(files_for(GetParam().form, is_dev(c)), o);
    const int64_t h = c["latent_shape"][1].get<int64_t>(), w = c["latent_shape"][2].get<int64_t>();
    const auto lf = fam->latent_format();
    ASSERT_EQ(lf.channels, 16);
    ASSERT_EQ(h, c["height"].get<int64_t>() / lf.spatial_factor);
    ASSERT_EQ(w, c["width"].get<int64_t>() / lf.spatial_factor);

    sampling::ScheduleOptions so = fam->schedule_options();
    so.image_seq_len = fam->image_seq_len(c["width"].get<int>(), c["height"].get<int>());
    auto sched = sampling::make_schedule(fam->model_sampling(), sampling::parse_scheduler(c["scheduler"].get<std::string>()),
                                         c["steps"].get<int>(), so);

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
    const double lat_err = max_abs_diff(lat, read_f32(ref, "final_latent"));
    EXPECT_LT(lat_err, 3e-3) << "final latent (F16 weights: ggml rounds the matmul activations to F16)";

    vae::HostTensor z(1, 16, h, w);
    z.data = lat;
    auto img = fam->decode(z, {});
    ASSERT_EQ(img.w, c["width"].get<int64_t>());
    ASSERT_EQ(img.h, c["height"].get<int64_t>());
    auto got = to_u8(img);
    auto want = pipeline::load_image(kDir / c["png"].get<std::string>(), 3);
    const int d = max_pixel_diff(got, want.pixels);
    std::printf("[flux1] %s: final latent max err %.3g, max pixel diff %d/255\n", param_name(GetParam()).c_str(), lat_err, d);
    EXPECT_LE(d, 2);
}

INSTANTIATE_TEST_SUITE_P(Cases, Flux1FamilyGen, ::testing::ValuesIn(all_params()),
                         [](const auto& info) { return param_name(info.param); });

// Text encoders that do not fit are refused at load(Te), from their headers, before any weight
// is loaded or graph built, naming the slot, what the file holds and what FLUX.1 expects.
TEST(Flux1Family, RefusesTextEncodersThatDoNotFit) {
    const fs::path ref = fs::path(EASEL_TEST_DATA) / "reference";
    struct Bad {
        std::string t5, clip;  // replacement files ("" = keep)
        std::vector<std::string> words;
    };
    const auto good = files_for(Form::Single);
    const std::vector<Bad> bad = {
        {good.clip_l, "", {"--t5xxl", "a CLIP text encoder", "not a T5 encoder", "d_model 16"}},
        {"", good.t5xxl, {"--clip_l", "a T5 encoder", "not a CLIP text encoder", "hidden size 8"}},
        {(ref / "t5_encoder_tiny.safetensors").string(), "", {"--t5xxl", "d_model 32", "context width 16"}},
        {(ref / "zimage_tiny" / "diffusers" / "text_encoder" / "model.safetensors").string(), "", {"--t5xxl", "a Qwen3 LLM", "not a T5"}},
        {"", (ref / "clip_text_sd15_tiny.safetensors").string(), {"--clip_l", "hidden size 32", "pooled width 8"}},
    };
    for (const auto& b : bad) {
        auto files = good;
        if (!b.t5.empty()) files.t5xxl = b.t5;
        if (!b.clip.empty()) files.clip_l = b.clip;
        auto fam = Flux1::open(files, {});  // the te files are not read at open
        ErrorKind k = ErrorKind::Internal;
        const std::string msg = error_of([&] { fam->encode_prompt("a cat", 0); }, &k);
        EXPECT_EQ(k, ErrorKind::ModelMismatch) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        for (const auto& wd : b.words) EXPECT_NE(msg.find(wd), std::string::npos) << "'" << wd << "' not in: " << msg;
        EXPECT_FALSE(fam->loaded(models::Module::Te));
        EXPECT_EQ(fam->param_bytes(models::Module::Te), 0u);
    }
    // An LLM (Qwen3, as Z-Image / FLUX.2 take) is refused at open.
    auto files = good;
    files.llm = (ref / "zimage_tiny" / "diffusers" / "text_encoder" / "model.safetensors").string();
    ErrorKind k = ErrorKind::Internal;
    const std::string msg = error_of([&] { Flux1::open(files, {}); }, &k);
    EXPECT_EQ(k, ErrorKind::ModelMismatch);
    EXPECT_NE(msg.find("--llm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--t5xxl"), std::string::npos) << msg;
    // The right ones load.
    auto fam = Flux1::open(good, {});
    fam->load(models::Module::Te);
    EXPECT_TRUE(fam->loaded(models::Module::Te));
    EXPECT_GT(fam->param_bytes(models::Module::Te), 0u);
}

// Files of the wrong kind are refused at open; dev / schnell told apart from the weights;
// defaults and the latent format.
TEST(Flux1Family, OpenChecksAndDefaults) {
    auto files = files_for(Form::Single);
    files.diffusion_model = files.vae;
    ErrorKind k = ErrorKind::Internal;
    std::string msg = error_of([&] { Flux1::open(files, {}); }, &k);
    EXPECT_EQ(k, ErrorKind::ModelMismatch);
    EXPECT_NE(msg.find("--diffusion-model"), std::string::npos) << msg;
    files = files_for(Form::Single);
    files.vae = files.t5xxl;
    msg = error_of([&] { Flux1::open(files, {}); }, &k);
    EXPECT_EQ(k, ErrorKind::ModelMismatch);
    EXPECT_NE(msg.find("--vae"), std::string::npos) << msg;

    auto dev = Flux1::open(files_for(Form::Folder), {});
    EXPECT_TRUE(dev->has_guidance());
    EXPECT_FLOAT_EQ(dev->guidance(), 3.5f);
    auto d = dev->defaults();
    EXPECT_EQ(d.sampler, "euler");
    EXPECT_EQ(d.scheduler, "flux");
    EXPECT_EQ(d.steps, 20);
    EXPECT_FLOAT_EQ(d.cfg_scale, 1.0f);
    EXPECT_EQ(dev->size_multiple(), 16);
    EXPECT_EQ(dev->image_seq_len(1024, 1024), 4096);
    const auto lf = dev->latent_format();
    EXPECT_FLOAT_EQ(lf.scaling_factor, 0.3611f);
    EXPECT_FLOAT_EQ(lf.shift_factor, 0.1159f);
    auto sn = Flux1::open(files_for(Form::Single, false), {});
    EXPECT_FALSE(sn->has_guidance());
    EXPECT_EQ(sn->defaults().scheduler, "discrete");
    EXPECT_EQ(sn->defaults().steps, 4);
    EXPECT_DOUBLE_EQ(sn->model_sampling().shift(), 1.0);
    models::FamilyOptions o;
    o.flow_shift = 2.5f;
    EXPECT_DOUBLE_EQ(Flux1::open(files_for(Form::Folder), o)->model_sampling().shift(), 2.5);
}

class Flux1TinyE2E : public ::testing::TestWithParam<Param> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Flux1TinyE2E);

// `easel generate --rng cpu` with the flags of cases.json (euler, flux / discrete, --guidance,
// --cfg-scale = true_cfg_scale).
TEST_P(Flux1TinyE2E, MatchesDiffusersWithin2Of255) {
    const auto& c = cases_json()["cases"][GetParam().case_index];
    const bool folder = GetParam().form == Form::Folder;
    const fs::path out = fs::path(testing::TempDir()) / ("easel_flux1_" + param_name(GetParam()) + std::string("_") + std::to_string(getpid()) + ".png");
    const auto files = files_for(GetParam().form, is_dev(c));
    std::string cmd = std::string(EASEL_BINARY) + " generate -t 1";
    if (folder) cmd += " -m " + quote(files.model);
    else
        cmd += " --diffusion-model " + quote(files.diffusion_model) + " --t5xxl " + quote(files.t5xxl) + " --clip_l " + quote(files.clip_l) +
               " --vae " + quote(files.vae);
    cmd += " -p " + quote(c["prompt"]) + " -n " + quote(c["negative_prompt"]) + std::string(" -W ") + std::to_string(c["width"].get<int>()) + " -H " +
           std::to_string(c["height"].get<int>()) + std::string(" --steps ") + std::to_string(c["steps"].get<int>()) + " --cfg-scale " +
           c["cfg_scale"].dump() + (is_dev(c) ? " --guidance " + c["guidance"].dump() : std::string()) + " -s " +
           std::to_string(c["seed"].get<int64_t>()) + " --sampling-method " + c["sampling_method"].get<std::string>() + " --scheduler " +
           c["scheduler"].get<std::string>() + " --rng " + c["rng"].get<std::string>() + " --no-cache -o " + quote(out.string()) +
           " > /dev/null 2>&1";
    fs::remove(out);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto got = pipeline::load_image(out, 3);
    auto want = pipeline::load_image(kDir / c["png"].get<std::string>(), 3);
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    const int d = max_pixel_diff(got.pixels, want.pixels);
    std::printf("[flux1 e2e] %s: max pixel diff %d/255\n", param_name(GetParam()).c_str(), d);
    EXPECT_LE(d, 2);
    fs::remove(out);
}

INSTANTIATE_TEST_SUITE_P(Cases, Flux1TinyE2E, ::testing::ValuesIn(all_params()),
                         [](const auto& info) { return param_name(info.param); });

// The family's defaults reproduce the reference without --scheduler / --sampling-method /
// --cfg-scale (dev: flux, euler, CFG 1; schnell: discrete): the first dev and schnell cases.
TEST(Flux1TinyE2EDefaults, DefaultsReproduceDiffusers) {
    for (const char* variant : {"dev", "schnell"}) {
        const nlohmann::json* cp = nullptr;
        for (const auto& c : cases_json()["cases"])
            if (!cp && c["variant"].get<std::string>() == variant && !c["cfg_active"].get<bool>()) cp = &c;
        ASSERT_NE(cp, nullptr) << variant;
        const auto& c = *cp;
        const auto files = files_for(Form::Single, is_dev(c));
        const fs::path out = fs::path(testing::TempDir()) / (std::string("easel_flux1_defaults_") + variant + std::string("_") + std::to_string(getpid()) + ".png");
        std::string cmd = std::string(EASEL_BINARY) + " generate -t 1 --diffusion-model " + quote(files.diffusion_model) + " --t5xxl " +
                          quote(files.t5xxl) + " --clip_l " + quote(files.clip_l) + " --vae " + quote(files.vae) + " -p " + quote(c["prompt"]) +
                          std::string(" -W ") + std::to_string(c["width"].get<int>()) + std::string(" -H ") + std::to_string(c["height"].get<int>()) + " --steps " +
                          std::to_string(c["steps"].get<int>()) + (is_dev(c) ? " --guidance " + c["guidance"].dump() : std::string()) +
                          std::string(" -s ") + std::to_string(c["seed"].get<int64_t>()) + " --rng cpu --no-cache -o " + quote(out.string()) +
                          " > /dev/null 2>&1";
        fs::remove(out);
        ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
        auto got = pipeline::load_image(out, 3);
        auto want = pipeline::load_image(kDir / c["png"].get<std::string>(), 3);
        EXPECT_LE(max_pixel_diff(got.pixels, want.pixels), 2) << variant;
        fs::remove(out);
    }
}

// `easel generate` refuses a CLIP-L given as --t5xxl and a Qwen3 given as --llm with one error
// line naming the flag, and writes no image.
TEST(Flux1TinyE2EErrors, WrongTextEncoderIsOneLineError) {
    const auto files = files_for(Form::Single);
    const fs::path qwen = fs::path(EASEL_TEST_DATA) / "reference" / "zimage_tiny" / "diffusers" / "text_encoder" / "model.safetensors";
    struct Case {
        std::string extra, flag, words;
    };
    const std::vector<Case> cases = {
        {" --t5xxl " + quote(files.clip_l) + " --clip_l " + quote(files.clip_l), "--t5xxl", "not a T5 encoder"},
        {" --t5xxl " + quote(files.t5xxl) + " --clip_l " + quote(files.clip_l) + " --llm " + quote(qwen.string()), "--llm", "no LLM"},
    };
    for (const auto& cs : cases) {
        const fs::path out = fs::path(testing::TempDir()) / (std::string("easel_flux1_err_") + std::to_string(getpid()) + ".png");
        const fs::path err = fs::path(testing::TempDir()) / (std::string("easel_flux1_err_") + std::to_string(getpid()) + ".txt");
        const std::string cmd = std::string(EASEL_BINARY) + " generate -t 1 --diffusion-model " + quote(files.diffusion_model) + " --vae " +
                                quote(files.vae) + cs.extra + " -p 'a cat' -W 64 -H 64 --steps 1 --rng cpu --no-cache -o " +
                                quote(out.string()) + " > /dev/null 2> " + quote(err.string());
        fs::remove(out);
        const int rc = std::system(cmd.c_str());
        EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << cmd;
        EXPECT_FALSE(fs::exists(out));
        std::ifstream f(err);
        std::stringstream ss;
        ss << f.rdbuf();
        std::string text = ss.str();
        while (!text.empty() && text.back() == '\n') text.pop_back();
        EXPECT_EQ(text.find('\n'), std::string::npos) << text;
        EXPECT_EQ(text.rfind("error: ", 0), 0u) << text;
        EXPECT_NE(text.find(cs.flag), std::string::npos) << text;
        EXPECT_NE(text.find(cs.words), std::string::npos) << text;
        fs::remove(err);
    }
}
