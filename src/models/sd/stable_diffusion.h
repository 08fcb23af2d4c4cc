// The SD1.x / SD2.x family: which files hold its modules, how a prompt becomes conditioning,
// the latent format, the prediction type and the default sampling settings.
//
// Modules: CLIP text encoder (SD1.x: OpenAI CLIP-L, SD2.x: OpenCLIP-H), UNet2DConditionModel,
// AutoencoderKL (or TAESD for decoding). Sources, in order of precedence: the explicit file
// flags (--diffusion-model, --vae, --taesd, --clip_l), then -m (a single file in the original
// ldm layout, a diffusers pipeline folder, or a GGUF).
//
// Lazy loading (models::Family): open() reads only headers: the UNet's (its configuration
// decides SD1.x vs SD2.x and in-painting) and the VAE's (latent factor, scaling factor). The
// text encoder's file is not even opened until load(Module::Te), so a cached conditioning
// never touches it. Each module has its own weights and its own GraphRunner on its device
// (FamilyOptions::te_device / diffusion_device / vae_device) and is freed by unload().
//
// Conditioning recipe (A1111, which SD1.x users expect; identical to diffusers'
// StableDiffusionPipeline.encode_prompt for prompts without emphasis or BREAK and at most 75
// tokens): the prompt is parsed for attention syntax, tokenized into 77-token windows
// (BOS + 75 + EOS/pad), each window encoded separately, A1111's "Original" emphasis applied,
// and the windows concatenated along the sequence axis: context [77*k, D].
#pragma once

#include "io/weight_index.h"
#include "models/clip/clip_text.h"
#include "models/family_base.h"
#include "models/sd/unet.h"
#include "models/sd/unet_slot.h"
#include "models/vae/autoencoder_kl.h"
#include "models/sd/placed_unet.h"
#include "sampling/schedule.h"
#include "text/clip_tokenizer.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace easel::models::sd {

/// An SD1.x/SD2.x model bound to the user's files; modules load on demand.
class StableDiffusion final : public FamilyBase {
public:
    /// Resolves every module's source and reads the UNet's and the VAE's headers (no weights,
    /// and nothing of the text encoder). Throws Error(ModelMismatch) when a file is not of this
    /// family (e.g. a VAE passed as -m) naming the slot and the fix, Error(Io) for missing or
    /// unreadable files, Error(InvalidInput) for a bad --type.
    static std::unique_ptr<StableDiffusion> open(const ModelFiles& files, const FamilyOptions& opt);
    ~StableDiffusion() override;

    // models::Family
    std::string name() const override;  ///< "SD1.x" or "SD2.x" (+ " inpainting")
    std::string describe() const override;
    LatentFormat latent_format() const override;
    /// The noise process: discrete betas from the scheduler config when given, else SD's. For an
    /// SD2.x file without a scheduler config the prediction type (eps or v) is found by a test
    /// evaluation of the UNet, which loads Module::Diffusion on the first call.
    ///
    /// Zero terminal SNR (ModelSampling::discrete's zero_terminal_snr): a diffusers folder's
    /// scheduler_config.json rescale_betas_zero_snr, or a `ztsnr` tensor in a single file. The
    /// prediction of a single file: a `v_pred` tensor (v), else its prediction_type /
    /// modelspec.prediction_type metadata, else eps (SD1.x) or the test evaluation (SD2.x);
    /// FamilyOptions::prediction overrides all of them.
    const sampling::ModelSampling& model_sampling() const override;
    /// The scheduler config's timestep_spacing and steps_offset (diffusers folders); the
    /// defaults (linspace, 1) otherwise.
    sampling::ScheduleOptions schedule_options() const override { return sched_opt_; }
    SamplingDefaults defaults() const override;
    int64_t diffusion_in_channels() const override { return ucfg_.in_channels; }
    /// Conditioning: context [77k, D], token_ids [77k] (the ids the encoder saw, padded) and
    /// token_weights [77k] (A1111 emphasis, all 1 without emphasis); no pooled vector or mask.
    /// Prompt -> conditioning. Textual-inversion names (set_embeddings) in the prompt's tokens
    /// take the embeddings' vectors after the token embedding layer (text/embeddings.h).
    Conditioning encode_prompt(const std::string& prompt, int clip_skip) override;
    /// Textual-inversion embeddings (--embd-dir) the prompts may name from now on; those without
    /// vectors of the text encoder's width are never matched (as A1111). Empty: none.
    void set_embeddings(std::vector<text::Embedding> embeddings) { embeddings_ = std::move(embeddings); }
    void diffusion(std::span<const float> x, std::span<const float> concat, int64_t h, int64_t w, double timestep,
                   const Conditioning& cond, std::span<float> out) override;
    vae::HostTensor decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) override;
    vae::LatentDist encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) override;

    /// SD2.x: the OpenCLIP-H context width 1024, or (any width) a UNet whose transformers use
    /// Linear projections, which ldm's SD2.x configs set (use_linear_in_transformer) and SD1.x's
    /// do not; so SD2-style models of other sizes get SD2's defaults (clip skip, prediction test).
    bool is_sd2() const { return ucfg_.context_dim == 1024 || uses_linear_projection(ucfg_); }
    bool is_inpaint() const { return ucfg_.in_channels == 9; }
    bool uses_taesd() const { return decodes_with_taesd(); }

protected:
    /// The UNet ("unet") and the CLIP text encoder ("clip_l" / "openclip_h", te 0); the model is
    /// described by its cross-attention (context) width.
    void lora_targets(LoraTargets& t) override;

private:
    StableDiffusion(const ModelFiles& files, const FamilyOptions& opt);
    /// The KeyMap component name of the text encoder: "openclip_h" (SD2.x), else "clip_l".
    std::string te_lora_component() const { return is_sd2() ? "openclip_h" : "clip_l"; }

    /// Registers the module slots (te: the CLIP text encoder for one 77-token window at the
    /// default clip skip when costed; diffusion: the UNet for a batch-1 evaluation with a
    /// 77-token context; the VAE with its decoder costed at the job's latent, or TAESD).
    void add_modules();
    void detect_prediction();
    /// The text encoder's headers: its weight index (`own` holds it when it is a file of its
    /// own), the CLIP keys and configuration (config.json overrides applied; its width checked
    /// against the UNet's). Throws Error(ModelMismatch) naming the flag and the fix.
    const io::WeightIndex& te_headers(std::unique_ptr<io::WeightIndex>& own, clip::ClipKeys& keys, clip::ClipConfig& cfg) const;
    /// Sets the pad id and the description of the text encoder just loaded (keys, cfg).
    void te_loaded(const clip::ClipKeys& keys, const clip::ClipConfig& cfg);
    struct TeWhole;    ///< the CLIP text encoder loaded whole
    /// The CLIP text encoder truncated to clip skip k (context = its last_hidden_state) under
    /// the placement spec; rebuilt when k changes.
    struct PlacedTe;

    // Sources (resolved at open).
    ModuleSource te_src_;
    std::optional<nlohmann::json> sched_cfg_;
    std::filesystem::path tokenizer_special_;  ///< special_tokens_map.json of a diffusers folder
    std::string model_desc_;
    /// The text encoder comes from a transformers-layout folder (diffusers' text_encoder/): its
    /// conversion already dropped OpenCLIP's last layer for SD2.x, so the default clip skip is 1.
    bool te_pre_truncated_ = false;

    // Header-level facts.
    UNetConfig ucfg_;
    std::optional<vae::KLSource> kl_;
    int spatial_factor_ = 8;
    float scaling_factor_ = 0.18215f;
    mutable std::unique_ptr<sampling::ModelSampling> ms_;
    mutable bool pred_pending_ = false;  ///< prediction to be found by a test evaluation
    std::string pred_src_;
    double beta_start_ = 0.00085, beta_end_ = 0.012;
    bool zsnr_ = false;            ///< betas rescaled to zero terminal SNR
    std::string zsnr_src_;         ///< where zsnr_ came from (for describe())
    sampling::ScheduleOptions sched_opt_;

    // Module slots (owned by modules_) and what loading the text encoder found.
    ModuleSlot<TeWhole, PlacedTe>* te_ = nullptr;
    ModuleSlot<UNetWhole, PlacedUNet>* unet_ = nullptr;
    int32_t pad_id_ = text::ClipTokenizer::kEos;
    std::string te_desc_;
    std::vector<text::Embedding> embeddings_;  ///< set_embeddings
};

}  // namespace easel::models::sd
