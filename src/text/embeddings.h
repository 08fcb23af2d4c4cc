// Textual-inversion embeddings (--embd-dir): reading the files and finding their names in a
// tokenized prompt, as A1111 does (modules/textual_inversion/textual_inversion.py:
// create_embedding_from_data, EmbeddingDatabase.find_embedding_at_position;
// modules/sd_hijack_clip.py tokenize_line; modules/sd_hijack.py EmbeddingsWithFixes).
//
// An embedding is named by its file stem. The name is tokenized with the CLIP tokenizer (so the
// match is case-insensitive, like every CLIP word) and found in the prompt's tokens; at a match
// the name's tokens are replaced by as many placeholder tokens (id 0) as the embedding has
// vectors, and after the token embedding layer those positions take the vectors. That is also
// what diffusers' load_textual_inversion gives for a name written as a word of its own (it adds
// "<name>", "<name>_1", ... as tokens whose embedding rows are the vectors).
//
// Files: A1111 .safetensors ("emb_params" [n, width], or one "string_to_param.*" tensor),
// diffusers learned_embeds ({"<token>": [width] or [n, width]}: any single tensor), SDXL
// {"clip_l": [n, 768], "clip_g": [n, 1280]}; .pt / .bin through io's reader once it reads
// PyTorch pickles (until then io refuses them, naming the file).
#pragma once

#include "text/clip_tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace easel::text {

/// One embedding's vectors per text encoder: key "" for SD1.x / SD2.x files (one encoder),
/// "clip_l" and "clip_g" for SDXL pairs. Each [n_vectors, width] row-major F32.
struct Embedding {
    std::string name;                               ///< the file stem: what a prompt writes
    std::filesystem::path path;
    int64_t n_vectors = 0;
    std::map<std::string, std::vector<float>> vectors;
    std::map<std::string, int64_t> width;           ///< per key
    /// The vectors for an encoder of `width` ("" key first, else the SDXL half of that width):
    /// nullptr when the embedding has none of that width.
    const std::vector<float>* for_width(int64_t w) const;
};

/// Reads an embedding file (see the header). Throws Error(InvalidInput) when the file holds
/// something else ("... is not a textual-inversion embedding: 3 tensors (a, b, c)"), more than
/// 75 vectors, or non-finite values; Error(Io) when it cannot be read.
Embedding read_embedding(const std::filesystem::path& file);

/// The embedding files of `dir` and its subfolders (.safetensors, .pt, .bin), name (stem) ->
/// path, sorted by name; for two files with one stem the first in path order wins (A1111 keeps
/// one too). Throws Error(Io) when `dir` is not a folder.
std::map<std::string, std::filesystem::path> list_embeddings(const std::filesystem::path& dir);

/// Where an embedding starts in a token sequence.
struct EmbeddingMatch {
    int index = -1;          ///< the embedding's index in the lookup
    size_t name_tokens = 0;  ///< how many prompt tokens its name takes
    int vectors = 0;         ///< how many vectors it puts in their place
};

/// A1111's ids_lookup: embedding names tokenized, keyed by their first token, longest first.
class EmbeddingLookup {
public:
    /// Adds embedding `index` named `name` with `vectors` vectors (names that tokenize to
    /// nothing are skipped).
    void add(const ClipTokenizer& tok, int index, const std::string& name, int vectors);
    /// The embedding whose name's tokens start at tokens[pos] (the longest when several do).
    std::optional<EmbeddingMatch> find_at(const std::vector<int32_t>& tokens, size_t pos) const;
    bool empty() const { return by_first_.empty(); }

private:
    struct Entry {
        std::vector<int32_t> ids;
        int index;
        int vectors;
    };
    std::map<int32_t, std::vector<Entry>> by_first_;
};

/// Host inputs that put embedding vectors into a CLIP window (models::clip::ClipInputs
/// embed_keep / embed_fix): keep F32 [L] is 0 at the positions that take a vector and 1
/// elsewhere; fix F32 [L, width] holds the vectors there and 0 elsewhere, so that
/// h = token_embedding(ids) * keep + fix.
struct EmbeddingInputs {
    std::vector<float> keep, fix;
};

}  // namespace easel::text
