// Binding a Block tree to weight files: TensorSource (prefix, renames, mapper, row slices,
// transposes), check_binding's one-line report, choose_param_type, ParamBuffer::load.
#include "core/error.h"
#include "io/weight_index.h"
#include "nn/layers.h"
#include "runtime/graph_runner.h"

#include <ggml-cpu.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

using namespace easel;

namespace {

struct T {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
    std::string dtype = "F32";
};

// Writes a safetensors file (F32 / I64 tensors) by hand.
std::filesystem::path write_safetensors(const std::string& file, const std::vector<T>& ts) {
    auto path = std::filesystem::temp_directory_path() / file;
    std::string header = "{";
    std::vector<uint8_t> data;
    for (size_t i = 0; i < ts.size(); ++i) {
        size_t begin = data.size();
        if (ts[i].dtype == "F32") {
            data.resize(begin + ts[i].data.size() * 4);
            std::memcpy(data.data() + begin, ts[i].data.data(), ts[i].data.size() * 4);
        } else {  // I64
            for (float v : ts[i].data) {
                int64_t x = (int64_t)v;
                data.resize(data.size() + 8);
                std::memcpy(data.data() + data.size() - 8, &x, 8);
            }
        }
        std::string shape;
        for (size_t d = 0; d < ts[i].shape.size(); ++d) shape += std::string(d ? "," : "") + std::to_string(ts[i].shape[d]);
        header += fmt::format("{}\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", i ? "," : "", ts[i].name,
                              ts[i].dtype, shape, begin, data.size());
    }
    header += "}";
    while (header.size() % 8) header += ' ';
    std::ofstream f(path, std::ios::binary);
    uint64_t n = header.size();
    f.write((const char*)&n, 8);
    f.write(header.data(), (std::streamsize)header.size());
    f.write((const char*)data.data(), (std::streamsize)data.size());
    return path;
}

std::vector<float> iota(size_t n, float start = 0) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = start + (float)i;
    return v;
}

std::vector<float> get(const nn::Param* p) {
    std::vector<float> v((size_t)ggml_nelements(p->tensor));
    EXPECT_EQ(p->tensor->type, GGML_TYPE_F32);
    ggml_backend_tensor_get(p->tensor, v.data(), 0, v.size() * 4);
    return v;
}

struct Attn : nn::Block {
    explicit Attn(int64_t d) {
        q = &add<nn::Linear>("q_proj", d, d);
        k = &add<nn::Linear>("k_proj", d, d);
        v = &add<nn::Linear>("v_proj", d, d);
    }
    nn::Linear *q, *k, *v;
};

}  // namespace

TEST(NnBinding, ReportsMissingUnexpectedMisshaped) {
    auto path = write_safetensors("easel_nn_binding_report.safetensors",
                                  {{"model.q_proj.weight", {2, 2}, iota(4)},
                                   {"model.q_proj.bias", {2}, iota(2)},
                                   {"model.k_proj.weight", {2, 3}, iota(6)},  // mis-shaped
                                   {"model.k_proj.bias", {2}, iota(2)},
                                   {"model.extra.weight", {1}, iota(1)},      // unexpected
                                   {"model.position_ids", {2}, iota(2), "I64"},  // ignored by suffix
                                   {"other.weight", {1}, iota(1)}});          // outside the prefix
    auto idx = io::WeightIndex::open(path);
    Attn a(2);  // v_proj missing
    nn::TensorSource src(idx, "model.");
    nn::LoadOptions opt;
    opt.ignore_unexpected_suffixes = {"position_ids"};
    std::string m = nn::check_binding(a, src, opt);
    EXPECT_NE(m.find("2 missing (model.v_proj.weight, model.v_proj.bias)"), std::string::npos) << m;
    EXPECT_NE(m.find("1 mis-shaped (model.k_proj.weight: file [2, 3] vs model [2, 2])"), std::string::npos) << m;
    EXPECT_NE(m.find("1 unexpected (model.extra.weight)"), std::string::npos) << m;
    EXPECT_EQ(m.find("position_ids"), std::string::npos) << m;
    EXPECT_EQ(m.find("other.weight"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos);
    try {
        nn::ParamBuffer::load(a, src, ggml_backend_cpu_buffer_type(), opt);
        FAIL() << "load should throw";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::ModelMismatch);
        EXPECT_EQ(std::string(e.what()), m);
    }
    std::filesystem::remove(path);
}

TEST(NnBinding, FusedQkvSliceTransposeAndMapper) {
    // OpenCLIP-style: in_proj_weight [3D, D] and in_proj_bias [3D] hold q, k, v stacked by rows.
    const int64_t D = 3;
    auto fused_w = iota(3 * D * D, 100);  // row r = {100+3r, 101+3r, 102+3r}
    auto fused_b = iota(3 * D, -5);
    auto path = write_safetensors("easel_nn_binding_fused.safetensors",
                                  {{"m.attn.in_proj_weight", {3 * D, D}, fused_w},
                                   {"m.attn.in_proj_bias", {3 * D}, fused_b},
                                   {"m.proj", {D, 2}, iota(2 * D, 7)}});
    auto idx = io::WeightIndex::open(path);
    struct M : nn::Block {
        M() {
            attn = &add<Attn>("self_attn", 3);
            text_projection = &add<nn::Linear>("text_projection", 3, 2, false);
        }
        Attn* attn;
        nn::Linear* text_projection;
    } m;
    nn::TensorSource src(idx, "m.");
    const char* names[3] = {"q_proj", "k_proj", "v_proj"};
    for (int i = 0; i < 3; ++i) {
        src.slice_rows(fmt::format("self_attn.{}.weight", names[i]), "m.attn.in_proj_weight", i * D, (i + 1) * D);
        src.slice_rows(fmt::format("self_attn.{}.bias", names[i]), "m.attn.in_proj_bias", i * D, (i + 1) * D);
    }
    src.transpose("text_projection.weight", "m.proj");
    EXPECT_EQ(nn::check_binding(m, src), "");
    auto pb = nn::ParamBuffer::load(m, src, ggml_backend_cpu_buffer_type());
    for (int i = 0; i < 3; ++i) {
        Attn& a = *m.attn;
        nn::Linear* l = i == 0 ? a.q : i == 1 ? a.k : a.v;
        EXPECT_EQ(get(l->w), std::vector<float>(fused_w.begin() + i * D * D, fused_w.begin() + (i + 1) * D * D)) << names[i];
        EXPECT_EQ(get(l->b), std::vector<float>(fused_b.begin() + i * D, fused_b.begin() + (i + 1) * D)) << names[i];
    }
    // stored [3, 2] = {{7,8},{9,10},{11,12}} -> Linear weight [2, 3] = {{7,9,11},{8,10,12}}
    EXPECT_EQ(get(m.text_projection->w), (std::vector<float>{7, 9, 11, 8, 10, 12}));

    // a slice past the end is reported, not read out of bounds
    nn::TensorSource bad(idx, "m.");
    bad.set_mapper([](const std::string& c) { return c == "text_projection.weight" ? std::string() : std::string(); });
    for (int i = 0; i < 3; ++i) {
        bad.slice_rows(fmt::format("self_attn.{}.weight", names[i]), "m.attn.in_proj_weight", i * D + 1, (i + 1) * D + 1);
        bad.slice_rows(fmt::format("self_attn.{}.bias", names[i]), "m.attn.in_proj_bias", i * D, (i + 1) * D);
    }
    bad.rename("text_projection.weight", "m.proj");
    std::string msg = nn::check_binding(m, bad);
    EXPECT_NE(msg.find("mis-shaped"), std::string::npos) << msg;
    EXPECT_NE(msg.find("in_proj_weight[rows 7:10]"), std::string::npos) << msg;
    std::filesystem::remove(path);
}

TEST(NnBinding, MapperSqueezeAndForward) {
    // a mapper renames every key; a [2, 3, 1, 1] stored kernel binds to a [2, 3] Linear (size-1 dims)
    auto path = write_safetensors("easel_nn_binding_mapper.safetensors",
                                  {{"enc.lin.w", {2, 3, 1, 1}, {1, 2, 3, 4, 5, 6}}, {"enc.lin.b", {2}, {0.5f, -1.0f}}});
    auto idx = io::WeightIndex::open(path);
    nn::Linear lin(3, 2);
    nn::TensorSource src(idx, "enc.");
    src.set_mapper([](const std::string& c) { return c == "weight" ? "lin.w" : c == "bias" ? "lin.b" : ""; });
    EXPECT_EQ(src.stored_name("weight"), "enc.lin.w");
    runtime::GraphRunner run(nullptr, 1);
    auto pb = nn::ParamBuffer::load(lin, src, run.buffer_type());
    EXPECT_GT(pb.size(), 0u);
    std::vector<float> x = {1, 0, -1};
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        return std::vector<ggml_tensor*>{lin.forward(c, g.input_f32("x", {3}, x))};
    });
    EXPECT_EQ(out[0].data, (std::vector<float>{-1.5f, -3.0f}));
    std::filesystem::remove(path);
}

TEST(NnBinding, ChooseParamType) {
    io::TensorInfo f32;
    f32.shape = {64, 64};
    f32.dtype = io::DType::F32;
    f32.gtype = GGML_TYPE_F32;
    io::TensorInfo f16 = f32;
    f16.dtype = io::DType::F16;
    f16.gtype = GGML_TYPE_F16;
    io::TensorInfo q8 = f32;
    q8.dtype = io::DType::Ggml;
    q8.gtype = GGML_TYPE_Q8_0;
    io::TensorInfo f8 = f32;
    f8.dtype = io::DType::F8_E4M3;
    f8.gtype = GGML_TYPE_COUNT;
    nn::LoadOptions def, to_q4;
    to_q4.weight_type = GGML_TYPE_Q4_0;
    using R = nn::ParamRole;
    EXPECT_EQ(nn::choose_param_type(R::Weight, f16, def), GGML_TYPE_F16);
    EXPECT_EQ(nn::choose_param_type(R::Weight, q8, def), GGML_TYPE_Q8_0);
    EXPECT_EQ(nn::choose_param_type(R::Weight, f8, def), GGML_TYPE_F16);
    EXPECT_EQ(nn::choose_param_type(R::Weight, f32, to_q4), GGML_TYPE_Q4_0);
    EXPECT_EQ(nn::choose_param_type(R::Embedding, q8, def), GGML_TYPE_Q8_0);
    EXPECT_EQ(nn::choose_param_type(R::Norm, f16, def), GGML_TYPE_F32);
    EXPECT_EQ(nn::choose_param_type(R::Bias, q8, def), GGML_TYPE_F32);
    EXPECT_EQ(nn::choose_param_type(R::ConvWeight, f32, def), GGML_TYPE_F32);
    EXPECT_EQ(nn::choose_param_type(R::ConvWeight, q8, def), GGML_TYPE_F16);
    EXPECT_EQ(nn::choose_param_type(R::ConvWeight, f32, to_q4), GGML_TYPE_F16);
    // rows of 40 are not whole Q4_0 blocks (32): keep a float type
    io::TensorInfo odd = f32;
    odd.shape = {8, 40};
    EXPECT_EQ(nn::choose_param_type(R::Weight, odd, to_q4), GGML_TYPE_F32);
}
