// T5 SentencePiece unigram tokenizer against known-right ids:
//  * tests/data/text/t5_tokenizer_ids.json: 43 strings (ASCII, punctuation, digits, accents,
//    full-width and other NFKC-normalised characters, whitespace runs, empty, long words, CJK,
//    emoji -> <unk>) whose ids tools/reference/t5_tokenizer_ids.py computed twice, with the
//    SentencePiece Python library and with an independent plain-Python charsmap + Viterbi, and
//    which agreed;
//  * published examples ("Hello world" -> [8774, 296, 1], the HF T5 docs);
//  * hand-checked normalisation and piece lookups.
#include "core/error.h"
#include "text/t5_tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

using easel::text::T5Tokenizer;

namespace {
const T5Tokenizer& tok() { return T5Tokenizer::builtin(); }
using Ids = std::vector<int32_t>;
}  // namespace

TEST(T5Tokenizer, VocabularyLayout) {
    EXPECT_EQ(tok().vocab_size(), 32100u);
    EXPECT_EQ(tok().piece(0), "<pad>");
    EXPECT_EQ(tok().piece(1), "</s>");
    EXPECT_EQ(tok().piece(2), "<unk>");
    EXPECT_EQ(tok().piece(3), "\xE2\x96\x81");  // "▁"
    EXPECT_FLOAT_EQ(tok().score(3), -2.0122928619384766f);
    EXPECT_EQ(*tok().piece_id("\xE2\x96\x81Hello"), 8774);
    EXPECT_EQ(*tok().piece_id("\xE2\x96\x81world"), 296);
    EXPECT_EQ(tok().piece(32099), "<extra_id_0>");
    EXPECT_FALSE(tok().piece_id("not-a-piece").has_value());
    EXPECT_THROW(tok().piece(32100), easel::Error);
    EXPECT_THROW(tok().piece(-1), easel::Error);
}

TEST(T5Tokenizer, KnownExamples) {
    // transformers' T5 docs: tokenizer("Hello world").input_ids == [8774, 296, 1]
    EXPECT_EQ(tok().encode_with_eos("Hello world"), (Ids{8774, 296, 1}));
    EXPECT_EQ(tok().encode("Hello world"), (Ids{8774, 296}));
    // the empty prompt of FLUX/SD3 negative conditioning is just </s>
    EXPECT_EQ(tok().encode_with_eos(""), (Ids{1}));
    // "a" is not a word piece: "▁" (3) then "a" (9); hand-checked in the vocabulary
    EXPECT_EQ(tok().encode("a"), (Ids{3, 9}));
    EXPECT_EQ(tok().piece(9), "a");
    EXPECT_FALSE(tok().piece_id("\xE2\x96\x81" "a").has_value());
}

TEST(T5Tokenizer, ReferenceIds) {
    std::ifstream f(std::string(EASEL_TEST_DATA) + "/text/t5_tokenizer_ids.json");
    ASSERT_TRUE(f.good());
    const auto j = nlohmann::json::parse(f);
    int matched = 0, total = 0;
    for (const auto& c : j["cases"]) {
        const std::string text = c["text"];
        const Ids want = c["ids"].get<Ids>();
        const Ids got = tok().encode_with_eos(text);
        ++total;
        if (got == want) ++matched;
        EXPECT_EQ(got, want) << "text: " << text;
    }
    std::cout << "[t5 tokenizer] " << matched << "/" << total << " reference cases match\n";
    EXPECT_GE(total, 40);
}

TEST(T5Tokenizer, NormalizerCharsmap) {
    // nmt_nfkc rules from the precompiled charsmap: full-width -> ASCII, U+3000 -> space,
    // ligatures split, circled digits -> digits; whitespace runs collapse; "▁" marks words.
    const std::string M = "\xE2\x96\x81";
    EXPECT_EQ(tok().normalize("\xEF\xBD\x88\xEF\xBD\x85\xEF\xBD\x8C\xEF\xBD\x8C\xEF\xBD\x8F\xE3\x80\x80World"),  // ｈｅｌｌｏ　World
              M + "hello" + M + "World");
    EXPECT_EQ(tok().normalize("\xEF\xAC\x81ne"), M + "fine");    // ﬁ ligature
    EXPECT_EQ(tok().normalize("\xE2\x91\xA0\xE2\x91\xA1"), M + "12");  // ①②
    EXPECT_EQ(tok().normalize("  a \t\n b  "), M + "a" + M + "b");
    EXPECT_EQ(tok().normalize(""), "");
    // so the full-width prompt has the ids of the ASCII one
    EXPECT_EQ(tok().encode("\xEF\xBD\x88\xEF\xBD\x85\xEF\xBD\x8C\xEF\xBD\x8C\xEF\xBD\x8F"), tok().encode("hello"));
    EXPECT_EQ(tok().encode("hello"), (Ids{21820}));
    EXPECT_EQ(tok().piece(21820), M + "hello");
}

TEST(T5Tokenizer, UnknownCharactersFuse) {
    // CJK characters are not in the T5 vocabulary: "▁" then one <unk> for the whole run
    EXPECT_EQ(tok().encode("\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF"), (Ids{3, 2}));  // こんにちは
    EXPECT_EQ(tok().decode(Ids{8774, 2, 1}), "Hello \xE2\x81\x87 ");
}

TEST(T5Tokenizer, PaddedWindowAndMask) {
    Ids mask;
    const Ids w = tok().encode_padded("Hello world", 8, &mask);
    EXPECT_EQ(w, (Ids{8774, 296, 1, 0, 0, 0, 0, 0}));
    EXPECT_EQ(mask, (Ids{1, 1, 1, 0, 0, 0, 0, 0}));
    // truncation keeps length-1 tokens then </s> (HF truncation=True, max_length)
    const Ids t = tok().encode_padded("Hello world Hello world Hello world", 4, &mask);
    EXPECT_EQ(t, (Ids{8774, 296, 8774, 1}));
    EXPECT_EQ(mask, (Ids{1, 1, 1, 1}));
    EXPECT_EQ(tok().encode_padded("", 3), (Ids{1, 0, 0}));
    EXPECT_THROW(tok().encode_padded("x", 0), easel::Error);
}

TEST(T5Tokenizer, DecodeRoundTrip) {
    const std::string s = "A photo of a cat, 42 cats! Caf\xC3\xA9 au lait.";  // é is a piece (ï would be <unk>)
    EXPECT_EQ(tok().decode(tok().encode_with_eos(s)), s);
    EXPECT_THROW(tok().decode(Ids{40000}), easel::Error);
}

TEST(T5Tokenizer, FromFileMatchesBuiltin) {
    const auto t = T5Tokenizer::from_file(std::string(EASEL_SOURCE_DIR) + "/models/tokenizers/t5/tokenizer.json.gz");
    EXPECT_EQ(t.vocab_size(), 32100u);
    EXPECT_EQ(t.encode("A majestic lion, cinematic lighting"), tok().encode("A majestic lion, cinematic lighting"));
}

TEST(T5Tokenizer, BadInput) {
    auto kind = [](auto&& f) {
        try {
            f();
        } catch (const easel::Error& e) {
            return e.kind();
        }
        return easel::ErrorKind::Internal;
    };
    using easel::ErrorKind;
    EXPECT_EQ(kind([] { T5Tokenizer::from_json_text("not json"); }), ErrorKind::InvalidInput);
    EXPECT_EQ(kind([] { T5Tokenizer::from_json_text("{}"); }), ErrorKind::InvalidInput);
    EXPECT_EQ(kind([] { T5Tokenizer::from_json_text(R"({"model":{"type":"BPE","vocab":{}}})"); }), ErrorKind::InvalidInput);
    EXPECT_EQ(kind([] { T5Tokenizer::from_json_text(R"({"model":{"vocab":[["a", "x"]]}})"); }), ErrorKind::InvalidInput);
    EXPECT_EQ(kind([] { T5Tokenizer::from_json_text(R"({"model":{"unk_id":5,"vocab":[["<unk>",0.0],["a",-1.0]]}})"); }),
              ErrorKind::InvalidInput);
    EXPECT_EQ(kind([] {
                  T5Tokenizer::from_json_text(
                      R"({"normalizer":{"type":"NFKC"},"model":{"unk_id":0,"vocab":[["<unk>",0.0],["a",-1.0]]}})");
              }),
              ErrorKind::InvalidInput);
    EXPECT_EQ(kind([] {
                  T5Tokenizer::from_json_text(
                      R"({"normalizer":{"type":"Precompiled","precompiled_charsmap":"!!!"},"model":{"unk_id":0,"vocab":[["<unk>",0.0],["a",-1.0]]}})");
              }),
              ErrorKind::InvalidInput);
    EXPECT_EQ(kind([] { T5Tokenizer::from_file("/nonexistent/tokenizer.json"); }), ErrorKind::Io);
    // a minimal valid model without normalizer: unigram over its three pieces
    const auto t = T5Tokenizer::from_json_text(
        R"({"model":{"unk_id":0,"vocab":[["<unk>",0.0],["\u2581ab",-1.0],["\u2581a",-2.0],["b",-2.0],["\u2581",-3.0]]}})");
    EXPECT_EQ(t.encode("ab"), (Ids{1}));        // one piece (-1) beats ▁a + b (-4)
    EXPECT_EQ(t.encode("ab b"), (Ids{1, 4, 3}));  // ▁b is not a piece: ▁ + b
    EXPECT_EQ(t.encode("c"), (Ids{4, 0}));        // ▁ + <unk>
}
