// Upscaling images with an ESRGAN model: `easel upscale`, sd-cli's `-M upscale`, and
// `--upscale-model` on generate / decode (each result upscaled before it is written).
//
// The network runs as the `upscaler` placement module (models/esrgan/placed_upscaler.h): on the device the
// placement flags give it (the default device otherwise), in tiles chosen from that device's
// budget unless --upscale-tile-size says otherwise, --upscale-repeats times in a row.
#pragma once

#include "io/weight_index.h"
#include "pipeline/image_io.h"
#include "placement/plan.h"
#include "placement/spec.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace easel::esrgan {
class PlacedUpscaler;
}

namespace easel::pipeline {

/// How to upscale.
struct UpscaleOptions {
    std::string model;       ///< --upscale-model: an ESRGAN / Real-ESRGAN file (.pth, .safetensors, ...)
    int repeats = 1;         ///< --upscale-repeats: passes (each on the previous result); >= 1
    /// --upscale-tile-size in input pixels: < 0 (default) chosen from the device budget, 0 the whole
    /// image at once (sd-cli's meaning), > 0 tiles of that size.
    int tile = -1;
    int threads = -1;        ///< CPU threads (<= 0: all)
    placement::PlacementFlags placement;  ///< the job's placement flags (their upscaler entry applies)
};

/// What one upscale() did.
struct UpscaleReport {
    int in_width = 0, in_height = 0, out_width = 0, out_height = 0;
    int tile = 0;           ///< tile of the last pass (0 = whole image)
    int tiles = 0;          ///< tiles run over all passes
    double seconds = 0;
    std::map<std::string, uint64_t> peaks;  ///< measured peak bytes per device so far
    uint64_t predicted = 0;                  ///< the plan's predicted bytes on the upscaler's device
};

/// An upscaler opened for a job (headers only until the first upscale()).
class ImageUpscaler {
public:
    /// Opens opt.model and checks that it is an upscaler; parses the placement flags. Throws
    /// Error(Io) for a missing file, Error(ModelMismatch) for a file that is not an upscaler (one
    /// line naming what it is), Error(InvalidInput) for repeats < 1 or bad placement flags.
    explicit ImageUpscaler(const UpscaleOptions& opt);
    ~ImageUpscaler();

    /// "RRDBNet x4 (23 blocks, ...)" and the file.
    std::string describe() const;
    /// Output pixels per input pixel of one pass.
    int scale() const;
    /// {width, height} after every pass. Throws Error(InvalidInput) when a side would pass
    /// kMaxOutputSide.
    std::pair<int64_t, int64_t> output_size(int64_t width, int64_t height) const;
    /// Checks before any work that the result of a width x height image fits host memory (the
    /// float output, the blend weights and the PNG bytes). Throws Error(OutOfMemory) with the
    /// numbers.
    void check_memory(int64_t width, int64_t height) const;
    /// The plan of the first pass over a width x height image (one tile's graph, the tile chosen
    /// as upscale() would), without loading: a row of `easel plan`.
    placement::ModulePlan plan(int64_t width, int64_t height, int* tile = nullptr);
    /// Upscales an RGB image (alpha, if any, is dropped with a warning by the callers that load
    /// files). Loads the weights on the first call. Throws as esrgan::PlacedUpscaler.
    Image upscale(const Image& in, UpscaleReport* report = nullptr, const std::function<void(int, int)>& on_tile = {});

    /// Largest output side accepted (pixels): 65536.
    static constexpr int64_t kMaxOutputSide = 65536;

private:
    UpscaleOptions opt_;
    std::unique_ptr<io::WeightIndex> index_;
    std::unique_ptr<esrgan::PlacedUpscaler> up_;
};

/// `easel upscale -i IN --upscale-model M [-o OUT] [--upscale-repeats N] [--upscale-tile-size T]`
/// (and `easel -M upscale ...`): loads the image (any format stb reads; alpha dropped with a
/// warning), upscales it and writes a PNG with a "postprocessing" text chunk (A1111's
/// "Postprocess upscaler: NAME, Postprocess upscale by: S"), through a temporary file. Checks the
/// output path and the memory first. Returns the report of the last pass.
UpscaleReport upscale_file(const std::string& input, const std::string& output, const UpscaleOptions& opt);

/// The A1111 "postprocessing" text of an upscale: "Postprocess upscaler: NAME, Postprocess upscale by: S".
std::string postprocessing_text(const ImageUpscaler& up, int repeats);

/// One log line after an upscale: sizes, tiles, time, measured peak per device beside the
/// prediction.
std::string format_upscale_report(const ImageUpscaler& up, const UpscaleReport& r);

}  // namespace easel::pipeline
