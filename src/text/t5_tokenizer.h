// T5 tokenizer: the SentencePiece unigram model of T5 / T5 v1.1 (the text encoder of FLUX.1,
// SD3, Chroma, PixArt), read from a Hugging Face tokenizer.json.
//
// Behaviour matches transformers' T5TokenizerFast (HF tokenizers on t5's tokenizer.json) and
// the original SentencePiece model, which agree on ordinary text:
//   1. normalize with the Precompiled normalizer: the SentencePiece "nmt_nfkc" rules stored as
//      normalizer.precompiled_charsmap (base64 of: u32 trie size, a Darts double-array trie over
//      UTF-8 input prefixes, a table of NUL-terminated replacements); longest match at each
//      position (full-width letters -> ASCII, ligatures split, U+3000 -> space, ...);
//   2. split on whitespace (runs collapse, leading/trailing dropped) and put "▁" (U+2581)
//      before every word (WhitespaceSplit + Metaspace, add_prefix_space);
//   3. unigram segmentation: the Viterbi path maximising the sum of piece log-probabilities
//      (model.vocab scores); a character no piece covers becomes <unk> (id 2) scored
//      min score - 10, and a run of unknowns is one <unk>;
//   4. append </s> (id 1) (post_processor TemplateProcessing "$A </s>").
// Steps 1-3 run in libsentencepiece (Debian libsentencepiece-dev): the tokenizer.json's pieces,
// scores and charsmap are written into a SentencePiece ModelProto in memory (see
// t5_tokenizer.cpp) and loaded with SentencePieceProcessor::LoadFromSerializedProto.
// Special-token text in the prompt ("</s>", "<extra_id_0>") is NOT recognised: it is tokenized
// as ordinary characters (HF would map it to the special id; no image pipeline relies on that).
//
// Vocabulary: 32,000 SentencePiece pieces + 100 <extra_id_N> (ids 32000..32099, never produced)
// = 32,100 ids; <pad> = 0, </s> = 1, <unk> = 2. The same 32k model serves t5-small .. t5-v1_1-xxl.
// The library embeds models/tokenizers/t5/tokenizer.json.gz (Apache-2.0 T5 vocabulary; see the
// README there), because FLUX.1 / SD3 text-encoder files carry no tokenizer.
// Thread safety: const methods may be called concurrently.
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

class T5Tokenizer {
public:
    static constexpr int32_t kPad = 0;  ///< <pad>: padding id of T5 pipelines (FLUX.1, SD3)
    static constexpr int32_t kEos = 1;  ///< </s>: appended to every encoding
    static constexpr int32_t kUnk = 2;  ///< <unk>

    /// The tokenizer over the vocabulary embedded in the library; built on first call
    /// (inflates and parses ~1.4 MB of JSON, ~0.5 s on the 2-core CI machine) and shared afterwards.
    static const T5Tokenizer& builtin();

    /// Builds a tokenizer from the text of a HF tokenizer.json holding a Unigram model
    /// (model.vocab = [[piece, score], ...], model.unk_id) and a Precompiled normalizer (or none).
    /// Throws Error(InvalidInput) when the JSON is malformed, the model is not Unigram, the
    /// normalizer is of another type, or SentencePiece rejects the resulting model.
    static T5Tokenizer from_json_text(std::string_view json);

    /// Reads a tokenizer.json file, gzip-compressed or plain.
    /// Throws Error(Io) if unreadable, Error(InvalidInput) as from_json_text.
    static T5Tokenizer from_file(const std::filesystem::path& path);

    T5Tokenizer(T5Tokenizer&&) noexcept;
    T5Tokenizer& operator=(T5Tokenizer&&) noexcept;
    ~T5Tokenizer();

    /// Token ids of `text` (UTF-8) without </s>, any length (steps 1-3 above).
    std::vector<int32_t> encode(std::string_view text) const;

    /// encode(text) + </s>, like HF tokenizer(text)["input_ids"] (no truncation).
    std::vector<int32_t> encode_with_eos(std::string_view text) const;

    /// Fixed-length input of a T5 text encoder, as diffusers' FLUX/SD3 pipelines call the
    /// tokenizer (padding="max_length", truncation=True, max_length=`length`): the first
    /// length-1 tokens of encode(text), </s>, then kPad up to `length`. When `mask` is given it
    /// receives `length` values, 1 for the tokens (</s> included) and 0 for padding.
    /// Throws Error(InvalidInput) if length < 1.
    std::vector<int32_t> encode_padded(std::string_view text, int length, std::vector<int32_t>* mask = nullptr) const;

    /// Step 1 + the whitespace handling of step 2: the normalized text with "▁" marking word
    /// starts, e.g. "ｈｅｌｌｏ  World" -> "▁hello▁World".
    std::string normalize(std::string_view text) const;

    /// Text of ids: pieces joined, "▁" -> space, leading space dropped; <pad>, </s> and
    /// <extra_id_N> skipped; <unk> as " ⁇ " (SentencePiece's surface).
    /// Throws Error(InvalidInput) for an id outside [0, vocab_size()).
    std::string decode(std::span<const int32_t> ids) const;

    /// Id of a piece in its stored form ("▁Hello"), if present.
    std::optional<int32_t> piece_id(std::string_view piece) const;
    /// Piece of `id`. Throws Error(InvalidInput) if out of range.
    const std::string& piece(int32_t id) const;
    /// Score (log probability) of `id`'s piece. Throws Error(InvalidInput) if out of range.
    float score(int32_t id) const;
    /// Number of ids (32,100 for T5).
    size_t vocab_size() const;

private:
    struct Impl;
    explicit T5Tokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace easel::text
