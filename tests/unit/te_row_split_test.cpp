// --split-mode row of the text encoders on ggml's meta device (placement/row_split.h): Qwen3
// (models/qwen3/qwen3_row_split.h: grouped-query attention, K/V split on kv heads with the query
// heads in groups, or mirrored with one kv head) and T5 (models/t5/t5_row_split.h: the relative
// position bias table split on heads). The tiny fixtures run with their blocks row split over two
// CPU devices and over two easel rpc-servers on 127.0.0.1, against the same module on one CPU
// device and against transformers' outputs; then through the families (Z-Image's and FLUX.2
// Klein's Qwen3 te, FLUX.1's T5 te) with `--backend te=RPC0&RPC1 --split-mode te=row`, against
// the same family without placement. F32 weights: a row split only reorders the partial sums of
// the row-role matmuls (and of ggml's all-reduce), so differences are ~1e-7. Each device's
// measured peak is compared with the plan's prediction.
#include "core/error.h"
#include "io/weight_index.h"
#include "models/family.h"
#include "models/qwen3/qwen3.h"
#include "models/qwen3/qwen3_row_split.h"
#include "models/t5/t5_encoder.h"
#include "models/t5/t5_row_split.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "placement/row_split.h"
#include "placement/spec.h"
#include "runtime/sequence_runner.h"
#include "row_split_test_support.h"
#include "rpc_servers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

using namespace easel;
using placement::PModule;
using placement::RowRole;
namespace q3 = easel::models::qwen3;

namespace {

const std::filesystem::path kRef = std::filesystem::path(EASEL_TEST_DATA) / "reference";
constexpr double kMiB = 1024.0 * 1024.0;

/// Two easel rpc-servers serving the CPU (tests/unit/rpc_servers.h).
easel::test_support::RpcServers& rpc() {
    static easel::test_support::RpcServers s(2);
    return s;
}

using test_support::max_abs_diff;
using test_support::run_planned;
using test_support::RunResult;

/// |measured - predicted| within 10% of the prediction (issues 5 and 9). The plan's all-reduce
/// staging is the largest partial sum of the blocks' graph (ModuleCosts::row_split_partial_bytes),
/// as the runtime measures it; before, it was bounded by the state between blocks, which holds T5's
/// position bias and Qwen3's mask too (T5 tiny's second RPC device was 11 KiB under a 97 KiB
/// prediction).
bool near(double m, double p) { return std::fabs(m - p) <= 0.1 * p; }

/// Each device's measured peak near its prediction (a device named twice, CPU&CPU, holds both
/// shares).
void check_peaks(const RunResult& row, const std::string& what) {
    std::map<std::string, uint64_t> predicted;
    for (auto& u : row.plan.devices) predicted[u.device] += u.total();
    for (auto& [d, bytes] : predicted) {
        ASSERT_TRUE(row.peaks.count(d)) << what << ": " << d;
        const double m = (double)row.peaks.at(d), p = (double)bytes;
        std::printf("[te row split] %s: %s measured peak %.4f MiB, predicted %.4f MiB (%.1f%%)\n", what.c_str(), d.c_str(), m / kMiB,
                    p / kMiB, 100.0 * (m - p) / p);
        EXPECT_TRUE(near(m, p)) << what << " on " << d << ": measured " << m << " predicted " << p;
    }
}

// ---------------------------------------------------------------- Qwen3 (tests/data/reference/qwen3_text_tiny)

/// transformers' Qwen3Model in miniature: 4 query heads / 2 kv heads of 16, hidden 32, 4 layers;
/// two prompts of 16 tokens, the second right-padded (attention mask).
struct QCase {
    io::WeightIndex idx = io::WeightIndex::open(kRef / "qwen3_text_tiny.safetensors");
    q3::Qwen3Keys keys = *q3::find_qwen3(idx);
    q3::Qwen3Config cfg = q3::infer_config(idx, keys);
    q3::Qwen3Model net{cfg};
    nn::TensorSource src = q3::make_tensor_source(idx, keys, cfg);
    std::vector<int32_t> ids, mask01, pos;
    std::vector<float> mask, expected;
    int64_t B = 0, L = 0;
    QCase() {
        const io::TensorInfo* t = idx.find("__input__.input_ids");
        const io::TensorInfo* m = idx.find("__input__.attention_mask");
        B = t->shape[0];
        L = t->shape[1];
        for (auto x : idx.read_i64(*t)) ids.push_back((int32_t)x);
        for (auto x : idx.read_i64(*m)) mask01.push_back((int32_t)x);
        mask = q3::attention_mask(mask01, L, B);
        pos = q3::positions(L);
        expected = idx.read_f32(*idx.find("__output__.last_hidden_state"));
    }
    nn::LoadOptions opt() const {
        nn::LoadOptions lo = q3::default_load_options(keys, cfg, idx);
        lo.check_unexpected = false;
        return lo;
    }
};

using QRunner = runtime::SequenceRunner<q3::Qwen3Inputs, q3::Qwen3State, q3::Qwen3Outputs>;

RunResult run_qwen3(QCase& q, const std::vector<std::string>& devices, placement::SplitMode mode, bool flash = true) {
    QRunner r(q.net, q.net, q.src, q.opt(), 2, flash);
    r.set_row_split(q3::qwen3_row_split_rules(q.net, flash));
    auto mk = [&](runtime::GraphBuilder& g) {
        q3::Qwen3Inputs in;
        in.ids = g.input_i32("ids", {q.L, q.B}, q.ids);
        in.mask = g.input_f32("mask", {q.L, q.L, 1, q.B}, q.mask);
        in.pos = g.input_i32("pos", {q.L}, q.pos);
        return in;
    };
    auto sel = [](q3::Qwen3Outputs& o) { return std::vector<ggml_tensor*>{o.last_hidden_state}; };
    return run_planned(r, PModule::Te, devices, mode, mk, sel, "Qwen3 tiny");
}

void check_qwen3_row_split(const std::vector<std::string>& devs, const char* what) {
    QCase q;
    const auto one = run_qwen3(q, {"CPU"}, placement::SplitMode::Layer);
    const auto row = run_qwen3(q, devs, placement::SplitMode::Row);
    ASSERT_EQ(row.plan.segments.size(), 3u) << placement::format_plan({row.plan});
    EXPECT_TRUE(placement::is_row_split_device(row.plan.segments[1].device));
    EXPECT_EQ(row.plan.segments[1].end, q.net.n_blocks());
    const float d_one = max_abs_diff(row.out, one.out), d_ref = max_abs_diff(row.out, q.expected);
    const float d_one_ref = max_abs_diff(one.out, q.expected);
    std::printf("[te row split] Qwen3 tiny (4 q / 2 kv heads) over %s: max abs diff vs one CPU device %.3g, vs transformers %.3g "
                "(one device vs transformers %.3g)\n%s%s",
                what, d_one, d_ref, d_one_ref, placement::format_plan({row.plan}).c_str(),
                placement::format_peaks({row.plan}, row.peaks).c_str());
    EXPECT_LE(d_one, 1e-5f) << what;
    EXPECT_LT(d_ref, 1e-4f) << what;
    check_peaks(row, std::string("Qwen3 tiny over ") + what);
}

// ---------------------------------------------------------------- T5 (tests/data/reference/t5_encoder_tiny)

/// transformers' T5EncoderModel in miniature: 4 heads of 8, d_model 32, 2 blocks, gated-gelu;
/// one prompt of 24 tokens, no mask (as FLUX.1 runs it).
struct TCase {
    io::WeightIndex idx = io::WeightIndex::open(kRef / "t5_encoder_tiny.safetensors");
    models::t5::T5Keys keys = *models::t5::find_t5_encoder(idx);
    models::t5::T5Config cfg = models::t5::infer_config(idx, keys);
    models::t5::T5Encoder net{cfg};
    nn::TensorSource src = models::t5::make_tensor_source(idx, keys);
    std::vector<int32_t> ids, buckets;
    std::vector<float> expected;
    int64_t L = 0;
    TCase() {
        const io::TensorInfo* t = idx.find("__input__.input_ids");
        for (auto x : idx.read_i64(*t)) ids.push_back((int32_t)x);
        L = t->shape[1];
        buckets = models::t5::relative_position_buckets(L, cfg.num_buckets, cfg.max_distance);
        expected = idx.read_f32(*idx.find("__output__.last_hidden_state"));
    }
    nn::LoadOptions opt() const {
        nn::LoadOptions lo = models::t5::default_load_options(idx, keys);
        lo.check_unexpected = false;
        return lo;
    }
};

using TRunner = runtime::SequenceRunner<models::t5::T5Inputs, models::t5::T5State, models::t5::T5Outputs>;

RunResult run_t5(TCase& t, const std::vector<std::string>& devices, placement::SplitMode mode) {
    TRunner r(t.net, t.net, t.src, t.opt(), 2, false);
    r.set_row_split(models::t5::t5_row_split_rules(t.net));
    auto mk = [&](runtime::GraphBuilder& g) {
        models::t5::T5Inputs in;
        in.ids = g.input_i32("ids", {t.L, 1}, t.ids);
        in.buckets = g.input_i32("buckets", {t.L * t.L}, t.buckets);
        return in;
    };
    auto sel = [](models::t5::T5Outputs& o) { return std::vector<ggml_tensor*>{o.last_hidden_state}; };
    return run_planned(r, PModule::Te, devices, mode, mk, sel, "T5 tiny");
}

void check_t5_row_split(const std::vector<std::string>& devs, const char* what) {
    TCase t;
    const auto one = run_t5(t, {"CPU"}, placement::SplitMode::Layer);
    const auto row = run_t5(t, devs, placement::SplitMode::Row);
    ASSERT_EQ(row.plan.segments.size(), 3u) << placement::format_plan({row.plan});
    EXPECT_TRUE(placement::is_row_split_device(row.plan.segments[1].device));
    const float d_one = max_abs_diff(row.out, one.out), d_ref = max_abs_diff(row.out, t.expected);
    const float d_one_ref = max_abs_diff(one.out, t.expected);
    std::printf("[te row split] T5 tiny (4 heads) over %s: max abs diff vs one CPU device %.3g, vs transformers %.3g "
                "(one device vs transformers %.3g)\n%s%s",
                what, d_one, d_ref, d_one_ref, placement::format_plan({row.plan}).c_str(),
                placement::format_peaks({row.plan}, row.peaks).c_str());
    EXPECT_LE(d_one, 1e-5f) << what;
    EXPECT_LT(d_ref, 1e-4f) << what;
    check_peaks(row, std::string("T5 tiny over ") + what);
}

// ---------------------------------------------------------------- families

std::shared_ptr<const placement::PlacementSpec> spec_of(const std::string& backend, const std::string& split) {
    placement::PlacementFlags f;
    f.backend = "default=CPU," + backend;  // the other modules on the CPU, as the unplaced family
    f.split_mode = split;
    return std::make_shared<placement::PlacementSpec>(placement::parse_placement(f, placement::device_names()));
}

/// The conditioning of two prompts (the te unloaded afterwards: its plan and peaks are kept).
struct TeOut {
    std::vector<float> ctx_pos, ctx_neg, pooled_pos;
};

TeOut encode(const std::string& model_dir, std::shared_ptr<const placement::PlacementSpec> spec, bool flash,
             std::unique_ptr<models::Family>* hold = nullptr) {
    models::ModelFiles files;
    files.model = (kRef / model_dir / "diffusers").string();
    models::FamilyOptions fo;
    fo.threads = 1;
    fo.placement = spec;
    fo.weight_type = "f32";  // F32 matmuls: the split's own rounding only (see the file comment)
    fo.flash_attn_te = flash;
    auto fam = models::open_family(files, fo);
    TeOut o;
    auto pos = fam->encode_prompt("a red cat on a mat", 0);
    auto neg = fam->encode_prompt("blurry", 0);
    o.ctx_pos = pos.context;
    o.ctx_neg = neg.context;
    o.pooled_pos = pos.pooled;
    fam->unload(models::Module::Te);
    if (hold) *hold = std::move(fam);
    return o;
}

/// The family's te plans (FLUX.1: T5 then CLIP-L) and whether each is a row split.
std::vector<bool> te_row_split(const models::Family& fam) {
    std::vector<bool> out;
    for (auto& p : fam.placement_plans()) {
        if (p.module != PModule::Te) continue;
        bool meta = false;
        for (auto& sg : p.segments) meta |= placement::is_row_split_device(sg.device);
        out.push_back(meta);
    }
    return out;
}

/// Every device's measured peak within 10% of the family's predicted per-device peak (near()).
/// Before the plan measured the partial sums (ModuleCosts::row_split_partial_bytes) it charged
/// each member the state between blocks per all-reduce step: with Klein's 512-token mask and
/// FLUX.1's 512-token T5 position bias in that state, the prediction was 1.0 / 3.0 MiB above the
/// measured peaks (Klein -12% / -35%, FLUX.1 -20% / -29%).
void family_peaks(const models::Family& fam, const std::string& what) {
    auto predicted = placement::device_peaks(fam.placement_plans());
    auto measured = fam.placement_peaks();
    for (auto& [d, p] : predicted) {
        ASSERT_TRUE(measured.count(d)) << what << ": no measured peak on " << d;
        const double m = (double)measured.at(d);
        std::printf("[te row split] %s: %s measured peak %.4f MiB, predicted %.4f MiB (%.1f%%)\n", what.c_str(), d.c_str(), m / kMiB,
                    (double)p / kMiB, 100.0 * (m - (double)p) / (double)p);
        EXPECT_TRUE(near(m, (double)p)) << what << " on " << d << ": measured " << m << " predicted " << p;
    }
}

/// `te=A&B --split-mode te=row` through the family vs the unplaced family (same flags).
void check_family_te_row_split(const std::string& model_dir, const std::string& what, size_t n_te, bool flash) {
    auto& r = rpc();
    ASSERT_EQ(r.devices.size(), 2u) << "rpc-servers did not come up";
    const TeOut plain = encode(model_dir, nullptr, flash);
    std::unique_ptr<models::Family> fam;
    const TeOut o = encode(model_dir, spec_of("te=" + r.devices[0] + "&" + r.devices[1], "te=row"), flash, &fam);
    const float d_pos = max_abs_diff(o.ctx_pos, plain.ctx_pos), d_neg = max_abs_diff(o.ctx_neg, plain.ctx_neg);
    std::printf("[te row split] %s te=%s&%s --split-mode te=row: conditioning max abs diff vs the unplaced family %.3g / %.3g\n%s%s",
                what.c_str(), r.devices[0].c_str(), r.devices[1].c_str(), d_pos, d_neg, placement::format_plan(fam->placement_plans()).c_str(),
                placement::format_peaks(fam->placement_plans(), fam->placement_peaks()).c_str());
    EXPECT_LE(d_pos, 1e-5f) << what;
    EXPECT_LE(d_neg, 1e-5f) << what;
    EXPECT_GT(std::max(d_pos, d_neg), 0.0f) << what << ": expected the row split's own rounding, not the layer-split path";
    EXPECT_EQ(o.pooled_pos, plain.pooled_pos) << what;  // FLUX.1's CLIP-L pooled vector (layer split)
    const auto meta = te_row_split(*fam);
    ASSERT_EQ(meta.size(), n_te) << what;
    EXPECT_TRUE(meta[0]) << what << ": the text encoder's plan is not a row split";
    for (size_t i = 1; i < meta.size(); ++i) EXPECT_FALSE(meta[i]) << what << ": CLIP-L has no row-split rules";
    family_peaks(*fam, what);
}

}  // namespace

// ---------------------------------------------------------------- rules

TEST(TeRowSplit, Qwen3RulesSplitKvHeadsWithTheirQueryGroups) {
    QCase q;
    ASSERT_EQ(q.cfg.heads, 4);
    ASSERT_EQ(q.cfg.kv_heads, 2);
    auto r = q3::qwen3_row_split_rules(q.net, true);
    ASSERT_TRUE(r->why_not.empty()) << r->why_not;
    auto rule = [&](const std::string& n) { return r->rule(n); };
    // 2 query heads per kv head: q_proj / o_proj on groups of 2 x 16 features, k/v on kv heads of 16
    EXPECT_EQ(rule("layers.2.self_attn.q_proj.weight").role, RowRole::Column);
    EXPECT_EQ(rule("layers.2.self_attn.q_proj.weight").granule, 32);
    EXPECT_EQ(rule("layers.2.self_attn.o_proj.weight").role, RowRole::Row);
    EXPECT_EQ(rule("layers.2.self_attn.o_proj.weight").granule, 32);
    for (const char* n : {"k_proj", "v_proj"}) {
        EXPECT_EQ(rule(std::string("layers.0.self_attn.") + n + ".weight").role, RowRole::Column) << n;
        EXPECT_EQ(rule(std::string("layers.0.self_attn.") + n + ".weight").granule, 16) << n;
    }
    EXPECT_EQ(rule("layers.1.mlp.gate_proj.weight").role, RowRole::Column);
    EXPECT_EQ(rule("layers.1.mlp.up_proj.weight").role, RowRole::Column);
    EXPECT_EQ(rule("layers.1.mlp.down_proj.weight").role, RowRole::Row);
    for (const char* n : {"layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight", "layers.0.input_layernorm.weight",
                          "layers.0.post_attention_layernorm.weight", "embed_tokens.weight", "norm.weight"})
        EXPECT_EQ(rule(n).role, RowRole::Mirror) << n;
    EXPECT_EQ(r->by_param.size(), 4u * 7u);
    // the kv heads bound the device count: 2 kv heads -> at most 2 devices
    EXPECT_EQ(r->max_devices, 2);
    EXPECT_NE(r->max_devices_param.find("_proj.weight"), std::string::npos) << r->max_devices_param;
    // the meta split state of layer 0's q_proj over 2 devices (ggml ne {32, 64}): 32 output rows each
    ggml_init_params ip{ggml_tensor_overhead() * 4, nullptr, true};
    ggml_context* ctx = ggml_init(ip);
    ggml_tensor* wq = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 64);
    ggml_tensor* wk = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 32);
    ggml_backend_meta_split_state s;
    ASSERT_TRUE(placement::split_state_of(wq, rule("layers.0.self_attn.q_proj.weight"), 2, s));
    EXPECT_EQ(s.axis, GGML_BACKEND_SPLIT_AXIS_1);
    EXPECT_EQ(s.ne[0], 32);
    EXPECT_EQ(s.ne[1], 32);
    ASSERT_TRUE(placement::split_state_of(wk, rule("layers.0.self_attn.k_proj.weight"), 2, s));
    EXPECT_EQ(s.ne[0], 16);
    EXPECT_EQ(s.ne[1], 16);
    ggml_free(ctx);
    // without flash attention the meta device cannot run the masked / grouped attention
    auto nf = q3::qwen3_row_split_rules(q.net, false);
    EXPECT_NE(nf->why_not.find("--fa"), std::string::npos) << nf->why_not;
}

TEST(TeRowSplit, Qwen3WithOneKvHeadMirrorsKeysAndValues) {
    // Z-Image's tiny te: 2 query heads of 16 share 1 kv head
    io::WeightIndex idx = io::WeightIndex::open(kRef / "zimage_tiny" / "diffusers" / "text_encoder" / "model.safetensors");
    auto keys = q3::find_qwen3(idx);
    ASSERT_TRUE(keys);
    const auto cfg = q3::infer_config(idx, *keys);
    ASSERT_EQ(cfg.heads, 2);
    ASSERT_EQ(cfg.kv_heads, 1);
    q3::Qwen3Model net(cfg);
    auto r = q3::qwen3_row_split_rules(net, true);
    ASSERT_TRUE(r->why_not.empty()) << r->why_not;
    EXPECT_EQ(r->rule("layers.0.self_attn.q_proj.weight").role, RowRole::Column);
    EXPECT_EQ(r->rule("layers.0.self_attn.q_proj.weight").granule, 16);
    EXPECT_EQ(r->rule("layers.0.self_attn.o_proj.weight").role, RowRole::Row);
    EXPECT_EQ(r->rule("layers.0.self_attn.k_proj.weight").role, RowRole::Mirror);
    EXPECT_EQ(r->rule("layers.0.self_attn.v_proj.weight").role, RowRole::Mirror);
    EXPECT_EQ(r->max_devices, 2);  // the query heads
}

TEST(TeRowSplit, T5RulesSplitHeadsAndThePositionBiasTable) {
    TCase t;
    ASSERT_EQ(t.cfg.heads, 4);
    auto r = models::t5::t5_row_split_rules(t.net);
    ASSERT_TRUE(r->why_not.empty()) << r->why_not;
    const std::string b0 = "encoder.block.0.layer.";
    for (const char* n : {"q", "k", "v"}) {
        EXPECT_EQ(r->rule(b0 + "0.SelfAttention." + n + ".weight").role, RowRole::Column) << n;
        EXPECT_EQ(r->rule(b0 + "0.SelfAttention." + n + ".weight").granule, 8) << n;
    }
    EXPECT_EQ(r->rule(b0 + "0.SelfAttention.o.weight").role, RowRole::Row);
    // [buckets 32, heads 4]: split along heads = ggml axis 0 (the Row role)
    const std::string tab = b0 + "0.SelfAttention.relative_attention_bias.weight";
    EXPECT_EQ(r->rule(tab).role, RowRole::Row);
    EXPECT_EQ(r->rule(tab).granule, 1);
    EXPECT_EQ(r->rule(b0 + "1.DenseReluDense.wi_0.weight").role, RowRole::Column);
    EXPECT_EQ(r->rule(b0 + "1.DenseReluDense.wi_1.weight").role, RowRole::Column);
    EXPECT_EQ(r->rule(b0 + "1.DenseReluDense.wo.weight").role, RowRole::Row);
    EXPECT_EQ(r->rule(b0 + "0.layer_norm.weight").role, RowRole::Mirror);
    EXPECT_EQ(r->by_param.size(), 2u * 7u + 1u);
    EXPECT_EQ(r->max_devices, 4);
    // bytes per device of the F32 table over 3 devices: heads 2 / 1 / 1 x 32 buckets x 4 B
    EXPECT_EQ(placement::slice_bytes(GGML_TYPE_F32, {32, 4}, r->rule(tab), 3), (std::vector<uint64_t>{256, 128, 128}));
    ggml_init_params ip{ggml_tensor_overhead() * 2, nullptr, true};
    ggml_context* ctx = ggml_init(ip);
    ggml_tensor* tt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 32);
    ggml_backend_meta_split_state s;
    ASSERT_TRUE(placement::split_state_of(tt, r->rule(tab), 2, s));
    EXPECT_EQ(s.axis, GGML_BACKEND_SPLIT_AXIS_0);
    EXPECT_EQ(s.ne[0], 2);
    EXPECT_EQ(s.ne[1], 2);
    ggml_free(ctx);
}

// ---------------------------------------------------------------- fall-backs to layer split

// More devices than kv heads, or no flash attention: the planner warns and plans a layer split,
// which gives the one-device output bitwise.
TEST(TeRowSplit, Qwen3FallsBackToLayerSplitWhereItCannotSplit) {
    QCase q;
    const auto one = run_qwen3(q, {"CPU"}, placement::SplitMode::Layer);
    const auto three = run_qwen3(q, {"CPU", "CPU", "CPU"}, placement::SplitMode::Row);  // 2 kv heads, 3 devices
    for (auto& sg : three.plan.segments) EXPECT_FALSE(placement::is_row_split_device(sg.device)) << sg.device;
    EXPECT_EQ(three.out, one.out);
    const auto one_plain = run_qwen3(q, {"CPU"}, placement::SplitMode::Layer, /*flash=*/false);
    const auto no_fa = run_qwen3(q, {"CPU", "CPU"}, placement::SplitMode::Row, /*flash=*/false);
    for (auto& sg : no_fa.plan.segments) EXPECT_FALSE(placement::is_row_split_device(sg.device)) << sg.device;
    EXPECT_EQ(no_fa.out, one_plain.out);
}

// ---------------------------------------------------------------- bare modules

TEST(TeRowSplit, Qwen3OnTwoCpuDevicesMatchesOneDevice) { check_qwen3_row_split({"CPU", "CPU"}, "CPU&CPU"); }
TEST(TeRowSplit, T5OnTwoCpuDevicesMatchesOneDevice) { check_t5_row_split({"CPU", "CPU"}, "CPU&CPU"); }

#ifdef EASEL_HAS_RPC
TEST(TeRowSplit, Qwen3OverTwoRpcServersMatchesOneDevice) {
    ASSERT_EQ(rpc().devices.size(), 2u) << "rpc-servers did not come up";
    check_qwen3_row_split(rpc().devices, "RPC0&RPC1");
}

TEST(TeRowSplit, T5OverTwoRpcServersMatchesOneDevice) {
    ASSERT_EQ(rpc().devices.size(), 2u) << "rpc-servers did not come up";
    check_t5_row_split(rpc().devices, "RPC0&RPC1");
}

// ---------------------------------------------------------------- through the families

TEST(TeRowSplit, ZImageQwen3TeThroughTheFamily) { check_family_te_row_split("zimage_tiny", "Z-Image tiny (Qwen3 te, --fa)", 1, true); }

TEST(TeRowSplit, KleinQwen3TeThroughTheFamily) { check_family_te_row_split("klein_tiny", "FLUX.2 Klein tiny (Qwen3 te, --fa)", 1, true); }

TEST(TeRowSplit, Flux1T5TeThroughTheFamily) { check_family_te_row_split("flux1_tiny", "FLUX.1 tiny (T5 row, CLIP-L layer)", 2, false); }

// Without --fa the Qwen3 te cannot be row split: the family plans a layer split (the planner's
// one-line warning) and its conditioning is bitwise the unplaced family's.
TEST(TeRowSplit, ZImageQwen3TeWithoutFlashAttentionFallsBackToLayerSplit) {
    auto& r = rpc();
    ASSERT_EQ(r.devices.size(), 2u) << "rpc-servers did not come up";
    const TeOut plain = encode("zimage_tiny", nullptr, false);
    std::unique_ptr<models::Family> fam;
    const TeOut o = encode("zimage_tiny", spec_of("te=" + r.devices[0] + "&" + r.devices[1], "te=row"), false, &fam);
    EXPECT_EQ(o.ctx_pos, plain.ctx_pos);
    EXPECT_EQ(o.ctx_neg, plain.ctx_neg);
    const auto meta = te_row_split(*fam);
    ASSERT_EQ(meta.size(), 1u);
    EXPECT_FALSE(meta[0]);
    auto plans = fam->placement_plans();
    ASSERT_FALSE(plans.empty());
    EXPECT_EQ(plans[0].devices.size(), 2u) << "layer split over both devices";
}
#endif
