// LoRA math (lora/math.h) against hand-computed figures: the update of every patch kind (LoRA,
// conv LoRA, LoCon Tucker, LoHa with and without Tucker, LoKr with full and factored halves),
// alpha / rank scaling read from files, merges (rows of fused weights, DoRA on either axis, user
// weights) and the stored-type round trip.
#include "lora/math.h"

#include "core/error.h"
#include "lora_test_support.h"

#include <gguf.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

using namespace easel;
using namespace easel::lora;
using lora_test::StTensor;

namespace {

Tensor T(std::vector<int64_t> shape, std::vector<float> v) { return Tensor{std::move(shape), std::move(v)}; }

void expect_tensor(const Tensor& got, const std::vector<int64_t>& shape, const std::vector<float>& want, float tol = 1e-6f) {
    ASSERT_EQ(got.shape, shape);
    ASSERT_EQ(got.data.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got.data[i], want[i], tol) << "element " << i;
}

}  // namespace

TEST(LoraMath, LowRankLinear) {
    // up [[1],[2]] @ down [[1, 0, -1]] * 2
    expect_tensor(lora_delta(T({2, 1}, {1, 2}), T({1, 3}, {1, 0, -1}), nullptr, 2.0f), {2, 3}, {2, 0, -2, 4, 0, -4});
    // rank 2: up [[1, 2], [0, 1]] @ down [[1, 1], [2, -1]] = [[5, -1], [2, -1]]
    expect_tensor(lora_delta(T({2, 2}, {1, 2, 0, 1}), T({2, 2}, {1, 1, 2, -1}), nullptr, 1.0f), {2, 2}, {5, -1, 2, -1});
}

TEST(LoraMath, ConvLora3x3AndTucker) {
    // kohya conv: up [2, 1, 1, 1] = (1, -1), down [1, 1, 3, 3] = 1..9 -> out 0 = 1..9, out 1 = -(1..9)
    std::vector<float> k(9), nk(9);
    for (int i = 0; i < 9; ++i) k[i] = float(i + 1), nk[i] = -float(i + 1);
    std::vector<float> both = k;
    both.insert(both.end(), nk.begin(), nk.end());
    expect_tensor(lora_delta(T({2, 1, 1, 1}, {1, -1}), T({1, 1, 3, 3}, k), nullptr, 1.0f), {2, 1, 3, 3}, both);
    // LoCon Tucker: up [1, 2] = (1, 2), mid [2, 1, 1, 2] = ((1, 2), (3, 4)), down [1, 2, 1, 1] = (5, 6):
    // delta[0, c, 0, x] = (1 * mid[0, 0, 0, x] + 2 * mid[1, 0, 0, x]) * down[0, c] = (7, 10) * (5, 6)
    Tensor mid = T({2, 1, 1, 2}, {1, 2, 3, 4});
    expect_tensor(lora_delta(T({1, 2, 1, 1}, {1, 2}), T({1, 2, 1, 1}, {5, 6}), &mid, 1.0f), {1, 2, 1, 2}, {35, 50, 42, 60});
}

TEST(LoraMath, LoHa) {
    // (w1a w1b) = [[3, 4], [6, 8]], (w2a w2b) = [[2, -2], [1, -1]] -> Hadamard [[6, -8], [6, -8]]
    Tensor w1a = T({2, 1}, {1, 2}), w1b = T({1, 2}, {3, 4}), w2a = T({2, 1}, {2, 1}), w2b = T({1, 2}, {1, -1});
    expect_tensor(loha_delta(w1a, w1b, w2a, w2b, nullptr, nullptr, 1.0f), {2, 2}, {6, -8, 6, -8});
    expect_tensor(loha_delta(w1a, w1b, w2a, w2b, nullptr, nullptr, 0.5f), {2, 2}, {3, -4, 3, -4});
    // Tucker (LyCORIS: w_a [r, out], w_b [r, in], t [r, r, k, k]):
    // rebuild1 = 2 * (1, 2)^T (3, 1) = [[6, 2], [12, 4]], rebuild2 = (1, 1)^T (1, 2) = [[1, 2], [1, 2]]
    Tensor t1 = T({1, 1, 1, 1}, {2}), t2 = T({1, 1, 1, 1}, {1});
    expect_tensor(loha_delta(T({1, 2}, {1, 2}), T({1, 2}, {3, 1}), T({1, 2}, {1, 1}), T({1, 2}, {1, 2}), &t1, &t2, 1.0f),
                  {2, 2, 1, 1}, {6, 4, 12, 8});
}

TEST(LoraMath, LoKr) {
    // kron([[1, 2], [3, 4]], [[1, -1]]) = [[1, -1, 2, -2], [3, -3, 4, -4]]
    expect_tensor(lokr_delta(T({2, 2}, {1, 2, 3, 4}), T({1, 2}, {1, -1}), 1.0f), {2, 4}, {1, -1, 2, -2, 3, -3, 4, -4});
    // a 4-D w2: kron([[2]], [1, 1, 1, 2] (3, 5)) broadcasts w1 over the kernel
    expect_tensor(lokr_delta(T({1, 1}, {2}), T({1, 1, 1, 2}, {3, 5}), 0.5f), {1, 1, 1, 2}, {3, 5});
    // kron of [2, 1] and [1, 2] x 3: rows (i1 c + i2), columns (j1 d + j2)
    expect_tensor(lokr_delta(T({2, 1}, {1, 2}), T({1, 2}, {1, 10}), 3.0f), {2, 2}, {3, 30, 6, 60});
}

TEST(LoraMath, PatchesFromAFileWithAlpha) {
    const auto dir = lora_test::temp_dir("lora_math");
    const auto f = lora_test::write_safetensors(
        dir / "m.safetensors",
        {
            // kohya LoRA, rank 1, alpha 2 -> scale 2
            {"lora_unet_a.lora_up.weight", {2, 1}, {1, 2}},
            {"lora_unet_a.lora_down.weight", {1, 3}, {1, 0, -1}},
            {"lora_unet_a.alpha", {}, {2}},
            // PEFT without alpha -> scale 1, with a lora_B bias
            {"b.lora_B.weight", {1, 1}, {3}},
            {"b.lora_A.weight", {1, 2}, {1, 2}},
            {"b.lora_B.bias", {1}, {0.5f}},
            // LoKr: w1 full [2, 2], w2 factored [1, 1] x [1, 2] (rank 1), alpha 2 -> scale 2
            {"c.lokr_w1", {2, 2}, {1, 2, 3, 4}},
            {"c.lokr_w2_a", {1, 1}, {1}},
            {"c.lokr_w2_b", {1, 2}, {1, -1}},
            {"c.alpha", {}, {2}},
            // LoKr with both halves full: alpha is ignored (scale 1)
            {"d.lokr_w1", {1, 1}, {2}},
            {"d.lokr_w2", {1, 2}, {1, 3}},
            {"d.alpha", {}, {8}},
            // LoHa rank 2 with alpha 1 -> scale 1/2
            {"e.hada_w1_a", {1, 2}, {1, 1}},
            {"e.hada_w1_b", {2, 1}, {1, 2}},
            {"e.hada_w2_a", {1, 2}, {1, 0}},
            {"e.hada_w2_b", {2, 1}, {4, 9}},
            {"e.alpha", {}, {1}},
            // full difference with a bias difference (F16 storage)
            {"f.diff", {1, 2}, {0.25f, -0.5f}, true},
            {"f.diff_b", {1}, {1.5f}, true},
        });
    LoraFile lf = LoraFile::open(f);
    const auto& ps = lf.parsed().patches;
    ASSERT_EQ(ps.size(), 6u);
    EXPECT_EQ(ps[0].kind, PatchKind::LoRA);
    EXPECT_FLOAT_EQ(lf.scale(ps[0]), 2.0f);
    expect_tensor(patch_delta(lf, ps[0]), {2, 3}, {2, 0, -2, 4, 0, -4});
    EXPECT_FLOAT_EQ(lf.scale(ps[1]), 1.0f);
    expect_tensor(patch_delta(lf, ps[1]), {1, 2}, {3, 6});
    expect_tensor(patch_bias_delta(lf, ps[1]), {1}, {0.5f});
    EXPECT_EQ(ps[2].kind, PatchKind::LoKr);
    EXPECT_EQ(ps[2].rank, 1);
    expect_tensor(patch_delta(lf, ps[2]), {2, 4}, {2, -2, 4, -4, 6, -6, 8, -8});
    EXPECT_EQ(ps[3].rank, 0);
    EXPECT_FLOAT_EQ(lf.scale(ps[3]), 1.0f);
    expect_tensor(patch_delta(lf, ps[3]), {1, 2}, {2, 6});
    // LoHa: (w1a w1b) = 1 + 2 = 3; (w2a w2b) = 4 -> 12 * 1/2
    EXPECT_EQ(ps[4].kind, PatchKind::LoHa);
    expect_tensor(patch_delta(lf, ps[4]), {1, 1}, {6});
    EXPECT_EQ(ps[5].kind, PatchKind::Diff);
    expect_tensor(patch_delta(lf, ps[5]), {1, 2}, {0.25f, -0.5f});
    expect_tensor(patch_bias_delta(lf, ps[5]), {1}, {1.5f});
    std::filesystem::remove_all(dir);
}

TEST(LoraMath, MergeRowsIntoAFusedWeight) {
    std::vector<float> w(8, 0.0f);  // [4, 2]
    merge_rows(w, 4, 2, T({2, 2}, {1, 2, 3, 4}), {0, 2, 1}, 0.5f);
    EXPECT_EQ(w, (std::vector<float>{0, 0, 0.5f, 1, 1.5f, 2, 0, 0}));
    // negative weight, second half of the update into the first rows
    merge_rows(w, 4, 2, T({2, 2}, {1, 2, 3, 4}), {1, 2, 0}, -1.0f);
    EXPECT_EQ(w, (std::vector<float>{-3, -4, 0.5f, 1, 1.5f, 2, 0, 0}));
    EXPECT_THROW(merge_rows(w, 4, 2, T({2, 2}, {1, 2, 3, 4}), {0, 2, 3}, 1.0f), Error);
}

TEST(LoraMath, DoraOutputAxis) {
    // W [[3, 0], [0, 4]], update [[0, 4], [3, 0]] -> V rows (3, 4), (3, 4), norms 5; magnitude (10, 5)
    // D = [[6, 8], [3, 4]]; m = 1: W' = D; m = 0.5: W + (D - W) / 2
    for (auto g : {T({2}, {10, 5}), T({2, 1}, {10, 5})}) {
        std::vector<float> w{3, 0, 0, 4};
        merge_dora(w, {2, 2}, T({2, 2}, {0, 4, 3, 0}), {0, 2, 0}, g, 1.0f);
        EXPECT_EQ(w, (std::vector<float>{6, 8, 3, 4}));
        std::vector<float> h{3, 0, 0, 4};
        merge_dora(h, {2, 2}, T({2, 2}, {0, 4, 3, 0}), {0, 2, 0}, g, 0.5f);
        EXPECT_EQ(h, (std::vector<float>{4.5f, 4, 1.5f, 4}));
        std::vector<float> z{3, 0, 0, 4};
        merge_dora(z, {2, 2}, T({2, 2}, {0, 4, 3, 0}), {0, 2, 0}, g, 0.0f);  // weight 0 = off
        EXPECT_EQ(z, (std::vector<float>{3, 0, 0, 4}));
    }
}

TEST(LoraMath, DoraInputAxis) {
    // columns of V = [[3, 4], [3, 4]] have norms sqrt(18), sqrt(32); magnitude [1, 2] = (10, 5):
    // D = [[3, 4], [3, 4]] * (10 / sqrt(18), 5 / sqrt(32)) = 10/sqrt(2), 5/sqrt(2) in every row
    std::vector<float> w{3, 0, 0, 4};
    merge_dora(w, {2, 2}, T({2, 2}, {0, 4, 3, 0}), {0, 2, 0}, T({1, 2}, {10, 5}), 1.0f);
    const float a = 10.0f / std::sqrt(2.0f), b = 5.0f / std::sqrt(2.0f);
    for (int r = 0; r < 2; ++r) {
        EXPECT_NEAR(w[r * 2], a, 1e-5f);
        EXPECT_NEAR(w[r * 2 + 1], b, 1e-5f);
    }
    // a per-input magnitude on part of a fused weight is refused
    std::vector<float> f(8, 1.0f);
    EXPECT_THROW(merge_dora(f, {4, 2}, T({2, 2}, {0, 4, 3, 0}), {0, 2, 0}, T({1, 2}, {10, 5}), 1.0f), Error);
    // a magnitude of neither axis
    EXPECT_THROW(merge_dora(w, {2, 2}, T({2, 2}, {0, 4, 3, 0}), {0, 2, 0}, T({3}, {1, 1, 1}), 1.0f), Error);
}

TEST(LoraMath, StoredTypeRoundTrip) {
    std::vector<float> v(64);
    for (int i = 0; i < 64; ++i) v[i] = (float)(i - 32) / 8.0f;  // exact in F16 and BF16
    for (ggml_type t : {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16}) {
        auto bytes = from_f32(v, t, 32);
        EXPECT_EQ(to_f32(bytes, t, 64), v) << ggml_type_name(t);
    }
    // re-quantising gives ggml's own quantisation of the values
    auto q = from_f32(v, GGML_TYPE_Q8_0, 32);
    std::vector<uint8_t> ref(ggml_row_size(GGML_TYPE_Q8_0, 32) * 2);
    ggml_quantize_chunk(GGML_TYPE_Q8_0, v.data(), ref.data(), 0, 2, 32, nullptr);
    EXPECT_EQ(q, ref);
    auto back = to_f32(q, GGML_TYPE_Q8_0, 64);
    for (int i = 0; i < 64; ++i) EXPECT_NEAR(back[i], v[i], 4.0f / 127.0f);
    EXPECT_THROW(from_f32(v, GGML_TYPE_IQ2_XXS, 64), Error);  // needs an importance matrix
    EXPECT_THROW(from_f32(v, GGML_TYPE_Q4_K, 32), Error);                      // rows of 32 are not Q4_K blocks (256)
}

TEST(LoraMath, ScaleFromDiffusersAdapterMetadata) {
    // diffusers' save_lora_weights keeps the PEFT configs in __metadata__["lora_adapter_metadata"]:
    // lora_alpha / r for the LoRAs of that prefix, alpha_pattern per module name, rsLoRA sqrt(r)
    const auto dir = lora_test::temp_dir("lora_meta");
    std::vector<StTensor> ts;
    for (const char* m : {"unet.a.attn1.to_q", "unet.a.attn1.to_k", "text_encoder.l.q_proj", "transformer.b.to_q"}) {
        ts.push_back({std::string(m) + ".lora_A.weight", {4, 2}, std::vector<float>(8, 1.0f)});
        ts.push_back({std::string(m) + ".lora_B.weight", {1, 4}, std::vector<float>(4, 1.0f)});
    }
    const std::string meta = R"({"unet.lora_alpha": 8, "unet.r": 4, "unet.alpha_pattern": {"attn1.to_k": 2},
                                "transformer.lora_alpha": 8, "transformer.use_rslora": true})";
    LoraFile lf = LoraFile::open(lora_test::write_safetensors(dir / "d.safetensors", ts, {{"lora_adapter_metadata", meta}}));
    const auto& ps = lf.parsed().patches;
    ASSERT_EQ(ps.size(), 4u);
    EXPECT_FLOAT_EQ(lf.scale(ps[0]), 2.0f);   // 8 / 4
    EXPECT_FLOAT_EQ(lf.scale(ps[1]), 0.5f);   // alpha_pattern: 2 / 4
    EXPECT_FLOAT_EQ(lf.scale(ps[2]), 1.0f);   // no config for text_encoder.: alpha = r
    EXPECT_FLOAT_EQ(lf.scale(ps[3]), 4.0f);   // rsLoRA: 8 / sqrt(4)
    std::filesystem::remove_all(dir);
}

TEST(LoraMath, GgufContainerReadsLikeSafetensors) {
    // A kohya LoRA in a GGUF container (F32 up, Q8_0 down as sd.cpp's converter can write it, F32 alpha):
    // the patches and the update are those of the same tensors in safetensors, with down Q8_0-rounded.
    std::vector<float> up(64 * 2), down(2 * 32);
    for (size_t i = 0; i < up.size(); ++i) up[i] = 0.01f * (float)((int)(i % 13) - 6);
    for (size_t i = 0; i < down.size(); ++i) down[i] = 0.02f * (float)((int)(i % 7) - 3);
    const auto dir = lora_test::temp_dir("lora_gguf");
    ggml_init_params ip{1 << 20, nullptr, false};
    ggml_context* ctx = ggml_init(ip);
    gguf_context* g = gguf_init_empty();
    ggml_tensor* tu = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2, 64);    // ggml ne {r, out} = PyTorch [64, 2]
    std::memcpy(tu->data, up.data(), up.size() * 4);
    ggml_set_name(tu, "lora_unet_x.lora_up.weight");
    ggml_tensor* td = ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, 32, 2);   // PyTorch [2, 32], Q8_0
    ggml_quantize_chunk(GGML_TYPE_Q8_0, down.data(), td->data, 0, 2, 32, nullptr);
    ggml_set_name(td, "lora_unet_x.lora_down.weight");
    ggml_tensor* ta = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1);
    *(float*)ta->data = 4.0f;
    ggml_set_name(ta, "lora_unet_x.alpha");
    for (ggml_tensor* t : {tu, td, ta}) gguf_add_tensor(g, t);
    const auto path = dir / "x.gguf";
    ASSERT_TRUE(gguf_write_to_file(g, path.c_str(), false));
    gguf_free(g);
    ggml_free(ctx);
    LoraFile lf = LoraFile::open(path);
    ASSERT_EQ(lf.parsed().patches.size(), 1u);
    const Patch& p = lf.parsed().patches[0];
    EXPECT_EQ(p.delta_shape, (std::vector<int64_t>{64, 32}));
    EXPECT_FLOAT_EQ(lf.scale(p), 2.0f);
    // the reference: the same math on the Q8_0-rounded down
    std::vector<float> dq = to_f32(from_f32(down, GGML_TYPE_Q8_0, 32), GGML_TYPE_Q8_0, 64);
    Tensor want = lora_delta(T({64, 2}, up), T({2, 32}, dq), nullptr, 2.0f);
    Tensor got = patch_delta(lf, p);
    ASSERT_EQ(got.shape, want.shape);
    for (size_t i = 0; i < want.data.size(); ++i) ASSERT_EQ(got.data[i], want.data[i]) << i;
    std::filesystem::remove_all(dir);
}
