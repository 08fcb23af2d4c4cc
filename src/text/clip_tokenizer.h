// CLIP byte-level BPE tokenizer (the text tokenizer of SD1.x/SD2.x/SDXL/SD3/FLUX CLIP encoders).
//
// Behaviour matches Hugging Face transformers' CLIPTokenizer (tokenizers backend, as used by
// diffusers and by `tokenizer(text)["input_ids"]`), which is OpenAI's clip/simple_tokenizer.py
// without ftfy:
//   1. normalize: Unicode NFC, every run of whitespace -> one space, full lower-casing.
//      No HTML unescaping: OpenAI's simple_tokenizer.py does html.unescape() twice, HF does
//      not, and SD pipelines (diffusers, A1111) tokenize through HF, so "&amp;" stays 3 tokens
//      ("&", "amp", ";") as in HF.
//   2. pre-tokenize with the CLIP pattern
//        <|startoftext|>|<|endoftext|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
//      (leftmost alternative wins; whitespace between matches is dropped; \p{L}/\p{N} are the
//      Unicode general categories, from src/text/unicode_tables.inc).
//   3. map each pre-token's UTF-8 bytes to printable code points (GPT-2 bytes_to_unicode),
//      append "</w>" to the last symbol, and apply merges by rank (lowest rank first) until
//      none applies; look the symbols up in the vocabulary.
// Vocabulary (49408 ids): 256 byte symbols, their 256 "</w>" variants, 48894 merges (lines
// 1..48894 of bpe_simple_vocab_16e6.txt), then <|startoftext|> = 49406 and <|endoftext|> = 49407.
// The merge list is embedded in the library (models/tokenizers/clip, MIT, OpenAI).
// Thread safety: encode()/decode() may be called concurrently (the word cache is locked).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace easel::text {

class ClipTokenizer {
public:
    static constexpr int32_t kBos = 49406;          ///< <|startoftext|>
    static constexpr int32_t kEos = 49407;          ///< <|endoftext|> (also SD1.x's pad token)
    static constexpr int32_t kOpenClipPad = 0;      ///< SD2.x / OpenCLIP (and SDXL CLIP-G) pad id
    static constexpr int kMaxLength = 77;           ///< CLIP context length (BOS + 75 + EOS)
    static constexpr size_t kDefaultMerges = 49152 - 256 - 2;  ///< 48894 merges used by CLIP

    /// The tokenizer over the vocabulary embedded in the library; built on first call
    /// (inflates ~1.4 MB, ~0.1 s) and shared afterwards.
    static const ClipTokenizer& builtin();

    /// Builds a tokenizer from the text of a bpe_simple_vocab file (header line, then one
    /// "a b" merge per line); uses the first `n_merges` merges.
    /// Throws Error(InvalidInput) if the text has fewer merges or a malformed line.
    static ClipTokenizer from_merges_text(std::string_view text, size_t n_merges = kDefaultMerges);

    /// Reads a bpe_simple_vocab file, gzip-compressed (.gz) or plain.
    /// Throws Error(Io) if unreadable, Error(InvalidInput) if malformed.
    static ClipTokenizer from_file(const std::filesystem::path& path, size_t n_merges = kDefaultMerges);

    ClipTokenizer(ClipTokenizer&&) noexcept;
    ClipTokenizer& operator=(ClipTokenizer&&) noexcept;
    ~ClipTokenizer();

    /// Token ids of `text` (UTF-8; invalid bytes become U+FFFD) without BOS/EOS, any length.
    std::vector<int32_t> encode(std::string_view text) const;

    /// BOS + encode(text) + EOS, like HF tokenizer(text)["input_ids"] (no truncation).
    std::vector<int32_t> encode_with_special(std::string_view text) const;

    /// One fixed CLIP window: BOS + at most kMaxLength-2 tokens + EOS, then `pad_id` up to
    /// `length` (77). Longer text is truncated like HF truncation=True. For prompts longer than
    /// 75 tokens use text::tokenize_weighted (prompt_syntax.h), which makes several windows.
    std::vector<int32_t> encode_window(std::string_view text, int32_t pad_id, int length = kMaxLength) const;

    /// Text of ids ("</w>" -> space, bytes re-assembled as UTF-8, BOS/EOS dropped).
    /// Throws Error(InvalidInput) for an id outside [0, vocab_size()).
    std::string decode(std::span<const int32_t> ids) const;

    /// Id of a vocabulary entry in its stored form ("cat</w>", ",</w>"), if present.
    std::optional<int32_t> token_id(std::string_view token) const;
    /// Vocabulary entry of `id`. Throws Error(InvalidInput) if out of range.
    const std::string& token(int32_t id) const;
    /// Number of ids (49408 for CLIP).
    size_t vocab_size() const;

    /// Step 1 above (NFC, whitespace runs -> " ", lower case), on UTF-8.
    static std::string normalize(std::string_view text);
    /// Step 2 above on already normalized text: the pre-tokens, in order.
    static std::vector<std::string> pre_tokenize(std::string_view normalized);

private:
    struct Impl;
    explicit ClipTokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace easel::text
