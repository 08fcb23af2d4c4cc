// CLIP BPE tokenizer: ids checked against Hugging Face CLIPTokenizer (openai/clip-vit-large-patch14).
#include "core/error.h"
#include "text/clip_tokenizer.h"
#include "text/unicode.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

using easel::text::ClipTokenizer;

namespace {
const ClipTokenizer& tok() { return ClipTokenizer::builtin(); }
using Ids = std::vector<int32_t>;
}  // namespace

TEST(ClipTokenizer, VocabularyLayout) {
    // 256 byte symbols + 256 "</w>" variants + 48894 merges + 2 specials.
    EXPECT_EQ(tok().vocab_size(), 49408u);
    EXPECT_EQ(tok().token(0), "!");          // first printable byte
    EXPECT_EQ(tok().token(256), "!</w>");
    EXPECT_EQ(tok().token(49406), "<|startoftext|>");
    EXPECT_EQ(tok().token(49407), "<|endoftext|>");
    // bytes_to_unicode: byte 0x20 (space) is the 33rd non-printable byte -> U+0120 'Ġ', id 188+...;
    // printable bytes come first: 94 + 12 + 82 = 188 of them.
    EXPECT_EQ(tok().token(188), "\xC4\x80");  // byte 0x00 -> U+0100
    EXPECT_EQ(*tok().token_id(",</w>"), 267);  // A1111's comma token
    EXPECT_EQ(*tok().token_id("a</w>"), 320);
    EXPECT_FALSE(tok().token_id("not-a-token").has_value());
}

TEST(ClipTokenizer, KnownSentence) {
    // HF CLIPTokenizer("a photo of a cat")["input_ids"].
    EXPECT_EQ(tok().encode_with_special("a photo of a cat"), (Ids{49406, 320, 1125, 539, 320, 2368, 49407}));
    // Case, surrounding and repeated whitespace do not change the ids.
    EXPECT_EQ(tok().encode("  A   Photo\tOF\n a CAT "), (Ids{320, 1125, 539, 320, 2368}));
    EXPECT_EQ(tok().encode(""), Ids{});
}

TEST(ClipTokenizer, Window) {
    const auto w = tok().encode_window("a photo of a cat", ClipTokenizer::kEos);
    ASSERT_EQ(w.size(), 77u);
    EXPECT_EQ(Ids(w.begin(), w.begin() + 7), (Ids{49406, 320, 1125, 539, 320, 2368, 49407}));
    for (size_t i = 7; i < 77; ++i) EXPECT_EQ(w[i], 49407);
    const auto w2 = tok().encode_window("a photo of a cat", ClipTokenizer::kOpenClipPad);
    EXPECT_EQ(w2[6], 49407);
    for (size_t i = 7; i < 77; ++i) EXPECT_EQ(w2[i], 0);
    // 100 words -> truncated to BOS + 75 + EOS.
    std::string longp;
    for (int i = 0; i < 100; ++i) longp += "cat ";
    const auto w3 = tok().encode_window(longp, 0);
    ASSERT_EQ(w3.size(), 77u);
    EXPECT_EQ(w3[75], 2368);
    EXPECT_EQ(w3[76], 49407);
}

TEST(ClipTokenizer, PreTokenizerPattern) {
    using V = std::vector<std::string>;
    EXPECT_EQ(ClipTokenizer::pre_tokenize("it's 2024, (cat:1.2)!"),
              (V{"it", "'s", "2", "0", "2", "4", ",", "(", "cat", ":", "1", ".", "2", ")!"}));
    EXPECT_EQ(ClipTokenizer::pre_tokenize("we'll've''d"), (V{"we", "'ll", "'ve", "''", "d"}));
    EXPECT_EQ(ClipTokenizer::pre_tokenize("a<|endoftext|>b"), (V{"a", "<|endoftext|>", "b"}));
    // Non-ASCII letters stay in one word; CJK ideographs are letters (Lo); full-width digits are
    // numbers (Nd), one per token; an emoji is neither (So).
    EXPECT_EQ(ClipTokenizer::pre_tokenize("café 你好 \xEF\xBC\x91\xEF\xBC\x92 \xF0\x9F\x98\x80"),
              (V{"café", "你好", "\xEF\xBC\x91", "\xEF\xBC\x92", "\xF0\x9F\x98\x80"}));
}

TEST(ClipTokenizer, Normalization) {
    // NFC: "e" + COMBINING ACUTE -> U+00E9; upper-case non-ASCII letters are lowered.
    EXPECT_EQ(ClipTokenizer::normalize("Cafe\xCC\x81  \xC3\x89T\xC3\x89"), "caf\xC3\xA9 \xC3\xA9t\xC3\xA9");
    EXPECT_EQ(tok().encode("Cafe\xCC\x81"), tok().encode("caf\xC3\xA9"));
    // Hangul jamo L+V+T compose to one syllable (U+1112 U+1161 U+11AB -> U+D55C).
    EXPECT_EQ(easel::text::utf8_encode(easel::text::nfc(U"\u1112\u1161\u11AB")), "\xED\x95\x9C");
    // Canonical reordering: a + dot below (ccc 220) + acute (230) in either order -> same NFC.
    EXPECT_EQ(easel::text::nfc(U"a\u0301\u0323"), easel::text::nfc(U"a\u0323\u0301"));
}

TEST(Unicode, Utf8DecodeReplacesInvalidBytes) {
    using easel::text::utf8_decode;
    // Same results as Python bytes.decode("utf-8", errors="replace").
    EXPECT_EQ(utf8_decode("\xE0\x80\x80"), U"\uFFFD\uFFFD\uFFFD");  // overlong
    EXPECT_EQ(utf8_decode("\xED\xA0\x80"), U"\uFFFD\uFFFD\uFFFD");  // surrogate
    EXPECT_EQ(utf8_decode("\xE4\xBD" "A"), U"\uFFFDA");                // truncated
    EXPECT_EQ(utf8_decode("a\x80" "b"), U"a\uFFFD" U"b");                   // stray continuation
    EXPECT_EQ(utf8_decode("\xC3\xA9\xF0\x9F\x98\x80"), U"\u00E9\U0001F600");
    EXPECT_FALSE(easel::text::utf8_valid("\xFF"));
    EXPECT_TRUE(easel::text::utf8_valid("caf\xC3\xA9"));
}

TEST(ClipTokenizer, DecodeRoundTrip) {
    // decode() ends every word with a space ("</w>" -> " "), as simple_tokenizer.py does.
    EXPECT_EQ(tok().decode(tok().encode_with_special("A photo of a CAT")), "a photo of a cat ");
    EXPECT_EQ(tok().decode(tok().encode("café, 你好! (masterpiece:1.2)")),
              "café , 你好 ! ( masterpiece : 1 . 2 ) ");
    EXPECT_EQ(tok().decode(tok().encode("emoji \xF0\x9F\x98\x80ok")), "emoji \xF0\x9F\x98\x80 ok ");
    EXPECT_THROW(tok().decode(Ids{49408}), easel::Error);
}

TEST(ClipTokenizer, FromFileMatchesEmbedded) {
    const auto path = std::filesystem::path(EASEL_SOURCE_DIR) / "models/tokenizers/clip/bpe_simple_vocab_16e6.txt.gz";
    const auto t = ClipTokenizer::from_file(path);
    EXPECT_EQ(t.encode("a photo of an astronaut riding a horse"), tok().encode("a photo of an astronaut riding a horse"));
    EXPECT_THROW(ClipTokenizer::from_file("/nonexistent/vocab.txt.gz"), easel::Error);
    EXPECT_THROW(ClipTokenizer::from_merges_text("header\nab\n", 1), easel::Error);
    EXPECT_THROW(ClipTokenizer::from_merges_text("header\na b\n", 2), easel::Error);
}

// 60 cases produced by Hugging Face transformers' CLIPTokenizer on the GPU machine
// (tools/reference/dump_clip_tokens.py -> tests/data/text/clip_tokenizer_cases.json,
// [{"text": ..., "ids": [BOS, ..., EOS], "ids_openai"?: [...]}]): mixed case, whitespace runs,
// accents, Greek/Cyrillic/CJK/Hangul, emoji, ligatures, zero-width and no-break spaces, literal
// special tokens, HTML entities (HF does not unescape them; "ids_openai" holds simple_tokenizer.py's
// unescaped ids, which easel deliberately does not follow), and 160-token prompts.
TEST(ClipTokenizer, HuggingFaceCases) {
    const auto path = std::filesystem::path(EASEL_TEST_DATA) / "text/clip_tokenizer_cases.json";
    std::ifstream f(path);
    ASSERT_TRUE(f) << "missing " << path;
    const auto cases = nlohmann::json::parse(f);
    ASSERT_FALSE(cases.empty());
    size_t n = 0;
    for (const auto& c : cases) {
        const std::string text = c.at("text");
        const Ids want = c.at("ids").get<Ids>();
        EXPECT_EQ(tok().encode_with_special(text), want) << "text: " << text;
        if (c.contains("ids_openai")) { EXPECT_NE(tok().encode_with_special(text), c.at("ids_openai").get<Ids>()); }
        ++n;
    }
    EXPECT_GE(n, 60u);
}
