#include "pipeline/image_io.h"

#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "text/unicode.h"

#include <png.h>

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // stbi__refill_buffer, inlined (stb's, not ours)
#endif
#endif
#include <stb_image.h>
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#endif
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include <cctype>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <system_error>

namespace easel::pipeline {
namespace {

std::vector<uint8_t> read_file(const std::filesystem::path& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        fail(ErrorKind::InvalidInput, "{} is a folder, not an image: pass an image file (PNG, JPEG, BMP, ...)", platform::path_utf8(path));
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(ErrorKind::Io, "cannot open image {}; check that the file exists and is readable", platform::path_utf8(path));
    f.seekg(0, std::ios::end);
    const auto size = static_cast<size_t>(f.tellg());
    f.seekg(0);
    std::vector<uint8_t> data(size);
    if (size && !f.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(size)))
        fail(ErrorKind::Io, "cannot read image {}", platform::path_utf8(path));
    return data;
}

void check_shape(int width, int height, int channels, size_t n, const char* what) {
    if (width <= 0 || height <= 0 || channels < 1 || channels > 4)
        fail(ErrorKind::InvalidInput, "{}: image is {}x{} with {} channels; need positive size and 1-4 channels", what,
             width, height, channels);
    if (n != static_cast<size_t>(width) * height * channels)
        fail(ErrorKind::InvalidInput, "{}: image {}x{}x{} needs {} values, got {}", what, width, height, channels,
             static_cast<size_t>(width) * height * channels, n);
}

// UTF-8 -> Latin-1 bytes if every code point is <= 0xFF.
std::optional<std::string> to_latin1(std::string_view utf8) {
    std::string out;
    for (char32_t c : text::utf8_decode(utf8)) {
        if (c > 0xFF) return std::nullopt;
        out.push_back(static_cast<char>(c));
    }
    return out;
}

struct PngWriteState {
    std::vector<uint8_t>* out;
    std::string error;
};

void png_write_cb(png_structp png, png_bytep data, png_size_t len) {
    auto* st = static_cast<PngWriteState*>(png_get_io_ptr(png));
    st->out->insert(st->out->end(), data, data + len);
}
void png_flush_cb(png_structp) {}
void png_error_cb(png_structp png, png_const_charp msg) {
    auto* st = static_cast<PngWriteState*>(png_get_error_ptr(png));
    st->error = msg ? msg : "unknown libpng error";
    png_longjmp(png, 1);
}
void png_warning_cb(png_structp, png_const_charp) {}

// The libpng part of encode_png, kept free of C++ objects so that longjmp cannot skip a
// destructor or clobber one. Returns false (st->error set) when libpng reports an error.
bool png_encode_raw(PngWriteState* st, png_text* chunks, int n_chunks, png_bytep* rows, int width, int height,
                    int color_type) {
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, st, png_error_cb, png_warning_cb);
    if (!png) {
        st->error = "libpng could not allocate a PNG writer";
        return false;
    }
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_write_struct(&png, nullptr);
        st->error = "libpng could not allocate a PNG info struct";
        return false;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return false;
    }
    png_set_write_fn(png, st, png_write_cb, png_flush_cb);
    png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8, color_type,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (n_chunks > 0) png_set_text(png, info, chunks, n_chunks);
    png_write_info(png, info);
    png_write_image(png, rows);
    png_write_end(png, nullptr);
    png_destroy_write_struct(&png, &info);
    return true;
}

}  // namespace

Image decode_image(std::span<const uint8_t> bytes, int channels, std::string_view what) {
    if (channels < 1 || channels > 4)
        fail(ErrorKind::InvalidInput, "cannot decode {} into {} channels; use 1 to 4", what, channels);
    if (bytes.empty()) fail(ErrorKind::InvalidInput, "{} is empty (0 bytes); give a PNG, JPEG or BMP file", what);
    if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
        fail(ErrorKind::InvalidInput, "{} is too large ({} bytes) to decode", what, bytes.size());
    int w = 0, h = 0, n = 0;
    stbi_uc* px = stbi_load_from_memory(bytes.data(), static_cast<int>(bytes.size()), &w, &h, &n, channels);
    if (!px)
        fail(ErrorKind::InvalidInput, "cannot decode {}: {} (supported: PNG, JPEG, BMP, TGA, GIF, PSD, HDR, PNM)", what,
             stbi_failure_reason() ? stbi_failure_reason() : "unknown format");
    Image img;
    img.width = w;
    img.height = h;
    img.channels = channels;
    img.pixels.assign(px, px + static_cast<size_t>(w) * h * channels);
    stbi_image_free(px);
    return img;
}

ImageInfo probe_image(std::span<const uint8_t> bytes, std::string_view what) {
    if (bytes.empty()) fail(ErrorKind::InvalidInput, "{} is empty (0 bytes); give a PNG, JPEG or BMP file", what);
    if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
        fail(ErrorKind::InvalidInput, "{} is too large ({} bytes) to decode", what, bytes.size());
    ImageInfo info;
    if (!stbi_info_from_memory(bytes.data(), static_cast<int>(bytes.size()), &info.width, &info.height, &info.channels))
        fail(ErrorKind::InvalidInput, "cannot read {}: {} (supported: PNG, JPEG, BMP, TGA, GIF, PSD, HDR, PNM)", what,
             stbi_failure_reason() ? stbi_failure_reason() : "unknown format");
    return info;
}

Image load_image(const std::filesystem::path& path, int channels) {
    const auto data = read_file(path);
    return decode_image(data, channels, platform::path_utf8(path));
}

std::vector<uint8_t> encode_png(const Image& image, std::span<const PngTextEntry> texts) {
    check_shape(image.width, image.height, image.channels, image.pixels.size(), "encode_png");
    // Prepare every text chunk before libpng starts (no C++ objects are created after setjmp).
    std::vector<std::string> keys, values;
    std::vector<int> compression;
    for (const auto& t : texts) {
        const auto key = to_latin1(t.keyword);
        if (t.keyword.empty() || !key || key->size() > 79)
            fail(ErrorKind::InvalidInput, "PNG text keyword '{}' must be 1-79 Latin-1 characters", t.keyword);
        if (!text::utf8_valid(t.text))
            fail(ErrorKind::InvalidInput, "PNG text '{}' is not valid UTF-8", t.keyword);
        keys.push_back(*key);
        if (auto l1 = to_latin1(t.text)) {
            values.push_back(*l1);
            compression.push_back(PNG_TEXT_COMPRESSION_NONE);
        } else {
            values.push_back(t.text);
            compression.push_back(PNG_ITXT_COMPRESSION_NONE);
        }
    }
    std::vector<png_text> chunks(texts.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
        chunks[i] = png_text{};
        chunks[i].compression = compression[i];
        chunks[i].key = keys[i].data();
        chunks[i].text = values[i].data();
        if (compression[i] == PNG_TEXT_COMPRESSION_NONE)
            chunks[i].text_length = values[i].size();
        else
            chunks[i].itxt_length = values[i].size();
    }
    std::vector<png_bytep> rows(image.height);
    for (int y = 0; y < image.height; ++y)
        rows[y] = const_cast<png_bytep>(image.pixels.data() + static_cast<size_t>(y) * image.width * image.channels);
    static constexpr int kColorType[5] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                                          PNG_COLOR_TYPE_RGB_ALPHA};
    std::vector<uint8_t> out;
    PngWriteState st{&out, {}};
    if (!png_encode_raw(&st, chunks.data(), static_cast<int>(chunks.size()), rows.data(), image.width, image.height,
                        kColorType[image.channels]))
        fail(ErrorKind::InvalidInput, "PNG encoding failed: {}", st.error);
    return out;
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality, std::string_view comment) {
    check_shape(image.width, image.height, image.channels, image.pixels.size(), "encode_jpeg");
    if (quality < 1 || quality > 100) fail(ErrorKind::InvalidInput, "JPEG quality {} is outside 1..100", quality);
    if (comment.size() > kMaxJpegComment)
        fail(ErrorKind::InvalidInput, "JPEG comment of {} bytes is longer than a COM segment holds ({})", comment.size(), kMaxJpegComment);
    std::vector<uint8_t> out;
    auto sink = [](void* ctx, void* data, int size) {
        auto* v = static_cast<std::vector<uint8_t>*>(ctx);
        v->insert(v->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
    };
    // stb writes gray (1) and RGB (3); 2 and 4 channels lose their alpha (JPEG has none)
    if (!stbi_write_jpg_to_func(sink, &out, image.width, image.height, image.channels, image.pixels.data(), quality) || out.size() < 2)
        fail(ErrorKind::Internal, "stb_image_write could not encode a {}x{} JPEG", image.width, image.height);
    if (!comment.empty()) {
        // COM segment (ITU T.81 B.2.4.5): FF FE, a 2-byte big-endian length counting itself, the bytes; right after SOI
        const size_t len = comment.size() + 2;
        std::vector<uint8_t> com = {0xFF, 0xFE, (uint8_t)(len >> 8), (uint8_t)(len & 0xFF)};
        com.insert(com.end(), comment.begin(), comment.end());
        out.insert(out.begin() + 2, com.begin(), com.end());
    }
    return out;
}

ImageFormat output_format(const std::filesystem::path& path) {
    std::string ext = platform::path_utf8(path.extension());
    for (auto& c : ext) c = (char)std::tolower((unsigned char)c);
    if (ext == ".jpg" || ext == ".jpeg" || ext == ".jpe") return ImageFormat::Jpeg;
    if (ext.empty() || ext == ".png") return ImageFormat::Png;
    // an image format easel does not write (.bmp, .webp, ...) or a name such as out.v2: refused
    // rather than a PNG under a name that says otherwise
    static const std::pair<const char*, const char*> known[] = {{".webp", "WebP"}, {".bmp", "BMP"},  {".gif", "GIF"},  {".tif", "TIFF"},
                                                                {".tiff", "TIFF"}, {".avif", "AVIF"}, {".heic", "HEIC"}, {".jxl", "JPEG XL"}};
    std::string kind = "\"" + ext + "\"";
    for (auto [e, name] : known)
        if (ext == e) kind = name;
    fail(ErrorKind::Unsupported, "{}: this build has no {} writer: name the output .png (PNG, the parameters in its text chunks) or .jpg/.jpeg (JPEG)",
         platform::path_utf8(path), kind);
}

ImageFormat check_output_path(const std::filesystem::path& path, const char* flag) {
    const ImageFormat f = output_format(path);
    if (path.extension().empty())
        log::warn("{} {}: no file extension: writing PNG under that name (name it .png, or .jpg/.jpeg for JPEG)", flag, platform::path_utf8(path));
    return f;
}

void save_image(const std::filesystem::path& path, const Image& image, std::span<const PngTextEntry> texts) {
    if (output_format(path) == ImageFormat::Png) return save_png(path, image, texts);
    std::string comment;
    for (const auto& t : texts)
        if (t.keyword == "parameters") comment = t.text;
    if (comment.size() > kMaxJpegComment) comment.resize(kMaxJpegComment);  // (a prompt of over 65 KB: its start is kept)
    platform::write_file_atomic(path, encode_jpeg(image, 90, comment));
}

void save_png(const std::filesystem::path& path, const Image& image, std::span<const PngTextEntry> texts) {
    const auto bytes = encode_png(image, texts);
    // Atomic: a crash or a full disk leaves the previous file (or none), never half a PNG.
    platform::write_file_atomic(path, bytes);
}

std::vector<float> image_to_planar(const Image& image, float lo, float hi) {
    check_shape(image.width, image.height, image.channels, image.pixels.size(), "image_to_planar");
    const size_t hw = static_cast<size_t>(image.width) * image.height;
    std::vector<float> out(hw * image.channels);
    const float scale = (hi - lo) / 255.0f;
    for (size_t p = 0; p < hw; ++p)
        for (int c = 0; c < image.channels; ++c)
            out[c * hw + p] = lo + scale * image.pixels[p * image.channels + c];
    return out;
}

Image image_from_planar(std::span<const float> data, int width, int height, int channels, float lo, float hi) {
    check_shape(width, height, channels, data.size(), "image_from_planar");
    if (!(hi != lo)) fail(ErrorKind::InvalidInput, "image_from_planar: value range [{}, {}] is empty", lo, hi);
    Image img;
    img.width = width;
    img.height = height;
    img.channels = channels;
    const size_t hw = static_cast<size_t>(width) * height;
    img.pixels.resize(hw * channels);
    for (size_t p = 0; p < hw; ++p)
        for (int c = 0; c < channels; ++c) {
            float v = (data[c * hw + p] - lo) / (hi - lo) * 255.0f;
            if (std::isnan(v)) v = 0;
            v = std::min(255.0f, std::max(0.0f, v));
            img.pixels[p * channels + c] = static_cast<uint8_t>(std::lround(v));
        }
    return img;
}

}  // namespace easel::pipeline
