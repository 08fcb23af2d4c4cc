#include "models/sd/stable_diffusion.h"

#include "core/error.h"
#include "models/model_files.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/diffusers.h"
#include "text/prompt_syntax.h"
#include "placement/taesd.h"

#include <cmath>
#include <filesystem>
#include <fstream>

namespace easel::models::sd {

namespace fs = std::filesystem;

/// The CLIP text encoder under FamilyOptions::placement: built with the layers up to the
/// context layer of clip skip k (its final-norm output is then the SD context), run as a
/// PlacedSequence; rebuilt when k changes.
struct StableDiffusion::PlacedTe {
    using Placed = placement::PlacedSequence<clip::ClipInputs, clip::ClipState, clip::ClipOutputs>;
    const io::WeightIndex* index = nullptr;
    clip::ClipKeys keys;
    clip::ClipConfig base;  ///< the file's configuration (all layers)
    int k = 0;              ///< clip skip the model below is built for (0: none yet)
    std::unique_ptr<clip::ClipTextModel> net;
    std::unique_ptr<nn::TensorSource> src;
    std::unique_ptr<Placed> placed;
    std::map<std::string, uint64_t> old_peaks;  ///< of models freed when k changed
};

namespace {

/// The text encoder of clip skip k as a model of its own: the first layers + 1 - k layers of
/// `base` (hidden_states[-k] is the output of layer layers - k), whose final layer norm gives the
/// SD context (ClipTextModel::encode with final_norm_on_skip). Throws Error(InvalidInput) when
/// k exceeds the layers.
clip::ClipConfig te_config_for_skip(const clip::ClipConfig& base, int k) {
    if (k < 1 || k > base.layers) fail(ErrorKind::InvalidInput, "clip skip {} is larger than the {} layers of the text encoder", k, base.layers);
    clip::ClipConfig c = base;
    c.layers = base.layers + 1 - k;
    return c;
}

std::vector<ggml_tensor*> te_select(clip::ClipOutputs& o) { return {o.last_hidden_state}; }

}  // namespace

StableDiffusion::~StableDiffusion() = default;

const io::WeightIndex& StableDiffusion::te_headers(std::unique_ptr<io::WeightIndex>& own, clip::ClipKeys& keys, clip::ClipConfig& ccfg) const {
    if (te_path_.empty()) fail(ErrorKind::ModelMismatch, "no text encoder: {} has none; pass one with --clip_l FILE", unet_flag_);
    const std::string flag = te_flag_.substr(0, te_flag_.find(' '));
    const io::WeightIndex* ti = nullptr;
    if (te_path_ == unet_path_) ti = unet_idx_.get();
    else if (vae_idx_ && te_path_ == vae_path_) ti = vae_idx_.get();
    else {
        own = open_index(te_path_, flag);
        ti = own.get();
    }
    auto encs = clip::find_clip_text_encoders(*ti);
    if (encs.empty()) fail(ErrorKind::ModelMismatch, "{}: no CLIP text encoder found in it; pass one with --clip_l FILE", te_flag_);
    keys = encs.front();
    clip::ClipOverrides cov;
    if (const nlohmann::json* cj = ti->config()) cov = clip::overrides_from_config_json(*cj);
    ccfg = clip::infer_config(*ti, keys, cov);
    if (ccfg.width != ucfg_.context_dim)
        fail(ErrorKind::ModelMismatch, "the text encoder's width {} does not match the UNet's cross-attention width {}: {} expects {}", ccfg.width,
             ucfg_.context_dim, is_sd2() ? "an SD2.x UNet" : "an SD1.x UNet", is_sd2() ? "OpenCLIP ViT-H (width 1024)" : "CLIP ViT-L/14 (width 768)");
    return *ti;
}

std::unique_ptr<StableDiffusion> StableDiffusion::open(const ModelFiles& files, const FamilyOptions& opt) {
    std::unique_ptr<StableDiffusion> m(new StableDiffusion());
    m->files_ = files;
    m->opt_ = opt;
    m->weight_type_ = parse_weight_type(opt.weight_type);
    if (files.model.empty() && files.diffusion_model.empty())
        fail(ErrorKind::InvalidInput, "no model given: pass -m MODEL (a checkpoint file or a diffusers folder) or --diffusion-model");
    if (!files.t5xxl.empty() || !files.llm.empty() || !files.clip_g.empty())
        fail(ErrorKind::ModelMismatch, "--t5xxl/--llm/--clip_g are not used by SD1.x/SD2.x (their text encoder is --clip_l)");

    // Resolve the source of each module (paths only; nothing of the text encoder is read).
    if (!files.model.empty()) {
        if (io::is_pipeline_folder(files.model)) {
            std::string pipeline_class;
            auto comps = io::list_pipeline_components(files.model, &pipeline_class);
            for (auto& c : comps) {
                if (c.name == "unet") m->unet_path_ = c.folder.string();
                else if (c.name == "vae") m->vae_path_ = c.folder.string();
                else if (c.name == "text_encoder") {
                    m->te_path_ = c.folder.string();
                    m->te_pre_truncated_ = true;
                }
                else if (c.name == "scheduler") m->sched_cfg_ = read_json(c.folder / "scheduler_config.json");
                else if (c.name == "tokenizer") {
                    // pad_token: special_tokens_map.json, or tokenizer_config.json where transformers 5
                    // saved no special_tokens_map.json
                    std::error_code ec;
                    m->tokenizer_special_ = c.folder / "special_tokens_map.json";
                    if (!std::filesystem::exists(m->tokenizer_special_, ec)) m->tokenizer_special_ = c.folder / "tokenizer_config.json";
                }
            }
            if (m->unet_path_.empty() && files.diffusion_model.empty())
                fail(ErrorKind::ModelMismatch, "-m {}: this diffusers pipeline ({}) has no unet folder; SD1.x/SD2.x pipelines have one",
                     files.model, pipeline_class.empty() ? "unknown class" : pipeline_class);
            m->model_desc_ = "diffusers folder " + files.model;
        } else {
            m->unet_path_ = m->vae_path_ = m->te_path_ = files.model;
            m->model_desc_ = files.model;
        }
        m->unet_flag_ = m->vae_flag_ = m->te_flag_ = "-m " + files.model;
    }
    if (!files.diffusion_model.empty()) {
        m->unet_path_ = files.diffusion_model;
        m->unet_flag_ = "--diffusion-model " + files.diffusion_model;
        if (m->model_desc_.empty()) m->model_desc_ = files.diffusion_model;
    }
    if (!files.vae.empty()) {
        m->vae_path_ = files.vae;
        m->vae_flag_ = "--vae " + files.vae;
    }
    if (!files.clip_l.empty()) {
        m->te_path_ = files.clip_l;
        m->te_flag_ = "--clip_l " + files.clip_l;
    }
    if (!files.taesd.empty()) {
        std::error_code ec;
        if (!fs::exists(files.taesd, ec)) fail(ErrorKind::Io, "--taesd {}: no such file or folder", files.taesd);
        m->taesd_path_ = files.taesd;
    }

    // UNet configuration from its headers.
    m->unet_idx_ = open_index(m->unet_path_, m->unet_flag_.substr(0, m->unet_flag_.find(' ')));
    try {
        m->ucfg_ = infer_unet_config(*m->unet_idx_);
    } catch (const Error& e) {
        if (e.kind() == ErrorKind::ModelMismatch)
            fail(ErrorKind::ModelMismatch, "{}: no SD1.x/SD2.x UNet in this file ({}); pass an SD checkpoint as -m, or the UNet as --diffusion-model",
                 m->unet_flag_, e.what());
        throw;
    }
    if (m->ucfg_.context_dim != 768 && m->ucfg_.context_dim != 1024)
        log::debug("UNet cross-attention width {} (not SD1.x 768 / SD2.x 1024): treating as SD1.x-style", m->ucfg_.context_dim);

    // VAE configuration from its headers (latent factor, scaling factor).
    if (!m->vae_path_.empty()) {
        if (m->vae_path_ == m->unet_path_ && files.diffusion_model.empty()) {
            // the same single file: no second index
        } else {
            m->vae_idx_ = open_index(m->vae_path_, m->vae_flag_.substr(0, m->vae_flag_.find(' ')));
        }
        const io::WeightIndex& vi = m->vae_idx_ ? *m->vae_idx_ : *m->unet_idx_;
        m->kl_ = vae::find_autoencoder_kl(vi);
        if (m->kl_) {
            check_vae_kind(vi, *m->kl_, 4, m->vae_flag_.empty() ? m->unet_flag_ : m->vae_flag_, "SD1.x/SD2.x",
                           "a 4-channel SD VAE (pass the right one with --vae)");
            vae::KLOverrides kov;
            if (const nlohmann::json* vc = vi.config()) kov = vae::kl_overrides_from_diffusers_config(*vc);
            auto kcfg = vae::infer_autoencoder_kl_config(vi, *m->kl_, kov);
            if (kcfg.latent_channels != 4)
                fail(ErrorKind::ModelMismatch, "the VAE has {} latent channels; SD1.x/SD2.x need a 4-channel VAE (pass the right one with --vae)",
                     kcfg.latent_channels);
            m->spatial_factor_ = kcfg.spatial_factor();
            if (const nlohmann::json* vc = vi.config(); vc && vc->contains("scaling_factor"))
                m->scaling_factor_ = (*vc)["scaling_factor"].get<float>();
        } else if (!files.vae.empty()) {
            fail(ErrorKind::ModelMismatch, "--vae {}: no AutoencoderKL (VAE) found in it; pass an SD VAE", files.vae);
        }
    }
    if (!m->kl_ && m->taesd_path_.empty())
        fail(ErrorKind::ModelMismatch, "{}: no AutoencoderKL (VAE) found in it; pass one with --vae FILE", m->vae_flag_.empty() ? m->unet_flag_ : m->vae_flag_);

    // Noise process and prediction type: a diffusers folder's scheduler_config.json; in a single
    // file ComfyUI's / Forge's marker tensors (`v_pred`: v-prediction, `ztsnr`: zero terminal
    // SNR; their presence counts, ComfyUI model_detection.py) or the prediction_type metadata;
    // SD2.x files without either get the test evaluation.
    double beta_start = 0.00085, beta_end = 0.012;
    bool zsnr = false;
    sampling::Prediction pred = sampling::Prediction::Eps;
    m->pred_src_ = "SD1.x default";
    if (m->sched_cfg_) {
        const auto& sc = *m->sched_cfg_;
        if (sc.contains("beta_start")) beta_start = sc["beta_start"].get<double>();
        if (sc.contains("beta_end")) beta_end = sc["beta_end"].get<double>();
        if (sc.contains("beta_schedule") && sc["beta_schedule"] != "scaled_linear")
            fail(ErrorKind::Unsupported, "scheduler config beta_schedule {} is not supported (scaled_linear is)", sc["beta_schedule"].dump());
        if (sc.contains("prediction_type")) {
            std::string p = sc["prediction_type"].get<std::string>();
            pred = p == "v_prediction" ? sampling::Prediction::V : sampling::Prediction::Eps;
            m->pred_src_ = "scheduler_config.json";
        }
        if (sc.contains("rescale_betas_zero_snr") && sc["rescale_betas_zero_snr"].is_boolean() && sc["rescale_betas_zero_snr"].get<bool>()) {
            zsnr = true;
            m->zsnr_src_ = "scheduler_config.json";
        }
        if (sc.contains("timestep_spacing") && sc["timestep_spacing"].is_string())
            m->sched_opt_.spacing = sampling::parse_spacing(sc["timestep_spacing"].get<std::string>());
        if (sc.contains("steps_offset") && sc["steps_offset"].is_number_integer())
            m->sched_opt_.steps_offset = sc["steps_offset"].get<int>();
    } else {
        const io::WeightIndex& ui = *m->unet_idx_;
        std::string meta_pred;
        for (const char* k : {"prediction_type", "modelspec.prediction_type"})
            if (auto it = ui.metadata().find(k); it != ui.metadata().end() && it->second.kind == io::MetaValue::Kind::String)
                meta_pred = ascii_lower(it->second.s);
        if (ui.contains("v_pred")) {
            pred = sampling::Prediction::V;
            m->pred_src_ = "v_pred tensor";
        } else if (meta_pred == "v_prediction" || meta_pred == "v") {
            pred = sampling::Prediction::V;
            m->pred_src_ = "file metadata";
        } else if (meta_pred == "epsilon" || meta_pred == "eps") {
            m->pred_src_ = "file metadata";
        } else if (m->is_sd2()) {
            pred = sampling::Prediction::V;
            m->pred_src_ = "test evaluation";
            m->pred_pending_ = true;
        }
        if (ui.contains("ztsnr")) {
            zsnr = true;
            m->zsnr_src_ = "ztsnr tensor";
        }
    }
    if (!opt.prediction.empty()) {
        pred = sampling::parse_prediction(opt.prediction);
        if (pred == sampling::Prediction::Flow)
            fail(ErrorKind::InvalidInput, "--prediction flow does not apply to {} (a discrete-time model): use eps or v",
                 m->is_sd2() ? "SD2.x" : "SD1.x");
        m->pred_src_ = "--prediction";
        m->pred_pending_ = false;
    }
    if (zsnr && pred == sampling::Prediction::Eps && !m->pred_pending_)
        log::warn("{}: zero-terminal-SNR schedule ({}) with eps prediction: such models are trained with v-prediction (give --prediction v if the output is noise)",
                  m->unet_flag_, m->zsnr_src_);
    m->beta_start_ = beta_start;
    m->beta_end_ = beta_end;
    m->zsnr_ = zsnr;
    m->ms_ = std::make_unique<sampling::ModelSampling>(sampling::ModelSampling::discrete(pred, beta_start, beta_end, 1000, zsnr));
    return m;
}

void StableDiffusion::detect_prediction() {
    // A1111's test (modules/sd_models_config.py is_using_v_parameterization_for_sd2): an eps
    // model given x = 0.5 at t = 999 predicts roughly x; a v model predicts about -x.
    pred_pending_ = false;
    Conditioning c;
    c.tokens = 77;
    c.dim = ucfg_.context_dim;
    c.context.assign((size_t)(77 * c.dim), 0.5f);
    std::vector<float> x((size_t)(4 * 8 * 8), 0.5f), concat((size_t)((ucfg_.in_channels - 4) * 8 * 8), 0.5f),
        out((size_t)(4 * 8 * 8));
    diffusion(x, concat, 8, 8, 999.0, c, out);
    double mean = 0;
    for (size_t i = 0; i < out.size(); ++i) mean += out[i] - 0.5;
    mean /= (double)out.size();
    auto pred = mean < -1.0 ? sampling::Prediction::V : sampling::Prediction::Eps;
    ms_ = std::make_unique<sampling::ModelSampling>(sampling::ModelSampling::discrete(pred, beta_start_, beta_end_, 1000, zsnr_));
}

const sampling::ModelSampling& StableDiffusion::model_sampling() const {
    if (pred_pending_) const_cast<StableDiffusion*>(this)->detect_prediction();
    return *ms_;
}

std::string StableDiffusion::name() const {
    return std::string(is_sd2() ? "SD2.x" : "SD1.x") + (is_inpaint() ? " inpainting" : "");
}

std::string StableDiffusion::describe() const {
    std::string pred = pred_pending_ ? "eps/v (found by a test evaluation when sampling)"
                                     : std::string(sampling::prediction_name(ms_->prediction())) + " (" + pred_src_ + ")";
    std::string sched;
    if (zsnr_) sched += ", zero terminal SNR (" + zsnr_src_ + ")";
    if (sched_opt_.spacing != sampling::Spacing::Linspace)
        sched += sched_opt_.spacing == sampling::Spacing::Leading ? ", leading timestep spacing" : ", trailing timestep spacing";
    return fmt::format("{} ({}), {}, {} prediction{}{}", name(), model_desc_, ucfg_.summary(), pred, sched,  // summary() starts with "UNet"
                       te_desc_.empty() ? "" : ", text encoder " + te_desc_);
}

LatentFormat StableDiffusion::latent_format() const {
    LatentFormat f;
    f.channels = 4;
    f.spatial_factor = spatial_factor_;
    f.scaling_factor = scaling_factor_;
    f.shift_factor = 0.0f;
    return f;
}

SamplingDefaults StableDiffusion::defaults() const {
    SamplingDefaults d;
    d.sampler = "euler_a";
    d.scheduler = "discrete";
    d.steps = 20;
    d.cfg_scale = 7.0f;
    // sd.cpp's convention for original SD2.x files (the penultimate of OpenCLIP-H's 24 layers);
    // a diffusers SD2.x folder stores 23 layers and diffusers uses their last output, i.e. 1.
    d.clip_skip = is_sd2() && !(te_pre_truncated_ && files_.clip_l.empty()) ? 2 : 1;
    d.width = d.height = is_sd2() ? 768 : 512;
    return d;
}

std::vector<std::string> StableDiffusion::module_files(Module m) const {
    switch (m) {
    case Module::Te: return te_path_.empty() ? std::vector<std::string>{} : std::vector<std::string>{te_path_};
    case Module::Diffusion: return {unet_path_};
    case Module::VaeDecoder:
        if (!taesd_path_.empty()) return {taesd_path_};
        return vae_path_.empty() ? std::vector<std::string>{} : std::vector<std::string>{vae_path_};
    case Module::VaeEncoder: return vae_path_.empty() ? std::vector<std::string>{} : std::vector<std::string>{vae_path_};
    }
    return {};
}

runtime::GraphRunner& StableDiffusion::runner(Module m) {
    auto make = [&](std::unique_ptr<runtime::GraphRunner>& r, ggml_backend_dev_t dev) -> runtime::GraphRunner& {
        if (!r) r = std::make_unique<runtime::GraphRunner>(dev, opt_.threads);
        return *r;
    };
    switch (m) {
    case Module::Te: return make(te_runner_, opt_.te_device);
    case Module::Diffusion: return make(unet_runner_, opt_.diffusion_device);
    default: return make(vae_runner_, opt_.vae_device);
    }
}

bool StableDiffusion::loaded(Module m) const {
    switch (m) {
    case Module::Te: return te_ != nullptr || placed_te_ != nullptr;
    case Module::Diffusion: return unet_.net != nullptr || placed_unet_ != nullptr;
    case Module::VaeDecoder: return vae_dec_ != nullptr || placed_vae_ != nullptr || (taesd_ && taesd_->has_decoder());
    case Module::VaeEncoder: return vae_enc_ != nullptr || placed_vae_enc_ != nullptr;
    }
    return false;
}

void StableDiffusion::load(Module m) {
    if (loaded(m)) return;
    switch (m) {
    case Module::Te: {
        std::unique_ptr<io::WeightIndex> own;
        clip::ClipKeys keys;
        clip::ClipConfig ccfg;
        const io::WeightIndex* ti = &te_headers(own, keys, ccfg);
        if (own) te_idx_ = std::move(own);
        if (opt_.placement) {  // planned and loaded on the first encoding (the model depends on the clip skip)
            placed_te_ = std::make_unique<PlacedTe>();
            placed_te_->index = ti;
            placed_te_->keys = keys;
            placed_te_->base = ccfg;
        } else {
            auto te = std::make_unique<clip::ClipTextModel>(ccfg);
            nn::TensorSource src = clip::make_tensor_source(*ti, keys, ccfg);
            nn::LoadOptions tlo = clip::default_load_options(keys, ccfg, *ti);
            tlo.weight_type = weight_type_;
            te_params_ = nn::ParamBuffer::load(*te, src, runner(Module::Te).buffer_type(), tlo);
            te_ = std::move(te);
        }
        // Pad id: the tokenizer's pad token when a diffusers folder says it, else the layout's.
        pad_id_ = keys.layout == clip::ClipKeys::Layout::OpenClip ? text::ClipTokenizer::kOpenClipPad : text::ClipTokenizer::kEos;
        if (!tokenizer_special_.empty() && files_.clip_l.empty()) {
            if (auto tok = read_json(tokenizer_special_); tok && tok->contains("pad_token")) {
                auto& p = (*tok)["pad_token"];
                std::string s = p.is_string() ? p.get<std::string>()
                                              : (p.is_object() && p.contains("content") ? p["content"].get<std::string>() : "");
                if (s == "<|endoftext|>") pad_id_ = text::ClipTokenizer::kEos;
                else if (s == "!") pad_id_ = 0;
            }
        }
        te_desc_ = fmt::format("width {} x {} layers", ccfg.width, ccfg.layers);
        break;
    }
    case Module::Diffusion: {
        nn::LoadOptions lo;
        lo.weight_type = weight_type_;
        if (opt_.placement) {  // planned and loaded on the first evaluation (the plan needs the shapes)
            placed_unet_ = std::make_unique<placement::PlacedUNet>(*unet_idx_, ucfg_, lo, *opt_.placement, opt_.threads,
                                                                   opt_.flash_attn_diffusion);
            break;
        }
        try {
            nn::TensorSource src = make_unet_source(*unet_idx_, ucfg_);
            LoadedUNet u;
            u.net = std::make_unique<UNet2DCondition>(ucfg_);
            u.params = nn::ParamBuffer::load(*u.net, src, runner(Module::Diffusion).buffer_type(), lo);
            unet_ = std::move(u);
        } catch (const Error& e) {
            if (e.kind() == ErrorKind::ModelMismatch)
                fail(ErrorKind::ModelMismatch, "{}: no SD1.x/SD2.x UNet in this file ({}); pass an SD checkpoint as -m, or the UNet as --diffusion-model",
                     unet_flag_, e.what());
            throw;
        }
        break;
    }
    case Module::VaeDecoder:
        if (!taesd_path_.empty()) {
            taesd_idx_ = open_index(taesd_path_, "--taesd");
            taesd_ = vae::TinyAutoencoder::load(*taesd_idx_, runner(m).backend());
            if (!taesd_->has_decoder()) fail(ErrorKind::ModelMismatch, "--taesd {}: holds no TAESD decoder", taesd_path_);
            break;
        }
        if (opt_.placement) {  // planned and loaded on the first decode (the plan needs the latent's shape)
            if (!kl_) fail(ErrorKind::ModelMismatch, "no VAE: pass one with --vae FILE");
            placed_vae_ = std::make_unique<placement::PlacedVaeDecoder>(vae_source(), *opt_.placement, opt_.threads, opt_.flash_attn_te);
            break;
        }
        [[fallthrough]];
    case Module::VaeEncoder: {
        if (!kl_) fail(ErrorKind::ModelMismatch, "no VAE: pass one with --vae FILE");
        if (m == Module::VaeEncoder && opt_.placement) {  // planned and loaded on the first encode (the plan needs the image's shape)
            placed_vae_enc_ = std::make_unique<placement::PlacedVaeEncoder>(vae_source(), *opt_.placement, opt_.threads, opt_.flash_attn_te);
            break;
        }
        const io::WeightIndex& vi = vae_idx_ ? *vae_idx_ : *unet_idx_;
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

void StableDiffusion::unload(Module m) {
    switch (m) {
    case Module::Te:
        te_params_ = nn::ParamBuffer();
        te_.reset();
        if (placed_te_ && placed_te_->placed && !placed_te_->placed->current_plan().segments.empty()) {
            te_plans_done_ = {placed_te_->placed->current_plan()};
            te_peaks_done_ = placed_te_->old_peaks;
            for (auto& [d, b] : placed_te_->placed->peaks()) te_peaks_done_[d] = std::max(te_peaks_done_[d], b);
        }
        placed_te_.reset();
        te_idx_.reset();
        te_runner_.reset();
        break;
    case Module::Diffusion:
        unet_.params = nn::ParamBuffer();
        unet_.net.reset();
        if (placed_unet_ && !placed_unet_->current_plan().segments.empty()) {  // the closing memory line names its devices
            dit_plans_done_ = {placed_unet_->current_plan()};
            dit_peaks_done_ = placed_unet_->peaks();
        }
        placed_unet_.reset();
        unet_runner_.reset();
        break;
    case Module::VaeDecoder:
        vae_dec_.reset();
        if (placed_vae_ && !placed_vae_->current_plan().segments.empty()) {
            vae_plans_done_ = {placed_vae_->current_plan()};
            vae_peaks_done_ = placed_vae_->peaks();
        }
        placed_vae_.reset();
        taesd_.reset();
        taesd_idx_.reset();
        if (!vae_enc_) vae_runner_.reset();
        break;
    case Module::VaeEncoder:
        vae_enc_.reset();
        if (placed_vae_enc_ && !placed_vae_enc_->current_plan().segments.empty()) {
            vae_enc_plans_done_ = {placed_vae_enc_->current_plan()};
            vae_enc_peaks_done_ = placed_vae_enc_->peaks();
        }
        placed_vae_enc_.reset();
        if (!vae_dec_ && !taesd_ && !placed_vae_) vae_runner_.reset();
        break;
    }
}

size_t StableDiffusion::param_bytes(Module m) const {
    switch (m) {
    case Module::Te: return te_ ? te_params_.size() : 0;
    case Module::Diffusion: return unet_.net ? unet_.params.size() : 0;
    case Module::VaeDecoder:
        if (vae_dec_) return bound_bytes(vae_dec_->module());
        if (placed_vae_) return placed_vae_->param_bytes();
        return 0;
    case Module::VaeEncoder:
        if (vae_enc_) return bound_bytes(vae_enc_->module());
        if (placed_vae_enc_) return placed_vae_enc_->param_bytes();
        return 0;
    }
    return 0;
}

size_t StableDiffusion::compute_bytes(Module m) const {
    switch (m) {
    case Module::Te: return te_compute_;
    case Module::Diffusion: return unet_compute_;
    case Module::VaeDecoder: return vae_dec_compute_;
    case Module::VaeEncoder: return vae_enc_compute_;
    }
    return 0;
}

Conditioning StableDiffusion::encode_prompt(const std::string& prompt, int clip_skip) {
    load(Module::Te);
    if (clip_skip <= 0) clip_skip = defaults().clip_skip;
    text::ChunkOptions co;
    co.pad_id = pad_id_;
    auto chunks = text::tokenize_weighted(text::ClipTokenizer::builtin(), prompt, co);
    const int64_t L = text::ClipTokenizer::kMaxLength;
    const int64_t n = (int64_t)chunks.ids.size();
    std::vector<int32_t> ids;
    for (auto& c : chunks.ids) ids.insert(ids.end(), c.begin(), c.end());
    const clip::ClipConfig& cfg = placed_te_ ? placed_te_->base : te_->config();
    for (int32_t id : ids)
        if (id < 0 || id >= cfg.vocab)
            fail(ErrorKind::ModelMismatch, "token id {} is outside the text encoder's vocabulary of {} (not a CLIP text encoder?)", id,
                 cfg.vocab);
    if (L > cfg.positions) fail(ErrorKind::ModelMismatch, "the text encoder has {} positions; CLIP needs 77", cfg.positions);

    std::vector<runtime::HostTensor> out;
    if (placed_te_) {
        PlacedTe& pt = *placed_te_;
        const int k = std::max(clip_skip, 1);
        if (pt.k != k) {
            if (pt.placed)
                for (auto& [d, b] : pt.placed->peaks()) pt.old_peaks[d] = std::max(pt.old_peaks[d], b);
            pt.placed.reset();
            const clip::ClipConfig kc = te_config_for_skip(pt.base, k);
            pt.net = std::make_unique<clip::ClipTextModel>(kc);
            pt.src = std::make_unique<nn::TensorSource>(clip::make_tensor_source(*pt.index, pt.keys, kc));
            nn::LoadOptions tlo = clip::default_load_options(pt.keys, kc, *pt.index);
            tlo.weight_type = weight_type_;
            pt.placed = std::make_unique<PlacedTe::Placed>(*pt.net, *pt.net, *pt.src, tlo, placement::PModule::Te, *opt_.placement,
                                                           opt_.threads, opt_.flash_attn_te);
            pt.k = k;
        }
        out = pt.placed->run(
            {n, k},
            [&](runtime::GraphBuilder& g) {
                clip::ClipInputs in;
                in.ids = g.input_i32("ids", {L, n}, ids);
                return in;
            },
            te_select, fmt::format("CLIP text encoder {} of {} layers (clip skip {}), {} x {} tokens", pt.net->n_blocks(), pt.base.layers, k, n, L));
    } else {
        clip::ClipEncodeOptions eo;
        eo.clip_skip = clip_skip;
        eo.final_norm_on_skip = true;
        auto& run = runner(Module::Te);
        run.set_threads(opt_.threads);
        out = run.run([&](runtime::GraphBuilder& g) {
            nn::Ctx c{g.ctx(), opt_.flash_attn_te};
            clip::ClipInputs in;
            in.ids = g.input_i32("ids", {L, n}, ids);
            auto enc = te_->encode(c, in, eo);
            return std::vector<ggml_tensor*>{enc.context};
        });
        te_compute_ = std::max(te_compute_, run.last_compute_bytes());
    }
    Conditioning r;
    r.dim = out[0].ne[0];
    r.tokens = L * n;
    r.context = std::move(out[0].data);
    r.token_ids = ids;
    r.token_weights.reserve(ids.size());
    for (int64_t k = 0; k < n; ++k) {
        const auto& wk = chunks.weights[(size_t)k];
        r.token_weights.insert(r.token_weights.end(), wk.begin(), wk.end());
        bool plain = true;
        for (float w : wk) plain = plain && w == 1.0f;
        if (plain) continue;
        std::span<float> z(r.context.data() + (size_t)(k * L * r.dim), (size_t)(L * r.dim));
        text::apply_emphasis_original(z, (size_t)L, (size_t)r.dim, wk);
    }
    return r;
}

void StableDiffusion::diffusion(std::span<const float> x, std::span<const float> concat, int64_t h, int64_t w, double timestep,
                                const Conditioning& cond, std::span<float> out) {
    const UNetConfig& cfg = ucfg_;
    const int64_t C = 4;
    if ((int64_t)x.size() != C * h * w)
        fail(ErrorKind::InvalidInput, "UNet latent input has {} values, expected {}x{}x{}", x.size(), C, h, w);
    if ((int64_t)concat.size() != (cfg.in_channels - C) * h * w)
        fail(ErrorKind::InvalidInput, "UNet extra input has {} values, expected {}x{}x{}", concat.size(), cfg.in_channels - C, h, w);
    if ((int64_t)out.size() != cfg.out_channels * h * w)
        fail(ErrorKind::InvalidInput, "UNet output buffer has {} values, expected {}x{}x{}", out.size(), cfg.out_channels, h, w);
    if (cond.dim != cfg.context_dim)
        fail(ErrorKind::ModelMismatch, "conditioning width {} does not match the UNet's cross-attention width {}", cond.dim, cfg.context_dim);
    if ((int64_t)cond.context.size() != cond.tokens * cond.dim || cond.tokens <= 0)
        fail(ErrorKind::InvalidInput, "conditioning context has {} values, expected {} tokens x {}", cond.context.size(), cond.tokens, cond.dim);
    load(Module::Diffusion);
    std::vector<float> x_in;
    std::span<const float> xs = x;
    if (!concat.empty()) {
        x_in.reserve(x.size() + concat.size());
        x_in.insert(x_in.end(), x.begin(), x.end());
        x_in.insert(x_in.end(), concat.begin(), concat.end());
        xs = x_in;
    }
    const float t = (float)timestep;
    if (placed_unet_) {
        placed_unet_->run(xs, 1, h, w, std::span<const float>(&t, 1), cond.context, cond.tokens, out);
        return;
    }
    auto& run = runner(Module::Diffusion);
    run.set_threads(opt_.threads);
    auto res = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), opt_.flash_attn_diffusion};
        UNetInputs in;
        in.sample = g.input_f32("sample", {w, h, cfg.in_channels, 1}, xs);
        in.timestep = g.input_f32("timestep", {1}, std::span<const float>(&t, 1));
        in.context = g.input_f32("context", {cond.dim, cond.tokens, 1}, cond.context);
        return std::vector<ggml_tensor*>{unet_.net->forward(c, in)};
    });
    unet_compute_ = std::max(unet_compute_, run.last_compute_bytes());
    std::copy(res[0].data.begin(), res[0].data.end(), out.begin());
}

vae::HostTensor StableDiffusion::decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) {
    if (latent.c != 4) fail(ErrorKind::InvalidInput, "latent has {} channels; SD1.x/SD2.x latents have 4", latent.c);
    load(Module::VaeDecoder);
    vae::ExecOptions ex;
    ex.flash_attn = opt_.flash_attn_te;
    ex.n_threads = opt_.threads;
    ex.compute_bytes = &vae_dec_compute_;  // the stage line's compute figure
    if (taesd_) {
        if (!opt_.placement) return taesd_->decode(latent, ex);
        // under placement flags: TAESD runs whole on the vae entry's first device; its plan (the
        // vae row) and measured peak (parameter buffer + compute buffer) join the plans printed
        const auto budgets = placement::resolve_budgets(*opt_.placement, placement::list_devices());
        const placement::PlacementSpec ts = placement::taesd_spec(*opt_.placement);
        placement::ModulePlan plan = placement::plan_module(placement::PModule::Vae, ts[placement::PModule::Vae], false,
                                                            placement::taesd_decoder_costs(*taesd_idx_, latent.h, latent.w), budgets);
        size_t compute = 0;
        ex.compute_bytes = &compute;
        vae::HostTensor img = taesd_->decode(latent, ex);
        vae_dec_compute_ = std::max(vae_dec_compute_, compute);
        const std::string dev = ts[placement::PModule::Vae].devices.front();
        vae_plans_done_ = {std::move(plan)};
        vae_peaks_done_[dev] = std::max<uint64_t>(vae_peaks_done_[dev], placement::taesd_measured_peak(taesd_->decoder_param_bytes(), compute));
        return img;
    }
    vae::HostTensor z = latent;
    for (auto& v : z.data) v /= scaling_factor_;
    if (placed_vae_) return placed_vae_->decode(z, tiling);
    return vae_dec_->decode(z, tiling, ex);
}

vae::LatentDist StableDiffusion::encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) {
    load(Module::VaeEncoder);
    vae::ExecOptions ex;
    ex.flash_attn = opt_.flash_attn_te;
    ex.n_threads = opt_.threads;
    ex.compute_bytes = &vae_enc_compute_;  // the stage line's compute figure
    if (placed_vae_enc_) return placed_vae_enc_->encode(image, tiling);
    return vae_enc_->encode(image, tiling, ex);
}

std::vector<placement::ModuleCosts> StableDiffusion::placement_costs(int64_t h, int64_t w) {
    std::vector<placement::ModuleCosts> out;
    if (!te_path_.empty() && !costs_skip_te()) {  // te: one 77-token window, the default clip skip (none when no file has one)
        struct Keep {
            std::unique_ptr<io::WeightIndex> own;
            clip::ClipKeys keys;
            clip::ClipConfig cfg;
            std::unique_ptr<clip::ClipTextModel> net;
            std::unique_ptr<nn::TensorSource> src;
            std::vector<int32_t> ids;
        };
        auto k = std::make_shared<Keep>();
        clip::ClipConfig base;
        const io::WeightIndex& ti = te_headers(k->own, k->keys, base);
        const int skip = std::max(defaults().clip_skip, 1);
        k->cfg = te_config_for_skip(base, skip);
        k->net = std::make_unique<clip::ClipTextModel>(k->cfg);
        k->src = std::make_unique<nn::TensorSource>(clip::make_tensor_source(ti, k->keys, k->cfg));
        const int64_t L = text::ClipTokenizer::kMaxLength;
        k->ids.assign((size_t)L, 0);
        nn::LoadOptions tlo = clip::default_load_options(k->keys, k->cfg, ti);
        tlo.weight_type = weight_type_;
        Keep* kp = k.get();
        out.push_back(placement::self_contained_costs<clip::ClipInputs, clip::ClipState, clip::ClipOutputs>(
            placement::PModule::Te, k, *k->net, *k->net, *k->src, tlo, opt_.threads, opt_.flash_attn_te,
            [kp, L](runtime::GraphBuilder& g) {
                clip::ClipInputs in;
                in.ids = g.input_i32("ids", {L, 1}, kp->ids);
                return in;
            },
            te_select, fmt::format("CLIP text encoder {} of {} layers (clip skip {}), 1 x {} tokens", k->cfg.layers, base.layers, skip, L)));
    }
    nn::LoadOptions lo;
    lo.weight_type = weight_type_;
    out.push_back(placement::unet_costs(*unet_idx_, ucfg_, lo, opt_.threads, opt_.flash_attn_diffusion, 1, h, w, text::ClipTokenizer::kMaxLength));
    // vae: the AutoencoderKL decoder (the VAE flash attention follows --fa, as decode() runs it)
    if (kl_ && kl_->has_decoder && taesd_path_.empty())
        out.push_back(placement::vae_decoder_costs(vae_source(), opt_.threads, opt_.flash_attn_te, h, w, planned_tiling()));
    if (!taesd_path_.empty()) {  // --taesd: the TAESD decoder is the vae module (run whole, untiled)
        auto ti = open_index(taesd_path_, "--taesd");
        out.push_back(placement::taesd_decoder_costs(*ti, h, w));
    }
    return out;
}

placement::VaeDecoderSource StableDiffusion::vae_source() const {
    placement::VaeDecoderSource s;
    s.index = vae_idx_ ? vae_idx_.get() : unet_idx_.get();
    s.src = *kl_;
    if (const nlohmann::json* vc = s.index->config()) s.overrides = vae::kl_overrides_from_diffusers_config(*vc);
    return s;
}

vae::TilingOptions StableDiffusion::planned_tiling() const { return placement::planned_tiling(opt_.vae_tile, spatial_factor_); }

std::optional<placement::ModuleCosts> StableDiffusion::encode_costs(int tile) {
    if (!(kl_ && kl_->has_encoder && !opt_.vae_encode_sizes.empty())) return std::nullopt;
    const auto sizes = placement::encode_sizes_at(opt_.vae_encode_sizes, size_multiple());
    return placement::encode_stage_costs(vae_source(), opt_.threads, opt_.flash_attn_te, sizes, placement::planned_tiling(tile, spatial_factor_));
}

std::vector<placement::ModulePlan> StableDiffusion::plan_placement(int64_t h, int64_t w) {
    if (!opt_.placement) return {};
    const auto budgets = placement::resolve_budgets(*opt_.placement, placement::list_devices());
    std::optional<std::string> taesd_warning;
    const placement::PlacementSpec spec = taesd_path_.empty() ? *opt_.placement : placement::taesd_spec(*opt_.placement, &taesd_warning);
    if (taesd_warning) log::warn("{}", *taesd_warning);
    auto plans = placement::plan_modules(spec, placement_costs(h, w), budgets);
    // the encode stage (img2img / in-painting): the VAE encoder under the vae entry
    if (auto ec = encode_costs(opt_.vae_tile)) plans.push_back(placement::plan_encode_stage(*ec, *opt_.placement, budgets));
    return plans;
}

std::vector<placement::ModulePlan> StableDiffusion::placement_plans() const {
    std::vector<placement::ModulePlan> r;
    if (placed_te_ && placed_te_->placed && !placed_te_->placed->current_plan().segments.empty()) r.push_back(placed_te_->placed->current_plan());
    else r.insert(r.end(), te_plans_done_.begin(), te_plans_done_.end());
    if (placed_unet_ && !placed_unet_->current_plan().segments.empty()) r.push_back(placed_unet_->current_plan());
    else r.insert(r.end(), dit_plans_done_.begin(), dit_plans_done_.end());
    if (placed_vae_ && !placed_vae_->current_plan().segments.empty()) r.push_back(placed_vae_->current_plan());
    else r.insert(r.end(), vae_plans_done_.begin(), vae_plans_done_.end());
    if (placed_vae_enc_ && !placed_vae_enc_->current_plan().segments.empty()) r.push_back(placed_vae_enc_->current_plan());
    else r.insert(r.end(), vae_enc_plans_done_.begin(), vae_enc_plans_done_.end());
    return r;
}

std::map<std::string, uint64_t> StableDiffusion::placement_peaks() const {
    std::map<std::string, uint64_t> p;
    auto merge = [&](const std::map<std::string, uint64_t>& m) {
        for (auto& [d, b] : m) p[d] = std::max(p[d], b);
    };
    merge(te_peaks_done_);
    if (placed_te_) {
        merge(placed_te_->old_peaks);
        if (placed_te_->placed) merge(placed_te_->placed->peaks());
    }
    merge(dit_peaks_done_);
    if (placed_unet_) merge(placed_unet_->peaks());
    merge(vae_peaks_done_);
    if (placed_vae_) merge(placed_vae_->peaks());
    merge(vae_enc_peaks_done_);
    if (placed_vae_enc_) merge(placed_vae_enc_->peaks());
    return p;
}

}  // namespace easel::models::sd
