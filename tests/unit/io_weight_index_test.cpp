// WeightIndex on a real reference fixture: names, shapes, dtypes, values (against the JSON
// sidecar statistics written by the fixture generator) and load_into conversions.
#include "core/error.h"
#include "io/weight_index.h"

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

using namespace easel;
using namespace easel::io;

namespace {

const std::string kRef = std::string(EASEL_TEST_DATA) + "/reference/";

nlohmann::json sidecar(const std::string& name) {
    std::ifstream f(kRef + name + ".json");
    return nlohmann::json::parse(f);
}

struct Stats {
    double min, max, mean, std;
};
Stats stats(const std::vector<float>& v) {
    double s = 0, mn = INFINITY, mx = -INFINITY;
    for (float x : v) {
        s += x;
        mn = std::min<double>(mn, x);
        mx = std::max<double>(mx, x);
    }
    const double mean = s / v.size();
    double ss = 0;
    for (float x : v) ss += (x - mean) * (x - mean);
    // torch.std is the unbiased (n-1) estimator
    return {mn, mx, mean, v.size() > 1 ? std::sqrt(ss / (v.size() - 1)) : 0.0};
}

}  // namespace

TEST(IoWeightIndex, ClipFixtureShapesAndStatsMatchSidecar) {
    auto wi = WeightIndex::open(kRef + "clip_text_sd15_tiny.safetensors");
    const auto js = sidecar("clip_text_sd15_tiny");
    ASSERT_EQ(wi.files().size(), 1u);
    EXPECT_EQ(wi.files()[0].format, "safetensors");
    EXPECT_EQ(wi.files()[0].size, js["file_bytes"].get<uint64_t>());
    // 52 weights + 1 input + 6 outputs
    EXPECT_EQ(wi.tensors().size(), js["weights"].size() + js["inputs"].size() + js["outputs"].size());
    EXPECT_EQ(js["weights"].size(), 52u);

    int checked = 0;
    for (auto& [name, w] : js["weights"].items()) {
        const TensorInfo* t = wi.find(name);
        ASSERT_NE(t, nullptr) << name;
        EXPECT_EQ(t->dtype, DType::F32);
        EXPECT_EQ(t->gtype, GGML_TYPE_F32);
        EXPECT_EQ(t->shape, w["shape"].get<std::vector<int64_t>>()) << name;
        EXPECT_EQ(t->nbytes, (uint64_t)t->numel() * 4);
        const auto v = wi.read_f32(*t);
        const Stats s = stats(v);
        EXPECT_FLOAT_EQ((float)s.min, w["min"].get<float>()) << name;
        EXPECT_FLOAT_EQ((float)s.max, w["max"].get<float>()) << name;
        EXPECT_NEAR(s.mean, w["mean"].get<double>(), 1e-6) << name;
        EXPECT_NEAR(s.std, w["std"].get<double>(), 1e-6 + 1e-5 * w["std"].get<double>()) << name;
        ++checked;
    }
    EXPECT_EQ(checked, 52);

    // Token embedding is [vocab, hidden] = [1000, 32] in PyTorch order: ggml ne {32, 1000}.
    const TensorInfo* emb = wi.find("embeddings.token_embedding.weight");
    ASSERT_NE(emb, nullptr);
    EXPECT_EQ(emb->ggml_ne(), (std::array<int64_t, 4>{32, 1000, 1, 1}));

    // The I64 input ids: 2x77, SD1.x tokenizer convention bos 998 first, eos/pad 999.
    const TensorInfo* ids = wi.find("__input__.input_ids");
    ASSERT_NE(ids, nullptr);
    EXPECT_EQ(ids->dtype, DType::I64);
    EXPECT_EQ(ids->gtype, GGML_TYPE_I64);
    EXPECT_EQ(ids->shape, (std::vector<int64_t>{2, 77}));
    const auto iv = wi.read_i64(*ids);
    ASSERT_EQ(iv.size(), 154u);
    for (int64_t x : iv) {
        EXPECT_GE(x, 0);
        EXPECT_LT(x, 1000);
    }
    const auto fv = wi.read_f32(*ids);
    for (size_t i = 0; i < iv.size(); ++i) EXPECT_EQ(fv[i], (float)iv[i]);
    EXPECT_THROW(wi.read_i64(*emb), Error);

    // Outputs' statistics too (different sizes, offsets later in the file).
    for (auto& [name, w] : js["outputs"].items()) {
        const TensorInfo* t = wi.find("__output__." + name);
        ASSERT_NE(t, nullptr) << name;
        const Stats s = stats(wi.read_f32(*t));
        EXPECT_FLOAT_EQ((float)s.min, w["min"].get<float>()) << name;
        EXPECT_FLOAT_EQ((float)s.max, w["max"].get<float>()) << name;
    }

    // __metadata__
    ASSERT_TRUE(wi.metadata().count("class"));
    EXPECT_EQ(wi.metadata().at("class").s, "CLIPTextModel");
    EXPECT_EQ(wi.metadata().at("library").s, "transformers");

    // bytes_with_prefix: all 52 weights are F32 and number num_parameters.
    EXPECT_EQ(wi.bytes_with_prefix("embeddings.") + wi.bytes_with_prefix("encoder.") + wi.bytes_with_prefix("final_layer_norm."),
              js["num_parameters"].get<uint64_t>() * 4);
    EXPECT_EQ(wi.find("nope"), nullptr);
}

TEST(IoWeightIndex, LoadIntoF32F16BF16HostAndBackendBuffer) {
    auto wi = WeightIndex::open(kRef + "clip_text_sd15_tiny.safetensors");
    const TensorInfo* t = wi.find("encoder.layers.0.mlp.fc1.weight");  // [64, 32]
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->shape, (std::vector<int64_t>{64, 32}));
    const auto ref = wi.read_f32(*t);

    ggml_init_params ip{16 * 1024 * 1024, nullptr, false};
    ggml_context* ctx = ggml_init(ip);
    ggml_tensor* a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 64);
    ggml_tensor* h = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 32, 64);
    ggml_tensor* b = ggml_new_tensor_2d(ctx, GGML_TYPE_BF16, 32, 64);
    wi.load_into(*t, a);
    wi.load_into(*t, h);
    wi.load_into(*t, b);
    for (int i = 0; i < 64 * 32; ++i) {
        const float x = ref[i];
        EXPECT_EQ(((float*)a->data)[i], x);
        EXPECT_EQ(ggml_fp16_to_fp32(((ggml_fp16_t*)h->data)[i]), ggml_fp16_to_fp32(ggml_fp32_to_fp16(x)));
        EXPECT_EQ(ggml_bf16_to_fp32(((ggml_bf16_t*)b->data)[i]), ggml_bf16_to_fp32(ggml_fp32_to_bf16(x)));
        EXPECT_NEAR(ggml_fp16_to_fp32(((ggml_fp16_t*)h->data)[i]), x, 1e-3 * std::fabs(x) + 1e-7);
    }
    // Element [row 5, col 7] of the PyTorch [64, 32] matrix sits at ne0 = 7, ne1 = 5.
    EXPECT_EQ(((float*)a->data)[5 * 32 + 7], ref[5 * 32 + 7]);

    // Wrong shape is refused with an easel::Error, not an assert.
    ggml_tensor* wrong = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 32);
    EXPECT_THROW(wi.load_into(*t, wrong), Error);

    // A tensor in a backend buffer (the CPU backend's; ggml_backend_tensor_set path is the same
    // call for device buffers).
    ggml_init_params ip2{ggml_tensor_overhead() * 4, nullptr, true};
    ggml_context* c2 = ggml_init(ip2);
    ggml_tensor* d = ggml_new_tensor_2d(c2, GGML_TYPE_F16, 32, 64);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(c2, ggml_backend_cpu_buffer_type());
    ASSERT_NE(buf, nullptr);
    wi.load_into(*t, d);
    std::vector<ggml_fp16_t> back(64 * 32);
    ggml_backend_tensor_get(d, back.data(), 0, back.size() * 2);
    for (int i = 0; i < 64 * 32; ++i) EXPECT_EQ(back[i], ((ggml_fp16_t*)h->data)[i]);
    ggml_backend_buffer_free(buf);
    ggml_free(c2);
    ggml_free(ctx);
}
