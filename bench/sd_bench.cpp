// easel-bench: timings of the full-size Stable Diffusion 1.5 modules with made-up weights, and of
// the bundled demo model's txt2img pipeline (issue 3 "Performance", issue 4's 256x256 figure).
//
// Module benchmarks (default): the bench builds the SD1.5 architectures with the real model code,
// enumerates their parameters under the diffusers / transformers key names, writes a temporary
// safetensors file with small random F16 values (fixed seed), and loads it back through the
// ordinary load path (config inferred from the weights, --type conversion for the UNet):
//   UNet      diffusers UNet2DConditionModel, SD1.5 config (block_out_channels 320/640/1280/1280,
//             layers_per_block 2, 8 heads, cross-attention width 768, 32 groups)
//   te        transformers CLIPTextModel, CLIP ViT-L/14 text tower (width 768, 12 layers,
//             12 heads, vocab 49408, 77 positions, quick_gelu)
//   vae       diffusers AutoencoderKL decoder (block_out_channels 128/256/512/512, 4 latent
//             channels, post_quant_conv)
//   qwen3     (only with --only qwen3) transformers Qwen3ForCausalLM, Qwen3-4B architecture (the
//             Z-Image / FLUX.2 klein-4B text encoder: hidden 2560, 36 layers, 32 heads, 8 kv heads,
//             head_dim 128, intermediate 9728, vocab 151936): one 512-token prompt encoding
// Each is run once to warm up, then --reps times; the median wall time is reported with the
// measured compute buffer (runtime::GraphRunner::last_compute_bytes) and parameter bytes.
//
// Demo benchmark (--demo FILE): pipeline::generate() at the default settings, i.e. the model file's
// recommended ones (its easel.* metadata: the demo model's 256x256, Euler, discrete, 20 steps, CFG 3),
// as `easel -p "..."` runs it; SD's defaults for a file without them (then 512x512). Seed 1; total and
// per-stage times from its GenerateReport.
#include "bench_common.h"
#include "core/error.h"
#include "core/log.h"
#include "easel_version.h"
#include "io/weight_index.h"
#include "models/clip/clip_text.h"
#include "models/recommended.h"
#include "models/qwen3/qwen3.h"
#include "models/sd/unet.h"
#include "models/vae/autoencoder_kl.h"
#include "nn/block.h"
#include "pipeline/generate.h"
#include "placement/devices.h"
#include "runtime/graph_runner.h"
#include "text/qwen_tokenizer.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <ggml-backend.h>
#include <ggml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

using namespace easel;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace easel::bench;

// ---------------------------------------------------------------------------------------------
// Made-up weights

/// splitmix64 (Steele, Lea, Flood 2014): a fast, well-mixed 64-bit generator; one stream per
/// tensor, seeded by the bench seed and the tensor name, so values do not depend on order.
struct SplitMix64 {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    /// Uniform in [-1, 1).
    float sym() { return float((next() >> 40) * (1.0 / 8388608.0) - 1.0); }
};

/// FNV-1a hash of a name (stream selection).
uint64_t fnv1a(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
    return h;
}

/// One tensor to write: name, PyTorch-order shape, role (decides the value distribution).
struct MadeUpTensor {
    std::string name;
    std::vector<int64_t> shape;
    nn::ParamRole role;
};

/// Every parameter of `root` under `prefix`, in declaration order.
std::vector<MadeUpTensor> tensors_of(nn::Block& root, const std::string& prefix) {
    std::vector<MadeUpTensor> out;
    root.visit_params(prefix, [&](const std::string& name, nn::Param& p) { out.push_back({name, p.shape, p.role}); });
    return out;
}

/// Values of one made-up tensor, like PyTorch's default initialisation in scale so that
/// activations stay O(1) through a deep network: matmul / conv weights uniform in
/// +-1/sqrt(fan_in) (fan_in = product of all dimensions but the first), biases uniform in
/// +-0.01, embeddings uniform in +-0.03, norm scales 1 and norm shifts 0.
void fill_values(const MadeUpTensor& t, uint64_t seed, std::vector<float>& v) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    v.resize((size_t)n);
    const bool is_bias_name = t.name.size() >= 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    if (t.role == nn::ParamRole::Norm) {
        std::fill(v.begin(), v.end(), is_bias_name ? 0.0f : 1.0f);
        return;
    }
    float scale = 0.01f;
    if (t.role == nn::ParamRole::Weight || t.role == nn::ParamRole::ConvWeight) {
        int64_t fan_in = 1;
        for (size_t i = 1; i < t.shape.size(); ++i) fan_in *= t.shape[i];
        scale = 1.0f / std::sqrt((float)std::max<int64_t>(fan_in, 1));
    } else if (t.role == nn::ParamRole::Embedding) {
        scale = 0.03f;
    }
    SplitMix64 rng{seed ^ fnv1a(t.name)};
    for (auto& x : v) x = scale * rng.sym();
}

/// Writes `tensors` as an F16 safetensors file (format: github.com/huggingface/safetensors
/// README: u64 little-endian header length, JSON header with dtype/shape/data_offsets, data).
/// Returns the number of parameters written. Throws Error(Io) when the file cannot be written.
int64_t write_made_up_safetensors(const fs::path& path, const std::vector<MadeUpTensor>& tensors, uint64_t seed) {
    json header = json::object();
    uint64_t off = 0;
    int64_t count = 0;
    for (auto& t : tensors) {
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        header[t.name] = {{"dtype", "F16"}, {"shape", t.shape}, {"data_offsets", {off, off + 2 * (uint64_t)n}}};
        off += 2 * (uint64_t)n;
        count += n;
    }
    header["__metadata__"] = {{"format", "pt"}, {"producer", "easel-bench made-up weights"}};
    std::string h = header.dump();
    while ((h.size() + 8) % 8 != 0) h.push_back(' ');
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) fail(ErrorKind::Io, "cannot create the temporary weight file {}: choose another folder with --tmp-dir", path.string());
    uint64_t hl = h.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = (unsigned char)(hl >> (8 * i));
    f.write((const char*)le, 8);
    f.write(h.data(), (std::streamsize)h.size());
    std::vector<float> v;
    std::vector<ggml_fp16_t> half;
    for (auto& t : tensors) {
        fill_values(t, seed, v);
        half.resize(v.size());
        ggml_fp32_to_fp16_row(v.data(), half.data(), (int64_t)v.size());
        f.write((const char*)half.data(), (std::streamsize)(half.size() * sizeof(ggml_fp16_t)));
    }
    f.close();
    if (!f) fail(ErrorKind::Io, "writing the temporary weight file {} failed (disk full?): choose another folder with --tmp-dir", path.string());
    return count;
}


// ---------------------------------------------------------------------------------------------
// SD1.5 architectures (the published configs, diffusers / transformers naming)

/// The SD1.5 UNet2DConditionModel structure (diffusers config of runwayml/stable-diffusion-v1-5:
/// block_out_channels [320, 640, 1280, 1280], layers_per_block 2, attention_head_dim 8 (= heads),
/// cross_attention_dim 768, CrossAttnDownBlock2D x3 + DownBlock2D, UpBlock2D + CrossAttnUpBlock2D
/// x3; channel bookkeeping as diffusers/models/unets/unet_2d_condition.py __init__).
models::sd::UNetConfig sd15_unet_config() {
    using namespace models::sd;
    UNetConfig c;
    const std::vector<int64_t> ch{320, 640, 1280, 1280};
    const int L = 2, heads = 8;
    const int64_t temb = 1280, ctx = 768;
    c.in_channels = 4;
    c.out_channels = 4;
    c.model_channels = ch[0];
    c.time_proj_dim = ch[0];
    c.time_embed_dim = temb;
    c.context_dim = ctx;
    c.layers_per_block = L;
    auto attn = [&](int64_t C) {
        TransformerSpec t;
        t.channels = C;
        t.inner = C;
        t.depth = 1;
        t.heads = heads;
        t.head_dim = C / heads;
        t.context_dim = ctx;
        t.ff_inner = 4 * C;
        t.linear_proj = false;
        return t;
    };
    auto res = [&](int64_t in, int64_t out) { return ResnetSpec{in, out, temb, in != out}; };
    int64_t prev = ch[0];
    for (size_t b = 0; b < ch.size(); ++b) {
        DownBlockSpec d;
        for (int j = 0; j < L; ++j) {
            d.resnets.push_back(res(j == 0 ? prev : ch[b], ch[b]));
            if (b + 1 < ch.size()) d.attentions.push_back(attn(ch[b]));
        }
        d.downsample = b + 1 < ch.size();
        prev = ch[b];
        c.down.push_back(d);
    }
    c.mid.present = true;
    c.mid.resnets = {res(ch.back(), ch.back()), res(ch.back(), ch.back())};
    c.mid.attentions = {attn(ch.back())};
    const std::vector<int64_t> rev(ch.rbegin(), ch.rend());
    prev = rev[0];
    for (size_t i = 0; i < rev.size(); ++i) {
        UpBlockSpec u;
        const int64_t out = rev[i], input = rev[std::min(i + 1, rev.size() - 1)];
        for (int j = 0; j <= L; ++j) {
            const int64_t skip = j == L ? input : out;
            u.resnets.push_back(res((j == 0 ? prev : out) + skip, out));
            if (i > 0) u.attentions.push_back(attn(out));
        }
        u.upsample = i + 1 < rev.size();
        prev = out;
        c.up.push_back(u);
    }
    return c;
}

/// CLIP ViT-L/14 text tower (openai/clip-vit-large-patch14 config: hidden 768, 12 layers,
/// 12 heads, intermediate 3072, vocab 49408, 77 positions, quick_gelu).
models::clip::ClipConfig clip_l_config() {
    models::clip::ClipConfig c;
    c.vocab = 49408;
    c.width = 768;
    c.layers = 12;
    c.positions = 77;
    c.intermediate = 3072;
    c.heads = 12;
    c.projection = 0;
    c.act = models::clip::Activation::QuickGelu;
    return c;
}

/// The SD VAE (AutoencoderKL, block_out_channels 128/256/512/512, layers_per_block 2, 4 latent
/// channels, 32 groups), decoder half.
vae::AutoencoderKLConfig sd_vae_config() {
    vae::AutoencoderKLConfig c;
    c.block_out_channels = {128, 256, 512, 512};
    c.latent_channels = 4;
    c.layers_per_block = 2;
    c.has_encoder = false;
    c.has_decoder = true;
    return c;
}

// ---------------------------------------------------------------------------------------------
// Timing




/// Standard-normal host values (Box-Muller over splitmix64), for latents and conditioning.
std::vector<float> normal_values(size_t n, uint64_t seed) {
    SplitMix64 r{seed};
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i += 2) {
        double u1 = ((r.next() >> 11) + 1.0) * (1.0 / 9007199254740993.0), u2 = (r.next() >> 11) * (1.0 / 9007199254740992.0);
        double m = std::sqrt(-2.0 * std::log(u1));
        v[i] = float(m * std::cos(2 * M_PI * u2));
        if (i + 1 < n) v[i + 1] = float(m * std::sin(2 * M_PI * u2));
    }
    return v;
}

struct Options {
    std::string device;
    int threads = 0;
    int reps = 3;
    int warmup = 1;
    std::string only;
    std::string type = "f16";
    int size = 512;
    std::string json_path;
    std::string demo;
    std::string tmp_dir;
    uint64_t seed = 1;
    bool flash = false;
    int batch = 1;             ///< UNet batch (2 = a CFG pair in one evaluation, as diffusers runs it)
    std::string unet_weights;  ///< made-up UNet file to write and keep (or reuse when present)
};

/// Runs `once` (which returns its output) o.warmup untimed + o.reps timed times; returns the
/// times, the compute buffer of the last run and statistics of the last output.
json time_runs(const Options& o, runtime::GraphRunner& run, const std::function<runtime::HostTensor()>& once) {
    json r;
    runtime::HostTensor out;
    std::vector<double> warm;
    for (int i = 0; i < o.warmup; ++i) {
        auto t0 = Clock::now();
        out = once();
        warm.push_back(seconds_since(t0));
    }
    r["warmup_s"] = warm;
    std::vector<double> times;
    for (int i = 0; i < o.reps; ++i) {
        auto t0 = Clock::now();
        out = once();
        times.push_back(seconds_since(t0));
    }
    r["times_s"] = times;
    r["median_s"] = median(times);
    r["min_s"] = times.empty() ? 0.0 : *std::min_element(times.begin(), times.end());
    r["compute_bytes"] = run.last_compute_bytes();
    r["output_shape_ggml"] = out.ne;
    r["output"] = output_stats(out.data);
    return r;
}

std::string mib(double b) { return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0)); }

void print_result(const json& r) {
    double warm = 0;
    for (auto& w : r["warmup_s"]) warm += w.get<double>();
    fmt::print("  {:<6} {:<5} median {:.3f} s over {} reps ({} warm-up runs, {:.3f} s); params {} ({:.1f} M) ; compute buffer {}; "
               "output mean {:.4g} std {:.4g}, non-finite {}\n",
               r["what"].get<std::string>(), r["type"].get<std::string>(), r["median_s"].get<double>(),
               r["times_s"].size(), r["warmup_s"].size(), warm, mib(r["param_bytes"].get<double>()),
               r["param_count"].get<double>() / 1e6, mib(r["compute_bytes"].get<double>()),
               r["output"]["mean"].get<double>(), r["output"]["std"].get<double>(), r["output"]["non_finite"].get<int64_t>());
}

fs::path temp_path(const Options& o, const std::string& what) {
    fs::path dir = o.tmp_dir.empty() ? fs::temp_directory_path() : fs::path(o.tmp_dir);
    return dir / fmt::format("easel-bench-{}-{}.safetensors", what, (long)getpid());
}

// ---------------------------------------------------------------------------------------------
// The three module benchmarks

json bench_unet(const Options& o, runtime::GraphRunner& run) {
    using namespace models::sd;
    const int64_t lat = o.size / 8;
    auto t_write = Clock::now();
    TempFile tmp;
    const fs::path wpath = o.unet_weights.empty() ? temp_path(o, "unet") : fs::path(o.unet_weights);
    if (o.unet_weights.empty()) tmp.path = wpath;
    int64_t count = 0;
    {
        UNet2DCondition shape_only(sd15_unet_config());
        if (o.unet_weights.empty() || !fs::exists(wpath)) {
            count = write_made_up_safetensors(wpath, tensors_of(shape_only, ""), o.seed);
        } else {
            for (const auto& t : tensors_of(shape_only, "")) {
                int64_t n = 1;
                for (int64_t d : t.shape) n *= d;
                count += n;
            }
        }
    }
    const double write_s = seconds_since(t_write);
    auto t_load = Clock::now();
    io::WeightIndex idx = io::WeightIndex::open(wpath);
    nn::LoadOptions lo;
    lo.weight_type = o.type == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    LoadedUNet u = load_unet(idx, run.buffer_type(), {}, lo);
    const double load_s = seconds_since(t_load);
    fmt::print("  unet: {} ({} parameters); made-up weights written in {:.1f} s, loaded in {:.1f} s\n",
               u.net->config().summary(), count, write_s, load_s);

    const int64_t B = o.batch;
    const auto sample = normal_values((size_t)(lat * lat * 4 * B), o.seed + 1);
    const auto context = normal_values((size_t)(768 * 77 * B), o.seed + 2);
    const std::vector<float> t((size_t)B, 981.0f);
    json r = time_runs(o, run, [&] {
        return run.run([&](runtime::GraphBuilder& g) {
            UNetInputs in;
            in.sample = g.input_f32("sample", {lat, lat, 4, B}, sample);
            in.timestep = g.input_f32("timestep", {B}, t);
            in.context = g.input_f32("context", {768, 77, B}, context);
            nn::Ctx c{g.ctx(), o.flash, g.backend()};
            return std::vector<ggml_tensor*>{u.net->forward(c, in)};
        })[0];
    });
    r["what"] = "unet";
    r["type"] = o.type;
    r["param_bytes"] = u.params.size();
    r["param_count"] = count;
    r["input"] = fmt::format("latent {}x{}x4, batch {}, context 77x768, timestep 981", lat, lat, B);
    r["batch"] = B;
    r["flash_attn"] = o.flash;
    r["write_s"] = write_s;
    r["load_s"] = load_s;
    return r;
}

json bench_te(const Options& o, runtime::GraphRunner& run) {
    namespace clip = models::clip;
    auto t_write = Clock::now();
    TempFile tmp{temp_path(o, "te")};
    int64_t count;
    {
        clip::ClipTextModel shape_only(clip_l_config());
        count = write_made_up_safetensors(tmp.path, tensors_of(shape_only, "text_model."), o.seed);
    }
    const double write_s = seconds_since(t_write);
    auto t_load = Clock::now();
    io::WeightIndex idx = io::WeightIndex::open(tmp.path);
    auto keys = clip::find_clip_text_encoders(idx);
    if (keys.size() != 1) fail(ErrorKind::Internal, "made-up CLIP file: expected one text encoder, found {}", keys.size());
    clip::ClipConfig cfg = clip::infer_config(idx, keys[0]);
    clip::ClipTextModel model(cfg);
    auto src = clip::make_tensor_source(idx, keys[0], cfg);
    nn::ParamBuffer params = nn::ParamBuffer::load(model, src, run.buffer_type(), clip::default_load_options(keys[0], cfg, idx));
    const double load_s = seconds_since(t_load);
    fmt::print("  te: CLIP text width {}, {} layers, {} heads, vocab {} ({} parameters); written in {:.1f} s, loaded in {:.1f} s\n",
               cfg.width, cfg.layers, cfg.heads, cfg.vocab, count, write_s, load_s);

    // One 77-token window: BOS, 20 ordinary tokens, EOS, then EOS padding (SD1.x's pad token).
    std::vector<int32_t> ids(77, 49407);
    ids[0] = 49406;
    for (int i = 1; i <= 20; ++i) ids[(size_t)i] = 320 + 37 * i;
    clip::check_token_ids(ids, cfg.vocab);
    json r = time_runs(o, run, [&] {
        return run.run([&](runtime::GraphBuilder& g) {
            nn::Ctx c{g.ctx(), o.flash, g.backend()};
            clip::ClipInputs in;
            in.ids = g.input_i32("ids", {77, 1}, ids);
            return std::vector<ggml_tensor*>{model.encode(c, in).context};
        })[0];
    });
    r["what"] = "te";
    r["type"] = "f16";
    r["param_bytes"] = params.size();
    r["param_count"] = count;
    r["input"] = "77 token ids, batch 1";
    r["write_s"] = write_s;
    r["load_s"] = load_s;
    return r;
}

/// The Qwen3-4B architecture (config.json of Qwen/Qwen3-4B: hidden_size 2560, num_hidden_layers 36,
/// num_attention_heads 32, num_key_value_heads 8, head_dim 128, intermediate_size 9728,
/// vocab_size 151936, rope_theta 1e6, rms_norm_eps 1e-6), the text encoder of Z-Image and
/// FLUX.2 klein-4B.
models::qwen3::Qwen3Config qwen3_4b_config() {
    models::qwen3::Qwen3Config c;
    c.vocab = 151936;
    c.hidden = 2560;
    c.layers = 36;
    c.heads = 32;
    c.kv_heads = 8;
    c.head_dim = 128;
    c.intermediate = 9728;
    return c;
}

/// Qwen3-4B prompt encoding: a real prompt through the Qwen3 chat template and tokenizer, right-
/// padded with <|endoftext|> to 512 tokens (Z-Image's and klein's max_sequence_length) with the
/// padding masked, batch 1; output hidden_states[-2] (Z-Image's choice: 35 of the 36 layers run).
/// Matmul weights F16 or Q8_0 (--type).
json bench_qwen3(const Options& o, runtime::GraphRunner& run) {
    namespace q3 = models::qwen3;
    auto t_write = Clock::now();
    TempFile tmp{temp_path(o, "qwen3")};
    int64_t count;
    {
        q3::Qwen3Model shape_only(qwen3_4b_config());
        count = write_made_up_safetensors(tmp.path, tensors_of(shape_only, "model."), o.seed);
    }
    const double write_s = seconds_since(t_write);
    auto t_load = Clock::now();
    io::WeightIndex idx = io::WeightIndex::open(tmp.path);
    q3::Qwen3RunOptions ro;
    ro.device = run.device();
    ro.threads = o.threads;
    ro.flash_attn = o.flash;
    ro.weight_type = o.type == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    q3::Qwen3TextEncoder te(idx, ro);
    const double load_s = seconds_since(t_load);
    const auto& cfg = te.config();
    fmt::print("  qwen3: hidden {}, {} layers, {} heads / {} kv heads, head_dim {}, intermediate {}, vocab {} ({} parameters); "
               "written in {:.1f} s, loaded in {:.1f} s\n",
               cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate, cfg.vocab, count, write_s, load_s);

    const int64_t L = 512;
    const auto& tok = text::QwenTokenizer::builtin();
    std::vector<int32_t> ids = tok.encode(text::QwenTokenizer::chat_prompt(
        "a photograph of a red fox sitting in a snowy forest at dawn, soft golden light, shallow depth of field", false));
    const size_t n_tokens = ids.size();
    std::vector<int32_t> mask(ids.size(), 1);
    ids.resize((size_t)L, text::QwenTokenizer::kEndOfText);
    mask.resize((size_t)L, 0);
    const std::vector<int> index{-2};
    json r = time_runs(o, te.runner(), [&] { return te.run(ids, mask, 1, L, index)[0]; });
    r["what"] = "qwen3";
    r["type"] = o.type;
    r["param_bytes"] = te.param_bytes();
    r["param_count"] = count;
    r["input"] = fmt::format("{} prompt tokens right-padded to {} (masked), batch 1; output hidden_states[-2]", n_tokens, L);
    r["write_s"] = write_s;
    r["load_s"] = load_s;
    return r;
}

json bench_vae(const Options& o, runtime::GraphRunner& run) {
    const int64_t lat = o.size / 8;
    auto t_write = Clock::now();
    TempFile tmp{temp_path(o, "vae")};
    int64_t count;
    {
        vae::AutoencoderKL shape_only(sd_vae_config(), vae::KLParts::DecoderOnly);
        count = write_made_up_safetensors(tmp.path, tensors_of(shape_only, ""), o.seed);
    }
    const double write_s = seconds_since(t_write);
    auto t_load = Clock::now();
    io::WeightIndex idx = io::WeightIndex::open(tmp.path);
    auto src = vae::find_autoencoder_kl(idx);
    if (!src) fail(ErrorKind::Internal, "made-up VAE file: no AutoencoderKL found");
    vae::AutoencoderKLConfig cfg = vae::infer_autoencoder_kl_config(idx, *src);
    vae::AutoencoderKL model(cfg, vae::KLParts::DecoderOnly);
    nn::LoadOptions lo;
    lo.weight_type = GGML_TYPE_F32;  // what AutoencoderKLModel::load (and so the pipeline) keeps by default
    nn::ParamBuffer params = nn::ParamBuffer::load(model, nn::TensorSource(idx, src->prefix), run.buffer_type(), lo);
    const double load_s = seconds_since(t_load);
    fmt::print("  vae: decoder with {} levels up to {} channels ({} parameters); written in {:.1f} s, loaded in {:.1f} s\n",
               cfg.block_out_channels.size(), cfg.block_out_channels.back(), count, write_s, load_s);

    const auto z = normal_values((size_t)(lat * lat * 4), o.seed + 3);
    json r = time_runs(o, run, [&] {
        return run.run([&](runtime::GraphBuilder& g) {
            nn::Ctx c{g.ctx(), o.flash, g.backend()};
            return std::vector<ggml_tensor*>{model.decode(c, g.input_f32("latent", {lat, lat, 4, 1}, z))};
        })[0];
    });
    r["what"] = "vae";
    r["type"] = "f32";  // conv weights as the pipeline keeps them (file holds F16)
    r["param_bytes"] = params.size();
    r["param_count"] = count;
    r["input"] = fmt::format("latent {}x{}x4 -> image {}x{}x3", lat, lat, lat * 8, lat * 8);
    r["write_s"] = write_s;
    r["load_s"] = load_s;
    return r;
}

json bench_demo(const Options& o) {
    pipeline::GenerateParams p;
    p.model = o.demo;
    p.prompt = "a large red circle in the centre, blue background";  // the README's first command
    // no size, sampler, scheduler, steps or CFG: the file's recommended settings (docs/formats.md)
    p.steps_given = p.cfg_scale_given = p.width_given = p.height_given = false;
    p.seed = 1;
    p.threads = o.threads > 0 ? o.threads : -1;
    p.flash_attn = o.flash;
    fs::path out = (o.tmp_dir.empty() ? fs::temp_directory_path() : fs::path(o.tmp_dir)) /
                   fmt::format("easel-bench-demo-{}.png", (long)getpid());
    p.output = out.string();
    json runs = json::array();
    std::vector<double> totals;
    for (int i = 0; i < o.warmup + o.reps; ++i) {  // the first o.warmup runs are warm-ups
        auto t0 = Clock::now();
        pipeline::GenerateReport rep = pipeline::generate(p);
        const double total = seconds_since(t0);
        double steps = 0;
        for (double s : rep.step_s) steps += s;
        json r = {{"total_s", total},       {"load_s", rep.load_s},   {"te_s", rep.te_s},
                  {"denoise_s", steps},     {"step_s", rep.step_s},   {"vae_s", rep.vae_s},
                  {"device", rep.device},   {"param_bytes", rep.param_bytes},
                  {"compute_peak_bytes", rep.compute_peak_bytes}, {"host_peak_rss_bytes", rep.host_peak_rss_bytes}};
        fmt::print("  demo {}: total {:.2f} s = load {:.2f} + te {:.2f} + denoise {:.2f} ({} steps, median {:.3f} s/step) + vae {:.2f}"
                   " (device {}, compute peak {})\n",
                   i < o.warmup ? fmt::format("warm-up {}", i + 1) : fmt::format("rep {}", i + 1 - o.warmup), total, rep.load_s, rep.te_s, steps, rep.step_s.size(),
                   median(rep.step_s), rep.vae_s, rep.device, mib((double)rep.compute_peak_bytes));
        if (i >= o.warmup) totals.push_back(total);
        runs.push_back(r);
    }
    std::error_code ec;
    fs::remove(out, ec);
    models::ModelFiles files;
    files.model = o.demo;
    const models::RecommendedSettings rec = models::read_recommended(files);
    const std::string settings =
        fmt::format("the model file's recommended settings: {}x{}, {} steps, {} {}, CFG {}; seed 1, batch 1", rec.width.value_or(512),
                    rec.height.value_or(512), rec.steps.value_or(20), rec.sampler.value_or("euler_a"), rec.scheduler.value_or("discrete"),
                    rec.cfg_scale.value_or(7.0f));
    return {{"what", "demo"},
            {"model", o.demo},
            {"settings", settings},
            {"prompt", p.prompt},
            {"median_total_s", median(totals)},
            {"runs", runs}};
}


int main_impl(int argc, char** argv) {
    Options o;
    CLI::App app{"easel-bench: full-size SD1.5 module timings with made-up weights, and the demo pipeline"};
    app.add_option("--device", o.device, "ggml device name (see `easel devices`); default: the first GPU, else the CPU");
    app.add_option("-t,--threads", o.threads, "CPU threads (0: all hardware threads)")->check(CLI::NonNegativeNumber);
    app.add_option("--reps", o.reps, "timed repetitions after the warm-up runs (default 3)")->check(CLI::Range(1, 1000));
    app.add_option("--warmup", o.warmup, "untimed warm-up runs before the timed ones (default 1)")->check(CLI::Range(0, 100));
    app.add_option("--only", o.only, "run only one module: unet, te or vae; or qwen3 (Qwen3-4B prompt encoding, never run by default)")
        ->check(CLI::IsMember({"unet", "te", "vae", "qwen3"}));
    app.add_option("--type", o.type, "UNet / qwen3 matmul weight type: f16 or q8_0 (default f16)")->check(CLI::IsMember({"f16", "q8_0"}));
    app.add_option("--size", o.size, "image side in pixels (default 512; latent side = size / 8)")
        ->check(CLI::Range(64, 4096));
    app.add_option("--json", o.json_path, "write the results as JSON to this file");
    app.add_option("--demo", o.demo, "benchmark the txt2img pipeline on this model at its default settings (the file's easel.* ones: the demo's 256x256, 20 steps, CFG 3) instead");
    app.add_option("--tmp-dir", o.tmp_dir, "folder for the temporary made-up weight files (default: the system temp folder)");
    app.add_option("--seed", o.seed, "seed of the made-up weights and inputs (default 1)");
    app.add_flag("--fa", o.flash, "use flash attention where the backend supports it");
    app.add_option("--batch", o.batch, "UNet batch (default 1; 2 = a CFG pair evaluated at once)")->check(CLI::Range(1, 16));
    app.add_option("--unet-weights", o.unet_weights, "made-up UNet file: written when absent and then kept, so diffusers can load the same weights (bench/compare/sd15_unet_diffusers.py)");
    CLI11_PARSE(app, argc, argv);
    if (o.size % 64 != 0) fail(ErrorKind::InvalidInput, "--size {} must be a multiple of 64 (latent side divisible by the UNet's 8)", o.size);

    std::string command_line;
    for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    json doc = {{"easel_version", EASEL_VERSION},
                {"command_line", command_line},
                {"host", host},
                {"ggml_commit", EASEL_GGML_COMMIT},
                {"ggml_source", EASEL_GGML_SOURCE},
                {"date", utc_now()},
                {"hardware_threads", std::thread::hardware_concurrency()},
                {"threads", o.threads},
                {"reps", o.reps},
                {"warmup", o.warmup},
                {"flash_attn", o.flash}};
    json results = json::array();

    if (!o.demo.empty()) {
        fmt::print("easel-bench demo: {} (ggml {})\n", o.demo, EASEL_GGML_COMMIT);
        if (!o.device.empty() || !o.only.empty() || o.type != "f16" || o.size != 512)
            fmt::print(stderr, "easel-bench: --device, --only, --type and --size do not apply to --demo (the pipeline picks the first GPU, else the CPU)\n");
        results.push_back(bench_demo(o));
    } else {
        placement::init_backends();
        ggml_backend_dev_t dev = nullptr;
        if (!o.device.empty()) dev = placement::find_device(o.device);
        else if (!(dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU))) dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        runtime::GraphRunner run(dev, o.threads);
        doc["device"] = {{"name", ggml_backend_dev_name(dev)}, {"description", ggml_backend_dev_description(dev)}};
        doc["size"] = o.size;
        fmt::print("easel-bench: device {} ({}), threads {}, size {}x{}, {} reps, ggml {}\n", ggml_backend_dev_name(dev),
                   ggml_backend_dev_description(dev), o.threads > 0 ? o.threads : (int)std::thread::hardware_concurrency(),
                   o.size, o.size, o.reps, EASEL_GGML_COMMIT);
        if (o.only.empty() || o.only == "te") results.push_back(bench_te(o, run)), print_result(results.back());
        if (o.only.empty() || o.only == "unet") results.push_back(bench_unet(o, run)), print_result(results.back());
        if (o.only.empty() || o.only == "vae") results.push_back(bench_vae(o, run)), print_result(results.back());
        if (o.only == "qwen3") results.push_back(bench_qwen3(o, run)), print_result(results.back());
    }
    doc["results"] = results;
    if (!o.json_path.empty()) {
        std::ofstream f(o.json_path);
        f << doc.dump(2) << "\n";
        if (!f) fail(ErrorKind::Io, "cannot write {}", o.json_path);
        fmt::print("results written to {}\n", o.json_path);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines appear as they are printed, also in a log file
    try {
        return main_impl(argc, argv);
    } catch (const easel::Error& e) {
        std::fprintf(stderr, "easel-bench: %s\n", e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "easel-bench: %s\n", e.what());
        return 1;
    }
}
