// runtime::graph_flops and ModuleCosts::flops: FLOPs counted from ggml graphs, checked against
// figures computed by hand from the shapes (hand-built graphs) and from the model configs
// (the tiny CLIP and Qwen3 text encoders, the tiny AutoencoderKL and TAESD decoders in
// tests/data/reference) and against the demo model's card (PyTorch's FLOP counter).
#include "io/weight_index.h"
#include "models/family.h"
#include "models/clip/clip_text.h"
#include "models/qwen3/qwen3.h"
#include "models/vae/autoencoder_kl.h"
#include "placement/plan.h"
#include "models/vae/placed_taesd.h"
#include "models/vae/placed_decoder.h"
#include "runtime/graph_flops.h"
#include "runtime/sequence_runner.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

using namespace easel;

namespace {

const std::filesystem::path kRef = std::filesystem::path(EASEL_TEST_DATA) / "reference";

nlohmann::json sidecar(const std::string& name) {
    std::ifstream f(kRef / (name + ".json"));
    return nlohmann::json::parse(f);
}

/// A no_alloc context for hand-built graphs (shapes only: nothing is computed).
struct NoAlloc {
    ggml_context* ctx;
    NoAlloc() {
        ggml_init_params ip{};
        ip.mem_size = ggml_tensor_overhead() * 256 + ggml_graph_overhead() * 16;
        ip.no_alloc = true;
        ctx = ggml_init(ip);
    }
    ~NoAlloc() { ggml_free(ctx); }
    ggml_tensor* t(ggml_type type, int64_t a, int64_t b = 1, int64_t c = 1, int64_t d = 1) {
        return ggml_new_tensor_4d(ctx, type, a, b, c, d);
    }
    /// graph_flops of the graph ending in `out`.
    double flops(ggml_tensor* out) {
        ggml_cgraph* gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);
        return runtime::graph_flops(gf);
    }
};

}  // namespace

TEST(GraphFlops, MatMulIsTwoKPerOutputElement) {
    NoAlloc g;
    // weight [M=32, K=64] (ne {64, 32}) x activations of N=10 columns (ne {64, 10}): 2 K M N
    EXPECT_DOUBLE_EQ(g.flops(ggml_mul_mat(g.ctx, g.t(GGML_TYPE_F16, 64, 32), g.t(GGML_TYPE_F32, 64, 10))), 2.0 * 64 * 32 * 10);
    // batched over ne[2] = 3, ne[3] = 2 with the weight broadcast along ne[2]: 6 matmuls
    EXPECT_DOUBLE_EQ(g.flops(ggml_mul_mat(g.ctx, g.t(GGML_TYPE_F32, 64, 32, 1, 2), g.t(GGML_TYPE_F32, 64, 10, 3, 2))),
                     2.0 * 64 * 32 * 10 * 3 * 2);
    // two chained matmuls add: [32 x 64] then [16 x 32] on the result
    ggml_tensor* h = ggml_mul_mat(g.ctx, g.t(GGML_TYPE_F32, 64, 32), g.t(GGML_TYPE_F32, 64, 10));  // ne {32, 10}
    EXPECT_DOUBLE_EQ(g.flops(ggml_mul_mat(g.ctx, g.t(GGML_TYPE_F32, 32, 16), h)), 2.0 * 64 * 32 * 10 + 2.0 * 32 * 16 * 10);
}

TEST(GraphFlops, MulMatIdCountsTheExpertsUsed) {
    NoAlloc g;
    // 4 experts of [M=8, K=16]; 5 tokens, 2 experts each: dst ne {8, 2, 5}
    ggml_tensor* as = g.t(GGML_TYPE_F32, 16, 8, 4);
    ggml_tensor* b = g.t(GGML_TYPE_F32, 16, 2, 5);
    ggml_tensor* ids = g.t(GGML_TYPE_I32, 2, 5);
    EXPECT_DOUBLE_EQ(g.flops(ggml_mul_mat_id(g.ctx, as, b, ids)), 2.0 * 16 * 8 * 2 * 5);
}

TEST(GraphFlops, FlashAttentionIsQKAndPV) {
    NoAlloc g;
    // Dk = 24, Dv = 16, Nq = 10, Nkv = 14, 6 query heads over 2 kv heads (GQA), batch 3
    const int64_t Dk = 24, Dv = 16, Nq = 10, Nkv = 14, H = 6, Hkv = 2, B = 3;
    ggml_tensor* q = g.t(GGML_TYPE_F32, Dk, Nq, H, B);
    ggml_tensor* k = g.t(GGML_TYPE_F16, Dk, Nkv, Hkv, B);
    ggml_tensor* v = g.t(GGML_TYPE_F16, Dv, Nkv, Hkv, B);
    ggml_tensor* m = g.t(GGML_TYPE_F16, Nkv, Nq);
    const double expect = 2.0 * Dk * Nq * Nkv * H * B + 2.0 * Dv * Nq * Nkv * H * B;  // 201600
    EXPECT_DOUBLE_EQ(g.flops(ggml_flash_attn_ext(g.ctx, q, k, v, m, 0.2f, 0.0f, 0.0f)), expect);
    EXPECT_DOUBLE_EQ(expect, 201600.0);
    // the same attention as two matmuls (softmax not counted) gives the same figure
    ggml_tensor* kq = ggml_mul_mat(g.ctx, g.t(GGML_TYPE_F32, Dk, Nkv, H, B), g.t(GGML_TYPE_F32, Dk, Nq, H, B));  // {Nkv, Nq, H, B}
    kq = ggml_soft_max(g.ctx, kq);
    EXPECT_DOUBLE_EQ(g.flops(ggml_mul_mat(g.ctx, g.t(GGML_TYPE_F32, Nkv, Dv, H, B), kq)), expect);
}

TEST(GraphFlops, Conv2dAsIm2colAndMatmul) {
    NoAlloc g;
    // kernel [Cout=8, Cin=4, 3, 3] (ne {3, 3, 4, 8}), input [N=2, 4, H=12, W=16], stride 1, pad 1:
    // Hout = 12, Wout = 16; 2 x Cin x kh x kw x Cout x Hout x Wout x N
    ggml_tensor* w = g.t(GGML_TYPE_F16, 3, 3, 4, 8);
    ggml_tensor* x = g.t(GGML_TYPE_F32, 16, 12, 4, 2);
    EXPECT_DOUBLE_EQ(g.flops(ggml_conv_2d(g.ctx, w, x, 1, 1, 1, 1, 1, 1)), 2.0 * 4 * 3 * 3 * 8 * 12 * 16 * 2);
    // stride 2: Hout = (12 + 2 - 3) / 2 + 1 = 6, Wout = (16 + 2 - 3) / 2 + 1 = 8
    EXPECT_DOUBLE_EQ(g.flops(ggml_conv_2d(g.ctx, w, x, 2, 2, 1, 1, 1, 1)), 2.0 * 4 * 3 * 3 * 8 * 6 * 8 * 2);
}

TEST(GraphFlops, DirectConvolutions) {
    NoAlloc g;
    ggml_tensor* x = g.t(GGML_TYPE_F32, 16, 12, 4, 2);  // [N=2, C=4, H=12, W=16]
    // direct conv, kernel ne {3, 3, Cin=4, Cout=8}, stride 2, pad 1: Wout 8, Hout 6
    EXPECT_DOUBLE_EQ(g.flops(ggml_conv_2d_direct(g.ctx, g.t(GGML_TYPE_F32, 3, 3, 4, 8), x, 2, 2, 1, 1, 1, 1)),
                     2.0 * 3 * 3 * 4 * 8 * 8 * 6 * 2);
    // depthwise, kernel ne {3, 3, 1, C=4}, stride 1, pad 1: every output one 3x3 dot product
    EXPECT_DOUBLE_EQ(g.flops(ggml_conv_2d_dw_direct(g.ctx, g.t(GGML_TYPE_F32, 3, 3, 1, 4), x, 1, 1, 1, 1, 1, 1)),
                     2.0 * 3 * 3 * 16 * 12 * 4 * 2);
    // transposed, kernel ne {2, 2, Cout=5, Cin=4}, input ne {6, 7, 4, 1}, stride 2: each input
    // value times 2 x 2 x 5 taps
    EXPECT_DOUBLE_EQ(g.flops(ggml_conv_transpose_2d_p0(g.ctx, g.t(GGML_TYPE_F32, 2, 2, 5, 4), g.t(GGML_TYPE_F32, 6, 7, 4, 1), 2)),
                     2.0 * 2 * 2 * 5 * 6 * 7 * 4);
}

TEST(GraphFlops, ElementwiseNormsAndSoftmaxCountZero) {
    NoAlloc g;
    ggml_tensor* a = g.t(GGML_TYPE_F32, 64, 10);
    ggml_tensor* y = ggml_add(g.ctx, a, g.t(GGML_TYPE_F32, 64, 10));
    y = ggml_mul(g.ctx, y, a);
    y = ggml_gelu(g.ctx, y);
    y = ggml_norm(g.ctx, y, 1e-5f);
    y = ggml_rms_norm(g.ctx, y, 1e-6f);
    y = ggml_soft_max(g.ctx, y);
    y = ggml_scale(g.ctx, y, 0.5f);
    y = ggml_cont(g.ctx, ggml_transpose(g.ctx, y));
    EXPECT_EQ(g.flops(y), 0.0);
    // one matmul on top: only it counts
    EXPECT_DOUBLE_EQ(g.flops(ggml_mul_mat(g.ctx, g.t(GGML_TYPE_F32, 10, 3), y)), 2.0 * 10 * 3 * 64);
    EXPECT_EQ(runtime::graph_flops(nullptr), 0.0);
}

namespace {

/// flops(0, n, true, true) equals the prologue alone + each block alone + the epilogue alone
/// (the graphs are cut at the state, which enters the next as inputs).
void expect_sum_of_parts(const placement::ModuleCosts& c, int n) {
    double parts = c.flops(0, 0, true, false) + c.flops(n, n, false, true);
    for (int i = 0; i < n; ++i) parts += c.flops(i, i + 1, false, false);
    EXPECT_DOUBLE_EQ(c.flops(0, n, true, true), parts);
    // and a two-segment cut
    const int m = n / 2;
    EXPECT_DOUBLE_EQ(c.flops(0, m, true, false) + c.flops(m, n, false, true), c.flops(0, n, true, true));
}

}  // namespace

// CLIP text encoder with projection (clip_text_with_projection_tiny: width D = 32, 4 heads,
// MLP F = 64, 3 layers, projection P = 16). Chosen because every matmul is a plain Linear on all
// T = L x N tokens with no grouped heads: per layer q, k, v, o are 2 T D D each, attention 4 T L D
// (Q K^T and P V: 2 L L D per sequence each; the causal mask does not shorten them), fc1 and
// fc2 are 2 T D F each. The prologue (token + position embeddings: get_rows, add) has no matmul;
// the epilogue's final LayerNorm has none and text_projection is 2 D P per pooled token (N).
// Head size 8 is a multiple of 8, so the plain attention path pads nothing.
TEST(GraphFlops, ClipTextEncoderMatchesConfigFormula) {
    namespace clip = models::clip;
    auto idx = io::WeightIndex::open(kRef / "clip_text_with_projection_tiny.safetensors");
    auto keys = clip::find_clip_text_encoders(idx);
    auto cfg = clip::infer_config(idx, keys.at(0), clip::overrides_from_config_json(sidecar("clip_text_with_projection_tiny")["config"]));
    ASSERT_EQ(cfg.width, 32);
    ASSERT_EQ(cfg.heads, 4);
    ASSERT_EQ(cfg.intermediate, 64);
    ASSERT_EQ(cfg.layers, 3);
    ASSERT_EQ(cfg.projection, 16);
    clip::ClipTextModel m(cfg);
    auto src = clip::make_tensor_source(idx, keys[0], cfg);
    auto lopt = clip::default_load_options(keys[0], cfg, idx);
    const int64_t L = 77, N = 2;
    std::vector<int32_t> ids((size_t)(L * N), 5);
    std::vector<int32_t> pool = {76, 153};
    auto mk = [ids, pool, L, N](runtime::GraphBuilder& g) {
        return clip::ClipInputs{g.input_i32("ids", {L, N}, ids), g.input_i32("pool", {N}, pool)};
    };
    auto sel = [](clip::ClipOutputs& o) { return std::vector<ggml_tensor*>{o.last_hidden_state, o.text_embeds}; };

    const double D = 32, F = 64, P = 16, T = (double)(L * N);
    const double layer = 4 * 2 * T * D * D + N * 4.0 * L * L * D + 2 * 2 * T * D * F;
    const double epilogue = 2 * D * P * N;
    EXPECT_DOUBLE_EQ(layer, 4040960.0);
    for (bool flash : {false, true}) {
        SCOPED_TRACE(flash ? "flash attention" : "plain attention");
        runtime::SequenceRunner<clip::ClipInputs, clip::ClipState, clip::ClipOutputs> r(m, m, src, lopt, 1, flash);
        placement::ModuleCosts c = r.costs(mk, sel, "CLIP");
        ASSERT_TRUE(c.flops);
        EXPECT_DOUBLE_EQ(c.flops(0, 0, true, false), 0.0);       // prologue: embeddings only
        EXPECT_DOUBLE_EQ(c.flops(3, 3, false, true), epilogue);  // 2048
        for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(c.flops(i, i + 1, false, false), layer);
        EXPECT_DOUBLE_EQ(c.flops(0, 3, true, true), 3 * layer + epilogue);  // 12124928
        EXPECT_DOUBLE_EQ(c.flops(1, 3, false, false), 2 * layer);
        expect_sum_of_parts(c, 3);
    }
}

// Qwen3 text encoder (qwen3_text_tiny: hidden D = 32, 4 query heads over 2 kv heads (GQA),
// head_dim 16, so q is D -> 64 and k, v are D -> 32; MLP I = 64 with gate, up and down; 4
// layers). Per layer on T = L x N tokens: q 2 T D (H hd), k and v 2 T D (Hkv hd) each, o
// 2 T (H hd) D, attention 4 L L (H hd) per sequence (every query head attends over the shared kv
// heads), gate/up/down 2 T D I each. q_norm/k_norm, RoPE and the final RMSNorm (the epilogue)
// are not matmuls; the prologue is embed_tokens (get_rows).
TEST(GraphFlops, Qwen3TextEncoderWithGqaMatchesConfigFormula) {
    namespace q3 = models::qwen3;
    auto idx = io::WeightIndex::open(kRef / "qwen3_text_tiny.safetensors");
    auto keys = q3::find_qwen3(idx);
    ASSERT_TRUE(keys);
    auto cfg = q3::infer_config(idx, *keys);
    ASSERT_EQ(cfg.hidden, 32);
    ASSERT_EQ(cfg.heads, 4);
    ASSERT_EQ(cfg.kv_heads, 2);
    ASSERT_EQ(cfg.head_dim, 16);
    ASSERT_EQ(cfg.intermediate, 64);
    ASSERT_EQ(cfg.layers, 4);
    q3::Qwen3Model m(cfg);
    auto src = q3::make_tensor_source(idx, *keys, cfg);
    auto lopt = q3::default_load_options(*keys, cfg, idx);
    const int64_t L = 24, N = 2;
    std::vector<int32_t> ids((size_t)(L * N), 7);
    std::vector<int32_t> pos = q3::positions(L);
    auto mk = [ids, pos, L, N](runtime::GraphBuilder& g) {
        q3::Qwen3Inputs in;
        in.ids = g.input_i32("ids", {L, N}, ids);
        in.pos = g.input_i32("pos", {L}, pos);
        return in;
    };
    auto sel = [](q3::Qwen3Outputs& o) { return std::vector<ggml_tensor*>{o.last_hidden_state}; };

    const double D = 32, Hq = 4 * 16, Hkv = 2 * 16, I = 64, T = (double)(L * N);
    const double layer = 2 * T * D * Hq + 2 * 2 * T * D * Hkv + 2 * T * Hq * D + N * 4.0 * L * L * Hq + 3 * 2 * T * D * I;
    EXPECT_DOUBLE_EQ(layer, 1474560.0);
    for (bool flash : {false, true}) {
        SCOPED_TRACE(flash ? "flash attention" : "plain attention");
        runtime::SequenceRunner<q3::Qwen3Inputs, q3::Qwen3State, q3::Qwen3Outputs> r(m, m, src, lopt, 1, flash);
        placement::ModuleCosts c = r.costs(mk, sel, "Qwen3");
        ASSERT_TRUE(c.flops);
        EXPECT_DOUBLE_EQ(c.flops(0, 0, true, false), 0.0);
        EXPECT_DOUBLE_EQ(c.flops(4, 4, false, true), 0.0);
        for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(c.flops(i, i + 1, false, false), layer);
        EXPECT_DOUBLE_EQ(c.flops(0, 4, true, true), 4 * layer);  // 5898240
        expect_sum_of_parts(c, 4);
    }
}

// AutoencoderKL decoder (autoencoder_kl_sd_tiny: latent L = 4, block_out_channels [16, 32],
// layers_per_block 2, so up blocks at 32 then 16 channels, factor 2; norm groups 8). A 3x3 conv
// C -> C' on P pixels is 2 x 9 C C' P; per latent pixel (P = h w):
//   prologue   post_quant_conv 1x1 4->4 (2*4*4 = 32) + conv_in 3x3 4->32 (2304)     = 2336 P
//   block 0    mid resnet 32: two 3x3 convs                              2 x 18432 = 36864 P
//   block 1    mid attention, one head of 32: q, k, v, o (4 x 2*32*32 = 8192 P) + Q K^T and
//              P V over the P tokens (2 x 2 x 32 P^2)                        = 8192 P + 128 P^2
//   block 2    mid resnet                                                            36864 P
//   blocks 3-5 up block 0 resnets 32->32                                         3 x 36864 P
//   block 6    its upsampler: 3x3 conv 32->32 on 4P pixels                    18432 x 4P = 73728 P
//   block 7    up block 1 resnet 32->16 at 4P: 3x3 32->16 (9216), 3x3 16->16 (4608), 1x1
//              shortcut 32->16 (1024)                                      14848 x 4 = 59392 P
//   blocks 8-9 resnets 16->16 at 4P                                       2 x 9216 x 4 = 73728 P
//   epilogue   conv_out 3x3 16->3 at 4P                                     864 x 4 = 3456 P
// total 405152 P + 128 P^2. GroupNorm, SiLU, the residual adds, the softmax and the nearest
// upsampling count 0.
namespace {

double kl_sd_tiny_flops(double P) { return 405152.0 * P + 128.0 * P * P; }

vae::VaeDecoderSource kl_sd_tiny_source(const io::WeightIndex& idx) {
    vae::VaeDecoderSource s;
    s.index = &idx;
    s.src = *vae::find_autoencoder_kl(idx);
    s.overrides.norm_num_groups = 8;
    return s;
}

}  // namespace

TEST(GraphFlops, VaeDecoderMatchesConfigFormulaAndTilesCountTheWholeDecode) {
    auto idx = io::WeightIndex::open(kRef / "autoencoder_kl_sd_tiny.safetensors");
    const vae::VaeDecoderSource s = kl_sd_tiny_source(idx);
    const int64_t h = 16, w = 12;
    const double P = (double)(h * w);
    for (bool flash : {false, true}) {
        SCOPED_TRACE(flash ? "flash attention" : "plain attention");
        placement::ModuleCosts c = vae::vae_decoder_costs(s, 1, flash, h, w);
        ASSERT_EQ(c.block_bytes.size(), 10u);
        ASSERT_TRUE(c.flops);
        EXPECT_DOUBLE_EQ(c.flops(0, 0, true, false), 2336 * P);
        EXPECT_DOUBLE_EQ(c.flops(0, 1, false, false), 36864 * P);
        EXPECT_DOUBLE_EQ(c.flops(1, 2, false, false), 8192 * P + 128 * P * P);
        EXPECT_DOUBLE_EQ(c.flops(6, 7, false, false), 73728 * P);
        EXPECT_DOUBLE_EQ(c.flops(7, 8, false, false), 59392 * P);
        EXPECT_DOUBLE_EQ(c.flops(10, 10, false, true), 3456 * P);
        EXPECT_DOUBLE_EQ(c.flops(0, 10, true, true), kl_sd_tiny_flops(P));  // 82507776
        EXPECT_DOUBLE_EQ(kl_sd_tiny_flops(P), 82507776.0);
        expect_sum_of_parts(c, 10);
    }
    // tiled with tiles of 8 x 8 latent cells: the bytes are measured at one tile's graph, the
    // FLOPs are still the whole decode's at 16 x 12 (not the tile's 64 cells)
    vae::TilingOptions t;
    t.enabled = true;
    t.tile_size = 8 * 2;  // pixels: 8 cells x factor 2
    placement::ModuleCosts tiled = vae::vae_decoder_costs(s, 1, false, h, w, t);
    placement::ModuleCosts whole = vae::vae_decoder_costs(s, 1, false, h, w);
    EXPECT_LT(tiled.measure(0, 10, true, true, "CPU"), whole.measure(0, 10, true, true, "CPU"));
    EXPECT_DOUBLE_EQ(tiled.flops(0, 10, true, true), kl_sd_tiny_flops(P));
    EXPECT_DOUBLE_EQ(tiled.flops(0, 1, false, false), 36864 * P);
}

// TAESD decoder (autoencoder_tiny_taesd_tiny: 16 channels everywhere, latent 4, decoder blocks
// [3, 3, 3, 1], factor 8), diffusers DecoderTiny: conv_in 3x3 4->16, ReLU; per stage its Blocks
// (three 3x3 convs 16->16 each, identity skip), then, except after the last stage, a nearest x2
// upsampling and a 3x3 conv 16->16; conv_out 3x3 16->3. A 3x3 16->16 conv is 2*9*16*16 = 4608
// FLOPs per pixel at its resolution; per latent pixel (P = h w):
//   conv_in 1152; stage 0 (9 convs) 9 x 4608 at 1x, its up conv 4608 at 4x; stage 1: 9 convs at
//   4x, up conv at 16x; stage 2: 9 convs at 16x, up conv at 64x; stage 3: 3 convs at 64x;
//   conv_out 2*9*16*3 = 864 at 64x
//   = 1152 + 4608 (9 + 4 + 36 + 16 + 144 + 64 + 192) + 864 x 64 = 2199168 P.
TEST(GraphFlops, TaesdDecoderMatchesConfigFormula) {
    auto idx = io::WeightIndex::open(kRef / "autoencoder_tiny_taesd_tiny.safetensors");
    const int64_t h = 8, w = 6;
    placement::ModuleCosts c = vae::taesd_decoder_costs(idx, h, w);
    ASSERT_EQ(c.block_bytes.size(), 1u);
    ASSERT_TRUE(c.flops);
    EXPECT_DOUBLE_EQ(c.flops(0, 1, true, true), 2199168.0 * h * w);  // 105560064
    EXPECT_DOUBLE_EQ(c.flops(0, 0, true, true), 0.0);                // no block: nothing runs
    // another latent: linear in the pixels (every op is a convolution)
    EXPECT_DOUBLE_EQ(vae::taesd_decoder_costs(idx, 4, 4).flops(0, 1, true, true), 2199168.0 * 16);
}

// The demo model (models/demo) against its model card, whose figures come from PyTorch's
// torch.utils.flop_counter.FlopCounterMode on the diffusers modules (tools/demo-model/train.py:
// convolutions, linears and attention matmuls at 2 FLOPs per multiply-add, the same convention):
// "UNet 2.43 GFLOP per evaluation (batch 1, 32x32 latent); VAE decoder 73.5 GFLOP" at 256x256
// (GPU run 11's log: 2.430 and 73.529). The card rounds to 3 digits; the counts here must fall inside
// that rounding.
TEST(GraphFlops, DemoModelMatchesItsModelCard) {
    models::ModelFiles files;
    files.model = (std::filesystem::path(EASEL_SOURCE_DIR) / "models" / "demo" / "easel-demo-shapes.safetensors").string();
    models::FamilyOptions fo;
    fo.threads = 1;
    auto fam = models::open_family(files, fo);
    auto costs = fam->placement_costs(32, 32);
    ASSERT_EQ(costs.size(), 3u);
    auto total = [](const placement::ModuleCosts& c) {
        const int n = (int)c.block_bytes.size();
        return c.flops(0, n, true, true);
    };
    ASSERT_EQ(costs[1].module, placement::PModule::Diffusion);
    ASSERT_EQ(costs[2].module, placement::PModule::Vae);
    EXPECT_NEAR(total(costs[1]), 2.43e9, 0.005e9);
    EXPECT_NEAR(total(costs[2]), 73.5e9, 0.05e9);
    expect_sum_of_parts(costs[1], (int)costs[1].block_bytes.size());
}
