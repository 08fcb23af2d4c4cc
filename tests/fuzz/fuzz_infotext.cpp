// libFuzzer target: the A1111 infotext parser (pipeline/png_meta.h parse_infotext, which never
// throws) on arbitrary text, and its writer: a parsed infotext formatted again (format_infotext)
// must parse to the same prompt, negative prompt and settings when the input was itself written
// by format_infotext (the round trip is checked on format_infotext's own output).
#include "fuzz_common.h"

#include "pipeline/png_meta.h"

using namespace easel;
using namespace easel::pipeline;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text((const char*)data, size);
    Infotext a = parse_infotext(text);
    try {
        const std::string once = format_infotext(a);
        const std::string twice = format_infotext(parse_infotext(once));
        // formatting is a fixed point after one parse
        EASEL_FUZZ_CHECK(format_infotext(parse_infotext(twice)) == twice);
    } catch (const Error&) {
    }
    return 0;
}
