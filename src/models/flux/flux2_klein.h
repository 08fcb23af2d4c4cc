// The FLUX.2 [klein] family (4B and 9B, distilled and base): which files hold its modules, how a
// prompt becomes conditioning, how reference images join the sequence, the latent format, the
// noise process and the default sampling settings.
//
// Modules (diffusers' Flux2KleinPipeline, diffusers/pipelines/flux2/pipeline_flux2_klein.py):
//   te         Qwen3 (klein 4B: Qwen3-4B, hidden 2560; klein 9B: Qwen3-8B, hidden 4096),
//              models::qwen3::Qwen3TextEncoder
//   diffusion  Flux2Transformer2DModel (models::flux::Flux2DiT), no guidance embedder
//   vae        AutoencoderKLFlux2 (32 latent channels, factor 8, BatchNorm statistics of the
//              2x2-patchified latent, models/flux/flux2_vae.h), or TAEF2 for decoding (--taesd)
// Sources, in order of precedence: the file flags (--diffusion-model, --llm, --vae, --taesd), then
// -m (a diffusers pipeline folder with transformer/, text_encoder/, vae/, scheduler/, tokenizer/,
// model_index.json; or one weight file, safetensors or GGUF, in the BFL / ComfyUI layout).
//
// Conditioning recipe (Flux2KleinPipeline._get_qwen3_prompt_embeds): the prompt is wrapped in
// Qwen3's chat template for one user message with add_generation_prompt=True and
// enable_thinking=False,
//   "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
// tokenized, truncated to 512 tokens and padded to 512 with <|endoftext|> (151643, right
// padding); the text encoder runs over all 512 positions with the padding mask (a padded
// position attends to the real tokens, positions 0..511), and the context is hidden_states 9,
// 18 and 27 stacked per token along the features: [512, 3 x hidden]. The padded positions stay
// in the context (the transformer attends to all 512 text tokens, without a mask).
//
// Sequence (Flux2KleinPipeline.__call__): image tokens = the 2x2-patchified, BatchNorm-normalised
// latent [128, H/16, W/16] packed row-major, position ids (0, y, x, 0); text ids (0, 0, 0, l);
// reference images (edit mode, -r): each is centre-cropped to multiples of 16 pixels (after a
// Lanczos resize to 1024x1024 pixels' area when larger), VAE-encoded (posterior mean),
// patchified, normalised and packed, with ids (10 + 10 i, y, x, 0), and appended after the
// image tokens; the prediction is read from the first (H/16)(W/16) output tokens.
//
// Noise process: rectified flow, x = (1 - sigma) x0 + sigma noise; schedule `flux2`: sigmas
// linspace(1, 1/n, n) shifted with mu = compute_empirical_mu(image tokens, n) (exponential time
// shift); the transformer gets t = sigma (timestep / 1000) and predicts the velocity noise - x0.
// CFG (base models): pred = neg + g (pos - neg) with the negative prompt "" (diffusers has no
// negative prompt argument; easel's -n defaults to ""), on when g > 1 = easel's --cfg-scale g.
// The distilled models (model_index.json is_distilled = true, and single files, which carry no
// such flag) default to 4 steps without CFG; the base models to 50 steps with CFG 4.
#pragma once

#include "io/weight_index.h"
#include "models/family_base.h"
#include "models/flux/flux2_dit.h"
#include "models/flux/flux2_vae.h"
#include "models/qwen3/qwen3.h"
#include "models/vae/autoencoder_kl.h"

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace easel::text {
class QwenTokenizer;
}

namespace easel::models::flux {

/// Flux2KleinPipeline's max_sequence_length: the prompt is truncated and padded to this length.
inline constexpr int64_t kKleinPromptTokens = 512;
/// The Qwen3 hidden-state indices the pipeline stacks (text_encoder_out_layers).
inline constexpr int kKleinTextLayers[3] = {9, 18, 27};
/// _prepare_image_ids: reference image i gets time coordinate kKleinRefTimeScale * (i + 1).
inline constexpr float kKleinRefTimeScale = 10.0f;
/// Reference images larger than this many pixels are resized to about this area first.
inline constexpr int64_t kKleinMaxRefPixels = 1024 * 1024;

/// What a transformer of context width `joint_dim` expects: "Qwen3-4B (hidden size 2560)" for
/// 7680, "Qwen3-8B (hidden size 4096)" for 12288, else "a Qwen3 text encoder with hidden size
/// joint_dim/3".
std::string klein_expected_text_encoder(int64_t joint_dim);

/// The token ids and padding mask the pipeline feeds Qwen3 for a prompt: chat template
/// (enable_thinking=False), tokenized with `tok`, truncated to kKleinPromptTokens, then padded
/// with <|endoftext|> to kKleinPromptTokens. ids and mask01 get kKleinPromptTokens entries each
/// (mask 1 = real token); returns the number of real tokens.
int64_t klein_prompt_tokens(const text::QwenTokenizer& tok, const std::string& prompt, std::vector<int32_t>& ids,
                            std::vector<int32_t>& mask01);

/// PIL's Image.resize(..., LANCZOS) on 8-bit RGB: separable Lanczos-3 resampling with antialiasing
/// support, fixed-point coefficients (22 fractional bits) and rounding to 8 bits after each pass
/// (Pillow libImaging/Resample.c; the horizontal pass first). pixels: [H, W, C] interleaved
/// bytes. Returns [h, w, C]. Throws Error(InvalidInput) on empty sizes.
std::vector<uint8_t> pil_lanczos_resize(std::span<const uint8_t> pixels, int W, int H, int C, int w, int h);

/// Flux2KleinPipeline's reference-image preprocessing on an image [1, 3, H, W] in [-1, 1] (as
/// image_to_planar makes from 8-bit pixels): when H*W > kKleinMaxRefPixels, Lanczos resize to
/// sqrt(kKleinMaxRefPixels / (H W)) times each side (int of the product; pil_lanczos_resize on
/// the 8-bit values), then a centre crop to multiples of `multiple` (left = (W - w)//2, top =
/// (H - h)//2). Throws Error(InvalidInput) when a side is below 64 pixels or the aspect ratio
/// exceeds 8 (Flux2ImageProcessor.check_image_input).
vae::HostTensor klein_prepare_reference(const vae::HostTensor& image, int multiple);
/// The size checks of klein_prepare_reference (diffusers' Flux2ImageProcessor.check_image_input)
/// alone, for a W x H pixel reference image: both sides >= 64, aspect ratio <= 8:1.
/// Throws Error(InvalidInput).
void klein_check_reference_size(int64_t W, int64_t H);

/// Reference tokens of edit mode: the packed diffusion latents of every reference image, one
/// after the other, and their position ids (_prepare_image_ids with scale 10).
struct KleinReferences {
    std::vector<float> tokens;  ///< [count, channels] row-major
    std::vector<float> ids;     ///< [count, 4] row-major: (10 (i + 1), y, x, 0)
    int64_t count = 0;
    int64_t channels = 0;
};

/// Packs diffusion latents [1, C, h_i, w_i] (normalised, patchified) into KleinReferences.
/// Throws Error(InvalidInput) when the channel counts differ or a latent is not a single image.
KleinReferences klein_pack_references(std::span<const vae::HostTensor> latents);

/// A FLUX.2 [klein] model bound to the user's files; modules load on demand.
class Flux2Klein final : public FamilyBase {
public:
    /// Resolves every module's source and reads the headers of the transformer and the VAE (no
    /// weights; nothing of the text encoder). Throws Error(ModelMismatch) when the diffusion
    /// model is not a FLUX.2 transformer, is FLUX.2 [dev] (Mistral text encoder, guidance
    /// embedder), or the VAE is not a FLUX.2 VAE (naming the flag and the fix), Error(Io) for
    /// missing files, Error(InvalidInput) for a bad --type.
    static std::unique_ptr<Flux2Klein> open(const ModelFiles& files, const FamilyOptions& opt);
    ~Flux2Klein() override;

    // models::Family
    std::string name() const override;  ///< "FLUX.2 Klein"
    std::string describe() const override;
    /// channels = the transformer's in_channels (128), spatial factor = VAE factor x 2 (16),
    /// scaling 1, shift 0: the latent easel samples is the patchified, normalised one.
    LatentFormat latent_format() const override;
    int size_multiple() const override { return latent_format().spatial_factor; }
    /// ModelSampling::flow(shift) with the scheduler config's shift (3.0); the flux2 schedule
    /// replaces it with its resolution-dependent shift.
    const sampling::ModelSampling& model_sampling() const override;
    /// euler, flux2, 1024x1024; distilled: 4 steps, CFG 1; base: 50 steps, CFG 4.
    SamplingDefaults defaults() const override;
    /// flow_pipeline_sigmas (sigmas linspace(1, 1/n, n) as the pipeline passes them).
    sampling::ScheduleOptions schedule_options() const override;
    /// context [512, 3 x hidden] (see the file comment), token_ids [512] (padding included), no
    /// mask (the transformer attends to every position). clip_skip is ignored.
    Conditioning encode_prompt(const std::string& prompt, int clip_skip) override;
    /// x: latent [128, h, w]; timestep = sigma * 1000; out: [128, h, w] velocity (noise - x0).
    /// Reference tokens (set_reference_images) join the sequence. Throws Error(InvalidInput) on
    /// size mismatches, Error(ModelMismatch) when the conditioning width differs from the
    /// transformer's context width.
    void diffusion(std::span<const float> x, std::span<const float> concat, int64_t h, int64_t w, double timestep,
                   const Conditioning& cond, std::span<float> out) override;
    /// latent [1, 128, h, w] -> de-normalise, unpatchify -> [1, 32, 2h, 2w] -> VAE (or TAEF2)
    /// decoder -> image [1, 3, 16h, 16w].
    vae::HostTensor decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) override;
    /// image [1, 3, H, W] in [-1, 1] -> posterior in the diffusion space (scaling 1, shift 0):
    /// mean = normalise(patchify(VAE mean)), logvar = patchify(logvar) - log(running_var + eps).
    vae::LatentDist encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) override;
    /// Edit mode: encodes each image (klein_prepare_reference, VAE encoder mean, patchify,
    /// normalise) and keeps the packed tokens for every later diffusion() call; an empty list
    /// clears them. Loads VaeEncoder (the caller may unload it afterwards).
    void set_reference_images(std::span<const vae::HostTensor> images) override;
    void check_reference_image(int width, int height) const override;
    /// The transformer's configuration (from the headers).
    const Flux2DiTConfig& dit_config() const { return dcfg_; }
    /// True when model_index.json says is_distilled (single files: assumed true).
    bool distilled() const { return distilled_; }
    /// The reference tokens set by set_reference_images().
    const KleinReferences& references() const { return refs_; }
    /// The BatchNorm statistics of the VAE (read at open).
    const Flux2LatentStats& latent_stats() const { return stats_; }

protected:
    /// The transformer ("dit") and the Qwen3 text encoder ("qwen3", te 0) when its file is given.
    void lora_targets(LoraTargets& t) override;

private:
    Flux2Klein(const ModelFiles& files, const FamilyOptions& opt);
    /// Registers the module slots. load(Te) refuses (Error(ModelMismatch)) a file that holds no
    /// Qwen3 model, one whose hidden size x 3 differs from the transformer's context width (naming
    /// the expected encoder), or one with fewer than 27 layers; checked from headers, before any
    /// weight is read or any graph built. Costs: te = Qwen3 built with 27 layers
    /// (kKleinTextLayers[2]: hidden_states 9, 18 and 27 are raw layer outputs, the last one the
    /// state after its last block), 512 tokens with the padding mask; diffusion = the transformer
    /// for a latent of h x w cells and a 512-token context (plus the reference tokens set so far);
    /// vae = the AutoencoderKL decoder (or TAEF2) on the unpatchified 2h x 2w VAE latent.
    void add_modules();
    /// Error(InvalidInput) for an empty latent.
    void check_planned_latent(int64_t h, int64_t w) const override;
    /// The init image sizes and the reference images at the size klein_prepare_reference encodes them.
    std::vector<std::pair<int64_t, int64_t>> encode_sizes() const override;
    const text::QwenTokenizer& tokenizer() const;
    const io::WeightIndex& te_headers(std::unique_ptr<io::WeightIndex>& own, qwen3::Qwen3Keys& keys, qwen3::Qwen3Config& cfg) const;
    vae::HostTensor vae_encode_mean(const vae::HostTensor& image, const vae::TilingOptions& tiling, vae::HostTensor* logvar);
    struct PlacedTe;   ///< Qwen3 under FamilyOptions::placement
    struct DiTWhole;   ///< the transformer loaded whole
    struct PlacedDiT;  ///< the transformer under FamilyOptions::placement

    ModuleSource te_src_;
    std::string tokenizer_json_;
    std::string model_desc_;
    bool distilled_ = true;
    std::string distilled_src_;

    Flux2DiTConfig dcfg_;
    std::optional<vae::KLSource> kl_;
    int vae_factor_ = 8;
    Flux2LatentStats stats_;
    std::unique_ptr<sampling::ModelSampling> ms_;
    KleinReferences refs_;

    // Module slots (owned by modules_).
    mutable std::unique_ptr<text::QwenTokenizer> own_tokenizer_;
    ModuleSlot<qwen3::Qwen3TextEncoder, PlacedTe>* te_ = nullptr;
    ModuleSlot<DiTWhole, PlacedDiT>* dit_ = nullptr;
    std::string te_desc_;
};

}  // namespace easel::models::flux
