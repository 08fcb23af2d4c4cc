// `easel generate`: prompt (+ init image, mask) -> PNG files, for the SD1.x/SD2.x family.
//
// Steps: load the model's modules on one device (the first GPU, else the CPU), encode the
// prompt and the negative prompt, draw the initial noise with the chosen RNG, sample, decode
// with the VAE (or TAESD) and write PNGs carrying A1111 `parameters` metadata.
#pragma once

#include "pipeline/generate_params.h"

#include <functional>
#include <string>
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
};

/// Progress callback: (image index, step done (1-based), steps, seconds of that step).
using ProgressFn = std::function<void(int image, int step, int steps, double seconds)>;

/// The bundled demo model (models/demo/easel-demo-shapes.safetensors), looked up through
/// $EASEL_DEMO_MODEL, then beside the executable (build tree or install prefix), then the
/// current folder; empty if not found.
std::string find_demo_model();

/// Runs a generation job. Without -m/--diffusion-model the bundled demo model is used. Throws easel::Error (one-line messages) for bad input: unknown
/// sampler/scheduler/rng names, unreadable or wrong-kind model files, an unreadable init image,
/// a mask whose size differs from the init image, etc. Width and height that are not
/// multiples of the latent factor (8) are rounded down with a warning.
GenerateReport generate(const GenerateParams& params, const ProgressFn& progress = {});

/// The output path of image `index` of a batch: printf-style %d in `pattern` gets index+1;
/// otherwise image 0 is `pattern` and image i >= 1 is `<stem>_<i+1><ext>`.
std::string batch_output_path(const std::string& pattern, int index, int count);

}  // namespace easel::pipeline
