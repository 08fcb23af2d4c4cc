// The FLUX.1 family (schnell and dev): which files hold its modules, how a prompt becomes
// conditioning, the latent format, the noise process and the default sampling settings.
//
// Modules (diffusers' FluxPipeline, diffusers/pipelines/flux/pipeline_flux.py):
//   te         T5-XXL encoder (text_encoder_2, models::t5::T5Encoder) and CLIP-L (text_encoder,
//              models::clip::ClipTextModel, pooled output only)
//   diffusion  FluxTransformer2DModel (models::flux::FluxDiT); dev has a guidance embedder,
//              schnell has none (told apart from the weights)
//   vae        the 16-channel FLUX.1 AutoencoderKL (factor 8, scaling 0.3611, shift 0.1159)
// Sources, in order of precedence: the file flags (--diffusion-model, --t5xxl, --clip_l, --vae),
// then -m (a diffusers FluxPipeline folder with transformer/, text_encoder/, text_encoder_2/,
// vae/, scheduler/, model_index.json; or one weight file, safetensors or GGUF, that holds the
// DiT in the BFL / ComfyUI or diffusers layout and possibly the VAE and text encoders).
//
// Lazy loading: open() reads only headers (the DiT's and the VAE's); the text encoders' files
// are opened by load(Module::Te), which checks from their headers, before any weight is read or
// graph built, that --t5xxl holds a T5 encoder of the DiT's context width and --clip_l a CLIP
// text encoder of its pooled width (a CLIP given as --t5xxl, a Qwen3 LLM, a T5 given as
// --clip_l ... are refused naming what was found and what is expected).
//
// Conditioning recipe (FluxPipeline.encode_prompt): context = T5 last_hidden_state of the
// prompt tokenized with padding="max_length", max_length=512 (kFlux1T5Tokens), truncation
// (tokens, </s>, <pad>...), run WITHOUT an attention mask, so the padded positions are part of
// the context ([512, d_model]); pooled = CLIP pooler_output (final-layer-normed state at the
// first </s>) of the prompt in one 77-token window padded with </s>. No emphasis weights (the
// prompt text goes to both tokenizers as is, as in diffusers).
//
// Sequence (FluxPipeline.__call__): the latent [16, h, w] is packed 2x2 into (h/2)(w/2) tokens
// of 64 features (pack_latents), image ids (0, y, x), text ids zero; the DiT gets
// timestep = sigma (the schedule's t / 1000), dev also guidance = --guidance (x1000 inside),
// and predicts the flow velocity noise - x0 (used as is).
//
// Noise process: rectified flow, x = (1 - sigma) x0 + sigma noise. Schedules as the pipeline's
// FlowMatchEulerDiscreteScheduler configs: dev (use_dynamic_shifting) = scheduler `flux`
// (resolution-dependent mu, sampling::SchedulerKind::Flux, its base/max shift from a folder's
// scheduler_config.json); schnell (static shift 1.0) = `discrete` with the pipeline's sigmas
// linspace(1, 1/n, n). --flow-shift S makes the model's static shift S.
// CFG: FluxPipeline's true_cfg_scale s with a negative prompt (neg + s (pos - neg)) equals
// easel's --cfg-scale s; the default 1 runs no negative pass (dev's guidance is distilled).
#pragma once

#include "io/weight_index.h"
#include "models/clip/clip_text.h"
#include "models/family_base.h"
#include "models/flux/flux_dit.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/autoencoder_kl.h"

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace easel::models::flux {

/// FluxPipeline's max_sequence_length default: T5 tokens, padded and truncated to this.
inline constexpr int64_t kFlux1T5Tokens = 512;
/// FLUX.1 dev's default distilled guidance (FluxPipeline guidance_scale, sd-cli --guidance).
inline constexpr float kFlux1DefaultGuidance = 3.5f;

/// "T5-XXL (d_model 4096)" for the real width, else "a T5 encoder with d_model D".
std::string flux1_expected_t5(int64_t joint_dim);
/// "CLIP-L (hidden size 768)" for the real width, else "a CLIP text encoder with hidden size P".
std::string flux1_expected_clip(int64_t pooled_dim);

/// A FLUX.1 model bound to the user's files; modules load on demand.
class Flux1 final : public FamilyBase {
public:
    /// Resolves every module's source and reads the DiT's and the VAE's headers (no weights;
    /// nothing of the text encoders). Throws Error(ModelMismatch) when the diffusion model is not
    /// a FLUX.1 DiT, the VAE is not a 16-channel AutoencoderKL, or --llm is given (FLUX.1 takes
    /// T5-XXL and CLIP-L), naming the flag and the fix; Error(Io) for missing or unreadable
    /// files; Error(InvalidInput) for a bad --type, --flow-shift or --guidance.
    static std::unique_ptr<Flux1> open(const ModelFiles& files, const FamilyOptions& opt);
    ~Flux1() override;

    // models::Family
    std::string name() const override;  ///< "FLUX.1 dev" or "FLUX.1 schnell"
    bool uses_guidance() const override { return dcfg_.guidance_embeds; }  ///< dev: yes; schnell: no guidance embedder
    std::string describe() const override;
    /// 16 channels, factor 8, scaling/shift from the VAE config.json, else 0.3611 / 0.1159.
    LatentFormat latent_format() const override;
    /// 16: the VAE factor 8 times the 2x2 packing.
    int size_multiple() const override { return 2 * spatial_factor_; }
    /// ModelSampling::flow(shift): --flow-shift, else the scheduler config's static shift (only
    /// when it does not use dynamic shifting), else 1.0.
    const sampling::ModelSampling& model_sampling() const override;
    /// sd-cli: euler, CFG 1 (off), 1024x1024, no clip skip; dev: scheduler flux, 20 steps (sd-cli's
    /// default; FluxPipeline's is 28); schnell: discrete (= the pipeline's sigmas), 4 steps.
    SamplingDefaults defaults() const override;
    /// flow_pipeline_sigmas = true (sigmas linspace(1, 1/n, n)) and calculate_shift's
    /// parameters from scheduler_config.json (base_image_seq_len, max_image_seq_len,
    /// base_shift, max_shift) when a folder gives them.
    sampling::ScheduleOptions schedule_options() const override;
    /// context [512, d_model] = T5 last_hidden_state of the padded prompt, pooled [P] = CLIP
    /// pooler_output, token_ids = the 512 T5 ids. clip_skip is ignored.
    Conditioning encode_prompt(const std::string& prompt, int clip_skip) override;
    /// x: latent [16, h, w] (h, w even); concat must be empty; timestep = sigma * 1000;
    /// out: [16, h, w] flow velocity (noise - x0). Throws Error(InvalidInput) on size mismatches,
    /// Error(ModelMismatch) when the conditioning widths differ from the DiT's.
    void diffusion(std::span<const float> x, std::span<const float> concat, int64_t h, int64_t w, double timestep,
                   const Conditioning& cond, std::span<float> out) override;
    /// latent [1, 16, h, w] (diffusion space) -> image [1, 3, 8h, 8w]: z / scaling + shift, then
    /// the VAE decoder.
    vae::HostTensor decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) override;
    /// image [1, 3, H, W] in [-1, 1] -> raw posterior (before shift/scaling).
    vae::LatentDist encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) override;
    /// The DiT's configuration (from the headers).
    const FluxDiTConfig& dit_config() const { return dcfg_; }
    /// True for dev (guidance embedder present), false for schnell.
    bool has_guidance() const { return dcfg_.guidance_embeds; }
    /// The guidance value dev's embedder receives (FamilyOptions::guidance).
    float guidance() const { return guidance_; }

protected:
    /// The DiT ("dit"), CLIP-L ("clip_l", te 0) and T5 ("t5xxl", te 1) when their files are given.
    void lora_targets(LoraTargets& t) override;

private:
    Flux1(const ModelFiles& files, const FamilyOptions& opt);
    /// Registers the module slots. load(Te) refuses (Error(ModelMismatch)) --t5xxl (or the
    /// folder's text_encoder_2) without a T5 encoder of the DiT's context width, or --clip_l
    /// (text_encoder) without a CLIP text encoder of its pooled width; checked from headers before
    /// any weight is loaded. Costs: te = two entries of module te (one stage: they are loaded
    /// together), the T5 encoder at 512 tokens (kFlux1T5Tokens) and CLIP-L at one 77-token window
    /// (a text encoder without a file is left out); diffusion = the DiT for a latent of h x w
    /// cells ((h/2)(w/2) image tokens) and a 512-token context; vae = the AutoencoderKL decoder.
    void add_modules();
    /// FLUX.1 packs the latent 2x2: Error(InvalidInput) for odd sides.
    void check_planned_latent(int64_t h, int64_t w) const override;
    struct TeModels;   ///< T5 + CLIP, loaded
    struct PlacedTe;   ///< T5 + CLIP under FamilyOptions::placement (two PlacedSequences, stage te)
    struct DiTWhole;   ///< the DiT loaded whole
    struct PlacedDiT;  ///< the DiT under FamilyOptions::placement
    /// Opens (or reuses) the index of a text encoder file and checks it. Throws
    /// Error(ModelMismatch) naming the flag, what was found and what FLUX.1 expects.
    const io::WeightIndex& t5_headers(std::unique_ptr<io::WeightIndex>& own, t5::T5Keys& keys, t5::T5Config& cfg) const;
    const io::WeightIndex& clip_headers(std::unique_ptr<io::WeightIndex>& own, clip::ClipKeys& keys, clip::ClipConfig& cfg) const;

    float guidance_ = kFlux1DefaultGuidance;
    ModuleSource t5_src_, clip_src_;
    std::string model_desc_, shift_src_;

    FluxSource dsrc_;
    FluxDiTConfig dcfg_;
    std::optional<vae::KLSource> kl_;  ///< absent with --taesd and no --vae (decode only)
    int spatial_factor_ = 8;
    float scaling_factor_ = 0.3611f, shift_factor_ = 0.1159f;
    std::unique_ptr<sampling::ModelSampling> ms_;
    sampling::ScheduleOptions sched_opt_;

    // Module slots (owned by modules_).
    ModuleSlot<TeModels, PlacedTe>* te_ = nullptr;
    ModuleSlot<DiTWhole, PlacedDiT>* dit_ = nullptr;
};

}  // namespace easel::models::flux
