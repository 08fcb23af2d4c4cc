// Generation metadata in PNG files: reading text chunks, and A1111 "infotext" (the
// `parameters` text that AUTOMATIC1111's webui, Forge, sd.cpp and easel write).
//
// Infotext layout (stable-diffusion-webui modules/processing.py create_infotext):
//   <prompt>
//   Negative prompt: <negative prompt>          (line omitted when the negative prompt is empty)
//   Steps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 7, Seed: 1, Size: 512x512, ...
// Settings are "Key: value" joined by ", "; a value containing ',', ':' or a newline is written
// as a JSON string (infotext_utils.quote). The field order A1111 uses is make_infotext's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace easel::pipeline {

/// One text chunk found in a PNG file.
struct PngTextChunk {
    std::string type;       ///< "tEXt", "zTXt" or "iTXt"
    std::string keyword;    ///< as stored (Latin-1 converted to UTF-8)
    std::string text;       ///< UTF-8 (see read_png_text for the decoding rule)
    bool after_idat = false;  ///< the chunk follows the image data (allowed by the PNG spec)
};

/// All tEXt/zTXt/iTXt chunks of a PNG, in file order, wherever they are (before or after IDAT).
/// tEXt/zTXt text is Latin-1 by the PNG spec, but some writers (sd.cpp) put raw UTF-8 there:
/// text that is valid UTF-8 is taken as UTF-8, anything else is decoded as Latin-1. iTXt text is
/// UTF-8 (compressed or not). CRCs are not checked; a chunk whose decompression fails is skipped.
/// Throws Error(Io) if the file cannot be read, Error(InvalidInput) if it is not a PNG
/// (empty, wrong signature, or a chunk running past the end of the file).
std::vector<PngTextChunk> read_png_text(const std::filesystem::path& path);
/// Same, on bytes in memory; `what` names the source in messages.
std::vector<PngTextChunk> read_png_text(std::span<const uint8_t> bytes, std::string_view what = "PNG data");

/// The text of the first chunk with this keyword, if any.
std::optional<std::string> find_png_text(std::span<const PngTextChunk> chunks, std::string_view keyword);

/// A parsed or to-be-written infotext.
struct Infotext {
    std::string prompt;
    std::string negative_prompt;
    /// Settings in order, values unquoted (JSON strings decoded), e.g. {"Steps", "20"}.
    std::vector<std::pair<std::string, std::string>> params;

    /// Value of a setting, if present.
    std::optional<std::string> get(std::string_view key) const;
    /// Replaces the value of `key`, or appends it.
    void set(std::string_view key, std::string value);
    /// A setting as a finite number (decimal text); nullopt if missing, not a number, or inf/nan.
    std::optional<double> number(std::string_view key) const;
    /// "Size: WxH" as {width, height}; nullopt if missing or malformed.
    std::optional<std::pair<int, int>> size() const;
};

/// A1111 infotext_utils.quote: the value itself, or a JSON string (non-ASCII kept as UTF-8)
/// if it contains ',', ':' or '\n'.
std::string infotext_quote(std::string_view value);

/// Formats an infotext exactly as create_infotext does: prompt, "\nNegative prompt: ..." when
/// the negative prompt is non-empty, "\n", then "Key: quoted value" joined by ", " (a setting
/// whose value equals its key is written as the key alone), and the whole text stripped of
/// surrounding whitespace.
std::string format_infotext(const Infotext& info);

/// Parses an infotext as A1111's parse_generation_parameters does: the last line is the
/// settings line if it holds at least 3 "Key: value" pairs, else it belongs to the prompt; lines
/// before "Negative prompt:" are the prompt, the rest the negative prompt (lines stripped,
/// joined with "\n"). Settings follow re_param = \s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)
/// with quoted values JSON-decoded, plus one extension: an unquoted value starting with '{' or
/// '[' extends to its matching bracket (JSON strings respected) when a ',' or the end follows,
/// so sd.cpp's "SDCPP: {json}" stays whole. Never throws; malformed text yields what matches.
Infotext parse_infotext(std::string_view text);

/// The settings of one generated image, in A1111's terms.
struct GenerationInfo {
    std::string prompt;
    std::string negative_prompt;
    int steps = 20;
    std::string sampler;        ///< A1111 display name ("Euler a"); see a1111_sampler_name
    std::string scheduler;      ///< A1111 "Schedule type" label ("Karras"); empty = omitted
    double cfg_scale = 7.0;
    std::optional<double> image_cfg_scale;
    int64_t seed = 0;
    int width = 512;
    int height = 512;
    std::string model_hash;     ///< A1111 short hash (first 10 hex of the file's sha256); empty = omitted
    std::string model;          ///< model name (file stem); empty = omitted
    std::string vae_hash;       ///< empty = omitted
    std::string vae;            ///< empty = omitted
    std::optional<double> denoising_strength;  ///< img2img strength
    int clip_skip = 1;          ///< written only when > 1 (A1111)
    std::string rng;            ///< A1111 "RNG" ("CPU", "NV"); written only when not empty
    /// Further settings (e.g. "Lora hashes", "Guidance"), written after the fixed fields and before Version.
    std::vector<std::pair<std::string, std::string>> extra;
    std::string version;        ///< default "easel <EASEL_VERSION>" when empty
};

/// The infotext of `g`, with A1111's field order: Steps, Sampler, Schedule type, CFG scale,
/// Image CFG scale, Seed, Size, Model hash, Model, VAE hash, VAE, Denoising strength, Clip skip,
/// RNG, extra..., Version. Numbers are written in shortest round-trip form (7 -> "7", 7.5 -> "7.5").
Infotext make_infotext(const GenerationInfo& g);

/// A1111's "Lora hashes" value (extensions-builtin/Lora/extra_networks_lora.py): "name: hash"
/// per LoRA, joined by ", ", each name as the prompt mentioned it with ':' and ',' removed and
/// its short hash (lora::a1111_short_hash); entries without a name or hash are left out, a name
/// given twice keeps its last hash. Goes into GenerationInfo::extra as {"Lora hashes", value}
/// (make_infotext quotes it, since it holds ':' and ',').
std::string lora_hashes_value(const std::vector<std::pair<std::string, std::string>>& name_hash);

/// A1111 display name of a sampler given by its sd.cpp / easel --sampling-method name
/// (euler -> "Euler", euler_a -> "Euler a", heun -> "Heun", dpm2 -> "DPM2", dpm++2s_a -> "DPM++ 2S a",
/// dpm++2m -> "DPM++ 2M", lcm -> "LCM", ddim_trailing -> "DDIM", ...); unknown names are returned unchanged.
std::string a1111_sampler_name(std::string_view method);
/// Inverse of a1111_sampler_name ("Euler a" -> "euler_a"), also accepting sd.cpp names as they
/// are ("euler_a") and sd.cpp's saved names; nullopt when unknown.
std::optional<std::string> sampler_from_a1111_name(std::string_view name);
/// A1111 "Schedule type" label of a --scheduler name (karras -> "Karras", exponential ->
/// "Exponential", sgm_uniform -> "SGM Uniform", simple -> "Simple", discrete -> "Normal",
/// ays -> "Align Your Steps", kl_optimal -> "KL Optimal", ...); unknown names unchanged.
std::string a1111_scheduler_name(std::string_view scheduler);

}  // namespace easel::pipeline
