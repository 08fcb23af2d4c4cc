// Qwen byte-level BPE tokenizer: llama.cpp's 46 tokenizer test vectors for the Qwen2 vocabulary
// (tests/data/text/llamacpp-ggml-vocab-qwen2.gguf.inp/.out, ids as llama.cpp and HF produce them),
// chat-template strings with added tokens (ids of the Qwen vocabulary: <|im_start|> 151644,
// <|im_end|> 151645, <think> 151667, </think> 151668, "user" 872, "assistant" 77091, "\n" 198,
// "\n\n" 271, looked up in tokenizer.json), the pre-tokenizer regex against Python's `regex`
// module, and the GGUF-metadata path (a GGUF file written with ggml's gguf API, read back through
// io::WeightIndex).
#include "core/error.h"
#include "io/weight_index.h"
#include "text/qwen_tokenizer.h"

#include <gguf.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using easel::text::QwenTokenizer;

namespace {

std::string read_file(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

struct Case {
    std::string text;
    std::vector<int32_t> ids;
};

// llama.cpp's test format: strings separated by "\n__ggml_vocab_test__\n"; one line of ids per string.
std::vector<Case> llamacpp_cases() {
    const std::string dir = std::string(EASEL_TEST_DATA) + "/text/";
    const std::string inp = read_file(dir + "llamacpp-ggml-vocab-qwen2.gguf.inp");
    const std::string out = read_file(dir + "llamacpp-ggml-vocab-qwen2.gguf.out");
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> texts;
    for (size_t pos = 0;;) {
        size_t e = inp.find(sep, pos);
        if (e == std::string::npos) break;
        texts.push_back(inp.substr(pos, e - pos));
        pos = e + sep.size();
    }
    std::vector<Case> cases;
    std::istringstream lines(out);
    std::string line;
    for (const std::string& t : texts) {
        if (!std::getline(lines, line)) break;
        Case c{t, {}};
        std::istringstream ls(line);
        int32_t id;
        while (ls >> id) c.ids.push_back(id);
        cases.push_back(std::move(c));
    }
    return cases;
}

std::string gunzip_file(const std::filesystem::path& p) {
    std::string gz = read_file(p);
    z_stream zs{};
    inflateInit2(&zs, 15 + 32);
    zs.next_in = reinterpret_cast<Bytef*>(gz.data());
    zs.avail_in = (uInt)gz.size();
    std::string out;
    char buf[1 << 16];
    int rc = Z_OK;
    while (rc == Z_OK) {
        zs.next_out = reinterpret_cast<Bytef*>(buf);
        zs.avail_out = sizeof buf;
        rc = inflate(&zs, Z_NO_FLUSH);
        out.append(buf, sizeof buf - zs.avail_out);
    }
    inflateEnd(&zs);
    return out;
}

void expect_cases(const QwenTokenizer& tok, const std::vector<Case>& cases) {
    int ok = 0;
    for (const Case& c : cases) {
        auto ids = tok.encode(c.text, /*parse_special=*/false);
        EXPECT_EQ(ids, c.ids) << "text: '" << c.text << "'";
        if (ids == c.ids) ++ok;
        EXPECT_EQ(tok.decode(ids), c.text);  // byte-level BPE is lossless (these texts are NFC)
    }
    EXPECT_EQ(ok, 46);
}

}  // namespace

TEST(QwenTokenizer, LlamaCppTestVectors) {
    auto cases = llamacpp_cases();
    ASSERT_EQ(cases.size(), 46u);
    const QwenTokenizer& tok = QwenTokenizer::builtin();
    EXPECT_EQ(tok.vocab_size(), 151669u);
    EXPECT_EQ(tok.merge_count(), 151387u);
    expect_cases(tok, cases);
}

TEST(QwenTokenizer, ChatTemplateWithAddedTokens) {
    const QwenTokenizer& tok = QwenTokenizer::builtin();
    // Klein form (enable_thinking=False): empty think block
    const std::string klein = QwenTokenizer::chat_prompt("a cat", true);
    EXPECT_EQ(klein, "<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    const std::vector<int32_t> want_klein = {151644, 872, 198, 64, 8251, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271};
    EXPECT_EQ(tok.encode(klein), want_klein);
    EXPECT_EQ(tok.decode(want_klein), klein);
    // Z-Image form (enable_thinking=True): no think block
    const std::string z = QwenTokenizer::chat_prompt("Hello world", false);
    const std::vector<int32_t> want_z = {151644, 872, 198, 9707, 1879, 151645, 198, 151644, 77091, 198};
    EXPECT_EQ(tok.encode(z), want_z);
    // adjacent added tokens and <|endoftext|> padding
    EXPECT_EQ(tok.encode("<|im_end|><|endoftext|><|endoftext|>"), (std::vector<int32_t>{151645, 151643, 151643}));
    EXPECT_EQ(tok.token(QwenTokenizer::kImStart), "<|im_start|>");
    EXPECT_EQ(tok.token_id("<think>"), 151667);
    // without special parsing the markers are plain text: no added id, same text back
    auto plain = tok.encode("<|im_start|>user", false);
    for (int32_t id : plain) EXPECT_LT(id, 151643);
    EXPECT_EQ(plain.front(), 27);  // "<"
    EXPECT_EQ(tok.decode(plain), "<|im_start|>user");
}

TEST(QwenTokenizer, PreTokenizerMatchesPythonRegex) {
    // Expected pieces from Python's `regex` module with the pattern of tokenizer.json.
    const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
        {"Hello world", {"Hello", " world"}},
        {"  hi", {" ", " hi"}},
        {"a\n\n b", {"a", "\n\n", " b"}},
        {"3.14", {"3", ".", "1", "4"}},
        {"IT'S it's we'LL", {"IT", "'S", " it", "'s", " we", "'LL"}},
        {"x   ", {"x", "   "}},
        {"!!!\n\nabc", {"!!!\n\n", "abc"}},
        {" \t\n \n  x", {" \t\n \n", " ", " x"}},
        {"na\u00efve caf\u00e9 \u6771\u4eac2024", {"na\u00efve", " caf\u00e9", " \u6771\u4eac", "2", "0", "2", "4"}},
        {"a\u3000b\u00a0c", {"a", "\u3000b", "\u00a0c"}},
        {"(test)  \n", {"(test", ")", "  \n"}},
    };
    for (auto& [text, want] : cases) EXPECT_EQ(QwenTokenizer::pre_tokenize(text), want) << text;
}

TEST(QwenTokenizer, NfcBeforeBpe) {
    const QwenTokenizer& tok = QwenTokenizer::builtin();
    // "e" + COMBINING ACUTE composes to U+00E9 under NFC: same ids as the precomposed text
    EXPECT_EQ(tok.encode("caf\x65\xCC\x81"), tok.encode("caf\u00e9"));
}

TEST(QwenTokenizer, FromGgufMetadataFile) {
    // Write the vocabulary the way llama.cpp's converter does (tokens by id, merges "a b",
    // token_type 1 normal / 3 control / 4 user-defined / 5 unused [PADn] fillers up to 151936).
    const std::string json = gunzip_file(std::string(EASEL_SOURCE_DIR) + "/models/tokenizers/qwen3/tokenizer.json.gz");
    auto j = nlohmann::json::parse(json);
    std::vector<std::string> tokens(151936);
    std::vector<int32_t> types(151936, 5);
    for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
        tokens[it.value().get<size_t>()] = it.key();
        types[it.value().get<size_t>()] = 1;
    }
    for (auto& a : j["added_tokens"]) {
        tokens[a["id"].get<size_t>()] = a["content"].get<std::string>();
        types[a["id"].get<size_t>()] = a["special"].get<bool>() ? 3 : 4;
    }
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i].empty()) tokens[i] = "[PAD" + std::to_string(i) + "]";
    std::vector<std::string> merges;
    for (auto& m : j["model"]["merges"]) merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    auto to_c = [](const std::vector<std::string>& v) {
        std::vector<const char*> p;
        for (auto& s : v) p.push_back(s.c_str());
        return p;
    };
    gguf_context* g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", "qwen3");
    gguf_set_val_str(g, "tokenizer.ggml.model", "gpt2");
    gguf_set_val_str(g, "tokenizer.ggml.pre", "qwen2");
    auto tp = to_c(tokens), mp = to_c(merges);
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", tp.data(), tp.size());
    gguf_set_arr_str(g, "tokenizer.ggml.merges", mp.data(), mp.size());
    gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types.data(), types.size());
    const auto path = std::filesystem::temp_directory_path() / ("easel_qwen_tok_" + std::to_string(::getpid()) + ".gguf");
    ASSERT_TRUE(gguf_write_to_file(g, path.string().c_str(), false));
    gguf_free(g);

    auto index = easel::io::WeightIndex::open(path);
    std::filesystem::remove(path);
    ASSERT_TRUE(QwenTokenizer::gguf_has_tokenizer(index.metadata()));
    QwenTokenizer tok = QwenTokenizer::from_gguf_metadata(index.metadata());
    EXPECT_EQ(tok.vocab_size(), 151936u);
    expect_cases(tok, llamacpp_cases());
    EXPECT_EQ(tok.encode(QwenTokenizer::chat_prompt("a cat", true)),
              (std::vector<int32_t>{151644, 872, 198, 64, 8251, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271}));
    // [PADn] fillers are never produced by matching
    EXPECT_EQ(tok.encode("[PAD151700]").size() > 1, true);
}

TEST(QwenTokenizer, BadInputIsAnError) {
    using easel::Error;
    EXPECT_THROW(QwenTokenizer::from_tokenizer_json("{not json"), Error);
    EXPECT_THROW(QwenTokenizer::from_tokenizer_json(R"({"model": {"type": "Unigram"}})"), Error);
    EXPECT_THROW(QwenTokenizer::from_tokenizer_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"]]}})"), Error);
    std::map<std::string, easel::io::MetaValue> meta;
    EXPECT_FALSE(QwenTokenizer::gguf_has_tokenizer(meta));
    EXPECT_THROW(QwenTokenizer::from_gguf_metadata(meta), Error);
    meta["tokenizer.ggml.model"].s = "llama";
    EXPECT_THROW(QwenTokenizer::from_gguf_metadata(meta), Error);
    const int32_t bad[] = {151669};
    EXPECT_THROW(QwenTokenizer::builtin().decode(bad), Error);
    EXPECT_THROW(QwenTokenizer::from_file("/nonexistent/tokenizer.json"), Error);
}
