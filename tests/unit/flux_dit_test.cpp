// FLUX.1 DiT against diffusers' FluxTransformer2DModel (tests/data/reference/flux1_transformer_tiny):
// the diffusers layout as stored, the BFL/ComfyUI layout built from the same tensors (fused
// qkv / linear1 rows, swapped final modulation, "model.diffusion_model." prefix), a run cut
// into two graphs across the double/single boundary, and bad input.
#include "core/error.h"
#include "models/flux/flux_dit.h"
#include "runtime/graph_runner.h"

#include "flux_test_util.h"

#include <ggml.h>
#include <gguf.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

using namespace easel;
using namespace easel::fluxtest;
namespace flux = easel::models::flux;

namespace {

struct Flux1Ref {
    TensorMap w, io;
    std::vector<float> ids;  // [txt; img] x 3
    int64_t Lt = 0, Li = 0;
};

Flux1Ref load_flux1() {
    Flux1Ref r;
    auto idx = io::WeightIndex::open(ref("flux1_transformer_tiny.safetensors"));
    read_fixture(idx, r.w, r.io);
    const T& txt = r.io.at("__input__.txt_ids");
    const T& img = r.io.at("__input__.img_ids");
    r.Lt = txt.shape[0];
    r.Li = img.shape[0];
    r.ids = txt.data;
    r.ids.insert(r.ids.end(), img.data.begin(), img.data.end());
    return r;
}

// diffusers names -> BFL names (the inverse of diffusers' convert_flux_transformer_checkpoint_to_diffusers).
TensorMap to_bfl(const TensorMap& w, const std::string& prefix) {
    TensorMap o;
    auto put = [&](const std::string& name, T t) { o[prefix + name] = std::move(t); };
    auto lin = [&](const std::string& d, const std::string& b) {
        put(b + ".weight", w.at(d + ".weight"));
        put(b + ".bias", w.at(d + ".bias"));
    };
    lin("x_embedder", "img_in");
    lin("context_embedder", "txt_in");
    lin("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer");
    lin("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer");
    lin("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer");
    lin("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer");
    lin("time_text_embed.text_embedder.linear_1", "vector_in.in_layer");
    lin("time_text_embed.text_embedder.linear_2", "vector_in.out_layer");
    lin("proj_out", "final_layer.linear");
    put("final_layer.adaLN_modulation.1.weight", swap_halves(w.at("norm_out.linear.weight")));
    put("final_layer.adaLN_modulation.1.bias", swap_halves(w.at("norm_out.linear.bias")));
    for (int i = 0; i < 2; ++i) {
        const std::string t = "transformer_blocks." + std::to_string(i) + ".", b = "double_blocks." + std::to_string(i) + ".";
        lin(t + "norm1.linear", b + "img_mod.lin");
        lin(t + "norm1_context.linear", b + "txt_mod.lin");
        for (const char* s : {".weight", ".bias"}) {
            put(b + "img_attn.qkv" + s, cat_rows({&w.at(t + "attn.to_q" + s), &w.at(t + "attn.to_k" + s), &w.at(t + "attn.to_v" + s)}));
            put(b + "txt_attn.qkv" + s, cat_rows({&w.at(t + "attn.add_q_proj" + s), &w.at(t + "attn.add_k_proj" + s),
                                                  &w.at(t + "attn.add_v_proj" + s)}));
        }
        put(b + "img_attn.norm.query_norm.scale", w.at(t + "attn.norm_q.weight"));
        put(b + "img_attn.norm.key_norm.scale", w.at(t + "attn.norm_k.weight"));
        put(b + "txt_attn.norm.query_norm.scale", w.at(t + "attn.norm_added_q.weight"));
        put(b + "txt_attn.norm.key_norm.scale", w.at(t + "attn.norm_added_k.weight"));
        lin(t + "attn.to_out.0", b + "img_attn.proj");
        lin(t + "attn.to_add_out", b + "txt_attn.proj");
        lin(t + "ff.net.0.proj", b + "img_mlp.0");
        lin(t + "ff.net.2", b + "img_mlp.2");
        lin(t + "ff_context.net.0.proj", b + "txt_mlp.0");
        lin(t + "ff_context.net.2", b + "txt_mlp.2");
    }
    for (int i = 0; i < 2; ++i) {
        const std::string t = "single_transformer_blocks." + std::to_string(i) + ".", b = "single_blocks." + std::to_string(i) + ".";
        lin(t + "norm.linear", b + "modulation.lin");
        for (const char* s : {".weight", ".bias"})
            put(b + "linear1" + s, cat_rows({&w.at(t + "attn.to_q" + s), &w.at(t + "attn.to_k" + s), &w.at(t + "attn.to_v" + s),
                                             &w.at(t + "proj_mlp" + s)}));
        put(b + "norm.query_norm.scale", w.at(t + "attn.norm_q.weight"));
        put(b + "norm.key_norm.scale", w.at(t + "attn.norm_k.weight"));
        lin(t + "proj_out", b + "linear2");
    }
    return o;
}

flux::FluxInputs inputs(runtime::GraphBuilder& g, const Flux1Ref& r, const flux::FluxDiTConfig& cfg, bool guidance = true) {
    auto rope = flux::rope_tables(r.ids, r.Lt + r.Li, cfg.axes_dims, cfg.theta);
    flux::FluxInputs in;
    in.img = g.input_f32("img", {cfg.in_channels, r.Li, 1}, r.io.at("__input__.hidden_states").data);
    in.txt = g.input_f32("txt", {cfg.joint_dim, r.Lt, 1}, r.io.at("__input__.encoder_hidden_states").data);
    in.pooled = g.input_f32("pooled", {cfg.pooled_dim, 1}, r.io.at("__input__.pooled_projections").data);
    in.timestep = g.input_f32("t", {1}, r.io.at("__input__.timestep").data);
    if (guidance) in.guidance = g.input_f32("g", {1}, r.io.at("__input__.guidance").data);
    in.rope_cos = g.input_f32("cos", {rope.half_dim, rope.tokens}, rope.cos);
    in.rope_sin = g.input_f32("sin", {rope.half_dim, rope.tokens}, rope.sin);
    return in;
}

float run_parity(const Flux1Ref& r, const io::WeightIndex& idx, flux::FluxLayout expect_layout, const std::string& expect_prefix) {
    runtime::GraphRunner run(nullptr, 2);
    auto m = flux::FluxDiTModel::load(idx, run.buffer_type());
    EXPECT_EQ(m.source.layout, expect_layout);
    EXPECT_EQ(m.source.prefix, expect_prefix);
    const auto& cfg = m.module->config();
    EXPECT_EQ(cfg.hidden, 32);
    EXPECT_EQ(cfg.heads, 2);
    EXPECT_EQ(cfg.head_dim, 16);
    EXPECT_EQ(cfg.in_channels, 16);
    EXPECT_EQ(cfg.out_channels, 16);
    EXPECT_EQ(cfg.joint_dim, 32);
    EXPECT_EQ(cfg.pooled_dim, 24);
    EXPECT_EQ(cfg.mlp_hidden, 128);
    EXPECT_EQ(cfg.n_double, 2);
    EXPECT_EQ(cfg.n_single, 2);
    EXPECT_TRUE(cfg.guidance_embeds);
    EXPECT_EQ(cfg.axes_dims, (std::vector<int>{4, 6, 6}));  // the fixture's axes_dims_rope, derived from head_dim 16
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false, g.backend()};
        return std::vector<ggml_tensor*>{m.module->forward(c, inputs(g, r, cfg)).sample};
    });
    EXPECT_EQ(out[0].ne[0], 16);
    EXPECT_EQ(out[0].ne[1], r.Li);
    return max_abs_diff(out[0].data, r.io.at("__output__.sample").data);
}

}  // namespace

TEST(FluxDiT, DefaultAxes) {
    EXPECT_EQ(flux::default_flux1_axes(128), (std::vector<int>{16, 56, 56}));  // FLUX.1 dev/schnell axes_dims_rope
    EXPECT_EQ(flux::default_flux1_axes(16), (std::vector<int>{4, 6, 6}));
    EXPECT_THROW(flux::default_flux1_axes(7), Error);
}

TEST(FluxDiT, RopeTablesByHand) {
    // one token with ids (2, 3) over axes (2, 4), theta 10000: axis 0 pair 0 angle 2 * 1;
    // axis 1 pair 0 angle 3 * 1, pair 1 angle 3 * 10000^(-2/4) = 0.03.
    std::vector<float> ids{2.0f, 3.0f};
    std::vector<int> axes{2, 4};
    auto r = flux::rope_tables(ids, 1, axes, 10000.0);
    ASSERT_EQ(r.half_dim, 3);
    EXPECT_NEAR(r.cos[0], std::cos(2.0), 1e-7);
    EXPECT_NEAR(r.sin[1], std::sin(3.0), 1e-7);
    EXPECT_NEAR(r.sin[2], std::sin(0.03), 1e-7);
    EXPECT_THROW(flux::rope_tables(ids, 2, axes, 10000.0), Error);
}

TEST(FluxDiT, PackLatentsMatchesFluxPipeline) {
    // latent [1, 2, 2, 4] with value = c*100 + y*10 + x; token (0, 1) (y 0-1, x 2-3) holds
    // features c*4 + dy*2 + dx = (2, 3, 12, 13, 102, 103, 112, 113).
    std::vector<float> lat(16);
    for (int c = 0; c < 2; ++c)
        for (int y = 0; y < 2; ++y)
            for (int x = 0; x < 4; ++x) lat[size_t(c * 8 + y * 4 + x)] = float(c * 100 + y * 10 + x);
    auto tok = flux::pack_latents(lat, 1, 2, 2, 4);
    std::vector<float> t1(tok.begin() + 8, tok.begin() + 16);
    EXPECT_EQ(t1, (std::vector<float>{2, 3, 12, 13, 102, 103, 112, 113}));
    EXPECT_EQ(flux::unpack_latents(tok, 1, 2, 2, 4), lat);
    EXPECT_THROW(flux::pack_latents(lat, 1, 4, 1, 4), Error);
}

TEST(FluxDiT, MatchesDiffusersTinyDiffusersLayout) {
    Flux1Ref r = load_flux1();
    auto bytes = safetensors_bytes(r.w);
    auto idx = io::WeightIndex::open_memory(bytes, "flux1_diffusers");
    const float err = run_parity(r, idx, flux::FluxLayout::Diffusers, "");
    std::printf("flux1 diffusers layout: max abs err %.3g\n", err);
    EXPECT_LT(err, 1e-4f);
}

TEST(FluxDiT, MatchesDiffusersTinyBflLayout) {
    Flux1Ref r = load_flux1();
    auto bytes = safetensors_bytes(to_bfl(r.w, "model.diffusion_model."));
    auto idx = io::WeightIndex::open_memory(bytes, "flux1_bfl");
    const float err = run_parity(r, idx, flux::FluxLayout::Bfl, "model.diffusion_model.");
    std::printf("flux1 BFL layout: max abs err %.3g\n", err);
    EXPECT_LT(err, 1e-4f);
}

TEST(FluxDiT, SegmentedRunMatchesWhole) {
    // prologue + blocks [0, 3) (two double blocks and the first single block) in one graph, the
    // state read back and fed as inputs to a second graph running block 3 and the epilogue.
    Flux1Ref r = load_flux1();
    auto bytes = safetensors_bytes(r.w);
    auto idx = io::WeightIndex::open_memory(bytes, "flux1_diffusers");
    runtime::GraphRunner run(nullptr, 2);
    auto m = flux::FluxDiTModel::load(idx, run.buffer_type());
    const auto& cfg = m.module->config();
    std::vector<std::string> names;
    int64_t n_txt = 0;
    auto part1 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false, g.backend()};
        flux::FluxState s = m.module->forward_range(c, m.module->prologue(c, inputs(g, r, cfg)), 0, 3);
        n_txt = s.n_txt;
        std::vector<ggml_tensor*> t;
        s.visit_tensors([&](const char* n, ggml_tensor*& x) {
            names.push_back(n);
            t.push_back(x);
        });
        return t;
    });
    ASSERT_EQ(names, (std::vector<std::string>{"joint", "temb", "rope_cos", "rope_sin"}));
    auto part2 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false, g.backend()};
        flux::FluxState s;
        s.n_txt = n_txt;
        for (size_t i = 0; i < names.size(); ++i) {
            ggml_tensor* x = g.input_f32(names[i], std::vector<int64_t>(part1[i].ne.begin(), part1[i].ne.end()), part1[i].data);
            if (names[i] == "joint") s.joint = x;
            if (names[i] == "temb") s.temb = x;
            if (names[i] == "rope_cos") s.rope_cos = x;
            if (names[i] == "rope_sin") s.rope_sin = x;
        }
        return std::vector<ggml_tensor*>{m.module->epilogue(c, m.module->forward_range(c, s, 3, 4)).sample};
    });
    EXPECT_LT(max_abs_diff(part2[0].data, r.io.at("__output__.sample").data), 1e-4f);
    EXPECT_EQ(&m.module->block_params(0), &m.module->block_params(0));
    EXPECT_THROW(m.module->block_params(4), Error);
}

TEST(FluxDiT, BadInputIsRefused) {
    Flux1Ref r = load_flux1();
    auto bytes = safetensors_bytes(r.w);
    auto idx = io::WeightIndex::open_memory(bytes, "flux1_diffusers");
    runtime::GraphRunner run(nullptr, 2);
    auto m = flux::FluxDiTModel::load(idx, run.buffer_type());
    const auto& cfg = m.module->config();
    // dev without guidance
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        return std::vector<ggml_tensor*>{m.module->forward(c, inputs(g, r, cfg, false)).sample};
    }),
                 Error);
    // context of the wrong width
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        auto in = inputs(g, r, cfg);
        in.txt = g.input_f32("txt2", {16, 20, 1}, std::vector<float>(320));
        return std::vector<ggml_tensor*>{m.module->forward(c, in).sample};
    }),
                 Error);
    // a file that is not a FLUX.1 DiT
    TensorMap junk{{"foo.weight", T{{2}, {1, 2}}}};
    auto jb = safetensors_bytes(junk);
    auto jidx = io::WeightIndex::open_memory(jb, "junk");
    EXPECT_THROW(flux::FluxDiTModel::load(jidx, run.buffer_type()), Error);
}

TEST(FluxDiT, FlashAttentionMatchesDiffusersTiny) {
    Flux1Ref r = load_flux1();
    auto bytes = safetensors_bytes(r.w);
    auto idx = io::WeightIndex::open_memory(bytes, "flux1_diffusers");
    runtime::GraphRunner run(nullptr, 2);
    auto m = flux::FluxDiTModel::load(idx, run.buffer_type());
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), true, g.backend()};
        return std::vector<ggml_tensor*>{m.module->forward(c, inputs(g, r, m.module->config())).sample};
    });
    const float err = max_abs_diff(out[0].data, r.io.at("__output__.sample").data);
    std::printf("flux1 flash attention: max abs err %.3g\n", err);
    EXPECT_LT(err, 1e-4f);
}

TEST(FluxDiT, SchnellLayoutHasNoGuidance) {
    // FLUX.1-schnell = the dev layout without time_text_embed.guidance_embedder. With the guidance
    // embedder's output layer zeroed, dev's guidance embedding is 0, so schnell built from the
    // same other weights must give dev's output bit for bit up to float rounding.
    Flux1Ref r = load_flux1();
    TensorMap schnell = r.w, zeroed = r.w;
    for (const char* n : {"weight", "bias"}) {
        schnell.erase(std::string("time_text_embed.guidance_embedder.linear_1.") + n);
        schnell.erase(std::string("time_text_embed.guidance_embedder.linear_2.") + n);
        auto& t = zeroed.at(std::string("time_text_embed.guidance_embedder.linear_2.") + n);
        std::fill(t.data.begin(), t.data.end(), 0.0f);
    }
    auto sb = safetensors_bytes(schnell), zb = safetensors_bytes(zeroed);
    auto sidx = io::WeightIndex::open_memory(sb, "schnell"), zidx = io::WeightIndex::open_memory(zb, "zeroed");
    runtime::GraphRunner run(nullptr, 2);
    auto ms = flux::FluxDiTModel::load(sidx, run.buffer_type());
    auto mz = flux::FluxDiTModel::load(zidx, run.buffer_type());
    EXPECT_FALSE(ms.module->config().guidance_embeds);
    EXPECT_TRUE(mz.module->config().guidance_embeds);
    auto os = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        return std::vector<ggml_tensor*>{ms.module->forward(c, inputs(g, r, ms.module->config(), false)).sample};
    });
    auto oz = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        return std::vector<ggml_tensor*>{mz.module->forward(c, inputs(g, r, mz.module->config())).sample};
    });
    EXPECT_LT(max_abs_diff(os[0].data, oz[0].data), 1e-6f);
    // and it differs from the real dev output (the guidance embedding matters there)
    EXPECT_GT(max_abs_diff(os[0].data, r.io.at("__output__.sample").data), 1e-3f);
}

namespace {

// Writes tensors as a city96-style GGUF (BFL names, no prefix): 2-D weights whose rows hold a
// multiple of 32 values in Q8_0, everything else F32.
std::filesystem::path write_q8_gguf(const TensorMap& ts, const std::string& tag) {
    size_t bytes = 0;
    for (auto& [n, t] : ts) bytes += t.data.size() * 4 + 1024;
    ggml_init_params ip{bytes + ts.size() * ggml_tensor_overhead(), nullptr, false};
    ggml_context* ctx = ggml_init(ip);
    gguf_context* g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", "flux");
    for (auto& [name, t] : ts) {
        const bool q = t.shape.size() == 2 && t.shape[1] % 32 == 0;
        ggml_tensor* x = t.shape.size() == 2 ? ggml_new_tensor_2d(ctx, q ? GGML_TYPE_Q8_0 : GGML_TYPE_F32, t.shape[1], t.shape[0])
                                             : ggml_new_tensor_1d(ctx, GGML_TYPE_F32, t.shape[0]);
        ggml_set_name(x, name.c_str());
        if (q) ggml_quantize_chunk(GGML_TYPE_Q8_0, t.data.data(), x->data, 0, t.shape[0], t.shape[1], nullptr);
        else std::memcpy(x->data, t.data.data(), t.data.size() * 4);
        gguf_add_tensor(g, x);
    }
    auto path = std::filesystem::temp_directory_path() / ("easel_flux1_" + tag + "_" + std::to_string(::getpid()) + ".gguf");
    EXPECT_TRUE(gguf_write_to_file(g, path.string().c_str(), false));
    gguf_free(g);
    ggml_free(ctx);
    return path;
}

}  // namespace

TEST(FluxDiT, City96StyleQ8GgufMatchesQ8Conversion) {
    // A Q8_0 GGUF in the BFL layout: fused qkv / linear1 rows are sliced out of quantised data
    // (whole rows, so whole Q8_0 blocks). It must give what the diffusers-layout F32 file gives
    // when its weights are converted to Q8_0 on load (--type q8_0), and stay near the F32 reference.
    Flux1Ref r = load_flux1();
    auto gpath = write_q8_gguf(to_bfl(r.w, ""), "q8");
    auto gidx = io::WeightIndex::open(gpath);
    auto bytes = safetensors_bytes(r.w);
    auto fidx = io::WeightIndex::open_memory(bytes, "flux1_diffusers");
    runtime::GraphRunner run(nullptr, 2);
    auto mg = flux::FluxDiTModel::load(gidx, run.buffer_type());
    EXPECT_EQ(mg.source.layout, flux::FluxLayout::Bfl);
    nn::LoadOptions q8;
    q8.weight_type = GGML_TYPE_Q8_0;
    auto mf = flux::FluxDiTModel::load(fidx, run.buffer_type(), q8);
    auto fwd = [&](const flux::FluxDiTModel& m) {
        return run.run([&](runtime::GraphBuilder& g) {
            nn::Ctx c{g.ctx()};
            return std::vector<ggml_tensor*>{m.module->forward(c, inputs(g, r, m.module->config())).sample};
        })[0].data;
    };
    auto og = fwd(mg), of = fwd(mf);
    const float e_pair = max_abs_diff(og, of), e_ref = max_abs_diff(og, r.io.at("__output__.sample").data);
    std::printf("flux1 Q8_0 GGUF (BFL): vs --type q8_0 %.3g, vs F32 reference %.3g\n", e_pair, e_ref);
    EXPECT_LT(e_pair, 1e-6f);  // the same quantised bits either way
    EXPECT_LT(e_ref, 5e-2f);
    std::error_code ec;
    std::filesystem::remove(gpath, ec);
}

TEST(FluxDiT, RopeAxesFromConfigJson) {
    // a diffusers folder: config.json's axes_dims_rope / rope_theta replace the defaults
    Flux1Ref r = load_flux1();
    auto dir = std::filesystem::temp_directory_path() / ("easel_flux1_folder_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    auto bytes = safetensors_bytes(r.w);
    {
        std::ofstream f(dir / "diffusion_pytorch_model.safetensors", std::ios::binary);
        f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    }
    auto write_cfg = [&](const std::string& text) { std::ofstream(dir / "config.json") << text; };
    runtime::GraphRunner run(nullptr, 2);
    write_cfg(R"({"_class_name": "FluxTransformer2DModel", "axes_dims_rope": [2, 6, 8], "rope_theta": 500})");
    {
        auto idx = io::WeightIndex::open(dir);
        auto m = flux::FluxDiTModel::load(idx, run.buffer_type());
        EXPECT_EQ(m.module->config().axes_dims, (std::vector<int>{2, 6, 8}));
        EXPECT_EQ(m.module->config().theta, 500.0);
    }
    write_cfg(R"({"axes_dims_rope": [4, 4, 4]})");  // sums to 12, the head size is 16
    {
        auto idx = io::WeightIndex::open(dir);
        EXPECT_THROW(flux::FluxDiTModel::load(idx, run.buffer_type()), Error);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}
