// T5 encoder against transformers' T5EncoderModel (tests/data/reference/t5_encoder_tiny: T5 v1.1
// gated-gelu, d_model 32, 4 heads x 8, d_ff 64, 2 blocks, 32 buckets, ids 1x24, no mask) and, for
// what the fixture does not cover (batch of two, attention mask, llama.cpp/GGUF names, Q8_0),
// against a double-precision host implementation of the same equations that is itself first
// checked against the fixture.
#include "core/error.h"
#include "io/weight_index.h"
#include "models/t5/t5_encoder.h"
#include "runtime/graph_runner.h"

#include <ggml-cpu.h>
#include <gguf.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <unistd.h>
#include <filesystem>
#include <iostream>
#include <map>

using namespace easel;
namespace t5 = easel::models::t5;

namespace {

std::string ref_path(const std::string& name) { return std::string(EASEL_TEST_DATA) + "/reference/" + name; }

struct Fixture {
    io::WeightIndex idx;
    std::vector<int32_t> ids;
    int64_t L = 0;
    std::vector<float> out;
};

Fixture load_fixture() {
    Fixture f;
    f.idx = io::WeightIndex::open(ref_path("t5_encoder_tiny.safetensors"));
    const io::TensorInfo* t = f.idx.find("__input__.input_ids");
    EXPECT_NE(t, nullptr);
    for (auto x : f.idx.read_i64(*t)) f.ids.push_back((int32_t)x);
    f.L = t->shape[1];
    f.out = f.idx.read_f32(*f.idx.find("__output__.last_hidden_state"));
    return f;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    if (a.size() != b.size()) return INFINITY;
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

ggml_backend_buffer_type_t cpu_buft() { return ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)); }

struct Loaded {
    std::unique_ptr<t5::T5Encoder> model;
    nn::ParamBuffer params;
};

Loaded load_model(const io::WeightIndex& idx, ggml_type weight_type = GGML_TYPE_COUNT) {
    auto keys = t5::find_t5_encoder(idx);
    EXPECT_TRUE(keys.has_value());
    auto cfg = t5::infer_config(idx, *keys);
    Loaded l;
    l.model = std::make_unique<t5::T5Encoder>(cfg);
    auto opt = t5::default_load_options(idx, *keys);
    opt.weight_type = weight_type;
    for (auto& t : idx.tensors())
        if (t.name.rfind("__", 0) == 0) opt.ignore_unexpected_suffixes.push_back(t.name);
    l.params = nn::ParamBuffer::load(*l.model, t5::make_tensor_source(idx, *keys), cpu_buft(), opt);
    return l;
}

// Runs the encoder on N rows of L ids (row-major), optional mask (N*L of 0/1). Returns {d_model, L, N} values.
std::vector<float> run_t5(const t5::T5Encoder& m, const std::vector<int32_t>& ids, int64_t L, int64_t N,
                          const std::vector<float>* mask = nullptr) {
    runtime::GraphRunner run(nullptr, 2);
    t5::check_token_ids(ids, m.config().vocab);
    const auto buckets = t5::relative_position_buckets(L, m.config().num_buckets, m.config().max_distance);
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        t5::T5Inputs in;
        in.ids = g.input_i32("ids", {L, N}, ids);
        in.buckets = g.input_i32("buckets", {L * L}, buckets);
        if (mask) in.mask = g.input_f32("mask", {L, N}, *mask);
        return std::vector<ggml_tensor*>{m.forward(c, in).last_hidden_state};
    });
    return out[0].data;
}

// ---------------------------------------------------------------- host reference (double)

struct HostT5 {
    std::map<std::string, std::vector<float>> w;  // canonical transformers names
    int64_t vocab = 0, D = 0, H = 0, dkv = 0, ff = 0, layers = 0, buckets = 32, maxd = 128;
};

HostT5 host_from(const io::WeightIndex& idx) {
    HostT5 h;
    for (auto& t : idx.tensors())
        if (t.name.rfind("__", 0) != 0) h.w[t.name] = idx.read_f32(t);
    const auto* e = idx.find("shared.weight");
    h.vocab = e->shape[0];
    h.D = e->shape[1];
    const auto* rel = idx.find("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
    h.buckets = rel->shape[0];
    h.H = rel->shape[1];
    h.dkv = idx.find("encoder.block.0.layer.0.SelfAttention.q.weight")->shape[0] / h.H;
    h.ff = idx.find("encoder.block.0.layer.1.DenseReluDense.wi_0.weight")->shape[0];
    while (idx.find("encoder.block." + std::to_string(h.layers) + ".layer.0.layer_norm.weight")) ++h.layers;
    return h;
}

// transformers' T5 encoder in double: one sequence of L ids, key mask of 0/1 (or all ones).
std::vector<double> host_forward(const HostT5& m, const std::vector<int32_t>& ids, const std::vector<float>& mask) {
    const int64_t L = (int64_t)ids.size(), D = m.D, H = m.H, dk = m.dkv, inner = H * dk;
    auto W = [&](const std::string& n) -> const std::vector<float>& { return m.w.at(n); };
    auto linear = [&](const std::vector<double>& x, const std::vector<float>& w, int64_t in, int64_t out) {
        std::vector<double> y((size_t)(L * out), 0.0);
        for (int64_t t = 0; t < L; ++t)
            for (int64_t o = 0; o < out; ++o) {
                double s = 0;
                for (int64_t i = 0; i < in; ++i) s += x[(size_t)(t * in + i)] * w[(size_t)(o * in + i)];
                y[(size_t)(t * out + o)] = s;
            }
        return y;
    };
    auto rms = [&](const std::vector<double>& x, const std::vector<float>& w) {
        std::vector<double> y(x.size());
        for (int64_t t = 0; t < L; ++t) {
            double ss = 0;
            for (int64_t i = 0; i < D; ++i) ss += x[(size_t)(t * D + i)] * x[(size_t)(t * D + i)];
            const double r = 1.0 / std::sqrt(ss / (double)D + 1e-6);
            for (int64_t i = 0; i < D; ++i) y[(size_t)(t * D + i)] = x[(size_t)(t * D + i)] * r * w[(size_t)i];
        }
        return y;
    };
    std::vector<double> h((size_t)(L * D));
    for (int64_t t = 0; t < L; ++t)
        for (int64_t i = 0; i < D; ++i) h[(size_t)(t * D + i)] = W("shared.weight")[(size_t)(ids[(size_t)t] * D + i)];
    const auto bk = t5::relative_position_buckets(L, m.buckets, m.maxd);
    const auto& rel = W("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
    for (int64_t l = 0; l < m.layers; ++l) {
        const std::string p = "encoder.block." + std::to_string(l) + ".";
        auto n = rms(h, W(p + "layer.0.layer_norm.weight"));
        auto q = linear(n, W(p + "layer.0.SelfAttention.q.weight"), D, inner);
        auto k = linear(n, W(p + "layer.0.SelfAttention.k.weight"), D, inner);
        auto v = linear(n, W(p + "layer.0.SelfAttention.v.weight"), D, inner);
        std::vector<double> a((size_t)(L * inner), 0.0);
        for (int64_t hh = 0; hh < H; ++hh)
            for (int64_t i = 0; i < L; ++i) {
                std::vector<double> s((size_t)L);
                double mx = -INFINITY;
                for (int64_t j = 0; j < L; ++j) {
                    double d = 0;
                    for (int64_t x = 0; x < dk; ++x) d += q[(size_t)(i * inner + hh * dk + x)] * k[(size_t)(j * inner + hh * dk + x)];
                    d += rel[(size_t)(bk[(size_t)(i * L + j)] * H + hh)];
                    if (mask[(size_t)j] == 0.0f) d += -3.4028234663852886e38;
                    s[(size_t)j] = d;
                    mx = std::max(mx, d);
                }
                double z = 0;
                for (auto& e : s) z += (e = std::exp(e - mx));
                for (int64_t j = 0; j < L; ++j)
                    for (int64_t x = 0; x < dk; ++x) a[(size_t)(i * inner + hh * dk + x)] += s[(size_t)j] / z * v[(size_t)(j * inner + hh * dk + x)];
            }
        auto o = linear(a, W(p + "layer.0.SelfAttention.o.weight"), inner, D);
        for (size_t i = 0; i < h.size(); ++i) h[i] += o[i];
        n = rms(h, W(p + "layer.1.layer_norm.weight"));
        auto g = linear(n, W(p + "layer.1.DenseReluDense.wi_0.weight"), D, m.ff);
        auto u = linear(n, W(p + "layer.1.DenseReluDense.wi_1.weight"), D, m.ff);
        for (size_t i = 0; i < g.size(); ++i) {
            const double x = g[i];
            g[i] = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x))) * u[i];
        }
        auto f = linear(g, W(p + "layer.1.DenseReluDense.wo.weight"), m.ff, D);
        for (size_t i = 0; i < h.size(); ++i) h[i] += f[i];
    }
    return rms(h, W("encoder.final_layer_norm.weight"));
}

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// transformers name -> llama.cpp name (the inverse of the easel mapping, written out independently).
std::string llama_name(const std::string& n) {
    if (n == "shared.weight") return "token_embd.weight";
    if (n == "encoder.final_layer_norm.weight") return "enc.output_norm.weight";
    static const std::pair<const char*, const char*> sub[] = {
        {"layer.0.SelfAttention.q.", "attn_q."},     {"layer.0.SelfAttention.k.", "attn_k."},
        {"layer.0.SelfAttention.v.", "attn_v."},     {"layer.0.SelfAttention.o.", "attn_o."},
        {"layer.0.SelfAttention.relative_attention_bias.", "attn_rel_b."},
        {"layer.0.layer_norm.", "attn_norm."},       {"layer.1.DenseReluDense.wi_0.", "ffn_gate."},
        {"layer.1.DenseReluDense.wi_1.", "ffn_up."}, {"layer.1.DenseReluDense.wo.", "ffn_down."},
        {"layer.1.layer_norm.", "ffn_norm."}};
    std::string r = n;
    r.replace(0, std::string("encoder.block.").size(), "enc.blk.");
    for (auto& [a, b] : sub) {
        auto pos = r.find(a);
        if (pos != std::string::npos) return r.replace(pos, std::string(a).size(), b);
    }
    return {};
}

}  // namespace

TEST(T5Encoder, ConfigFromWeights) {
    auto f = load_fixture();
    auto keys = t5::find_t5_encoder(f.idx);
    ASSERT_TRUE(keys.has_value());
    EXPECT_EQ(keys->layout, t5::T5Keys::Layout::Transformers);
    EXPECT_EQ(keys->prefix, "");
    EXPECT_EQ(keys->embedding, "shared.weight");
    auto c = t5::infer_config(f.idx, *keys);
    EXPECT_EQ(c.vocab, 1000);
    EXPECT_EQ(c.d_model, 32);
    EXPECT_EQ(c.heads, 4);
    EXPECT_EQ(c.d_kv, 8);
    EXPECT_EQ(c.d_ff, 64);
    EXPECT_EQ(c.layers, 2);
    EXPECT_EQ(c.num_buckets, 32);
    EXPECT_EQ(c.ff, t5::FeedForward::GatedGelu);
    EXPECT_FALSE(c.bias_every_layer);
}

TEST(T5Encoder, RelativePositionBuckets) {
    // Hand-computed with T5's bidirectional bucketing, 32 buckets (16 per direction, 8 exact),
    // max distance 128: |rel| < 8 -> |rel|; else 8 + floor(log(|rel|/8) / log(16) * 8), at most 15;
    // keys after the query (rel > 0) add 16.
    const int64_t L = 300;
    const auto b = t5::relative_position_buckets(L, 32, 128);
    auto at = [&](int64_t i, int64_t j) { return b[(size_t)(i * L + j)]; };
    EXPECT_EQ(at(5, 5), 0);
    EXPECT_EQ(at(5, 4), 1);     // rel -1
    EXPECT_EQ(at(5, 6), 17);    // rel +1
    EXPECT_EQ(at(10, 3), 7);    // rel -7
    EXPECT_EQ(at(10, 2), 8);    // rel -8: log(1) = 0
    EXPECT_EQ(at(30, 10), 10);  // rel -20: 8 * log(2.5)/log(16) = 2.64
    EXPECT_EQ(at(0, 20), 26);   // rel +20
    EXPECT_EQ(at(127, 0), 15);  // rel -127: 7.98 -> 15
    EXPECT_EQ(at(0, 200), 31);  // rel +200: clamped
    EXPECT_EQ(at(299, 0), 15);
    EXPECT_THROW(t5::relative_position_buckets(0, 32, 128), Error);
}

TEST(T5Encoder, TinyParity) {
    auto f = load_fixture();
    auto l = load_model(f.idx);
    const auto out = run_t5(*l.model, f.ids, f.L, 1);
    const float e = max_abs_diff(out, f.out);
    std::cout << "[t5_encoder_tiny] last_hidden_state max abs err " << e << "\n";
    EXPECT_LT(e, 1e-4f);
    // an all-ones mask changes nothing
    std::vector<float> ones((size_t)f.L, 1.0f);
    EXPECT_LT(max_abs_diff(run_t5(*l.model, f.ids, f.L, 1, &ones), f.out), 1e-4f);
}

TEST(T5Encoder, HostReferenceMatchesFixture) {
    // the double-precision host implementation used by the tests below is right on the fixture
    auto f = load_fixture();
    auto h = host_from(f.idx);
    const float e = max_abs_diff(to_float(host_forward(h, f.ids, std::vector<float>((size_t)f.L, 1.0f))), f.out);
    std::cout << "[t5 host reference] vs fixture max abs err " << e << "\n";
    EXPECT_LT(e, 1e-5f);
}

TEST(T5Encoder, BatchAndAttentionMask) {
    // two sequences of 10: row 0 unmasked, row 1 with its last 4 keys masked (padding), as
    // SD3/Chroma-style pipelines pass; each row must equal the host reference of that row.
    auto f = load_fixture();
    auto l = load_model(f.idx);
    auto h = host_from(f.idx);
    const int64_t L = 10;
    std::vector<int32_t> ids(f.ids.begin(), f.ids.begin() + L);
    std::vector<int32_t> row1 = {37, 512, 9, 999, 1, 0, 0, 0, 0, 0};
    ids.insert(ids.end(), row1.begin(), row1.end());
    std::vector<float> mask(20, 1.0f);
    for (int j = 6; j < 10; ++j) mask[(size_t)(10 + j)] = 0.0f;
    const auto out = run_t5(*l.model, ids, L, 2, &mask);
    const auto r0 = to_float(host_forward(h, std::vector<int32_t>(ids.begin(), ids.begin() + L), std::vector<float>(mask.begin(), mask.begin() + L)));
    const auto r1 = to_float(host_forward(h, row1, std::vector<float>(mask.begin() + L, mask.end())));
    const size_t half = out.size() / 2;
    const float e0 = max_abs_diff(std::vector<float>(out.begin(), out.begin() + (ptrdiff_t)half), r0);
    const float e1 = max_abs_diff(std::vector<float>(out.begin() + (ptrdiff_t)half, out.end()), r1);
    std::cout << "[t5 batch+mask] row0 " << e0 << " row1 (masked) " << e1 << "\n";
    EXPECT_LT(e0, 1e-4f);
    EXPECT_LT(e1, 1e-4f);
    // the mask matters: without it row 1 differs
    const auto nomask = run_t5(*l.model, ids, L, 2);
    EXPECT_GT(max_abs_diff(std::vector<float>(nomask.begin() + (ptrdiff_t)half, nomask.end()), r1), 1e-3f);
}

TEST(T5Encoder, SegmentedRunMatchesWhole) {
    // prologue + block 0 in one graph; block 1 + epilogue in a second one whose state (h and the
    // position bias computed by block 0) are inputs: the placement runtime's pattern.
    auto f = load_fixture();
    auto l = load_model(f.idx);
    const auto& cfg = l.model->config();
    const auto buckets = t5::relative_position_buckets(f.L, cfg.num_buckets, cfg.max_distance);
    runtime::GraphRunner run(nullptr, 2);
    std::vector<std::string> names;
    auto part1 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        t5::T5Inputs in{g.input_i32("ids", {f.L, 1}, f.ids), g.input_i32("buckets", {f.L * f.L}, buckets), nullptr};
        auto s = l.model->forward_range(c, l.model->prologue(c, in), 0, 1);
        std::vector<ggml_tensor*> t;
        s.visit_tensors([&](const char* n, ggml_tensor*& x) {
            names.push_back(n);
            t.push_back(x);
        });
        return t;
    });
    ASSERT_EQ(names, (std::vector<std::string>{"h", "buckets", "bias"}));
    auto part2 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        t5::T5State s;
        s.h = g.input_f32("h", std::vector<int64_t>(part1[0].ne.begin(), part1[0].ne.end()), part1[0].data);
        s.buckets = g.input_i32("buckets", {f.L * f.L}, buckets);
        s.bias = g.input_f32("bias", std::vector<int64_t>(part1[2].ne.begin(), part1[2].ne.end()), part1[2].data);
        return std::vector<ggml_tensor*>{l.model->epilogue(c, l.model->forward_range(c, s, 1, 2)).last_hidden_state};
    });
    EXPECT_LT(max_abs_diff(part2[0].data, f.out), 1e-4f);
    // block 1 has no bias table: starting there without the state's bias is an error, not an abort
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        t5::T5Inputs in{g.input_i32("ids", {f.L, 1}, f.ids), g.input_i32("buckets", {f.L * f.L}, buckets), nullptr};
        return std::vector<ggml_tensor*>{l.model->forward_range(c, l.model->prologue(c, in), 1, 2).h};
    }),
                 Error);
}

TEST(T5Encoder, LlamaCppGgufLayoutAndQ8) {
    // The fixture rewritten as a city96-style GGUF (llama.cpp names, token_embd, enc.blk.N.*),
    // matrices stored as Q8_0 and the rest F32: names map back, the quantised weights load, and
    // the result stays close to the F32 reference.
    auto f = load_fixture();
    const std::filesystem::path path = std::filesystem::temp_directory_path() / ("easel_t5_llama_" + std::to_string(getpid()) + ".gguf");
    {
        gguf_context* g = gguf_init_empty();
        ggml_init_params ip{64 << 20, nullptr, false};
        ggml_context* ctx = ggml_init(ip);
        for (auto& t : f.idx.tensors()) {
            if (t.name.rfind("__", 0) == 0 || t.name == "encoder.embed_tokens.weight") continue;
            const std::string n = llama_name(t.name);
            ASSERT_FALSE(n.empty()) << t.name;
            auto v = f.idx.read_f32(t);
            const bool mat = t.shape.size() == 2 && t.shape[1] % 32 == 0 && t.name.find("relative_attention_bias") == std::string::npos;
            ggml_tensor* x = t.shape.size() == 2 ? ggml_new_tensor_2d(ctx, mat ? GGML_TYPE_Q8_0 : GGML_TYPE_F32, t.shape[1], t.shape[0])
                                                 : ggml_new_tensor_1d(ctx, GGML_TYPE_F32, t.shape[0]);
            ggml_set_name(x, n.c_str());
            if (mat) ggml_quantize_chunk(GGML_TYPE_Q8_0, v.data(), x->data, 0, t.shape[0], t.shape[1], nullptr);
            else std::memcpy(x->data, v.data(), v.size() * 4);
            gguf_add_tensor(g, x);
        }
        gguf_set_val_str(g, "general.architecture", "t5encoder");
        ASSERT_TRUE(gguf_write_to_file(g, path.c_str(), false));
        gguf_free(g);
        ggml_free(ctx);
    }
    auto idx = io::WeightIndex::open(path);
    auto keys = t5::find_t5_encoder(idx);
    ASSERT_TRUE(keys.has_value());
    EXPECT_EQ(keys->layout, t5::T5Keys::Layout::LlamaCpp);
    EXPECT_EQ(keys->embedding, "token_embd.weight");
    auto cfg = t5::infer_config(idx, *keys);
    EXPECT_EQ(cfg.heads, 4);
    EXPECT_EQ(cfg.layers, 2);
    auto l = load_model(idx);
    const auto out = run_t5(*l.model, f.ids, f.L, 1);
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        num += (out[i] - f.out[i]) * (out[i] - f.out[i]);
        den += f.out[i] * f.out[i];
    }
    const double rel_rms = std::sqrt(num / den);
    std::cout << "[t5 gguf q8_0] relative RMS error " << rel_rms << " max abs " << max_abs_diff(out, f.out) << "\n";
    EXPECT_LT(rel_rms, 0.05);  // 2.0% measured: 32-wide rows are one Q8_0 block each, the embedding is quantised too
    EXPECT_GT(rel_rms, 0.0);  // the weights really were quantised
    std::filesystem::remove(path);
}

TEST(T5Encoder, F16WeightsStayClose) {
    // --type f16: matrices in F16, activations F32 (what the T5-XXL bench runs)
    auto f = load_fixture();
    auto l = load_model(f.idx, GGML_TYPE_F16);
    const float e = max_abs_diff(run_t5(*l.model, f.ids, f.L, 1), f.out);
    std::cout << "[t5_encoder_tiny f16 weights] max abs err " << e << "\n";
    EXPECT_LT(e, 5e-3f);
}

TEST(T5Encoder, BadInput) {
    auto f = load_fixture();
    auto l = load_model(f.idx);
    // token id outside the vocabulary
    EXPECT_THROW(t5::check_token_ids({1, 5, 1000}, l.model->config().vocab), Error);
    runtime::GraphRunner run(nullptr, 1);
    // buckets of the wrong length
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        std::vector<int32_t> b(10, 0);
        t5::T5Inputs in{g.input_i32("ids", {f.L, 1}, f.ids), g.input_i32("buckets", {10}, b), nullptr};
        return std::vector<ggml_tensor*>{l.model->forward(c, in).last_hidden_state};
    }),
                 Error);
    // a mask of the wrong shape
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        auto b = t5::relative_position_buckets(f.L, 32, 128);
        std::vector<float> m(5, 1.0f);
        t5::T5Inputs in{g.input_i32("ids", {f.L, 1}, f.ids), g.input_i32("buckets", {f.L * f.L}, b), g.input_f32("mask", {5}, m)};
        return std::vector<ggml_tensor*>{l.model->forward(c, in).last_hidden_state};
    }),
                 Error);
    // a file without a T5 encoder
    auto clip = io::WeightIndex::open(ref_path("clip_text_sd15_tiny.safetensors"));
    EXPECT_FALSE(t5::find_t5_encoder(clip).has_value());
}
