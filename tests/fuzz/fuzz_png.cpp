// libFuzzer target: image files as easel reads them for -i / --mask / -r and for `easel inspect`
// (pipeline/image_io.h decode_image: stb_image, PNG, JPEG, BMP, ...) and the PNG text chunks
// with the A1111 infotext in them (pipeline/png_meta.h read_png_text, parse_infotext). The whole
// input is the file; the first byte also picks the channel count asked for (1-4).
#include "fuzz_common.h"

#include "pipeline/image_io.h"
#include "pipeline/png_meta.h"

using namespace easel;
using namespace easel::pipeline;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::span<const uint8_t> bytes(data, size);
    try {
        for (auto& c : read_png_text(bytes, "fuzz.png")) (void)parse_infotext(c.text);
    } catch (const Error&) {
    }
    try {
        const int channels = size ? 1 + data[0] % 4 : 3;
        Image img = decode_image(bytes, channels, "fuzz image");
        EASEL_FUZZ_CHECK(img.width > 0 && img.height > 0 && img.channels == channels);
        EASEL_FUZZ_CHECK(img.pixels.size() == (size_t)img.width * img.height * channels);
    } catch (const Error&) {
    }
    return 0;
}
