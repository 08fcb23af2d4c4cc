// Z-Image from GGUF files as they are found in the wild, against diffusers' ZImagePipeline images
// of the tiny pipeline (tests/data/reference/zimage_tiny):
//   * the transformer in the original (Tongyi / ComfyUI) layout as a GGUF, the way city96's
//     ComfyUI-GGUF tools/convert.py writes one (general.architecture "lumina2", as the published
//     Z-Image-Turbo GGUFs: 1-D tensors and tensors of <= 1024 values in F32, the rest F16, or Q8_0
//     where the row length allows it);
//   * the Qwen3 text encoder as a llama.cpp-style GGUF (convert_hf_to_gguf.py names: token_embd,
//     blk.N.attn_q ..., output_norm; qwen3.* hyper-parameters; the tokenizer in the metadata:
//     tokenizer.ggml.model "gpt2", pre "qwen2", tokens with [PADn] fillers up to the embedding
//     rows, token_type, merges, special ids), so the tokenizer comes from the GGUF;
//   * the VAE as the ae.safetensors-layout file (what users pass with --vae).
// Both GGUFs are written here with ggml's gguf API from the reference safetensors.
// Pass criteria: F16 GGUFs: max |pixel - diffusers| <= 2 (of 255) on every case (measured: max 1,
// mean <= 0.015); Q8_0 GGUFs (transformer matrices and pad tokens, text-encoder matrices whose rows
// allow it): mean |diff| <= 1.0 and max <= 12 (Q8_0 rounds every weight to 8 bits per block of 32:
// measured mean 0.20-0.48, max 2-4; a wrong dequantisation or layout gives mean tens of levels).
#include "core/error.h"
#include "io/weight_index.h"
#include "models/zimage/z_image.h"
#include "pipeline/image_io.h"
#include "text/qwen_tokenizer.h"

#include <ggml.h>
#include <gguf.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace easel;

namespace {

const fs::path kDir = fs::path(EASEL_TEST_DATA) / "reference" / "zimage_tiny";

nlohmann::json cases_json() {
    std::ifstream f(kDir / "cases.json");
    return nlohmann::json::parse(f);
}

std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string gunzip_file(const fs::path& p) {
    std::string gz = read_file(p);
    z_stream zs{};
    inflateInit2(&zs, 15 + 32);
    zs.next_in = reinterpret_cast<Bytef*>(gz.data());
    zs.avail_in = (uInt)gz.size();
    std::string out;
    std::vector<char> buf(1 << 16);
    int rc = Z_OK;
    while (rc == Z_OK) {
        zs.next_out = reinterpret_cast<Bytef*>(buf.data());
        zs.avail_out = (uInt)buf.size();
        rc = inflate(&zs, Z_NO_FLUSH);
        out.append(buf.data(), buf.size() - zs.avail_out);
    }
    inflateEnd(&zs);
    return out;
}

/// One tensor to write: its GGUF name, storage type and float values in stored (PyTorch
/// row-major) order; ne in ggml order.
struct OutTensor {
    std::string name;
    ggml_type type;
    std::array<int64_t, 4> ne;
    int n_dims;
    std::vector<float> values;
};

/// Writes tensors (converted to their types) plus the metadata `meta` sets into a GGUF file.
void write_gguf(const fs::path& path, const std::vector<OutTensor>& ts, const std::function<void(gguf_context*)>& meta) {
    size_t bytes = 1 << 20;
    for (auto& t : ts) bytes += t.values.size() * 4 + 1024;
    ggml_init_params ip{bytes, nullptr, false};
    ggml_context* ctx = ggml_init(ip);
    gguf_context* g = gguf_init_empty();
    meta(g);
    for (auto& t : ts) {
        ggml_tensor* x = ggml_new_tensor(ctx, t.type, t.n_dims, t.ne.data());
        ggml_set_name(x, t.name.c_str());
        const int64_t rows = (int64_t)t.values.size() / t.ne[0];
        if (t.type == GGML_TYPE_F32) std::memcpy(x->data, t.values.data(), t.values.size() * 4);
        else if (t.type == GGML_TYPE_F16) ggml_fp32_to_fp16_row(t.values.data(), (ggml_fp16_t*)x->data, (int64_t)t.values.size());
        else ggml_quantize_chunk(t.type, t.values.data(), x->data, 0, rows, t.ne[0], nullptr);
        gguf_add_tensor(g, x);
    }
    ASSERT_TRUE(gguf_write_to_file(g, path.string().c_str(), false)) << path;
    gguf_free(g);
    ggml_free(ctx);
}

OutTensor from_index(const io::WeightIndex& idx, const io::TensorInfo& t, const std::string& name, ggml_type type) {
    OutTensor o{name, type, t.ggml_ne(), std::max<int>(1, (int)t.shape.size()), idx.read_f32(t)};
    return o;
}

/// city96 convert.py's type choice: 1-D tensors and tensors of <= 1024 values stay F32; the rest
/// F16, or `quant` when the row length is a multiple of its block (32).
/// Exception: the pad tokens ([1, dim]) are quantised too when `quant` is set: in the real model
/// (dim 3840) they are larger than the threshold, and llama.cpp's quantize tool quantises them.
ggml_type comfy_type(const io::TensorInfo& t, ggml_type quant) {
    const bool pad = t.name.find("pad_token") != std::string::npos;
    if (pad && quant != GGML_TYPE_F16 && t.ggml_ne()[0] % 32 == 0) return quant;
    if (t.shape.size() <= 1 || t.numel() <= 1024) return GGML_TYPE_F32;
    if (quant != GGML_TYPE_F16 && t.ggml_ne()[0] % 32 == 0) return quant;
    return GGML_TYPE_F16;
}

/// The original-layout transformer as a ComfyUI-GGUF-style file.
void write_dit_gguf(const fs::path& out, ggml_type quant) {
    auto idx = io::WeightIndex::open(kDir / "zimage_tiny_transformer.safetensors");
    std::vector<OutTensor> ts;
    for (auto& t : idx.tensors()) ts.push_back(from_index(idx, t, t.name, comfy_type(t, quant)));
    write_gguf(out, ts, [&](gguf_context* g) {
        gguf_set_val_str(g, "general.architecture", "lumina2");
        gguf_set_val_u32(g, "general.quantization_version", 2);
        gguf_set_val_u32(g, "general.file_type", quant == GGML_TYPE_Q8_0 ? 7 : 1);
    });
}

/// llama.cpp's Qwen3 tensor name for a transformers Qwen3ForCausalLM name ("" if none).
std::string llama_name(const std::string& hf) {
    if (hf == "model.embed_tokens.weight") return "token_embd.weight";
    if (hf == "model.norm.weight") return "output_norm.weight";
    if (hf == "lm_head.weight") return "output.weight";
    static const std::pair<const char*, const char*> table[] = {
        {"input_layernorm.weight", "attn_norm.weight"},   {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},     {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},     {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},      {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    const std::string p = "model.layers.";
    if (hf.rfind(p, 0) != 0) return {};
    const size_t dot = hf.find('.', p.size());
    const std::string n = hf.substr(p.size(), dot - p.size()), rest = hf.substr(dot + 1);
    for (auto& [from, to] : table)
        if (rest == from) return "blk." + n + "." + to;
    return {};
}

/// The GGUF tokenizer arrays as llama.cpp's converter writes them for Qwen (vocab padded with
/// [PADn] up to `vocab_rows`; types 1 normal, 3 control, 4 user-defined, 5 unused).
struct GgufVocab {
    std::vector<std::string> tokens, merges;
    std::vector<int32_t> types;
};

GgufVocab qwen_vocab(int64_t vocab_rows) {
    const auto j = nlohmann::json::parse(gunzip_file(fs::path(EASEL_SOURCE_DIR) / "models/tokenizers/qwen3/tokenizer.json.gz"));
    GgufVocab v;
    v.tokens.resize((size_t)vocab_rows);
    v.types.assign((size_t)vocab_rows, 5);
    for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
        v.tokens[it.value().get<size_t>()] = it.key();
        v.types[it.value().get<size_t>()] = 1;
    }
    for (auto& a : j["added_tokens"]) {
        v.tokens[a["id"].get<size_t>()] = a["content"].get<std::string>();
        v.types[a["id"].get<size_t>()] = a["special"].get<bool>() ? 3 : 4;
    }
    for (size_t i = 0; i < v.tokens.size(); ++i)
        if (v.tokens[i].empty()) v.tokens[i] = std::string("[PAD") + std::to_string(i) + "]";
    for (auto& m : j["model"]["merges"])
        v.merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
    return v;
}

/// The tiny pipeline's Qwen3 text encoder as a llama.cpp GGUF: 1-D norms F32, matrices F16 or
/// `quant` where the row length is a multiple of 32 (as llama.cpp's converter falls back);
/// `edit_vocab` may change the tokenizer written into the metadata.
void write_te_gguf(const fs::path& out, ggml_type quant, const std::function<void(GgufVocab&)>& edit_vocab = {}) {
    auto idx = io::WeightIndex::open(kDir / "diffusers" / "text_encoder" / "model.safetensors");
    std::vector<OutTensor> ts;
    int64_t vocab_rows = 0, hidden = 0, ff = 0, layers = 0, q_rows = 0, kv_rows = 0, head_dim = 0;
    for (auto& t : idx.tensors()) {
        const std::string n = llama_name(t.name);
        ASSERT_FALSE(n.empty()) << "unexpected text-encoder tensor " << t.name;
        ggml_type type = t.shape.size() <= 1 ? GGML_TYPE_F32 : (quant != GGML_TYPE_F16 && t.ggml_ne()[0] % 32 == 0 ? quant : GGML_TYPE_F16);
        ts.push_back(from_index(idx, t, n, type));
        if (n == "token_embd.weight") vocab_rows = t.shape[0], hidden = t.shape[1];
        if (n == "blk.0.ffn_gate.weight") ff = t.shape[0];
        if (n == "blk.0.attn_q.weight") q_rows = t.shape[0];
        if (n == "blk.0.attn_k.weight") kv_rows = t.shape[0];
        if (n == "blk.0.attn_q_norm.weight") head_dim = t.shape[0];
        if (n.rfind("blk.", 0) == 0) layers = std::max<int64_t>(layers, std::atoll(n.c_str() + 4) + 1);
    }
    ASSERT_GT(head_dim, 0);
    GgufVocab v = qwen_vocab(vocab_rows);
    if (edit_vocab) edit_vocab(v);
    std::vector<const char*> tp, mp;
    for (auto& s : v.tokens) tp.push_back(s.c_str());
    for (auto& s : v.merges) mp.push_back(s.c_str());
    const auto tcfg = nlohmann::json::parse(read_file(kDir / "diffusers" / "tokenizer" / "tokenizer_config.json"));
    const std::string chat = fs::exists(kDir / "diffusers" / "tokenizer" / "chat_template.jinja")
                                 ? read_file(kDir / "diffusers" / "tokenizer" / "chat_template.jinja")
                                 : tcfg.value("chat_template", std::string());
    write_gguf(out, ts, [&](gguf_context* g) {
        gguf_set_val_str(g, "general.architecture", "qwen3");
        gguf_set_val_str(g, "general.name", "tiny Qwen3 (easel test)");
        gguf_set_val_u32(g, "general.file_type", quant == GGML_TYPE_Q8_0 ? 7 : 1);
        gguf_set_val_u32(g, "general.quantization_version", 2);
        gguf_set_val_u32(g, "qwen3.block_count", (uint32_t)layers);
        gguf_set_val_u32(g, "qwen3.context_length", 40960);
        gguf_set_val_u32(g, "qwen3.embedding_length", (uint32_t)hidden);
        gguf_set_val_u32(g, "qwen3.feed_forward_length", (uint32_t)ff);
        gguf_set_val_u32(g, "qwen3.attention.head_count", (uint32_t)(q_rows / head_dim));
        gguf_set_val_u32(g, "qwen3.attention.head_count_kv", (uint32_t)(kv_rows / head_dim));
        gguf_set_val_u32(g, "qwen3.attention.key_length", (uint32_t)head_dim);
        gguf_set_val_u32(g, "qwen3.attention.value_length", (uint32_t)head_dim);
        gguf_set_val_f32(g, "qwen3.rope.freq_base", 1000000.0f);
        gguf_set_val_f32(g, "qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
        gguf_set_val_str(g, "tokenizer.ggml.model", "gpt2");
        gguf_set_val_str(g, "tokenizer.ggml.pre", "qwen2");
        gguf_set_arr_str(g, "tokenizer.ggml.tokens", tp.data(), tp.size());
        gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.types.data(), v.types.size());
        gguf_set_arr_str(g, "tokenizer.ggml.merges", mp.data(), mp.size());
        gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", 151645);
        gguf_set_val_u32(g, "tokenizer.ggml.padding_token_id", 151643);
        gguf_set_val_u32(g, "tokenizer.ggml.bos_token_id", 151643);
        gguf_set_val_bool(g, "tokenizer.ggml.add_bos_token", false);
        if (!chat.empty()) gguf_set_val_str(g, "tokenizer.chat_template", chat.c_str());
    });
}

std::string quote(const std::string& s) {
    std::string r = "'";
    for (char c : s) {
        if (c == '\'') r += "'\\''";
        else r += c;
    }
    return r + "'";
}

struct PixelDiff {
    int max = 256;
    double mean = 1e9;
};

PixelDiff pixel_diff(const pipeline::Image& a, const pipeline::Image& b) {
    PixelDiff d;
    if (a.pixels.size() != b.pixels.size() || a.pixels.empty()) return d;
    d.max = 0;
    double s = 0;
    for (size_t i = 0; i < a.pixels.size(); ++i) {
        const int x = std::abs((int)a.pixels[i] - (int)b.pixels[i]);
        d.max = std::max(d.max, x);
        s += x;
    }
    d.mean = s / (double)a.pixels.size();
    return d;
}

/// `easel generate --rng cpu` on case `c` with the given files; returns the PNG.
pipeline::Image generate(const nlohmann::json& c, const fs::path& dit, const fs::path& te, const std::string& tag) {
    const fs::path out = fs::path(testing::TempDir()) / ("easel_zimage_gguf_" + tag + "_" + c["name"].get<std::string>() + "_" +
                                                         std::to_string(getpid()) + ".png");
    std::string cmd = std::string(EASEL_BINARY) + " generate -t 1 --diffusion-model " + quote(dit.string()) + " --llm " +
                      quote(te.string()) + " --vae " + quote((kDir / "zimage_tiny_vae.safetensors").string()) + " -p " +
                      quote(c["prompt"]) + " -n " + quote(c["negative_prompt"]) + std::string(" -W ") + std::to_string(c["width"].get<int>()) +
                      std::string(" -H ") + std::to_string(c["height"].get<int>()) + std::string(" --steps ") + std::to_string(c["steps"].get<int>()) +
                      " --cfg-scale " + c["cfg_scale"].dump() + std::string(" -s ") + std::to_string(c["seed"].get<int64_t>()) +
                      " --sampling-method " + c["sampling_method"].get<std::string>() + " --scheduler " +
                      c["scheduler"].get<std::string>() + " --rng " + c["rng"].get<std::string>() + " --no-cache -o " +
                      quote(out.string()) + " > /dev/null 2>&1";
    fs::remove(out);
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto img = pipeline::load_image(out, 3);
    fs::remove(out);
    return img;
}

/// Temporary files of one test, removed at the end.
struct TempFiles {
    std::vector<fs::path> paths;
    fs::path add(const std::string& stem) {
        paths.push_back(fs::path(testing::TempDir()) / (stem + std::string("_") + std::to_string(getpid()) + ".gguf"));
        return paths.back();
    }
    ~TempFiles() {
        for (auto& p : paths) fs::remove(p);
    }
};

void run_all_cases(ggml_type quant, const char* tag, bool exact) {
    TempFiles tmp;
    const fs::path dit = tmp.add(std::string("zimage_dit_") + tag), te = tmp.add(std::string("qwen3_te_") + tag);
    write_dit_gguf(dit, quant);
    write_te_gguf(te, quant);
    {
        auto di = io::WeightIndex::open(dit);
        int quantised = 0, f32 = 0, f16 = 0;
        for (auto& t : di.tensors()) {
            quantised += t.gtype == quant && quant != GGML_TYPE_F16;
            f32 += t.gtype == GGML_TYPE_F32;
            f16 += t.gtype == GGML_TYPE_F16;
        }
        EXPECT_GT(f32, 10) << "small tensors stay F32 as in ComfyUI-GGUF files";
        if (quant == GGML_TYPE_F16) { EXPECT_GT(f16, 10); }
        else EXPECT_GT(quantised, 10) << "no transformer weight was stored as " << ggml_type_name(quant);
    }
    const auto cj = cases_json();  // (a named copy: the range must outlive the loop)
    for (const auto& c : cj["cases"]) {
        auto got = generate(c, dit, te, tag);
        auto want = pipeline::load_image(kDir / c["png"].get<std::string>(), 3);
        ASSERT_EQ(got.width, want.width) << c["name"];
        ASSERT_EQ(got.height, want.height) << c["name"];
        const PixelDiff d = pixel_diff(got, want);
        std::printf("[zimage gguf %s] %s: max pixel diff %d/255, mean %.3f\n", tag, c["name"].get<std::string>().c_str(), d.max, d.mean);
        if (exact) {
            EXPECT_LE(d.max, 2) << c["name"];
        } else {
            EXPECT_LE(d.mean, 1.0) << c["name"];
            EXPECT_LE(d.max, 12) << c["name"];
        }
    }
}

}  // namespace

// F16 GGUFs (transformer ComfyUI-style, text encoder llama.cpp-style with its tokenizer):
// every case within 2/255 of diffusers.
TEST(ZImageTinyGguf, F16GgufsMatchDiffusersWithin2Of255) { run_all_cases(GGML_TYPE_F16, "f16", true); }

// Q8_0 GGUFs: close to diffusers (bound in the file comment).
TEST(ZImageTinyGguf, Q8GgufsStayClose) { run_all_cases(GGML_TYPE_Q8_0, "q8_0", false); }

// The tokenizer in the GGUF metadata gives the same ids as tokenizer.json on llama.cpp's Qwen2
// tokenizer test strings (/work/shared/models/qwen3-tokenizer, copied to tests/data/text) and
// on the chat-templated prompts of the cases, and it is the one the family uses: a GGUF whose
// vocabulary swaps two tokens changes the family's prompt ids accordingly.
TEST(ZImageTinyGguf, TokenizerComesFromTheGgufMetadata) {
    TempFiles tmp;
    const fs::path te = tmp.add("qwen3_te_tok");
    write_te_gguf(te, GGML_TYPE_F16);
    auto ti = io::WeightIndex::open(te);
    ASSERT_TRUE(text::QwenTokenizer::gguf_has_tokenizer(ti.metadata()));
    const auto from_gguf = text::QwenTokenizer::from_gguf_metadata(ti.metadata());
    const auto from_json = text::QwenTokenizer::from_file(fs::path(EASEL_SOURCE_DIR) / "models/tokenizers/qwen3/tokenizer.json.gz");
    EXPECT_EQ(from_gguf.vocab_size(), 151936u);  // padded to the embedding rows with [PADn]
    const std::string inp = read_file(fs::path(EASEL_TEST_DATA) / "text" / "llamacpp-ggml-vocab-qwen2.gguf.inp");
    const std::string sep = "\n__ggml_vocab_test__\n";
    int n = 0;
    for (size_t pos = 0;;) {
        const size_t e = inp.find(sep, pos);
        if (e == std::string::npos) break;
        const std::string s = inp.substr(pos, e - pos);
        EXPECT_EQ(from_gguf.encode(s), from_json.encode(s)) << s;
        pos = e + sep.size();
        ++n;
    }
    EXPECT_GE(n, 40);

    models::ModelFiles f;
    f.diffusion_model = (kDir / "zimage_tiny_transformer.safetensors").string();
    f.vae = (kDir / "zimage_tiny_vae.safetensors").string();
    f.llm = te.string();
    auto fam = models::zimage::ZImage::open(f, {});
    const auto cj = cases_json();  // (a named copy: the range must outlive the loop)
    for (const auto& c : cj["cases"]) {
        EXPECT_EQ(fam->prompt_ids(c["prompt"].get<std::string>()), c["cond_ids"].get<std::vector<int32_t>>()) << c["name"];
        EXPECT_EQ(fam->prompt_ids(c["prompt"].get<std::string>()),
                  from_json.encode(text::QwenTokenizer::chat_prompt(c["prompt"].get<std::string>(), false)));
    }
    EXPECT_FALSE(fam->loaded(models::Module::Te));  // the tokenizer needs only the header

    // swap "Ġcat" and "Ġdog" in the GGUF vocabulary: the family must follow the GGUF
    const fs::path swapped = tmp.add("qwen3_te_swapped");
    const int32_t cat = *from_json.token_id("\xC4\xA0" "cat"), dog = *from_json.token_id("\xC4\xA0" "dog");
    write_te_gguf(swapped, GGML_TYPE_F16, [&](GgufVocab& v) { std::swap(v.tokens[(size_t)cat], v.tokens[(size_t)dog]); });
    f.llm = swapped.string();
    auto fam2 = models::zimage::ZImage::open(f, {});
    auto ids = fam2->prompt_ids("a photo of a cat");
    auto ref = from_json.encode(text::QwenTokenizer::chat_prompt("a photo of a cat", false));
    ASSERT_EQ(ids.size(), ref.size());
    int swapped_seen = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ref[i] == cat) {
            EXPECT_EQ(ids[i], dog);
            ++swapped_seen;
        } else {
            EXPECT_EQ(ids[i], ref[i]);
        }
    }
    EXPECT_EQ(swapped_seen, 1);
}

// A llama.cpp-style Qwen3 GGUF of another hidden size is refused before any weight is loaded,
// naming the hidden size the transformer expects.
TEST(ZImageTinyGguf, RefusesQwen3GgufOfAnotherWidth) {
    TempFiles tmp;
    const fs::path te = tmp.add("qwen3_h8");
    std::vector<OutTensor> ts;
    auto mat = [&](const std::string& n, int64_t rows, int64_t cols) {
        ts.push_back({n, GGML_TYPE_F32, {cols, rows, 1, 1}, 2, std::vector<float>((size_t)(rows * cols), 0.0f)});
    };
    auto vec = [&](const std::string& n, int64_t len) { ts.push_back({n, GGML_TYPE_F32, {len, 1, 1, 1}, 1, std::vector<float>((size_t)len, 1.0f)}); };
    mat("token_embd.weight", 64, 8);
    vec("output_norm.weight", 8);
    for (int l = 0; l < 2; ++l) {
        const std::string p = std::string("blk.") + std::to_string(l) + ".";
        vec(p + "attn_norm.weight", 8);
        vec(p + "ffn_norm.weight", 8);
        mat(p + "attn_q.weight", 16, 8);
        mat(p + "attn_k.weight", 8, 8);
        mat(p + "attn_v.weight", 8, 8);
        mat(p + "attn_output.weight", 8, 16);
        vec(p + "attn_q_norm.weight", 8);
        vec(p + "attn_k_norm.weight", 8);
        mat(p + "ffn_gate.weight", 32, 8);
        mat(p + "ffn_up.weight", 32, 8);
        mat(p + "ffn_down.weight", 8, 32);
    }
    write_gguf(te, ts, [](gguf_context* g) { gguf_set_val_str(g, "general.architecture", "qwen3"); });
    models::ModelFiles f;
    f.diffusion_model = (kDir / "zimage_tiny_transformer.safetensors").string();
    f.vae = (kDir / "zimage_tiny_vae.safetensors").string();
    f.llm = te.string();
    auto fam = models::zimage::ZImage::open(f, {});
    try {
        fam->load(models::Module::Te);
        ADD_FAILURE() << "a hidden-8 Qwen3 GGUF was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::ModelMismatch);
        const std::string m = e.what();
        EXPECT_NE(m.find("hidden size 8"), std::string::npos) << m;
        EXPECT_NE(m.find("hidden size 12"), std::string::npos) << m;
    }
    EXPECT_FALSE(fam->loaded(models::Module::Te));
}
