// Z-Image transformer against diffusers' ZImageTransformer2DModel (fixture
// tests/data/reference/zimage_transformer_tiny: dim 32, 2 heads of 16, 2 layers, 1 + 1 refiner
// layers, axes [4, 6, 6], a batch of 2 items with captions of 7 and 12 tokens).
//
// Batch masking: diffusers pads every item's image tokens (16) and caption (7, 12) to multiples
// of 32 with the pad tokens (attended to), and masks only the padding that makes the items of a
// batch equally long. Here both items have 32 image + 32 caption tokens, so the batched
// reference ran without any mask and each item's output equals a run of that item alone: our
// per-item evaluation must match both samples.
//
// Layouts: the fixture's diffusers names, and the same weights renamed to the original /
// ComfyUI / sd.cpp layout (fused attention.qkv, attention.out, q_norm/k_norm, x_embedder,
// final_layer, prefix model.diffusion_model., 1-D pad tokens, an extra norm_final.weight).
#include "core/error.h"
#include "io/detect.h"
#include "io/weight_index.h"
#include "models/zimage/z_image_dit.h"
#include "runtime/graph_runner.h"

#include <ggml.h>
#include <gguf.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

using namespace easel;
namespace zi = easel::models::zimage;

namespace {

/// Load options with the given threads and --type (the rest as their defaults).
zi::ZImageLoadOptions load_opts(int threads, ggml_type weight_type = GGML_TYPE_COUNT) {
    zi::ZImageLoadOptions o;
    o.threads = threads;
    o.weight_type = weight_type;
    return o;
}


const std::string kCase = std::string(EASEL_TEST_DATA) + "/reference/zimage_transformer_tiny.safetensors";

struct T {
    std::vector<int64_t> shape;
    std::vector<float> v;
};
using Tensors = std::vector<std::pair<std::string, T>>;

void write_safetensors(const std::filesystem::path& path, const Tensors& ts) {
    std::string header = "{";
    std::vector<uint8_t> data;
    for (size_t i = 0; i < ts.size(); ++i) {
        const auto& [name, t] = ts[i];
        size_t begin = data.size();
        data.resize(begin + t.v.size() * 4);
        std::memcpy(data.data() + begin, t.v.data(), t.v.size() * 4);
        std::string shape;
        for (size_t d = 0; d < t.shape.size(); ++d) shape += std::string(d ? "," : "") + std::to_string(t.shape[d]);
        header += fmt::format("{}\"{}\":{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", i ? "," : "", name, shape, begin,
                              data.size());
    }
    header += "}";
    std::ofstream f(path, std::ios::binary);
    uint64_t n = header.size();
    f.write((const char*)&n, 8);
    f.write(header.data(), (std::streamsize)header.size());
    f.write((const char*)data.data(), (std::streamsize)data.size());
}

// The fixture's weights (no __input__/__output__ entries), diffusers names.
Tensors fixture_weights(const io::WeightIndex& ref) {
    Tensors ts;
    for (auto& t : ref.tensors())
        if (t.name.rfind("__", 0) != 0) ts.push_back({t.name, {t.shape, ref.read_f32(t)}});
    return ts;
}

// The same weights in the original layout under `prefix`.
Tensors to_original(const Tensors& dif, const std::string& prefix, bool pad_1d) {
    std::map<std::string, T> m(dif.begin(), dif.end());
    Tensors out;
    auto rep = [](std::string s, const std::string& a, const std::string& b) {
        size_t i = s.find(a);
        if (i != std::string::npos) s = s.substr(0, i) + b + s.substr(i + a.size());
        return s;
    };
    for (auto& [n, t] : dif) {
        if (n.find(".attention.to_k.") != std::string::npos || n.find(".attention.to_v.") != std::string::npos) continue;
        if (n.find(".attention.to_q.") != std::string::npos) {
            const std::string base = n.substr(0, n.find(".attention.to_q."));
            T f;
            const T& q = t;
            const T& k = m.at(base + ".attention.to_k.weight");
            const T& v = m.at(base + ".attention.to_v.weight");
            f.shape = {q.shape[0] + k.shape[0] + v.shape[0], q.shape[1]};
            for (const T* x : {&q, &k, &v}) f.v.insert(f.v.end(), x->v.begin(), x->v.end());
            out.push_back({prefix + base + ".attention.qkv.weight", f});
            continue;
        }
        std::string s = n;
        s = rep(s, "all_x_embedder.2-1.", "x_embedder.");
        s = rep(s, "all_final_layer.2-1.", "final_layer.");
        s = rep(s, ".attention.to_out.0.", ".attention.out.");
        s = rep(s, ".attention.norm_q.", ".attention.q_norm.");
        s = rep(s, ".attention.norm_k.", ".attention.k_norm.");
        T c = t;
        if (pad_1d && (s == "x_pad_token" || s == "cap_pad_token")) c.shape = {t.shape.back()};
        out.push_back({prefix + s, c});
    }
    out.push_back({prefix + "norm_final.weight", {{32}, std::vector<float>(32, 1.0f)}});
    return out;
}

struct Sample {
    std::vector<float> x, cap, expected;
    int64_t H = 0, W = 0, L = 0;
    float t = 0;
};

std::vector<Sample> fixture_samples(const io::WeightIndex& ref) {
    std::vector<Sample> s(2);
    auto tv = ref.read_f32(*ref.find("__input__.t"));
    for (int i = 0; i < 2; ++i) {
        const io::TensorInfo* x = ref.find(std::string("__input__.x.") + std::to_string(i));
        const io::TensorInfo* c = ref.find(std::string("__input__.cap_feats.") + std::to_string(i));
        const io::TensorInfo* o = ref.find(std::string("__output__.sample.") + std::to_string(i));
        EXPECT_TRUE(x && c && o);
        EXPECT_EQ(x->shape, (std::vector<int64_t>{16, 1, 8, 8}));  // [C, F, H, W], F = 1
        s[i].x = ref.read_f32(*x);
        s[i].cap = ref.read_f32(*c);
        s[i].expected = ref.read_f32(*o);
        s[i].H = x->shape[2];
        s[i].W = x->shape[3];
        s[i].L = c->shape[0];
        s[i].t = tv[(size_t)i];
    }
    return s;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    if (a.size() != b.size()) return INFINITY;
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

std::filesystem::path temp_file(const std::string& stem) {
    return std::filesystem::temp_directory_path() / fmt::format("easel_zimage_{}_{}.safetensors", stem, (long)::getpid());
}

// Loads `path` through the public API and checks both samples with plain and flash attention.
void check_parity(const std::filesystem::path& path, const std::string& label) {
    auto ref = io::WeightIndex::open(kCase);
    auto samples = fixture_samples(ref);
    auto idx = io::WeightIndex::open(path);
    for (bool flash : {false, true}) {
        zi::ZImageLoadOptions opt;
        opt.threads = 2;
        opt.flash_attn = flash;
        auto m = zi::LoadedZImageDiT::load(idx, opt);
        for (size_t i = 0; i < samples.size(); ++i) {
            const Sample& s = samples[i];
            std::vector<float> out(s.x.size());
            m->forward(s.x.data(), s.H, s.W, s.t, s.cap.data(), s.L, out.data());
            float e = max_abs_diff(out, s.expected);
            std::cout << "[" << label << "] flash=" << flash << " sample." << i << " (caption " << s.L << ", t " << s.t
                      << ") max abs err " << e << "\n";
            EXPECT_LT(e, 1e-4f) << label << " sample " << i;
        }
    }
}

}  // namespace

TEST(ZImageDiT, InfersTinyConfigFromWeights) {
    auto idx = io::WeightIndex::open(kCase);
    auto keys = zi::find_zimage_dit(idx);
    ASSERT_TRUE(keys.has_value());
    EXPECT_EQ(keys->layout, zi::ZImageKeys::Layout::Diffusers);
    EXPECT_EQ(keys->prefix, "");
    auto c = zi::infer_config(idx, *keys);
    EXPECT_EQ(c.dim, 32);
    EXPECT_EQ(c.n_heads, 2);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.n_layers, 2);
    EXPECT_EQ(c.n_noise_refiner, 1);
    EXPECT_EQ(c.n_context_refiner, 1);
    EXPECT_EQ(c.in_channels, 16);
    EXPECT_EQ(c.patch, 2);
    EXPECT_EQ(c.f_patch, 1);
    EXPECT_EQ(c.cap_feat_dim, 32);
    EXPECT_EQ(c.ffn_hidden, 85);  // int(32 / 3 * 8)
    EXPECT_EQ(c.adaln_dim, 32);   // min(dim, 256)
    EXPECT_EQ(c.t_hidden, 1024);
    EXPECT_EQ(c.t_freq_dim, 256);
    EXPECT_TRUE(c.qk_norm);
    // the fixture's config says axes_dims [4, 6, 6]: the scaled [32, 48, 48] rule gives the same
    EXPECT_EQ(c.axes_dims, (std::array<int64_t, 3>{4, 6, 6}));
    // config.json values win over defaults
    nlohmann::json j = {{"axes_dims", {2, 8, 6}}, {"rope_theta", 100.0}, {"n_heads", 2}};
    auto c2 = zi::infer_config(idx, *keys, zi::overrides_from_config_json(j));
    EXPECT_EQ(c2.axes_dims, (std::array<int64_t, 3>{2, 8, 6}));
    EXPECT_FLOAT_EQ(c2.rope_theta, 100.0f);
    // contradictions are refused
    EXPECT_THROW(zi::infer_config(idx, *keys, zi::overrides_from_config_json(nlohmann::json{{"n_heads", 4}})), Error);
    EXPECT_THROW(zi::infer_config(idx, *keys, zi::overrides_from_config_json(nlohmann::json{{"axes_dims", {4, 6, 8}}})), Error);
}

TEST(ZImageDiT, RopeTablesMatchHandComputedAngles) {
    zi::ZImageDiTConfig c;
    c.head_dim = 16;
    c.axes_dims = {4, 6, 6};
    c.rope_theta = 256.0f;
    c.patch = 2;
    // 8x6 latent -> 4x3 = 12 image tokens (padded to 32), caption 33 tokens (padded to 64)
    auto r = zi::make_rope(c, 8, 6, 33);
    EXPECT_EQ(r.img_tokens, 12);
    EXPECT_EQ(r.img_tokens_padded, 32);
    EXPECT_EQ(r.cap_tokens_padded, 64);
    ASSERT_EQ(r.cos.size(), (size_t)(8 * 96));
    auto at = [&](const std::vector<float>& v, int64_t row, int col) { return v[(size_t)(row * 8 + col)]; };
    // image token (h = 2, w = 1) is row 2 * 3 + 1 = 7, position (Lp + 1, 2, 1) = (65, 2, 1)
    // channels: axis 0 freqs 256^0, 256^-1/2; axis 1 256^0, 256^-1/3, 256^-2/3; axis 2 the same
    EXPECT_NEAR(at(r.cos, 7, 0), std::cos(65.0), 1e-6);
    EXPECT_NEAR(at(r.sin, 7, 1), std::sin(65.0 / 16.0), 1e-6);
    EXPECT_NEAR(at(r.cos, 7, 2), std::cos(2.0), 1e-6);
    EXPECT_NEAR(at(r.sin, 7, 3), std::sin(2.0 / std::cbrt(256.0)), 1e-6);
    EXPECT_NEAR(at(r.cos, 7, 7), std::cos(1.0 / std::cbrt(65536.0)), 1e-6);
    // image pad token (row 20): position (0, 0, 0)
    for (int k = 0; k < 8; ++k) EXPECT_EQ(at(r.cos, 20, k), 1.0f);
    // caption token 40 (a pad token, row 32 + 40): position (41, 0, 0)
    EXPECT_NEAR(at(r.sin, 72, 0), std::sin(41.0), 1e-6);
    EXPECT_NEAR(at(r.cos, 72, 1), std::cos(41.0 / 16.0), 1e-6);
    EXPECT_EQ(at(r.sin, 72, 2), 0.0f);
    EXPECT_THROW(zi::make_rope(c, 7, 6, 3), Error);   // not a multiple of the patch
    EXPECT_THROW(zi::make_rope(c, 8, 6, 0), Error);   // empty caption
}

TEST(ZImageDiT, DiffusersLayoutParity) {
    auto ref = io::WeightIndex::open(kCase);
    auto path = temp_file("diffusers");
    write_safetensors(path, fixture_weights(ref));
    check_parity(path, "diffusers layout");
    std::filesystem::remove(path);
}

TEST(ZImageDiT, OriginalLayoutParity) {
    auto ref = io::WeightIndex::open(kCase);
    for (bool pad_1d : {false, true}) {
        auto path = temp_file(pad_1d ? "original_1d" : "original");
        write_safetensors(path, to_original(fixture_weights(ref), "model.diffusion_model.", pad_1d));
        auto idx = io::WeightIndex::open(path);
        auto keys = zi::find_zimage_dit(idx);
        ASSERT_TRUE(keys.has_value());
        EXPECT_EQ(keys->layout, zi::ZImageKeys::Layout::Original);
        EXPECT_EQ(keys->prefix, "model.diffusion_model.");
        auto c = zi::infer_config(idx, *keys);
        EXPECT_EQ(c.n_heads, 2);
        EXPECT_EQ(c.pad_token_rank, pad_1d ? 1 : 2);
        auto det = io::detect(idx);
        EXPECT_EQ(det.family, "Z-Image");
        check_parity(path, pad_1d ? "original layout, 1-D pad tokens" : "original layout");
        std::filesystem::remove(path);
    }
}

TEST(ZImageDiT, SegmentedRunMatchesWhole) {
    // prologue + layer 0 in one graph; the state read back and fed to layer 1 + epilogue in a second
    auto ref = io::WeightIndex::open(kCase);
    auto s = fixture_samples(ref)[1];
    auto keys = zi::find_zimage_dit(ref);
    auto cfg = zi::infer_config(ref, *keys);
    zi::ZImageDiT net(cfg);
    nn::LoadOptions lo = zi::default_load_options(ref, *keys);
    lo.ignore_unexpected_suffixes.push_back("__input__.x.0");
    for (const char* n : {"__input__.x.1", "__input__.t", "__input__.cap_feats.0", "__input__.cap_feats.1", "__output__.sample.0",
                          "__output__.sample.1"})
        lo.ignore_unexpected_suffixes.push_back(n);
    runtime::GraphRunner run(nullptr, 2);
    auto pb = nn::ParamBuffer::load(net, zi::make_tensor_source(ref, *keys, cfg), run.buffer_type(), lo);
    auto rope = zi::make_rope(cfg, s.H, s.W, s.L);
    const int64_t half = cfg.head_dim / 2;
    auto inputs = [&](runtime::GraphBuilder& g) {
        zi::ZImageInputs in;
        in.x = g.input_f32("x", {s.W, s.H, 16, 1}, s.x);
        in.t = g.input_f32("t", {1}, std::span<const float>(&s.t, 1));
        in.cap = g.input_f32("cap", {32, s.L, 1}, s.cap);
        in.rope_cos = g.input_f32("cos", {half, rope.tokens()}, rope.cos);
        in.rope_sin = g.input_f32("sin", {half, rope.tokens()}, rope.sin);
        return in;
    };
    std::vector<std::string> names;
    zi::ZImageState meta;
    auto part1 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        zi::ZImageState st = net.forward_range(c, net.prologue(c, inputs(g)), 0, 1);
        meta = st;
        std::vector<ggml_tensor*> outs;
        st.visit_tensors([&](const char* n, ggml_tensor*& t) {
            names.push_back(n);
            outs.push_back(t);
        });
        return outs;
    });
    ASSERT_EQ(names, (std::vector<std::string>{"h", "adaln", "rope_cos", "rope_sin"}));
    auto part2 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        zi::ZImageState st = meta;
        size_t k = 0;
        st.visit_tensors([&](const char* n, ggml_tensor*& t) {
            const auto& h = part1[k++];
            t = g.input_f32(n, {h.ne[0], h.ne[1], h.ne[2], h.ne[3]}, h.data);
        });
        return std::vector<ggml_tensor*>{net.epilogue(c, net.forward_range(c, st, 1, 2))};
    });
    float e = max_abs_diff(part2[0].data, s.expected);
    std::cout << "[segmented] max abs err " << e << "\n";
    EXPECT_LT(e, 1e-4f);
}

TEST(ZImageDiT, BadInputIsRefusedBeforeTheGraph) {
    auto ref = io::WeightIndex::open(kCase);
    auto path = temp_file("bad");
    write_safetensors(path, fixture_weights(ref));
    auto idx = io::WeightIndex::open(path);
    auto m = zi::LoadedZImageDiT::load(idx, load_opts(2));
    std::vector<float> x(16 * 8 * 8), cap(7 * 32), out(x.size());
    EXPECT_THROW(m->forward(x.data(), 7, 8, 0.5f, cap.data(), 7, out.data()), Error);  // H not a multiple of 2
    EXPECT_THROW(m->forward(x.data(), 8, 8, 0.5f, cap.data(), 0, out.data()), Error);  // no caption
    EXPECT_THROW(m->forward(x.data(), 8, 8, NAN, cap.data(), 7, out.data()), Error);
    // a file without a Z-Image transformer
    auto path2 = temp_file("notzimage");
    write_safetensors(path2, {{"foo.weight", {{2, 2}, {1, 2, 3, 4}}}});
    auto idx2 = io::WeightIndex::open(path2);
    try {
        zi::LoadedZImageDiT::load(idx2);
        FAIL() << "expected ModelMismatch";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::ModelMismatch);
    }
    // a missing layer tensor is named
    Tensors ts = fixture_weights(ref);
    std::erase_if(ts, [](auto& p) { return p.first == "layers.1.ffn_norm2.weight"; });
    auto path3 = temp_file("missing");
    write_safetensors(path3, ts);
    auto idx3 = io::WeightIndex::open(path3);
    try {
        zi::LoadedZImageDiT::load(idx3);
        FAIL() << "expected ModelMismatch";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::ModelMismatch);
        EXPECT_NE(std::string(e.what()).find("layers.1.ffn_norm2.weight"), std::string::npos) << e.what();
    }
    for (auto& p : {path, path2, path3}) std::filesystem::remove(p);
}

// The first transformer call of the tiny ZImagePipeline cases in tests/data/reference/zimage_tiny
// (dit0_x, dit0_t = 1 - sigma, dit0_out before the pipeline negates it), from the diffusers folder
// (config.json beside the weights) and from the original-layout single file. The weights are
// stored as F16 values: loaded as F32 (the values are exact), the output matches within 1e-4;
// kept F16 (ggml then rounds the activations of each matmul to F16), within 1e-2.
TEST(ZImageDiT, TinyPipelineFirstCall) {
    const std::string dir = std::string(EASEL_TEST_DATA) + "/reference/zimage_tiny/";
    for (std::string src : {"diffusers/transformer", "zimage_tiny_transformer.safetensors"}) {
        auto idx = io::WeightIndex::open(dir + src);
        for (ggml_type wt : {GGML_TYPE_F32, GGML_TYPE_COUNT}) {
            zi::ZImageLoadOptions opt;
            opt.threads = 2;
            opt.weight_type = wt;
            auto m = zi::LoadedZImageDiT::load(idx, opt);
            EXPECT_EQ(m->config().axes_dims, (std::array<int64_t, 3>{4, 6, 6}));
            for (std::string c : {"cat_s0_64", "circle_s1_96x64"}) {
                auto ref = io::WeightIndex::open(dir + "case_" + c + ".safetensors");
                const io::TensorInfo* x = ref.find("dit0_x");
                const io::TensorInfo* cond = ref.find("cond");
                ASSERT_TRUE(x && cond && ref.find("dit0_t") && ref.find("dit0_out"));
                const int64_t H = x->shape[3], W = x->shape[4], L = cond->shape[0];
                EXPECT_EQ(m->config().cap_feat_dim, cond->shape[1]);  // the tiny Qwen3's hidden size
                auto xv = ref.read_f32(*x);
                auto cv = ref.read_f32(*cond);
                const float t = ref.read_f32(*ref.find("dit0_t"))[0];
                auto expected = ref.read_f32(*ref.find("dit0_out"));
                std::vector<float> out(xv.size());
                m->forward(xv.data(), H, W, t, cv.data(), L, out.data());
                const float e = max_abs_diff(out, expected);
                std::cout << "[zimage_tiny " << src << ", " << (wt == GGML_TYPE_F32 ? "f32" : "f16 as stored") << "] " << c << " (" << H
                          << "x" << W << " latent, " << L << " tokens, t " << t << ") max abs err " << e << "\n";
                EXPECT_LT(e, wt == GGML_TYPE_F32 ? 1e-4f : 1e-2f) << src << " " << c;
            }
        }
    }
}

namespace {

// Writes tensors as a GGUF in the original layout (as sd.cpp / city96 conversions): 2-D weights
// whose rows hold a multiple of 32 values in Q8_0, everything else F32; pad tokens 1-D.
std::filesystem::path write_q8_gguf(const Tensors& ts) {
    size_t bytes = 0;
    for (auto& [n, t] : ts) bytes += t.v.size() * 4 + 1024;
    ggml_init_params ip{bytes + ts.size() * ggml_tensor_overhead(), nullptr, false};
    ggml_context* ctx = ggml_init(ip);
    gguf_context* g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", "zimage");
    for (auto& [name, t] : ts) {
        const bool two = t.shape.size() == 2 && t.shape[0] > 1;
        const bool q = two && t.shape[1] % 32 == 0;
        ggml_tensor* x = two ? ggml_new_tensor_2d(ctx, q ? GGML_TYPE_Q8_0 : GGML_TYPE_F32, t.shape[1], t.shape[0])
                             : ggml_new_tensor_1d(ctx, GGML_TYPE_F32, (int64_t)t.v.size());
        ggml_set_name(x, name.c_str());
        if (q) ggml_quantize_chunk(GGML_TYPE_Q8_0, t.v.data(), x->data, 0, t.shape[0], t.shape[1], nullptr);
        else std::memcpy(x->data, t.v.data(), t.v.size() * 4);
        gguf_add_tensor(g, x);
    }
    auto path = std::filesystem::temp_directory_path() / fmt::format("easel_zimage_q8_{}.gguf", (long)::getpid());
    EXPECT_TRUE(gguf_write_to_file(g, path.string().c_str(), false));
    gguf_free(g);
    ggml_free(ctx);
    return path;
}

}  // namespace

// A Q8_0 GGUF in the original layout (fused qkv rows sliced out of quantised data, 1-D pad
// tokens): the same output as the diffusers-layout F32 file converted to Q8_0 on load
// (--type q8_0), and near the F32 reference.
TEST(ZImageDiT, OriginalLayoutQ8GgufMatchesQ8Conversion) {
    auto ref = io::WeightIndex::open(kCase);
    auto samples = fixture_samples(ref);
    auto w = fixture_weights(ref);
    Tensors orig = to_original(w, "", true);
    std::erase_if(orig, [](auto& p) { return p.first == "norm_final.weight"; });
    auto gpath = write_q8_gguf(orig);
    auto fpath = temp_file("q8_source");
    write_safetensors(fpath, w);
    auto gidx = io::WeightIndex::open(gpath);
    auto fidx = io::WeightIndex::open(fpath);
    auto keys = zi::find_zimage_dit(gidx);
    ASSERT_TRUE(keys.has_value());
    EXPECT_EQ(keys->layout, zi::ZImageKeys::Layout::Original);
    auto mg = zi::LoadedZImageDiT::load(gidx, load_opts(2));
    auto mf = zi::LoadedZImageDiT::load(fidx, load_opts(2, GGML_TYPE_Q8_0));
    for (size_t i = 0; i < samples.size(); ++i) {
        const Sample& s = samples[i];
        std::vector<float> og(s.x.size()), of(s.x.size());
        mg->forward(s.x.data(), s.H, s.W, s.t, s.cap.data(), s.L, og.data());
        mf->forward(s.x.data(), s.H, s.W, s.t, s.cap.data(), s.L, of.data());
        const float e_pair = max_abs_diff(og, of), e_ref = max_abs_diff(og, s.expected);
        std::cout << "[q8_0 gguf, original layout] sample." << i << " vs --type q8_0 " << e_pair << ", vs f32 reference " << e_ref << "\n";
        EXPECT_LT(e_pair, 1e-6f);  // the same quantised bits either way
        EXPECT_LT(e_ref, 5e-2f);
    }
    std::filesystem::remove(gpath);
    std::filesystem::remove(fpath);
}
