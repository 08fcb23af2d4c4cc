// The SDXL family (SDXL base and SDXL-style UNets such as SSD-1B / Vega, their configuration
// inferred from the weights): which files hold its modules, how a prompt becomes conditioning,
// the micro-conditioning, the latent format and the default sampling settings.
//
// Modules: two CLIP text encoders in one te slot (CLIP ViT-L/14 and OpenCLIP ViT-bigG/14 with its
// text projection), the UNet2DConditionModel with text_time conditioning (unet.h), the SDXL
// AutoencoderKL (scaling factor 0.13025) or TAESDXL for decoding. Sources, in order of
// precedence: the file flags (--diffusion-model, --vae, --taesd, --clip_l, --clip_g), then -m
// (an original single file with model.diffusion_model.*, first_stage_model.*,
// conditioner.embedders.0.transformer.* (CLIP-L) and conditioner.embedders.1.model.* (OpenCLIP-G);
// or a diffusers StableDiffusionXLPipeline folder: unet/, vae/, text_encoder/, text_encoder_2/).
//
// Conditioning (diffusers StableDiffusionXLPipeline.encode_prompt, with A1111's prompt syntax and
// 75-token windows as SD1.x): each window goes through both encoders; the context is
// concat(CLIP-L hidden_states[-k], OpenCLIP-G hidden_states[-k]) along the channels (no final
// layer norm; k = clip skip, default 2: the penultimate layer, diffusers' clip_skip None), with
// A1111's "Original" emphasis applied to each encoder's output separately (A1111 weights each
// embedder of its SDXL conditioner on its own); the pooled vector is OpenCLIP-G's text_embeds
// (text_projection of the final-normed state at the first window's EOS). Ids: CLIP-L's windows
// pad with <|endoftext|>, OpenCLIP-G's with "!" (id 0), as SDXL's tokenizer and tokenizer_2.
// An empty negative prompt becomes zeros (context and pooled) when the pipeline says
// force_zeros_for_empty_prompt (model_index.json; SDXL base's default, so also single files).
//
// Micro-conditioning (diffusers _get_add_time_ids with its defaults): time ids = (original
// height, original width, crop top, crop left, target height, target width) = (H, W, 0, 0, H, W)
// in pixels of the image being made.
#pragma once

#include "io/weight_index.h"
#include "models/clip/clip_text.h"
#include "models/family_base.h"
#include "models/sd/placed_unet.h"
#include "models/sd/unet.h"
#include "models/sd/unet_slot.h"
#include "sampling/schedule.h"
#include "text/clip_tokenizer.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace easel::models::sd {

/// An SDXL model bound to the user's files; modules load on demand.
class StableDiffusionXL final : public FamilyBase {
public:
    /// Resolves every module's source and reads the UNet's and the VAE's headers (no weights, and
    /// nothing of the text encoders when they are files of their own). Throws
    /// Error(ModelMismatch) when a file is not of this family naming the slot and the fix,
    /// Error(Unsupported) for the SDXL refiner (5 time ids) and in-painting UNets (not yet run),
    /// Error(Io) for missing or unreadable files, Error(InvalidInput) for a bad --type.
    static std::unique_ptr<StableDiffusionXL> open(const ModelFiles& files, const FamilyOptions& opt);
    ~StableDiffusionXL() override;

    std::string name() const override { return "SDXL"; }
    std::string describe() const override;
    LatentFormat latent_format() const override;
    /// Discrete betas (scaled_linear 0.00085..0.012, or the scheduler config's), eps prediction
    /// unless the scheduler config, a `v_pred` tensor, the file's prediction_type metadata or
    /// --prediction say v.
    const sampling::ModelSampling& model_sampling() const override { return *ms_; }
    /// The scheduler config's timestep_spacing and steps_offset; without one SDXL base's
    /// scheduler_config.json (leading spacing, steps offset 1), as diffusers' from_single_file.
    sampling::ScheduleOptions schedule_options() const override { return sched_opt_; }
    /// euler_a, discrete, 20 steps, CFG 7, clip skip 2 (penultimate), 1024 x 1024.
    SamplingDefaults defaults() const override;
    int64_t diffusion_in_channels() const override { return ucfg_.in_channels; }
    /// Conditioning: context [77k, D1 + D2], pooled [projection], token_ids / token_weights as
    /// SD1.x (CLIP-L's ids).
    Conditioning encode_prompt(const std::string& prompt, int clip_skip) override;
    /// Zeros shaped as `positive` (context and pooled) when the pipeline zeroes an empty negative
    /// prompt (force_zeros_for_empty_prompt), else nullopt.
    std::optional<Conditioning> empty_negative(const Conditioning& positive) const override;
    /// One UNet evaluation with time ids (8h, 8w, 0, 0, 8h, 8w) (pixels; the VAE factor) and the
    /// pooled vector of `cond`.
    void diffusion(std::span<const float> x, std::span<const float> concat, int64_t h, int64_t w, double timestep,
                   const Conditioning& cond, std::span<float> out) override;
    vae::HostTensor decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) override;
    vae::LatentDist encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) override;

    const UNetConfig& unet_config() const { return ucfg_; }
    /// The time ids diffusers passes for an image of height x width pixels with the default
    /// original size, crop and target size: {H, W, 0, 0, H, W}.
    static std::vector<float> default_time_ids(int64_t height, int64_t width);

private:
    StableDiffusionXL(const ModelFiles& files, const FamilyOptions& opt);

    /// Registers the te slot (both encoders), the UNet slot and the VAE.
    void add_modules();

    /// One text encoder's headers: its keys and configuration in `index`.
    struct TeHeaders {
        const io::WeightIndex* index = nullptr;
        clip::ClipKeys keys;
        clip::ClipConfig cfg;
    };
    /// Both encoders' headers (own1 / own2 hold indexes of files of their own), checked against
    /// the UNet: widths summing to its cross-attention width, G's projection = its pooled width.
    /// Throws Error(ModelMismatch) naming the flag and the fix.
    std::pair<TeHeaders, TeHeaders> te_headers(std::unique_ptr<io::WeightIndex>& own1, std::unique_ptr<io::WeightIndex>& own2) const;
    struct TeWhole;    ///< both text encoders loaded whole

    ModuleSource te1_src_, te2_src_;
    std::optional<nlohmann::json> sched_cfg_;
    std::filesystem::path tok1_special_, tok2_special_;  ///< tokenizer folders' special tokens (diffusers folder)
    std::string model_desc_;
    bool force_zeros_ = true;
    std::string force_zeros_src_ = "SDXL base default";

    UNetConfig ucfg_;
    std::optional<vae::KLSource> kl_;
    int spatial_factor_ = 8;
    float scaling_factor_ = 0.13025f;
    std::unique_ptr<sampling::ModelSampling> ms_;
    std::string pred_src_ = "SDXL default";
    sampling::ScheduleOptions sched_opt_;

    ModuleSlot<TeWhole>* te_ = nullptr;
    ModuleSlot<UNetWhole, PlacedUNet>* unet_ = nullptr;
    int32_t pad1_ = text::ClipTokenizer::kEos, pad2_ = text::ClipTokenizer::kOpenClipPad;
    std::string te_desc_;
};

}  // namespace easel::models::sd
