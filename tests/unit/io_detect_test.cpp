// Family detection: reference fixtures, real model files' key lists (tests/data/io/keys, made
// from the real files), real LoRA key lists of every common format (tests/data/io/lora-keys,
// from InvokeAI's tests), the tiny SD1.x single-file checkpoint and diffusers folder, and
// synthetic full-size layouts given as (name, shape) lists.
#include "io/detect.h"
#include "io/weight_index.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

using namespace easel::io;
namespace fs = std::filesystem;

namespace {

const fs::path kData = EASEL_TEST_DATA;

TensorInfo ti(const std::string& name, std::vector<int64_t> shape, const std::string& dtype = "F32") {
    TensorInfo t;
    t.name = name;
    t.shape = std::move(shape);
    t.dtype = dtype == "F16" ? DType::F16 : dtype == "I64" ? DType::I64 : DType::F32;
    const int es = dtype == "F16" ? 2 : dtype == "I64" ? 8 : 4;
    t.nbytes = (uint64_t)std::max<int64_t>(t.numel(), 0) * es;
    return t;
}

// [[name, dtype, shape], ...] key lists.
std::vector<TensorInfo> keys(const fs::path& p) {
    std::ifstream f(p);
    auto j = nlohmann::json::parse(f);
    std::vector<TensorInfo> v;
    for (auto& e : j) v.push_back(ti(e[0], e[2].get<std::vector<int64_t>>(), e[1]));
    return v;
}

// InvokeAI LoRA lists: {"state_dict_keys": {key: shape}}.
std::vector<TensorInfo> lora_keys(const std::string& name) {
    std::ifstream f(kData / "io" / "lora-keys" / (name + ".json"));
    auto j = nlohmann::json::parse(f);
    std::vector<TensorInfo> v;
    for (auto& [k, s] : j["state_dict_keys"].items()) v.push_back(ti(k, s.get<std::vector<int64_t>>()));
    return v;
}

const DetectedComponent* comp(const Detection& d, const std::string& role) {
    for (auto& c : d.components)
        if (c.role == role) return &c;
    return nullptr;
}

}  // namespace

TEST(IoDetect, ReferenceFixtures) {
    struct Case {
        const char* file;
        const char* family;
        const char* variant;  // substring
    };
    const Case cases[] = {
        {"unet_sd15_tiny", "SD1.x", ""},
        {"autoencoder_kl_sd_tiny", "SD VAE", "4ch"},
        {"autoencoder_kl_flux_tiny", "FLUX VAE", "16ch"},
        {"autoencoder_kl_flux2_tiny", "FLUX.2 VAE", "8ch"},
        {"autoencoder_tiny_taesd_tiny", "TAESD", "TAESD encoder + decoder"},
        {"clip_text_sd15_tiny", "CLIP text encoder", "hidden 32, 3 layers"},
        {"clip_text_with_projection_tiny", "CLIP text encoder", "with projection"},
        {"t5_encoder_tiny", "T5 encoder", "d_model 32"},
        {"qwen3_text_tiny", "LLM text encoder", "Qwen3"},
        {"flux1_transformer_tiny", "FLUX.1", "dev"},
        {"flux2_klein_transformer_tiny", "FLUX.2", "Klein"},
        {"sd3_transformer_tiny", "SD3", ""},
        {"zimage_transformer_tiny", "Z-Image", ""},
        {"qwenimage_transformer_tiny", "Qwen-Image", ""},
    };
    for (auto& c : cases) {
        auto d = detect(keys(kData / "io" / "keys" / (std::string("fixture_") + c.file + ".json")));
        EXPECT_EQ(d.family, c.family) << c.file;
        EXPECT_NE(d.variant.find(c.variant), std::string::npos) << c.file << ": " << d.variant;
        EXPECT_EQ(d.components.size(), 1u) << c.file;
        // Also the file itself, for the fixtures the repository keeps (tests/data/reference; the
        // SD3 and Qwen-Image transformers are kept as key lists only)
        const fs::path real = kData / "reference" / (std::string(c.file) + ".safetensors");
        const std::string f = c.file;
        if (f == "sd3_transformer_tiny" || f == "qwenimage_transformer_tiny") continue;
        ASSERT_TRUE(fs::exists(real)) << real;
        auto d2 = detect(WeightIndex::open(real));
        EXPECT_EQ(d2.family, c.family) << real;
        EXPECT_EQ(d2.variant, d.variant) << real;
    }
    // FLUX.1 dev by its guidance embedder; param bytes are the weights' (inputs/outputs excluded).
    auto wi = WeightIndex::open(kData / "reference" / "unet_sd15_tiny.safetensors");
    auto d = detect(wi);
    ASSERT_EQ(d.components.size(), 1u);
    EXPECT_EQ(d.components[0].params, 283284);  // README: 283,284 parameters
    EXPECT_EQ(d.components[0].param_bytes, 283284u * 4);
    EXPECT_EQ(d.layout, "diffusers");
}

TEST(IoDetect, TinySingleFileCheckpointAndDiffusersFolder) {
    auto d = detect(WeightIndex::open(kData / "reference" / "sd_tiny" / "sd_tiny.safetensors"));
    EXPECT_EQ(d.family, "SD1.x");
    EXPECT_NE(d.layout.find("single-file"), std::string::npos) << d.layout;
    auto* dm = comp(d, "diffusion model");
    auto* vae = comp(d, "VAE");
    auto* te = comp(d, "text encoder");
    ASSERT_TRUE(dm && vae && te);
    EXPECT_EQ(dm->prefix, "model.diffusion_model.");
    EXPECT_EQ(vae->prefix, "first_stage_model.");
    EXPECT_EQ(te->prefix, "cond_stage_model.transformer.");
    EXPECT_EQ(vae->kind, "vae_kl");
    EXPECT_EQ(te->kind, "clip");
    auto wi = WeightIndex::open(kData / "reference" / "sd_tiny" / "sd_tiny.safetensors");
    EXPECT_EQ(dm->param_bytes, wi.bytes_with_prefix("model.diffusion_model."));
    EXPECT_EQ(vae->param_bytes, wi.bytes_with_prefix("first_stage_model."));
    EXPECT_EQ(te->param_bytes, wi.bytes_with_prefix("cond_stage_model."));

    const fs::path pipe = kData / "reference" / "sd_tiny" / "diffusers";
    EXPECT_EQ(detect(WeightIndex::open(pipe / "unet")).family, "SD1.x");
    EXPECT_EQ(detect(WeightIndex::open(pipe / "vae")).family, "SD VAE");
    EXPECT_EQ(detect(WeightIndex::open(pipe / "text_encoder")).family, "CLIP text encoder");
    EXPECT_NE(WeightIndex::open(pipe / "unet").config(), nullptr);
}

TEST(IoDetect, RealModelKeyLists) {
    const fs::path k = kData / "io" / "keys";
    auto e = detect(keys(k / "esrgan_realesr_animevideov3.json"));
    EXPECT_EQ(e.family, "ESRGAN upscaler");
    EXPECT_EQ(e.variant, "SRVGGNetCompact x4");  // realesr-animevideov3 is x4
    auto t2e = detect(keys(k / "taef2_encoder.json"));
    EXPECT_EQ(t2e.family, "TAESD");
    EXPECT_EQ(t2e.variant, "TAEF2 encoder");
    EXPECT_EQ(detect(keys(k / "taef2_decoder.json")).variant, "TAEF2 decoder");
    EXPECT_EQ(detect(keys(k / "taesana_encoder.json")).variant, "TAESANA encoder");
    // The committed safetensors conversion of TAEF2 (same keys) too.
    EXPECT_EQ(detect(WeightIndex::open(kData / "reference" / "autoencoder_tiny_taef2_decoder.safetensors")).variant, "TAEF2 decoder");
    auto ti_ = detect(keys(k / "textual_inversion_test_embedding.json"));
    EXPECT_EQ(ti_.family, "Textual inversion");
    EXPECT_EQ(ti_.variant, "5 vectors for SD1.x");
    for (const char* f : {"lora_cloneofsimo_disney.json", "lora_cloneofsimo_analog_svd_rank4.json"}) {
        auto l = detect(keys(k / f));
        EXPECT_EQ(l.family, "LoRA") << f;
        EXPECT_EQ(l.layout, "cloneofsimo") << f;
        EXPECT_NE(l.variant.find("SD1.x"), std::string::npos) << f << ": " << l.variant;
        EXPECT_NE(comp(l, "LoRA (text encoders)"), nullptr) << f;
    }
    // the disney LoRA's key list (made from the file) holds the <s1>, <s2> pivotal-tuning tokens
    EXPECT_NE(comp(detect(keys(k / "lora_cloneofsimo_disney.json")), "embedding"), nullptr);
}

TEST(IoDetect, LoraFormatsFromRealKeyLists) {
    struct Case {
        const char* file;
        const char* layout;
        const char* variant;  // substring
    };
    const Case cases[] = {
        {"flux_lora_kohya_format", "kohya", "LoRA for FLUX.1"},
        {"flux_lora_kohya_with_te1_format", "kohya", "FLUX.1"},
        {"flux_lora_diffusers_format", "diffusers/peft", "LoRA for FLUX.1"},
        {"flux_lora_diffusers_no_proj_mlp_format", "diffusers/peft", "FLUX.1"},
        {"flux_lora_diffusers_base_model_format", "peft", "FLUX.1"},
        {"flux_lora_aitoolkit_format", "ComfyUI/ai-toolkit (BFL names)", "FLUX.1"},
        {"flux_lora_xlabs_format", "xlabs", "FLUX.1"},
        {"flux_lokr_bfl_format", "ComfyUI", "LoKr for FLUX.1"},
        {"flux_dora_onetrainer_format", "kohya", "DoRA"},
        {"flux_control_lora_format", "", "full tensors"},
        {"qwen_image_lora_diffusers_format", "diffusers", "Qwen-Image"},
        {"qwen_image_lora_kohya_format", "kohya", "LoKr for Qwen-Image"},
        {"anima_lora_kohya_format", "kohya", "Cosmos"},
        {"anima_lora_kohya_with_te_format", "kohya", "Cosmos"},
        {"anima_lora_lokr_format", "ComfyUI", "LoKr+DoRA"},
        {"anima_lora_peft_format", "ComfyUI/ai-toolkit (BFL names)", "Cosmos"},
        {"krea2_lora_kohya_format", "kohya", "LoRA"},
    };
    for (auto& c : cases) {
        auto d = detect(lora_keys(c.file));
        EXPECT_EQ(d.family, "LoRA") << c.file;
        if (*c.layout) { EXPECT_EQ(d.layout, c.layout) << c.file; }
        EXPECT_NE(d.variant.find(c.variant), std::string::npos) << c.file << ": " << d.variant;
    }
    // Text-encoder parts are split out with their bytes.
    auto te = detect(lora_keys("flux_lora_kohya_with_te1_format"));
    auto* tc = comp(te, "LoRA (text encoders)");
    auto* dc = comp(te, "LoRA (diffusion model)");
    ASSERT_TRUE(tc && dc);
    EXPECT_GT(tc->tensors, 0u);
    EXPECT_EQ(tc->tensors + dc->tensors, lora_keys("flux_lora_kohya_with_te1_format").size());
}

TEST(IoDetect, FullSizeLayoutsFromNameShapeLists) {
    // SD1.5 original single file: 4 in-channels, context 768, conv proj_in.
    std::vector<TensorInfo> sd15 = {
        ti("model.diffusion_model.input_blocks.0.0.weight", {320, 4, 3, 3}),
        ti("model.diffusion_model.input_blocks.1.1.proj_in.weight", {320, 320, 1, 1}),
        ti("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight", {320, 768}),
        ti("first_stage_model.encoder.conv_in.weight", {128, 3, 3, 3}),
        ti("first_stage_model.encoder.down.0.block.0.conv1.weight", {128, 128, 3, 3}),
        ti("first_stage_model.encoder.conv_out.weight", {8, 512, 3, 3}),
        ti("cond_stage_model.transformer.text_model.embeddings.token_embedding.weight", {49408, 768}),
        ti("cond_stage_model.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight", {768, 768}),
        ti("cond_stage_model.transformer.text_model.encoder.layers.11.self_attn.q_proj.weight", {768, 768}),
        ti("model_ema.decay", {}),
        ti("alphas_cumprod", {1000}),
    };
    auto d = detect(sd15);
    EXPECT_EQ(d.family, "SD1.x");
    EXPECT_EQ(d.variant, "");
    EXPECT_NE(comp(d, "EMA weights"), nullptr);
    EXPECT_NE(comp(d, "other"), nullptr);
    EXPECT_NE(comp(d, "text encoder")->detail.find("hidden 768"), std::string::npos);

    // Inpainting: 9 input channels.
    sd15[0] = ti("model.diffusion_model.input_blocks.0.0.weight", {320, 9, 3, 3});
    EXPECT_EQ(detect(sd15).variant, "inpaint");

    // SD2.x: linear proj_in, context 1024, OpenCLIP-H text encoder; prediction unknown, then from metadata.
    std::vector<TensorInfo> sd2 = {
        ti("model.diffusion_model.input_blocks.0.0.weight", {320, 4, 3, 3}),
        ti("model.diffusion_model.input_blocks.1.1.proj_in.weight", {320, 320}),
        ti("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight", {320, 1024}),
        ti("cond_stage_model.model.token_embedding.weight", {49408, 1024}),
        ti("cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight", {3072, 1024}),
    };
    d = detect(sd2);
    EXPECT_EQ(d.family, "SD2.x");
    EXPECT_EQ(d.variant, "768-v or 512 eps: prediction from config/metadata");
    EXPECT_NE(comp(d, "text encoder")->detail.find("OpenCLIP"), std::string::npos);
    std::map<std::string, MetaValue> meta;
    meta["modelspec.prediction_type"].s = "v";
    EXPECT_EQ(detect(sd2, meta).variant, "v-prediction");

    // SDXL base and refiner (LDM names).
    auto sdxl = [](int64_t ctx, int64_t adm) {
        return std::vector<TensorInfo>{
            ti("model.diffusion_model.input_blocks.0.0.weight", {ctx == 2048 ? 320 : 384, 4, 3, 3}),
            ti("model.diffusion_model.label_emb.0.0.weight", {1280, adm}),
            ti("model.diffusion_model.input_blocks.4.1.proj_in.weight", {640, 640}),
            ti("model.diffusion_model.input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight", {640, ctx}),
            ti("conditioner.embedders.0.transformer.text_model.embeddings.token_embedding.weight", {49408, 768}),
        };
    };
    d = detect(sdxl(2048, 2816));
    EXPECT_EQ(d.family, "SDXL");
    EXPECT_EQ(d.variant, "base");
    EXPECT_EQ(comp(d, "text encoder 1")->prefix, "conditioner.embedders.0.transformer.");
    EXPECT_EQ(detect(sdxl(1280, 2560)).variant, "refiner");

    // FLUX.1 BFL dev vs schnell, and Fill.
    std::vector<TensorInfo> flux = {
        ti("img_in.weight", {3072, 64}), ti("txt_in.weight", {3072, 4096}), ti("vector_in.in_layer.weight", {3072, 768}),
        ti("double_blocks.0.img_attn.qkv.weight", {9216, 3072}), ti("double_blocks.18.img_attn.qkv.weight", {9216, 3072}),
        ti("single_blocks.0.linear1.weight", {21504, 3072}), ti("single_blocks.37.linear1.weight", {21504, 3072}),
        ti("guidance_in.in_layer.weight", {3072, 256}),
    };
    d = detect(flux);
    EXPECT_EQ(d.family, "FLUX.1");
    EXPECT_EQ(d.variant, "dev");
    EXPECT_EQ(d.layout, "BFL");
    std::vector<TensorInfo> schnell(flux.begin(), flux.end() - 1);
    EXPECT_EQ(detect(schnell).variant, "schnell");
    for (auto& t : flux)
        t.name = "model.diffusion_model." + t.name;
    flux[0] = ti("model.diffusion_model.img_in.weight", {3072, 384});
    d = detect(flux);
    EXPECT_EQ(d.family, "FLUX.1");
    EXPECT_EQ(d.variant, "dev, Fill (inpaint)");

    // FLUX.2 Klein 4B (BFL names): shared modulation, no guidance, 5 double + 20 single, hidden 3072.
    std::vector<TensorInfo> klein = {ti("img_in.weight", {3072, 128}), ti("txt_in.weight", {3072, 7680}),
                                     ti("double_stream_modulation_img.lin.weight", {18432, 3072})};
    for (int i = 0; i < 5; ++i) klein.push_back(ti("double_blocks." + std::to_string(i) + ".img_attn.qkv.weight", {9216, 3072}));
    for (int i = 0; i < 20; ++i) klein.push_back(ti("single_blocks." + std::to_string(i) + ".linear1.weight", {27648, 3072}));
    d = detect(klein);
    EXPECT_EQ(d.family, "FLUX.2");
    EXPECT_EQ(d.variant, "Klein 4B");
    klein.push_back(ti("guidance_in.in_layer.weight", {3072, 256}));
    EXPECT_EQ(detect(klein).variant, "dev");

    // SD3.5 large (38 joint blocks) vs medium (MMDiT-X attn2).
    std::vector<TensorInfo> sd35;
    for (int i = 0; i < 38; ++i)
        sd35.push_back(ti("model.diffusion_model.joint_blocks." + std::to_string(i) + ".x_block.attn.qkv.weight", {7488, 2496}));
    sd35.push_back(ti("model.diffusion_model.x_embedder.proj.weight", {2496, 16, 2, 2}));
    sd35.push_back(ti("text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q.weight", {4096, 4096}));
    sd35.push_back(ti("text_encoders.t5xxl.transformer.shared.weight", {32128, 4096}));
    for (int i = 0; i < 24; ++i)
        sd35.push_back(ti("text_encoders.t5xxl.transformer.encoder.block." + std::to_string(i) + ".layer.0.SelfAttention.k.weight", {4096, 4096}));
    d = detect(sd35);
    EXPECT_EQ(d.family, "SD3");
    EXPECT_EQ(d.variant, "3.5 large");
    EXPECT_NE(comp(d, "text encoder (t5xxl)")->detail.find("T5-XXL"), std::string::npos);

    // Text encoders alone: CLIP-L, CLIP-G (HF), Qwen3-4B.
    auto clip = [](int64_t h, int n) {
        std::vector<TensorInfo> v = {ti("text_model.embeddings.token_embedding.weight", {49408, h})};
        for (int i = 0; i < n; ++i) v.push_back(ti("text_model.encoder.layers." + std::to_string(i) + ".mlp.fc1.weight", {4 * h, h}));
        return v;
    };
    EXPECT_EQ(detect(clip(768, 12)).variant, "CLIP-L");
    EXPECT_EQ(detect(clip(1280, 32)).variant, "CLIP-G (OpenCLIP bigG)");
    std::vector<TensorInfo> q3 = {ti("model.embed_tokens.weight", {151936, 2560}), ti("model.layers.0.self_attn.q_norm.weight", {128}),
                                  ti("model.layers.35.self_attn.q_proj.weight", {4096, 2560})};
    EXPECT_EQ(detect(q3).variant, "Qwen3 4B");

    // ESRGAN RRDBNet x4 (BasicSR names).
    std::vector<TensorInfo> rrdb = {ti("conv_first.weight", {64, 3, 3, 3}), ti("body.0.rdb1.conv1.weight", {32, 64, 3, 3}),
                                    ti("conv_up1.weight", {64, 64, 3, 3}), ti("conv_up2.weight", {64, 64, 3, 3})};
    EXPECT_EQ(detect(rrdb).variant, "RRDBNet x4");

    // Unknown input never throws.
    EXPECT_EQ(detect(std::vector<TensorInfo>{ti("foo", {3})}).family, "unknown");
    EXPECT_EQ(detect(std::vector<TensorInfo>{}).family, "unknown");
}
