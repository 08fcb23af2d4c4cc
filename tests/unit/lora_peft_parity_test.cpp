// LoHa, LoKr and DoRA against peft (issue 21): tests/data/reference/lora/module_refs.safetensors
// (tools/reference/make_lora_refs.py) holds one Linear(16, 12) (base.weight, base.bias), an input x
// [5, 16] and, per adapter kind, the adapter in LyCORIS / kohya naming ("loha.m.hada_w1_a",
// "lokr.m.lokr_w1", "dora.m.lora_A.weight", "dora.m.lora_magnitude_vector.weight", "<kind>.m.alpha")
// and peft's output y [5, 12] of the adapted layer. Easel's LoRA code reads the file as any LoRA
// (lora::LoraFile), and lora::ComponentPatches - the object the families register - gives the
// layer's output merged into the weight and, where easel runs the kind at run time, as the term
// nn::weight_matmul adds. Both must equal peft's y.
#include "lora/apply.h"
#include "lora/lora_file.h"
#include "runtime/graph_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>

using namespace easel;
using namespace easel::lora;

namespace {

const std::filesystem::path kRefs = std::filesystem::path(EASEL_TEST_DATA) / "reference" / "lora" / "module_refs.safetensors";
constexpr int64_t kIn = 16, kOut = 12, kRows = 5;

std::vector<float> tensor(const LoraFile& f, const std::string& name) {
    const io::TensorInfo* t = f.index().find(name);
    if (!t) throw std::runtime_error(std::string("module_refs.safetensors has no ") + name);
    return f.index().read_f32(*t);
}

// x W^T + b: x [rows, in], W [out, in]
std::vector<float> linear(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b) {
    std::vector<float> y((size_t)(kRows * kOut));
    for (int64_t r = 0; r < kRows; ++r)
        for (int64_t o = 0; o < kOut; ++o) {
            double acc = b[(size_t)o];
            for (int64_t i = 0; i < kIn; ++i) acc += (double)x[(size_t)(r * kIn + i)] * w[(size_t)(o * kIn + i)];
            y[(size_t)(r * kOut + o)] = (float)acc;
        }
    return y;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, (double)std::fabs(a[i] - b[i]));
    return m;
}

struct Adapter {
    std::shared_ptr<const LoraFile> file;
    size_t patch = 0;
};

Adapter adapter(const std::string& kind) {
    auto f = std::make_shared<const LoraFile>(LoraFile::open(kRefs));
    const auto& ps = f->parsed().patches;
    for (size_t i = 0; i < ps.size(); ++i)
        if (ps[i].module == kind + ".m") return {f, i};
    throw std::runtime_error(std::string("module_refs.safetensors has no patch ") + kind + ".m");
}

const Target kTarget{"m.weight", {kOut, kIn}, "m.bias"};

/// The layer's output with the adapter merged into W (m = 1: peft's adapter at scale 1).
std::vector<float> merged_output(const Adapter& a) {
    ComponentPatches cp(ApplyMode::Immediately, "test");
    cp.add(a.file, a.patch, kTarget, {{0, {0, kOut, 0}}}, 1.0f);
    std::vector<float> w = tensor(*a.file, "base.weight");
    EXPECT_EQ(cp.how("m.weight", nn::ParamRole::Weight, GGML_TYPE_F32, false), nn::WeightPatches::How::Merge);
    cp.merge("m.weight", w);
    return linear(tensor(*a.file, "x"), w, tensor(*a.file, "base.bias"));
}

/// The layer's output with the adapter as the run-time term (--lora-apply-mode at_runtime).
std::vector<float> runtime_output(const Adapter& a) {
    ComponentPatches cp(ApplyMode::AtRuntime, "test");
    cp.add(a.file, a.patch, kTarget, {{0, {0, kOut, 0}}}, 1.0f);
    EXPECT_EQ(cp.how("m.weight", nn::ParamRole::Weight, GGML_TYPE_F32, false), nn::WeightPatches::How::Runtime);
    const auto uts = cp.runtime_tensors("m.weight");
    const auto x = tensor(*a.file, "x"), w = tensor(*a.file, "base.weight"), b = tensor(*a.file, "base.bias");
    runtime::GraphRunner run(nullptr, 1);
    std::unique_ptr<nn::RuntimeUpdate> u;
    auto out = run.run([&](runtime::GraphBuilder& g) {
        std::vector<ggml_tensor*> ts;
        for (size_t i = 0; i < uts.size(); ++i) {
            std::string name = "u";
            name += std::to_string(i);
            ts.push_back(g.input_f32(name, {uts[i].ne[0], uts[i].ne[1], uts[i].ne[2], uts[i].ne[3]}, uts[i].data));
        }
        u = cp.runtime("m.weight", ts);
        ggml_context* c = g.ctx();
        ggml_tensor* X = g.input_f32("x", {kIn, kRows}, x);
        ggml_tensor* y = ggml_mul_mat(c, g.input_f32("w", {kIn, kOut}, w), X);
        y = u->apply(c, X, y, 0, kOut, true);
        return std::vector<ggml_tensor*>{ggml_add(c, y, g.input_f32("b", {kOut}, b))};
    });
    return out[0].data;
}

}  // namespace

// LoHa (r 4, alpha 2: scale 0.5): (w1a w1b) * (w2a w2b) * 0.5, merged and as a dense run-time term.
TEST(LoraPeftParity, LoHaEqualsPeft) {
    const Adapter a = adapter("loha");
    EXPECT_EQ(a.file->parsed().patches[a.patch].kind, PatchKind::LoHa);
    const auto want = tensor(*a.file, "loha.y");
    const double em = max_diff(merged_output(a), want), er = max_diff(runtime_output(a), want);
    std::printf("[peft parity] LoHa: merged max abs diff %.3g, run time %.3g\n", em, er);
    EXPECT_LT(em, 1e-5);
    EXPECT_LT(er, 1e-5);
    EXPECT_GT(max_diff(linear(tensor(*a.file, "x"), tensor(*a.file, "base.weight"), tensor(*a.file, "base.bias")), want), 0.05);
}

// LoKr (w1 whole, w2 = w2_a w2_b of rank 1, alpha 2: scale 2): kron(w1, w2) * 2, merged and as the
// Kronecker term (never formed) at run time.
TEST(LoraPeftParity, LoKrEqualsPeft) {
    const Adapter a = adapter("lokr");
    EXPECT_EQ(a.file->parsed().patches[a.patch].kind, PatchKind::LoKr);
    const auto want = tensor(*a.file, "lokr.y");
    const double em = max_diff(merged_output(a), want), er = max_diff(runtime_output(a), want);
    std::printf("[peft parity] LoKr: merged max abs diff %.3g, run time %.3g\n", em, er);
    EXPECT_LT(em, 1e-5);
    EXPECT_LT(er, 1e-5);
    EXPECT_GT(max_diff(linear(tensor(*a.file, "x"), tensor(*a.file, "base.weight"), tensor(*a.file, "base.bias")), want), 0.05);
}

// DoRA (PEFT use_dora, r 4, lora_alpha 8; magnitude [12] per output row): W' = g * V / ||V||_row with
// V = W + 2 B A. Easel merges DoRA weights in every mode (it rescales W), so at_runtime asks Merge too.
TEST(LoraPeftParity, DoraEqualsPeft) {
    const Adapter a = adapter("dora");
    const Patch& p = a.file->parsed().patches[a.patch];
    EXPECT_EQ(p.kind, PatchKind::LoRA);
    EXPECT_FALSE(p.dora_scale.empty());
    const auto want = tensor(*a.file, "dora.y");
    const double em = max_diff(merged_output(a), want);
    std::printf("[peft parity] DoRA: merged max abs diff %.3g\n", em);
    EXPECT_LT(em, 1e-5);
    ComponentPatches rt(ApplyMode::AtRuntime, "test");
    rt.add(a.file, a.patch, kTarget, {{0, {0, kOut, 0}}}, 1.0f);
    EXPECT_EQ(rt.how("m.weight", nn::ParamRole::Weight, GGML_TYPE_F32, false), nn::WeightPatches::How::Merge);
    EXPECT_GT(max_diff(linear(tensor(*a.file, "x"), tensor(*a.file, "base.weight"), tensor(*a.file, "base.bias")), want), 0.05);
}
