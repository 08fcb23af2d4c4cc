// Layers of src/nn against hand-computed values and naive reference loops.
#include "core/error.h"
#include "nn/layers.h"
#include "runtime/graph_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <random>

using namespace easel;

namespace {

void set(nn::Param* p, const std::vector<float>& v) {
    ASSERT_NE(p->tensor, nullptr);
    ASSERT_EQ((size_t)ggml_nelements(p->tensor), v.size());
    if (p->tensor->type == GGML_TYPE_F32) {
        ggml_backend_tensor_set(p->tensor, v.data(), 0, v.size() * sizeof(float));
    } else {
        std::vector<ggml_fp16_t> h(v.size());
        ggml_fp32_to_fp16_row(v.data(), h.data(), (int64_t)v.size());
        ggml_backend_tensor_set(p->tensor, h.data(), 0, h.size() * sizeof(ggml_fp16_t));
    }
}

std::vector<float> randn(size_t n, unsigned seed, float scale = 1.0f) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float m = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

}  // namespace

TEST(NnBlock, ParamNamesMirrorTree) {
    struct Mlp : nn::Block {
        Mlp() {
            fc1 = &add<nn::Linear>("fc1", 4, 8);
            fc2 = &add<nn::Linear>("fc2", 8, 4, false);
        }
        nn::Linear* fc1;
        nn::Linear* fc2;
    };
    struct Root : nn::Block {
        Root() {
            add<Mlp>("layers.0.mlp");
            add<nn::LayerNorm>("norm", 4);
            param("scale", {4}, nn::ParamRole::Norm, true);
        }
    };
    Root r;
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    r.visit_params("model", [&](const std::string& n, nn::Param& p) {
        names.push_back(n);
        shapes.push_back(p.shape);
    });
    std::vector<std::string> want = {"model.scale", "model.layers.0.mlp.fc1.weight", "model.layers.0.mlp.fc1.bias",
                                     "model.layers.0.mlp.fc2.weight", "model.norm.weight", "model.norm.bias"};
    EXPECT_EQ(names, want);
    EXPECT_EQ(shapes[1], (std::vector<int64_t>{8, 4}));
    EXPECT_EQ(r.param_count(), 6u);
    EXPECT_THROW(r.param("scale", {1}), Error);
    EXPECT_THROW(r.param("a.b", {1}), Error);
}

TEST(NnLayers, Linear2x3) {
    nn::Linear lin(3, 2);
    runtime::GraphRunner run(nullptr, 1);
    auto pb = nn::ParamBuffer::allocate(lin, run.buffer_type());
    set(lin.w, {1, 2, 3, 4, 5, 6});  // [[1,2,3],[4,5,6]]
    set(lin.b, {0.5f, -1.0f});
    std::vector<float> x = {1, 0, -1, 2, 1, 0};  // two rows
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        return std::vector<ggml_tensor*>{lin.forward(c, g.input_f32("x", {3, 2}, x))};
    });
    ASSERT_EQ(out[0].ne[0], 2);
    ASSERT_EQ(out[0].ne[1], 2);
    std::vector<float> want = {-1.5f, -3.0f, 4.5f, 12.0f};
    EXPECT_EQ(out[0].data, want);
    // wrong width is an error, not an abort
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        return std::vector<ggml_tensor*>{lin.forward(c, g.input_f32("x", {2, 3}, x))};
    }),
                 Error);
}

TEST(NnLayers, GroupNormKnownValues) {
    // 4 channels in 2 groups, image 2x1, batch 1. Group 0 holds {1,2,3,4} (channels 0,1),
    // group 1 holds {-2,0,2,4}.  mean 2.5 / var 1.25 and mean 1 / var 5.
    nn::GroupNorm gn(2, 4, 1e-5f);
    runtime::GraphRunner run(nullptr, 1);
    auto pb = nn::ParamBuffer::allocate(gn, run.buffer_type());
    set(gn.w, {1.0f, 2.0f, -1.0f, 0.5f});
    set(gn.b, {0.0f, 0.1f, 0.2f, -0.3f});
    std::vector<float> x = {1, 2, 3, 4, -2, 0, 2, 4};  // {W=2, H=1, C=4, N=1}
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        return std::vector<ggml_tensor*>{gn.forward(c, g.input_f32("x", {2, 1, 4, 1}, x))};
    });
    const float s0 = 1.0f / std::sqrt(1.25f + 1e-5f), s1 = 1.0f / std::sqrt(5.0f + 1e-5f);
    std::vector<float> want = {
        (1 - 2.5f) * s0 * 1.0f + 0.0f, (2 - 2.5f) * s0 * 1.0f + 0.0f,  // channel 0
        (3 - 2.5f) * s0 * 2.0f + 0.1f, (4 - 2.5f) * s0 * 2.0f + 0.1f,  // channel 1
        (-2 - 1.0f) * s1 * -1.0f + 0.2f, (0 - 1.0f) * s1 * -1.0f + 0.2f,
        (2 - 1.0f) * s1 * 0.5f - 0.3f, (4 - 1.0f) * s1 * 0.5f - 0.3f};
    EXPECT_LT(max_abs_diff(out[0].data, want), 1e-5f);
    EXPECT_NEAR(out[0].data[0], -1.3416355f, 1e-5f);
    // the sequence layout {L, C, N} gives the same numbers
    auto out2 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        return std::vector<ggml_tensor*>{gn.forward(c, g.input_f32("x", {2, 4, 1}, x))};
    });
    EXPECT_LT(max_abs_diff(out2[0].data, want), 1e-5f);
    EXPECT_EQ(out2[0].ne[1], 4);
}

TEST(NnLayers, LayerNormAndRmsNorm) {
    nn::LayerNorm ln(4, 1e-5f);
    nn::RMSNorm rms(4, 1e-6f);
    runtime::GraphRunner run(nullptr, 1);
    auto pb1 = nn::ParamBuffer::allocate(ln, run.buffer_type());
    auto pb2 = nn::ParamBuffer::allocate(rms, run.buffer_type());
    set(ln.w, {1, 2, 3, 4});
    set(ln.b, {0.5f, 0, 0, -0.5f});
    set(rms.w, {1, -1, 2, 0.5f});
    std::vector<float> x = {1, 2, 3, 4, 0, 0, 0, 8};
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        ggml_tensor* xi = g.input_f32("x", {4, 2}, x);
        return std::vector<ggml_tensor*>{ln.forward(c, xi), rms.forward(c, xi)};
    });
    // row 0: mean 2.5, var 1.25; row 1: mean 2, var 12
    const float a = 1 / std::sqrt(1.25f + 1e-5f), b = 1 / std::sqrt(12.0f + 1e-5f);
    std::vector<float> want_ln = {-1.5f * a * 1 + 0.5f, -0.5f * a * 2, 0.5f * a * 3, 1.5f * a * 4 - 0.5f,
                                  -2 * b * 1 + 0.5f,    -2 * b * 2,    -2 * b * 3,   6 * b * 4 - 0.5f};
    EXPECT_LT(max_abs_diff(out[0].data, want_ln), 1e-5f);
    // rms row 0: sqrt(30/4), row 1: sqrt(64/4) = 4
    const float r0 = 1 / std::sqrt(7.5f + 1e-6f), r1 = 1 / std::sqrt(16.0f + 1e-6f);
    std::vector<float> want_rms = {1 * r0, -2 * r0, 6 * r0, 2 * r0, 0, 0, 0, 8 * r1 * 0.5f};
    EXPECT_LT(max_abs_diff(out[1].data, want_rms), 1e-5f);
}

TEST(NnLayers, EmbeddingBatch) {
    nn::Embedding emb(5, 3);
    runtime::GraphRunner run(nullptr, 1);
    auto pb = nn::ParamBuffer::allocate(emb, run.buffer_type());
    std::vector<float> table(15);
    for (int i = 0; i < 15; ++i) table[i] = (float)(i * 10 + 1);  // row r = {30r+1, 30r+11, 30r+21}
    set(emb.w, table);
    std::vector<int32_t> ids = {4, 0, 2, 1, 1, 3};  // {L=3, N=2}
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        return std::vector<ggml_tensor*>{emb.forward(c, g.input_i32("ids", {3, 2}, ids))};
    });
    EXPECT_EQ(out[0].ne[0], 3);
    EXPECT_EQ(out[0].ne[1], 3);
    EXPECT_EQ(out[0].ne[2], 2);
    for (int i = 0; i < 6; ++i)
        for (int d = 0; d < 3; ++d) EXPECT_EQ(out[0].data[i * 3 + d], table[ids[i] * 3 + d]);
}

namespace {

// naive conv2d in PyTorch layout: x [N, C, H, W] (same bytes as ggml {W, H, C, N}), w [O, C, k, k]
std::vector<float> naive_conv(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b, int N,
                              int C, int H, int W, int O, int k, int s, int p, int& OH, int& OW) {
    OH = (H + 2 * p - k) / s + 1;
    OW = (W + 2 * p - k) / s + 1;
    std::vector<float> y((size_t)N * O * OH * OW);
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < O; ++o)
            for (int i = 0; i < OH; ++i)
                for (int j = 0; j < OW; ++j) {
                    double acc = b.empty() ? 0 : b[o];
                    for (int c = 0; c < C; ++c)
                        for (int u = 0; u < k; ++u)
                            for (int v = 0; v < k; ++v) {
                                int yy = i * s - p + u, xx = j * s - p + v;
                                if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
                                acc += (double)x[((n * C + c) * H + yy) * W + xx] * w[((o * C + c) * k + u) * k + v];
                            }
                    y[((n * O + o) * OH + i) * OW + j] = (float)acc;
                }
    return y;
}

}  // namespace

TEST(NnLayers, Conv2dMatchesNaive) {
    struct Case {
        int C, O, k, s, p, H, W;
        bool f16;
    };
    for (bool direct : {false, true})
    for (Case cs : {Case{3, 5, 3, 1, 1, 6, 7, false}, Case{3, 4, 3, 2, 1, 7, 6, false}, Case{4, 3, 1, 1, 0, 5, 5, false},
                    Case{2, 3, 3, 1, 1, 4, 5, true}}) {
        nn::Conv2d conv(cs.C, cs.O, cs.k, cs.s, cs.p);
        EXPECT_EQ(nn::set_conv_direct(conv, direct), 1);  // --vae-conv-direct / --diffusion-conv-direct: ggml_conv_2d_direct
        runtime::GraphRunner run(nullptr, 1);
        auto pb = nn::ParamBuffer::allocate(conv, run.buffer_type(), [&](const std::string&, const nn::Param& p) {
            return p.role == nn::ParamRole::ConvWeight && cs.f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
        });
        const int N = 2;
        auto w = randn((size_t)cs.O * cs.C * cs.k * cs.k, 1);
        auto b = randn(cs.O, 2);
        auto x = randn((size_t)N * cs.C * cs.H * cs.W, 3);
        if (cs.f16) {  // round the kernel to f16 so that the reference sees the same values
            for (auto& v : w) v = ggml_fp16_to_fp32(ggml_fp32_to_fp16(v));
        }
        set(conv.w, w);
        set(conv.b, b);
        auto out = run.run([&](runtime::GraphBuilder& g) {
            nn::Ctx c{g.ctx()};
            return std::vector<ggml_tensor*>{conv.forward(c, g.input_f32("x", {cs.W, cs.H, cs.C, N}, x))};
        });
        int OH, OW;
        auto want = naive_conv(x, w, b, N, cs.C, cs.H, cs.W, cs.O, cs.k, cs.s, cs.p, OH, OW);
        EXPECT_EQ(out[0].ne[0], OW);
        EXPECT_EQ(out[0].ne[1], OH);
        EXPECT_EQ(out[0].ne[2], cs.O);
        EXPECT_EQ(out[0].ne[3], N);
        // an F16 kernel makes ggml round the im2col data to F16 too
        EXPECT_LT(max_abs_diff(out[0].data, want), cs.f16 ? 2e-2f : 1e-4f) << "C=" << cs.C << " k=" << cs.k << " s=" << cs.s
                                                                          << " direct=" << direct;
    }
}

// --vae-conv-direct / --diffusion-conv-direct: the direct convolution gives the im2col path's
// result within float rounding (F32 kernel: the same products summed in another order; F16
// kernel: both round the data to F16) and its compute buffer lacks the im2col matrix
// (K*K*C x OW*OH values), so a plan measured from the graph drops by most of that.
TEST(NnLayers, Conv2dDirectEqualsIm2colWithLessMemory) {
    for (bool f16 : {false, true}) {
        const int C = 32, O = 32, k = 3, H = 48, W = 40, N = 1;
        nn::Conv2d conv(C, O, k, 1, 1);
        runtime::GraphRunner run(nullptr, 1);
        auto pb = nn::ParamBuffer::allocate(conv, run.buffer_type(), [&](const std::string&, const nn::Param& p) {
            return p.role == nn::ParamRole::ConvWeight && f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
        });
        set(conv.w, randn((size_t)O * C * k * k, 4, 0.1f));
        set(conv.b, randn(O, 5));
        const auto x = randn((size_t)N * C * H * W, 6);
        auto once = [&](bool direct, size_t& compute) {
            nn::set_conv_direct(conv, direct);
            auto out = run.run([&](runtime::GraphBuilder& g) {
                nn::Ctx c{g.ctx(), false, g.backend()};
                return std::vector<ggml_tensor*>{conv.forward(c, g.input_f32("x", {W, H, C, N}, x))};
            });
            compute = run.last_compute_bytes();
            return out[0].data;
        };
        size_t im2col_bytes = 0, direct_bytes = 0;
        const auto d = once(true, direct_bytes);  // first: the runner's compute buffer only grows
        const auto a = once(false, im2col_bytes);
        float scale = 0;
        for (float v : a) scale = std::max(scale, std::fabs(v));
        EXPECT_LT(max_abs_diff(a, d), (f16 ? 2e-3f : 1e-5f) * scale) << "f16=" << f16;
        const size_t cols = (size_t)k * k * C * H * W * (f16 ? 2 : 4);  // the im2col matrix in the kernel's type
        // the allocator reuses part of the matrix's space for other tensors, so the drop is most of
        // it, not all (measured: F32 1.97 of 2.21 MB, F16 0.86 of 1.11 MB)
        EXPECT_GE((double)im2col_bytes - (double)direct_bytes, 0.7 * (double)cols)
            << "f16=" << f16 << ": im2col " << im2col_bytes << " B, direct " << direct_bytes << " B";
        EXPECT_LT(2 * direct_bytes, im2col_bytes);
    }
}

namespace {

// naive attention: q [N, Lq, Hq*D] (ggml {D*Hq, Lq, N}), k/v [N, Lk, Hkv*D], mask [N?, Lq, Lk]
std::vector<float> naive_attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                   const std::vector<float>* mask, bool mask_per_batch, int N, int Lq, int Lk, int Hq,
                                   int Hkv, int D) {
    std::vector<float> o((size_t)N * Lq * Hq * D);
    const int rep = Hq / Hkv;
    for (int n = 0; n < N; ++n)
        for (int h = 0; h < Hq; ++h) {
            const int hk = h / rep;
            for (int i = 0; i < Lq; ++i) {
                std::vector<double> s(Lk);
                double mx = -INFINITY;
                for (int j = 0; j < Lk; ++j) {
                    double acc = 0;
                    for (int d = 0; d < D; ++d)
                        acc += (double)q[((size_t)n * Lq + i) * Hq * D + h * D + d] * k[((size_t)n * Lk + j) * Hkv * D + hk * D + d];
                    acc /= std::sqrt((double)D);
                    if (mask) acc += (*mask)[((mask_per_batch ? n : 0) * Lq + i) * Lk + j];
                    s[j] = acc;
                    mx = std::max(mx, acc);
                }
                double sum = 0;
                for (auto& x : s) sum += (x = std::exp(x - mx));
                for (int d = 0; d < D; ++d) {
                    double acc = 0;
                    for (int j = 0; j < Lk; ++j) acc += s[j] / sum * v[((size_t)n * Lk + j) * Hkv * D + hk * D + d];
                    o[((size_t)n * Lq + i) * Hq * D + h * D + d] = (float)acc;
                }
            }
        }
    return o;
}

}  // namespace

TEST(NnLayers, AttentionMatchesNaive) {
    struct Case {
        int N, Lq, Lk, Hq, Hkv, D;
        int mask;  // 0 none, 1 causal {Lk, Lq}, 2 per-batch padding {Lk, Lq, 1, N}
    };
    runtime::GraphRunner run(nullptr, 2);
    for (Case cs : {Case{2, 5, 5, 4, 4, 8, 0}, Case{2, 6, 6, 2, 2, 16, 1}, Case{2, 3, 7, 4, 2, 8, 2}, Case{1, 4, 9, 6, 1, 4, 1}}) {
        auto q = randn((size_t)cs.N * cs.Lq * cs.Hq * cs.D, 10);
        auto k = randn((size_t)cs.N * cs.Lk * cs.Hkv * cs.D, 11);
        auto v = randn((size_t)cs.N * cs.Lk * cs.Hkv * cs.D, 12);
        std::vector<float> mask;
        bool per_batch = cs.mask == 2;
        if (cs.mask == 1) {
            mask.assign((size_t)cs.Lq * cs.Lk, 0.0f);
            for (int i = 0; i < cs.Lq; ++i)
                for (int j = 0; j < cs.Lk; ++j)
                    if (j > i) mask[i * cs.Lk + j] = -INFINITY;
        } else if (cs.mask == 2) {
            mask.assign((size_t)cs.N * cs.Lq * cs.Lk, 0.0f);
            for (int n = 0; n < cs.N; ++n)
                for (int i = 0; i < cs.Lq; ++i)
                    for (int j = cs.Lk - 2 * n - 1; j < cs.Lk; ++j) mask[(n * cs.Lq + i) * cs.Lk + j] = -INFINITY;
        }
        auto want = naive_attention(q, k, v, cs.mask ? &mask : nullptr, per_batch, cs.N, cs.Lq, cs.Lk, cs.Hq, cs.Hkv, cs.D);
        for (bool flash : {false, true}) {
            auto out = run.run([&](runtime::GraphBuilder& g) {
                nn::Ctx c{g.ctx(), flash};
                ggml_tensor* qi = g.input_f32("q", {cs.Hq * cs.D, cs.Lq, cs.N}, q);
                ggml_tensor* ki = g.input_f32("k", {cs.Hkv * cs.D, cs.Lk, cs.N}, k);
                ggml_tensor* vi = g.input_f32("v", {cs.Hkv * cs.D, cs.Lk, cs.N}, v);
                ggml_tensor* mi = nullptr;
                if (cs.mask == 1) mi = g.input_f32("mask", {cs.Lk, cs.Lq}, mask);
                if (cs.mask == 2) mi = g.input_f32("mask", {cs.Lk, cs.Lq, 1, cs.N}, mask);
                return std::vector<ggml_tensor*>{nn::attention(c, qi, ki, vi, cs.Hq, cs.Hkv, mi)};
            });
            EXPECT_EQ(out[0].ne[0], cs.Hq * cs.D);
            EXPECT_EQ(out[0].ne[1], cs.Lq);
            EXPECT_EQ(out[0].ne[2], cs.N);
            float err = max_abs_diff(out[0].data, want);
            std::cout << "[attention] flash=" << flash << " Hq=" << cs.Hq << " Hkv=" << cs.Hkv << " mask=" << cs.mask << " max abs err " << err << "\n";
            // with F32 K/V the CPU flash kernel stays in F32 (measured ~3e-7 for both paths)
            EXPECT_LT(err, 1e-5f) << "flash=" << flash << " Hq=" << cs.Hq << " Hkv=" << cs.Hkv << " mask=" << cs.mask;
        }
    }
}

TEST(NnLayers, AttentionRejectsBadShapes) {
    runtime::GraphRunner run(nullptr, 1);
    std::vector<float> a(24, 0.0f);
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        ggml_tensor* q = g.input_f32("q", {6, 4}, a);
        ggml_tensor* k = g.input_f32("k", {4, 6}, a);
        return std::vector<ggml_tensor*>{nn::attention(c, q, k, k, 3, 2)};
    }),
                 Error);
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        ggml_tensor* q = g.input_f32("q", {6, 4}, a);
        ggml_tensor* m = g.input_f32("m", {3, 4}, std::span<const float>(a.data(), 12));
        return std::vector<ggml_tensor*>{nn::attention(c, q, q, q, 2, 2, m)};
    }),
                 Error);
}

TEST(NnLayers, TimestepEmbeddingMatchesFormula) {
    // diffusers get_timestep_embedding: exponent = -ln(max_period) * i / (half - shift)
    runtime::GraphRunner run(nullptr, 1);
    std::vector<float> t = {0.0f, 1.0f, 250.5f, 999.0f};
    struct Case {
        int dim;
        bool flip;
        float shift, scale;
    };
    for (Case cs : {Case{8, true, 0.0f, 1.0f}, Case{9, false, 1.0f, 1.0f}, Case{32, true, 1.0f, 2.0f}}) {
        auto out = run.run([&](runtime::GraphBuilder& g) {
            nn::Ctx c{g.ctx()};
            return std::vector<ggml_tensor*>{
                nn::timestep_embedding(c, g.input_f32("t", {4}, t), cs.dim, cs.flip, cs.shift, cs.scale)};
        });
        ASSERT_EQ(out[0].ne[0], cs.dim);
        ASSERT_EQ(out[0].ne[1], 4);
        const int half = cs.dim / 2;
        float worst = 0;
        for (int n = 0; n < 4; ++n)
            for (int i = 0; i < cs.dim; ++i) {
                double want = 0;  // zero pad for odd dim
                if (i < 2 * half) {
                    int f = i % half;
                    double arg = cs.scale * t[n] * std::exp(-std::log(10000.0) * f / (half - cs.shift));
                    bool first = i < half;
                    bool use_cos = cs.flip ? first : !first;
                    want = use_cos ? std::cos(arg) : std::sin(arg);
                }
                worst = std::max(worst, (float)std::fabs(out[0].data[n * cs.dim + i] - want));
            }
        // f32 rounding of arguments up to 2000 rad limits the match
        EXPECT_LT(worst, cs.scale > 1 ? 5e-4f : 2e-4f) << "dim=" << cs.dim;
    }
    // exact spot values: t=1, dim 8, shift 0, flip: [cos(1), cos(0.1), cos(0.01), cos(0.001), sin(1) ...]
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        return std::vector<ggml_tensor*>{nn::timestep_embedding(c, g.input_f32("t", {1}, std::span<const float>(&t[1], 1)), 8,
                                                                true, 0.0f)};
    });
    EXPECT_NEAR(out[0].data[0], std::cos(1.0), 1e-6);
    EXPECT_NEAR(out[0].data[1], std::cos(0.1), 1e-6);
    EXPECT_NEAR(out[0].data[5], std::sin(0.1), 1e-6);
    EXPECT_NEAR(out[0].data[7], std::sin(0.001), 1e-6);
}
