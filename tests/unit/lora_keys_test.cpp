// LoRA keys -> model weights (lora/key_map.h, models/lora_targets.h, lora/mapping.h) on full-size module
// trees built from configs (no weights): every key of every real key list of
// tests/data/io/lora-keys (InvokeAI's, see its SOURCE.md) that targets FLUX.1 maps onto FLUX.1
// dev + CLIP-L + T5-XXL; synthetic lists in the real naming schemes do the same for Z-Image (the
// 480-tensor ai-toolkit layout of a real Z-Image LoRA, the original fused-qkv names), FLUX.2
// Klein (BFL and diffusers names) and the tiny SD1.x UNet + CLIP (kohya LDM and diffusers names,
// PEFT, the old attention-processor names); LoRAs for another family or size and the lists for
// families easel does not run are refused naming what they target; cloneofsimo files are refused.
#include "lora/mapping.h"
#include "models/lora_targets.h"

#include "core/error.h"
#include "lora_test_support.h"
#include "models/sd/unet.h"
#include "models/t5/t5_encoder.h"

#include <gtest/gtest.h>

#include <memory>

using namespace easel;
using namespace easel::lora;
using easel::io::TensorInfo;
using lora_test::lora_keys;

namespace {

TensorInfo ti(const std::string& name, std::vector<int64_t> shape) {
    TensorInfo t;
    t.name = name;
    t.shape = std::move(shape);
    t.nbytes = (uint64_t)t.numel() * 4;
    return t;
}

// A PEFT/kohya pair for a module [out, in] of rank r.
void pair(std::vector<TensorInfo>& v, const std::string& m, int64_t out, int64_t in, const std::string& style = "peft", int64_t r = 16) {
    if (style == "peft") {
        v.push_back(ti(m + ".lora_A.weight", {r, in}));
        v.push_back(ti(m + ".lora_B.weight", {out, r}));
    } else {
        v.push_back(ti(m + ".lora_down.weight", {r, in}));
        v.push_back(ti(m + ".lora_up.weight", {out, r}));
        v.push_back(ti(m + ".alpha", {}));
    }
}

// The full-size configurations (the real models' config.json values)
models::clip::ClipConfig clip_l() {
    return {.vocab = 49408, .width = 768, .layers = 12, .positions = 77, .intermediate = 3072, .heads = 12};
}

models::t5::T5Config t5_xxl() { return {.vocab = 32128, .d_model = 4096, .d_kv = 64, .heads = 64, .d_ff = 10240, .layers = 24}; }

models::qwen3::Qwen3Config qwen3_4b() {
    return {.vocab = 151936, .hidden = 2560, .layers = 36, .heads = 32, .kv_heads = 8, .head_dim = 128, .intermediate = 9728};
}

models::zimage::ZImageDiTConfig zimage_full() {
    return {.dim = 3840, .n_heads = 30, .n_kv_heads = 30, .head_dim = 128, .ffn_hidden = 10240, .n_layers = 30, .n_noise_refiner = 2,
            .n_context_refiner = 2, .cap_feat_dim = 2560, .adaln_dim = 256};
}

models::flux::Flux2DiTConfig klein(bool nine_b) {
    models::flux::Flux2DiTConfig c;  // 4B defaults
    if (nine_b) {
        c.hidden = 4096;
        c.heads = 32;
        c.mlp_hidden = 12288;
        c.joint_dim = 12288;
        c.n_double = 8;
        c.n_single = 24;
    }
    return c;
}

// FLUX.1 dev + CLIP-L + T5-XXL, as the FLUX.1 family would register them.
struct Flux1Model {
    models::flux::FluxDiTConfig cfg;
    std::unique_ptr<models::flux::FluxDiT> dit = std::make_unique<models::flux::FluxDiT>(cfg);
    std::unique_ptr<models::clip::ClipTextModel> clip = std::make_unique<models::clip::ClipTextModel>(clip_l());
    std::unique_ptr<models::t5::T5Encoder> t5 = std::make_unique<models::t5::T5Encoder>(t5_xxl());
    KeyMap km;
    Flux1Model() {
        add_flux1_targets(km, *dit, cfg, false);
        add_clip_targets(km, "clip_l", 0, *clip, clip_l());
        add_t5_targets(km, 1, *t5);
    }
    ModelInfo info() const { return {"FLUX.1", 3072, "hidden"}; }
};

struct ZImageModel {
    std::unique_ptr<models::zimage::ZImageDiT> dit = std::make_unique<models::zimage::ZImageDiT>(zimage_full());
    std::unique_ptr<models::qwen3::Qwen3Model> qwen = std::make_unique<models::qwen3::Qwen3Model>(qwen3_4b());
    KeyMap km;
    ZImageModel() {
        add_zimage_targets(km, *dit, zimage_full());
        add_qwen3_targets(km, 0, *qwen, qwen3_4b());
    }
    ModelInfo info() const { return {"Z-Image", 3840, "hidden"}; }
};

struct KleinModel {
    bool nine_b;
    std::unique_ptr<models::flux::Flux2DiT> dit;
    KeyMap km;
    explicit KleinModel(bool nb, bool bfl_order = true) : nine_b(nb), dit(std::make_unique<models::flux::Flux2DiT>(klein(nb), bfl_order)) {
        add_flux2_targets(km, *dit, klein(nb), bfl_order);
    }
    ModelInfo info() const { return {"FLUX.2 Klein", nine_b ? 4096 : 3072, "hidden"}; }
};

struct Fit {
    ParsedLora parsed;
    Mapping m;
};

Fit fit(const std::vector<TensorInfo>& ts, const KeyMap& km) {
    Fit f{parse_keys(ts, "test"), {}};
    f.m = map_patches(f.parsed, ts, km);
    return f;
}

// Every module of the fit found its layer, with the right shape.
void expect_all_mapped(const Fit& f, const std::string& what) {
    EXPECT_TRUE(f.m.unmapped.empty()) << what << ": " << f.m.unmapped.size() << " unmapped, e.g. " << f.m.unmapped[0];
    EXPECT_TRUE(f.m.mismatched.empty()) << what << ": " << f.m.mismatched[0];
}

std::string refusal(const std::vector<TensorInfo>& ts, const KeyMap& km, const ModelInfo& info) {
    Fit f = fit(ts, km);
    try {
        check_fit("x", ts, f.parsed, f.m, info);
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::ModelMismatch);
        return e.what();
    }
    return "(not refused)";
}

}  // namespace

TEST(LoraKeys, EveryKeyOfTheFlux1ListsMaps) {
    Flux1Model model;
    EXPECT_TRUE(model.km.ambiguous().empty()) << model.km.ambiguous()[0];
    struct Case {
        const char* file;
        size_t patches;
    };
    const Case cases[] = {
        {"flux_lora_kohya_format", 912 / 3},
        {"flux_lora_kohya_with_te1_format", 1128 / 3},
        {"flux_lora_diffusers_format", 988 / 2},
        {"flux_lora_diffusers_no_proj_mlp_format", 684 / 2},
        {"flux_lora_diffusers_base_model_format", 762 / 2},
        {"flux_lora_aitoolkit_format", 456 / 2},
        {"flux_lora_xlabs_format", 24 / 2},
        {"flux_dora_onetrainer_format", 2024 / 4},
    };
    for (const Case& c : cases) {
        const auto ts = lora_keys(c.file);
        Fit f = fit(ts, model.km);
        EXPECT_EQ(f.parsed.patches.size(), c.patches) << c.file;
        EXPECT_TRUE(f.parsed.unknown.empty()) << c.file;
        expect_all_mapped(f, c.file);
        EXPECT_EQ(f.m.mapped.size(), c.patches) << c.file;
        EXPECT_EQ(check_fit("x", ts, f.parsed, f.m, model.info()), "") << c.file;
    }
}

TEST(LoraKeys, FusedAndSplitLayersFindTheirRows) {
    Flux1Model model;
    const auto& dit = model.km.components()[0];
    auto names = [&](const Match& m) {
        std::vector<std::string> v;
        for (auto& d : m.dest)
            v.push_back(dit.targets[(size_t)d.target].name + "@" + std::to_string(d.rows.src_begin) + ":" + std::to_string(d.rows.src_end) +
                        ">" + std::to_string(d.rows.dst_begin));
        return v;
    };
    // BFL single-block linear1 = to_q | to_k | to_v | proj_mlp rows of the canonical weights
    EXPECT_EQ(names(model.km.find("lora_unet_single_blocks_3_linear1")),
              (std::vector<std::string>{"single_transformer_blocks.3.attn.to_q.weight@0:3072>0",
                                        "single_transformer_blocks.3.attn.to_k.weight@3072:6144>0",
                                        "single_transformer_blocks.3.attn.to_v.weight@6144:9216>0",
                                        "single_transformer_blocks.3.proj_mlp.weight@9216:21504>0"}));
    // xlabs lora2 = the text stream's fused qkv
    EXPECT_EQ(names(model.km.find("double_blocks.1.processor.qkv_lora2")).size(), 3u);
    EXPECT_EQ(names(model.km.find("double_blocks.1.processor.qkv_lora2"))[1], "transformer_blocks.1.attn.add_k_proj.weight@3072:6144>0");
    // diffusers to_k on its own
    EXPECT_EQ(names(model.km.find("transformer.single_transformer_blocks.0.attn.to_k")),
              (std::vector<std::string>{"single_transformer_blocks.0.attn.to_k.weight@0:3072>0"}));
    // norm_out: the model here keeps diffusers' (scale, shift) rows, so BFL's (shift, scale) swaps
    EXPECT_EQ(names(model.km.find("diffusion_model.final_layer.adaLN_modulation.1")),
              (std::vector<std::string>{"norm_out.linear.weight@0:3072>3072", "norm_out.linear.weight@3072:6144>0"}));
    EXPECT_EQ(names(model.km.find("transformer.norm_out.linear")), (std::vector<std::string>{"norm_out.linear.weight@0:6144>0"}));
    // the te components: kohya te1 = CLIP-L, te2 = T5
    EXPECT_EQ(model.km.components()[(size_t)model.km.find("lora_te1_text_model_encoder_layers_0_mlp_fc1").component].name, "clip_l");
    EXPECT_EQ(model.km.components()[(size_t)model.km.find("lora_te2_encoder_block_3_layer_1_DenseReluDense_wi_1").component].name, "t5xxl");
    EXPECT_EQ(model.km.find("lora_unet_no_such_layer").component, -1);
}

TEST(LoraKeys, ZImageLayouts) {
    ZImageModel model;
    EXPECT_TRUE(model.km.ambiguous().empty());
    // ai-toolkit / diffusers names as in a real Z-Image LoRA: 30 layers x 8 modules x 2 = 480 tensors
    std::vector<TensorInfo> ts;
    for (int i = 0; i < 30; ++i) {
        const std::string b = "diffusion_model.layers." + std::to_string(i) + ".";
        for (const char* q : {"attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0"}) pair(ts, b + q, 3840, 3840);
        pair(ts, b + "feed_forward.w1", 10240, 3840);
        pair(ts, b + "feed_forward.w3", 10240, 3840);
        pair(ts, b + "feed_forward.w2", 3840, 10240);
        pair(ts, b + "adaLN_modulation.0", 4 * 3840, 256);
    }
    ASSERT_EQ(ts.size(), 480u);
    Fit f = fit(ts, model.km);
    EXPECT_EQ(f.m.mapped.size(), 240u);
    expect_all_mapped(f, "ai-toolkit names");
    // original (fused qkv, attention.out) kohya names and a Qwen3 te LoRA
    std::vector<TensorInfo> o;
    pair(o, "lora_unet_layers_0_attention_qkv", 3 * 3840, 3840, "kohya");
    pair(o, "lora_unet_noise_refiner_1_attention_out", 3840, 3840, "kohya");
    pair(o, "lora_unet_context_refiner_0_feed_forward_w2", 3840, 10240, "kohya");
    pair(o, "lora_te_model_layers_0_self_attn_q_proj", 4096, 2560, "kohya");
    pair(o, "lora_te_layers_35_mlp_down_proj", 2560, 9728, "kohya");
    Fit g = fit(o, model.km);
    EXPECT_EQ(g.m.mapped.size(), 5u);
    expect_all_mapped(g, "original kohya names");
    EXPECT_EQ(g.m.mapped[0].dest.size(), 3u);  // qkv -> to_q, to_k, to_v
    EXPECT_EQ(check_fit("z", o, g.parsed, g.m, model.info()), "");
}

TEST(LoraKeys, KleinLayoutsAndSizes) {
    auto klein_lora = [](int64_t D, int nd, int ns, bool bfl) {
        const int64_t M = 3 * D;
        std::vector<TensorInfo> v;
        for (int i = 0; i < nd; ++i) {
            const std::string b = (bfl ? "diffusion_model.double_blocks." : "transformer.transformer_blocks.") + std::to_string(i) + ".";
            if (bfl) {
                for (const char* s : {"img", "txt"}) {
                    pair(v, b + s + "_attn.qkv", 3 * D, D);
                    pair(v, b + s + "_attn.proj", D, D);
                    pair(v, b + s + "_mlp.0", 2 * M, D);
                    pair(v, b + s + "_mlp.2", D, M);
                }
            } else {
                for (const char* s : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.to_add_out"}) pair(v, b + s, D, D);
                pair(v, b + "ff.linear_in", 2 * M, D);
                pair(v, b + "ff_context.linear_out", D, M);
            }
        }
        for (int i = 0; i < ns; ++i) {
            const std::string b = (bfl ? "diffusion_model.single_blocks." : "transformer.single_transformer_blocks.") + std::to_string(i) + ".";
            pair(v, b + (bfl ? "linear1" : "attn.to_qkv_mlp_proj"), 3 * D + 2 * M, D);
            pair(v, b + (bfl ? "linear2" : "attn.to_out"), D, D + M);
        }
        return v;
    };
    KleinModel k4(false), k9(true);
    EXPECT_TRUE(k4.km.ambiguous().empty());
    for (bool bfl : {true, false}) {
        auto l4 = klein_lora(3072, 5, 20, bfl);
        Fit f = fit(l4, k4.km);
        expect_all_mapped(f, bfl ? "4B, BFL names" : "4B, diffusers names");
        EXPECT_EQ(f.m.mapped.size(), f.parsed.patches.size());
        // a 4B LoRA on the 9B model: same family, another size
        const std::string r = refusal(l4, k9.km, k9.info());
        EXPECT_NE(r.find("targets FLUX.2 (hidden 3072), the model is FLUX.2 Klein (hidden 4096): it was made for another size"), std::string::npos) << r;
        auto l9 = klein_lora(4096, 8, 24, bfl);
        Fit g = fit(l9, k9.km);
        expect_all_mapped(g, bfl ? "9B, BFL names" : "9B, diffusers names");
    }
}

TEST(LoraKeys, SdUNetAndClipNamingSchemes) {
    const io::WeightIndex unet_idx = io::WeightIndex::open(lora_test::kData / "reference" / "unet_sd15_tiny.safetensors");
    std::ifstream side(lora_test::kData / "reference" / "unet_sd15_tiny.json");  // the fixture's diffusers config (8 groups)
    const models::sd::UNetConfig ucfg =
        models::sd::infer_unet_config(unet_idx, models::sd::unet_overrides_from_diffusers_config(nlohmann::json::parse(side).at("config")));
    models::sd::UNet2DCondition unet(ucfg);
    const io::WeightIndex clip_idx = io::WeightIndex::open(lora_test::kData / "reference" / "clip_text_sd15_tiny.safetensors");
    const auto keys = models::clip::find_clip_text_encoders(clip_idx);
    ASSERT_FALSE(keys.empty());
    const models::clip::ClipConfig ccfg = models::clip::infer_config(clip_idx, keys[0]);
    models::clip::ClipTextModel clip(ccfg);
    KeyMap km;
    add_unet_targets(km, unet, ucfg);
    add_clip_targets(km, "clip_l", 0, clip, ccfg);
    EXPECT_TRUE(km.ambiguous().empty());
    std::vector<TensorInfo> ts;
    // kohya, LDM names: proj_in (1x1 conv), a LoCon 3x3 conv1, the mid block's cross attention, time_embed
    ts.push_back(ti("lora_unet_input_blocks_1_1_proj_in.lora_down.weight", {4, 16, 1, 1}));
    ts.push_back(ti("lora_unet_input_blocks_1_1_proj_in.lora_up.weight", {16, 4, 1, 1}));
    ts.push_back(ti("lora_unet_input_blocks_1_0_in_layers_2.lora_down.weight", {4, 16, 3, 3}));
    ts.push_back(ti("lora_unet_input_blocks_1_0_in_layers_2.lora_up.weight", {16, 4, 1, 1}));
    pair(ts, "lora_unet_middle_block_1_transformer_blocks_0_attn2_to_k", 32, 32, "kohya", 4);
    pair(ts, "lora_unet_time_embed_0", 64, 16, "kohya", 4);
    // kohya, diffusers names
    pair(ts, "lora_unet_down_blocks_0_attentions_1_transformer_blocks_0_attn2_to_k", 16, 32, "kohya", 4);
    pair(ts, "lora_unet_time_embedding_linear_2", 64, 64, "kohya", 4);
    // PEFT and the old diffusers attention processors
    pair(ts, "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q", 16, 16, "peft", 4);
    ts.push_back(ti("unet.mid_block.attentions.0.transformer_blocks.0.attn1.processor.to_out_lora.down.weight", {4, 32}));
    ts.push_back(ti("unet.mid_block.attentions.0.transformer_blocks.0.attn1.processor.to_out_lora.up.weight", {32, 4}));
    // text encoder: kohya, PEFT, the old lora_linear_layer
    pair(ts, "lora_te_text_model_encoder_layers_0_self_attn_q_proj", 32, 32, "kohya", 4);
    pair(ts, "text_encoder.text_model.encoder.layers.1.mlp.fc1", 64, 32, "peft", 4);
    ts.push_back(ti("text_encoder.text_model.encoder.layers.1.self_attn.out_proj.lora_linear_layer.down.weight", {4, 32}));
    ts.push_back(ti("text_encoder.text_model.encoder.layers.1.self_attn.out_proj.lora_linear_layer.up.weight", {32, 4}));
    // LoHa on a conv (flattened kernel) and a full diff on a norm
    ts.push_back(ti("lora_unet_down_blocks_1_resnets_0_conv1.hada_w1_a", {32, 2}));
    ts.push_back(ti("lora_unet_down_blocks_1_resnets_0_conv1.hada_w1_b", {2, 16 * 9}));
    ts.push_back(ti("lora_unet_down_blocks_1_resnets_0_conv1.hada_w2_a", {32, 2}));
    ts.push_back(ti("lora_unet_down_blocks_1_resnets_0_conv1.hada_w2_b", {2, 16 * 9}));
    ts.push_back(ti("lora_unet_conv_norm_out.diff", {16}));
    ts.push_back(ti("lora_unet_conv_norm_out.diff_b", {16}));
    Fit f = fit(ts, km);
    expect_all_mapped(f, "SD naming schemes");
    EXPECT_EQ(f.m.mapped.size(), 13u);
    const auto& u = km.components()[0];
    EXPECT_EQ(u.targets[(size_t)f.m.mapped[0].dest[0].target].name, "down_blocks.0.attentions.0.proj_in.weight");
    EXPECT_EQ(u.targets[(size_t)f.m.mapped[1].dest[0].target].name, "down_blocks.0.resnets.0.conv1.weight");
    EXPECT_EQ(u.targets[(size_t)f.m.mapped[2].dest[0].target].name, "mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight");
    EXPECT_EQ(u.targets[(size_t)f.m.mapped[7].dest[0].target].name, "mid_block.attentions.0.transformer_blocks.0.attn1.to_out.0.weight");
    EXPECT_EQ(check_fit("sd", ts, f.parsed, f.m, {"SD1.x", 32, "context"}), "");

    // An SD1.5 LoRA (context 768) on this model (context 32)
    std::vector<TensorInfo> big;
    pair(big, "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k", 320, 768, "kohya", 4);
    pair(big, "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_v", 320, 768, "kohya", 4);
    const std::string r = refusal(big, km, {"SD1.x", 32, "context"});
    EXPECT_NE(r.find("LoRA 'x' targets SD1.x (context 768), the model is SD1.x (context 32)"), std::string::npos) << r;
}

TEST(LoraKeys, WrongFamiliesAreRefusedNamingTheirTarget) {
    Flux1Model flux;
    ZImageModel zimage;
    KleinModel k4(false);
    std::string r = refusal(lora_keys("flux_lora_kohya_format"), zimage.km, zimage.info());
    EXPECT_NE(r.find("LoRA 'x' targets FLUX.1 (hidden 3072), the model is Z-Image (hidden 3840): use a LoRA made for Z-Image"), std::string::npos) << r;
    r = refusal(lora_keys("flux_lora_diffusers_format"), k4.km, k4.info());
    EXPECT_NE(r.find("targets FLUX.1 (hidden 3072), the model is FLUX.2 Klein (hidden 3072)"), std::string::npos) << r;
    for (const char* f : {"anima_lora_kohya_format", "anima_lora_kohya_with_te_format", "anima_lora_lokr_format", "anima_lora_peft_format"}) {
        r = refusal(lora_keys(f), zimage.km, zimage.info());
        EXPECT_NE(r.find("targets Anima/Cosmos, a model family easel does not run; the model is Z-Image"), std::string::npos) << f << ": " << r;
    }
    r = refusal(lora_keys("krea2_lora_kohya_format"), flux.km, flux.info());
    EXPECT_NE(r.find("targets Krea 2, a model family easel does not run"), std::string::npos) << r;
    for (const char* f : {"qwen_image_lora_diffusers_format", "qwen_image_lora_kohya_format"}) {
        r = refusal(lora_keys(f), zimage.km, zimage.info());
        EXPECT_NE(r.find("targets Qwen-Image, a model family easel does not run"), std::string::npos) << f << ": " << r;
    }
    r = refusal(lora_keys("qwen_image_lora_kohya_format"), flux.km, flux.info());  // img_mlp: firmly Qwen-Image
    EXPECT_NE(r.find("targets Qwen-Image, a model family easel does not run"), std::string::npos) << r;
    // The diffusers Qwen-Image list holds only transformer_blocks.{0,1}.attn.to_{q,k} of width 3072: exactly
    // the names and shapes of a FLUX.1 LoRA of those layers. It is applied to FLUX.1, with a warning.
    {
        const auto ts = lora_keys("qwen_image_lora_diffusers_format");
        Fit f = fit(ts, flux.km);
        const std::string w = check_fit("q", ts, f.parsed, f.m, flux.info());
        EXPECT_NE(w.find("LoRA 'q': its names also fit Qwen-Image; applied as FLUX.1 layers"), std::string::npos) << w;
    }
    // the FLUX Control LoRA (img_in widened to 128 inputs, norm scales replaced)
    r = refusal(lora_keys("flux_control_lora_format"), flux.km, flux.info());
    EXPECT_NE(r.find("is a FLUX Control LoRA"), std::string::npos) << r;
    // InvokeAI's LoKr list has made-up factor shapes: kron([32, 96], [32, 32]) = [1024, 3072] is no FLUX.1 layer
    r = refusal(lora_keys("flux_lokr_bfl_format"), flux.km, flux.info());
    EXPECT_NE(r.find("does not fit the FLUX.1 (hidden 3072) model"), std::string::npos) << r;
}

TEST(LoraKeys, PartialMatchesAreNamedInOneWarning) {
    Flux1Model model;
    auto ts = lora_keys("flux_lora_kohya_format");
    pair(ts, "lora_unet_no_such_block_0", 3072, 3072, "kohya");
    ts.push_back(ti("emb_params", {2, 768}));
    ts.push_back(ti("some.full.tensor", {3}));
    Fit f = fit(ts, model.km);
    const std::string w = check_fit("mine", ts, f.parsed, f.m, model.info());
    EXPECT_NE(w.find("LoRA 'mine': 1 of its 305 modules match no layer of the FLUX.1 model and are not applied: lora_unet_no_such_block_0"),
              std::string::npos) << w;
    EXPECT_NE(w.find("1 tensors of no LoRA kind are not applied: some.full.tensor"), std::string::npos) << w;
    EXPECT_NE(w.find("1 bundled embedding vectors (emb_params) are not applied"), std::string::npos) << w;
}

TEST(LoraKeys, MalformedAndOldFormatsAreRefused) {
    // cloneofsimo/lora: numbered modules, no names (the real key list of lora_disney.safetensors)
    std::ifstream kf(lora_test::kData / "io" / "keys" / "lora_cloneofsimo_disney.json");
    auto j = nlohmann::json::parse(kf);
    std::vector<TensorInfo> clone;
    for (auto& e : j) clone.push_back(ti(e[0], e[2].get<std::vector<int64_t>>()));
    try {
        parse_keys(clone, "lora_disney.safetensors");
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
        EXPECT_NE(std::string(e.what()).find("lora_disney.safetensors is a cloneofsimo/lora file"), std::string::npos) << e.what();
    }
    // an up without its down; ranks that disagree; a LoHa half
    auto bad = [](std::vector<TensorInfo> ts) {
        try {
            parse_keys(ts, "f");
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
            return std::string(e.what());
        }
        return std::string("(accepted)");
    };
    EXPECT_NE(bad({ti("a.lora_up.weight", {4, 2})}).find("has an up (lora_B) weight without a down (lora_A) weight"), std::string::npos);
    EXPECT_NE(bad({ti("a.lora_up.weight", {4, 2}), ti("a.lora_down.weight", {3, 4})}).find("ranks disagree"), std::string::npos);
    EXPECT_NE(bad({ti("a.hada_w1_a", {4, 2}), ti("a.hada_w1_b", {2, 4})}).find("LoHa needs"), std::string::npos);
    EXPECT_NE(bad({ti("a.lora_up.weight", {4, 2}), ti("a.lora_down.weight", {2, 4}), ti("a.alpha", {2})}).find("alpha has shape [2]"),
              std::string::npos);
    // an alpha alone patches nothing and is not an error
    EXPECT_TRUE(parse_keys({ti("a.alpha", {})}, "f").patches.empty());
}

TEST(LoraKeys, SdxlTextEncoderPrefixes) {
    // SDXL's kohya LoRAs name CLIP-L lora_te1_ and CLIP-G (OpenCLIP bigG in transformers names) lora_te2_;
    // diffusers text_encoder. / text_encoder_2. (the UNet side uses the UNet key map of SD1.x/2.x).
    const models::clip::ClipConfig g{.vocab = 49408, .width = 1280, .layers = 32, .positions = 77, .intermediate = 5120, .heads = 20,
                                     .projection = 1280, .act = models::clip::Activation::Gelu};
    models::clip::ClipTextModel l_model(clip_l()), g_model(g);
    KeyMap km;
    add_clip_targets(km, "clip_l", 0, l_model, clip_l());
    add_clip_targets(km, "clip_g", 1, g_model, g);
    std::vector<TensorInfo> ts;
    pair(ts, "lora_te1_text_model_encoder_layers_11_self_attn_q_proj", 768, 768, "kohya", 8);
    pair(ts, "lora_te2_text_model_encoder_layers_31_mlp_fc2", 1280, 5120, "kohya", 8);
    pair(ts, "text_encoder_2.text_model.encoder.layers.0.self_attn.k_proj", 1280, 1280, "peft", 8);
    pair(ts, "text_encoder.text_model.encoder.layers.0.mlp.fc1", 3072, 768, "peft", 8);
    Fit f = fit(ts, km);
    ASSERT_EQ(f.m.mapped.size(), 4u);
    expect_all_mapped(f, "SDXL te prefixes");
    const char* want[] = {"clip_l", "clip_g", "clip_g", "clip_l"};
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(km.components()[(size_t)f.m.mapped[i].component].name, want[i]) << i;
}
