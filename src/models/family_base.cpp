#include "models/family_base.h"

#include "core/error.h"
#include "core/log.h"
#include "models/lora_targets.h"
#include "models/model_files.h"
#include "models/vae/placed_taesd.h"
#include "placement/devices.h"
#include "core/platform.h"

#include <filesystem>

namespace easel::models {

void note_unused_model_file(const char* flag, const std::string& path, const std::string& family, const char* why) {
    if (path.empty()) return;
    std::error_code ec;
    if (!std::filesystem::exists(platform::u8path(path), ec)) fail(ErrorKind::Io, "{} {}: no such file or folder", flag, path);
    log::warn("{} {}: {} {}; the file is not read", flag, path, family, why);
}

/// The KL decoder or a TAESD decoder on FamilyOptions::vae_device.
struct FamilyBase::DecoderWhole {
    std::unique_ptr<runtime::GraphRunner> runner;
    std::unique_ptr<vae::AutoencoderKLModel> kl;
    std::unique_ptr<io::WeightIndex> taesd_index;
    std::unique_ptr<vae::TinyAutoencoder> taesd;
    size_t param_bytes() const {
        if (kl) return bound_bytes(kl->module());
        size_t b = 0;
        if (taesd && taesd->decoder()) b += bound_bytes(*taesd->decoder());
        if (taesd && taesd->encoder()) b += bound_bytes(*taesd->encoder());
        return b;
    }
};

/// The KL encoder on FamilyOptions::vae_device.
struct FamilyBase::EncoderWhole {
    std::unique_ptr<runtime::GraphRunner> runner;
    std::unique_ptr<vae::AutoencoderKLModel> kl;
    size_t param_bytes() const { return bound_bytes(kl->module()); }
};

FamilyBase::FamilyBase(const ModelFiles& files, const FamilyOptions& opt) : files_(files), opt_(opt) {
    weight_type_ = parse_weight_type(opt.weight_type);
}

FamilyBase::~FamilyBase() = default;

const io::WeightIndex& FamilyBase::index_for(const ModuleSource& s, std::unique_ptr<io::WeightIndex>& own) const {
    if (dit_idx_ && s.path == dit_src_.path) return *dit_idx_;
    if (vae_idx_ && s.path == vae_src_.path) return *vae_idx_;
    own = open_index(s.path, s.flag);
    return *own;
}

vae::VaeDecoderSource FamilyBase::vae_source() const {
    vae::VaeDecoderSource s;
    s.index = &vae_index();
    s.src = *vae_.kl;
    if (const nlohmann::json* vc = s.index->config()) s.overrides = vae::kl_overrides_from_diffusers_config(*vc);
    s.overrides.conv_direct = opt_.vae_conv_direct;
    return s;
}

FamilyBase::VaeHeaders FamilyBase::read_vae_headers(const VaeExpect& e) {
    if (vae_src_.empty()) fail(ErrorKind::ModelMismatch, "{}: no VAE given; {}", dit_src_.named(), e.no_vae);
    if (vae_src_.path != dit_src_.path) vae_idx_ = open_index(vae_src_.path, vae_src_.flag);
    const io::WeightIndex& vi = vae_index();
    auto kl = vae::find_autoencoder_kl(vi);
    if (!kl) fail(ErrorKind::ModelMismatch, "{}: no AutoencoderKL (VAE) found in it; {}", vae_src_.named(), e.no_kl);
    check_vae_kind(vi, *kl, e.latent_channels, vae_src_.named(), e.family, e.needed);
    VaeHeaders h;
    h.kl = *kl;
    vae::KLOverrides kov;
    if (const nlohmann::json* vc = vi.config()) kov = vae::kl_overrides_from_diffusers_config(*vc);
    h.cfg = vae::infer_autoencoder_kl_config(vi, h.kl, kov);
    if (h.cfg.latent_channels != e.latent_channels)
        fail(ErrorKind::ModelMismatch, "{}: the VAE has {} latent channels; {}", vae_src_.named(), h.cfg.latent_channels, e.wrong_channels);
    if (const nlohmann::json* vc = vi.config()) {
        if (vc->contains("scaling_factor") && (*vc)["scaling_factor"].is_number()) h.scaling = (*vc)["scaling_factor"].get<float>();
        if (vc->contains("shift_factor") && (*vc)["shift_factor"].is_number()) h.shift = (*vc)["shift_factor"].get<float>();
    }
    return h;
}

void FamilyBase::take_taesd() {
    if (files_.taesd.empty()) return;
    std::error_code ec;
    if (!std::filesystem::exists(platform::u8path(files_.taesd), ec)) fail(ErrorKind::Io, "--taesd {}: no such file or folder", files_.taesd);
    taesd_path_ = files_.taesd;
}

FamilyBase::OpenedVae FamilyBase::open_vae(const VaeExpect& e) {
    take_taesd();
    OpenedVae o;
    if (!vae_src_.empty() || taesd_path_.empty()) {
        const VaeHeaders vh = read_vae_headers(e);
        o.kl = vh.kl;
        o.spatial_factor = vh.cfg.spatial_factor();
        o.scaling = vh.scaling;
        o.shift = vh.shift;
    }
    return o;
}

std::vector<std::pair<int64_t, int64_t>> FamilyBase::encode_sizes() const {
    return vae::encode_sizes_at(opt_.vae_encode_sizes, size_multiple());
}

void FamilyBase::add_vae(VaeSetup setup) {
    vae_ = std::move(setup);
    if (decodes_with_taesd()) {
        // the decoder's first convolution takes the latent channels: checked from the headers now
        const auto ti = open_index(taesd_path_, "--taesd");
        const vae::TaesdSource ts = vae::find_taesd(*ti);
        if (!ts.decoder_prefix) fail(ErrorKind::ModelMismatch, "--taesd {}: holds no TAESD decoder; pass {}", taesd_path_, vae_.taesd_kind);
        int64_t channels = 0;
        for (const vae::TaesdLayer& l : vae::parse_taesd_layers(*ti, *ts.decoder_prefix, vae::TaesdPart::Decoder))
            if (l.kind == vae::TaesdLayer::Kind::Conv) {
                channels = l.in;
                break;
            }
        if (channels != vae_.taesd_channels)
            fail(ErrorKind::ModelMismatch, "--taesd {}: a {}-channel tiny autoencoder; {} have {} channels: pass {}", taesd_path_, channels,
                 vae_.taesd_latents.empty() ? name() + " latents" : vae_.taesd_latents, vae_.taesd_channels, vae_.taesd_kind);
    }
    const auto no_vae = [this] {
        if (!vae_.kl) fail(ErrorKind::ModelMismatch, "no VAE: pass one with --vae FILE");
    };
    // the KL decoder or encoder whole: its own runner on the vae device, F32 weights
    const auto load_kl = [this](runtime::GraphRunner& runner, vae::KLParts parts) {
        const io::WeightIndex& vi = vae_index();
        vae::KLOverrides kov;
        if (const nlohmann::json* vc = vi.config()) kov = vae::kl_overrides_from_diffusers_config(*vc);
        kov.conv_direct = opt_.vae_conv_direct;
        return vae::AutoencoderKLModel::load(vi, *vae_.kl, runner.backend(), kov, parts);
    };

    ModuleSlot<DecoderWhole, vae::PlacedVaeDecoder>::Hooks dh;
    dh.load_whole = [this, no_vae, load_kl] {
        auto d = std::make_unique<DecoderWhole>();
        d->runner = std::make_unique<runtime::GraphRunner>(opt_.vae_device, opt_.threads);
        if (decodes_with_taesd()) {
            d->taesd_index = open_index(taesd_path_, "--taesd");
            d->taesd = vae::TinyAutoencoder::load(*d->taesd_index, d->runner->backend());
            d->taesd->set_conv_direct(opt_.vae_conv_direct);  // (its kind checked in add_vae)
            return d;
        }
        no_vae();
        d->kl = load_kl(*d->runner, vae::KLParts::DecoderOnly);
        return d;
    };
    dh.load_placed = [this, no_vae] {  // planned and loaded on the first decode (the plan needs the latent's shape)
        no_vae();
        return std::make_unique<vae::PlacedVaeDecoder>(vae_source(), *opt_.placement, opt_.threads, vae_.flash_attn);
    };
    dh.whole_under_placement = [this] { return decodes_with_taesd(); };
    dh.files = [this]() -> std::vector<std::string> {
        std::vector<std::string> r;
        if (decodes_with_taesd()) {
            r.push_back(taesd_path_);
            if (vae_.taesd_reads_vae_file) r.push_back(vae_src_.path);
            return r;
        }
        if (!vae_src_.empty()) r.push_back(vae_src_.path);
        return r;
    };
    dh.costs = [this](int64_t h, int64_t w) {
        std::vector<placement::ModuleCosts> out;
        const int64_t s = vae_.latent_scale;
        if (vae_.kl && vae_.kl->has_decoder && !decodes_with_taesd())  // the AutoencoderKL decoder at the job's latent and tiling
            out.push_back(vae::vae_decoder_costs(vae_source(), opt_.threads, vae_.flash_attn, s * h, s * w,
                                                       vae::planned_tiling(opt_.vae_tile, vae_.tile_factor)));
        if (decodes_with_taesd()) {  // --taesd: the TAESD decoder is the vae module (run whole, untiled)
            auto ti = open_index(taesd_path_, "--taesd");
            out.push_back(vae::taesd_decoder_costs(*ti, s * h, s * w, opt_.vae_conv_direct));
        }
        return out;
    };
    dec_ = &modules_.add<DecoderWhole, vae::PlacedVaeDecoder>(Module::VaeDecoder, std::move(dh));

    ModuleSlot<EncoderWhole, vae::PlacedVaeEncoder>::Hooks eh;
    eh.load_whole = [this, no_vae, load_kl] {
        no_vae();
        auto e = std::make_unique<EncoderWhole>();
        e->runner = std::make_unique<runtime::GraphRunner>(opt_.vae_device, opt_.threads);
        e->kl = load_kl(*e->runner, vae::KLParts::EncoderOnly);
        return e;
    };
    eh.load_placed = [this, no_vae] {  // planned and loaded on the first encode (the plan needs the image's shape)
        no_vae();
        return std::make_unique<vae::PlacedVaeEncoder>(vae_source(), *opt_.placement, opt_.threads, vae_.flash_attn);
    };
    eh.files = [this]() -> std::vector<std::string> {
        if (vae_src_.empty()) return {};
        return {vae_src_.path};
    };
    enc_ = &modules_.add<EncoderWhole, vae::PlacedVaeEncoder>(Module::VaeEncoder, std::move(eh));
}

vae::HostTensor FamilyBase::decode_taesd(const vae::HostTensor& z) {
    DecoderWhole& d = *dec_->whole();
    vae::ExecOptions ex;
    ex.flash_attn = vae_.flash_attn;
    ex.n_threads = opt_.threads;
    ex.compute_bytes = dec_->compute_counter();  // the stage line's compute figure
    if (!opt_.placement) return d.taesd->decode(z, ex);
    // under placement flags: the TAESD runs whole on the vae entry's first device; its plan (the
    // vae row) and measured peak (parameter buffer + compute buffer) join the plans printed
    const auto budgets = placement::resolve_budgets(*opt_.placement, placement::list_devices());
    const placement::PlacementSpec ts = vae::taesd_spec(*opt_.placement);
    placement::ModulePlan plan = placement::plan_module(placement::PModule::Vae, ts[placement::PModule::Vae], false,
                                                        vae::taesd_decoder_costs(*d.taesd_index, z.h, z.w, opt_.vae_conv_direct), budgets);
    size_t compute = 0;
    ex.compute_bytes = &compute;
    vae::HostTensor img = d.taesd->decode(z, ex);
    dec_->note_compute(compute);
    const std::string dev = ts[placement::PModule::Vae].devices.front();
    dec_->keep_run(std::move(plan), dev, vae::taesd_measured_peak(d.taesd->decoder_param_bytes(), compute));
    return img;
}

vae::HostTensor FamilyBase::decode_kl(const vae::HostTensor& z, const vae::TilingOptions& tiling) {
    if (auto* p = dec_->placed()) return p->decode(z, tiling);
    vae::ExecOptions ex;
    ex.flash_attn = vae_.flash_attn;
    ex.n_threads = opt_.threads;
    ex.compute_bytes = dec_->compute_counter();  // the stage line's compute figure
    return dec_->whole()->kl->decode(z, tiling, ex);
}

vae::HostTensor FamilyBase::decode_scaled(const vae::HostTensor& latent, const vae::TilingOptions& tiling, float scaling, float shift) {
    load(Module::VaeDecoder);
    if (decodes_with_taesd()) return decode_taesd(latent);
    vae::HostTensor z = latent;
    if (shift != 0.0f)
        for (auto& v : z.data) v = v / scaling + shift;
    else
        for (auto& v : z.data) v /= scaling;
    return decode_kl(z, tiling);
}

vae::LatentDist FamilyBase::encode_kl(const vae::HostTensor& image, const vae::TilingOptions& tiling) {
    if (!vae_.kl && decodes_with_taesd())
        fail(ErrorKind::InvalidInput,
             "an init image (-i) is encoded with the VAE encoder, and --taesd {} only decodes: pass {} with --vae FILE for img2img", taesd_path_,
             vae_.vae_needed);
    load(Module::VaeEncoder);
    if (auto* p = enc_->placed()) return p->encode(image, tiling);
    vae::ExecOptions ex;
    ex.flash_attn = vae_.flash_attn;
    ex.n_threads = opt_.threads;
    ex.compute_bytes = enc_->compute_counter();  // the stage line's compute figure
    return enc_->whole()->kl->encode(image, tiling, ex);
}

std::vector<placement::ModuleCosts> FamilyBase::placement_costs(int64_t h, int64_t w) {
    check_planned_latent(h, w);
    return modules_.costs(h, w, costs_skip_te());
}

std::optional<placement::ModuleCosts> FamilyBase::encode_costs(int tile) {
    if (!(vae_.kl && vae_.kl->has_encoder)) return std::nullopt;
    const auto sizes = encode_sizes();
    if (sizes.empty()) return std::nullopt;
    return vae::encode_stage_costs(vae_source(), opt_.threads, vae_.flash_attn, sizes, vae::planned_tiling(tile, vae_.tile_factor));
}

std::vector<placement::ModulePlan> FamilyBase::plan_placement(int64_t h, int64_t w) {
    if (!opt_.placement) return {};
    const auto budgets = placement::resolve_budgets(*opt_.placement, placement::list_devices());
    std::optional<std::string> taesd_warning;
    const placement::PlacementSpec spec = decodes_with_taesd() ? vae::taesd_spec(*opt_.placement, &taesd_warning) : *opt_.placement;
    if (taesd_warning) log::warn("{}", *taesd_warning);
    auto plans = placement::plan_modules(spec, placement_costs(h, w), budgets);
    // the encode stage (img2img, in-painting, reference images): the VAE encoder under the vae entry
    if (auto ec = encode_costs(opt_.vae_tile)) plans.push_back(vae::plan_encode_stage(*ec, *opt_.placement, budgets));
    return plans;
}

void FamilyBase::set_loras(const std::vector<lora::OpenedLora>& loras, lora::ApplyMode mode) {
    std::vector<lora::LoraRequest> reqs;
    for (const auto& l : loras) reqs.push_back(l.request);
    std::string key = lora::lora_set_key(reqs, mode);
    if (key == lora_key_) return;
    // modules loaded with the old set load again with the new one
    modules_.unload(Module::Te);
    modules_.unload(Module::Diffusion);
    lora_reg_.reset();
    lora_key_.clear();
    if (key.empty()) return;
    LoraTargets t;
    lora_targets(t);
    const auto patches = lora::build_patches(t.km, loras, t.info, mode);
    std::vector<nn::PatchEntry> entries;
    for (const auto& [component, cp] : patches) {
        auto src = t.sources.find(component);
        if (src == t.sources.end()) fail(ErrorKind::Internal, "LoRA: no weight source for component {}", component);
        for (const std::string& name : cp->names()) {
            const io::TensorInfo* info = src->second->find(name);
            if (!info) continue;  // an optional weight this file lacks: nothing to patch
            entries.push_back({nn::stored_key(src->second->index(), *info), cp, name});
        }
    }
    lora_reg_ = nn::register_patches(std::move(entries));
    lora_key_ = std::move(key);
}

void FamilyBase::add_qwen3_lora_targets(LoraTargets& t, const io::WeightIndex& index, std::unique_ptr<io::WeightIndex> own,
                                        const qwen3::Qwen3Keys& keys, const qwen3::Qwen3Config& cfg) {
    qwen3::Qwen3Model q(cfg);
    lora::add_qwen3_targets(t.km, 0, q, cfg);
    t.sources["qwen3"] = std::make_unique<nn::TensorSource>(qwen3::make_tensor_source(index, keys, cfg));
    if (own) t.own.push_back(std::move(own));
}

qwen3::Qwen3RunOptions FamilyBase::qwen3_run_options() const {
    qwen3::Qwen3RunOptions ro;
    ro.device = opt_.te_device;
    ro.threads = opt_.threads;
    ro.weight_type = weight_type_;
    ro.flash_attn = opt_.flash_attn_te;
    return ro;
}

void FamilyBase::lora_targets(LoraTargets&) {
    fail(ErrorKind::Unsupported, "{} takes no LoRAs in this build: remove --lora / <lora:...> (or give weight 0)", name());
}

void set_loras(Family& fam, const std::vector<lora::OpenedLora>& loras, lora::ApplyMode mode) {
    if (auto* fb = dynamic_cast<FamilyBase*>(&fam)) return fb->set_loras(loras, mode);
    if (!loras.empty()) fail(ErrorKind::Unsupported, "{} takes no LoRAs in this build: remove --lora / <lora:...> (or give weight 0)", fam.name());
}

}  // namespace easel::models
