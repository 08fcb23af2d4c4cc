// Image files in and out: decoding (PNG, JPEG, BMP, TGA, GIF first frame, PSD, HDR, PNM via
// stb_image) and PNG encoding with text chunks (libpng). Pixels are 8-bit, interleaved.
//
// stb_image is compiled privately into image_io.cpp (STB_IMAGE_STATIC); Debian's libstb-dev
// also ships a prebuilt libstb, which easel does not link, so no symbols can clash.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace easel::pipeline {

/// An 8-bit image, row-major interleaved: pixels[(y * width + x) * channels + c],
/// i.e. [H, W, C] (ggml ne = [C, W, H]). channels is 1 (gray), 2 (gray+alpha), 3 (RGB) or 4 (RGBA).
struct Image {
    int width = 0;
    int height = 0;
    int channels = 0;
    std::vector<uint8_t> pixels;
};

/// One PNG text chunk to write. Values are UTF-8.
struct PngTextEntry {
    std::string keyword;  ///< 1-79 Latin-1 characters, no leading/trailing/double spaces (PNG spec)
    std::string text;     ///< UTF-8
};

/// Decodes an image file into `channels` channels (1-4; stb converts, e.g. RGBA -> RGB drops
/// alpha, gray -> RGB replicates). Throws Error(Io) if the file cannot be read and
/// Error(InvalidInput) if it is empty or not a decodable image (message names the file and
/// stb's reason).
Image load_image(const std::filesystem::path& path, int channels = 3);

/// Width, height and channel count of encoded image bytes, read from the header only (no pixel
/// is decoded: a server checks an upload's size before decoding it).
struct ImageInfo {
    int width = 0, height = 0, channels = 0;
};
/// Throws Error(InvalidInput) naming `what` when the bytes are empty or not a supported image.
ImageInfo probe_image(std::span<const uint8_t> bytes, std::string_view what = "image");

/// Same as load_image on bytes in memory; `what` names the source in error messages.
Image decode_image(std::span<const uint8_t> bytes, int channels = 3, std::string_view what = "image");

/// Encodes a PNG (8-bit, deflate) with the given text chunks before the image data. Each text
/// is written the way PIL's PngInfo.add_text does (what A1111 uses): a tEXt chunk when it
/// is representable in Latin-1 (converted to Latin-1 bytes), otherwise an uncompressed iTXt
/// chunk holding UTF-8. Throws Error(InvalidInput) for a bad image shape, a keyword that is
/// empty, longer than 79 bytes or not Latin-1, or text that is not valid UTF-8.
std::vector<uint8_t> encode_png(const Image& image, std::span<const PngTextEntry> texts = {});

/// encode_png written atomically to `path` (platform::write_file_atomic: temporary file, fsync,
/// rename, fsync of the folder). Throws Error(Io) with one line if the file cannot be written
/// (the previous file is kept, no temporary file remains), plus encode_png's errors.
void save_png(const std::filesystem::path& path, const Image& image, std::span<const PngTextEntry> texts = {});

/// Largest JPEG comment (COM segment payload): 65535 - 2 length bytes.
inline constexpr size_t kMaxJpegComment = 65533;

/// Encodes a baseline JPEG (stb_image_write; 4:2:0 below quality 90, 4:4:4 from 90) of a gray or
/// RGB image (an alpha channel is dropped) at `quality` 1..100; a non-empty `comment` is written
/// as a COM segment right after SOI (what `exiftool -Comment` and PIL's info["comment"] read).
/// Throws Error(InvalidInput) for a bad shape, a quality outside 1..100 or a comment longer than
/// kMaxJpegComment bytes.
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 90, std::string_view comment = {});

/// The file formats easel writes images in.
enum class ImageFormat { Png, Jpeg };
/// The format of an output path, from its extension (case-insensitive): .jpg / .jpeg / .jpe:
/// JPEG; .png or no extension: PNG (as sd-cli). Throws Error(Unsupported) for any other
/// extension (.webp, .bmp, out.v2 ...: no writer for it in this build), naming the formats that
/// are written.
ImageFormat output_format(const std::filesystem::path& path);

/// output_format(path) checked before a job runs, for the output named by `flag` ("-o"): throws
/// its Error(Unsupported); a name without an extension gets one warning (PNG is written under
/// that name).
ImageFormat check_output_path(const std::filesystem::path& path, const char* flag);

/// Writes `image` atomically in output_format(path): PNG with `texts` as text chunks (save_png),
/// or JPEG at quality 90 with the "parameters" text (A1111's infotext) as its comment (cut to
/// kMaxJpegComment bytes). Throws output_format's, encode_png's / encode_jpeg's and save_png's errors.
void save_image(const std::filesystem::path& path, const Image& image, std::span<const PngTextEntry> texts = {});

/// Planar float copy of an image: [C, H, W] (ggml ne = [W, H, C]), value v/255 mapped linearly
/// to [lo, hi] (lo=0, hi=1 gives [0, 1]; lo=-1, hi=1 gives the VAE input range).
std::vector<float> image_to_planar(const Image& image, float lo = 0.0f, float hi = 1.0f);

/// Inverse of image_to_planar: data is [C, H, W] (ggml ne = [W, H, C]); each value is mapped
/// from [lo, hi] to [0, 255], clamped and rounded to nearest (as diffusers' numpy_to_pil:
/// (x * 255).round()). NaN becomes 0. Throws Error(InvalidInput) if data.size() != C*H*W or
/// the shape is invalid.
Image image_from_planar(std::span<const float> data, int width, int height, int channels, float lo = 0.0f,
                        float hi = 1.0f);

}  // namespace easel::pipeline
