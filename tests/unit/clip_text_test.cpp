// CLIP text encoders against the transformers reference fixtures (tests/data/reference):
// clip_text_sd15_tiny (CLIPTextModel, quick_gelu, eos = pad = 999) and
// clip_text_with_projection_tiny (CLIPTextModelWithProjection, gelu, pad 0, projection 16).
// Both with plain and flash attention; also the OpenCLIP original layout (fused qkv, transposed
// projection) rebuilt from the same weights, and clip skip.
#include "core/error.h"
#include "io/weight_index.h"
#include "models/clip/clip_text.h"
#include "placement/devices.h"
#include "runtime/graph_runner.h"
#include "rpc_servers.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>


using namespace easel;
namespace clip = easel::models::clip;

namespace {

/// ClipOverrides with the given fields set (the others left to the file's config).
clip::ClipOverrides overrides(int64_t heads, std::optional<int64_t> eos = std::nullopt, std::optional<int> layers = std::nullopt) {
    clip::ClipOverrides o;
    o.heads = heads;
    o.eos_token_id = eos;
    o.layers = layers;
    return o;
}


std::string ref_path(const std::string& name) { return std::string(EASEL_TEST_DATA) + "/reference/" + name; }

nlohmann::json sidecar(const std::string& c) {
    std::ifstream f(ref_path(c + ".json"));
    return nlohmann::json::parse(f);
}

struct Ref {
    io::WeightIndex idx;
    std::vector<int32_t> ids;
    int64_t N = 0, L = 0;
    std::vector<float> out(const std::string& name) const {
        const io::TensorInfo* t = idx.find("__output__." + name);
        EXPECT_NE(t, nullptr) << name;
        return t ? idx.read_f32(*t) : std::vector<float>{};
    }
};

Ref load_ref(const std::string& c) {
    Ref r;
    r.idx = io::WeightIndex::open(ref_path(c + ".safetensors"));
    const io::TensorInfo* t = r.idx.find("__input__.input_ids");
    EXPECT_NE(t, nullptr);
    auto v = r.idx.read_i64(*t);
    r.N = t->shape[0];
    r.L = t->shape[1];
    for (auto x : v) r.ids.push_back((int32_t)x);
    return r;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    if (a.size() != b.size()) return INFINITY;
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

// Runs the encoder with every output; returns name -> values.
std::map<std::string, std::vector<float>> run_clip(clip::ClipTextModel& m, const Ref& r, bool flash,
                                                   const clip::ClipEncodeOptions& opt = {}) {
    runtime::GraphRunner run(nullptr, 2);
    clip::check_token_ids(r.ids, m.config().vocab);
    auto pool = clip::pool_indices(r.ids, r.L, r.N, m.config().eos_token_id);
    std::vector<std::string> names;
    auto outs = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), flash};
        clip::ClipInputs in;
        in.ids = g.input_i32("ids", {r.L, r.N}, r.ids);
        in.pool_index = g.input_i32("pool", {r.N}, pool);
        clip::ClipEncodeOptions o = opt;
        o.all_hidden_states = true;
        auto e = m.encode(c, in, o);
        std::vector<ggml_tensor*> t = {e.out.last_hidden_state, e.out.pooler_output, e.context};
        names = {"last_hidden_state", "pooler_output", "context"};
        if (e.out.text_embeds) {
            t.push_back(e.out.text_embeds);
            names.push_back("text_embeds");
        }
        for (size_t i = 0; i < e.hidden_states.size(); ++i) {
            t.push_back(e.hidden_states[i]);
            names.push_back(std::string("hidden_states.") + std::to_string(i));
        }
        return t;
    });
    std::map<std::string, std::vector<float>> res;
    for (size_t i = 0; i < outs.size(); ++i) res[names[i]] = outs[i].data;
    return res;
}

struct Loaded {
    std::unique_ptr<clip::ClipTextModel> model;
    nn::ParamBuffer params;
};

Loaded load_model(const io::WeightIndex& idx, const clip::ClipKeys& keys, const clip::ClipOverrides& ov) {
    auto cfg = clip::infer_config(idx, keys, ov);
    Loaded l;
    l.model = std::make_unique<clip::ClipTextModel>(cfg);
    auto src = clip::make_tensor_source(idx, keys, cfg);
    auto opt = clip::default_load_options(keys, cfg, idx);
    for (auto& t : idx.tensors())  // the fixture's own inputs/outputs are not weights
        if (t.name.rfind("__", 0) == 0) opt.ignore_unexpected_suffixes.push_back(t.name);
    l.params = nn::ParamBuffer::load(*l.model, src, ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)),
                                     opt);
    return l;
}

// LayerNorm over rows of `width` in double, the reference for final_layer_norm(hidden_states[i]).
std::vector<float> layer_norm(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b, float eps) {
    const size_t D = w.size();
    std::vector<float> y(x.size());
    for (size_t r = 0; r < x.size() / D; ++r) {
        double mean = 0, var = 0;
        for (size_t i = 0; i < D; ++i) mean += x[r * D + i];
        mean /= D;
        for (size_t i = 0; i < D; ++i) var += (x[r * D + i] - mean) * (x[r * D + i] - mean);
        var /= D;
        for (size_t i = 0; i < D; ++i) y[r * D + i] = (float)((x[r * D + i] - mean) / std::sqrt(var + eps) * w[i] + b[i]);
    }
    return y;
}

}  // namespace

TEST(ClipText, ConfigAndKeysFromWeights) {
    Ref a = load_ref("clip_text_sd15_tiny");
    auto ka = clip::find_clip_text_encoders(a.idx);
    ASSERT_EQ(ka.size(), 1u);
    EXPECT_EQ(ka[0].prefix, "");
    EXPECT_EQ(ka[0].projection_name, "");
    auto ca = clip::infer_config(a.idx, ka[0], clip::overrides_from_config_json(sidecar("clip_text_sd15_tiny")["config"]));
    EXPECT_EQ(ca.vocab, 1000);
    EXPECT_EQ(ca.width, 32);
    EXPECT_EQ(ca.layers, 3);
    EXPECT_EQ(ca.positions, 77);
    EXPECT_EQ(ca.intermediate, 64);
    EXPECT_EQ(ca.heads, 4);
    EXPECT_EQ(ca.projection, 0);
    EXPECT_EQ(ca.act, clip::Activation::QuickGelu);
    EXPECT_EQ(ca.eos_token_id, 999);

    Ref b = load_ref("clip_text_with_projection_tiny");
    auto kb = clip::find_clip_text_encoders(b.idx);
    ASSERT_EQ(kb.size(), 1u);
    EXPECT_EQ(kb[0].prefix, "text_model.");
    EXPECT_EQ(kb[0].projection_name, "text_projection.weight");
    auto cb = clip::infer_config(b.idx, kb[0], clip::overrides_from_config_json(sidecar("clip_text_with_projection_tiny")["config"]));
    EXPECT_EQ(cb.projection, 16);
    EXPECT_EQ(cb.act, clip::Activation::Gelu);
    // without config.json: head size 64 convention -> width 32 is not divisible, heads default 1 here
    auto cdef = clip::infer_config(b.idx, kb[0]);
    EXPECT_EQ(cdef.heads, 1);
    EXPECT_EQ(cdef.act, clip::Activation::QuickGelu);  // transformers layout, width not 1024/1280
    EXPECT_THROW(clip::infer_config(b.idx, kb[0], overrides(5)), Error);
}

TEST(ClipText, PoolIndices) {
    // transformers: first eos position; legacy eos id 2: argmax(ids) (first maximum)
    std::vector<int32_t> ids = {998, 5, 999, 999, 0,  /* row 1 */ 998, 7, 8, 9, 10};
    EXPECT_EQ(clip::pool_indices(ids, 5, 2, 999), (std::vector<int32_t>{2, 5}));  // row 1 has no eos -> position 0
    EXPECT_EQ(clip::pool_indices(ids, 5, 2, 2), (std::vector<int32_t>{2, 5}));    // argmax: first 999, then 998 at 0
    EXPECT_THROW(clip::pool_indices(ids, 4, 2, 999), Error);
    EXPECT_NO_THROW(clip::check_token_ids(ids, 1000));
    EXPECT_THROW(clip::check_token_ids(ids, 999), Error);  // 999 is outside [0, 999)
    EXPECT_THROW(clip::check_token_ids({-1}, 10), Error);
}

TEST(ClipText, Sd15TinyParity) {
    Ref r = load_ref("clip_text_sd15_tiny");
    auto keys = clip::find_clip_text_encoders(r.idx);
    auto l = load_model(r.idx, keys.at(0), clip::overrides_from_config_json(sidecar("clip_text_sd15_tiny")["config"]));
    for (bool flash : {false, true}) {
        auto o = run_clip(*l.model, r, flash);
        float worst = 0;
        for (std::string n : {"last_hidden_state", "pooler_output", "hidden_states.0", "hidden_states.1", "hidden_states.2",
                              "hidden_states.3"}) {
            float e = max_abs_diff(o[n], r.out(n));
            std::cout << "[clip_text_sd15_tiny] flash=" << flash << " " << n << " max abs err " << e << "\n";
            EXPECT_LT(e, 1e-4f) << n << " flash=" << flash;
            worst = std::max(worst, e);
        }
        EXPECT_EQ(o["context"], o["last_hidden_state"]);  // clip_skip 0: the last layer
    }
}

TEST(ClipText, WithProjectionTinyParity) {
    Ref r = load_ref("clip_text_with_projection_tiny");
    auto keys = clip::find_clip_text_encoders(r.idx);
    auto l = load_model(r.idx, keys.at(0), clip::overrides_from_config_json(sidecar("clip_text_with_projection_tiny")["config"]));
    for (bool flash : {false, true}) {
        auto o = run_clip(*l.model, r, flash);
        for (std::string n : {"last_hidden_state", "text_embeds", "hidden_states.0", "hidden_states.1", "hidden_states.2",
                              "hidden_states.3"}) {
            float e = max_abs_diff(o[n], r.out(n));
            std::cout << "[clip_text_with_projection_tiny] flash=" << flash << " " << n << " max abs err " << e << "\n";
            EXPECT_LT(e, 1e-4f) << n << " flash=" << flash;
        }
    }
}

TEST(ClipText, ClipSkip) {
    Ref r = load_ref("clip_text_with_projection_tiny");
    auto keys = clip::find_clip_text_encoders(r.idx);
    auto l = load_model(r.idx, keys.at(0), clip::overrides_from_config_json(sidecar("clip_text_with_projection_tiny")["config"]));
    auto w = r.idx.read_f32(*r.idx.find("text_model.final_layer_norm.weight"));
    auto b = r.idx.read_f32(*r.idx.find("text_model.final_layer_norm.bias"));
    // clip_skip 2 (sd-cli; diffusers clip_skip=1): final_layer_norm(hidden_states[-2])
    auto o = run_clip(*l.model, r, false, {.clip_skip = 2});
    EXPECT_LT(max_abs_diff(o["context"], layer_norm(r.out("hidden_states.2"), w, b, 1e-5f)), 1e-4f);
    // SDXL: hidden_states[-2] without the final norm
    o = run_clip(*l.model, r, false, {.clip_skip = 2, .final_norm_on_skip = false});
    EXPECT_LT(max_abs_diff(o["context"], r.out("hidden_states.2")), 1e-4f);
    // clip_skip 3: hidden_states[1]; also the path that stops early (no pooled output asked for)
    runtime::GraphRunner run(nullptr, 2);
    auto outs = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        clip::ClipInputs in;
        in.ids = g.input_i32("ids", {r.L, r.N}, r.ids);
        auto e = l.model->encode(c, in, {.clip_skip = 3, .final_norm_on_skip = false});
        EXPECT_EQ(e.out.last_hidden_state, nullptr);  // layers 2..3 were not built
        return std::vector<ggml_tensor*>{e.context};
    });
    EXPECT_LT(max_abs_diff(outs[0].data, r.out("hidden_states.1")), 1e-4f);
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        clip::ClipInputs in;
        in.ids = g.input_i32("ids", {r.L, r.N}, r.ids);
        return std::vector<ggml_tensor*>{l.model->encode(c, in, {.clip_skip = 4}).context};
    }),
                 Error);
}

TEST(ClipText, SegmentedRunMatchesWhole) {
    // prologue + blocks [0,2) in one graph, state read back, blocks [2,3) + epilogue in a second
    // graph whose state tensors are inputs: the placement runtime's pattern.
    Ref r = load_ref("clip_text_sd15_tiny");
    auto keys = clip::find_clip_text_encoders(r.idx);
    auto l = load_model(r.idx, keys.at(0), clip::overrides_from_config_json(sidecar("clip_text_sd15_tiny")["config"]));
    runtime::GraphRunner run(nullptr, 2);
    auto pool = clip::pool_indices(r.ids, r.L, r.N, l.model->config().eos_token_id);
    std::vector<std::string> names;
    auto part1 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        clip::ClipInputs in{g.input_i32("ids", {r.L, r.N}, r.ids), g.input_i32("pool", {r.N}, pool)};
        clip::ClipState s = l.model->forward_range(c, l.model->prologue(c, in), 0, 2);
        std::vector<ggml_tensor*> t;
        s.visit_tensors([&](const char* n, ggml_tensor*& x) {
            names.push_back(n);
            t.push_back(x);
        });
        return t;
    });
    ASSERT_EQ(names, (std::vector<std::string>{"h", "mask", "pool_index"}));
    auto part2 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        // a state with the same slots as part 1's, each replaced by an input tensor
        clip::ClipState s;
        s.pool_index = g.input_i32("pool_index", {r.N}, pool);  // integer state: re-supplied from the host
        size_t i = 0;
        s.visit_tensors([&](const char* n, ggml_tensor*& x) {
            const auto& h = part1[i++];
            if (std::string(n) != "pool_index") x = g.input_f32(n, std::vector<int64_t>(h.ne.begin(), h.ne.end()), h.data);
        });
        auto o = l.model->epilogue(c, l.model->forward_range(c, s, 2, 3));
        return std::vector<ggml_tensor*>{o.last_hidden_state, o.pooler_output};
    });
    EXPECT_LT(max_abs_diff(part2[0].data, r.out("last_hidden_state")), 1e-4f);
    EXPECT_LT(max_abs_diff(part2[1].data, r.out("pooler_output")), 1e-4f);
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        clip::ClipInputs in{g.input_i32("ids", {r.L, r.N}, r.ids), nullptr};
        return std::vector<ggml_tensor*>{l.model->forward_range(c, l.model->prologue(c, in), 2, 4).h};
    }),
                 Error);
}

namespace {

// Writes tensors (F32) as a safetensors file.
void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>>& ts) {
    std::string header = "{";
    std::vector<uint8_t> data;
    for (size_t i = 0; i < ts.size(); ++i) {
        const auto& [name, sv] = ts[i];
        size_t begin = data.size();
        data.resize(begin + sv.second.size() * 4);
        std::memcpy(data.data() + begin, sv.second.data(), sv.second.size() * 4);
        std::string shape;
        for (size_t d = 0; d < sv.first.size(); ++d) {
            if (d) shape += ",";
            shape += std::to_string(sv.first[d]);
        }
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

}  // namespace

TEST(ClipText, OpenClipLayoutParity) {
    // Rebuild the with-projection fixture in the OpenCLIP layout of an SDXL single file
    // (conditioner.embedders.1.model.*): fused in_proj, renamed norms/MLP, projection [width, proj].
    Ref r = load_ref("clip_text_with_projection_tiny");
    const std::string P = "conditioner.embedders.1.model.";
    auto get = [&](const std::string& n) { return r.idx.read_f32(*r.idx.find("text_model." + n)); };
    std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>> ts;
    ts.push_back({P + "token_embedding.weight", {{1000, 32}, get("embeddings.token_embedding.weight")}});
    ts.push_back({P + "positional_embedding", {{77, 32}, get("embeddings.position_embedding.weight")}});
    for (int l = 0; l < 3; ++l) {
        std::string hf = std::string("encoder.layers.") + std::to_string(l) + ".";
        std::string oc = P + std::string("transformer.resblocks.") + std::to_string(l) + ".";
        std::vector<float> w, b;
        for (const char* x : {"q_proj", "k_proj", "v_proj"}) {
            auto wx = get(hf + "self_attn." + x + ".weight");
            auto bx = get(hf + "self_attn." + x + ".bias");
            w.insert(w.end(), wx.begin(), wx.end());
            b.insert(b.end(), bx.begin(), bx.end());
        }
        ts.push_back({oc + "attn.in_proj_weight", {{96, 32}, w}});
        ts.push_back({oc + "attn.in_proj_bias", {{96}, b}});
        ts.push_back({oc + "attn.out_proj.weight", {{32, 32}, get(hf + "self_attn.out_proj.weight")}});
        ts.push_back({oc + "attn.out_proj.bias", {{32}, get(hf + "self_attn.out_proj.bias")}});
        ts.push_back({oc + "ln_1.weight", {{32}, get(hf + "layer_norm1.weight")}});
        ts.push_back({oc + "ln_1.bias", {{32}, get(hf + "layer_norm1.bias")}});
        ts.push_back({oc + "ln_2.weight", {{32}, get(hf + "layer_norm2.weight")}});
        ts.push_back({oc + "ln_2.bias", {{32}, get(hf + "layer_norm2.bias")}});
        ts.push_back({oc + "mlp.c_fc.weight", {{64, 32}, get(hf + "mlp.fc1.weight")}});
        ts.push_back({oc + "mlp.c_fc.bias", {{64}, get(hf + "mlp.fc1.bias")}});
        ts.push_back({oc + "mlp.c_proj.weight", {{32, 64}, get(hf + "mlp.fc2.weight")}});
        ts.push_back({oc + "mlp.c_proj.bias", {{32}, get(hf + "mlp.fc2.bias")}});
    }
    ts.push_back({P + "ln_final.weight", {{32}, get("final_layer_norm.weight")}});
    ts.push_back({P + "ln_final.bias", {{32}, get("final_layer_norm.bias")}});
    auto proj = r.idx.read_f32(*r.idx.find("text_projection.weight"));  // [16, 32]
    std::vector<float> projT(proj.size());
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 32; ++j) projT[j * 16 + i] = proj[i * 32 + j];
    ts.push_back({P + "text_projection", {{32, 16}, projT}});
    ts.push_back({P + "logit_scale", {{1}, {4.6f}}});
    auto path = std::filesystem::temp_directory_path() / "easel_clip_openclip_layout.safetensors";
    write_safetensors(path, ts);

    auto idx = io::WeightIndex::open(path);
    auto keys = clip::find_clip_text_encoders(idx);
    ASSERT_EQ(keys.size(), 1u);
    EXPECT_EQ(keys[0].layout, clip::ClipKeys::Layout::OpenClip);
    EXPECT_EQ(keys[0].prefix, P);
    // heads and the eos id are not in OpenCLIP weights: give the fixture's
    auto cfg = clip::infer_config(idx, keys[0], overrides(4, 999));
    EXPECT_EQ(cfg.projection, 16);
    EXPECT_EQ(cfg.layers, 3);
    EXPECT_EQ(cfg.act, clip::Activation::Gelu);  // default for OpenCLIP widths != 768
    auto src = clip::make_tensor_source(idx, keys[0], cfg);
    clip::ClipTextModel m2(cfg);
    auto pb2 = nn::ParamBuffer::load(m2, src, ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)),
                                     clip::default_load_options(keys[0], cfg, idx));
    for (bool flash : {false, true}) {
        auto o = run_clip(m2, r, flash);
        for (std::string n : {"last_hidden_state", "text_embeds", "hidden_states.1", "hidden_states.3"}) {
            float e = max_abs_diff(o[n], r.out(n));
            std::cout << "[openclip layout] flash=" << flash << " " << n << " max abs err " << e << "\n";
            EXPECT_LT(e, 1e-4f) << n;
        }
    }
    // using only the first 2 layers (diffusers' SD2 text encoder drops the last): layer 2 is ignored, not unexpected
    auto cfg2 = clip::infer_config(idx, keys[0], overrides(4, std::nullopt, 2));
    clip::ClipTextModel m3(cfg2);
    EXPECT_EQ(nn::check_binding(m3, clip::make_tensor_source(idx, keys[0], cfg2), clip::default_load_options(keys[0], cfg2, idx)), "");
    std::filesystem::remove(path);
}

namespace {

// The tiny SD1.x pipeline of tests/data/reference/sd_tiny (f16 weights; references computed in
// f32 from those values): cond / uncond = last_hidden_state for input_ids / uncond_ids.
void check_sd_tiny(const io::WeightIndex& idx, const clip::ClipOverrides& ov, const std::string& want_prefix) {
    auto keys = clip::find_clip_text_encoders(idx);
    ASSERT_EQ(keys.size(), 1u);
    EXPECT_EQ(keys[0].prefix, want_prefix);
    auto cfg = clip::infer_config(idx, keys[0], ov);
    EXPECT_EQ(cfg.vocab, 49408);
    EXPECT_EQ(cfg.width, 64);
    EXPECT_EQ(cfg.layers, 2);
    EXPECT_EQ(cfg.heads, 1);
    EXPECT_EQ(cfg.act, clip::Activation::QuickGelu);
    EXPECT_EQ(cfg.eos_token_id, 49407);
    auto cs = io::WeightIndex::open(ref_path("sd_tiny/case_euler_discrete_a_s0.safetensors"));
    std::vector<int32_t> ids;
    for (const char* n : {"uncond_ids", "input_ids"})
        for (auto v : cs.read_i64(*cs.find(n))) ids.push_back((int32_t)v);
    auto want_uncond = cs.read_f32(*cs.find("uncond"));
    auto want_cond = cs.read_f32(*cs.find("cond"));
    for (ggml_type wt : {GGML_TYPE_F32, GGML_TYPE_COUNT, GGML_TYPE_Q8_0}) {  // F32, the stored F16, --type q8_0
        clip::ClipTextModel m(cfg);
        auto opt = clip::default_load_options(keys[0], cfg, idx);
        opt.weight_type = wt;
        runtime::GraphRunner run(nullptr, 2);
        auto pb = nn::ParamBuffer::load(m, clip::make_tensor_source(idx, keys[0], cfg), run.buffer_type(), opt);
        if (wt == GGML_TYPE_Q8_0) {
            EXPECT_EQ(m.block_params(0).param_count(), 16u);
            EXPECT_EQ(m.config().width % 32, 0);
        }
        for (bool flash : {false, true}) {
            auto out = run.run([&](runtime::GraphBuilder& g) {
                nn::Ctx c{g.ctx(), flash, g.backend()};
                clip::ClipInputs in;
                in.ids = g.input_i32("ids", {77, 2}, ids);
                return std::vector<ggml_tensor*>{m.encode(c, in).context};
            });
            std::vector<float> got_u(out[0].data.begin(), out[0].data.begin() + 77 * 64);
            std::vector<float> got_c(out[0].data.begin() + 77 * 64, out[0].data.end());
            float e = std::max(max_abs_diff(got_u, want_uncond), max_abs_diff(got_c, want_cond));
            std::cout << "[sd_tiny " << (want_prefix.empty() ? "diffusers" : "single file") << "] weights "
                      << (wt == GGML_TYPE_F32 ? "f32" : wt == GGML_TYPE_Q8_0 ? "q8_0" : "f16") << " flash=" << flash
                      << " max abs err " << e << "\n";
            // stored F16 matmul weights make ggml round activations to F16 as well; Q8_0 rounds
            // weights to 8 bits and activations to 8 bits (Q8_0 dot products): judge it by the
            // relative RMS error instead
            double se = 0, sr = 0;
            for (size_t i = 0; i < got_c.size(); ++i) {
                se += (got_c[i] - want_cond[i]) * (got_c[i] - want_cond[i]) + (got_u[i] - want_uncond[i]) * (got_u[i] - want_uncond[i]);
                sr += want_cond[i] * want_cond[i] + want_uncond[i] * want_uncond[i];
            }
            std::cout << "    relative rms err " << std::sqrt(se / sr) << "\n";
            if (wt == GGML_TYPE_Q8_0) { EXPECT_LT(std::sqrt(se / sr), 3e-2); }  // measured 1.5e-2 (a wrong layout gives ~1)
            else EXPECT_LT(e, wt == GGML_TYPE_F32 ? 1e-4f : 5e-3f);
        }
    }
}

}  // namespace

TEST(ClipText, ParamBytesPerBlock) {
    // one sd_tiny layer: q/k/v/out 4 x (64x64 + 64), 2 layer norms 2 x (64 + 64), fc1 128x64 + 128,
    // fc2 64x128 + 64 -> 32768 matmul weights + 704 bias/norm values
    auto idx = io::WeightIndex::open(ref_path("sd_tiny/sd_tiny.safetensors"));
    auto keys = clip::find_clip_text_encoders(idx);
    auto cfg = clip::infer_config(idx, keys.at(0));
    clip::ClipTextModel m(cfg);
    auto src = clip::make_tensor_source(idx, keys[0], cfg);
    nn::TensorSource layer_src(idx, keys[0].prefix + "encoder.layers.1.");
    const nn::Block& layer = m.block_params(1);
    EXPECT_EQ(nn::param_bytes(layer, layer_src), 32768u * 2 + 704u * 4);  // stored F16; norms/biases F32
    nn::LoadOptions f32;
    f32.weight_type = GGML_TYPE_F32;
    EXPECT_EQ(nn::param_bytes(layer, layer_src, f32), (32768u + 704u) * 4);
    nn::LoadOptions q8;
    q8.weight_type = GGML_TYPE_Q8_0;  // 34 bytes per 32 values
    EXPECT_EQ(nn::param_bytes(layer, layer_src, q8), 32768u / 32 * 34 + 704u * 4);
    // whole model, stored types: embeddings 49408x64 F16, positions 77x64 F32 (kept F32), final norm
    uint64_t whole = nn::param_bytes(m, src);
    EXPECT_EQ(whole, 49408u * 64 * 2 + 77u * 64 * 4 + 2 * (32768u * 2 + 704u * 4) + 128u * 4);
    runtime::GraphRunner run(nullptr, 1);
    auto pb = nn::ParamBuffer::load(m, src, run.buffer_type(), clip::default_load_options(keys[0], cfg, idx));
    EXPECT_GE(pb.size(), whole);
    EXPECT_LT(pb.size(), whole + 64 * 64);  // alignment padding only
}

TEST(ClipText, SdTinySingleFileParity) {
    // original (ldm) layout: cond_stage_model.transformer.text_model.*, no config: defaults apply
    auto idx = io::WeightIndex::open(ref_path("sd_tiny/sd_tiny.safetensors"));
    check_sd_tiny(idx, {}, "cond_stage_model.transformer.text_model.");
}

TEST(ClipText, SdTinyDiffusersFolderParity) {
    // transformers 5 save_pretrained: no text_model. prefix; config.json gives heads and act
    auto idx = io::WeightIndex::open(ref_path("sd_tiny/diffusers/text_encoder/model.safetensors"));
    std::ifstream f(ref_path("sd_tiny/diffusers/text_encoder/config.json"));
    check_sd_tiny(idx, clip::overrides_from_config_json(nlohmann::json::parse(f)), "");
}

#ifdef EASEL_HAS_RPC
TEST(ClipText, RunsOnRpcDevice) {
    // Parameters in a non-host buffer, inputs/outputs through the backend API: an easel
    // rpc-server on 127.0.0.1 serving its CPU (the multi-device set-up of CI).
    easel::test_support::RpcServers rpc(1);  // throws (the test fails) when it cannot start
    ggml_backend_dev_t dev = placement::find_device(rpc.devices.at(0));

    Ref r = load_ref("clip_text_with_projection_tiny");
    auto keys = clip::find_clip_text_encoders(r.idx);
    auto cfg = clip::infer_config(r.idx, keys.at(0), clip::overrides_from_config_json(sidecar("clip_text_with_projection_tiny")["config"]));
    clip::ClipTextModel m(cfg);
    runtime::GraphRunner run(dev);
    auto pb = nn::ParamBuffer::load(m, clip::make_tensor_source(r.idx, keys[0], cfg), run.buffer_type(),
                                    clip::default_load_options(keys[0], cfg, r.idx));
    EXPECT_FALSE(ggml_backend_buffer_is_host(pb.buffer()));
    auto pool = clip::pool_indices(r.ids, r.L, r.N, cfg.eos_token_id);
    for (bool flash : {false, true}) {
        auto out = run.run([&](runtime::GraphBuilder& g) {
            nn::Ctx c{g.ctx(), flash, g.backend()};
            clip::ClipInputs in{g.input_i32("ids", {r.L, r.N}, r.ids), g.input_i32("pool", {r.N}, pool)};
            auto e = m.encode(c, in, {.clip_skip = 2, .final_norm_on_skip = false});
            return std::vector<ggml_tensor*>{e.out.last_hidden_state, e.out.text_embeds, e.context};
        });
        float e0 = max_abs_diff(out[0].data, r.out("last_hidden_state"));
        float e1 = max_abs_diff(out[1].data, r.out("text_embeds"));
        float e2 = max_abs_diff(out[2].data, r.out("hidden_states.2"));
        std::cout << "[rpc] flash=" << flash << " last_hidden_state " << e0 << " text_embeds " << e1 << " hidden_states[-2] " << e2 << "\n";
        EXPECT_LT(std::max({e0, e1, e2}), 1e-4f);
    }
}
#endif
