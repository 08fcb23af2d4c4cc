// `easel generate`: prompt (+ init image, mask) -> PNG files, over models::Family.
//
// generate() composes the stages of stages.h in one process: open the family (headers only),
// encode the prompts (or take them from --load-embeddings or the cache: then the text encoder
// is never opened), encode the init image (or --load-latent / the cache), denoise every image
// (checkpoints with --checkpoint-dir, --resume), decode, and write PNGs carrying A1111
// `parameters` metadata. Each stage loads only its modules, on one device (the first GPU,
// else the CPU), and frees them when done. run_stage() runs one stage alone with its files.
#pragma once

#include "pipeline/generate_params.h"
#include "pipeline/image_io.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace easel::models {
class Family;
}
namespace easel::sampling {
class Sampler;
}

namespace easel::pipeline {

/// What a finished generate() reports.
struct GenerateReport {
    std::vector<std::string> outputs;   ///< PNG paths written, in batch order
    int64_t seed = 0;                   ///< seed of the first image (after resolving -1)
    int width = 0, height = 0;          ///< pixels actually generated (after rounding)
    double load_s = 0;                  ///< seconds loading weights
    double te_s = 0;                    ///< seconds encoding prompts
    std::vector<double> step_s;         ///< seconds per denoising step (all images)
    double vae_s = 0;                   ///< seconds in VAE encode + decode
    std::string device;                 ///< device name the modules ran on
    size_t param_bytes = 0;             ///< parameter bytes loaded on that device
    size_t compute_peak_bytes = 0;      ///< largest measured compute buffer
    size_t host_peak_rss_bytes = 0;     ///< peak resident set size of the process
    /// Modules run under placement plans: the measured peak bytes per device over the job
    /// (Family::placement_peaks(); `device` and `param_bytes` then describe no single device);
    /// empty when nothing ran under a plan.
    std::map<std::string, uint64_t> placed_peak_bytes;
    bool interrupted = false;           ///< a StepFn stopped the sampling (fewer outputs than -b)
    bool conditioning_cached = false;   ///< the conditioning came from the cache
    double te_saved_s = 0;              ///< encode time the cache hit saved (as stored)
    double upscale_s = 0;               ///< seconds in the upscaler (--upscale-model)
    /// The upscaler's measured peak bytes per device (--upscale-model; its own stage after decode).
    std::map<std::string, uint64_t> upscale_peak_bytes;
};

/// Progress callback: (image index, step done (1-based), steps, seconds of that step).
using ProgressFn = std::function<void(int image, int step, int steps, double seconds)>;

/// What a StepFn sees after every denoising step (the step's checkpoint, if any, is being written
/// on a thread of its own meanwhile; it is on the disk once run() returns or throws).
struct StepInfo {
    int image = 0, images = 1;  ///< batch index and batch size
    int step = 0, steps = 0;    ///< steps done of this image (1-based) and its step count
    /// The sampler after the step: result() is the current latent [1, channels, h, w].
    const sampling::Sampler* sampler = nullptr;
    int64_t channels = 0, h = 0, w = 0;  ///< latent shape (cells)
};
/// Per-step hook of Generator::run: return false to stop sampling there (A1111's interrupt:
/// the current latent is decoded as this image's result, later images of the batch are not
/// made, GenerateReport::interrupted is set). An exception it throws leaves run() at once
/// (cancel, shutdown: the step's checkpoint is on the disk by then).
using StepFn = std::function<bool(const StepInfo&)>;

/// Options of a Generator.
struct GeneratorOptions {
    /// Modules stay loaded after their stage, for the next job (else each stage frees them).
    bool keep_loaded = false;
};

/// A model opened once that runs many jobs (`easel server`); generate() is a Generator running
/// one job. The family is opened (headers only) by open() or by the first run(); with
/// Options::keep_loaded the modules a stage loads stay loaded for the next job (the server
/// without placement flags), otherwise each stage frees them as generate() does. Not
/// thread-safe: one job at a time.
class Generator {
public:
    using Options = GeneratorOptions;
    /// `base`: the model, placement and execution flags every job shares. Opens nothing yet.
    explicit Generator(const GenerateParams& base, Options opt = {});
    ~Generator();
    Generator(const Generator&) = delete;
    Generator& operator=(const Generator&) = delete;

    /// Opens the family now and checks the job memory at width x height pixels (printing the
    /// placement plan of placed jobs); with keep_loaded it also loads te, diffusion and the VAE
    /// decoder. Throws as generate() (a model that cannot be opened, a plan that does not fit).
    void open(int width, int height);
    bool is_open() const;
    /// Runs one job. `params` must name the model and execution settings of base() (model
    /// files, --type, --prediction, --flow-shift, --guidance, --fa, -t, VAE tiling, placement):
    /// a job that differs is refused with Error(InvalidInput) naming the flag. Everything else
    /// (prompts, size, sampler, steps, seed, init image, mask, outputs, checkpoints) is the
    /// job's own. Throws as generate(), and whatever on_step throws.
    GenerateReport run(const GenerateParams& params, const ProgressFn& progress = {}, const StepFn& on_step = {});
    /// Decodes a diffusion-space latent [1, C, h, w] with the job's decoder (VAE or TAESD),
    /// e.g. for a live preview from a StepFn. Needs is_open().
    Image decode_preview(std::span<const float> latent, int64_t h, int64_t w);
    /// The open family (Error(Internal) before open()).
    models::Family& family();
    const GenerateParams& base() const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

/// The bundled demo model (models/demo/easel-demo-shapes.safetensors), looked up through
/// $EASEL_DEMO_MODEL, then beside the executable (build tree or install prefix), then the
/// current folder; empty if not found.
std::string find_demo_model();

/// The VAE tile side in latent cells a job's decode uses (--vae-tiling with --vae-tile-size X or
/// XxY: X), 0 without --vae-tiling; what models::FamilyOptions::vae_tile plans for. Throws
/// Error(InvalidInput) for a malformed --vae-tile-size.
int planned_vae_tile(const GenerateParams& p);

/// --vae-tiling's --vae-tile-size and --vae-tile-overlap checked (overlap in [0, 1), a tile that
/// still advances); nothing without --vae-tiling. Throws Error(InvalidInput) naming the flag and
/// the fix.
void check_vae_tiling(const GenerateParams& p);

/// The images a job encodes with the VAE encoder, {H, W} pixels as the files give them.
struct EncodeSizes {
    std::vector<std::pair<int64_t, int64_t>> init;        ///< -i (at most one)
    std::vector<std::pair<int64_t, int64_t>> references;  ///< -r, in order
};
/// The sizes of `p`'s -i and -r images (for models::FamilyOptions::vae_encode_sizes /
/// reference_sizes, so `easel plan` shows the encode stage as generate will run it). Reads the
/// images. Throws as load_image (Error(Io) / Error(InvalidInput)).
EncodeSizes encode_image_sizes(const GenerateParams& p);

/// Runs a generation job. Without -m/--diffusion-model the bundled demo model is used. Throws easel::Error (one-line messages) for bad input: unknown
/// sampler/scheduler/rng names, unreadable or wrong-kind model files, an unreadable init image,
/// a mask whose size differs from the init image, etc. Width and height that are not
/// multiples of the latent factor (8) are rounded down with a warning.
GenerateReport generate(const GenerateParams& params, const ProgressFn& progress = {});

/// The stages that run alone (`easel encode-prompt|encode-image|denoise|decode`, or
/// `--stage te-encode|llm-encode|vae-encode|diffuse|vae-decode`).
enum class Stage { EncodePrompt, EncodeImage, Denoise, Decode };
/// Parses a command name or a --stage alias. Throws Error(InvalidInput) listing the names.
Stage parse_stage(const std::string& name);
const char* stage_name(Stage s);

/// Runs one stage with its file flags:
///   EncodePrompt: -p/-n (+ model flags) -> --save-embeddings FILE (loads only the te)
///   EncodeImage:  -i IMAGE -> --save-latent FILE (the posterior; loads only the VAE encoder)
///   Denoise:      --load-embeddings FILE [--load-latent INIT] -> --save-latent OUT, with
///                 --checkpoint-dir DIR [--resume | --resume-step N] (loads only the diffusion model)
///   Decode:       --load-latent FILE -> -o OUT.png (loads only the VAE decoder / TAESD)
/// Returns the files written. Throws easel::Error: a missing required flag, a refused artifact
/// (truncated, edited, wrong kind, another model, another size), a checkpoint that does not
/// match the job (every difference named).
std::vector<std::string> run_stage(Stage stage, const GenerateParams& params, const ProgressFn& progress = {});

/// Checks an output path before any work: not empty, its folder exists and is writable (a probe
/// file is created there and removed), and the path is not a folder nor an existing non-regular
/// file (a device such as /dev/null or /dev/full, a FIFO: the writers put a temporary file next
/// to it and rename it over the target, which would replace the node). `flag` names the option in
/// the message. Throws Error(Io/InvalidInput).
void check_output_folder(const std::string& path, const char* flag);

/// The output path of image `index` of a batch: each %d, %Nd or %0Nd in `pattern` becomes
/// index+1 (printf's meaning, but replaced here: no other % conversion is interpreted, %% is %);
/// without one, image 0 is `pattern` and image i >= 1 is `<stem>_<i+1><ext>`. With `begin` >= 0
/// (sd-cli's --output-begin-idx) the numbers are begin + index, and without a %d every image of
/// a batch of count > 1 gets `<stem>_<begin+index><ext>` (a single image keeps `pattern`).
std::string batch_output_path(const std::string& pattern, int index, int count, int begin = -1);

}  // namespace easel::pipeline
