// The Z-Image family (Z-Image-Turbo and Z-Image): which files hold its modules, how a prompt
// becomes conditioning, the latent format, the noise process and the default sampling settings.
//
// Modules (diffusers' ZImagePipeline, diffusers/pipelines/z_image/pipeline_z_image.py):
//   te         Qwen3 (Qwen3-4B: hidden 2560) decoder-only LLM, models::qwen3::Qwen3TextEncoder
//   diffusion  ZImageTransformer2DModel (S3-DiT), models::zimage::LoadedZImageDiT
//   vae        the FLUX.1 AutoencoderKL (16 latent channels, f 8, scaling 0.3611, shift 0.1159)
// Sources, in order of precedence: the file flags (--diffusion-model, --llm, --vae), then -m (a
// diffusers pipeline folder with transformer/, text_encoder/, vae/, scheduler/; or one weight
// file, safetensors or GGUF, that holds the transformer and possibly the VAE / text encoder).
//
// Lazy loading (models::Family): open() reads only headers (the transformer's and the VAE's);
// the text encoder's file is opened by load(Module::Te), which checks that it is a Qwen3 model
// whose hidden size equals the transformer's cap_feat_dim before loading any weight.
//
// Conditioning recipe (ZImagePipeline._encode_prompt): the prompt is wrapped in Qwen3's chat
// template for one user message with add_generation_prompt=True and enable_thinking=True,
//   "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n",
// tokenized (Qwen BPE, added tokens parsed), truncated to 512 tokens (max_sequence_length), and
// encoded; the context is hidden_states[-2] of the real tokens ([L, hidden]). diffusers pads to
// 512 and drops the padded positions afterwards; with causal attention and right padding the
// real tokens' states do not depend on the padding, so easel encodes the real tokens only.
// No A1111 emphasis: the prompt text goes to the tokenizer as is (as in diffusers).
//
// Noise process: rectified flow, x = (1 - sigma) x0 + sigma noise, static shift 3.0
// (scheduler_config.json "shift", or --flow-shift). ZImagePipeline's schedule is sigmas =
// linspace(1, 1/n, n) shifted (sampling::ScheduleOptions::flow_pipeline_sigmas). The network
// sees t = (1000 - sigma*1000) / 1000 = 1 - sigma and predicts x0 - noise; diffusion() returns
// the velocity noise - x0 (the negated output, as ZImagePipeline's noise_pred = -noise_pred).
// CFG: ZImagePipeline's guidance_scale g (pos + g (pos - neg), on whenever g > 0) equals
// easel's --cfg-scale 1 + g.
#pragma once

#include "io/weight_index.h"
#include "models/family_base.h"
#include "models/qwen3/qwen3.h"
#include "models/vae/autoencoder_kl.h"
#include "models/zimage/z_image_dit.h"
#include "sampling/schedule.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace easel::text {
class QwenTokenizer;
}

namespace easel::models::zimage {

/// ZImagePipeline's max_sequence_length: prompts are truncated to this many tokens.
inline constexpr int64_t kMaxPromptTokens = 512;

/// Z-Image-Turbo's static flow shift (scheduler_config.json "shift").
inline constexpr double kDefaultFlowShift = 3.0;

/// True when `index` holds a Z-Image transformer (either key layout, any prefix); headers only.
bool is_zimage(const io::WeightIndex& index);

/// A Z-Image model bound to the user's files; modules load on demand.
class ZImage final : public FamilyBase {
public:
    /// Resolves every module's source and reads the transformer's and the VAE's headers (no
    /// weights; nothing of the text encoder). Throws Error(ModelMismatch) when the diffusion
    /// model is not a Z-Image transformer or the VAE is not a 16-channel AutoencoderKL (naming
    /// the flag and the fix), Error(Io) for missing or unreadable files, Error(InvalidInput)
    /// for a bad --type or a negative --flow-shift.
    static std::unique_ptr<ZImage> open(const ModelFiles& files, const FamilyOptions& opt);
    ~ZImage() override;

    // models::Family
    std::string name() const override;  ///< "Z-Image"
    std::string describe() const override;
    /// 16 channels, the VAE's spatial factor (8), scaling/shift from the VAE config.json when
    /// present, else FLUX.1's 0.3611 / 0.1159.
    LatentFormat latent_format() const override;
    /// 16: the VAE factor 8 times the transformer's patch size 2.
    int size_multiple() const override { return (int)(dcfg_.patch * spatial_factor_); }
    /// ModelSampling::flow(shift): --flow-shift, else the scheduler config's shift, else 3.0.
    const sampling::ModelSampling& model_sampling() const override;
    /// Z-Image-Turbo's: euler, discrete (= ZImagePipeline's sigmas), 8 steps, CFG 1 (off),
    /// 1024x1024, no clip skip.
    SamplingDefaults defaults() const override;
    /// flow_pipeline_sigmas = true: ZImagePipeline's sigmas linspace(1, 1/n, n), then shifted.
    sampling::ScheduleOptions schedule_options() const override;
    /// Conditioning: context [L, hidden] = hidden_states[-2] of the L real tokens of the
    /// templated prompt (L <= 512), token_ids [L]; no pooled vector, no mask, no weights.
    /// clip_skip is ignored (not applicable).
    Conditioning encode_prompt(const std::string& prompt, int clip_skip) override;
    /// x: latent [16, h, w]; concat must be empty; timestep = sigma * 1000 (the schedule's);
    /// out: [16, h, w] flow velocity (noise - x0). Throws Error(InvalidInput) on size
    /// mismatches or odd h / w (the transformer's patch is 2), Error(ModelMismatch) when the
    /// conditioning width differs from cap_feat_dim.
    void diffusion(std::span<const float> x, std::span<const float> concat, int64_t h, int64_t w, double timestep,
                   const Conditioning& cond, std::span<float> out) override;
    /// latent [1, 16, h, w] (diffusion space) -> image [1, 3, 8h, 8w]: z / scaling + shift, then
    /// the VAE decoder.
    vae::HostTensor decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) override;
    /// image [1, 3, H, W] in [-1, 1] -> raw posterior (before shift/scaling).
    vae::LatentDist encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) override;
    /// The transformer's configuration (from the headers).
    const ZImageDiTConfig& dit_config() const { return dcfg_; }
    /// The token ids encode_prompt() feeds the text encoder for `prompt`: the chat template,
    /// tokenized, truncated to kMaxPromptTokens. Needs no loaded module.
    std::vector<int32_t> prompt_ids(const std::string& prompt) const;

protected:
    /// The transformer ("dit") and the Qwen3 text encoder ("qwen3", te 0) when its file is given.
    void lora_targets(LoraTargets& t) override;

private:
    ZImage(const ModelFiles& files, const FamilyOptions& opt);
    /// Registers the module slots. load(Te) refuses (Error(ModelMismatch)) a file that holds no
    /// Qwen3 model or one whose hidden size differs from the transformer's cap_feat_dim (checked
    /// from headers, before any weight is loaded). Costs: te = Qwen3 built with layers - 1
    /// layers (the context is hidden_states[-2], the raw output of layer layers - 2) at 512
    /// tokens (kMaxPromptTokens); diffusion = the transformer for a latent of h x w cells and a
    /// 512-token caption; vae = the AutoencoderKL decoder for a latent of h x w cells (one tile
    /// when FamilyOptions::vae_tile tiles it).
    void add_modules();
    const text::QwenTokenizer& tokenizer() const;
    /// The text encoder's headers: its index (`own` holds it when it is a file of its own), keys
    /// and configuration, checked (a Qwen3 model of the transformer's width with >= 2 layers).
    /// Throws Error(ModelMismatch) naming the flag and the fix.
    const io::WeightIndex& te_headers(std::unique_ptr<io::WeightIndex>& own, qwen3::Qwen3Keys& keys, qwen3::Qwen3Config& cfg) const;
    struct PlacedTe;   ///< Qwen3 under FamilyOptions::placement
    struct PlacedDiT;  ///< the transformer under FamilyOptions::placement

    // Sources (resolved at open).
    ModuleSource te_src_;
    std::string tokenizer_json_;
    std::string model_desc_;
    std::string shift_src_;

    // Header-level facts.
    ZImageDiTConfig dcfg_;
    std::optional<vae::KLSource> kl_;  ///< absent with --taesd and no --vae (decode only)
    int spatial_factor_ = 8;
    float scaling_factor_ = 0.3611f, shift_factor_ = 0.1159f;
    std::unique_ptr<sampling::ModelSampling> ms_;

    // Module slots (owned by modules_).
    mutable std::unique_ptr<text::QwenTokenizer> own_tokenizer_;
    ModuleSlot<qwen3::Qwen3TextEncoder, PlacedTe>* te_ = nullptr;
    ModuleSlot<LoadedZImageDiT, PlacedDiT>* dit_ = nullptr;
    std::string te_desc_;
};

}  // namespace easel::models::zimage
