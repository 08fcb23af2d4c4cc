// Textual inversion (text/embeddings.h, prompt_syntax's substitution, CLIP's embed inputs):
// the real A1111 embedding file of tests/data/textual-inversion, the diffusers and SDXL forms,
// a name found in the prompt as A1111 does (by its CLIP tokens, case-insensitive, longest name
// first), the placeholders and their window (an embedding that does not fit starts the next
// one; the comma back-off moves it along), and the tiny CLIP run with a vector in place of a
// token giving what that token gives.
#include "text/embeddings.h"

#include "core/error.h"
#include "io/weight_index.h"
#include "lora_test_support.h"
#include "models/clip/clip_text.h"
#include "runtime/graph_runner.h"
#include "text/prompt_syntax.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace easel;
using namespace easel::text;
namespace fs = std::filesystem;

TEST(TextEmbeddings, ReadsTheRealA1111FileAndTheOtherForms) {
    const fs::path real = lora_test::kData / "textual-inversion" / "test_embedding.safetensors";
    Embedding e = read_embedding(real);
    EXPECT_EQ(e.name, "test_embedding");
    EXPECT_EQ(e.n_vectors, 5);
    EXPECT_EQ(e.width.at(""), 768);
    ASSERT_NE(e.for_width(768), nullptr);
    EXPECT_EQ(e.for_width(768)->size(), 5u * 768u);
    EXPECT_EQ(e.for_width(1024), nullptr);  // not for an SD2.x encoder
    const io::WeightIndex idx = io::WeightIndex::open(real);
    EXPECT_EQ(*e.for_width(768), idx.read_f32(*idx.find("emb_params")));

    const fs::path d = lora_test::temp_dir("ti_forms");
    lora_test::write_safetensors(d / "toy.safetensors", {{"<cat-toy>", {4}, {1, 2, 3, 4}}});  // diffusers learned_embeds
    lora_test::write_safetensors(d / "xl.safetensors", {{"clip_g", {2, 3}, {1, 1, 1, 2, 2, 2}}, {"clip_l", {2, 2}, {5, 5, 6, 6}}});
    lora_test::write_safetensors(d / "s2p.safetensors", {{"string_to_param.*", {1, 2}, {7, 8}}, {"string_to_token.*", {1}, {265}}});
    lora_test::write_safetensors(d / "model.safetensors", {{"a.weight", {2}, {1, 2}}, {"b.weight", {2}, {1, 2}}});
    lora_test::write_safetensors(d / "nan.safetensors", {{"emb_params", {1, 2}, {1, NAN}}});
    Embedding toy = read_embedding(d / "toy.safetensors");
    EXPECT_EQ(toy.n_vectors, 1);
    EXPECT_EQ(*toy.for_width(4), (std::vector<float>{1, 2, 3, 4}));
    Embedding xl = read_embedding(d / "xl.safetensors");
    EXPECT_EQ(xl.n_vectors, 2);
    EXPECT_EQ(*xl.for_width(2), (std::vector<float>{5, 5, 6, 6}));  // clip_l
    EXPECT_EQ(xl.for_width(3)->size(), 6u);                          // clip_g
    EXPECT_EQ(*read_embedding(d / "s2p.safetensors").for_width(2), (std::vector<float>{7, 8}));
    try {
        read_embedding(d / "model.safetensors");
        FAIL();
    } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("is not a textual-inversion embedding: 2 tensors (a.weight, b.weight)"), std::string::npos)
            << err.what();
    }
    EXPECT_THROW(read_embedding(d / "nan.safetensors"), Error);
    auto listed = list_embeddings(d);
    EXPECT_EQ(listed.size(), 5u);
    EXPECT_EQ(listed.at("toy"), d / "toy.safetensors");
    EXPECT_THROW(list_embeddings(d / "missing"), Error);
    fs::remove_all(d);
}

TEST(TextEmbeddings, NamesInThePromptBecomePlaceholders) {
    const ClipTokenizer& tok = ClipTokenizer::builtin();
    EmbeddingLookup lookup;
    lookup.add(tok, 0, "test_embedding", 5);
    lookup.add(tok, 1, "test", 2);  // a shorter name with the same first token: the longer wins
    ChunkOptions opt;
    opt.embeddings = &lookup;
    const auto plain = tokenize_weighted(tok, "a photo of (Test_Embedding:1.2), best");
    const auto with = tokenize_weighted(tok, "a photo of (Test_Embedding:1.2), best", opt);
    const auto name_ids = tok.encode("test_embedding");
    ASSERT_GT(name_ids.size(), 1u);
    const size_t at = 1 + tok.encode("a photo of").size();
    ASSERT_EQ(with.ids.size(), 1u);
    ASSERT_EQ(with.fixes[0].size(), 1u);
    EXPECT_EQ(with.fixes[0][0], (EmbeddingFix{at, 0, 5}));
    for (size_t i = 0; i < 5; ++i) {
        EXPECT_EQ(with.ids[0][at + i], 0);
        EXPECT_FLOAT_EQ(with.weights[0][at + i], 1.2f);
    }
    // after the placeholders the prompt continues as without embeddings, shifted by 5 - name tokens
    EXPECT_EQ(with.ids[0][at + 5], plain.ids[0][at + name_ids.size()]);
    EXPECT_EQ(with.token_count, plain.token_count + 5 - (int)name_ids.size());
    // the shorter name alone
    const auto t2 = tokenize_weighted(tok, "test", opt);
    EXPECT_EQ(t2.fixes[0][0], (EmbeddingFix{1, 1, 2}));

    // an embedding that does not fit in what is left of a window starts the next one
    std::string filler;
    for (int i = 0; i < 73; ++i) filler += "cat ";
    const auto w = tokenize_weighted(tok, filler + "test_embedding", opt);
    ASSERT_EQ(w.ids.size(), 2u);
    EXPECT_TRUE(w.fixes[0].empty());
    EXPECT_EQ(w.fixes[1][0], (EmbeddingFix{1, 0, 5}));
    // the comma back-off moves a placeholder run with its tokens
    std::string f2;
    for (int i = 0; i < 66; ++i) f2 += "cat ";
    const auto c = tokenize_weighted(tok, f2 + ", dog test cat cat cat cat cat cat", opt);
    ASSERT_EQ(c.ids.size(), 2u);
    ASSERT_EQ(c.fixes[1].size(), 1u);
    EXPECT_EQ(c.fixes[1][0], (EmbeddingFix{2, 1, 2}));  // "dog" moved first, then the 2 vectors
    EXPECT_EQ(c.ids[1][1], tok.encode("dog")[0]);

    // the host inputs of the window
    std::vector<float> v5(5 * 3), v2(2 * 3, 9.0f);
    for (size_t i = 0; i < v5.size(); ++i) v5[i] = (float)i;
    const auto in = embedding_inputs(with, 0, {&v5, &v2}, 3);
    EXPECT_EQ(in.keep.size(), 77u);
    EXPECT_EQ(in.keep[at - 1], 1.0f);
    EXPECT_EQ(in.keep[at], 0.0f);
    EXPECT_EQ(in.keep[at + 4], 0.0f);
    EXPECT_EQ(in.keep[at + 5], 1.0f);
    EXPECT_EQ(in.fix[(at + 1) * 3 + 2], 5.0f);
    EXPECT_EQ(in.fix[(at + 5) * 3], 0.0f);
    EXPECT_THROW(embedding_inputs(with, 0, {nullptr}, 3), Error);
}

TEST(TextEmbeddings, ClipTakesTheVectorsInPlaceOfTokens) {
    // The tiny SD1.x CLIP with the row of token 123 given as an embedding vector at position 3
    // (id 0 there) gives what the ids with 123 at position 3 give.
    namespace clip = easel::models::clip;
    const io::WeightIndex idx = io::WeightIndex::open(lora_test::kData / "reference" / "clip_text_sd15_tiny.safetensors");
    const auto keys = clip::find_clip_text_encoders(idx);
    ASSERT_FALSE(keys.empty());
    const clip::ClipConfig cfg = clip::infer_config(idx, keys[0]);
    clip::ClipTextModel model(cfg);
    runtime::GraphRunner run(nullptr, 2);
    nn::LoadOptions opt = clip::default_load_options(keys[0], cfg, idx);
    for (const auto& t : idx.tensors())
        if (t.name.rfind("__", 0) == 0) opt.ignore_unexpected_suffixes.push_back(t.name);  // the fixture's inputs / outputs
    auto params = nn::ParamBuffer::load(model, clip::make_tensor_source(idx, keys[0], cfg), run.buffer_type(), opt);
    const int64_t L = 8, W = cfg.width;
    std::vector<int32_t> ids{0, 5, 6, 123, 7, 999, 999, 999}, holes = ids;
    holes[3] = 0;
    const std::vector<float> table = idx.read_f32(*idx.find(keys[0].prefix + "embeddings.token_embedding.weight"));
    std::vector<float> keep(L, 1.0f), fix(L * W, 0.0f);
    keep[3] = 0.0f;
    std::copy_n(table.begin() + 123 * W, W, fix.begin() + 3 * W);
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), false};
        clip::ClipInputs a, b;
        a.ids = g.input_i32("ids", {L, 1}, ids);
        b.ids = g.input_i32("holes", {L, 1}, holes);
        b.embed_keep = g.input_f32("keep", {1, L, 1}, keep);
        b.embed_fix = g.input_f32("fix", {W, L, 1}, fix);
        return std::vector<ggml_tensor*>{model.encode(c, a).context, model.encode(c, b).context};
    });
    ASSERT_EQ(out[0].data.size(), out[1].data.size());
    float m = 0;
    for (size_t i = 0; i < out[0].data.size(); ++i) m = std::max(m, std::fabs(out[0].data[i] - out[1].data[i]));
    EXPECT_EQ(m, 0.0f);
}
