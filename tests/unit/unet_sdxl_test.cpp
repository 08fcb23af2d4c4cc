// The SDXL UNet (diffusers UNet2DConditionModel with addition_embed_type "text_time") without a
// reference fixture: a tiny SDXL-shaped UNet with seeded random weights, written in both key
// layouts, must
//   * have its structure inferred from the weights (no attention in the first level, per-level
//     transformer depth, Linear projections, the add_embedding widths: pooled 12 + 6 x 256);
//   * compute the time embedding of diffusers' forward (get_timestep_embedding of the timestep
//     -> time_embedding, plus add_time_proj of the 6 time ids flattened, concatenated after the
//     pooled text embedding -> add_embedding, summed) as a host double-precision transcription
//     of those formulas does;
//   * give the same output from the original (SGM: label_emb.0.0 / 0.2) and the diffusers layout;
//   * refuse missing or mis-sized text_time inputs with a clear error.
// The SDXL family on a synthetic single file (this UNet + two random CLIP encoders in SGM names,
// TAESD as the decoder) must wire its modules as diffusers does: context = concat(CLIP-L
// hidden_states[-2], G hidden_states[-2]) per token, pooled = G's text_embeds, an empty negative
// = zeros, the UNet called with time ids (H, W, 0, 0, H, W) in pixels.
// The parity with diffusers itself is tests/e2e/sdxl_tiny_e2e_test.cpp (fixture of
// tools/reference/make_sdxl_pipeline.py).
#include "core/error.h"
#include "io/weight_index.h"
#include "models/clip/clip_text.h"
#include "models/family.h"
#include "models/sd/sdxl.h"
#include "models/sd/unet.h"
#include "runtime/graph_runner.h"
#include "text/clip_tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

using namespace easel;
using namespace easel::models::sd;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kPooled = 12, kTimeDim = 256, kTemb = 64, kCtx = 16;

ResnetSpec res(int64_t in, int64_t out) { return ResnetSpec{in, out, kTemb, in != out}; }

TransformerSpec attn(int64_t ch, int depth) {
    TransformerSpec t;
    t.channels = t.inner = ch;
    t.depth = depth;
    t.heads = 1;
    t.head_dim = ch;
    t.context_dim = kCtx;
    t.ff_inner = 4 * ch;
    t.linear_proj = true;
    return t;
}

/// SDXL's shape in miniature: levels (32, 64), the first without attention, transformer depth
/// 2 in the second level and the mid block, one resnet per down block, text_time conditioning.
UNetConfig tiny_sdxl_config() {
    UNetConfig c;
    c.model_channels = 32;
    c.time_proj_dim = 32;
    c.time_embed_dim = kTemb;
    c.context_dim = kCtx;
    c.layers_per_block = 1;
    c.has_add_embedding = true;
    c.add_embed_in = kPooled + 6 * kTimeDim;
    c.add_time_dim = kTimeDim;
    c.add_time_ids = 6;
    c.add_text_dim = kPooled;
    c.down.push_back({{res(32, 32)}, {}, true});
    c.down.push_back({{res(32, 64)}, {attn(64, 2)}, false});
    c.mid.present = true;
    c.mid.resnets = {res(64, 64), res(64, 64)};
    c.mid.attentions = {attn(64, 2)};
    c.up.push_back({{res(128, 64), res(96, 64)}, {attn(64, 2), attn(64, 2)}, true});
    c.up.push_back({{res(96, 32), res(64, 32)}, {}, false});
    return c;
}

/// Deterministic values in [-s, s).
struct Lcg {
    uint64_t x;
    float next(float s) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        return s * ((float)((x >> 40) & 0xFFFFFF) / (float)(1 << 23) - 1.0f);
    }
};

using Tensors = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;

/// Every parameter of the UNet of `cfg` under its diffusers name, seeded random values (norm
/// weights near 1, the rest small).
Tensors random_weights(const UNetConfig& cfg) {
    UNet2DCondition net(cfg);
    Tensors ts;
    Lcg r{1234};
    net.visit_params("", [&](const std::string& name, nn::Param& p) {
        int64_t n = 1;
        for (int64_t d : p.shape) n *= d;
        std::vector<float> v((size_t)n);
        const bool norm = name.find("norm") != std::string::npos && name.ends_with(".weight");
        for (auto& x : v) x = norm ? 1.0f + r.next(0.1f) : r.next(0.15f);
        ts[name] = {p.shape, std::move(v)};
    });
    return ts;
}

void write_safetensors(const fs::path& path, const Tensors& ts, const std::function<std::string(const std::string&)>& rename) {
    nlohmann::json h = nlohmann::json::object();
    uint64_t off = 0;
    for (auto& [name, v] : ts) {
        const uint64_t n = v.second.size() * sizeof(float);
        h[rename(name)] = {{"dtype", "F32"}, {"shape", v.first}, {"data_offsets", {off, off + n}}};
        off += n;
    }
    std::string hs = h.dump();
    while (hs.size() % 8) hs += ' ';
    std::ofstream f(path, std::ios::binary);
    uint64_t len = hs.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(hs.data(), (std::streamsize)hs.size());
    for (auto& [name, v] : ts) f.write(reinterpret_cast<const char*>(v.second.data()), (std::streamsize)(v.second.size() * 4));
}

struct Files {
    fs::path diffusers, ldm;
    Tensors weights;
};

/// The tiny UNet in both layouts (written once per process).
const Files& files() {
    static Files f = [] {
        Files r;
        const UNetConfig cfg = tiny_sdxl_config();
        r.weights = random_weights(cfg);
        const fs::path dir = fs::path(testing::TempDir()) / ("easel_unet_sdxl_" + std::to_string(getpid()));
        fs::create_directories(dir);
        r.diffusers = dir / "unet_diffusers.safetensors";
        r.ldm = dir / "unet_ldm.safetensors";
        write_safetensors(r.diffusers, r.weights, [](const std::string& n) { return n; });
        write_safetensors(r.ldm, r.weights, [&](const std::string& n) {
            std::string k = unet_ldm_key(cfg, n);
            if (k.empty()) throw std::runtime_error("no LDM name for " + n);
            return "model.diffusion_model." + k;
        });
        return r;
    }();
    return f;
}

struct Inputs {
    std::vector<float> sample, t, ctx, pooled, ids;
};

Inputs inputs() {
    Inputs in;
    Lcg r{99};
    in.sample.resize(2 * 4 * 8 * 12);
    for (auto& v : in.sample) v = r.next(1.0f);
    in.t = {999.0f, 321.5f};
    in.ctx.resize(2 * 77 * kCtx);
    for (auto& v : in.ctx) v = r.next(1.0f);
    in.pooled.resize(2 * kPooled);
    for (auto& v : in.pooled) v = r.next(1.0f);
    in.ids = {64, 96, 0, 0, 64, 96, 1024, 768, 16, 32, 896, 1152};
    return in;
}

UNetInputs graph_inputs(runtime::GraphBuilder& g, const Inputs& in) {
    UNetInputs u;
    u.sample = g.input_f32("sample", {12, 8, 4, 2}, in.sample);
    u.timestep = g.input_f32("timestep", {2}, in.t);
    u.context = g.input_f32("context", {kCtx, 77, 2}, in.ctx);
    u.text_embeds = g.input_f32("text_embeds", {kPooled, 2}, in.pooled);
    u.time_ids = g.input_f32("time_ids", {6, 2}, in.ids);
    return u;
}

std::vector<float> run_full(const fs::path& file, const Inputs& in) {
    auto idx = io::WeightIndex::open(file);
    runtime::GraphRunner runner;
    auto unet = load_unet(idx, runner.buffer_type());
    auto out = runner.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false};
        return std::vector<ggml_tensor*>{unet.net->forward(c, graph_inputs(g, in))};
    });
    return out.at(0).data;
}

// diffusers get_timestep_embedding(t, dim, flip_sin_to_cos=True, downscale_freq_shift=0): [cos | sin].
std::vector<double> sinusoid(double t, int64_t dim) {
    const int64_t half = dim / 2;
    std::vector<double> e((size_t)dim);
    for (int64_t i = 0; i < half; ++i) {
        const double a = t * std::exp(-std::log(10000.0) * (double)i / (double)half);
        e[(size_t)i] = std::cos(a);
        e[(size_t)(half + i)] = std::sin(a);
    }
    return e;
}

std::vector<double> linear(const Tensors& w, const std::string& name, const std::vector<double>& x) {
    const auto& W = w.at(name + ".weight");
    const auto& b = w.at(name + ".bias");
    const int64_t out = W.first[0], in = W.first[1];
    EXPECT_EQ((int64_t)x.size(), in) << name;
    std::vector<double> y((size_t)out);
    for (int64_t o = 0; o < out; ++o) {
        double s = b.second[(size_t)o];
        for (int64_t i = 0; i < in; ++i) s += (double)W.second[(size_t)(o * in + i)] * x[(size_t)i];
        y[(size_t)o] = s;
    }
    return y;
}

std::vector<double> silu(std::vector<double> x) {
    for (auto& v : x) v = v / (1.0 + std::exp(-v));
    return x;
}

}  // namespace

TEST(UnetSdxl, ConfigInferredFromWeightsInBothLayouts) {
    for (const fs::path& p : {files().diffusers, files().ldm}) {
        SCOPED_TRACE(p.filename().string());
        auto idx = io::WeightIndex::open(p);
        const UNetConfig c = infer_unet_config(idx);
        EXPECT_EQ(c.layout, p == files().ldm ? UNetKeyLayout::Ldm : UNetKeyLayout::Diffusers);
        EXPECT_TRUE(c.has_add_embedding);
        EXPECT_EQ(c.add_embed_in, kPooled + 6 * kTimeDim);
        EXPECT_EQ(c.add_time_dim, kTimeDim);
        EXPECT_EQ(c.add_time_ids, 6);
        EXPECT_EQ(c.add_text_dim, kPooled);
        EXPECT_EQ(c.time_embed_dim, kTemb);
        EXPECT_EQ(c.context_dim, kCtx);
        ASSERT_EQ(c.down.size(), 2u);
        EXPECT_TRUE(c.down[0].attentions.empty());
        ASSERT_EQ(c.down[1].attentions.size(), 1u);
        EXPECT_EQ(c.down[1].attentions[0].depth, 2);
        EXPECT_TRUE(c.down[1].attentions[0].linear_proj);
        EXPECT_EQ(c.down[1].attentions[0].heads, 1);  // SDXL's head size 64
        ASSERT_EQ(c.mid.attentions.size(), 1u);
        EXPECT_EQ(c.mid.attentions[0].depth, 2);
        EXPECT_EQ(c.up[0].attentions.size(), 2u);
        EXPECT_TRUE(c.up[1].attentions.empty());
        EXPECT_NE(c.summary().find("text_time (pooled 12 + 6 ids x 256)"), std::string::npos) << c.summary();
    }
    EXPECT_EQ(unet_ldm_key(tiny_sdxl_config(), "add_embedding.linear_1.weight"), "label_emb.0.0.weight");
    EXPECT_EQ(unet_ldm_key(tiny_sdxl_config(), "add_embedding.linear_2.bias"), "label_emb.0.2.bias");
}

TEST(UnetSdxl, AdditionTimeEmbedDimFromConfigJson) {
    nlohmann::json j = {{"addition_embed_type", "text_time"}, {"addition_time_embed_dim", 8}};
    EXPECT_EQ(unet_overrides_from_diffusers_config(j).addition_time_embed_dim, 8);
    nlohmann::json bad = {{"addition_embed_type", "text_image"}};
    EXPECT_THROW(unet_overrides_from_diffusers_config(bad), Error);
    // 8-wide time ids on our 256-wide weights: 1548 - 48 = 1500 pooled values (inferred, not refused)
    auto idx = io::WeightIndex::open(files().diffusers);
    UNetOverrides ov;
    ov.addition_time_embed_dim = 8;
    EXPECT_EQ(infer_unet_config(idx, ov).add_text_dim, kPooled + 6 * kTimeDim - 48);
}

TEST(UnetSdxl, TimeEmbeddingMatchesDiffusersFormulas) {
    const Files& f = files();
    auto idx = io::WeightIndex::open(f.ldm);
    runtime::GraphRunner runner;
    auto unet = load_unet(idx, runner.buffer_type());
    const Inputs in = inputs();
    auto out = runner.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false};
        UNetState s = unet.net->prologue(c, graph_inputs(g, in));
        return std::vector<ggml_tensor*>{s.temb};
    });
    ASSERT_EQ(out.at(0).data.size(), (size_t)(2 * kTemb));
    const Tensors& w = f.weights;
    double worst = 0, scale = 0;
    for (int n = 0; n < 2; ++n) {
        auto emb = linear(w, "time_embedding.linear_2", silu(linear(w, "time_embedding.linear_1", sinusoid(in.t[(size_t)n], 32))));
        std::vector<double> add_in(in.pooled.begin() + n * kPooled, in.pooled.begin() + (n + 1) * kPooled);
        for (int k = 0; k < 6; ++k) {
            auto e = sinusoid(in.ids[(size_t)(n * 6 + k)], kTimeDim);
            add_in.insert(add_in.end(), e.begin(), e.end());
        }
        auto aug = linear(w, "add_embedding.linear_2", silu(linear(w, "add_embedding.linear_1", add_in)));
        std::vector<double> sum(emb.size());
        for (size_t i = 0; i < sum.size(); ++i) sum[i] = emb[i] + aug[i];
        auto want = silu(sum);  // UNetState::temb is the activated embedding the resnets consume
        for (int64_t i = 0; i < kTemb; ++i) {
            worst = std::max(worst, std::fabs(want[(size_t)i] - (double)out[0].data[(size_t)(n * kTemb + i)]));
            scale = std::max(scale, std::fabs(want[(size_t)i]));
        }
    }
    std::printf("[unet_sdxl] temb max abs error %.3g (max |temb| %.3g)\n", worst, scale);
    EXPECT_GT(scale, 0.1);
    EXPECT_LT(worst, 1e-4 * std::max(1.0, scale));
}

TEST(UnetSdxl, LdmAndDiffusersLayoutsGiveTheSameOutput) {
    const Inputs in = inputs();
    auto a = run_full(files().diffusers, in);
    auto b = run_full(files().ldm, in);
    ASSERT_EQ(a.size(), (size_t)(2 * 4 * 8 * 12));
    ASSERT_EQ(a.size(), b.size());
    double m = 0, d = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        m = std::max(m, (double)std::fabs(a[i]));
        d = std::max(d, (double)std::fabs(a[i] - b[i]));
    }
    EXPECT_GT(m, 1e-3);
    EXPECT_LT(d, 1e-6);  // the same graph on the same weights
    // the micro-conditioning reaches the output: other time ids, another prediction
    Inputs in2 = in;
    in2.ids[0] = 128;
    auto c = run_full(files().diffusers, in2);
    double dc = 0;
    for (size_t i = 0; i < a.size() / 2; ++i) dc = std::max(dc, (double)std::fabs(a[i] - c[i]));
    EXPECT_GT(dc, 1e-6);
}

TEST(UnetSdxl, RefusesMissingOrMisSizedTextTimeInputs) {
    auto idx = io::WeightIndex::open(files().diffusers);
    runtime::GraphRunner runner;
    auto unet = load_unet(idx, runner.buffer_type());
    const Inputs in = inputs();
    auto expect_invalid = [&](const std::function<void(UNetInputs&, runtime::GraphBuilder&)>& spoil, const char* what) {
        try {
            runner.run([&](runtime::GraphBuilder& g) {
                nn::Ctx c{g.ctx(), false};
                UNetInputs u = graph_inputs(g, in);
                spoil(u, g);
                return std::vector<ggml_tensor*>{unet.net->forward(c, u)};
            });
            ADD_FAILURE() << what << ": no error";
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << what << ": " << e.what();
        }
    };
    std::vector<float> five(10, 0.0f), wide(2 * (kPooled + 1), 0.0f);
    expect_invalid([](UNetInputs& u, runtime::GraphBuilder&) { u.time_ids = nullptr; }, "no time ids");
    expect_invalid([](UNetInputs& u, runtime::GraphBuilder&) { u.text_embeds = nullptr; }, "no pooled embedding");
    expect_invalid([&](UNetInputs& u, runtime::GraphBuilder& g) { u.time_ids = g.input_f32("ids5", {5, 2}, five); }, "5 time ids");
    expect_invalid([&](UNetInputs& u, runtime::GraphBuilder& g) { u.text_embeds = g.input_f32("wide", {kPooled + 1, 2}, wide); },
                   "pooled too wide");
}

namespace {

/// A random CLIP text encoder of width 8 (2 layers, 1 head, CLIP vocabulary and 77 positions),
/// with a 12-wide text projection when `projection`; names under `prefix` (transformers names).
void add_clip(Tensors& ts, const std::string& prefix, const std::string& proj_name, uint64_t seed) {
    models::clip::ClipConfig c;
    c.vocab = 49408;
    c.width = 8;
    c.layers = 2;
    c.positions = 77;
    c.intermediate = 16;
    c.heads = 1;
    c.projection = proj_name.empty() ? 0 : kPooled;
    models::clip::ClipTextModel net(c);
    Lcg r{seed};
    net.visit_params("", [&](const std::string& name, nn::Param& p) {
        int64_t n = 1;
        for (int64_t d : p.shape) n *= d;
        std::vector<float> v((size_t)n);
        const bool norm = name.find("norm") != std::string::npos && name.ends_with(".weight");
        for (auto& x : v) x = norm ? 1.0f + r.next(0.1f) : r.next(0.5f);
        ts[name == "text_projection.weight" ? proj_name : prefix + name] = {p.shape, std::move(v)};
    });
}

const fs::path& synthetic_sdxl_file() {
    static fs::path p = [] {
        Tensors ts;
        const UNetConfig cfg = tiny_sdxl_config();
        for (auto& [name, v] : files().weights) ts["model.diffusion_model." + unet_ldm_key(cfg, name)] = v;
        add_clip(ts, "conditioner.embedders.0.transformer.text_model.", "", 7);
        add_clip(ts, "conditioner.embedders.1.transformer.text_model.", "conditioner.embedders.1.transformer.text_projection.weight", 8);
        fs::path f = files().diffusers.parent_path() / "sdxl_synthetic.safetensors";
        write_safetensors(f, ts, [](const std::string& n) { return n; });
        return f;
    }();
    return p;
}

}  // namespace

TEST(SdxlFamily, WiresBothEncodersPooledVectorAndTimeIds) {
    models::ModelFiles mf;
    mf.model = synthetic_sdxl_file().string();
    mf.taesd = (fs::path(EASEL_TEST_DATA) / "reference" / "autoencoder_tiny_taesd_tiny.safetensors").string();
    models::FamilyOptions fo;
    fo.threads = 2;
    auto fam = models::open_family(mf, fo);
    ASSERT_EQ(fam->name(), "SDXL");
    EXPECT_FLOAT_EQ(fam->latent_format().scaling_factor, 0.13025f);
    EXPECT_EQ(fam->defaults().clip_skip, 2);
    EXPECT_EQ(fam->defaults().width, 1024);
    EXPECT_EQ(fam->schedule_options().spacing, sampling::Spacing::Leading);
    EXPECT_EQ(fam->schedule_options().steps_offset, 1);

    const std::string prompt = "a red cat on a mat";
    models::Conditioning cond = fam->encode_prompt(prompt, 0);
    ASSERT_EQ(cond.dim, kCtx);
    ASSERT_EQ(cond.tokens, 77);
    ASSERT_EQ(cond.pooled.size(), (size_t)kPooled);

    // the same encoders run directly: CLIP-L ids padded with <|endoftext|>, G's with "!" (0)
    auto idx = io::WeightIndex::open(synthetic_sdxl_file());
    auto encs = models::clip::find_clip_text_encoders(idx);
    ASSERT_EQ(encs.size(), 2u);
    const auto& tok = text::ClipTokenizer::builtin();
    std::vector<std::vector<float>> pen(2);
    std::vector<float> pooled;
    for (int e = 0; e < 2; ++e) {
        const auto cfg = models::clip::infer_config(idx, encs[(size_t)e]);
        models::clip::ClipTextModel net(cfg);
        runtime::GraphRunner runner;
        auto params = nn::ParamBuffer::load(net, models::clip::make_tensor_source(idx, encs[(size_t)e], cfg), runner.buffer_type(),
                                            models::clip::default_load_options(encs[(size_t)e], cfg, idx));
        std::vector<int32_t> ids = tok.encode_window(prompt, e == 0 ? text::ClipTokenizer::kEos : 0);
        if (e == 0) {
            EXPECT_EQ(cond.token_ids, ids);
        } else {
            EXPECT_EQ(ids.back(), 0);  // G's windows pad with "!"
        }
        std::vector<int32_t> pool = models::clip::pool_indices(ids, 77, 1, cfg.eos_token_id);
        models::clip::ClipEncodeOptions eo;
        eo.clip_skip = 2;
        eo.final_norm_on_skip = false;
        auto out = runner.run([&](runtime::GraphBuilder& g) {
            nn::Ctx c{g.ctx(), false};
            models::clip::ClipInputs in;
            in.ids = g.input_i32("ids", {77, 1}, ids);
            in.pool_index = g.input_i32("pool", {1}, pool);
            auto enc = net.encode(c, in, eo);
            std::vector<ggml_tensor*> r{enc.context};
            if (enc.out.text_embeds) r.push_back(enc.out.text_embeds);
            return r;
        });
        pen[(size_t)e] = out[0].data;
        if (e == 1) {
            ASSERT_EQ(out.size(), 2u);
            pooled = out[1].data;
        }
    }
    double dc = 0, m = 0;
    for (int64_t t = 0; t < 77; ++t)
        for (int64_t d = 0; d < kCtx; ++d) {
            const float want = d < 8 ? pen[0][(size_t)(t * 8 + d)] : pen[1][(size_t)(t * 8 + d - 8)];
            dc = std::max(dc, (double)std::fabs(cond.context[(size_t)(t * kCtx + d)] - want));
            m = std::max(m, (double)std::fabs(want));
        }
    double dp = 0;
    for (size_t i = 0; i < pooled.size(); ++i) dp = std::max(dp, (double)std::fabs(cond.pooled[i] - pooled[i]));
    std::printf("[sdxl family] context max diff %.3g (max |context| %.3g), pooled max diff %.3g\n", dc, m, dp);
    EXPECT_GT(m, 0.1);
    EXPECT_LT(dc, 1e-5);
    EXPECT_LT(dp, 1e-5);

    auto z = fam->empty_negative(cond);
    ASSERT_TRUE(z.has_value());
    EXPECT_EQ(z->context, std::vector<float>(cond.context.size(), 0.0f));
    EXPECT_EQ(z->pooled, std::vector<float>(kPooled, 0.0f));

    // one diffusion call = the UNet with time ids (8h, 8w, 0, 0, 8h, 8w) and the pooled vector
    Lcg r{5};
    std::vector<float> x(4 * 8 * 12), got(4 * 8 * 12);
    for (auto& v : x) v = r.next(1.0f);
    fam->diffusion(x, {}, 8, 12, 500.0, cond, got);
    runtime::GraphRunner runner;
    auto unet = load_unet(io::WeightIndex::open(files().diffusers), runner.buffer_type());
    const std::vector<float> t{500.0f}, ids = models::sd::StableDiffusionXL::default_time_ids(64, 96);
    EXPECT_EQ(ids, (std::vector<float>{64, 96, 0, 0, 64, 96}));
    auto want = runner.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false};
        UNetInputs u;
        u.sample = g.input_f32("sample", {12, 8, 4, 1}, x);
        u.timestep = g.input_f32("timestep", {1}, t);
        u.context = g.input_f32("context", {kCtx, 77, 1}, cond.context);
        u.text_embeds = g.input_f32("text_embeds", {kPooled, 1}, cond.pooled);
        u.time_ids = g.input_f32("time_ids", {6, 1}, ids);
        return std::vector<ggml_tensor*>{unet.net->forward(c, u)};
    });
    double du = 0;
    for (size_t i = 0; i < got.size(); ++i) du = std::max(du, (double)std::fabs(got[i] - want.at(0).data[i]));
    std::printf("[sdxl family] diffusion vs direct UNet max diff %.3g\n", du);
    EXPECT_LT(du, 1e-5);
}
