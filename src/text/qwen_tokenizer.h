// Qwen byte-level BPE tokenizer (Qwen2 / Qwen2.5 / Qwen3 vocabulary), the tokenizer of the
// Qwen3 text encoders of Z-Image and FLUX.2 [klein] (and of Qwen-Image's Qwen2.5-VL).
//
// Behaviour matches Hugging Face tokenizers' Qwen2TokenizerFast (tokenizer.json of Qwen/Qwen3-4B)
// and llama.cpp's "gpt2" tokenizer with pre-tokenizer "qwen2":
//   1. added tokens (<|endoftext|>, <|im_start|>, <|im_end|>, <think>, ...) are found in the raw
//      text first (leftmost, longest match; tokenizers' AddedVocabulary) and become their ids;
//      the text between them goes through steps 2-5 (pass parse_special = false to treat them
//      as plain text);
//   2. normalize: Unicode NFC (text::nfc, src/text/unicode.h);
//   3. pre-tokenize with the Split regex of tokenizer.json (behaviour Isolated)
//        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//      (\p{L}/\p{N}: Unicode general categories; \s: the Unicode White_Space property as
//      Oniguruma, the regex engine of tokenizers, defines it);
//   4. map each piece's UTF-8 bytes to printable code points (GPT-2 bytes_to_unicode);
//   5. BPE: merge the adjacent pair of lowest merge rank (leftmost first among equal ranks)
//      until no merge applies, then look the symbols up in the vocabulary.
// No BOS/EOS is added (the post-processor of Qwen's tokenizer.json adds none).
//
// Vocabulary sources: a tokenizer.json (model.type "BPE", merges as "a b" strings or as pairs),
// GGUF metadata (tokenizer.ggml.model "gpt2", tokenizer.ggml.tokens / .merges / .token_type;
// token types CONTROL (3) and USER_DEFINED (4) are the added tokens), or the copy of Qwen3's
// tokenizer.json embedded in the library (models/tokenizers/qwen3/tokenizer.json.gz, Apache-2.0).
// Thread safety: encode()/decode() may be called concurrently (the word cache is locked).
#pragma once

#include "io/weight_index.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace easel::text {

class QwenTokenizer {
public:
    static constexpr int32_t kEndOfText = 151643;  ///< <|endoftext|>: Qwen's pad token
    static constexpr int32_t kImStart = 151644;    ///< <|im_start|>
    static constexpr int32_t kImEnd = 151645;      ///< <|im_end|>

    /// The Qwen3 tokenizer embedded in the library (151,643 BPE tokens + 26 added tokens);
    /// built on first call (inflates and parses ~11 MB of JSON, about a second) and shared.
    static const QwenTokenizer& builtin();

    /// Builds a tokenizer from the text of an HF tokenizer.json (model.type "BPE", byte-level;
    /// merges as "a b" strings or [a, b] pairs; added_tokens are matched literally).
    /// Throws Error(InvalidInput) if it is not such a file (names the missing/malformed field).
    static QwenTokenizer from_tokenizer_json(std::string_view json_text);

    /// Reads a tokenizer.json, gzip-compressed (.gz) or plain.
    /// Throws Error(Io) if unreadable, Error(InvalidInput) if malformed.
    static QwenTokenizer from_file(const std::filesystem::path& path);

    /// Builds a tokenizer from GGUF metadata (llama.cpp keys): tokenizer.ggml.model must be
    /// "gpt2", tokenizer.ggml.tokens (ids = positions), tokenizer.ggml.merges ("a b"), and
    /// tokenizer.ggml.token_type (optional; 3 = CONTROL and 4 = USER_DEFINED are matched
    /// literally as added tokens). tokenizer.ggml.pre other than "qwen2" is rejected.
    /// Throws Error(InvalidInput) naming the missing or malformed key.
    static QwenTokenizer from_gguf_metadata(const std::map<std::string, io::MetaValue>& meta);

    /// True when `meta` holds a GGUF tokenizer this class can build (gpt2 model, qwen2 pre).
    static bool gguf_has_tokenizer(const std::map<std::string, io::MetaValue>& meta);

    QwenTokenizer(QwenTokenizer&&) noexcept;
    QwenTokenizer& operator=(QwenTokenizer&&) noexcept;
    ~QwenTokenizer();

    /// Token ids of `text` (UTF-8; invalid bytes become U+FFFD), no BOS/EOS, any length.
    /// parse_special: match added tokens (<|im_start|>...) in the text (HF default).
    std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

    /// Text of ids: added tokens as their text, the others' bytes re-assembled (invalid UTF-8
    /// kept as is). Throws Error(InvalidInput) for an id outside [0, vocab_size()).
    std::string decode(std::span<const int32_t> ids) const;

    /// Id of a vocabulary entry in its stored (byte-mapped) form ("Ġcat", "<|im_end|>").
    std::optional<int32_t> token_id(std::string_view token) const;
    /// Vocabulary entry of `id` in stored form. Throws Error(InvalidInput) if out of range.
    const std::string& token(int32_t id) const;
    /// Number of ids (151,669 for Qwen3: 151,643 BPE tokens + 26 added).
    size_t vocab_size() const;
    /// Number of merges.
    size_t merge_count() const;

    /// Step 3 above on already normalized UTF-8 text: the pieces, in order (they concatenate to
    /// the input).
    static std::vector<std::string> pre_tokenize(std::string_view normalized);

    /// The Qwen3 chat template (tokenizer_config.json) for one user message with
    /// add_generation_prompt=True:
    ///   "<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    /// plus "<think>\n\n</think>\n\n" when empty_think is set (enable_thinking=False, as
    /// diffusers' Flux2KleinPipeline calls it; ZImagePipeline uses enable_thinking=True: none).
    static std::string chat_prompt(std::string_view user, bool empty_think);

private:
    struct Impl;
    explicit QwenTokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace easel::text
