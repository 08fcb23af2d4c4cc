// Qwen3 text encoder against the transformers reference fixture qwen3_text_tiny
// (tests/data/reference: Qwen3Model, vocab 1000, hidden 32, 4 layers, 4 q heads / 2 kv heads,
// head_dim 16, rope_theta 1e6; row 1 right-padded from position 11): every hidden_states.i,
// last_hidden_state, the raw output of the last layer, FLUX.2 klein's stack of layers 1, 2, 3;
// the Qwen3ForCausalLM layout ("model." prefix + lm_head.weight); GGUF files with llama.cpp
// names written here at F16 and Q8_0; a segmented run (two graphs) as the placement runtime
// builds them; and bad input.
#include "core/error.h"
#include "io/weight_index.h"
#include "models/qwen3/qwen3.h"
#include "runtime/graph_runner.h"

#include <ggml-cpu.h>
#include <gguf.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <unistd.h>

using namespace easel;
namespace q3 = easel::models::qwen3;

namespace {

std::string ref_path(const std::string& name) { return std::string(EASEL_TEST_DATA) + "/reference/" + name; }

struct Ref {
    io::WeightIndex idx;
    std::vector<int32_t> ids, mask;
    int64_t B = 0, L = 0;
    std::vector<float> out(const std::string& name) const {
        const io::TensorInfo* t = idx.find("__output__." + name);
        EXPECT_NE(t, nullptr) << name;
        return t ? idx.read_f32(*t) : std::vector<float>{};
    }
};

Ref load_ref() {
    Ref r;
    r.idx = io::WeightIndex::open(ref_path("qwen3_text_tiny.safetensors"));
    const io::TensorInfo* t = r.idx.find("__input__.input_ids");
    const io::TensorInfo* m = r.idx.find("__input__.attention_mask");
    EXPECT_TRUE(t && m);
    r.B = t->shape[0];
    r.L = t->shape[1];
    for (auto x : r.idx.read_i64(*t)) r.ids.push_back((int32_t)x);
    for (auto x : r.idx.read_i64(*m)) r.mask.push_back((int32_t)x);
    return r;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    if (a.size() != b.size()) return INFINITY;
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

// The model's weights under their transformers names (no "__" entries), as F32 values.
std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>> model_weights(const Ref& r) {
    std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>> ts;
    for (auto& t : r.idx.tensors())
        if (t.name.rfind("__", 0) != 0) ts.push_back({t.name, {t.shape, r.idx.read_f32(t)}});
    return ts;
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>>& ts) {
    std::string header = "{";
    std::vector<uint8_t> data;
    for (size_t i = 0; i < ts.size(); ++i) {
        const auto& [name, sv] = ts[i];
        size_t begin = data.size();
        data.resize(begin + sv.second.size() * 4);
        std::memcpy(data.data() + begin, sv.second.data(), sv.second.size() * 4);
        std::string shape;
        for (size_t d = 0; d < sv.first.size(); ++d) shape += std::string(d ? "," : "") + std::to_string(sv.first[d]);
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

// transformers name -> llama.cpp GGUF name (written independently of the library's map)
std::string gguf_name(const std::string& n) {
    if (n == "embed_tokens.weight") return "token_embd.weight";
    if (n == "norm.weight") return "output_norm.weight";
    const size_t dot = n.find('.', 7);  // "layers.<i>."
    const std::string blk = "blk." + n.substr(7, dot - 7) + ".";
    const std::string rest = n.substr(dot + 1);
    const std::map<std::string, std::string> m = {
        {"input_layernorm.weight", "attn_norm.weight"},   {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},     {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},     {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},      {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"}};
    return blk + m.at(rest);
}

// Writes the fixture's weights as a llama.cpp-style Qwen3 GGUF: 2-D weights in `wtype`
// (F16 or Q8_0), norms F32, plus an output.weight (lm_head) that must be ignored.
std::filesystem::path write_gguf(const Ref& r, ggml_type wtype, const std::string& tag) {
    auto ts = model_weights(r);
    ts.push_back({"lm_head.weight", ts.front().second});  // tied lm_head, written as output.weight
    size_t bytes = 0;
    for (auto& t : ts) bytes += ggml_row_size(GGML_TYPE_F32, (int64_t)t.second.second.size()) + 1024;
    ggml_init_params ip{bytes + ts.size() * ggml_tensor_overhead(), nullptr, false};
    ggml_context* ctx = ggml_init(ip);
    gguf_context* g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", "qwen3");
    gguf_set_val_f32(g, "qwen3.rope.freq_base", 1e6f);
    gguf_set_val_f32(g, "qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
    for (auto& [name, sv] : ts) {
        const auto& [shape, v] = sv;
        const bool two_d = shape.size() == 2;
        const ggml_type type = two_d ? wtype : GGML_TYPE_F32;
        ggml_tensor* t = two_d ? ggml_new_tensor_2d(ctx, type, shape[1], shape[0]) : ggml_new_tensor_1d(ctx, type, shape[0]);
        const std::string gname = name == "lm_head.weight" ? "output.weight" : gguf_name(name);
        ggml_set_name(t, gname.c_str());
        if (type == GGML_TYPE_F32) std::memcpy(t->data, v.data(), v.size() * 4);
        else if (type == GGML_TYPE_F16) ggml_fp32_to_fp16_row(v.data(), (ggml_fp16_t*)t->data, (int64_t)v.size());
        else ggml_quantize_chunk(type, v.data(), t->data, 0, shape[0], shape[1], nullptr);
        gguf_add_tensor(g, t);
    }
    auto path = std::filesystem::temp_directory_path() / ("easel_qwen3_" + tag + std::string("_") + std::to_string(::getpid()) + ".gguf");
    EXPECT_TRUE(gguf_write_to_file(g, path.string().c_str(), false));
    gguf_free(g);
    ggml_free(ctx);
    return path;
}

const std::vector<int> kAll = {0, 1, 2, 3, 4};

}  // namespace

TEST(Qwen3Text, ConfigInferredFromWeights) {
    Ref r = load_ref();
    auto keys = q3::find_qwen3(r.idx);
    ASSERT_TRUE(keys);
    EXPECT_EQ(keys->prefix, "");
    auto c = q3::infer_config(r.idx, *keys);
    EXPECT_EQ(c.vocab, 1000);
    EXPECT_EQ(c.hidden, 32);
    EXPECT_EQ(c.layers, 4);
    EXPECT_EQ(c.heads, 4);
    EXPECT_EQ(c.kv_heads, 2);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.intermediate, 64);
    EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
    EXPECT_FLOAT_EQ(c.eps, 1e-6f);
}

TEST(Qwen3Text, TinyParityHiddenStatesAndKleinStack) {
    Ref r = load_ref();
    for (bool flash : {false, true}) {
        q3::Qwen3RunOptions opt;
        opt.threads = 2;
        opt.flash_attn = flash;
        q3::Qwen3TextEncoder te(r.idx, opt);
        auto hs = te.run(r.ids, r.mask, r.B, r.L, kAll);
        ASSERT_EQ(hs.size(), 5u);
        for (int i = 0; i < 5; ++i) {
            EXPECT_EQ(hs[(size_t)i].ne[0], 32);
            EXPECT_EQ(hs[(size_t)i].ne[1], 16);
            EXPECT_EQ(hs[(size_t)i].ne[2], 2);
            const float e = max_abs_diff(hs[(size_t)i].data, r.out(std::string("hidden_states.") + std::to_string(i)));
            std::cout << "[qwen3 tiny] flash=" << flash << " hidden_states." << i << " max abs err " << e << "\n";
            EXPECT_LT(e, 1e-4f) << "hidden_states." << i;
        }
        // last_hidden_state = hidden_states[-1]
        auto last = te.run(r.ids, r.mask, r.B, r.L, std::vector<int>{-1});
        const float el = max_abs_diff(last[0].data, r.out("last_hidden_state"));
        std::cout << "[qwen3 tiny] flash=" << flash << " last_hidden_state max abs err " << el << "\n";
        EXPECT_LT(el, 1e-4f);
        // Z-Image: hidden_states[-2] alone (layers after it are not built)
        auto z = te.run(r.ids, r.mask, r.B, r.L, std::vector<int>{-2});
        EXPECT_LT(max_abs_diff(z[0].data, r.out("hidden_states.3")), 1e-4f);
        // FLUX.2 klein: stack of hidden_states 1, 2, 3 per token -> {96, L, B}
        auto k = te.run(r.ids, r.mask, r.B, r.L, std::vector<int>{1, 2, 3});
        for (int i = 0; i < 3; ++i)
            EXPECT_LT(max_abs_diff(k[(size_t)i].data, r.out(std::string("hidden_states.") + std::to_string(i + 1))), 1e-4f) << "klein input " << i;
        auto st = q3::stack_hidden_states(k);
        EXPECT_EQ(st.ne[0], 96);
        const float ek = max_abs_diff(st.data, r.out("klein_prompt_embeds_layers_1_2_3"));
        std::cout << "[qwen3 tiny] flash=" << flash << " klein stack max abs err " << ek << "\n";
        EXPECT_LT(ek, 1e-4f);
    }
}

TEST(Qwen3Text, SegmentedRunMatchesWholeAndRawLastLayer) {
    // prologue + layers [0, 2) in one graph; the state read back and fed as inputs to a second
    // graph running layers [2, 4): its h is the raw output of the last layer (layer_output.3),
    // and the epilogue gives last_hidden_state.
    Ref r = load_ref();
    auto keys = q3::find_qwen3(r.idx);
    auto cfg = q3::infer_config(r.idx, *keys);
    q3::Qwen3Model model(cfg);
    runtime::GraphRunner run(nullptr, 2);
    auto params = nn::ParamBuffer::load(model, q3::make_tensor_source(r.idx, *keys, cfg), run.buffer_type(),
                                        q3::default_load_options(*keys, cfg, r.idx));
    const auto mask = q3::attention_mask(r.mask, r.L, r.B);
    const auto pos = q3::positions(r.L);
    std::vector<std::string> names;
    auto part1 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        q3::Qwen3Inputs in{g.input_i32("ids", {r.L, r.B}, r.ids), g.input_f32("mask", {r.L, r.L, 1, r.B}, mask),
                           g.input_i32("pos", {r.L}, pos)};
        q3::Qwen3State s = model.forward_range(c, model.prologue(c, in), 0, 2);
        std::vector<ggml_tensor*> t;
        s.visit_tensors([&](const char* n, ggml_tensor*& x) {
            names.push_back(n);
            t.push_back(x);
        });
        return t;
    });
    ASSERT_EQ(names, (std::vector<std::string>{"h", "mask", "pos"}));
    EXPECT_LT(max_abs_diff(part1[0].data, r.out("hidden_states.2")), 1e-4f);
    auto part2 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        q3::Qwen3State s;
        size_t i = 0;
        s.visit_tensors([&](const char* n, ggml_tensor*& x) {
            const auto& h = part1[i++];
            if (std::string(n) == "pos") x = g.input_i32(n, {r.L}, pos);  // integer state: re-supplied from the host
            else x = g.input_f32(n, std::vector<int64_t>(h.ne.begin(), h.ne.end()), h.data);
        });
        s = model.forward_range(c, s, 2, 4);
        return std::vector<ggml_tensor*>{s.h, model.epilogue(c, s).last_hidden_state};
    });
    const float e3 = max_abs_diff(part2[0].data, r.out("layer_output.3"));
    std::cout << "[qwen3 tiny] segmented layer_output.3 max abs err " << e3 << "\n";
    EXPECT_LT(e3, 1e-4f);
    EXPECT_LT(max_abs_diff(part2[1].data, r.out("last_hidden_state")), 1e-4f);
}

TEST(Qwen3Text, ForCausalLMLayoutWithModelPrefix) {
    // Flux2KleinPipeline's text encoder is Qwen3ForCausalLM: every key under "model.", plus lm_head.weight.
    Ref r = load_ref();
    auto ts = model_weights(r);
    for (auto& t : ts) t.first = "model." + t.first;
    ts.push_back({"lm_head.weight", ts.front().second});
    auto path = std::filesystem::temp_directory_path() / (std::string("easel_qwen3_causallm_") + std::to_string(::getpid()) + ".safetensors");
    write_safetensors(path, ts);
    q3::Qwen3RunOptions opt;
    opt.threads = 2;
    auto te = q3::Qwen3TextEncoder::open(path, opt);
    std::filesystem::remove(path);
    auto hs = te.run(r.ids, r.mask, r.B, r.L, std::vector<int>{4, 2});
    EXPECT_LT(max_abs_diff(hs[0].data, r.out("last_hidden_state")), 1e-4f);
    EXPECT_LT(max_abs_diff(hs[1].data, r.out("hidden_states.2")), 1e-4f);
    EXPECT_EQ(hs[0].name, "hidden_states.4");
}

TEST(Qwen3Text, GgufF16AndQ8_0) {
    // Tolerances: F16 weights carry a relative rounding error of at most 2^-11 (4.9e-4) each;
    // through 4 layers with outputs of order 1-3 that gives max errors of a few 1e-3 (measured
    // 1.0e-3 at hidden_states.2, 2.9e-3 at last_hidden_state): bound 1e-2. Q8_0 keeps 8 bits per
    // weight with one F16 scale per 32 (relative error up to 1/254 of the block's largest value),
    // and ggml's CPU matmul also quantises the activations to Q8_0, so its error is ~20x larger:
    // it is bounded by the relative RMS error (measured ~1-2 %, bound 5 %) and a max abs error
    // bound of 0.2 (measured 0.066 on outputs whose max |value| is about 4).
    Ref r = load_ref();
    const auto ref_last = r.out("last_hidden_state");
    const auto ref_h2 = r.out("hidden_states.2");
    auto rel_rms = [](const std::vector<float>& a, const std::vector<float>& b) {
        double e = 0, n = 0;
        for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
            e += double(a[i] - b[i]) * (a[i] - b[i]);
            n += double(b[i]) * b[i];
        }
        return (float)std::sqrt(e / n);
    };
    struct Case {
        ggml_type type;
        const char* tag;
        float max_tol, rms_tol;
    };
    for (const Case& k : {Case{GGML_TYPE_F16, "f16", 1e-2f, 5e-3f}, Case{GGML_TYPE_Q8_0, "q8_0", 0.2f, 5e-2f}}) {
        auto path = write_gguf(r, k.type, k.tag);
        q3::Qwen3RunOptions opt;
        opt.threads = 2;
        auto te = q3::Qwen3TextEncoder::open(path, opt);
        std::filesystem::remove(path);
        EXPECT_EQ(te.config().layers, 4);
        EXPECT_EQ(te.config().kv_heads, 2);
        auto hs = te.run(r.ids, r.mask, r.B, r.L, std::vector<int>{2, -1});
        const float e2 = max_abs_diff(hs[0].data, ref_h2), el = max_abs_diff(hs[1].data, ref_last);
        const float r2 = rel_rms(hs[0].data, ref_h2), rl = rel_rms(hs[1].data, ref_last);
        std::cout << "[qwen3 tiny gguf " << k.tag << "] hidden_states.2 max abs err " << e2 << " rel rms " << r2
                  << "; last_hidden_state max abs err " << el << " rel rms " << rl << "\n";
        EXPECT_LT(e2, k.max_tol);
        EXPECT_LT(el, k.max_tol);
        EXPECT_LT(r2, k.rms_tol);
        EXPECT_LT(rl, k.rms_tol);
    }
}

TEST(Qwen3Text, AttentionMaskHandComputed) {
    const float I = -INFINITY;
    // right padding: token 2 is padding
    auto m = q3::attention_mask(std::vector<int32_t>{1, 1, 0}, 3, 1);
    EXPECT_EQ(m, (std::vector<float>{0, I, I, 0, 0, I, 0, 0, I}));
    // left padding: query 0 sees no token, keeps its causal row
    m = q3::attention_mask(std::vector<int32_t>{0, 1, 1}, 3, 1);
    EXPECT_EQ(m, (std::vector<float>{0, I, I, I, 0, I, I, 0, 0}));
    EXPECT_THROW(q3::attention_mask(std::vector<int32_t>{1, 1}, 3, 1), Error);
}

TEST(Qwen3Text, BadInputIsAnError) {
    Ref r = load_ref();
    q3::Qwen3RunOptions opt;
    opt.threads = 2;
    q3::Qwen3TextEncoder te(r.idx, opt);
    EXPECT_THROW(te.run(r.ids, r.mask, r.B, r.L, std::vector<int>{5}), Error);
    EXPECT_THROW(te.run(r.ids, r.mask, r.B, r.L, std::vector<int>{-6}), Error);
    EXPECT_THROW(te.run(r.ids, r.mask, r.B, r.L, std::vector<int>{}), Error);
    EXPECT_THROW(te.run(r.ids, r.mask, r.B, r.L + 1, kAll), Error);
    EXPECT_THROW(te.run(r.ids, std::vector<int32_t>{1, 1}, r.B, r.L, kAll), Error);
    auto bad = r.ids;
    bad[3] = 1000;
    EXPECT_THROW(te.run(bad, r.mask, r.B, r.L, kAll), Error);
    // only the first 3 layers built and loaded: a 3-layer model (index 4 no longer exists)
    q3::Qwen3RunOptions three = opt;
    three.overrides.layers = 3;
    q3::Qwen3TextEncoder te3(r.idx, three);
    EXPECT_EQ(te3.model().n_blocks(), 3);
    EXPECT_LT(max_abs_diff(te3.run(r.ids, r.mask, r.B, r.L, std::vector<int>{2})[0].data, r.out("hidden_states.2")), 1e-4f);
    EXPECT_THROW(te3.run(r.ids, r.mask, r.B, r.L, std::vector<int>{4}), Error);
    three.overrides.layers = 5;
    EXPECT_THROW(q3::Qwen3TextEncoder(r.idx, three), Error);
    // a file that holds no Qwen3 model
    auto clip = io::WeightIndex::open(ref_path("clip_text_sd15_tiny.safetensors"));
    EXPECT_FALSE(q3::find_qwen3(clip));
    EXPECT_THROW(q3::Qwen3TextEncoder(clip, opt), Error);
    // no mask = no padding: row 0 (unpadded) agrees with the masked run
    auto a = te.run(r.ids, {}, r.B, r.L, std::vector<int>{-1});
    auto ref = r.out("last_hidden_state");
    std::vector<float> row0(ref.begin(), ref.begin() + 16 * 32), got0(a[0].data.begin(), a[0].data.begin() + 16 * 32);
    EXPECT_LT(max_abs_diff(got0, row0), 1e-4f);
}
