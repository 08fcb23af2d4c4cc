// libFuzzer target: the A1111 prompt syntax (text/prompt_syntax.h): extra-network tags
// (<lora:name:0.8>), attention brackets and weights, BREAK, and the 75-token chunking over the
// built-in CLIP tokenizer. The first byte sets the chunking options; the rest is the prompt.
#include "fuzz_common.h"

#include "text/clip_tokenizer.h"
#include "text/prompt_syntax.h"

using namespace easel;
using namespace easel::text;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::Reader r{data, size};
    const uint8_t opt = r.byte();
    const std::string_view prompt = r.rest();
    try {
        PromptTags tags = extract_extra_networks(prompt);
        auto runs = parse_prompt_attention(tags.text);
        EASEL_FUZZ_CHECK(!runs.empty());
        ChunkOptions o;
        o.parse_attention = (opt & 1) == 0;
        o.comma_padding_backtrack = (opt >> 1) % 32;
        o.chunk_length = 1 + (opt >> 6) * 37;  // 1, 38, 75, 112
        o.pad_id = (opt & 2) ? 0 : ClipTokenizer::kEos;
        auto chunks = tokenize_weighted(ClipTokenizer::builtin(), tags.text, o);
        EASEL_FUZZ_CHECK(chunks.ids.size() == chunks.weights.size() && !chunks.ids.empty());
        for (size_t c = 0; c < chunks.ids.size(); ++c) {
            EASEL_FUZZ_CHECK(chunks.ids[c].size() == (size_t)o.chunk_length + 2);
            EASEL_FUZZ_CHECK(chunks.weights[c].size() == (size_t)o.chunk_length + 2);
        }
    } catch (const Error&) {
    }
    return 0;
}
