// The hires fix (A1111's "Hires. fix", sd-cli's --hires*): a txt2img first pass at -W x -H, its
// latent upscaled (latent interpolation, or decode -> pixel upscaler -> encode), then an img2img
// second pass at the larger size. The pipeline code that runs the passes is in generate.cpp (the
// same Family calls as every stage); this file holds the pieces with no model in them: the
// upscaler names, the target size, latent interpolation (torch.nn.functional.interpolate's
// formulas), pixel resizes, the second pass's schedule cut and the infotext fields.
//
// Conventions (A1111 modules/processing.py StableDiffusionProcessingTxt2Img, which sd.cpp follows):
//  - target: int(W * scale) x int(H * scale), or hr_resize_x / hr_resize_y (one given: the other
//    from the aspect ratio; both: upscaled to cover the target, the latent then centre-cropped),
//    rounded down to the model's size multiple;
//  - "Hires steps" N (0: --steps) are the steps the second pass runs: the schedule has
//    int(N / min(strength, 0.999)) steps and the pass runs its last N (A1111
//    sd_samplers_common.setup_img2img_steps with steps given; sd.cpp make_hires_sigma_schedule);
//  - the second pass of image b uses the first pass's seed (seed + b) again: its noise is the
//    first draw of that seed at the new size (latent upscalers), after the encoded image's
//    posterior sample (pixel upscalers: easel's img2img draw order, as sd.cpp);
//  - the same prompts, sampler, scheduler, CFG scale and eta as the first pass.
#pragma once

#include "pipeline/image_io.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace easel::pipeline {

struct GenerateParams;

/// torch.nn.functional.interpolate modes of A1111's latent upscalers.
enum class LatentInterp { Nearest, NearestExact, Bilinear, Bicubic };

/// What a hires upscaler name means.
struct HiresUpscaler {
    enum class Kind { Latent, Lanczos, Nearest, Model } kind = Kind::Latent;
    LatentInterp mode = LatentInterp::Bilinear;  ///< Kind::Latent
    bool antialias = false;                      ///< Kind::Latent
    std::string name;                            ///< as A1111 writes it ("Latent", "Lanczos", a model's file stem)
    std::string model_path;                      ///< Kind::Model: the ESRGAN / Real-ESRGAN file
    bool is_latent() const { return kind == Kind::Latent; }
};

/// The built-in names, in sd.cpp's order: Latent, Latent (nearest), Latent (nearest-exact),
/// Latent (antialiased), Latent (bicubic), Latent (bicubic antialiased), Lanczos, Nearest.
std::vector<std::string> builtin_hires_upscalers();

/// Resolves --hires-upscaler / A1111's hr_upscaler: a built-in name (case-insensitive; Latent
/// modes as A1111's shared.latent_upscale_modes), else an upscaler model: NAME.{pth,pt,
/// safetensors,ckpt,bin} in `models_dir` (--hires-upscalers-dir), the --upscale-model file whose
/// stem is NAME, or an existing file path. "None" is not resolved here (the callers decide: sd-cli
/// turns the hires fix off, A1111 resizes with Lanczos). Throws Error(InvalidInput) naming the
/// choices.
HiresUpscaler resolve_hires_upscaler(const std::string& name, const std::string& models_dir, const std::string& upscale_model);

/// The second pass's size.
struct HiresTarget {
    int up_width = 0, up_height = 0;  ///< pixels the first pass's result is upscaled to (covers the target)
    int width = 0, height = 0;        ///< final pixels (after the centre crop)
    int crop_x = 0, crop_y = 0;       ///< latent cells cut from the left / top (the rest from the right / bottom)
    std::string info_key, info_value; ///< "Hires upscale", "2" or "Hires resize", "1024x1024"
};

/// The target of a W x H first pass (A1111 calculate_target_resolution): resize_x/resize_y 0 ->
/// int(W * scale) x int(H * scale); else as hr_resize_x / hr_resize_y. Sizes are rounded down to
/// `multiple` pixels (the model's size multiple; f = its latent factor divides it). Throws
/// Error(InvalidInput) for a scale <= 0 with no size, negative sizes, or a target side outside
/// [multiple, 16384].
HiresTarget hires_target(int W, int H, double scale, int resize_x, int resize_y, int multiple, int f);

/// torch.nn.functional.interpolate(x, size=(oh, ow), mode, align_corners=False, antialias) of a
/// latent [C, h, w] (row-major, w fastest) in float: nearest (floor(dst * in/out)), nearest-exact
/// (floor((dst + 0.5) * in/out)), bilinear and bicubic (A = -0.75, clamped taps) from the source
/// index in/out * (dst + 0.5) - 0.5, and with antialias the separable triangle / cubic (a = -0.5)
/// filters of _upsample_*_aa (support widened when downscaling; width pass, then height). Returns
/// [C, oh, ow]. Throws Error(InvalidInput) on empty sizes.
std::vector<float> interpolate_latent(std::span<const float> x, int64_t C, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                      LatentInterp mode, bool antialias);

/// Cuts a [C, h, w] latent to [C, h - cy0 - cy1, w - cx0 - cx1] keeping rows cy0.. and columns cx0...
std::vector<float> crop_latent(std::span<const float> x, int64_t C, int64_t h, int64_t w, int64_t cx0, int64_t cy0, int64_t cw, int64_t ch);

/// PIL's Image.resize(..., NEAREST) of an 8-bit image: source pixel floor((dst + 0.5) * in/out).
Image resize_nearest_pil(const Image& in, int w, int h);
/// PIL's Image.resize(..., LANCZOS) of an 8-bit image (models::flux::pil_lanczos_resize).
Image resize_lanczos_pil(const Image& in, int w, int h);

/// The second pass's schedule: `schedule_steps` steps of which the last `run` are run (start =
/// schedule_steps - run). steps = hires steps (0: the first pass's), strength = denoising
/// strength in (0, 1]. A1111: schedule_steps = int(steps / min(strength, 0.999)), run = steps.
struct HiresSchedule {
    int schedule_steps = 0, run = 0, start = 0;
};
HiresSchedule hires_schedule(int steps, double strength);

/// The A1111 infotext fields of a hires job, after "Denoising strength" (which GenerationInfo
/// writes): {"Hires upscale", "2"} or {"Hires resize", "WxH"}, {"Hires steps", N} (only when
/// --hires-steps was given, > 0), {"Hires upscaler", name}.
std::vector<std::pair<std::string, std::string>> hires_infotext_fields(const HiresTarget& t, int hires_steps, const HiresUpscaler& up);

/// What a planner needs of a --hires job (easel plan, --auto-fit): the second pass's size and
/// whether its upscale encodes an image (pixel and model upscalers: the VAE encoder runs at
/// target.up_width x target.up_height). Nothing when p.hires is off or --hires-upscaler None turns
/// it off (sd-cli). W x H: the first pass's (rounded) size; multiple, f: the family's size
/// multiple and latent factor. Throws as check_hires_flags, resolve_hires_upscaler and hires_target.
struct HiresPassSize {
    HiresUpscaler up;
    HiresTarget target;
    bool encodes = false;
};
std::optional<HiresPassSize> hires_pass_size(const GenerateParams& p, int W, int H, int multiple, int f);

/// The hires settings of a job checked (nothing when p.hires is false): strength in (0, 1], steps
/// >= 0, scale > 0 without a size, sizes >= 0, --hires-sigmas parsed (>= 2 values). Throws
/// Error(InvalidInput) naming the flag.
void check_hires_flags(const GenerateParams& p);

}  // namespace easel::pipeline
