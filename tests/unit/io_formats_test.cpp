// Safetensors dtypes, shard indexes, diffusers folders, GGUF (written with ggml's gguf API)
// and load_into conversions, against hand-computed values.
#include "core/error.h"
#include "io/diffusers.h"
#include "io/weight_index.h"

#include <ggml.h>
#include <gguf.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

using namespace easel;
using namespace easel::io;
namespace fs = std::filesystem;

namespace {

struct StEntry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
};

template <class T>
std::vector<uint8_t> raw(const std::vector<T>& v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

// Writes a safetensors file the way the reference writer does (header padded with spaces to 8).
void write_st(const fs::path& p, const std::vector<StEntry>& es, const nlohmann::json& meta = nullptr) {
    nlohmann::ordered_json h;
    if (!meta.is_null()) h["__metadata__"] = meta;
    uint64_t off = 0;
    for (auto& e : es) {
        h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + e.data.size()}}};
        off += e.data.size();
    }
    std::string hs = h.dump();
    while (hs.size() % 8) hs += ' ';
    std::ofstream f(p, std::ios::binary);
    uint64_t n = hs.size();
    f.write((const char*)&n, 8);
    f << hs;
    for (auto& e : es) f.write((const char*)e.data.data(), e.data.size());
}

fs::path tmpdir(const std::string& name) {
    fs::path d = fs::temp_directory_path() / ("easel_io_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

}  // namespace

TEST(IoSafetensors, EveryDtypeReadsToKnownValues) {
    auto d = tmpdir("dtypes");
    std::vector<StEntry> es;
    es.push_back({"f64", "F64", {3}, raw(std::vector<double>{1.5, -2.25, 1e10})});
    es.push_back({"f32", "F32", {2, 2}, raw(std::vector<float>{0.1f, -0.2f, 3.0f, 4.5f})});
    // F16: 0x3c00 = 1, 0xc000 = -2, 0x3555 ~ 0.33325, 0x7c00 = inf
    es.push_back({"f16", "F16", {4}, raw(std::vector<uint16_t>{0x3c00, 0xc000, 0x3555, 0x7c00})});
    // BF16: upper half of f32: 0x3f80 = 1, 0xc040 = -3, 0x3e80 = 0.25
    es.push_back({"bf16", "BF16", {3}, raw(std::vector<uint16_t>{0x3f80, 0xc040, 0x3e80})});
    // E4M3FN: 0x38 = 1.0, 0x7e = 448 (max), 0x01 = 2^-9 (min subnormal), 0xc0 = -2, 0x7f = NaN
    es.push_back({"e4m3", "F8_E4M3", {5}, {0x38, 0x7e, 0x01, 0xc0, 0x7f}});
    // E5M2: 0x3c = 1.0, 0x7b = 57344 (max), 0x7c = +inf, 0x01 = 2^-16, 0xbe = -1.5
    es.push_back({"e5m2", "F8_E5M2", {5}, {0x3c, 0x7b, 0x7c, 0x01, 0xbe}});
    es.push_back({"i64", "I64", {2}, raw(std::vector<int64_t>{-5, 1ll << 40})});
    es.push_back({"i32", "I32", {2}, raw(std::vector<int32_t>{-7, 123456})});
    es.push_back({"i16", "I16", {2}, raw(std::vector<int16_t>{-300, 300})});
    es.push_back({"i8", "I8", {2}, {0xff, 0x7f}});
    es.push_back({"u8", "U8", {2}, {0xff, 0x01}});
    es.push_back({"bool", "BOOL", {3}, {1, 0, 1}});
    es.push_back({"scalar", "F32", {}, raw(std::vector<float>{7.0f})});
    es.push_back({"empty", "F32", {0, 4}, {}});
    write_st(d / "all.safetensors", es, {{"format", "pt"}});
    auto wi = WeightIndex::open(d / "all.safetensors");
    ASSERT_EQ(wi.tensors().size(), es.size());
    auto f = [&](const char* n) { return wi.read_f32(*wi.find(n)); };
    EXPECT_EQ(f("f64"), (std::vector<float>{1.5f, -2.25f, 1e10f}));
    EXPECT_EQ(f("f32"), (std::vector<float>{0.1f, -0.2f, 3.0f, 4.5f}));
    auto h = f("f16");
    EXPECT_EQ(h[0], 1.0f);
    EXPECT_EQ(h[1], -2.0f);
    EXPECT_NEAR(h[2], 0.33325195f, 1e-7);
    EXPECT_TRUE(std::isinf(h[3]));
    EXPECT_EQ(f("bf16"), (std::vector<float>{1.0f, -3.0f, 0.25f}));
    auto e4 = f("e4m3");
    EXPECT_EQ(e4[0], 1.0f);
    EXPECT_EQ(e4[1], 448.0f);
    EXPECT_EQ(e4[2], std::ldexp(1.0f, -9));
    EXPECT_EQ(e4[3], -2.0f);
    EXPECT_TRUE(std::isnan(e4[4]));
    auto e5 = f("e5m2");
    EXPECT_EQ(e5[0], 1.0f);
    EXPECT_EQ(e5[1], 57344.0f);
    EXPECT_TRUE(std::isinf(e5[2]) && e5[2] > 0);
    EXPECT_EQ(e5[3], std::ldexp(1.0f, -16));
    EXPECT_EQ(e5[4], -1.5f);
    EXPECT_EQ(wi.read_i64(*wi.find("i64")), (std::vector<int64_t>{-5, 1ll << 40}));
    EXPECT_EQ(wi.read_i64(*wi.find("i32")), (std::vector<int64_t>{-7, 123456}));
    EXPECT_EQ(wi.read_i64(*wi.find("i16")), (std::vector<int64_t>{-300, 300}));
    EXPECT_EQ(wi.read_i64(*wi.find("i8")), (std::vector<int64_t>{-1, 127}));
    EXPECT_EQ(wi.read_i64(*wi.find("u8")), (std::vector<int64_t>{255, 1}));
    EXPECT_EQ(wi.read_i64(*wi.find("bool")), (std::vector<int64_t>{1, 0, 1}));
    EXPECT_EQ(f("i16"), (std::vector<float>{-300.0f, 300.0f}));
    EXPECT_EQ(f("scalar"), (std::vector<float>{7.0f}));
    EXPECT_EQ(wi.find("scalar")->numel(), 1);
    EXPECT_EQ(wi.find("empty")->numel(), 0);
    EXPECT_EQ(wi.find("i32")->gtype, GGML_TYPE_I32);
    EXPECT_EQ(wi.find("i16")->gtype, GGML_TYPE_I16);
    EXPECT_EQ(wi.find("i8")->gtype, GGML_TYPE_I8);
    EXPECT_EQ(wi.find("u8")->gtype, GGML_TYPE_COUNT);
    EXPECT_EQ(wi.find("e4m3")->gtype, GGML_TYPE_COUNT);
    EXPECT_EQ(wi.metadata().at("format").s, "pt");

    // Conversions on load: F64 -> F16, E5M2 -> BF16, I64 -> I32 (range-checked), float -> I32 refused.
    ggml_init_params ip{1 << 20, nullptr, false};
    ggml_context* ctx = ggml_init(ip);
    ggml_tensor* t16 = ggml_new_tensor_1d(ctx, GGML_TYPE_F16, 3);
    wi.load_into(*wi.find("f64"), t16);
    EXPECT_EQ(ggml_fp16_to_fp32(((ggml_fp16_t*)t16->data)[0]), 1.5f);
    EXPECT_EQ(ggml_fp16_to_fp32(((ggml_fp16_t*)t16->data)[1]), -2.25f);
    EXPECT_TRUE(std::isinf(ggml_fp16_to_fp32(((ggml_fp16_t*)t16->data)[2])));  // 1e10 overflows f16
    ggml_tensor* tb = ggml_new_tensor_1d(ctx, GGML_TYPE_BF16, 5);
    wi.load_into(*wi.find("e5m2"), tb);
    EXPECT_EQ(ggml_bf16_to_fp32(((ggml_bf16_t*)tb->data)[4]), -1.5f);
    EXPECT_EQ(ggml_bf16_to_fp32(((ggml_bf16_t*)tb->data)[1]), 57344.0f);
    ggml_tensor* ti = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 2);
    wi.load_into(*wi.find("i32"), ti);
    EXPECT_EQ(((int32_t*)ti->data)[1], 123456);
    EXPECT_THROW(wi.load_into(*wi.find("i64"), ti), Error);  // 2^40 does not fit in I32
    ggml_tensor* ti16 = ggml_new_tensor_1d(ctx, GGML_TYPE_I16, 2);
    wi.load_into(*wi.find("i16"), ti16);
    EXPECT_EQ(((int16_t*)ti16->data)[0], -300);
    ggml_tensor* tf2 = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 3);
    EXPECT_THROW(wi.load_into(*wi.find("f64"), tf2), Error);
    ggml_free(ctx);
    fs::remove_all(d);
}

TEST(IoSafetensors, ShardIndexFolderAndConfig) {
    auto d = tmpdir("shards");
    write_st(d / "diffusion_pytorch_model-00001-of-00002.safetensors",
             {{"a.weight", "F32", {2}, raw(std::vector<float>{1, 2})}, {"b.weight", "F16", {1}, raw(std::vector<uint16_t>{0x3c00})}});
    write_st(d / "diffusion_pytorch_model-00002-of-00002.safetensors", {{"c.weight", "BF16", {2}, raw(std::vector<uint16_t>{0x4000, 0x4040})}});
    nlohmann::json idx = {{"metadata", {{"total_size", 14}}},
                          {"weight_map",
                           {{"a.weight", "diffusion_pytorch_model-00001-of-00002.safetensors"},
                            {"b.weight", "diffusion_pytorch_model-00001-of-00002.safetensors"},
                            {"c.weight", "diffusion_pytorch_model-00002-of-00002.safetensors"}}}};
    std::ofstream(d / "diffusion_pytorch_model.safetensors.index.json") << idx.dump();
    std::ofstream(d / "config.json") << R"({"_class_name": "UNet2DConditionModel", "in_channels": 9})";

    for (auto p : {d, d / "diffusion_pytorch_model.safetensors.index.json"}) {
        auto wi = WeightIndex::open(p);
        EXPECT_EQ(wi.files().size(), 2u);
        EXPECT_EQ(wi.tensors().size(), 3u);
        EXPECT_EQ(wi.read_f32(*wi.find("c.weight")), (std::vector<float>{2.0f, 3.0f}));
        EXPECT_EQ(wi.find("c.weight")->file, 1u);
        ASSERT_NE(wi.config(), nullptr);
        EXPECT_EQ((*wi.config())["in_channels"].get<int>(), 9);
        EXPECT_EQ(wi.metadata().at("total_size").i, 14);
        EXPECT_EQ(wi.bytes_with_prefix(""), 14u);
    }
    // A single file opened directly has no config.
    EXPECT_EQ(WeightIndex::open(d / "diffusion_pytorch_model-00002-of-00002.safetensors").config(), nullptr);

    // Index naming a tensor its shard lacks.
    idx["weight_map"]["zz"] = "diffusion_pytorch_model-00002-of-00002.safetensors";
    std::ofstream(d / "bad.safetensors.index.json") << idx.dump();
    EXPECT_THROW(WeightIndex::open(d / "bad.safetensors.index.json"), Error);
    // Shard escaping the folder.
    std::ofstream(d / "esc.safetensors.index.json") << R"({"weight_map": {"a": "../x.safetensors"}})";
    EXPECT_THROW(WeightIndex::open(d / "esc.safetensors.index.json"), Error);
    // The same name in two files.
    auto wi = WeightIndex::open(d / "diffusion_pytorch_model-00001-of-00002.safetensors");
    EXPECT_THROW(wi.add_file(d / "diffusion_pytorch_model-00001-of-00002.safetensors"), Error);
    fs::remove_all(d);
}

TEST(IoSafetensors, DiffusersVariantsAndPipelineFolder) {
    auto d = tmpdir("pipe");
    fs::create_directories(d / "vae");
    fs::create_directories(d / "text_encoder");
    write_st(d / "vae" / "diffusion_pytorch_model.fp16.safetensors", {{"x", "F16", {1}, raw(std::vector<uint16_t>{0x3c00})}});
    write_st(d / "vae" / "diffusion_pytorch_model.bf16.safetensors", {{"y", "BF16", {1}, raw(std::vector<uint16_t>{0x3f80})}});
    write_st(d / "text_encoder" / "model.safetensors", {{"t", "F32", {1}, raw(std::vector<float>{1})}});
    write_st(d / "text_encoder" / "model.fp16.safetensors", {{"u", "F16", {1}, raw(std::vector<uint16_t>{0x3c00})}});
    std::ofstream(d / "model_index.json") << R"({"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.30.0",
      "vae": ["diffusers", "AutoencoderKL"], "text_encoder": ["transformers", "CLIPTextModel"],
      "safety_checker": [null, null], "requires_safety_checker": false})";
    EXPECT_TRUE(WeightIndex::open(d / "vae").contains("x"));           // fp16 variant preferred
    EXPECT_TRUE(WeightIndex::open(d / "text_encoder").contains("t"));  // non-variant preferred
    EXPECT_THROW(WeightIndex::open(d), Error);                          // pipeline root: pick a component
    std::string cls;
    auto comps = list_pipeline_components(d, &cls);
    EXPECT_EQ(cls, "StableDiffusionPipeline");
    ASSERT_EQ(comps.size(), 2u);
    EXPECT_EQ(comps[0].name, "vae");
    EXPECT_EQ(comps[0].class_name, "AutoencoderKL");
    EXPECT_EQ(comps[1].library, "transformers");
    EXPECT_EQ(comps[1].folder, d / "text_encoder");
    EXPECT_TRUE(is_pipeline_folder(d));
    EXPECT_FALSE(is_pipeline_folder(d / "vae"));
    EXPECT_THROW(WeightIndex::open(d / "missing"), Error);
    fs::remove_all(d);
}

namespace {

// Builds a GGUF with ggml's writer: tensors given in ggml ne order.
struct GgufBuilder {
    gguf_context* g = gguf_init_empty();
    ggml_context* ctx;
    GgufBuilder() {
        ggml_init_params ip{64 << 20, nullptr, false};
        ctx = ggml_init(ip);
    }
    ~GgufBuilder() {
        gguf_free(g);
        ggml_free(ctx);
    }
    ggml_tensor* add(const char* name, ggml_type t, std::vector<int64_t> ne) {
        ggml_tensor* x = ggml_new_tensor(ctx, t, (int)ne.size(), ne.data());
        ggml_set_name(x, name);
        gguf_add_tensor(g, x);
        return x;
    }
    void write(const fs::path& p) { ASSERT_TRUE(gguf_write_to_file(g, p.c_str(), false)); }
};

}  // namespace

TEST(IoGguf, MetadataShapesQuantisedReadAndConvert) {
    auto d = tmpdir("gguf");
    GgufBuilder b;
    gguf_set_val_str(b.g, "general.architecture", "flux");
    gguf_set_val_u32(b.g, "test.u32", 4000000000u);
    gguf_set_val_i8(b.g, "test.i8", -3);
    gguf_set_val_f32(b.g, "test.f32", 0.5f);
    gguf_set_val_f64(b.g, "test.f64", -0.25);
    gguf_set_val_bool(b.g, "test.bool", true);
    gguf_set_val_u64(b.g, "test.u64", 1ull << 40);
    const char* toks[] = {"<s>", "hello", "\xc3\xa9t\xc3\xa9"};
    gguf_set_arr_str(b.g, "tokenizer.ggml.tokens", toks, 3);
    const int32_t ints[] = {1, -2, 3};
    gguf_set_arr_data(b.g, "test.ints", GGUF_TYPE_INT32, ints, 3);
    const float fl[] = {0.5f, 1.5f};
    gguf_set_arr_data(b.g, "test.floats", GGUF_TYPE_FLOAT32, fl, 2);

    // F32 tensor ne {4, 3, 2} = PyTorch [2, 3, 4]; values i * 0.5
    ggml_tensor* a = b.add("a", GGML_TYPE_F32, {4, 3, 2});
    for (int i = 0; i < 24; ++i) ((float*)a->data)[i] = i * 0.5f;
    // PyTorch [3, 1, 8]: the inner 1 stays (ggml's writer drops only trailing ne == 1).
    ggml_tensor* one = b.add("one", GGML_TYPE_F16, {8, 1, 3});
    for (int i = 0; i < 24; ++i) ((ggml_fp16_t*)one->data)[i] = ggml_fp32_to_fp16((float)i);
    // Q8_0 tensor, 2 rows of 64, quantised from a ramp
    std::vector<float> src(128);
    for (int i = 0; i < 128; ++i) src[i] = std::sin(i * 0.1f);
    ggml_tensor* q = b.add("q", GGML_TYPE_Q8_0, {64, 2});
    ggml_quantize_chunk(GGML_TYPE_Q8_0, src.data(), q->data, 0, 2, 64, nullptr);
    ggml_tensor* ii = b.add("ids", GGML_TYPE_I32, {3});
    ((int32_t*)ii->data)[0] = 7; ((int32_t*)ii->data)[1] = -8; ((int32_t*)ii->data)[2] = 9;
    b.write(d / "m.gguf");

    auto wi = WeightIndex::open(d / "m.gguf");
    EXPECT_EQ(wi.files()[0].format, "gguf");
    const auto& m = wi.metadata();
    EXPECT_EQ(m.at("general.architecture").s, "flux");
    EXPECT_EQ(m.at("test.u32").kind, MetaValue::Kind::Int);
    EXPECT_EQ(m.at("test.u32").i, 4000000000ll);
    EXPECT_EQ(m.at("test.i8").i, -3);
    EXPECT_EQ(m.at("test.f32").f, 0.5);
    EXPECT_EQ(m.at("test.f64").f, -0.25);
    EXPECT_TRUE(m.at("test.bool").b);
    EXPECT_EQ(m.at("test.u64").i, 1ll << 40);
    EXPECT_EQ(m.at("tokenizer.ggml.tokens").kind, MetaValue::Kind::StringArray);
    EXPECT_EQ(m.at("tokenizer.ggml.tokens").sa, (std::vector<std::string>{"<s>", "hello", "\xc3\xa9t\xc3\xa9"}));
    EXPECT_EQ(m.at("test.ints").ia, (std::vector<int64_t>{1, -2, 3}));
    EXPECT_EQ(m.at("test.floats").fa, (std::vector<double>{0.5, 1.5}));

    const TensorInfo* ta = wi.find("a");
    ASSERT_NE(ta, nullptr);
    EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3, 4}));
    EXPECT_EQ(ta->ggml_ne(), (std::array<int64_t, 4>{4, 3, 2, 1}));
    EXPECT_EQ(ta->dtype, DType::Ggml);
    EXPECT_EQ(ta->gtype, GGML_TYPE_F32);
    auto av = wi.read_f32(*ta);
    for (int i = 0; i < 24; ++i) EXPECT_EQ(av[i], i * 0.5f);
    EXPECT_EQ(ta->offset % 32, 0u);  // GGUF default alignment
    EXPECT_EQ(wi.find("one")->shape, (std::vector<int64_t>{3, 1, 8}));
    EXPECT_EQ(wi.read_f32(*wi.find("one"))[7], 7.0f);
    EXPECT_EQ(wi.read_i64(*wi.find("ids")), (std::vector<int64_t>{7, -8, 9}));

    const TensorInfo* tq = wi.find("q");
    EXPECT_EQ(tq->shape, (std::vector<int64_t>{2, 64}));
    EXPECT_EQ(tq->nbytes, 2 * 2 * 34u);  // 2 rows x 2 blocks x 34 bytes (Q8_0)
    auto qv = wi.read_f32(*tq);
    // Q8_0 keeps 8 bits per value with one f16 scale per 32: error below max|x|/127 per block.
    for (int i = 0; i < 128; ++i) EXPECT_NEAR(qv[i], src[i], 1.0f / 127 + 1e-3f);

    ggml_init_params ip{1 << 20, nullptr, false};
    ggml_context* ctx = ggml_init(ip);
    // quantised -> same type: raw copy
    ggml_tensor* q2 = ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, 64, 2);
    wi.load_into(*tq, q2);
    EXPECT_EQ(std::memcmp(q2->data, wi.bytes(*tq).data(), tq->nbytes), 0);
    // quantised -> F16 dequantises
    ggml_tensor* h = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 64, 2);
    wi.load_into(*tq, h);
    for (int i = 0; i < 128; ++i) EXPECT_EQ(ggml_fp16_to_fp32(((ggml_fp16_t*)h->data)[i]), ggml_fp16_to_fp32(ggml_fp32_to_fp16(qv[i])));
    // quantised -> another quantised type is refused
    ggml_tensor* q4 = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 64, 2);
    EXPECT_THROW(wi.load_into(*tq, q4), Error);
    // Shape mismatch against a quantised destination is an error, not an assert.
    ggml_tensor* a4 = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 32, 2);
    EXPECT_THROW(wi.load_into(*ta, a4), Error);
    fs::remove_all(d);
    ggml_free(ctx);
}

TEST(IoLoad, QuantiseFromSafetensorsMatchesGgml) {
    auto d = tmpdir("quant");
    std::vector<float> v(256 * 4);
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0, 1);
    for (auto& x : v) x = nd(rng);
    std::vector<uint16_t> bf(v.size());
    for (size_t i = 0; i < v.size(); ++i) bf[i] = ggml_fp32_to_bf16(v[i]).bits;
    write_st(d / "w.safetensors", {{"w", "BF16", {4, 256}, raw(bf)}});
    auto wi = WeightIndex::open(d / "w.safetensors");
    const auto src = wi.read_f32(*wi.find("w"));
    ggml_init_params ip{1 << 20, nullptr, false};
    ggml_context* ctx = ggml_init(ip);
    for (ggml_type qt : {GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0}) {
        ggml_tensor* q = ggml_new_tensor_2d(ctx, qt, 256, 4);
        wi.load_into(*wi.find("w"), q);
        std::vector<uint8_t> expect(ggml_nbytes(q));
        ggml_quantize_chunk(qt, src.data(), expect.data(), 0, 4, 256, nullptr);
        EXPECT_EQ(std::memcmp(q->data, expect.data(), expect.size()), 0) << ggml_type_name(qt);
        std::vector<float> back(v.size());
        ggml_get_type_traits(qt)->to_float(q->data, back.data(), back.size());
        double err = 0, ref = 0;
        for (size_t i = 0; i < v.size(); ++i) {
            err += (back[i] - src[i]) * (back[i] - src[i]);
            ref += src[i] * src[i];
        }
        EXPECT_LT(std::sqrt(err / ref), 0.12) << ggml_type_name(qt);  // Q4_K ~ 0.07, Q8_0 ~ 0.004
    }
    ggml_tensor* iq = ggml_new_tensor_2d(ctx, GGML_TYPE_IQ2_XXS, 256, 4);
    EXPECT_THROW(wi.load_into(*wi.find("w"), iq), Error);  // needs an importance matrix
    ggml_free(ctx);
    fs::remove_all(d);
}

TEST(IoWeightIndex, OpenMemoryMatchesFile) {
    const std::string p = std::string(EASEL_TEST_DATA) + "/reference/clip_text_sd15_tiny.safetensors";
    std::ifstream f(p, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
    auto a = WeightIndex::open(p);
    auto b = WeightIndex::open_memory(bytes, "clip.safetensors");
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    for (size_t i = 0; i < a.tensors().size(); ++i) {
        EXPECT_EQ(a.tensors()[i].name, b.tensors()[i].name);
        EXPECT_EQ(a.read_f32(a.tensors()[i]), b.read_f32(b.tensors()[i]));
    }
    EXPECT_THROW(WeightIndex::open_memory(std::vector<uint8_t>{}, "empty"), Error);
}
