// A1111 prompt syntax: expected values are the doctest examples of parse_prompt_attention in
// stable-diffusion-webui modules/prompt_parser.py, and chunk layouts worked out by hand from
// modules/sd_hijack_clip.py tokenize_line.
#include "core/error.h"
#include "text/clip_tokenizer.h"
#include "text/prompt_syntax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iomanip>
#include <ostream>

using namespace easel::text;
using W = std::vector<WeightedText>;
using Ids = std::vector<int32_t>;

namespace easel::text {
// Readable failure messages: {"text", weight} with 17 significant digits.
void PrintTo(const WeightedText& w, std::ostream* os) { *os << "{\"" << w.text << "\", " << std::setprecision(17) << w.weight << "}"; }
}  // namespace easel::text

namespace {
const ClipTokenizer& tok() { return ClipTokenizer::builtin(); }
std::string repeat(const std::string& s, int n) {
    std::string r;
    for (int i = 0; i < n; ++i) r += s;
    return r;
}
}  // namespace

TEST(PromptAttention, A1111DocstringExamples) {
    EXPECT_EQ(parse_prompt_attention("normal text"), (W{{"normal text", 1.0}}));
    EXPECT_EQ(parse_prompt_attention("an (important) word"), (W{{"an ", 1.0}, {"important", 1.1}, {" word", 1.0}}));
    EXPECT_EQ(parse_prompt_attention("(unbalanced"), (W{{"unbalanced", 1.1}}));
    EXPECT_EQ(parse_prompt_attention("\\(literal\\]"), (W{{"(literal]", 1.0}}));
    EXPECT_EQ(parse_prompt_attention("(unnecessary)(parens)"), (W{{"unnecessaryparens", 1.1}}));
    // Python prints these doubles as 1.5730000000000004 and 1.4641000000000006: bit-exact here.
    EXPECT_EQ(parse_prompt_attention("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky)))."),
              (W{{"a ", 1.0},
                 {"house", 1.5730000000000004},
                 {" ", 1.1},
                 {"on", 1.0},
                 {" a ", 1.1},
                 {"hill", 0.55},
                 {", sun, ", 1.1},
                 {"sky", 1.4641000000000006},
                 {".", 1.1}}));
}

TEST(PromptAttention, EscapesBracketsAndEdgeCases) {
    EXPECT_EQ(parse_prompt_attention(""), (W{{"", 1.0}}));
    EXPECT_EQ(parse_prompt_attention("a \\\\ b"), (W{{"a \\ b", 1.0}}));
    EXPECT_EQ(parse_prompt_attention("a \\x"), (W{{"a x", 1.0}}));       // lone backslash dropped
    EXPECT_EQ(parse_prompt_attention("[x]"), (W{{"x", 1 / 1.1}}));
    EXPECT_EQ(parse_prompt_attention("x) y]"), (W{{"x) y]", 1.0}}));       // unmatched closers are text
    EXPECT_EQ(parse_prompt_attention("(x : 1.25 )"), (W{{"x ", 1.25}}));   // spaces around the weight
    EXPECT_EQ(parse_prompt_attention("time: 5:30"), (W{{"time: 5:30", 1.0}}));
    EXPECT_EQ(parse_prompt_attention("x:1.5) y"), (W{{"x:1.5) y", 1.0}}));  // weight with no '(' is text
    EXPECT_EQ(parse_prompt_attention("(a:-1)"), (W{{"a", -1.0}}));
    EXPECT_THROW(parse_prompt_attention("(a:1.2.3)"), easel::Error);
    // Non-ASCII text passes through.
    EXPECT_EQ(parse_prompt_attention("(猫:1.2)"), (W{{"猫", 1.2}}));
}

TEST(PromptAttention, Break) {
    EXPECT_EQ(parse_prompt_attention("a cat BREAK a dog"), (W{{"a cat", 1.0}, {"BREAK", -1.0}, {"a dog", 1.0}}));
    // Only the whole word: BREAKFAST and xBREAK are text.
    EXPECT_EQ(parse_prompt_attention("BREAKFAST xBREAK"), (W{{"BREAKFAST xBREAK", 1.0}}));
    EXPECT_EQ(parse_prompt_attention("a,BREAK,b"), (W{{"a,", 1.0}, {"BREAK", -1.0}, {",b", 1.0}}));
    EXPECT_TRUE(parse_prompt_attention("x BREAK y")[1].is_break());
    // Inside brackets the marker's -1 is multiplied: it is then plain text (A1111 quirk).
    const auto in = parse_prompt_attention("(a BREAK b)");
    ASSERT_EQ(in.size(), 3u);
    EXPECT_FALSE(in[1].is_break());
    EXPECT_DOUBLE_EQ(in[1].weight, -1.1);
}

TEST(PromptAttention, RealPrompts) {
    // kohya sd-scripts example (kohya_gen_img_example.png): double de-emphasis.
    EXPECT_EQ(parse_prompt_attention("Wikipe-tan, [[cowboy shot, beautiful dress, smile, in park]]"),
              (W{{"Wikipe-tan, ", 1.0}, {"cowboy shot, beautiful dress, smile, in park", 0.8264462809917354}}));
    // ComfyUI negative prompt (sdparsers_night_evening_day_morning_cropped.png, node 7), first part.
    EXPECT_EQ(parse_prompt_attention("(hands), text, error, cropped, (worst quality:1.2), (low quality:1.2), normal quality"),
              (W{{"hands", 1.1},
                 {", text, error, cropped, ", 1.0},
                 {"worst quality", 1.2},
                 {", ", 1.0},
                 {"low quality", 1.2},
                 {", normal quality", 1.0}}));
}

TEST(PromptTags, LoraTags) {
    // sd.cpp keeps the tag in its saved prompt (sdcpp_with_lcm.png).
    const auto p = extract_extra_networks("a lovely cat<lora:lcm-lora-sdv1-5:1>");
    EXPECT_EQ(p.text, "a lovely cat");
    ASSERT_EQ(p.loras.size(), 1u);
    EXPECT_EQ(p.loras[0].kind, "lora");
    EXPECT_EQ(p.loras[0].name, "lcm-lora-sdv1-5");
    EXPECT_EQ(p.loras[0].multiplier, 1.0f);
    EXPECT_EQ(p.loras[0].unet_multiplier, 1.0f);

    const auto q = extract_extra_networks("<lora:a> x <lyco:b:0.5> y <lora:c:0.8:0.3:dyn=16> <lora:d:unet=0.2:te=0.7>");
    EXPECT_EQ(q.text, "x y");  // the whitespace each tag leaves goes with it
    ASSERT_EQ(q.loras.size(), 4u);
    EXPECT_EQ(q.loras[0].name, "a");
    EXPECT_EQ(q.loras[0].multiplier, 1.0f);
    EXPECT_EQ(q.loras[1].kind, "lyco");
    EXPECT_EQ(q.loras[1].multiplier, 0.5f);
    EXPECT_EQ(q.loras[1].unet_multiplier, 0.5f);  // defaults to the text-encoder multiplier
    EXPECT_EQ(q.loras[2].multiplier, 0.8f);
    EXPECT_EQ(q.loras[2].unet_multiplier, 0.3f);
    EXPECT_EQ(q.loras[2].dyn_dim, 16);
    EXPECT_EQ(q.loras[3].multiplier, 0.7f);
    EXPECT_EQ(q.loras[3].unet_multiplier, 0.2f);

    // Unknown kinds are removed too (A1111), reported in `others`; not-a-tag text stays.
    const auto r = extract_extra_networks("cat <hypernet:h:0.6> <3 <lora:> a<b>");
    EXPECT_EQ(r.text, "cat <3 <lora:> a<b>");
    ASSERT_EQ(r.others.size(), 1u);
    EXPECT_EQ(r.others[0].kind, "hypernet");
    EXPECT_EQ(r.others[0].name, "h");
    EXPECT_TRUE(r.loras.empty());

    // Where a tag was, no whitespace is left over (Qwen3 and T5 would encode it; CLIP ignores it):
    // at the end, at the start, between words, several in a row; other whitespace stays as written.
    EXPECT_EQ(extract_extra_networks("a photo of a cat <lora:x:0.6>").text, "a photo of a cat");
    EXPECT_EQ(extract_extra_networks("  <lora:x:0.6>\t a photo of a cat").text, "a photo of a cat");
    EXPECT_EQ(extract_extra_networks("a photo of <lora:x:0.6> a cat").text, "a photo of a cat");
    EXPECT_EQ(extract_extra_networks("a cat, <lora:x> <lora:y>\n").text, "a cat,\n");
    EXPECT_EQ(extract_extra_networks("<lora:x> <lora:y> a  cat ").text, "a  cat ");
    EXPECT_EQ(extract_extra_networks("a<lora:x>b").text, "ab");
    EXPECT_EQ(extract_extra_networks("<lora:x>").text, "");

    EXPECT_THROW(extract_extra_networks("<lora:x:abc>"), easel::Error);
    EXPECT_THROW(extract_extra_networks("<lora::1>"), easel::Error);
}

TEST(WeightedTokenize, SingleChunkWeights) {
    const auto c = tokenize_weighted(tok(), "a (cat:1.5)");
    ASSERT_EQ(c.ids.size(), 1u);
    ASSERT_EQ(c.ids[0].size(), 77u);
    ASSERT_EQ(c.weights[0].size(), 77u);
    EXPECT_EQ(Ids(c.ids[0].begin(), c.ids[0].begin() + 4), (Ids{49406, 320, 2368, 49407}));
    for (size_t i = 4; i < 77; ++i) EXPECT_EQ(c.ids[0][i], 49407);
    EXPECT_EQ(c.weights[0][0], 1.0f);
    EXPECT_EQ(c.weights[0][1], 1.0f);
    EXPECT_EQ(c.weights[0][2], 1.5f);
    for (size_t i = 3; i < 77; ++i) EXPECT_EQ(c.weights[0][i], 1.0f);
    EXPECT_EQ(c.token_count, 2);

    // SD2 / OpenCLIP padding: everything after the first EOS becomes 0.
    ChunkOptions o;
    o.pad_id = 0;
    const auto d = tokenize_weighted(tok(), "a (cat:1.5)", o);
    EXPECT_EQ(d.ids[0][3], 49407);
    for (size_t i = 4; i < 77; ++i) EXPECT_EQ(d.ids[0][i], 0);

    // Emphasis off: brackets are tokens.
    o = {};
    o.parse_attention = false;
    const auto e = tokenize_weighted(tok(), "(cat)", o);
    EXPECT_EQ(Ids(e.ids[0].begin(), e.ids[0].begin() + 5),
              (Ids{49406, *tok().token_id("(</w>"), 2368, *tok().token_id(")</w>"), 49407}));
    for (size_t i = 0; i < 77; ++i) EXPECT_EQ(e.weights[0][i], 1.0f);
    EXPECT_EQ(e.token_count, 3);  // "(", "cat", ")"

    // Empty prompt: one window BOS EOS pad..., count 0.
    const auto f = tokenize_weighted(tok(), "");
    ASSERT_EQ(f.ids.size(), 1u);
    EXPECT_EQ(f.ids[0][0], 49406);
    EXPECT_EQ(f.ids[0][1], 49407);
    EXPECT_EQ(f.token_count, 0);
}

TEST(WeightedTokenize, LongPromptSplitsIn75) {
    // 80 x "cat" (one token each) -> 75 + 5.
    const auto c = tokenize_weighted(tok(), repeat("cat ", 80));
    ASSERT_EQ(c.ids.size(), 2u);
    for (size_t i = 1; i <= 75; ++i) EXPECT_EQ(c.ids[0][i], 2368);
    EXPECT_EQ(c.ids[0][76], 49407);
    for (size_t i = 1; i <= 5; ++i) EXPECT_EQ(c.ids[1][i], 2368);
    EXPECT_EQ(c.ids[1][6], 49407);
    EXPECT_EQ(c.token_count, 80);
    // Exactly 75 tokens: one chunk, nothing left over.
    EXPECT_EQ(tokenize_weighted(tok(), repeat("cat ", 75)).ids.size(), 1u);
}

TEST(WeightedTokenize, CommaBackoff) {
    const int32_t cat = 2368, comma = 267;
    const int32_t dog = tok().encode("dog")[0];
    // 70 cats, ",", 10 dogs: the chunk fills at the 4th dog; the 5th dog finds the comma 5 tokens
    // back (<= 20), so the 4 dogs after it move to chunk 2.
    const auto c = tokenize_weighted(tok(), repeat("cat ", 70) + "," + repeat(" dog", 10));
    ASSERT_EQ(c.ids.size(), 2u);
    EXPECT_EQ(c.ids[0][70], cat);
    EXPECT_EQ(c.ids[0][71], comma);
    EXPECT_EQ(c.ids[0][72], 49407);  // padding after the comma
    for (size_t i = 1; i <= 10; ++i) EXPECT_EQ(c.ids[1][i], dog);
    EXPECT_EQ(c.ids[1][11], 49407);
    EXPECT_EQ(c.token_count, 85);

    // Same prompt with the back-off disabled: hard split at 75.
    ChunkOptions o;
    o.comma_padding_backtrack = 0;
    const auto d = tokenize_weighted(tok(), repeat("cat ", 70) + "," + repeat(" dog", 10), o);
    EXPECT_EQ(d.ids[0][75], dog);
    for (size_t i = 1; i <= 6; ++i) EXPECT_EQ(d.ids[1][i], dog);

    // A comma more than 20 tokens back: no back-off.
    const auto e = tokenize_weighted(tok(), repeat("cat ", 50) + "," + repeat(" dog", 30));
    EXPECT_EQ(e.ids[0][75], dog);
    EXPECT_EQ(e.ids[1][1], dog);
}

TEST(WeightedTokenize, BreakStartsNewChunk) {
    const auto c = tokenize_weighted(tok(), "a cat BREAK (dog:1.3)");
    const int32_t dog = tok().encode("dog")[0];
    ASSERT_EQ(c.ids.size(), 2u);
    EXPECT_EQ(Ids(c.ids[0].begin(), c.ids[0].begin() + 4), (Ids{49406, 320, 2368, 49407}));
    EXPECT_EQ(Ids(c.ids[1].begin(), c.ids[1].begin() + 3), (Ids{49406, dog, 49407}));
    EXPECT_EQ(c.weights[1][1], 1.3f);
    EXPECT_EQ(c.token_count, 76);  // 75 for the broken chunk + 1
}

TEST(Emphasis, OriginalRestoresMean) {
    // z = [[1, 2], [3, 4]], multipliers [1, 2]: mean 2.5 -> [1, 2, 6, 8] mean 4.25 -> x 2.5/4.25.
    std::vector<float> z{1, 2, 3, 4};
    const std::vector<float> m{1, 2};
    apply_emphasis_original(z, 2, 2, m);
    const double s = 2.5 / 4.25;
    EXPECT_NEAR(z[0], 1 * s, 1e-6);
    EXPECT_NEAR(z[1], 2 * s, 1e-6);
    EXPECT_NEAR(z[2], 6 * s, 1e-6);
    EXPECT_NEAR(z[3], 8 * s, 1e-6);
    EXPECT_THROW(apply_emphasis_original(z, 3, 2, m), easel::Error);
}
