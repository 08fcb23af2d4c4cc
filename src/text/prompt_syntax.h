// A1111 (AUTOMATIC1111/stable-diffusion-webui) prompt syntax: attention weights, BREAK, extra-network
// tags, and the weighted, chunked CLIP tokenization that feeds the text encoder.
//
// Facts carried over (not code) from stable-diffusion-webui:
//   modules/prompt_parser.py    parse_prompt_attention, re_attention, re_break
//   modules/extra_networks.py   re_extra_net = <(\w+):([^>]+)>, args split on ':'
//   extensions-builtin/Lora/extra_networks_lora.py   <lora:name:te[:unet[:dyn]]>, te=/unet=/dyn= named args
//   modules/sd_hijack_clip.py   tokenize_line (75-token chunks, BREAK, comma back-off), process_tokens (pad)
//   modules/sd_emphasis.py      EmphasisOriginal (multiply hidden states, restore the mean)
// docs/prompts.md describes the syntax for users.
#pragma once

#include "text/clip_tokenizer.h"
#include "text/embeddings.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace easel::text {

/// One run of prompt text and its attention multiplier. A BREAK marker has text "BREAK" and
/// weight -1 exactly (A1111's convention; a BREAK inside brackets gets its -1 multiplied and is
/// then ordinary text, as in A1111).
struct WeightedText {
    std::string text;
    double weight = 1.0;
    bool is_break() const { return text == "BREAK" && weight == -1.0; }
    bool operator==(const WeightedText&) const = default;
};

/// A1111 parse_prompt_attention. Rules: "(x)" multiplies x by 1.1, "[x]" by 1/1.1,
/// "(x:w)" by w (w = [+-]?[.0-9]+, spaces allowed around it); nesting multiplies; a bracket
/// left open multiplies everything after it to the end; a ")" or "]" with no open bracket
/// is literal text; "\(", "\)", "\[", "\]", "\\" are literal characters and a lone "\" is
/// dropped; "BREAK" as a whole word (with the spaces around it) becomes a break marker;
/// adjacent runs of equal weight are merged; an empty prompt gives {{"", 1.0}}.
/// Weights are doubles computed in A1111's order, so they equal A1111's bit for bit.
/// Throws Error(InvalidInput) for a weight such as "(x:1.2.3)" that is not a number (A1111
/// fails there too).
std::vector<WeightedText> parse_prompt_attention(std::string_view prompt);

/// An extra-network tag <kind:arg[:arg...]>, e.g. <lora:name:0.8> or <lora:name:1:0.5:dyn=8>.
struct ExtraNetworkTag {
    std::string kind;                        ///< "lora", "lyco", "hypernet", ... as written
    std::string name;                        ///< first positional argument
    float multiplier = 1.0f;                 ///< LoRA text-encoder multiplier (te=, or 2nd positional); default 1
    float unet_multiplier = 1.0f;            ///< LoRA UNet/DiT multiplier (unet=, or 3rd positional); default = multiplier
    std::optional<int> dyn_dim;              ///< LoRA dyn= (4th positional), if given
    std::vector<std::string> args;           ///< all ':'-separated arguments as written
    bool operator==(const ExtraNetworkTag&) const = default;
};

/// A prompt with its extra-network tags taken out.
struct PromptTags {
    std::string text;                        ///< prompt with every <kind:...> tag (and the whitespace it leaves) removed
    std::vector<ExtraNetworkTag> loras;      ///< kinds "lora" and "lyco" (LyCORIS alias), in order
    std::vector<ExtraNetworkTag> others;     ///< any other kind (e.g. "hypernet"): removed, warned, unused
};

/// Finds every tag matching A1111's <(\w+):([^>]+)> (\w = Unicode letter, digit or '_'), removes
/// it from the text (A1111 removes tags of every kind; unknown kinds are logged as a warning and
/// returned in `others`), and parses LoRA/LyCORIS arguments as A1111's Lora extension does:
/// positional name[:te[:unet[:dyn]]], named te=, unet=, dyn= override them.
/// The whitespace a removed tag leaves behind is removed with it (unlike A1111, whose CLIP
/// tokenizer ignores it; Qwen3 and T5 would encode it): a tag at the start takes the whitespace
/// after it, any other tag followed by whitespace or the end takes the whitespace before it, so
/// "a cat <lora:x:1>", "<lora:x:1> a cat" and "a <lora:x:1> cat" give "a cat" / "a cat" / "a cat".
/// Throws Error(InvalidInput) for a LoRA tag with an empty name or a non-numeric multiplier.
PromptTags extract_extra_networks(std::string_view prompt);

/// Options of tokenize_weighted.
struct ChunkOptions {
    int32_t pad_id = ClipTokenizer::kEos;    ///< checkpoint's pad id: 49407 for SD1.x CLIP-L, 0 for SD2.x/OpenCLIP
    int comma_padding_backtrack = 20;        ///< A1111 option; 0 disables the comma back-off
    int chunk_length = 75;                   ///< prompt tokens per window (window = chunk_length + 2)
    bool parse_attention = true;             ///< false = A1111 emphasis "None": brackets are plain text
    /// Textual-inversion names to find in the prompt's tokens (A1111's embedding database), or null.
    const EmbeddingLookup* embeddings = nullptr;
};

/// An embedding placed in a window: positions [offset, offset + vectors) of the window's ids
/// (BOS is position 0) take the vectors of embedding `index` (of the EmbeddingLookup).
struct EmbeddingFix {
    size_t offset = 0;
    int index = -1;
    int vectors = 0;
    bool operator==(const EmbeddingFix&) const = default;
};

/// Token ids and per-token attention multipliers, one 77-token window per chunk.
/// ids[c] and weights[c] have chunk_length + 2 entries: BOS, 75 tokens, EOS/pad.
struct WeightedChunks {
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::vector<float>> weights;
    int token_count = 0;                     ///< A1111's count: 75 per full chunk + tokens of the last
    std::vector<std::vector<EmbeddingFix>> fixes;  ///< per window: the embeddings placed in it (each empty without embeddings)
};

/// A1111 tokenize_line: parses attention (unless disabled), tokenizes each run separately,
/// and fills 75-token chunks. A BREAK starts a new chunk. When a chunk is full and the next
/// token is not a comma, and the chunk's last comma (",</w>", id 267) is at most
/// comma_padding_backtrack tokens from its end, the tokens after that comma move to the next
/// chunk. Each chunk is padded with EOS to 75, framed as BOS + 75 + EOS, and every position after
/// the first EOS is set to pad_id (process_tokens). Weights are 1 for BOS/EOS/padding.
/// Extra-network tags must already be removed (extract_extra_networks). With options.embeddings,
/// a run of tokens spelling an embedding's name becomes `vectors` placeholder tokens (id 0) of
/// the run's weight, recorded in `fixes`; an embedding that does not fit in what is left of the
/// window starts the next one (A1111 tokenize_line). When the comma back-off moves tokens to the
/// next window, the embeddings among them move too (A1111 leaves their fixes behind, pointing at
/// padding: a quirk not reproduced). Throws what parse_prompt_attention throws, and
/// Error(InvalidInput) for chunk_length < 1 or an embedding longer than a window.
WeightedChunks tokenize_weighted(const ClipTokenizer& tokenizer, std::string_view prompt,
                                 const ChunkOptions& options = {});

/// The host inputs (see EmbeddingInputs) of window `chunk` of `c`: `vectors[i]` holds the
/// [n, width] vectors of embedding i. Throws Error(InvalidInput) when a fix names an embedding
/// without vectors of this width or runs past the window.
EmbeddingInputs embedding_inputs(const WeightedChunks& c, size_t chunk, const std::vector<const std::vector<float>*>& vectors,
                                 int64_t width);

/// A1111 "Original" emphasis on one chunk's text-encoder output, in place:
///   z <- z * multiplier[token];  z <- z * (mean(z_before) / mean(z_after))
/// z is [n_tokens, dim] row-major (ggml ne = [dim, n_tokens]); multipliers has n_tokens entries.
/// Means are over all n_tokens*dim values, accumulated in double. If the new mean is 0 the
/// rescale is skipped (A1111 would produce inf/NaN). Throws Error(InvalidInput) on size mismatch.
/// Source: modules/sd_emphasis.py EmphasisOriginal.after_transformers.
void apply_emphasis_original(std::span<float> z, size_t n_tokens, size_t dim, std::span<const float> multipliers);

}  // namespace easel::text
