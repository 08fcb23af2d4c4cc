// SD UNet (diffusers UNet2DConditionModel) against the tiny diffusers reference fixture
// tests/data/reference/unet_sd15_tiny.* (diffusers 0.40.0.dev0, float32, CPU).
#include "core/error.h"
#include "io/weight_index.h"
#include "models/sd/unet.h"
#include "runtime/graph_runner.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <unistd.h>

using namespace easel;
using namespace easel::models::sd;

namespace {

const std::filesystem::path kDir = std::filesystem::path(EASEL_TEST_DATA) / "reference";
const std::filesystem::path kWeights = kDir / "unet_sd15_tiny.safetensors";

// heads/groups/etc. of the fixture, from its JSON sidecar (the diffusers config)
UNetOverrides fixture_overrides() {
    std::ifstream f(kDir / "unet_sd15_tiny.json");
    auto j = nlohmann::json::parse(f);
    return unet_overrides_from_diffusers_config(j.at("config"));
}

std::vector<float> tensor(const io::WeightIndex& idx, const std::string& name) {
    const io::TensorInfo* t = idx.find(name);
    if (!t) throw std::runtime_error("fixture lacks " + name);
    return idx.read_f32(*t);
}

struct Inputs {
    std::vector<float> sample, timestep, context, expected;
};

Inputs fixture_inputs(const io::WeightIndex& idx) {
    return {tensor(idx, "__input__.sample"), tensor(idx, "__input__.timestep"), tensor(idx, "__input__.encoder_hidden_states"),
            tensor(idx, "__output__.sample")};
}

// Runs the UNet: sample [N, C, H, W], timestep [N], context [N, L, D] (PyTorch order, same memory as ggml ne reversed).
runtime::HostTensor run_unet(const UNet2DCondition& net, runtime::GraphRunner& runner, const std::vector<float>& sample,
                             std::array<int64_t, 4> nchw, const std::vector<float>& t, const std::vector<float>& ctx,
                             int64_t L, bool flash) {
    auto out = runner.run([&](runtime::GraphBuilder& g) {
        UNetInputs in;
        in.sample = g.input_f32("sample", {nchw[3], nchw[2], nchw[1], nchw[0]}, sample);
        in.timestep = g.input_f32("timestep", {(int64_t)t.size()}, t);
        in.context = g.input_f32("context", {(int64_t)ctx.size() / (L * nchw[0]), L, nchw[0]}, ctx);
        nn::Ctx c{g.ctx(), flash};
        return std::vector<ggml_tensor*>{net.forward(c, in)};
    });
    return out.at(0);
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float m = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

nn::LoadOptions no_unexpected_check() {
    nn::LoadOptions o;
    o.check_unexpected = false;  // the fixture file also holds __input__/__output__ tensors
    return o;
}

// Writes a safetensors file of F32 tensors (header: name -> dtype, shape, data_offsets).
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>>& ts) {
    nlohmann::json h = nlohmann::json::object();
    uint64_t off = 0;
    for (auto& [name, v] : ts) {
        const uint64_t n = v.second.size() * sizeof(float);
        h[name] = {{"dtype", "F32"}, {"shape", v.first}, {"data_offsets", {off, off + n}}};
        off += n;
    }
    std::string hs = h.dump();
    while (hs.size() % 8) hs += ' ';
    std::ofstream f(path, std::ios::binary);
    uint64_t len = hs.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(hs.data(), (std::streamsize)hs.size());
    for (auto& [name, v] : ts) f.write(reinterpret_cast<const char*>(v.second.data()), (std::streamsize)(v.second.size() * 4));
}

// The original LDM (CompVis) name of each fixture key, written out by hand for the fixture's
// structure (layers_per_block 2; down: [attn + downsample, plain]; up: [plain + upsample, attn])
// from the rules in diffusers' loaders/single_file_utils.py (convert_ldm_unet_checkpoint):
// input_blocks.0.0 = conv_in; input_blocks.(1 + b*3 + j).0 / .1 = down resnet / attention;
// input_blocks.(1 + b*3 + 2).0.op = downsampler; middle_block.0/1/2; output_blocks.(b*3 + j).0 / .1;
// upsampler output_blocks.(b*3 + 2).1.conv (.2.conv when the block has attentions);
// time_embed.0/2, out.0/2; resnet norm1/conv1/time_emb_proj/norm2/conv2/conv_shortcut =
// in_layers.0/in_layers.2/emb_layers.1/out_layers.0/out_layers.3/skip_connection.
std::string fixture_ldm_name(const std::string& k) {
    static const std::vector<std::pair<std::string, std::string>> blocks = {
        {"conv_in.", "input_blocks.0.0."},
        {"time_embedding.linear_1.", "time_embed.0."},
        {"time_embedding.linear_2.", "time_embed.2."},
        {"down_blocks.0.resnets.0.", "input_blocks.1.0.R"},
        {"down_blocks.0.attentions.0.", "input_blocks.1.1."},
        {"down_blocks.0.resnets.1.", "input_blocks.2.0.R"},
        {"down_blocks.0.attentions.1.", "input_blocks.2.1."},
        {"down_blocks.0.downsamplers.0.conv.", "input_blocks.3.0.op."},
        {"down_blocks.1.resnets.0.", "input_blocks.4.0.R"},
        {"down_blocks.1.resnets.1.", "input_blocks.5.0.R"},
        {"mid_block.resnets.0.", "middle_block.0.R"},
        {"mid_block.attentions.0.", "middle_block.1."},
        {"mid_block.resnets.1.", "middle_block.2.R"},
        {"up_blocks.0.resnets.0.", "output_blocks.0.0.R"},
        {"up_blocks.0.resnets.1.", "output_blocks.1.0.R"},
        {"up_blocks.0.resnets.2.", "output_blocks.2.0.R"},
        {"up_blocks.0.upsamplers.0.conv.", "output_blocks.2.1.conv."},
        {"up_blocks.1.resnets.0.", "output_blocks.3.0.R"},
        {"up_blocks.1.attentions.0.", "output_blocks.3.1."},
        {"up_blocks.1.resnets.1.", "output_blocks.4.0.R"},
        {"up_blocks.1.attentions.1.", "output_blocks.4.1."},
        {"up_blocks.1.resnets.2.", "output_blocks.5.0.R"},
        {"up_blocks.1.attentions.2.", "output_blocks.5.1."},
        {"conv_norm_out.", "out.0."},
        {"conv_out.", "out.2."},
    };
    static const std::vector<std::pair<std::string, std::string>> resnet = {
        {"norm1.", "in_layers.0."},  {"conv1.", "in_layers.2."},         {"time_emb_proj.", "emb_layers.1."},
        {"norm2.", "out_layers.0."}, {"conv2.", "out_layers.3."},        {"conv_shortcut.", "skip_connection."},
    };
    for (auto& [d, l] : blocks) {
        if (k.rfind(d, 0) != 0) continue;
        std::string rest = k.substr(d.size());
        if (l.back() != 'R') return l + rest;
        for (auto& [rd, rl] : resnet)
            if (rest.rfind(rd, 0) == 0) return l.substr(0, l.size() - 1) + rl + rest.substr(rd.size());
        return {};
    }
    return {};
}

}  // namespace

TEST(UnetConfig, InferredFromTinyFixture) {
    auto idx = io::WeightIndex::open(kWeights);
    UNetConfig c = infer_unet_config(idx, fixture_overrides());
    EXPECT_EQ(c.layout, UNetKeyLayout::Diffusers);
    EXPECT_EQ(c.prefix, "");
    EXPECT_EQ(c.in_channels, 4);
    EXPECT_EQ(c.out_channels, 4);
    EXPECT_EQ(c.model_channels, 16);
    EXPECT_EQ(c.time_proj_dim, 16);
    EXPECT_EQ(c.time_embed_dim, 64);
    EXPECT_EQ(c.context_dim, 32);
    EXPECT_EQ(c.layers_per_block, 2);
    EXPECT_EQ(c.norm_groups, 8);
    EXPECT_TRUE(c.flip_sin_to_cos);
    EXPECT_EQ(c.freq_shift, 0.0f);
    ASSERT_EQ(c.down.size(), 2u);
    EXPECT_EQ(c.down[0].resnets.size(), 2u);
    EXPECT_EQ(c.down[0].attentions.size(), 2u);
    EXPECT_TRUE(c.down[0].downsample);
    EXPECT_EQ(c.down[1].attentions.size(), 0u);
    EXPECT_FALSE(c.down[1].downsample);
    EXPECT_EQ(c.down[1].resnets[0].in, 16);
    EXPECT_EQ(c.down[1].resnets[0].out, 32);
    EXPECT_TRUE(c.down[1].resnets[0].shortcut);
    ASSERT_TRUE(c.mid.present);
    EXPECT_EQ(c.mid.resnets.size(), 2u);
    ASSERT_EQ(c.mid.attentions.size(), 1u);
    ASSERT_EQ(c.up.size(), 2u);
    EXPECT_EQ(c.up[0].resnets.size(), 3u);
    EXPECT_TRUE(c.up[0].upsample);
    EXPECT_TRUE(c.up[0].attentions.empty());
    EXPECT_EQ(c.up[1].attentions.size(), 3u);
    EXPECT_FALSE(c.up[1].upsample);
    // up_blocks.0.resnets.0 takes mid output (32) + the skip from down_blocks.1.resnets.1 (32)
    EXPECT_EQ(c.up[0].resnets[0].in, 64);
    // up_blocks.1.resnets.2 takes 16 + conv_in's 16
    EXPECT_EQ(c.up[1].resnets[2].in, 32);
    const TransformerSpec& t = c.down[0].attentions[0];
    EXPECT_FALSE(t.linear_proj);
    EXPECT_EQ(t.channels, 16);
    EXPECT_EQ(t.heads, 2);  // attention_head_dim=2 means 2 heads (diffusers naming quirk)
    EXPECT_EQ(t.head_dim, 8);
    EXPECT_EQ(t.depth, 1);
    EXPECT_EQ(t.context_dim, 32);
    EXPECT_EQ(t.ff_inner, 64);
    EXPECT_EQ(c.mid.attentions[0].heads, 2);
    EXPECT_EQ(c.mid.attentions[0].head_dim, 16);
    EXPECT_EQ(c.downsample_factor(), 2);
}

TEST(UnetConfig, ConventionsWhenConfigIsAbsent) {
    auto idx = io::WeightIndex::open(kWeights);
    // no overrides: 32 groups (real SD) cannot split the tiny model's 16 channels
    try {
        infer_unet_config(idx);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
        EXPECT_NE(std::string(e.what()).find("GroupNorm groups"), std::string::npos) << e.what();
    }
    // groups given, heads not: the SD1.x convention (conv projection) is 8 heads
    UNetOverrides ov;
    ov.norm_groups = 8;
    UNetConfig c = infer_unet_config(idx, ov);
    EXPECT_EQ(c.down[0].attentions[0].heads, 8);
    EXPECT_EQ(c.down[0].attentions[0].head_dim, 2);
    EXPECT_EQ(c.mid.attentions[0].heads, 8);
    EXPECT_EQ(c.mid.attentions[0].head_dim, 4);
    // head size override: heads = channels / head_dim
    ov.head_dim = 4;
    c = infer_unet_config(idx, ov);
    EXPECT_EQ(c.down[0].attentions[0].heads, 4);
    EXPECT_EQ(c.mid.attentions[0].heads, 8);
    // per-block heads list: mid uses the last entry, up block i entry n-1-i
    ov.num_heads = std::vector<int>{4, 2};
    c = infer_unet_config(idx, ov);
    EXPECT_EQ(c.down[0].attentions[0].heads, 4);
    EXPECT_EQ(c.mid.attentions[0].heads, 2);
    EXPECT_EQ(c.up[1].attentions[0].heads, 4);
    ov.num_heads = std::vector<int>{3};
    EXPECT_THROW(infer_unet_config(idx, ov), Error);  // 16 channels do not split into 3 heads
}

TEST(UnetConfig, DiffusersConfigJsonQuirk) {
    // attention_head_dim is the number of heads when num_attention_heads is null (SD1.x / SD2.x configs)
    auto o = unet_overrides_from_diffusers_config(
        nlohmann::json::parse(R"({"attention_head_dim": [5, 10, 20, 20], "num_attention_heads": null,
                                  "norm_num_groups": 32, "freq_shift": 0, "flip_sin_to_cos": true})"));
    ASSERT_TRUE(o.num_heads.has_value());
    EXPECT_EQ(*o.num_heads, (std::vector<int>{5, 10, 20, 20}));
    EXPECT_EQ(o.norm_groups, 32);
    o = unet_overrides_from_diffusers_config(nlohmann::json::parse(R"({"attention_head_dim": 8, "num_attention_heads": 4})"));
    EXPECT_EQ(*o.num_heads, (std::vector<int>{4}));
    EXPECT_THROW(unet_overrides_from_diffusers_config(nlohmann::json::parse(R"({"attention_head_dim": "x"})")), Error);
}

TEST(UnetConfig, NotAUnet) {
    auto idx = io::WeightIndex::open(kDir / "clip_text_sd15_tiny.safetensors");
    try {
        infer_unet_config(idx);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::ModelMismatch);
    }
}

TEST(UnetSd, MatchesDiffusersTinyFixture) {
    auto idx = io::WeightIndex::open(kWeights);
    runtime::GraphRunner runner;
    auto unet = load_unet(idx, runner.buffer_type(), fixture_overrides(), no_unexpected_check());
    auto in = fixture_inputs(idx);
    std::vector<std::vector<float>> outs;
    for (bool flash : {false, true}) {
        auto out = run_unet(*unet.net, runner, in.sample, {2, 4, 16, 16}, in.timestep, in.context, 77, flash);
        EXPECT_EQ(out.ne, (std::array<int64_t, 4>{16, 16, 4, 2}));
        const float err = max_abs_diff(out.data, in.expected);
        std::printf("[unet_sd15_tiny] flash_attn=%d max abs error %.3g\n", (int)flash, err);
        EXPECT_LT(err, 1e-4f) << "flash_attn=" << flash;
        outs.push_back(out.data);
    }
    std::printf("[unet_sd15_tiny] flash vs non-flash max abs difference %.3g\n", max_abs_diff(outs[0], outs[1]));
}

TEST(UnetSd, BlockSequenceCutAnywhereGivesSameOutput) {
    auto idx = io::WeightIndex::open(kWeights);
    runtime::GraphRunner runner;
    auto unet = load_unet(idx, runner.buffer_type(), fixture_overrides(), no_unexpected_check());
    auto& net = *unet.net;
    // 2 down, downsample, 2 down, mid, 3 + 3 up
    ASSERT_EQ(net.n_blocks(), 12);
    EXPECT_EQ(net.block_name(0), "down_blocks.0.resnets.0+attentions.0");
    EXPECT_EQ(net.block_kind(2), UNet2DCondition::Kind::Downsample);
    EXPECT_EQ(net.block_kind(5), UNet2DCondition::Kind::Mid);
    EXPECT_EQ(net.block_name(8), "up_blocks.0.resnets.2+upsamplers.0");
    // every parameter belongs to exactly one of prologue / blocks / epilogue, under its checkpoint name
    size_t n = 0;
    std::map<std::string, int> seen;
    auto count = [&](const std::string& name, const nn::Param&) { ++n, ++seen[name]; };
    net.visit_prologue_params(count);
    for (int i = 0; i < net.n_blocks(); ++i) net.block_params(i).visit_params("", count);
    net.visit_epilogue_params(count);
    EXPECT_EQ(n, net.param_count());
    for (auto& [name, k] : seen) {
        EXPECT_EQ(k, 1) << name;
        EXPECT_NE(idx.find(name), nullptr) << name;
    }
    EXPECT_TRUE(seen.count("down_blocks.0.attentions.1.transformer_blocks.0.ff.net.0.proj.weight"));
    EXPECT_TRUE(seen.count("mid_block.resnets.1.conv2.weight"));

    // Two graphs cut before block k: the first reads every state tensor back, the second starts
    // from inputs of the same values (what a segment boundary between devices does).
    auto in = fixture_inputs(idx);
    for (int k : {1, 5, 8}) {
        std::vector<std::string> names;
        auto first = runner.run([&](runtime::GraphBuilder& g) {
            UNetInputs ui;
            ui.sample = g.input_f32("sample", {16, 16, 4, 2}, in.sample);
            ui.timestep = g.input_f32("timestep", {2}, in.timestep);
            ui.context = g.input_f32("context", {32, 77, 2}, in.context);
            nn::Ctx c{g.ctx(), false};
            UNetState s = net.forward_range(c, net.prologue(c, ui), 0, k);
            std::vector<ggml_tensor*> outs;
            s.visit_tensors([&](const char* name, ggml_tensor*& t) {
                names.push_back(name);
                outs.push_back(t);
            });
            return outs;
        });
        ASSERT_GE(names.size(), 4u);
        EXPECT_EQ(names[0], "h");
        EXPECT_EQ(names[3], "skip.0");
        auto second = runner.run([&](runtime::GraphBuilder& g) {
            UNetState s;
            s.skips.resize(names.size() - 3);
            size_t j = 0;
            s.visit_tensors([&](const char* name, ggml_tensor*& t) {
                auto& h = first[j++];
                t = g.input_f32(name, {h.ne[0], h.ne[1], h.ne[2], h.ne[3]}, h.data);
            });
            nn::Ctx c{g.ctx(), false};
            s = net.forward_range(c, s, k, net.n_blocks());
            EXPECT_TRUE(s.skips.empty());
            return std::vector<ggml_tensor*>{net.epilogue(c, s)};
        });
        const float err = max_abs_diff(second.at(0).data, in.expected);
        std::printf("[unet_sd15_tiny] cut before block %d: %zu state tensors, max abs error %.3g\n", k, names.size(), err);
        EXPECT_LT(err, 1e-4f) << "cut before block " << k;
    }
}

TEST(UnetSd, LdmKeyLayoutGivesSameOutput) {
    auto idx = io::WeightIndex::open(kWeights);
    std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>> ts;
    for (auto& t : idx.tensors()) {
        if (t.name.rfind("__", 0) == 0) continue;
        std::string ldm = fixture_ldm_name(t.name);
        ASSERT_FALSE(ldm.empty()) << "no LDM name for " << t.name;
        ts.push_back({"model.diffusion_model." + ldm, {t.shape, idx.read_f32(t)}});
    }
    const auto dir = std::filesystem::temp_directory_path() / ("easel_unet_ldm_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const auto path = dir / "ldm_unet.safetensors";
    write_safetensors(path, ts);
    {
        auto ldm = io::WeightIndex::open(path);
        UNetConfig c = infer_unet_config(ldm, fixture_overrides());
        EXPECT_EQ(c.layout, UNetKeyLayout::Ldm);
        EXPECT_EQ(c.prefix, "model.diffusion_model.");
        EXPECT_EQ(c.layers_per_block, 2);
        EXPECT_TRUE(c.up[0].upsample);
        EXPECT_EQ(c.up[1].attentions.size(), 3u);
        EXPECT_EQ(unet_ldm_key(c, "up_blocks.0.upsamplers.0.conv.weight"), "output_blocks.2.1.conv.weight");
        EXPECT_EQ(unet_ldm_key(c, "down_blocks.1.resnets.0.conv_shortcut.bias"), "input_blocks.4.0.skip_connection.bias");
        runtime::GraphRunner runner;
        // every stored key is used (check_unexpected on): the map covers the whole file
        auto unet = load_unet(ldm, runner.buffer_type(), fixture_overrides());
        auto in = fixture_inputs(idx);
        auto out = run_unet(*unet.net, runner, in.sample, {2, 4, 16, 16}, in.timestep, in.context, 77, false);
        const float err = max_abs_diff(out.data, in.expected);
        std::printf("[unet_sd15_tiny, LDM names] max abs error %.3g\n", err);
        EXPECT_LT(err, 1e-4f);
    }
    std::filesystem::remove_all(dir);
}

TEST(UnetSd, RejectsBadInputs) {
    auto idx = io::WeightIndex::open(kWeights);
    runtime::GraphRunner runner;
    auto unet = load_unet(idx, runner.buffer_type(), fixture_overrides(), no_unexpected_check());
    std::vector<float> x(1 * 3 * 8 * 8, 0.1f), t{500.0f}, ctx(1 * 5 * 32, 0.2f), ctx_bad(1 * 5 * 24, 0.2f);
    auto expect_invalid = [&](const std::vector<float>& s, std::array<int64_t, 4> nchw, const std::vector<float>& tt,
                              const std::vector<float>& cc, int64_t L) {
        try {
            run_unet(*unet.net, runner, s, nchw, tt, cc, L, false);
            ADD_FAILURE() << "expected an error";
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << e.what();
        }
    };
    expect_invalid(x, {1, 3, 8, 8}, t, ctx, 5);                                              // 3 latent channels
    expect_invalid(std::vector<float>(4 * 64, 0.1f), {1, 4, 8, 8}, t, ctx_bad, 5);            // context width 24
    expect_invalid(std::vector<float>(4 * 64, 0.1f), {1, 4, 8, 8}, {1.0f, 2.0f}, ctx, 5);     // 2 timesteps, batch 1
}

TEST(UnetConfig, LdmNamesOfSd15Layout) {
    // SD1.5's structure: 4 levels, 2 resnets each, attention on the first three down / last three up blocks.
    UNetConfig c;
    c.layers_per_block = 2;
    c.up.resize(4);
    for (int b = 1; b < 4; ++b) c.up[b].attentions.resize(3);
    // names as they appear in v1-5-pruned.safetensors (model.diffusion_model. prefix left out)
    EXPECT_EQ(unet_ldm_key(c, "conv_in.weight"), "input_blocks.0.0.weight");
    EXPECT_EQ(unet_ldm_key(c, "time_embedding.linear_2.bias"), "time_embed.2.bias");
    EXPECT_EQ(unet_ldm_key(c, "down_blocks.0.attentions.1.proj_in.weight"), "input_blocks.2.1.proj_in.weight");
    EXPECT_EQ(unet_ldm_key(c, "down_blocks.0.downsamplers.0.conv.weight"), "input_blocks.3.0.op.weight");
    EXPECT_EQ(unet_ldm_key(c, "down_blocks.2.downsamplers.0.conv.bias"), "input_blocks.9.0.op.bias");
    EXPECT_EQ(unet_ldm_key(c, "down_blocks.3.resnets.1.time_emb_proj.weight"), "input_blocks.11.0.emb_layers.1.weight");
    EXPECT_EQ(unet_ldm_key(c, "down_blocks.1.resnets.0.conv_shortcut.weight"), "input_blocks.4.0.skip_connection.weight");
    EXPECT_EQ(unet_ldm_key(c, "mid_block.resnets.1.conv2.weight"), "middle_block.2.out_layers.3.weight");
    EXPECT_EQ(unet_ldm_key(c, "mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight"),
              "middle_block.1.transformer_blocks.0.attn2.to_k.weight");
    EXPECT_EQ(unet_ldm_key(c, "up_blocks.0.upsamplers.0.conv.weight"), "output_blocks.2.1.conv.weight");
    EXPECT_EQ(unet_ldm_key(c, "up_blocks.1.upsamplers.0.conv.weight"), "output_blocks.5.2.conv.weight");
    EXPECT_EQ(unet_ldm_key(c, "up_blocks.2.upsamplers.0.conv.bias"), "output_blocks.8.2.conv.bias");
    EXPECT_EQ(unet_ldm_key(c, "up_blocks.3.resnets.2.norm1.weight"), "output_blocks.11.0.in_layers.0.weight");
    EXPECT_EQ(unet_ldm_key(c, "up_blocks.3.attentions.2.norm.bias"), "output_blocks.11.1.norm.bias");
    EXPECT_EQ(unet_ldm_key(c, "conv_norm_out.weight"), "out.0.weight");
    EXPECT_EQ(unet_ldm_key(c, "conv_out.bias"), "out.2.bias");
    EXPECT_EQ(unet_ldm_key(c, "down_blocks.0.resnets.2.conv1.weight"), "");  // past layers_per_block
    EXPECT_EQ(unet_ldm_key(c, "text_model.embeddings.position_ids"), "");
}

TEST(UnetSd, LinearProjectionAndNineChannelsInferredFromWeights) {
    // Two re-layouts of the fixture that must not change its output:
    //  - proj_in/proj_out stored as Linear [C, C] instead of 1x1 Conv [C, C, 1, 1] (SD2.x's
    //    use_linear_projection: the same per-pixel matrix product);
    //  - conv_in widened to 9 input channels (in-painting UNet) with zero kernels for channels
    //    4..8, fed random values there.
    auto idx = io::WeightIndex::open(kWeights);
    std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>> ts;
    for (auto& t : idx.tensors()) {
        if (t.name.rfind("__", 0) == 0) continue;
        std::vector<int64_t> shape = t.shape;
        std::vector<float> v = idx.read_f32(t);
        const bool proj = t.name.find(".proj_in.weight") != std::string::npos || t.name.find(".proj_out.weight") != std::string::npos;
        if (proj) {
            ASSERT_EQ(shape.size(), 4u);
            shape.resize(2);
        }
        if (t.name == "conv_in.weight") {
            ASSERT_EQ(shape, (std::vector<int64_t>{16, 4, 3, 3}));
            std::vector<float> w(16 * 9 * 9, 0.0f);
            for (int o = 0; o < 16; ++o)
                for (int i = 0; i < 4; ++i)
                    for (int k = 0; k < 9; ++k) w[(o * 9 + i) * 9 + k] = v[(o * 4 + i) * 9 + k];
            v = w;
            shape = {16, 9, 3, 3};
        }
        ts.push_back({t.name, {shape, v}});
    }
    const auto dir = std::filesystem::temp_directory_path() / ("easel_unet_lin_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const auto path = dir / "unet_linear_9ch.safetensors";
    write_safetensors(path, ts);
    {
        auto w = io::WeightIndex::open(path);
        UNetConfig c = infer_unet_config(w, fixture_overrides());
        EXPECT_EQ(c.in_channels, 9);
        EXPECT_TRUE(c.down[0].attentions[0].linear_proj);
        EXPECT_TRUE(c.mid.attentions[0].linear_proj);
        // with linear projection and no heads given, the SD2.x convention (head size 64) applies,
        // which the tiny model's 16 channels cannot meet
        UNetOverrides only_groups;
        only_groups.norm_groups = 8;
        EXPECT_THROW(infer_unet_config(w, only_groups), Error);

        runtime::GraphRunner runner;
        auto unet = load_unet(w, runner.buffer_type(), fixture_overrides());
        auto in = fixture_inputs(idx);
        // [2, 9, 16, 16]: the fixture's 4 channels then 5 channels of noise per sample
        std::vector<float> x9(2 * 9 * 256);
        uint32_t r = 12345;
        for (int n = 0; n < 2; ++n)
            for (int ch = 0; ch < 9; ++ch)
                for (int p = 0; p < 256; ++p) {
                    r = r * 1664525u + 1013904223u;
                    x9[(n * 9 + ch) * 256 + p] = ch < 4 ? in.sample[(n * 4 + ch) * 256 + p] : (float)(r >> 8) / 8388608.0f - 1.0f;
                }
        auto out = run_unet(*unet.net, runner, x9, {2, 9, 16, 16}, in.timestep, in.context, 77, false);
        const float err = max_abs_diff(out.data, in.expected);
        std::printf("[unet_sd15_tiny, linear projection + 9 channels] max abs error %.3g\n", err);
        EXPECT_LT(err, 1e-4f);
    }
    std::filesystem::remove_all(dir);
}

TEST(UnetSd, UpsampleMatchesSkipSizeLikeTorchNearest) {
    // Upsample2D to a size that is not 2x (diffusers' upsample_size for odd latents): with an
    // identity 3x3 kernel the output is the nearest-resized input plus the bias, where torch's
    // F.interpolate(size=..., mode="nearest") takes source index floor(dst * in / out).
    const int64_t C = 2, H = 7, W = 5, OH = 13, OW = 10;
    std::vector<float> wt(C * C * 9, 0.0f);
    for (int o = 0; o < C; ++o) wt[(o * C + o) * 9 + 4] = 1.0f;
    const std::vector<float> bias{0.5f, -0.25f};
    const auto dir = std::filesystem::temp_directory_path() / ("easel_unet_up_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    write_safetensors(dir / "up.safetensors", {{"conv.weight", {{C, C, 3, 3}, wt}}, {"conv.bias", {{C}, bias}}});
    {
        auto idx = io::WeightIndex::open(dir / "up.safetensors");
        Upsample2D up(C);
        runtime::GraphRunner runner;
        nn::TensorSource src(idx);
        auto params = nn::ParamBuffer::load(up, src, runner.buffer_type());
        std::vector<float> x(C * H * W);
        for (int c = 0; c < C; ++c)
            for (int h = 0; h < H; ++h)
                for (int w = 0; w < W; ++w) x[(c * H + h) * W + w] = 100.0f * c + 10.0f * h + w;
        auto out = runner.run([&](runtime::GraphBuilder& g) {
            nn::Ctx c{g.ctx(), false};
            return std::vector<ggml_tensor*>{up.forward(c, g.input_f32("x", {W, H, C, 1}, x), OW, OH)};
        });
        ASSERT_EQ(out[0].ne, (std::array<int64_t, 4>{OW, OH, C, 1}));
        // rows: floor(i * 7 / 13) for i = 0..12, columns floor(j / 2)
        const int rows[13] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6};
        for (int c = 0; c < C; ++c)
            for (int i = 0; i < OH; ++i)
                for (int j = 0; j < OW; ++j)
                    ASSERT_NEAR(out[0].data[(c * OH + i) * OW + j], 100.0f * c + 10.0f * rows[i] + j / 2 + bias[c], 1e-5f)
                        << c << "," << i << "," << j;
    }
    std::filesystem::remove_all(dir);
}

TEST(UnetSd, OddLatentSizesMatchDiffusers) {
    // 13x10 latents: the downsampler makes 7x5, the upsampler must return to the skip's 13x10
    // (diffusers' forward_upsample_size path). Reference: diffusers' output of the same fixture on
    // these inputs (tools/reference/unet_extra_fixtures.py, unet_sd15_tiny_odd.safetensors).
    const auto ref_path = kDir / "unet_sd15_tiny_odd.safetensors";
    ASSERT_TRUE(std::filesystem::exists(ref_path)) << ref_path << " is missing: tools/reference/unet_extra_fixtures.py makes it";
    auto ref = io::WeightIndex::open(ref_path);
    auto idx = io::WeightIndex::open(kWeights);
    runtime::GraphRunner runner;
    auto unet = load_unet(idx, runner.buffer_type(), fixture_overrides(), no_unexpected_check());
    const auto x = tensor(ref, "__input__.odd.sample"), ctx = tensor(ref, "__input__.odd.encoder_hidden_states");
    const auto t = tensor(ref, "__input__.odd.timestep"), want = tensor(ref, "__output__.odd.sample");
    ASSERT_EQ(x.size(), 4u * 13 * 10);
    ASSERT_EQ(ctx.size(), 7u * 32);
    for (bool flash : {false, true}) {
        auto out = run_unet(*unet.net, runner, x, {1, 4, 13, 10}, t, ctx, 7, flash);
        EXPECT_EQ(out.ne, (std::array<int64_t, 4>{10, 13, 4, 1}));
        const float err = max_abs_diff(out.data, want);
        std::printf("[unet_sd15_tiny 13x10] flash=%d max abs error vs diffusers %.3g\n", (int)flash, err);
        EXPECT_LT(err, 1e-4f) << "flash_attn=" << flash;
    }
}

namespace {

// The first UNet call of a tiny SD1.x pipeline generation (tests/data/reference/sd_tiny, made by
// tools/reference/make_sd_pipeline.py with diffusers): batch [uncond, cond] (or [cond] without CFG).
struct PipelineCall {
    std::vector<float> sample, timestep, context, expected;
    std::array<int64_t, 4> nchw{};
};

PipelineCall pipeline_call(const std::string& name) {
    auto idx = io::WeightIndex::open(kDir / "sd_tiny" / ("case_" + name + ".safetensors"));
    PipelineCall p;
    const io::TensorInfo* s = idx.find("unet0_sample");
    for (int i = 0; i < 4; ++i) p.nchw[i] = s->shape[i];
    p.sample = idx.read_f32(*s);
    p.expected = tensor(idx, "unet0_out");
    const float t = tensor(idx, "unet0_timestep").at(0);
    p.timestep.assign((size_t)p.nchw[0], t);
    if (p.nchw[0] == 2) p.context = tensor(idx, "uncond");
    auto cond = tensor(idx, "cond");
    p.context.insert(p.context.end(), cond.begin(), cond.end());
    return p;
}

}  // namespace

TEST(UnetSd, TinyPipelineDiffusersFolderAndSingleFile) {
    // diffusers folder: heads (attention_head_dim=8) and groups (32) from its config.json;
    // single file (LDM names under model.diffusion_model.): no config, the SD1.x conventions.
    auto folder = io::WeightIndex::open(kDir / "sd_tiny" / "diffusers" / "unet");
    auto single = io::WeightIndex::open(kDir / "sd_tiny" / "sd_tiny.safetensors");
    UNetConfig cf = infer_unet_config(folder), cs = infer_unet_config(single);
    EXPECT_EQ(cf.layout, UNetKeyLayout::Diffusers);
    EXPECT_EQ(cs.layout, UNetKeyLayout::Ldm);
    EXPECT_EQ(cs.prefix, "model.diffusion_model.");
    for (auto* c : {&cf, &cs}) {
        EXPECT_EQ(c->model_channels, 32);
        EXPECT_EQ(c->context_dim, 64);
        EXPECT_EQ(c->norm_groups, 32);
        EXPECT_EQ(c->down[0].attentions[0].heads, 8);
        EXPECT_EQ(c->mid.attentions[0].heads, 8);
        EXPECT_EQ(c->mid.attentions[0].head_dim, 8);
    }
    EXPECT_EQ(cf.heads_source, "config.json");
    EXPECT_EQ(cs.heads_source, "SD1.x convention (8 heads)");

    runtime::GraphRunner runner;
    nn::LoadOptions f32;
    f32.weight_type = GGML_TYPE_F32;  // the reference ran in float32 on f16-rounded weights
    auto uf = load_unet(folder, runner.buffer_type(), {}, f32);
    auto us = load_unet(single, runner.buffer_type(), {}, f32);   // unexpected keys checked under the prefix
    auto us16 = load_unet(single, runner.buffer_type(), {});      // weights kept in f16
    for (const char* name : {"euler_discrete_a_s0", "euler_discrete_a_s0_96x64", "dpmpp2m_karras_b_s0_cfg1"}) {
        auto p = pipeline_call(name);
        float amax = 0;
        for (float v : p.expected) amax = std::max(amax, std::fabs(v));
        const int64_t L = 77;
        auto of = run_unet(*uf.net, runner, p.sample, p.nchw, p.timestep, p.context, L, false);
        auto os = run_unet(*us.net, runner, p.sample, p.nchw, p.timestep, p.context, L, true);
        auto o16 = run_unet(*us16.net, runner, p.sample, p.nchw, p.timestep, p.context, L, false);
        const float ef = max_abs_diff(of.data, p.expected), es = max_abs_diff(os.data, p.expected),
                    e16 = max_abs_diff(o16.data, p.expected);
        std::printf("[sd_tiny %s, t=%.2f, max |out| %.3g] folder f32 %.3g, single file f32 + flash %.3g, single file f16 %.3g\n",
                    name, p.timestep[0], amax, ef, es, e16);
        EXPECT_LT(ef, 1e-4f) << name;
        EXPECT_LT(es, 1e-4f) << name;
        EXPECT_LT(e16, 2e-3f * amax) << name;  // f16 weights: activations rounded to f16 in the matmuls
    }
}
