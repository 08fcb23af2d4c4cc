// An original-layout (ldm) SD UNet whose first level has no attention (down DownBlock2D,
// CrossAttnDownBlock2D x2; up CrossAttnUpBlock2D x2, UpBlock2D: the demo model's "lowattn" layout,
// tools/demo-model/archs.py) against diffusers' UNet2DConditionModel.
// Fixture: tests/data/reference/unet_lowattn_tiny.* (tools/reference/unet_lowattn_fixture.py).
#include "io/weight_index.h"
#include "models/sd/unet.h"
#include "runtime/graph_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

using namespace easel;
using namespace easel::models::sd;

namespace {

const std::filesystem::path kWeights = std::filesystem::path(EASEL_TEST_DATA) / "reference" / "unet_lowattn_tiny.safetensors";

std::vector<float> tensor(const io::WeightIndex& idx, const std::string& name) {
    const io::TensorInfo* t = idx.find(name);
    if (!t) throw std::runtime_error("fixture lacks " + name);
    return idx.read_f32(*t);
}

// What the weights do not show: the fixture's 8 GroupNorm groups (heads stay the SD1.x convention).
UNetOverrides groups8() {
    UNetOverrides o;
    o.norm_groups = 8;
    o.source = "test";
    return o;
}

}  // namespace

TEST(UnetLowAttn, ConfigInferredFromLdmNames) {
    auto idx = io::WeightIndex::open(kWeights);
    const UNetConfig c = infer_unet_config(idx, groups8());
    EXPECT_EQ(c.layout, UNetKeyLayout::Ldm);
    EXPECT_EQ(c.prefix, "model.diffusion_model.");
    EXPECT_EQ(c.layers_per_block, 2);
    EXPECT_EQ(c.model_channels, 16);
    EXPECT_EQ(c.context_dim, 16);
    EXPECT_EQ(c.norm_groups, 8);
    EXPECT_EQ(c.heads_source, "SD1.x convention (8 heads)");
    ASSERT_EQ(c.down.size(), 3u);
    ASSERT_EQ(c.up.size(), 3u);
    // down: plain, attention, attention; downsamplers on the first two levels
    const int64_t down_out[] = {16, 16, 32};
    const size_t down_attn[] = {0, 2, 2};
    const bool down_ds[] = {true, true, false};
    for (int b = 0; b < 3; ++b) {
        EXPECT_EQ(c.down[b].resnets.size(), 2u) << b;
        EXPECT_EQ(c.down[b].resnets.back().out, down_out[b]) << b;
        EXPECT_EQ(c.down[b].attentions.size(), down_attn[b]) << b;
        EXPECT_EQ(c.down[b].downsample, down_ds[b]) << b;
        for (const auto& t : c.down[b].attentions) {
            EXPECT_EQ(t.heads, 8);
            EXPECT_EQ(t.head_dim, down_out[b] / 8);
            EXPECT_FALSE(t.linear_proj);
        }
    }
    EXPECT_TRUE(c.down[2].resnets[0].shortcut);  // 16 -> 32
    EXPECT_FALSE(c.down[1].resnets[0].shortcut);
    // up: attention, attention, plain; upsamplers (ldm output_blocks.2.2.conv, output_blocks.5.2.conv) on the first two
    const int64_t up_out[] = {32, 16, 16};
    const size_t up_attn[] = {3, 3, 0};
    const bool up_us[] = {true, true, false};
    for (int b = 0; b < 3; ++b) {
        EXPECT_EQ(c.up[b].resnets.size(), 3u) << b;
        EXPECT_EQ(c.up[b].resnets.back().out, up_out[b]) << b;
        EXPECT_EQ(c.up[b].attentions.size(), up_attn[b]) << b;
        EXPECT_EQ(c.up[b].upsample, up_us[b]) << b;
    }
    ASSERT_TRUE(c.mid.present);
    EXPECT_EQ(c.mid.attentions.size(), 1u);
    EXPECT_EQ(c.mid.attentions[0].head_dim, 4);
    // the key map places the first level's resnets at input_blocks.1-2.0, with no .1 (attention) entries
    EXPECT_EQ(unet_ldm_key(c, "down_blocks.0.resnets.1.conv1.weight"), "input_blocks.2.0.in_layers.2.weight");
    EXPECT_EQ(unet_ldm_key(c, "down_blocks.1.attentions.0.proj_in.weight"), "input_blocks.4.1.proj_in.weight");
    EXPECT_EQ(unet_ldm_key(c, "up_blocks.0.upsamplers.0.conv.weight"), "output_blocks.2.2.conv.weight");
    EXPECT_EQ(unet_ldm_key(c, "up_blocks.2.resnets.2.conv2.weight"), "output_blocks.8.0.out_layers.3.weight");
    EXPECT_FALSE(idx.contains("model.diffusion_model.input_blocks.1.1.proj_in.weight"));
    EXPECT_FALSE(idx.contains("model.diffusion_model.output_blocks.6.1.proj_in.weight"));
}

TEST(UnetLowAttn, MatchesDiffusers) {
    auto idx = io::WeightIndex::open(kWeights);
    runtime::GraphRunner runner;
    // The weights are stored F16 (exactly the values diffusers ran in float32); loaded as F32 so that
    // ggml computes in float32 like the reference (F16 weights make ggml's CPU matmuls round the
    // activations to F16: ~2e-3 here). Every stored UNet tensor must be used (unexpected-key check on).
    nn::LoadOptions opt;
    opt.weight_type = GGML_TYPE_F32;
    auto unet = load_unet(idx, runner.buffer_type(), groups8(), opt);
    const auto sample = tensor(idx, "__input__.sample"), t = tensor(idx, "__input__.timestep"),
               ctx = tensor(idx, "__input__.encoder_hidden_states"), want = tensor(idx, "__output__.sample");
    for (bool flash : {false, true}) {
        auto out = runner.run([&](runtime::GraphBuilder& g) {
            UNetInputs in;
            in.sample = g.input_f32("sample", {16, 16, 4, 2}, sample);
            in.timestep = g.input_f32("timestep", {2}, t);
            in.context = g.input_f32("context", {16, 7, 2}, ctx);
            nn::Ctx c{g.ctx(), flash};
            return std::vector<ggml_tensor*>{unet.net->forward(c, in)};
        });
        ASSERT_EQ(out.at(0).ne, (std::array<int64_t, 4>{16, 16, 4, 2}));
        ASSERT_EQ(out.at(0).data.size(), want.size());
        float err = 0, scale = 0;
        for (size_t i = 0; i < want.size(); ++i) {
            err = std::max(err, std::fabs(out.at(0).data[i] - want[i]));
            scale = std::max(scale, std::fabs(want[i]));
        }
        std::printf("[unet_lowattn_tiny] flash_attn=%d max abs error %.3g (max |output| %.3g)\n", (int)flash, err, scale);
        EXPECT_GT(scale, 0.5f);  // not a degenerate output
        EXPECT_LT(err, 1e-4f);
    }
}
