// Family: what the pipeline knows about a model family (SD1.x/2.x, Z-Image, FLUX.1, FLUX.2 ...).
//
// design.md: "Model families are objects, not if (version == ...) chains." The pipeline (and its
// stages: encode prompt, encode image, denoise, decode) talks to a model only through this
// interface; it never switches on the family. A family
//   * finds its modules in the user's files (-m, --diffusion-model, --vae, --taesd, --clip_l,
//     --t5xxl, --llm ...), infers their configuration from the weights,
//   * loads a module only when asked (load(Module)) and frees it when told (unload(Module)), so
//     a stage loads only what it needs and a cache hit never opens the text encoder file,
//   * turns a prompt into a Conditioning (the one format every family fills; docs/artifacts.md),
//   * runs its diffusion model on a latent, and its VAE (or tiny autoencoder) on images,
//   * states its latent format, noise process and default sampling settings.
//
// Layouts: tensors on the host are PyTorch order, row-major, innermost (fastest) last in the
// shape comments: a latent [C, h, w] has w fastest; a context [L, D] has D fastest.
#pragma once

#include "models/vae/autoencoder_kl.h"
#include "models/vae/host_tensor.h"
#include "placement/plan.h"
#include "sampling/schedule.h"

#include <ggml-backend.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace easel::models {

/// The modules of a family, by sd.cpp's names (te = every text encoder of the family).
enum class Module { Te, Diffusion, VaeDecoder, VaeEncoder };
const char* module_name(Module m);  ///< "te", "diffusion", "vae" (decoder), "vae encoder"

/// Conditioning for ONE prompt (positive or negative), in the one format all families share.
/// Fields a family does not use stay empty. See docs/artifacts.md for how it is stored.
struct Conditioning {
    /// Cross-attention / joint-attention context [L, D], D fastest.
    ///  SD1.x/2.x: CLIP hidden states after clip skip, emphasis applied, L = 77*k windows.
    ///  FLUX.1: T5-XXL last_hidden_state (L = 256 or 512, D = 4096).
    ///  Z-Image: Qwen3 hidden_states[-2] of the unmasked tokens only (L = real tokens, D = 2560).
    ///  FLUX.2 Klein: Qwen3 hidden_states 9, 18, 27 concatenated along D (D = 3 * hidden).
    std::vector<float> context;
    int64_t tokens = 0;  ///< L
    int64_t dim = 0;     ///< D
    /// Pooled vector [P] (FLUX.1: CLIP-L pooler_output, P = 768). Empty when unused.
    std::vector<float> pooled;
    /// Attention mask over the context tokens [L]: 1 = attend, 0 = padding. Empty = all 1.
    std::vector<uint8_t> mask;
    /// The token ids the encoder saw, concatenated over windows [T] (informational, for
    /// checks and caching), and per-token emphasis weights [T] (A1111 / T5-style weighting;
    /// empty = all 1).
    std::vector<int32_t> token_ids;
    std::vector<float> token_weights;

    bool empty() const { return context.empty() && pooled.empty(); }
};

/// How latents relate to images: pixels per latent cell, channels, and the VAE's normalisation
/// (diffusion space z = (vae_latent - shift_factor) * scaling_factor).
struct LatentFormat {
    int64_t channels = 4;        ///< latent channels the diffusion model denoises (SD: 4, FLUX/Z-Image: 16)
    int spatial_factor = 8;      ///< image pixels per latent cell along each axis
    float scaling_factor = 0.18215f;
    float shift_factor = 0.0f;
};

/// Sampling settings a family defaults to when the user gives none (sd-cli names).
struct SamplingDefaults {
    std::string sampler = "euler_a";
    std::string scheduler = "discrete";
    int steps = 20;
    float cfg_scale = 7.0f;
    int clip_skip = 1;  ///< SD only; 0 = not applicable
    int width = 512, height = 512;
};

/// Every file a job may name (sd-cli flags). Empty = absent.
struct ModelFiles {
    std::string model;            ///< -m: single file / GGUF / diffusers folder
    std::string diffusion_model;  ///< --diffusion-model
    std::string vae;              ///< --vae
    std::string taesd;            ///< --taesd
    std::string clip_l;           ///< --clip_l
    std::string clip_g;           ///< --clip_g
    std::string t5xxl;            ///< --t5xxl
    std::string llm;              ///< --llm (Qwen3 etc.)
};

/// Load-time options shared by all families.
struct FamilyOptions {
    ggml_backend_dev_t te_device = nullptr;         ///< nullptr: CPU
    ggml_backend_dev_t diffusion_device = nullptr;  ///< nullptr: CPU
    ggml_backend_dev_t vae_device = nullptr;        ///< nullptr: CPU
    int threads = 0;                                ///< CPU threads (<= 0: all)
    bool flash_attn_te = false;                     ///< --fa
    bool flash_attn_diffusion = false;              ///< --fa or --diffusion-fa
    bool vae_conv_direct = false;                   ///< --vae-conv-direct (KL VAE and TAESD convolutions)
    bool diffusion_conv_direct = false;             ///< --diffusion-conv-direct (UNet convolutions; the DiTs have none)
    std::string weight_type;                        ///< --type ("" keeps the stored types)
    std::string prediction;                         ///< --prediction override ("" = detect)
    float flow_shift = 0.0f;                        ///< --flow-shift (0 = the family's default)
    float guidance = 3.5f;                          ///< --guidance: distilled guidance (FLUX.1 dev's embedder)
    /// Placement flags resolved (docs/placement.md); null = every module whole on its device
    /// above. A family that supports it runs its diffusion model under a placement::Plan.
    std::shared_ptr<const placement::PlacementSpec> placement;
    /// --vae-tiling: the tile side in latent cells the pipeline's decode will use (0 = whole), so
    /// placement_costs / plan_placement cost the VAE decoder at the graph it will really run.
    int vae_tile = 0;
    /// The images the job encodes with the VAE encoder, {H, W} pixels as given (the init image -i,
    /// whose size in-painting's masked image shares; `easel encode-image`'s image): plan_placement
    /// adds the encode stage's plan (module vae, stage placement::kVaeEncodeStage) for them, each
    /// rounded down to size_multiple() as the pipeline crops it. Empty: no encode stage planned.
    std::vector<std::pair<int64_t, int64_t>> vae_encode_sizes;
    /// Reference images of edit-mode families (-r), {H, W} pixels as given: planned like
    /// vae_encode_sizes at the size the family encodes them (FLUX.2 Klein: resized / cropped).
    std::vector<std::pair<int64_t, int64_t>> reference_sizes;
};

/// A model family bound to the user's files. Modules load lazily (see load()).
class Family {
public:
    virtual ~Family() = default;

    /// "SD1.x", "SD2.x inpainting", "Z-Image", ...
    virtual std::string name() const = 0;
    /// Short description of the weight sources, for logs.
    virtual std::string describe() const = 0;
    virtual LatentFormat latent_format() const = 0;
    /// The noise process (discrete eps/v, or flow with its shift).
    virtual const sampling::ModelSampling& model_sampling() const = 0;
    virtual SamplingDefaults defaults() const = 0;
    /// True when the diffusion model takes --guidance (a distilled-guidance input: FLUX.1 dev);
    /// generate warns once when --guidance is given to a family without one.
    virtual bool uses_guidance() const { return false; }
    /// Options for sampling::make_schedule that reproduce the family's reference pipeline
    /// (Z-Image: flow_pipeline_sigmas, since ZImagePipeline passes sigmas linspace(1, 1/n, n)
    /// to FlowMatchEulerDiscreteScheduler instead of letting it space timesteps itself).
    virtual sampling::ScheduleOptions schedule_options() const { return {}; }
    /// Channels the diffusion model takes: latent channels plus concat channels (SD
    /// in-painting UNets: 4 + 1 mask + 4 masked-image latent = 9).
    virtual int64_t diffusion_in_channels() const { return latent_format().channels; }
    /// Image sides must be a multiple of this many pixels (SD: the VAE factor 8; patchified DiTs
    /// such as Z-Image: VAE factor x patch size = 16). generate rounds sizes down to it.
    virtual int size_multiple() const { return latent_format().spatial_factor; }
    /// Image tokens of a width x height (pixels) image, one per size_multiple()^2 pixels: what
    /// diffusers' FLUX pipelines call image_seq_len (packed latent length, (H/16)*(W/16) for
    /// FLUX.1/FLUX.2), fed to the resolution-dependent flux / flux2 schedulers
    /// (sampling::ScheduleOptions::image_seq_len). Families with another token count override it.
    virtual int64_t image_seq_len(int width, int height) const {
        const int f = size_multiple();
        return static_cast<int64_t>(width / f) * (height / f);
    }
    /// Paths of the files module m reads (for fingerprints and cache keys); may be empty
    /// when a module is absent.
    virtual std::vector<std::string> module_files(Module m) const = 0;

    /// Loads module m if not loaded (reads and uploads its weights). Throws Error(Io) for an
    /// unreadable file, Error(ModelMismatch) for a file of the wrong kind (naming the slot and
    /// the fix), Error(OutOfMemory) when its weights do not fit.
    virtual void load(Module m) = 0;
    /// Frees module m's weights and compute buffers (no-op when not loaded).
    virtual void unload(Module m) = 0;
    virtual bool loaded(Module m) const = 0;

    /// Prompt -> conditioning (loads Te when needed). `clip_skip` <= 0 = the family's default.
    /// The prompt has had its <lora:...> tags removed.
    virtual Conditioning encode_prompt(const std::string& prompt, int clip_skip) = 0;

    /// The conditioning of an empty negative prompt when the family's reference pipeline does not
    /// encode "" (SDXL: zeros shaped as `positive`, diffusers' force_zeros_for_empty_prompt);
    /// std::nullopt (the default): the empty prompt is encoded like any other.
    virtual std::optional<Conditioning> empty_negative(const Conditioning& positive) const {
        (void)positive;
        return std::nullopt;
    }
    /// One diffusion-model evaluation (loads Diffusion when needed).
    ///  x: latent [C, h, w] (C = latent_format().channels) at noise level sigma, already scaled
    ///     by the Denoiser's c_in (discrete models) or as is (flow models);
    ///  concat: extra input channels [Cc, h, w] appended to x (in-painting UNets), or empty;
    ///  timestep: the schedule's network timestep for this sigma (sampling::Schedule::timesteps;
    ///     flow models: sigma * 1000; the family converts to its own convention);
    ///  out: [C, h, w] the prediction in the family's Prediction convention (eps, v, or flow
    ///     velocity noise - x0, whatever sign the model itself uses).
    /// Throws Error(InvalidInput) on size mismatches.
    virtual void diffusion(std::span<const float> x, std::span<const float> concat, int64_t h, int64_t w,
                           double timestep, const Conditioning& cond, std::span<float> out) = 0;

    /// Diffusion-space latent [1, C, h, w] -> image [1, 3, h*f, w*f] in about [-1, 1]
    /// (undoes scaling/shift; loads VaeDecoder when needed).
    virtual vae::HostTensor decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) = 0;
    /// Image [1, 3, H, W] in [-1, 1] -> posterior in the raw VAE space (before scaling/shift;
    /// loads VaeEncoder when needed). Throws Error(Unsupported) when the family has no encoder.
    virtual vae::LatentDist encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) = 0;
    /// Reference images of edit-mode families (FLUX.2 Klein `-r`), each [1, 3, H, W] in [-1, 1]
    /// (any size: the family crops/resizes as its reference pipeline does), encoded now (loads
    /// VaeEncoder) and used by every later diffusion() call; an empty list clears them. The
    /// default throws Error(Unsupported): the family takes no reference images.
    virtual void set_reference_images(std::span<const vae::HostTensor> images);
    /// Checks a reference image of width x height pixels before any stage runs (nothing is
    /// loaded): the default throws Error(Unsupported) as set_reference_images() does; edit
    /// families throw Error(InvalidInput) for a size their pipeline refuses.
    virtual void check_reference_image(int width, int height) const;

    /// Parameter bytes of module m when loaded (0 when not loaded) and the largest compute
    /// buffer measured for it so far, in bytes.
    virtual size_t param_bytes(Module m) const = 0;
    virtual size_t compute_bytes(Module m) const = 0;

    /// Planner inputs of every module the family can run under a placement plan, for one
    /// evaluation on a latent of h x w cells at the job's shapes, without loading any weight:
    /// per module (placement::ModuleCosts::module says which: te, diffusion ...) the parameter
    /// bytes of each block and of the prologue/epilogue at the types loading would choose
    /// (--type applied), and `measure(b, e, prologue, epilogue, device)`, the compute buffer of
    /// the graph running blocks [b, e) on a ggml device (by name), sized with ggml's graph
    /// allocator; `state_bytes(e)`, the state crossing block e. The VAE decoder (PModule::Vae) is
    /// costed at one decode graph (one tile when FamilyOptions::vae_tile tiles the latent) and
    /// fills ModuleCosts::measure_tile for --auto-fit's tiling. Text encoders are costed at the
    /// family's longest prompt (SD: one 77-token window; Z-Image: 512 tokens) and default clip
    /// skip. Independent of FamilyOptions::placement (the --auto-fit planner calls it before a
    /// spec exists). The callbacks own what they use and may outlive the call, not the family.
    /// Empty when the family has no placeable module; a module without a file (no text encoder
    /// given) is left out. Throws Error(ModelMismatch) / Error(Io) when a module's file is of the
    /// wrong kind or unreadable (headers are read).
    virtual std::vector<placement::ModuleCosts> placement_costs(int64_t h, int64_t w) { return {}; }

    /// The planner inputs of the job's encode stage (module vae, stage placement::kVaeEncodeStage):
    /// the VAE encoder at the largest image the job encodes (FamilyOptions::vae_encode_sizes and
    /// reference_sizes, at the size the family encodes them) when the encodes run with tiles of
    /// `tile` latent cells (0 = whole; the pipeline encodes with the decode's --vae-tiling).
    /// std::nullopt when the job encodes no image or the family has no placed VAE encoder.
    /// plan_placement plans the same costs at FamilyOptions::vae_tile; --auto-fit asks for each
    /// tile it tries. Nothing is loaded. Throws as placement_costs.
    virtual std::optional<placement::ModuleCosts> encode_costs(int tile) { return std::nullopt; }

    /// The placement plans (placement/plan.h) of the modules the family runs under
    /// FamilyOptions::placement, for one evaluation on a latent of h x w cells, without loading
    /// anything; empty when the family has no placed module. Throws Error(OutOfMemory) with the
    /// planner's message when a plan does not fit.
    virtual std::vector<placement::ModulePlan> plan_placement(int64_t h, int64_t w) { return {}; }
    /// The plans in use and the measured peak bytes per device since loading (empty when none).
    virtual std::vector<placement::ModulePlan> placement_plans() const { return {}; }
    virtual std::map<std::string, uint64_t> placement_peaks() const { return {}; }

    /// Leaves the text encoders out of placement_costs (and so of plan_placement and the
    /// pre-run memory check): set when the job's conditioning comes from the cache or
    /// --load-embeddings, whose contract is that the text encoder's files are never opened.
    void set_costs_skip_te(bool skip) { costs_skip_te_ = skip; }
    bool costs_skip_te() const { return costs_skip_te_; }

protected:
    bool costs_skip_te_ = false;
};

/// Detects the family from the files (headers only: no weights are read) and returns it with no
/// module loaded. Throws Error(ModelMismatch) when the files hold no supported diffusion model,
/// naming what was found; Error(Io) for unreadable files.
std::unique_ptr<Family> open_family(const ModelFiles& files, const FamilyOptions& opt);

}  // namespace easel::models
