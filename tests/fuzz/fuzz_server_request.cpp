// libFuzzer target: the server's request parsers (src/server/job_request.h) on arbitrary bytes.
// The first byte picks the API; the rest is the body: a JSON body for the A1111 txt2img/img2img,
// OpenAI generations, sd.cpp img_gen and easel jobs parsers, or (OpenAI edits) multipart-like
// parts split at NUL bytes (name, then content, alternately). A malformed request must raise
// server::ApiError (a 4xx with the field named), nothing else: no other exception, no crash, no
// sanitizer report. Images in the bodies are probed from their headers (stb) before any decode.
#include "server/base64.h"
#include "server/job_request.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace easel::server;
    if (size < 1) return 0;
    Limits limits;
    limits.max_body_bytes = 1 << 20;
    limits.max_image_bytes = 1 << 20;
    limits.max_image_pixels = 1 << 20;
    const std::string_view body((const char*)data + 1, size - 1);
    try {
        switch (data[0] % 7) {
        case 0: (void)parse_a1111(parse_json_body(body, limits), false, limits); break;
        case 1: (void)parse_a1111(parse_json_body(body, limits), true, limits); break;
        case 2: (void)parse_openai_generation(parse_json_body(body, limits), limits); break;
        case 3: (void)parse_sdcpp_img_gen(parse_json_body(body, limits), limits); break;
        case 4: (void)parse_easel_job(parse_json_body(body, limits), limits); break;
        case 5: {
            std::vector<FormPart> parts;
            size_t at = 0;
            bool name = true;
            FormPart cur;
            for (size_t i = 0; i <= body.size(); ++i) {
                if (i < body.size() && body[i] != '\0') continue;
                const std::string_view piece = body.substr(at, i - at);
                if (name) {
                    cur = {};
                    cur.name = std::string(piece);
                    if (cur.name == "image" || cur.name == "mask") cur.filename = cur.name + ".png";
                } else {
                    cur.content = std::string(piece);
                    parts.push_back(cur);
                }
                name = !name;
                at = i + 1;
            }
            (void)parse_openai_edit(parts, limits);
            break;
        }
        default: {
            auto bytes = base64_decode(body, 1 << 20);
            if (bytes) {
                const std::string again = base64_encode(*bytes);
                auto round = base64_decode(again, 1 << 20);
                if (!round || *round != *bytes) __builtin_trap();  // encode/decode must round-trip
            }
            break;
        }
        }
    } catch (const ApiError&) {
    }
    return 0;
}
