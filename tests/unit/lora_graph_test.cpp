// LoRA at run time (lora/graph.h) against the merged weights of lora/math.h: the low-rank,
// dense and Kronecker terms of a linear layer, several updates with DoRA on either axis, conv
// LoRAs (3x3 down, LoCon Tucker mid, stride 2), the in-graph LoHa / Kronecker deltas, and the
// placement of a fused layer's rows (prepare_term).
#include "lora/graph.h"

#include "lora/key_map.h"
#include "lora_test_support.h"
#include "runtime/graph_runner.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace easel;
using namespace easel::lora;

namespace {

Tensor ramp_t(std::vector<int64_t> shape, float a, float b) {
    Tensor t{shape, {}};
    int64_t n = 1;
    for (auto d : shape) n *= d;
    for (int64_t i = 0; i < n; ++i) t.data.push_back(std::sin(a * (float)i + b));
    return t;
}

// ggml order of a PyTorch shape
std::vector<int64_t> ne(const std::vector<int64_t>& s) { return std::vector<int64_t>(s.rbegin(), s.rend()); }

// x W^T + b on the host: x [L, in], W [out, in]
std::vector<float> host_linear(const Tensor& x, const std::vector<float>& w, const std::vector<float>& b, int64_t out) {
    const int64_t L = x.shape[0], in = x.shape[1];
    std::vector<float> y((size_t)(L * out));
    for (int64_t l = 0; l < L; ++l)
        for (int64_t o = 0; o < out; ++o) {
            double acc = b.empty() ? 0 : b[(size_t)o];
            for (int64_t i = 0; i < in; ++i) acc += (double)x.data[(size_t)(l * in + i)] * w[(size_t)(o * in + i)];
            y[(size_t)(l * out + o)] = (float)acc;
        }
    return y;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

}  // namespace

TEST(LoraGraph, LowRankDenseAndKronTermsEqualTheMergedWeight) {
    const int64_t in = 4, out = 6, L = 3;
    Tensor x = ramp_t({L, in}, 0.7f, 0.1f), w = ramp_t({out, in}, 0.3f, 0.5f), b = ramp_t({out}, 1.1f, 0.2f);
    Tensor up = ramp_t({out, 2}, 0.9f, 0.3f), down = ramp_t({2, in}, 0.4f, 1.0f);
    Tensor w1 = ramp_t({2, 2}, 1.3f, 0.0f), w2 = ramp_t({3, 2}, 0.5f, 0.7f);
    Tensor h1a = ramp_t({out, 1}, 0.2f, 0.4f), h1b = ramp_t({1, in}, 0.6f, 0.1f), h2a = ramp_t({out, 2}, 0.8f, 0.9f),
           h2b = ramp_t({2, in}, 0.1f, 0.3f);
    const float s = 0.7f;
    Tensor lowrank = lora_delta(up, down, nullptr, s), kron = lokr_delta(w1, w2, s), loha = loha_delta(h1a, h1b, h2a, h2b, nullptr, nullptr, 1.0f);

    runtime::GraphRunner run(nullptr, 1);
    auto got = run.run([&](runtime::GraphBuilder& g) {
        ggml_context* c = g.ctx();
        ggml_tensor* X = g.input_f32("x", {in, L}, x.data);
        ggml_tensor* W = g.input_f32("w", {in, out}, w.data);
        ggml_tensor* B = g.input_f32("b", {out}, b.data);
        Terms lr, dn, kr;
        lr.terms.push_back({Term::Kind::LowRank, g.input_f32("down", ne(down.shape), down.data), g.input_f32("up", ne(up.shape), up.data)});
        lr.terms.back().scale = s;
        Term d;
        d.kind = Term::Kind::Dense;
        d.delta = g.input_f32("delta", ne(loha.shape), loha.data);
        d.scale = -0.5f;  // a negative user weight
        dn.terms.push_back(d);
        Term k;
        k.kind = Term::Kind::Kron;
        k.w1 = g.input_f32("w1", ne(w1.shape), w1.data);
        k.w2 = g.input_f32("w2", ne(w2.shape), w2.data);
        k.scale = s;
        kr.terms.push_back(k);
        return std::vector<ggml_tensor*>{patched_linear(c, X, W, B, lr), patched_linear(c, X, W, B, dn), patched_linear(c, X, W, B, kr),
                                         patched_linear(c, X, W, nullptr, Terms{})};
    });
    auto merged = [&](const Tensor& delta, float m) {
        std::vector<float> wm = w.data;
        merge_rows(wm, out, in, delta, {0, out, 0}, m);
        return wm;
    };
    EXPECT_LT(max_diff(got[0].data, host_linear(x, merged(lowrank, 1.0f), b.data, out)), 1e-5f);
    EXPECT_LT(max_diff(got[1].data, host_linear(x, merged(loha, -0.5f), b.data, out)), 1e-5f);
    EXPECT_LT(max_diff(got[2].data, host_linear(x, merged(kron, 1.0f), b.data, out)), 1e-5f);
    EXPECT_LT(max_diff(got[3].data, host_linear(x, w.data, {}, out)), 1e-5f);
}

TEST(LoraGraph, DoraScalesGiveTheSequentialMerge) {
    // W, then a plain update, a DoRA update on the output axis and one on the input axis, each
    // with its own weight: the run-time form (scales on x and y) equals x W'^T of the merges.
    const int64_t in = 5, out = 4, L = 2;
    Tensor x = ramp_t({L, in}, 0.37f, 0.2f), w = ramp_t({out, in}, 0.61f, 0.4f);
    Tensor d1 = ramp_t({out, in}, 0.23f, 1.0f), d2 = ramp_t({out, in}, 0.41f, 0.3f), d3 = ramp_t({out, in}, 0.17f, 2.0f);
    Tensor g_out = ramp_t({out}, 0.5f, 1.2f), g_in = ramp_t({1, in}, 0.3f, 0.9f);
    for (auto& v : g_out.data) v = 1.5f + v;
    for (auto& v : g_in.data) v = 2.0f + v;
    const float m1 = 0.8f, m2 = 0.6f, m3 = -0.3f;
    std::vector<float> wm = w.data;
    merge_rows(wm, out, in, d1, {0, out, 0}, m1);
    merge_dora(wm, {out, in}, d2, {0, out, 0}, g_out, m2);
    merge_dora(wm, {out, in}, d3, {0, out, 0}, g_in, m3);
    const std::vector<float> want = host_linear(x, wm, {}, out);

    DoraScales sc = dora_runtime_scales(w, {{&d1, m1, nullptr}, {&d2, m2, &g_out}, {&d3, m3, &g_in}});
    ASSERT_EQ(sc.in.size(), 3u);
    runtime::GraphRunner run(nullptr, 1);
    auto got = run.run([&](runtime::GraphBuilder& g) {
        Terms t;
        auto vec = [&](const char* n, const std::vector<float>& v) { return v.empty() ? nullptr : g.input_f32(n, {(int64_t)v.size()}, v); };
        t.base_in_scale = vec("bi", sc.base_in);
        t.base_out_scale = vec("bo", sc.base_out);
        const Tensor* ds[3] = {&d1, &d2, &d3};
        const float ms[3] = {m1, m2, m3};
        for (int k = 0; k < 3; ++k) {
            Term term;
            term.kind = Term::Kind::Dense;
            term.delta = g.input_f32((std::string("d") + std::to_string(k)).c_str(), {in, out}, ds[k]->data);
            term.scale = ms[k];
            term.in_scale = vec((std::string("i") + std::to_string(k)).c_str(), sc.in[(size_t)k]);
            term.out_scale = vec((std::string("o") + std::to_string(k)).c_str(), sc.out[(size_t)k]);
            t.terms.push_back(term);
        }
        return std::vector<ggml_tensor*>{patched_linear(g.ctx(), g.input_f32("x", {in, L}, x.data), g.input_f32("w", {in, out}, w.data), nullptr, t)};
    });
    EXPECT_LT(max_diff(got[0].data, want), 2e-5f);
    EXPECT_GT(max_diff(want, host_linear(x, w.data, {}, out)), 0.05f);  // the updates matter
}

TEST(LoraGraph, ConvLoraEqualsTheMergedKernel) {
    const int64_t C = 3, O = 2, H = 5, W = 6;
    Tensor x = ramp_t({1, C, H, W}, 0.13f, 0.2f), k = ramp_t({O, C, 3, 3}, 0.29f, 0.7f), bias = ramp_t({O}, 1.0f, 0.0f);
    Tensor down = ramp_t({2, C, 3, 3}, 0.31f, 0.1f), up = ramp_t({O, 2, 1, 1}, 0.47f, 0.5f);
    Tensor down1 = ramp_t({2, C, 1, 1}, 0.53f, 0.2f), mid = ramp_t({2, 2, 3, 3}, 0.19f, 0.8f);
    const float s = 0.9f;
    Tensor kl = k, kt = k;
    {
        Tensor d = lora_delta(up, down, nullptr, s), dt = lora_delta(up, down1, &mid, s);
        ASSERT_EQ(d.shape, k.shape);
        ASSERT_EQ(dt.shape, k.shape);
        for (size_t i = 0; i < k.data.size(); ++i) kl.data[i] += d.data[i], kt.data[i] += dt.data[i];
    }
    runtime::GraphRunner run(nullptr, 1);
    for (int stride : {1, 2}) {
        auto got = run.run([&](runtime::GraphBuilder& g) {
            ggml_context* c = g.ctx();
            ggml_tensor* X = g.input_f32("x", ne(x.shape), x.data);
            ggml_tensor* K = g.input_f32("k", ne(k.shape), k.data);
            ggml_tensor* B = g.input_f32("b", {O}, bias.data);
            Terms a, t;
            Term ta;
            ta.down = g.input_f32("down", ne(down.shape), down.data);
            ta.up = g.input_f32("up", ne(up.shape), up.data);
            ta.scale = s;
            a.terms.push_back(ta);
            Term tt;
            tt.down = g.input_f32("down1", ne(down1.shape), down1.data);
            tt.mid = g.input_f32("mid", ne(mid.shape), mid.data);
            tt.up = g.input_f32("up2", {2, O}, up.data);  // a 2-D up works too
            tt.scale = s;
            t.terms.push_back(tt);
            ggml_tensor* KL = g.input_f32("kl", ne(k.shape), kl.data);
            ggml_tensor* KT = g.input_f32("kt", ne(k.shape), kt.data);
            ggml_tensor* Bm = ggml_reshape_4d(c, B, 1, 1, O, 1);
            return std::vector<ggml_tensor*>{patched_conv2d(c, X, K, B, stride, 1, a), ggml_add(c, conv2d(c, X, KL, stride, 1), Bm),
                                             patched_conv2d(c, X, K, B, stride, 1, t), ggml_add(c, conv2d(c, X, KT, stride, 1), Bm)};
        });
        EXPECT_LT(max_diff(got[0].data, got[1].data), 3e-5f) << "stride " << stride;
        EXPECT_LT(max_diff(got[2].data, got[3].data), 3e-5f) << "stride " << stride;
        EXPECT_EQ(got[0].ne[0], stride == 1 ? W : 3);
    }
    // conv2d itself on a hand case: 3x3 ones over 1..9 with padding 1: centre 45, corner 12
    std::vector<float> img{1, 2, 3, 4, 5, 6, 7, 8, 9}, ones(9, 1.0f);
    auto c3 = run.run([&](runtime::GraphBuilder& g) {
        return std::vector<ggml_tensor*>{conv2d(g.ctx(), g.input_f32("x", {3, 3, 1, 1}, img), g.input_f32("k", {3, 3, 1, 1}, ones), 1, 1)};
    });
    EXPECT_EQ(c3[0].data[4], 45.0f);
    EXPECT_EQ(c3[0].data[0], 12.0f);
}

TEST(LoraGraph, InGraphDeltasEqualTheHostOnes) {
    Tensor w1a = ramp_t({4, 2}, 0.3f, 0.1f), w1b = ramp_t({2, 3}, 0.5f, 0.2f), w2a = ramp_t({4, 1}, 0.7f, 0.3f), w2b = ramp_t({1, 3}, 0.9f, 0.4f);
    Tensor k1 = ramp_t({2, 3}, 0.21f, 0.5f), k2 = ramp_t({3, 2}, 0.33f, 0.6f);
    Tensor loha = loha_delta(w1a, w1b, w2a, w2b, nullptr, nullptr, 1.0f), kron = lokr_delta(k1, k2, 1.0f);
    runtime::GraphRunner run(nullptr, 1);
    auto got = run.run([&](runtime::GraphBuilder& g) {
        ggml_context* c = g.ctx();
        auto in = [&](const char* n, const Tensor& t) { return g.input_f32(n, ne(t.shape), t.data); };
        return std::vector<ggml_tensor*>{loha_delta_graph(c, in("a", w1a), in("b", w1b), in("c", w2a), in("d", w2b)),
                                         kron_graph(c, in("k1", k1), in("k2", k2))};
    });
    EXPECT_EQ(got[0].ne[0], 3);
    EXPECT_EQ(got[0].ne[1], 4);
    EXPECT_LT(max_diff(got[0].data, loha.data), 1e-6f);
    EXPECT_EQ(got[1].ne[0], 6);
    EXPECT_EQ(got[1].ne[1], 6);
    EXPECT_LT(max_diff(got[1].data, kron.data), 1e-6f);
}

TEST(LoraGraph, PrepareTermPlacesTheRowsOfAFusedLayer) {
    // A LoRA on a fused [6, 2] layer whose rows 2..4 are the target's rows 0..2 (to_k of a
    // fused qkv), and one whose two halves are swapped onto the target (FLUX norm_out).
    const auto dir = lora_test::temp_dir("lora_prepare");
    const auto f = lora_test::write_safetensors(dir / "p.safetensors",
                                                {{"qkv.lora_up.weight", {6, 1}, {1, 2, 3, 4, 5, 6}},
                                                 {"qkv.lora_down.weight", {1, 2}, {1, -1}},
                                                 {"qkv.alpha", {}, {0.5f}},
                                                 {"nrm.lokr_w1", {2, 1}, {1, 2}},
                                                 {"nrm.lokr_w2", {1, 2}, {3, 4}}});
    LoraFile lf = LoraFile::open(f);
    Target k{"attn.to_k.weight", {2, 2}, ""};
    HostTerm h = prepare_term(lf, lf.parsed().patches[0], k, {{0, {2, 4, 0}}});
    EXPECT_EQ(h.kind, Term::Kind::LowRank);
    EXPECT_FLOAT_EQ(h.scale, 0.5f);
    EXPECT_EQ(h.up.shape, (std::vector<int64_t>{2, 1}));
    EXPECT_EQ(h.up.data, (std::vector<float>{3, 4}));
    Target n{"norm_out.linear.weight", {2, 2}, ""};
    HostTerm s = prepare_term(lf, lf.parsed().patches[1], n, {{0, {0, 1, 1}}, {0, {1, 2, 0}}});
    EXPECT_EQ(s.kind, Term::Kind::Dense);  // not an exact cover: the Kronecker product is formed
    EXPECT_EQ(s.delta.data, (std::vector<float>{6, 8, 3, 4}));
    HostTerm e = prepare_term(lf, lf.parsed().patches[1], n, {{0, {0, 2, 0}}});
    EXPECT_EQ(e.kind, Term::Kind::Kron);
    std::filesystem::remove_all(dir);
}
