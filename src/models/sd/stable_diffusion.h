// The SD1.x / SD2.x family: which files hold its modules, how a prompt becomes conditioning,
// the latent format, the prediction type and the default sampling settings.
//
// Modules: CLIP text encoder (SD1.x: OpenAI CLIP-L, SD2.x: OpenCLIP-H), UNet2DConditionModel,
// AutoencoderKL (or TAESD for decoding). Sources, in order of precedence: the explicit file
// flags (--diffusion-model, --vae, --taesd, --clip_l), then -m (a single file in the original
// ldm layout, a diffusers pipeline folder, or a GGUF).
//
// Conditioning recipe (A1111, which SD1.x users expect; identical to diffusers'
// StableDiffusionPipeline.encode_prompt for prompts without emphasis or BREAK and at most 75
// tokens): the prompt is parsed for attention syntax, tokenized into 77-token windows
// (BOS + 75 + EOS/pad), each window encoded separately, A1111's "Original" emphasis applied,
// and the windows concatenated along the sequence axis: context [1, 77*k, D].
#pragma once

#include "io/weight_index.h"
#include "models/clip/clip_text.h"
#include "models/sd/unet.h"
#include "models/vae/autoencoder_kl.h"
#include "models/vae/taesd.h"
#include "runtime/graph_runner.h"
#include "sampling/schedule.h"
#include "text/clip_tokenizer.h"

#include <memory>
#include <string>
#include <vector>

namespace easel::models::sd {

/// Which files to load. Empty strings are absent.
struct SDFiles {
    std::string model;            ///< -m: single file / GGUF / diffusers folder
    std::string diffusion_model;  ///< --diffusion-model
    std::string vae;              ///< --vae
    std::string taesd;            ///< --taesd
    std::string clip_l;           ///< --clip_l (the SD text encoder)
};

/// Load-time options.
struct SDOptions {
    ggml_backend_dev_t device = nullptr;   ///< nullptr: CPU
    int threads = 0;                        ///< CPU threads (<= 0: all)
    bool flash_attn_te = false;             ///< --fa
    bool flash_attn_diffusion = false;      ///< --fa or --diffusion-fa
    std::string weight_type;                ///< --type ("" keeps the stored types)
    std::string prediction;                 ///< --prediction override ("" = detect)
    bool need_encoder = false;              ///< load the VAE encoder (img2img, inpainting)
};

/// Prompt conditioning for the UNet: context [1, L, D] (row-major, D fastest; L = 77*k).
struct SDConditioning {
    std::vector<float> context;
    int64_t tokens = 0;  ///< L
    int64_t dim = 0;     ///< D
};

/// A loaded SD1.x/SD2.x model.
class StableDiffusion {
public:
    /// Loads every module needed for generation. Throws Error(ModelMismatch) when a file is
    /// not of this family (e.g. a VAE passed as -m) naming the slot and the fix, Error(Io) for
    /// unreadable files, Error(OutOfMemory) when weights do not fit.
    static std::unique_ptr<StableDiffusion> load(const SDFiles& files, const SDOptions& opt);
    ~StableDiffusion();

    /// "SD1.x" or "SD2.x" (+ " inpainting").
    std::string name() const;
    bool is_sd2() const { return sd2_; }
    bool is_inpaint() const { return unet_in_channels() == 9; }
    int64_t unet_in_channels() const;
    int64_t latent_channels() const { return 4; }
    /// Pixels per latent cell (8).
    int spatial_factor() const { return spatial_factor_; }
    /// 0.18215 (SD1.x/2.x); the KL latent is divided by it before decoding.
    float scaling_factor() const { return scaling_factor_; }
    /// The noise process: discrete betas from the scheduler config when given, else SD's.
    const sampling::ModelSampling& model_sampling() const { return *ms_; }
    /// Default clip skip (1 for SD1.x, 2 for SD2.x; sd.cpp's convention).
    int default_clip_skip() const { return sd2_ ? 2 : 1; }
    /// A short description of the weight sources, for logs.
    std::string describe() const;

    /// Encodes a prompt (A1111 syntax; LoRA tags must already be removed).
    SDConditioning encode_prompt(const std::string& prompt, int clip_skip);

    /// One UNet evaluation: x_in [N, Cin, H, W] latent (N = 1), timestep, context -> prediction
    /// [N, 4, H, W] written to out. Throws Error(InvalidInput) on size mismatch.
    void unet(const std::vector<float>& x_in, int64_t h, int64_t w, double timestep, const SDConditioning& cond,
              std::span<float> out);

    /// latent (UNet space, [1, 4, h, w]) -> image [1, 3, h*f, w*f] in about [-1, 1].
    vae::HostTensor decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling);
    /// image [1, 3, H, W] in [-1, 1] -> KL posterior (mean, logvar) in the raw KL space.
    vae::LatentDist encode(const vae::HostTensor& image, const vae::TilingOptions& tiling);
    bool uses_taesd() const { return taesd_ != nullptr; }

    /// Peak compute-buffer bytes measured per module so far ("te", "diffusion", "vae").
    size_t te_compute_bytes() const { return te_compute_; }
    size_t unet_compute_bytes() const { return unet_compute_; }
    /// Parameter bytes loaded per module.
    size_t te_param_bytes() const;
    size_t unet_param_bytes() const;
    size_t vae_param_bytes() const { return vae_param_bytes_; }

private:
    StableDiffusion() = default;

    bool sd2_ = false;
    int spatial_factor_ = 8;
    float scaling_factor_ = 0.18215f;
    int32_t pad_id_ = text::ClipTokenizer::kEos;
    std::unique_ptr<sampling::ModelSampling> ms_;
    std::string describe_;
    SDOptions opt_;

    std::vector<std::unique_ptr<io::WeightIndex>> indexes_;
    std::unique_ptr<runtime::GraphRunner> runner_;
    std::unique_ptr<clip::ClipTextModel> te_;
    nn::ParamBuffer te_params_;
    LoadedUNet unet_;
    std::unique_ptr<vae::AutoencoderKLModel> vae_;
    std::unique_ptr<vae::TinyAutoencoder> taesd_;
    size_t vae_param_bytes_ = 0;
    size_t te_compute_ = 0, unet_compute_ = 0;
};

}  // namespace easel::models::sd
