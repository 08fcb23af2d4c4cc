// FLUX.2 DiT against diffusers' Flux2Transformer2DModel (tests/data/reference/flux2_klein_transformer_tiny):
// the diffusers layout as stored, the BFL/ComfyUI layout built from the same tensors (fused
// qkv rows, swapped final modulation, renamed modulation/MLP layers), and a run cut into two
// graphs inside the double blocks.
#include "core/error.h"
#include "models/flux/flux2_dit.h"
#include "runtime/graph_runner.h"

#include "flux_test_util.h"

#include <gtest/gtest.h>

using namespace easel;
using namespace easel::fluxtest;
namespace flux = easel::models::flux;

namespace {

struct Flux2Ref {
    TensorMap w, io;
    std::vector<float> ids;  // [txt; img] x 4
    int64_t Lt = 0, Li = 0;
};

Flux2Ref load_flux2() {
    Flux2Ref r;
    auto idx = io::WeightIndex::open(ref("flux2_klein_transformer_tiny.safetensors"));
    read_fixture(idx, r.w, r.io);
    const T& txt = r.io.at("__input__.txt_ids");  // [1, 10, 4]
    const T& img = r.io.at("__input__.img_ids");  // [1, 24, 4]
    r.Lt = txt.shape[1];
    r.Li = img.shape[1];
    r.ids = txt.data;
    r.ids.insert(r.ids.end(), img.data.begin(), img.data.end());
    return r;
}

// diffusers names -> BFL names (inverse of convert_flux2_transformer_checkpoint_to_diffusers).
TensorMap to_bfl(const TensorMap& w) {
    TensorMap o;
    auto lin = [&](const std::string& d, const std::string& b) { o[b + ".weight"] = w.at(d + ".weight"); };
    lin("x_embedder", "img_in");
    lin("context_embedder", "txt_in");
    lin("time_guidance_embed.timestep_embedder.linear_1", "time_in.in_layer");
    lin("time_guidance_embed.timestep_embedder.linear_2", "time_in.out_layer");
    lin("double_stream_modulation_img.linear", "double_stream_modulation_img.lin");
    lin("double_stream_modulation_txt.linear", "double_stream_modulation_txt.lin");
    lin("single_stream_modulation.linear", "single_stream_modulation.lin");
    lin("proj_out", "final_layer.linear");
    o["final_layer.adaLN_modulation.1.weight"] = swap_halves(w.at("norm_out.linear.weight"));
    for (int i = 0; i < 2; ++i) {
        const std::string t = "transformer_blocks." + std::to_string(i) + ".", b = "double_blocks." + std::to_string(i) + ".";
        o[b + "img_attn.qkv.weight"] =
            cat_rows({&w.at(t + "attn.to_q.weight"), &w.at(t + "attn.to_k.weight"), &w.at(t + "attn.to_v.weight")});
        o[b + "txt_attn.qkv.weight"] =
            cat_rows({&w.at(t + "attn.add_q_proj.weight"), &w.at(t + "attn.add_k_proj.weight"), &w.at(t + "attn.add_v_proj.weight")});
        o[b + "img_attn.norm.query_norm.scale"] = w.at(t + "attn.norm_q.weight");
        o[b + "img_attn.norm.key_norm.scale"] = w.at(t + "attn.norm_k.weight");
        o[b + "txt_attn.norm.query_norm.scale"] = w.at(t + "attn.norm_added_q.weight");
        o[b + "txt_attn.norm.key_norm.scale"] = w.at(t + "attn.norm_added_k.weight");
        lin(t + "attn.to_out.0", b + "img_attn.proj");
        lin(t + "attn.to_add_out", b + "txt_attn.proj");
        lin(t + "ff.linear_in", b + "img_mlp.0");
        lin(t + "ff.linear_out", b + "img_mlp.2");
        lin(t + "ff_context.linear_in", b + "txt_mlp.0");
        lin(t + "ff_context.linear_out", b + "txt_mlp.2");
    }
    for (int i = 0; i < 2; ++i) {
        const std::string t = "single_transformer_blocks." + std::to_string(i) + ".", b = "single_blocks." + std::to_string(i) + ".";
        lin(t + "attn.to_qkv_mlp_proj", b + "linear1");
        lin(t + "attn.to_out", b + "linear2");
        o[b + "norm.query_norm.scale"] = w.at(t + "attn.norm_q.weight");
        o[b + "norm.key_norm.scale"] = w.at(t + "attn.norm_k.weight");
    }
    return o;
}

flux::Flux2Inputs inputs(runtime::GraphBuilder& g, const Flux2Ref& r, const flux::Flux2DiTConfig& cfg) {
    auto rope = flux::rope_tables(r.ids, r.Lt + r.Li, cfg.axes_dims, cfg.theta);
    flux::Flux2Inputs in;
    in.img = g.input_f32("img", {cfg.in_channels, r.Li, 1}, r.io.at("__input__.hidden_states").data);
    in.txt = g.input_f32("txt", {cfg.joint_dim, r.Lt, 1}, r.io.at("__input__.encoder_hidden_states").data);
    in.timestep = g.input_f32("t", {1}, r.io.at("__input__.timestep").data);
    in.rope_cos = g.input_f32("cos", {rope.half_dim, rope.tokens}, rope.cos);
    in.rope_sin = g.input_f32("sin", {rope.half_dim, rope.tokens}, rope.sin);
    return in;
}

float run_parity(const Flux2Ref& r, const io::WeightIndex& idx, flux::FluxLayout layout) {
    runtime::GraphRunner run(nullptr, 2);
    auto m = flux::Flux2DiTModel::load(idx, run.buffer_type());
    EXPECT_EQ(m.source.layout, layout);
    const auto& cfg = m.module->config();
    EXPECT_EQ(cfg.hidden, 32);
    EXPECT_EQ(cfg.heads, 2);
    EXPECT_EQ(cfg.head_dim, 16);
    EXPECT_EQ(cfg.in_channels, 16);
    EXPECT_EQ(cfg.out_channels, 16);
    EXPECT_EQ(cfg.joint_dim, 96);
    EXPECT_EQ(cfg.mlp_hidden, 96);  // mlp_ratio 3
    EXPECT_EQ(cfg.n_double, 2);
    EXPECT_EQ(cfg.n_single, 2);
    EXPECT_FALSE(cfg.guidance_embeds);
    EXPECT_EQ(cfg.axes_dims, (std::vector<int>{4, 4, 4, 4}));  // the fixture's axes_dims_rope
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false, g.backend()};
        return std::vector<ggml_tensor*>{m.module->forward(c, inputs(g, r, cfg)).sample};
    });
    return max_abs_diff(out[0].data, r.io.at("__output__.sample").data);
}

}  // namespace

TEST(Flux2DiT, PositionIdsMatchKleinPipeline) {
    // the fixture's ids are Flux2KleinPipeline._prepare_text_ids / _prepare_latent_ids of a 4x6 grid
    Flux2Ref r = load_flux2();
    EXPECT_EQ(flux::flux2_text_ids(r.Lt), r.io.at("__input__.txt_ids").data);
    EXPECT_EQ(flux::flux2_image_ids(4, 6), r.io.at("__input__.img_ids").data);
    EXPECT_EQ(flux::default_flux2_axes(128), (std::vector<int>{32, 32, 32, 32}));
}

TEST(Flux2DiT, MatchesDiffusersTinyDiffusersLayout) {
    Flux2Ref r = load_flux2();
    auto bytes = safetensors_bytes(r.w);
    auto idx = io::WeightIndex::open_memory(bytes, "flux2_diffusers");
    const float err = run_parity(r, idx, flux::FluxLayout::Diffusers);
    std::printf("flux2 diffusers layout: max abs err %.3g\n", err);
    EXPECT_LT(err, 1e-4f);
}

TEST(Flux2DiT, MatchesDiffusersTinyBflLayout) {
    Flux2Ref r = load_flux2();
    auto bytes = safetensors_bytes(to_bfl(r.w));
    auto idx = io::WeightIndex::open_memory(bytes, "flux2_bfl");
    const float err = run_parity(r, idx, flux::FluxLayout::Bfl);
    std::printf("flux2 BFL layout: max abs err %.3g\n", err);
    EXPECT_LT(err, 1e-4f);
}

TEST(Flux2DiT, SegmentedRunMatchesWhole) {
    Flux2Ref r = load_flux2();
    auto bytes = safetensors_bytes(r.w);
    auto idx = io::WeightIndex::open_memory(bytes, "flux2_diffusers");
    runtime::GraphRunner run(nullptr, 2);
    auto m = flux::Flux2DiTModel::load(idx, run.buffer_type());
    const auto& cfg = m.module->config();
    std::vector<std::string> names;
    int64_t n_txt = 0;
    auto part1 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false, g.backend()};
        flux::Flux2State s = m.module->forward_range(c, m.module->prologue(c, inputs(g, r, cfg)), 0, 1);
        n_txt = s.n_txt;
        std::vector<ggml_tensor*> t;
        s.visit_tensors([&](const char* n, ggml_tensor*& x) {
            names.push_back(n);
            t.push_back(x);
        });
        return t;
    });
    ASSERT_EQ(names, (std::vector<std::string>{"img", "txt", "temb", "mod_img", "mod_txt", "mod_single", "rope_cos", "rope_sin"}));
    auto part2 = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false, g.backend()};
        flux::Flux2State s;
        s.n_txt = n_txt;
        // same slots as part 1, each replaced by an input holding its values
        s.img = s.txt = s.temb = s.mod_img = s.mod_txt = s.mod_single = s.rope_cos = s.rope_sin = nullptr;
        ggml_tensor** slots[] = {&s.img, &s.txt, &s.temb, &s.mod_img, &s.mod_txt, &s.mod_single, &s.rope_cos, &s.rope_sin};
        for (size_t i = 0; i < names.size(); ++i)
            *slots[i] = g.input_f32(names[i], std::vector<int64_t>(part1[i].ne.begin(), part1[i].ne.end()), part1[i].data);
        return std::vector<ggml_tensor*>{m.module->epilogue(c, m.module->forward_range(c, s, 1, 4)).sample};
    });
    EXPECT_LT(max_abs_diff(part2[0].data, r.io.at("__output__.sample").data), 1e-4f);
}

TEST(Flux2DiT, WrongContextWidthIsRefused) {
    // e.g. Qwen3-4B features (3 x 2560) given to a model built for another encoder
    Flux2Ref r = load_flux2();
    auto bytes = safetensors_bytes(r.w);
    auto idx = io::WeightIndex::open_memory(bytes, "flux2_diffusers");
    runtime::GraphRunner run(nullptr, 2);
    auto m = flux::Flux2DiTModel::load(idx, run.buffer_type());
    const auto& cfg = m.module->config();
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx()};
        auto in = inputs(g, r, cfg);
        in.txt = g.input_f32("txt2", {64, r.Lt, 1}, std::vector<float>(size_t(64 * r.Lt)));
        return std::vector<ggml_tensor*>{m.module->forward(c, in).sample};
    }),
                 Error);
    // a FLUX.1 finder does not take a FLUX.2 file, and vice versa
    EXPECT_FALSE(flux::find_flux_dit(idx).has_value());
}
