// Model family detection from tensor names and shapes (plus config.json / metadata when present).
//
// Works on both diffusers/transformers layouts and the original single-file layouts (LDM,
// BFL, ComfyUI), with or without prefixes such as model.diffusion_model., first_stage_model.,
// cond_stage_model., conditioner.embedders.N., text_encoders.<name>.. Rules are structural
// (which keys exist, how many blocks, which tensors are 2-D vs 4-D) so that tiny test models
// are detected like real ones; widths name a known variant only when they match a real one.
// The rules are listed in docs/formats.md.
#pragma once

#include "io/weight_index.h"

#include <nlohmann/json_fwd.hpp>

#include <map>
#include <string>
#include <vector>

namespace easel::io {

/// One module found inside a file (a single-file checkpoint holds several).
struct DetectedComponent {
    std::string role;    ///< "diffusion model", "VAE", "text encoder", "LoRA", "upscaler", "embedding", "other"
    std::string kind;    ///< machine tag: unet, mmdit, flux1, flux2, zimage, qwenimage, vae_kl, vae_flux2, taesd,
                         ///< clip, openclip, t5, llm, lora, esrgan, embedding, ema, other
    std::string prefix;  ///< stored-name prefix of its tensors ("" for a standalone file)
    std::string detail;  ///< human-readable: "CLIP-L (hidden 768, 12 layers)"
    uint64_t tensors = 0;
    uint64_t param_bytes = 0;  ///< stored bytes of its tensors
    int64_t params = 0;        ///< number of elements
};

/// What a file (or folder) holds.
struct Detection {
    /// "SD1.x", "SD2.x", "SDXL", "SD3", "FLUX.1", "FLUX.2", "Z-Image", "Qwen-Image", "SD VAE", "FLUX VAE",
    /// "FLUX.2 VAE", "TAESD", "CLIP text encoder", "OpenCLIP text encoder", "T5 encoder", "LLM text encoder",
    /// "LoRA", "ESRGAN upscaler", "Textual inversion", or "unknown".
    std::string family;
    std::string variant;  ///< "dev", "schnell", "inpaint", "refiner", "Klein 4B", "TAEF2 encoder", ...
    std::string layout;   ///< "diffusers", "original", "BFL", "ComfyUI", "kohya", "peft", "GGUF", ...
    std::vector<DetectedComponent> components;
    std::vector<std::string> notes;  ///< what could not be decided from weights, and why
};

/// Detects from an opened index (uses its metadata and config.json when present).
Detection detect(const WeightIndex& wi);

/// Detects from a (name, shape) list alone; `meta` and `config` are optional hints.
/// Never throws for unrecognised input: returns family "unknown" with notes.
Detection detect(const std::vector<TensorInfo>& tensors, const std::map<std::string, MetaValue>& meta = {},
                 const nlohmann::json* config = nullptr);

/// The model family a LoRA's tensor names (and a few widths) point to: "FLUX.1", "FLUX.2",
/// "Qwen-Image", "Z-Image", "SD3", "SD3 (transformer_blocks only)", "SDXL", "SD2.x", "SD1.x",
/// "Anima/Cosmos", "Krea 2" or "unknown model" (rules in docs/formats.md). What the names cannot
/// decide is added to `notes` when given.
std::string detect_lora_target(const std::vector<TensorInfo>& tensors, std::vector<std::string>* notes = nullptr);

}  // namespace easel::io
