#include "models/zimage/z_image.h"

#include "core/error.h"
#include "models/model_files.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/diffusers.h"
#include "text/qwen_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace easel::models::zimage {

namespace fs = std::filesystem;

namespace {

std::string flag_of(const std::string& flag_and_path) { return flag_and_path.substr(0, flag_and_path.find(' ')); }

/// "Qwen3-4B (hidden 2560)" for the real cap_feat_dim, else "a Qwen3 model with hidden size D".
std::string expected_te(int64_t cap_feat_dim) {
    if (cap_feat_dim == 2560) return "Qwen3-4B (hidden size 2560)";
    return fmt::format("a Qwen3 text encoder with hidden size {}", cap_feat_dim);
}

}  // namespace

bool is_zimage(const io::WeightIndex& index) { return find_zimage_dit(index).has_value(); }

ZImage::~ZImage() = default;

std::unique_ptr<ZImage> ZImage::open(const ModelFiles& files, const FamilyOptions& opt) {
    std::unique_ptr<ZImage> m(new ZImage());
    m->files_ = files;
    m->opt_ = opt;
    m->weight_type_ = parse_weight_type(opt.weight_type);
    if (files.model.empty() && files.diffusion_model.empty())
        fail(ErrorKind::InvalidInput, "no model given: pass -m MODEL (a diffusers folder or a Z-Image file) or --diffusion-model");
    if (!(opt.flow_shift >= 0.0f) || !std::isfinite(opt.flow_shift))
        fail(ErrorKind::InvalidInput, "--flow-shift {}: must be a positive number (0 = the model's default)", opt.flow_shift);

    std::optional<nlohmann::json> sched_cfg;
    if (!files.model.empty()) {
        if (io::is_pipeline_folder(files.model)) {
            std::string pipeline_class;
            auto comps = io::list_pipeline_components(files.model, &pipeline_class);
            for (auto& c : comps) {
                if (c.name == "transformer") m->dit_path_ = c.folder.string();
                else if (c.name == "vae") m->vae_path_ = c.folder.string();
                else if (c.name == "text_encoder") m->te_path_ = c.folder.string();
                else if (c.name == "scheduler") sched_cfg = read_json(c.folder / "scheduler_config.json");
                else if (c.name == "tokenizer") {
                    std::error_code ec;
                    if (fs::is_regular_file(c.folder / "tokenizer.json", ec)) m->tokenizer_json_ = (c.folder / "tokenizer.json").string();
                }
            }
            if (m->dit_path_.empty() && files.diffusion_model.empty())
                fail(ErrorKind::ModelMismatch, "-m {}: this diffusers pipeline ({}) has no transformer folder; Z-Image pipelines have one",
                     files.model, pipeline_class.empty() ? "unknown class" : pipeline_class);
            m->model_desc_ = "diffusers folder " + files.model;
        } else {
            m->dit_path_ = m->vae_path_ = m->te_path_ = files.model;
            m->model_desc_ = files.model;
        }
        m->dit_flag_ = m->vae_flag_ = m->te_flag_ = "-m " + files.model;
    }
    if (!files.diffusion_model.empty()) {
        m->dit_path_ = files.diffusion_model;
        m->dit_flag_ = "--diffusion-model " + files.diffusion_model;
        if (m->model_desc_.empty()) m->model_desc_ = files.diffusion_model;
    }
    if (!files.vae.empty()) {
        m->vae_path_ = files.vae;
        m->vae_flag_ = "--vae " + files.vae;
    }
    if (!files.llm.empty()) {
        m->te_path_ = files.llm;
        m->te_flag_ = "--llm " + files.llm;
    }

    // Transformer configuration from its headers.
    m->dit_idx_ = open_index(m->dit_path_, flag_of(m->dit_flag_));
    auto keys = find_zimage_dit(*m->dit_idx_);
    if (!keys)
        fail(ErrorKind::ModelMismatch, "{}: no Z-Image transformer in it (no x_pad_token / cap_pad_token); pass the Z-Image model as -m or --diffusion-model",
             m->dit_flag_);
    ZImageOverrides dov;
    if (const nlohmann::json* dc = m->dit_idx_->config()) dov = overrides_from_config_json(*dc);
    m->dcfg_ = infer_config(*m->dit_idx_, *keys, dov);
    if (m->dcfg_.in_channels != 16)
        fail(ErrorKind::ModelMismatch, "{}: the transformer takes {} latent channels; Z-Image's take 16", m->dit_flag_, m->dcfg_.in_channels);

    // VAE configuration from its headers.
    if (m->vae_path_.empty())
        fail(ErrorKind::ModelMismatch, "{}: no VAE given; pass the FLUX.1 VAE (ae.safetensors) with --vae FILE", m->dit_flag_);
    if (m->vae_path_ == m->dit_path_) {
        // one file holding both: no second index
    } else {
        m->vae_idx_ = open_index(m->vae_path_, flag_of(m->vae_flag_));
    }
    const io::WeightIndex& vi = m->vae_idx_ ? *m->vae_idx_ : *m->dit_idx_;
    m->kl_ = vae::find_autoencoder_kl(vi);
    if (!m->kl_)
        fail(ErrorKind::ModelMismatch, "{}: no AutoencoderKL (VAE) found in it; pass the FLUX.1 VAE (ae.safetensors) with --vae FILE", m->vae_flag_);
    vae::KLOverrides kov;
    if (const nlohmann::json* vc = vi.config()) kov = vae::kl_overrides_from_diffusers_config(*vc);
    auto kcfg = vae::infer_autoencoder_kl_config(vi, *m->kl_, kov);
    if (kcfg.latent_channels != m->dcfg_.in_channels)
        fail(ErrorKind::ModelMismatch, "{}: the VAE has {} latent channels; Z-Image needs the 16-channel FLUX.1 VAE (ae.safetensors)",
             m->vae_flag_, kcfg.latent_channels);
    m->spatial_factor_ = kcfg.spatial_factor();
    if (const nlohmann::json* vc = vi.config()) {
        if (vc->contains("scaling_factor") && (*vc)["scaling_factor"].is_number()) m->scaling_factor_ = (*vc)["scaling_factor"].get<float>();
        if (vc->contains("shift_factor") && (*vc)["shift_factor"].is_number()) m->shift_factor_ = (*vc)["shift_factor"].get<float>();
    }

    // Noise process: static shift.
    double shift = kDefaultFlowShift;
    m->shift_src_ = "Z-Image default";
    if (sched_cfg && sched_cfg->contains("shift") && (*sched_cfg)["shift"].is_number()) {
        shift = (*sched_cfg)["shift"].get<double>();
        m->shift_src_ = "scheduler_config.json";
        if (sched_cfg->value("use_dynamic_shifting", false))
            log::warn("scheduler_config.json asks for dynamic shifting; ZImagePipeline's Turbo config uses the static shift {}, which easel applies", shift);
    }
    if (opt.flow_shift > 0.0f) {
        shift = opt.flow_shift;
        m->shift_src_ = "--flow-shift";
    }
    m->ms_ = std::make_unique<sampling::ModelSampling>(sampling::ModelSampling::flow(shift));
    return m;
}

std::string ZImage::name() const { return "Z-Image"; }

std::string ZImage::describe() const {
    return fmt::format("Z-Image ({}), transformer {}, flow shift {} ({}){}", model_desc_, dcfg_.summary(), ms_->shift(), shift_src_,
                       te_desc_.empty() ? "" : ", text encoder " + te_desc_);
}

LatentFormat ZImage::latent_format() const {
    LatentFormat f;
    f.channels = dcfg_.in_channels;
    f.spatial_factor = spatial_factor_;
    f.scaling_factor = scaling_factor_;
    f.shift_factor = shift_factor_;
    return f;
}

const sampling::ModelSampling& ZImage::model_sampling() const { return *ms_; }

SamplingDefaults ZImage::defaults() const {
    SamplingDefaults d;
    d.sampler = "euler";
    d.scheduler = "discrete";
    d.steps = 8;
    d.cfg_scale = 1.0f;
    d.clip_skip = 0;
    d.width = d.height = 1024;
    return d;
}

sampling::ScheduleOptions ZImage::schedule_options() const {
    sampling::ScheduleOptions o;
    o.flow_pipeline_sigmas = true;
    return o;
}

std::vector<std::string> ZImage::module_files(Module m) const {
    switch (m) {
    case Module::Te: {
        std::vector<std::string> r;
        if (!te_path_.empty()) r.push_back(te_path_);
        if (!tokenizer_json_.empty()) r.push_back(tokenizer_json_);
        return r;
    }
    case Module::Diffusion: return {dit_path_};
    case Module::VaeDecoder:
    case Module::VaeEncoder: return {vae_path_};
    }
    return {};
}

runtime::GraphRunner& ZImage::runner(Module) {
    if (!vae_runner_) vae_runner_ = std::make_unique<runtime::GraphRunner>(opt_.vae_device, opt_.threads);
    return *vae_runner_;
}

bool ZImage::loaded(Module m) const {
    switch (m) {
    case Module::Te: return te_ != nullptr;
    case Module::Diffusion: return dit_ != nullptr;
    case Module::VaeDecoder: return vae_dec_ != nullptr;
    case Module::VaeEncoder: return vae_enc_ != nullptr;
    }
    return false;
}

const text::QwenTokenizer& ZImage::tokenizer() const {
    if (tokenizer_json_.empty()) return text::QwenTokenizer::builtin();
    if (!own_tokenizer_) own_tokenizer_ = std::make_unique<text::QwenTokenizer>(text::QwenTokenizer::from_file(tokenizer_json_));
    return *own_tokenizer_;
}

void ZImage::load(Module m) {
    if (loaded(m)) return;
    switch (m) {
    case Module::Te: {
        if (te_path_.empty())
            fail(ErrorKind::ModelMismatch, "no text encoder: pass {} with --llm FILE", expected_te(dcfg_.cap_feat_dim));
        std::unique_ptr<io::WeightIndex> own;
        const io::WeightIndex* ti = nullptr;
        if (te_path_ == dit_path_) ti = dit_idx_.get();
        else if (vae_idx_ && te_path_ == vae_path_) ti = vae_idx_.get();
        else {
            own = open_index(te_path_, flag_of(te_flag_));
            ti = own.get();
        }
        // Header checks before any weight is read: a Qwen3 model, of the transformer's width.
        auto keys = qwen3::find_qwen3(*ti);
        if (!keys)
            fail(ErrorKind::ModelMismatch, "{}: no Qwen3 text encoder found in it; Z-Image expects {}; pass it with --llm FILE", te_flag_,
                 expected_te(dcfg_.cap_feat_dim));
        qwen3::Qwen3Config qc = qwen3::infer_config(*ti, *keys);
        if (qc.hidden != dcfg_.cap_feat_dim)
            fail(ErrorKind::ModelMismatch,
                 "{}: the text encoder's hidden size {} does not match the transformer's caption width {}: this Z-Image transformer expects {}",
                 te_flag_, qc.hidden, dcfg_.cap_feat_dim, expected_te(dcfg_.cap_feat_dim));
        if (qc.layers < 2)
            fail(ErrorKind::ModelMismatch, "{}: the text encoder has {} layer(s); Z-Image reads hidden_states[-2] and needs at least 2", te_flag_,
                 qc.layers);
        qwen3::Qwen3RunOptions ro;
        ro.device = opt_.te_device;
        ro.threads = opt_.threads;
        ro.weight_type = weight_type_;
        ro.flash_attn = opt_.flash_attn_te;
        te_ = std::make_unique<qwen3::Qwen3TextEncoder>(*ti, ro);
        te_desc_ = fmt::format("Qwen3 hidden {} x {} layers", qc.hidden, qc.layers);
        break;
    }
    case Module::Diffusion: {
        ZImageLoadOptions lo;
        lo.device = opt_.diffusion_device;
        lo.threads = opt_.threads;
        lo.flash_attn = opt_.flash_attn_diffusion;
        lo.weight_type = weight_type_;
        if (const nlohmann::json* dc = dit_idx_->config()) lo.overrides = overrides_from_config_json(*dc);
        dit_ = LoadedZImageDiT::load(*dit_idx_, lo);
        break;
    }
    case Module::VaeDecoder:
    case Module::VaeEncoder: {
        const io::WeightIndex& vi = vae_idx_ ? *vae_idx_ : *dit_idx_;
        vae::KLOverrides kov;
        if (const nlohmann::json* vc = vi.config()) kov = vae::kl_overrides_from_diffusers_config(*vc);
        auto& slot = m == Module::VaeEncoder ? vae_enc_ : vae_dec_;
        slot = vae::AutoencoderKLModel::load(vi, *kl_, runner(m).backend(), kov,
                                             m == Module::VaeEncoder ? vae::KLParts::EncoderOnly : vae::KLParts::DecoderOnly);
        break;
    }
    }
    log::debug("loaded {} ({:.1f} MiB)", module_name(m), (double)param_bytes(m) / (1024.0 * 1024.0));
}

void ZImage::unload(Module m) {
    switch (m) {
    case Module::Te: te_.reset(); break;
    case Module::Diffusion: dit_.reset(); break;
    case Module::VaeDecoder:
        vae_dec_.reset();
        if (!vae_enc_) vae_runner_.reset();
        break;
    case Module::VaeEncoder:
        vae_enc_.reset();
        if (!vae_dec_) vae_runner_.reset();
        break;
    }
}

size_t ZImage::param_bytes(Module m) const {
    switch (m) {
    case Module::Te: return te_ ? te_->param_bytes() : 0;
    case Module::Diffusion: return dit_ ? dit_->param_bytes() : 0;
    case Module::VaeDecoder: return vae_dec_ ? bound_bytes(vae_dec_->module()) : 0;
    case Module::VaeEncoder: return vae_enc_ ? bound_bytes(vae_enc_->module()) : 0;
    }
    return 0;
}

size_t ZImage::compute_bytes(Module m) const {
    switch (m) {
    case Module::Te: return te_compute_;
    case Module::Diffusion: return dit_ ? std::max(dit_compute_, dit_->compute_bytes()) : dit_compute_;
    case Module::VaeDecoder: return vae_dec_compute_;
    case Module::VaeEncoder: return vae_enc_compute_;
    }
    return 0;
}

std::vector<int32_t> ZImage::prompt_ids(const std::string& prompt) const {
    const text::QwenTokenizer& tok = tokenizer();
    std::vector<int32_t> ids = tok.encode(text::QwenTokenizer::chat_prompt(prompt, /*empty_think=*/false));
    if ((int64_t)ids.size() > kMaxPromptTokens) {
        log::warn("the prompt has {} tokens with the chat template; Z-Image reads the first {} (diffusers' max_sequence_length)", ids.size(),
                  kMaxPromptTokens);
        ids.resize((size_t)kMaxPromptTokens);
    }
    return ids;
}

Conditioning ZImage::encode_prompt(const std::string& prompt, int /*clip_skip*/) {
    std::vector<int32_t> ids = prompt_ids(prompt);
    load(Module::Te);
    const int64_t vocab = te_->config().vocab;
    for (int32_t id : ids)
        if (id < 0 || id >= vocab)
            fail(ErrorKind::ModelMismatch, "{}: token id {} is outside the text encoder's vocabulary of {}; Z-Image expects {} with Qwen's vocabulary",
                 te_flag_, id, vocab, expected_te(dcfg_.cap_feat_dim));
    const int64_t L = (int64_t)ids.size();
    const int index = -2;
    auto hs = te_->run(ids, {}, 1, L, std::span<const int>(&index, 1));
    te_compute_ = std::max(te_compute_, te_->runner().last_compute_bytes());
    Conditioning r;
    r.dim = hs[0].ne[0];
    r.tokens = L;
    r.context = std::move(hs[0].data);
    r.token_ids = std::move(ids);
    return r;
}

void ZImage::diffusion(std::span<const float> x, std::span<const float> concat, int64_t h, int64_t w, double timestep,
                       const Conditioning& cond, std::span<float> out) {
    const int64_t C = dcfg_.in_channels;
    if (!concat.empty())
        fail(ErrorKind::InvalidInput, "Z-Image's transformer takes no extra input channels (got {} values); in-painting is not supported", concat.size());
    if (h <= 0 || w <= 0 || h % dcfg_.patch != 0 || w % dcfg_.patch != 0)
        fail(ErrorKind::InvalidInput, "latent size {}x{}: Z-Image needs a multiple of {} latent cells (image sides a multiple of {} pixels)", w, h,
             dcfg_.patch, dcfg_.patch * spatial_factor_);
    if ((int64_t)x.size() != C * h * w)
        fail(ErrorKind::InvalidInput, "transformer latent input has {} values, expected {}x{}x{}", x.size(), C, h, w);
    if ((int64_t)out.size() != C * h * w)
        fail(ErrorKind::InvalidInput, "transformer output buffer has {} values, expected {}x{}x{}", out.size(), C, h, w);
    if (cond.dim != dcfg_.cap_feat_dim)
        fail(ErrorKind::ModelMismatch, "conditioning width {} does not match the transformer's caption width {} ({} expected)", cond.dim,
             dcfg_.cap_feat_dim, expected_te(dcfg_.cap_feat_dim));
    if (cond.tokens <= 0 || (int64_t)cond.context.size() != cond.tokens * cond.dim)
        fail(ErrorKind::InvalidInput, "conditioning context has {} values, expected {} tokens x {}", cond.context.size(), cond.tokens, cond.dim);
    if (!std::isfinite(timestep)) fail(ErrorKind::InvalidInput, "timestep {} is not finite", timestep);
    load(Module::Diffusion);
    // ZImagePipeline: timestep = (1000 - t) / 1000 in float32, t = sigma * 1000 (float32).
    const float t_sched = (float)timestep;
    const float t_model = (1000.0f - t_sched) / 1000.0f;
    dit_->forward(x.data(), h, w, t_model, cond.context.data(), cond.tokens, out.data());
    dit_compute_ = std::max(dit_compute_, dit_->compute_bytes());
    for (float& v : out) v = -v;  // velocity noise - x0 = -(model output)
}

vae::HostTensor ZImage::decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) {
    if (latent.c != dcfg_.in_channels)
        fail(ErrorKind::InvalidInput, "latent has {} channels; Z-Image latents have {}", latent.c, dcfg_.in_channels);
    load(Module::VaeDecoder);
    vae::ExecOptions ex;
    ex.n_threads = opt_.threads;
    vae::HostTensor z = latent;
    for (auto& v : z.data) v = v / scaling_factor_ + shift_factor_;
    return vae_dec_->decode(z, tiling, ex);
}

vae::LatentDist ZImage::encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) {
    load(Module::VaeEncoder);
    vae::ExecOptions ex;
    ex.n_threads = opt_.threads;
    return vae_enc_->encode(image, tiling, ex);
}

}  // namespace easel::models::zimage
