// FamilyBase: the Family interface implemented once over a ModuleSet (module_set.h), plus the
// parts every family shares: the options and --type, the diffusion model's and the VAE's weight
// indexes, and the VAE modules (AutoencoderKL decoder and encoder, whole or placed, and a
// TAESD / TAEF2 decoder, checked against the family when the model is opened); the --taesd /
// VAE header reading (open_vae), the un-scaling decode (decode_scaled) and the Qwen3 text
// encoder's run options and LoRA targets (Z-Image, FLUX.2 Klein).
//
// A family derives from it and describes only what is its own: in open(), its sources
// (resolve_sources), header checks and configuration, its module slots (modules_.add for te and
// diffusion, add_vae() for the VAE); and its conditioning recipe (encode_prompt), denoiser
// wrapper (diffusion), latent format (latent_format, decode/encode around decode_kl / encode_kl)
// and defaults. load/unload/loaded, param and compute bytes, module_files, placement_costs,
// encode_costs, plan_placement, placement_plans and placement_peaks are FamilyBase's.
#pragma once

#include "io/weight_index.h"
#include "lora/apply.h"
#include "nn/weight_patch.h"
#include "models/family.h"
#include "models/module_set.h"
#include "models/qwen3/qwen3.h"
#include "models/vae/autoencoder_kl.h"
#include "models/vae/placed_decoder.h"
#include "models/vae/placed_encoder.h"
#include "models/vae/taesd.h"
#include "runtime/graph_runner.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace easel::models {

/// A model-file flag (--clip_l, --clip_g, --t5xxl ...) that `family` has no module for: one
/// warning "FLAG PATH: FAMILY WHY; the file is not read". Nothing when `path` is empty. Throws
/// Error(Io) when `path` names nothing (a typo must not pass as "unused").
void note_unused_model_file(const char* flag, const std::string& path, const std::string& family, const char* why);

/// The Family interface over a ModuleSet; see the file comment.
class FamilyBase : public Family {
public:
    ~FamilyBase() override;

    /// The files the module's slot names (Family::module_files).
    std::vector<std::string> module_files(Module m) const override { return modules_.files(m); }
    /// Loads module m: under FamilyOptions::placement when given (the plan is made on its first
    /// run), else whole on its device. Throws what the module's hooks throw (Error(Io),
    /// Error(ModelMismatch), Error(OutOfMemory)); Error(Unsupported) for a module the family lacks.
    void load(Module m) final { modules_.load(m, opt_.placement != nullptr, name()); }
    void unload(Module m) final { modules_.unload(m); }
    bool loaded(Module m) const final { return modules_.loaded(m); }
    size_t param_bytes(Module m) const final { return modules_.param_bytes(m); }
    size_t compute_bytes(Module m) const final { return modules_.compute_bytes(m); }
    /// Every slot's costs in slot order (te left out with set_costs_skip_te), after
    /// check_planned_latent(h, w).
    std::vector<placement::ModuleCosts> placement_costs(int64_t h, int64_t w) final;
    /// The VAE encoder at the largest of encode_sizes() (nullopt without an encoder or images).
    std::optional<placement::ModuleCosts> encode_costs(int tile) final;
    /// placement::plan_modules over placement_costs() (the vae entry reduced to one device when
    /// a TAESD decodes, with its warning logged) plus the encode stage's plan.
    std::vector<placement::ModulePlan> plan_placement(int64_t h, int64_t w) final;
    std::vector<placement::ModulePlan> placement_plans() const final { return modules_.plans(); }
    std::map<std::string, uint64_t> placement_peaks() const final { return modules_.peaks(); }

    /// The job's LoRAs (the active ones, opened: lora::open_loras) and --lora-apply-mode: each file
    /// is mapped onto the family's te and diffusion weights from the headers (lora_targets) and
    /// fit-checked (lora::check_fit), and its patches are registered under the stored tensors those
    /// modules load (nn::register_patches): from the next load on they are merged in read_param or
    /// bound as run-time terms (lora/apply.h). When the set differs from the current one, te and
    /// diffusion are unloaded (they load again with it). An empty list removes them. Nothing is
    /// loaded here. Throws Error(ModelMismatch) for a LoRA made for another family or size,
    /// Error(Unsupported) for a family without LoRA targets.
    void set_loras(const std::vector<lora::OpenedLora>& loras, lora::ApplyMode mode);

protected:
    /// What set_loras maps LoRAs onto.
    struct LoraTargets {
        lora::KeyMap km;      ///< the diffusion model and each text encoder as components (models/lora_targets.h)
        lora::ModelInfo info; ///< the model, for lora::check_fit's messages
        /// Per component name ("unet", "dit", "clip_l", ...): the TensorSource its module loads
        /// with, which says where each patched weight is stored.
        std::map<std::string, std::unique_ptr<nn::TensorSource>> sources;
        std::vector<std::unique_ptr<io::WeightIndex>> own;  ///< indexes opened for the sources
    };
    /// Fills `t` from the headers (the Block trees of the configurations read at open, the
    /// modules' TensorSources): the text encoders only when their files are given. The default
    /// throws Error(Unsupported).
    virtual void lora_targets(LoraTargets& t);
    /// Adds a Qwen3 text encoder (Z-Image, FLUX.2 Klein) to `t` as component "qwen3", te 0: its
    /// Block tree built from `cfg`, its stored weights found in `index` by `keys`; `own` (the
    /// index, when it is a file of its own) is kept in t.own.
    static void add_qwen3_lora_targets(LoraTargets& t, const io::WeightIndex& index, std::unique_ptr<io::WeightIndex> own,
                                       const qwen3::Qwen3Keys& keys, const qwen3::Qwen3Config& cfg);
    /// The run options of a Qwen3 text encoder loaded whole: FamilyOptions' te device, threads
    /// and te flash attention, and --type.
    qwen3::Qwen3RunOptions qwen3_run_options() const;

    /// Keeps the files and options and parses --type (Error(InvalidInput) for a bad one).
    FamilyBase(const ModelFiles& files, const FamilyOptions& opt);

    /// Refuses a latent size the diffusion model cannot take before anything is costed
    /// (Error(InvalidInput)); the default accepts every size.
    virtual void check_planned_latent(int64_t /*h*/, int64_t /*w*/) const {}
    /// The image sizes {H, W} pixels the job's encode stage encodes, as the family encodes them:
    /// the default is FamilyOptions::vae_encode_sizes rounded down to size_multiple().
    virtual std::vector<std::pair<int64_t, int64_t>> encode_sizes() const;

    /// The index of `s` when it is the diffusion model's or the VAE's file (already open), else
    /// a new one kept in `own`. Throws Error(Io) naming the flag when the path does not exist.
    const io::WeightIndex& index_for(const ModuleSource& s, std::unique_ptr<io::WeightIndex>& own) const;
    /// The VAE's weight index: its own file's, or the diffusion model's (one file holding both).
    const io::WeightIndex& vae_index() const { return vae_idx_ ? *vae_idx_ : *dit_idx_; }

    /// What read_vae_headers() expects of the VAE, in the family's words for its refusals.
    struct VaeExpect {
        int64_t latent_channels = 16;  ///< the latent channels of the family's VAE
        std::string family;            ///< "Z-Image" (check_vae_kind's family)
        std::string needed;            ///< check_vae_kind's text: "the FLUX.1 VAE (16 latent channels, ae.safetensors)"
        std::string no_vae;            ///< after "DIFFUSION_FLAG: no VAE given; ": "pass the FLUX.1 VAE (ae.safetensors) with --vae FILE"
        std::string no_kl;             ///< after "VAE_FLAG: no AutoencoderKL (VAE) found in it; ": likewise
        std::string wrong_channels;    ///< after "VAE_FLAG: the VAE has N latent channels; ": "Z-Image needs the 16-channel ..."
    };
    /// The VAE's headers as read_vae_headers() finds them.
    struct VaeHeaders {
        vae::KLSource kl;
        vae::AutoencoderKLConfig cfg;  ///< config.json overrides applied
        std::optional<float> scaling, shift;  ///< config.json's scaling_factor / shift_factor when given
    };
    /// Reads the VAE's headers (no weights): opens vae_idx_ when the VAE is not in the diffusion
    /// model's file, finds its AutoencoderKL, refuses one of another kind from one header
    /// (check_vae_kind) and one whose configuration has other latent channels. Throws
    /// Error(ModelMismatch) with `e`'s words, Error(Io) for an unreadable file.
    VaeHeaders read_vae_headers(const VaeExpect& e);

    /// How a family's VAE modules are set up (add_vae()).
    struct VaeSetup {
        /// The AutoencoderKL found in vae_index(); absent: only a TAESD decoder (SD with --taesd
        /// and no VAE), and loading the KL decoder or the encoder says "no VAE: pass one with --vae FILE".
        std::optional<vae::KLSource> kl;
        /// Flash attention in the VAE's attention (SD: --fa; the others: off).
        bool flash_attn = false;
        /// Image pixels per cell of FamilyOptions::vae_tile (the tiling plans are made at).
        int tile_factor = 8;
        /// VAE latent cells per sampler latent cell along each axis (FLUX.2's patchified latent: 2).
        int latent_scale = 1;
        /// module_files(VaeDecoder) lists the VAE's file after TAESD's (FLUX.2: its latent statistics).
        bool taesd_reads_vae_file = false;
        /// With --taesd (taesd_path_): the latent channels its decoder must take (SD 4, FLUX.1 and
        /// Z-Image 16, FLUX.2 32), the latents' name for the refusal ("" = name() + " latents")
        /// and the tiny autoencoder to pass instead ("TAEF1 (taef1_decoder)").
        int64_t taesd_channels = 4;
        std::string taesd_latents{}, taesd_kind{};
        /// The VAE to pass for img2img when only --taesd is given: "the FLUX.1 VAE (ae.safetensors)".
        std::string vae_needed = "a VAE";
    };
    /// Registers the VaeDecoder and VaeEncoder slots (after te and diffusion: the slot order).
    /// With --taesd, first reads the TAESD file's headers and refuses (Error(ModelMismatch)) one
    /// without a decoder or whose decoder takes other than setup.taesd_channels latent channels:
    /// when the model is opened, before any stage runs (a TAEF2 given to SD fails here, not
    /// after the denoising).
    /// The KL decoder and encoder load whole on FamilyOptions::vae_device, or as
    /// vae::PlacedVaeDecoder / PlacedVaeEncoder under the placement's vae entry; a TAESD
    /// decoder always loads whole. Costs: the KL decoder at the job's latent (x latent_scale) and
    /// planned tiling, or the TAESD decoder at the same latent untiled.
    void add_vae(VaeSetup setup);
    /// True when a TAESD decodes (--taesd).
    bool decodes_with_taesd() const { return !taesd_path_.empty(); }
    /// Takes --taesd (files_.taesd) into taesd_path_. Throws Error(Io) when it names nothing.
    void take_taesd();
    /// What open_vae() read: the AutoencoderKL (absent: --taesd alone) and its configuration's
    /// spatial factor and scaling / shift (nullopt: the VAE's config.json gives none).
    struct OpenedVae {
        std::optional<vae::KLSource> kl;
        int spatial_factor = 8;
        std::optional<float> scaling, shift;
    };
    /// take_taesd(), then the VAE's headers (read_vae_headers(e)) unless --taesd is given without
    /// a VAE: then the tiny autoencoder decodes, nothing is read and there is no VAE encoder
    /// (img2img says so), the spatial factor staying 8 (FLUX.1's VAE, the one TAEF1 mirrors).
    /// Throws as take_taesd() and read_vae_headers().
    OpenedVae open_vae(const VaeExpect& e);
    /// Decodes a raw VAE latent [N, L, h, w] with the loaded TAESD decoder (call load(VaeDecoder)
    /// first). Under placement flags its plan (the vae row) and measured peak are recorded.
    vae::HostTensor decode_taesd(const vae::HostTensor& z);
    /// Decodes a raw VAE latent [N, L, h, w] (after the family's un-scaling) with the loaded KL
    /// decoder, whole or placed, tiled as `tiling` says -> image [N, 3, h f, w f].
    vae::HostTensor decode_kl(const vae::HostTensor& z, const vae::TilingOptions& tiling);
    /// Loads the VAE encoder and encodes an image [N, 3, H, W] in [-1, 1] -> raw posterior.
    /// Throws Error(InvalidInput) when --taesd is given without a VAE (a TAESD only decodes),
    /// naming VaeSetup::vae_needed; Error(ModelMismatch) when there is no VAE at all.
    vae::LatentDist encode_kl(const vae::HostTensor& image, const vae::TilingOptions& tiling);
    /// A diffusion-space latent [N, C, h, w] -> image [N, 3, h f, w f]: loads the VaeDecoder;
    /// a TAESD (--taesd) decodes the latent as it is (TAESD / TAESDXL / TAEF1 take the scaled
    /// latent), else the KL decoder decodes latent / scaling + shift (diffusers' un-scaling; the
    /// shift only when not 0), tiled as `tiling` says.
    vae::HostTensor decode_scaled(const vae::HostTensor& latent, const vae::TilingOptions& tiling, float scaling, float shift);
    /// Where the AutoencoderKL lies, for the placed decoder / encoder and their costs.
    vae::VaeDecoderSource vae_source() const;

    ModelFiles files_;
    FamilyOptions opt_;
    ggml_type weight_type_ = GGML_TYPE_COUNT;  ///< --type (GGML_TYPE_COUNT keeps the stored types)
    ModuleSource dit_src_, vae_src_;          ///< the diffusion model's and the VAE's sources
    std::string taesd_path_;                  ///< --taesd: a tiny autoencoder decodes ("" = the KL decoder)
    std::unique_ptr<io::WeightIndex> dit_idx_, vae_idx_;  ///< their indexes (vae_idx_ null: the VAE is in dit_idx_'s file)
    ModuleSet modules_;

private:
    std::unique_ptr<nn::PatchRegistration> lora_reg_;  ///< the registered patches of the current LoRA set
    std::string lora_key_;                             ///< lora::lora_set_key of that set
    struct DecoderWhole;  ///< the KL decoder or a TAESD decoder, loaded whole
    struct EncoderWhole;  ///< the KL encoder, loaded whole
    VaeSetup vae_;
    ModuleSlot<DecoderWhole, vae::PlacedVaeDecoder>* dec_ = nullptr;
    ModuleSlot<EncoderWhole, vae::PlacedVaeEncoder>* enc_ = nullptr;
};

/// Family::set_loras for any family: FamilyBase::set_loras, or Error(Unsupported) when `fam`
/// is not a FamilyBase and `loras` is not empty.
void set_loras(Family& fam, const std::vector<lora::OpenedLora>& loras, lora::ApplyMode mode);

}  // namespace easel::models
