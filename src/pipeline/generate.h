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

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

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
    bool conditioning_cached = false;   ///< the conditioning came from the cache
    double te_saved_s = 0;              ///< encode time the cache hit saved (as stored)
    double upscale_s = 0;               ///< seconds in the upscaler (--upscale-model)
    /// The upscaler's measured peak bytes per device (--upscale-model; its own stage after decode).
    std::map<std::string, uint64_t> upscale_peak_bytes;
};

/// Progress callback: (image index, step done (1-based), steps, seconds of that step).
using ProgressFn = std::function<void(int image, int step, int steps, double seconds)>;

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
/// without one, image 0 is `pattern` and image i >= 1 is `<stem>_<i+1><ext>`.
std::string batch_output_path(const std::string& pattern, int index, int count);

}  // namespace easel::pipeline
