// LoRAs applied inside the families (lora/apply.h through nn::read_param and nn::weight_matmul),
// on the tiny SD1.x model of tests/data/reference/sd_tiny (F16 weights, UNet + CLIP + VAE in one
// file). The expectation is the model itself with its weights patched by hand: W + m * s * up @ down
// computed here (F64 sums rounded to F32, times s, times m, added in F32, rounded to F16) and
// written into a copy of the file; merged LoRAs must give that model's outputs bit for bit.
#include "lora_test_support.h"

#include "core/error.h"
#include "lora/apply.h"
#include "models/family.h"
#include "models/family_base.h"
#include "models/sd/stable_diffusion.h"
#include "text/clip_tokenizer.h"
#include "text/embeddings.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

using namespace easel;
using lora_test::StTensor;
namespace fs = std::filesystem;

namespace {

const fs::path kTiny = lora_test::kData / "reference" / "sd_tiny" / "sd_tiny.safetensors";

/// One low-rank patch of the test LoRAs: the model's stored weight, its kohya module name, the
/// factors' shapes and values.
struct LowRank {
    std::string stored;   ///< the weight's name in sd_tiny.safetensors
    std::string module;   ///< kohya module name in the LoRA file
    std::vector<int64_t> down_shape, up_shape;
    float alpha = 0;      ///< stored as .alpha; the scale is alpha / rank
    std::vector<float> down, up;
    int64_t rank() const { return down_shape[0]; }
};

std::vector<float> randn(size_t n, uint32_t seed, float sd) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

int64_t numel(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (auto d : s) n *= d;
    return n;
}

/// The patches of a LoRA: a cross-attention key projection (Linear), a 3x3 ResNet conv (LoCon),
/// a 1x1 proj_in conv, and the text encoder's first query projection. `seed` varies the values.
std::vector<LowRank> make_patches(uint32_t seed, bool with_te = true) {
    std::vector<LowRank> v;
    auto add = [&](std::string stored, std::string module, std::vector<int64_t> down, std::vector<int64_t> up, float alpha) {
        LowRank p{std::move(stored), std::move(module), std::move(down), std::move(up), alpha, {}, {}};
        p.down = randn((size_t)numel(p.down_shape), seed++, 0.3f);
        p.up = randn((size_t)numel(p.up_shape), seed++, 0.3f);
        v.push_back(std::move(p));
    };
    add("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight",
        "lora_unet_input_blocks_1_1_transformer_blocks_0_attn2_to_k", {4, 64}, {32, 4}, 2.0f);
    add("model.diffusion_model.input_blocks.1.0.in_layers.2.weight", "lora_unet_input_blocks_1_0_in_layers_2", {4, 32, 3, 3},
        {32, 4, 1, 1}, 4.0f);
    add("model.diffusion_model.middle_block.1.proj_in.weight", "lora_unet_middle_block_1_proj_in", {2, 64, 1, 1}, {64, 2, 1, 1}, 1.0f);
    if (with_te)
        add("cond_stage_model.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight",
            "lora_te_text_model_encoder_layers_0_self_attn_q_proj", {2, 64}, {64, 2}, 1.0f);
    return v;
}

fs::path write_lora(const fs::path& dir, const std::string& name, const std::vector<LowRank>& ps) {
    std::vector<StTensor> ts;
    for (const LowRank& p : ps) {
        ts.push_back({p.module + ".lora_down.weight", p.down_shape, p.down, false});
        ts.push_back({p.module + ".lora_up.weight", p.up_shape, p.up, false});
        ts.push_back({p.module + ".alpha", {}, {p.alpha}, false});
    }
    return lora_test::write_safetensors(dir / (name + ".safetensors"), ts);
}

/// W += m * s * up @ down for each patch, by hand, in a copy of sd_tiny (F16 values rewritten in place).
fs::path patch_by_hand(const fs::path& out, const std::vector<std::pair<std::vector<LowRank>, float>>& loras) {
    fs::copy_file(kTiny, out, fs::copy_options::overwrite_existing);
    const io::WeightIndex idx = io::WeightIndex::open(kTiny);
    std::map<std::string, std::vector<float>> w;  // stored name -> F32 values
    for (const auto& [ps, m] : loras)
        for (const LowRank& p : ps) {
            const io::TensorInfo* t = idx.find(p.stored);
            EXPECT_NE(t, nullptr) << p.stored;
            if (!t) continue;
            if (!w.count(p.stored)) w[p.stored] = idx.read_f32(*t);
            std::vector<float>& W = w[p.stored];
            const int64_t rows = p.up_shape[0], r = p.rank(), re = numel(p.down_shape) / r;
            EXPECT_EQ((int64_t)W.size(), rows * re) << p.stored;
            const float s = p.alpha / (float)r;
            for (int64_t o = 0; o < rows; ++o)
                for (int64_t j = 0; j < re; ++j) {
                    double acc = 0;
                    for (int64_t k = 0; k < r; ++k) acc += (double)p.up[(size_t)(o * r + k)] * (double)p.down[(size_t)(k * re + j)];
                    float d = (float)acc;
                    d *= s;
                    W[(size_t)(o * re + j)] += m * d;
                }
        }
    std::fstream f(out, std::ios::in | std::ios::out | std::ios::binary);
    for (const auto& [name, W] : w) {
        const io::TensorInfo* t = idx.find(name);
        std::vector<ggml_fp16_t> h(W.size());
        for (size_t i = 0; i < W.size(); ++i) h[i] = ggml_fp32_to_fp16(W[i]);
        f.seekp((std::streamoff)t->offset);
        f.write(reinterpret_cast<const char*>(h.data()), (std::streamsize)(h.size() * 2));
    }
    return out;
}

std::unique_ptr<models::Family> open_tiny(const fs::path& model, const std::string& type = "") {
    models::ModelFiles files;
    files.model = model.string();
    models::FamilyOptions fo;
    fo.threads = 2;
    fo.weight_type = type;
    return models::open_family(files, fo);
}

lora::LoraRequest request(const fs::path& file, float te, float unet) {
    lora::LoraRequest r;
    r.name = file.stem().string();
    r.path = file;
    r.te_weight = te;
    r.diffusion_weight = unet;
    r.origin = "--lora";
    return r;
}

/// What a model gives: the conditioning of one prompt and one UNet evaluation on it.
struct Out {
    std::vector<float> context, eps;
};

Out run(models::Family& fam) {
    Out o;
    const models::Conditioning c = fam.encode_prompt("a red cube on a table", 0);
    o.context = c.context;
    const int64_t h = 8, w = 8;
    const auto x = randn((size_t)(4 * h * w), 7, 1.0f);
    o.eps.resize(x.size());
    fam.diffusion(x, {}, h, w, 500.0, c, o.eps);
    return o;
}

Out run_with(const fs::path& model, const std::vector<lora::LoraRequest>& reqs, lora::ApplyMode mode, const std::string& type = "") {
    auto fam = open_tiny(model, type);
    models::set_loras(*fam, lora::open_loras(reqs), mode);
    return run(*fam);
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0, scale = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        m = std::max(m, (double)std::fabs(a[i] - b[i]));
        scale = std::max(scale, (double)std::fabs(b[i]));
    }
    return m / std::max(scale, 1e-30);
}

class LoraApply : public ::testing::Test {
protected:
    void SetUp() override { dir = lora_test::temp_dir("lora_apply"); }
    void TearDown() override { fs::remove_all(dir); }
    fs::path dir;
};

}  // namespace

// Merged (immediately, and auto on F16 weights): the hand-patched model's outputs, bit for bit.
TEST_F(LoraApply, MergedEqualsHandPatchedModelBitwise) {
    const auto ps = make_patches(11);
    const fs::path l = write_lora(dir, "one", ps);
    const fs::path hand = patch_by_hand(dir / "hand.safetensors", {{ps, 1.0f}});
    const Out want = run(*open_tiny(hand));
    const Out base = run(*open_tiny(kTiny));
    ASSERT_NE(want.context, base.context) << "the te patch must change the conditioning";
    ASSERT_NE(want.eps, base.eps);
    for (lora::ApplyMode mode : {lora::ApplyMode::Immediately, lora::ApplyMode::Auto}) {
        const Out got = run_with(kTiny, {request(l, 1.0f, 1.0f)}, mode);
        EXPECT_EQ(got.context, want.context) << lora::apply_mode_name(mode);
        EXPECT_EQ(got.eps, want.eps) << lora::apply_mode_name(mode);
    }
}

// Two LoRAs add (in order), with a negative weight; te and UNet weights apart (A1111 te:unet).
TEST_F(LoraApply, TwoLorasAddAndNegativeWeights) {
    const auto a = make_patches(21), b = make_patches(41);
    const fs::path la = write_lora(dir, "a", a), lb = write_lora(dir, "b", b);
    const fs::path hand = patch_by_hand(dir / "hand2.safetensors", {{a, 0.7f}, {b, -0.5f}});
    const Out want = run(*open_tiny(hand));
    const Out got = run_with(kTiny, {request(la, 0.7f, 0.7f), request(lb, -0.5f, -0.5f)}, lora::ApplyMode::Immediately);
    EXPECT_EQ(got.context, want.context);
    EXPECT_EQ(got.eps, want.eps);

    // te weight 0: the conditioning is the plain model's; the UNet is patched
    const auto unet_only = make_patches(21, false);
    const fs::path hand_u = patch_by_hand(dir / "hand_u.safetensors", {{unet_only, 0.7f}});
    const Out want_u = run(*open_tiny(hand_u));
    const Out base = run(*open_tiny(kTiny));
    const Out got_u = run_with(kTiny, {request(la, 0.0f, 0.7f)}, lora::ApplyMode::Immediately);
    EXPECT_EQ(got_u.context, base.context);
    EXPECT_EQ(got_u.eps, want_u.eps);
}

// Weight 0 is no LoRA at all; set_loras with another set reloads the modules.
TEST_F(LoraApply, WeightZeroIsIdenticalAndSetsSwitch) {
    const auto ps = make_patches(5);
    const fs::path l = write_lora(dir, "z", ps);
    const Out base = run(*open_tiny(kTiny));
    const Out zero = run_with(kTiny, {request(l, 0.0f, 0.0f)}, lora::ApplyMode::Auto);
    EXPECT_EQ(zero.context, base.context);
    EXPECT_EQ(zero.eps, base.eps);

    // one family: no LoRA, then the LoRA, then none again (modules reload each time)
    auto fam = open_tiny(kTiny);
    const Out a0 = run(*fam);
    models::set_loras(*fam, lora::open_loras({request(l, 1.0f, 1.0f)}), lora::ApplyMode::Immediately);
    const Out a1 = run(*fam);
    models::set_loras(*fam, {}, lora::ApplyMode::Immediately);
    const Out a2 = run(*fam);
    const Out want = run(*open_tiny(patch_by_hand(dir / "hand_z.safetensors", {{ps, 1.0f}})));
    EXPECT_EQ(a0.eps, base.eps);
    EXPECT_EQ(a1.eps, want.eps);
    EXPECT_EQ(a1.context, want.context);
    EXPECT_EQ(a2.eps, base.eps);
}

// At run time (s B (A x) beside each patched matmul): the merged result within F32 rounding, with
// F32 weights (--type f32) so that merging rounds nothing; and on F16 weights within F16 rounding.
TEST_F(LoraApply, RuntimeEqualsMergedWithinRounding) {
    const auto a = make_patches(61), b = make_patches(81);
    const fs::path la = write_lora(dir, "a", a), lb = write_lora(dir, "b", b);
    const std::vector<lora::LoraRequest> reqs{request(la, 1.0f, 1.0f), request(lb, -0.6f, 0.6f)};
    const Out merged = run_with(kTiny, reqs, lora::ApplyMode::Immediately, "f32");
    const Out rt = run_with(kTiny, reqs, lora::ApplyMode::AtRuntime, "f32");
    const Out base = run_with(kTiny, {}, lora::ApplyMode::AtRuntime, "f32");
    const double dc = max_rel(rt.context, merged.context), de = max_rel(rt.eps, merged.eps);
    const double lc = max_rel(base.context, merged.context), le = max_rel(base.eps, merged.eps);
    std::cout << "[lora runtime vs merged, f32 weights] context " << dc << " eps " << de << " (LoRA effect: " << lc << ", " << le << ")\n";
    EXPECT_LT(dc, 1e-5);
    EXPECT_LT(de, 1e-5);
    EXPECT_GT(lc, 1e-3);  // the LoRA changes both by far more than the tolerance
    EXPECT_GT(le, 1e-3);

    const Out merged16 = run_with(kTiny, reqs, lora::ApplyMode::Immediately);
    const Out rt16 = run_with(kTiny, reqs, lora::ApplyMode::AtRuntime);
    std::cout << "[lora runtime vs merged, f16 weights] context " << max_rel(rt16.context, merged16.context) << " eps "
              << max_rel(rt16.eps, merged16.eps) << "\n";
    EXPECT_LT(max_rel(rt16.context, merged.context), 1e-2);
    EXPECT_LT(max_rel(rt16.eps, merged.eps), 1e-2);
}

// A quantised model (--type q8_0): auto applies the LoRA at run time on the Q8_0 weights (the
// convolution kernels, F16, are merged); the result is the F32 merged one within Q8_0's error,
// much closer to it than the unpatched Q8_0 model.
TEST_F(LoraApply, QuantisedModelTakesARuntimeLora) {
    const auto ps = make_patches(91);
    const fs::path l = write_lora(dir, "q", ps);
    const std::vector<lora::LoraRequest> reqs{request(l, 1.0f, 1.0f)};
    const Out ref = run_with(kTiny, reqs, lora::ApplyMode::Immediately, "f32");
    const Out q = run_with(kTiny, reqs, lora::ApplyMode::Auto, "q8_0");
    const Out q0 = run_with(kTiny, {}, lora::ApplyMode::Auto, "q8_0");
    for (float v : q.eps) ASSERT_TRUE(std::isfinite(v));
    const double with = max_rel(q.eps, ref.eps), without = max_rel(q0.eps, ref.eps);
    std::cout << "[lora q8_0 at run time] eps vs f32 merged " << with << " (unpatched q8_0: " << without << ")\n";
    EXPECT_LT(with, 0.05);
    EXPECT_LT(with * 4, without);
    const double cw = max_rel(q.context, ref.context), c0 = max_rel(q0.context, ref.context);
    EXPECT_LT(cw * 4, c0);
}

// A LoRA made for another family is refused before anything loads, naming what it targets.
TEST_F(LoraApply, LoraOfAnotherFamilyIsRefused) {
    std::vector<StTensor> ts;
    ts.push_back(lora_test::ramp("lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", {4, 3072}));
    ts.push_back(lora_test::ramp("lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", {9216, 4}));
    const fs::path l = lora_test::write_safetensors(dir / "flux.safetensors", ts);
    auto fam = open_tiny(kTiny);
    try {
        models::set_loras(*fam, lora::open_loras({request(l, 1.0f, 1.0f)}), lora::ApplyMode::Auto);
        FAIL() << "a FLUX.1 LoRA on SD1.x was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::ModelMismatch);
        EXPECT_NE(std::string(e.what()).find("FLUX.1"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fam->loaded(models::Module::Diffusion));
}

// Textual inversion: "a photo of mytok" with a 2-vector embedding named mytok gives the
// conditioning of "a photo of cat dog" on the model whose token embedding rows of "cat" and "dog"
// were replaced by the two vectors by hand (vectors chosen F16-exact: bit for bit).
TEST_F(LoraApply, TextualInversionEqualsHandEditedTokenEmbedding) {
    const auto& tok = text::ClipTokenizer::builtin();
    const auto cat = tok.encode("cat"), dog = tok.encode("dog");
    ASSERT_EQ(cat.size(), 1u);
    ASSERT_EQ(dog.size(), 1u);
    const int64_t width = 64;  // sd_tiny's CLIP width
    std::vector<float> vec = randn((size_t)(2 * width), 3, 0.5f);
    for (float& v : vec) v = ggml_fp16_to_fp32(ggml_fp32_to_fp16(v));
    const fs::path emb_dir = dir / "embeddings";
    fs::create_directories(emb_dir);
    lora_test::write_safetensors(emb_dir / "mytok.safetensors", {StTensor{"emb_params", {2, width}, vec, false}});

    // the hand-edited model: token_embedding rows cat, dog <- the vectors
    const fs::path hand = dir / "hand_ti.safetensors";
    fs::copy_file(kTiny, hand, fs::copy_options::overwrite_existing);
    {
        const io::WeightIndex idx = io::WeightIndex::open(kTiny);
        const io::TensorInfo* t = idx.find("cond_stage_model.transformer.text_model.embeddings.token_embedding.weight");
        ASSERT_NE(t, nullptr);
        ASSERT_EQ(t->shape.at(1), width);
        ASSERT_GT(t->shape.at(0), std::max(cat[0], dog[0]));
        std::fstream f(hand, std::ios::in | std::ios::out | std::ios::binary);
        for (int i = 0; i < 2; ++i) {
            const int32_t id = i == 0 ? cat[0] : dog[0];
            std::vector<ggml_fp16_t> h((size_t)width);
            for (int64_t j = 0; j < width; ++j) h[(size_t)j] = ggml_fp32_to_fp16(vec[(size_t)(i * width + j)]);
            f.seekp((std::streamoff)(t->offset + (uint64_t)id * (uint64_t)width * 2));
            f.write(reinterpret_cast<const char*>(h.data()), (std::streamsize)(width * 2));
        }
    }
    const models::Conditioning want = open_tiny(hand)->encode_prompt("a photo of cat dog", 0);

    auto fam = open_tiny(kTiny);
    auto* sd = dynamic_cast<models::sd::StableDiffusion*>(fam.get());
    ASSERT_NE(sd, nullptr);
    const models::Conditioning plain = fam->encode_prompt("a photo of mytok", 0);
    sd->set_embeddings({text::read_embedding(emb_dir / "mytok.safetensors")});
    const models::Conditioning got = fam->encode_prompt("a photo of mytok", 0);
    EXPECT_NE(plain.context, want.context);
    EXPECT_EQ(got.context, want.context);
}
