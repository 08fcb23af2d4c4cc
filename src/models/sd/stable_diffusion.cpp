#include "models/sd/stable_diffusion.h"

#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/diffusers.h"
#include "models/lora_targets.h"
#include "models/model_files.h"
#include "runtime/placed_sequence.h"
#include "text/prompt_syntax.h"

#include <cmath>
#include <filesystem>
#include <fstream>

namespace easel::models::sd {

namespace fs = std::filesystem;

/// The CLIP text encoder under FamilyOptions::placement: built with the layers up to the
/// context layer of clip skip k (its final-norm output is then the SD context), run as a
/// PlacedSequence; rebuilt when k changes.
struct StableDiffusion::PlacedTe {
    using Placed = runtime::PlacedSequence<clip::ClipInputs, clip::ClipState, clip::ClipOutputs>;
    std::unique_ptr<io::WeightIndex> own;  ///< the text encoder's index when it is a file of its own
    const io::WeightIndex* index = nullptr;
    clip::ClipKeys keys;
    clip::ClipConfig base;  ///< the file's configuration (all layers)
    int k = 0;              ///< clip skip the model below is built for (0: none yet)
    std::unique_ptr<clip::ClipTextModel> net;
    std::unique_ptr<nn::TensorSource> src;
    std::unique_ptr<Placed> placed;
    std::map<std::string, uint64_t> old_peaks;  ///< of models freed when k changed

    std::vector<placement::ModulePlan> plans() const {
        if (!placed || placed->current_plan().segments.empty()) return {};
        return {placed->current_plan()};
    }
    std::map<std::string, uint64_t> peaks() const {
        std::map<std::string, uint64_t> p = old_peaks;
        if (placed) merge_peaks(p, placed->peaks());
        return p;
    }
};

/// The CLIP text encoder on FamilyOptions::te_device.
struct StableDiffusion::TeWhole {
    std::unique_ptr<runtime::GraphRunner> runner;
    std::unique_ptr<io::WeightIndex> own;  ///< the text encoder's index when it is a file of its own
    std::unique_ptr<clip::ClipTextModel> net;
    nn::ParamBuffer params;
    size_t param_bytes() const { return params.size(); }
};

/// The UNet on FamilyOptions::diffusion_device.
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

StableDiffusion::StableDiffusion(const ModelFiles& files, const FamilyOptions& opt) : FamilyBase(files, opt) {}

StableDiffusion::~StableDiffusion() = default;

const io::WeightIndex& StableDiffusion::te_headers(std::unique_ptr<io::WeightIndex>& own, clip::ClipKeys& keys, clip::ClipConfig& ccfg) const {
    if (te_src_.empty()) fail(ErrorKind::ModelMismatch, "no text encoder: {} has none; pass one with --clip_l FILE", dit_src_.named());
    const io::WeightIndex* ti = &index_for(te_src_, own);
    auto encs = clip::find_clip_text_encoders(*ti);
    if (encs.empty()) fail(ErrorKind::ModelMismatch, "{}: no CLIP text encoder found in it; pass one with --clip_l FILE", te_src_.named());
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
    std::unique_ptr<StableDiffusion> m(new StableDiffusion(files, opt));
    if (files.model.empty() && files.diffusion_model.empty())
        fail(ErrorKind::InvalidInput, "no model given: pass -m MODEL (a checkpoint file or a diffusers folder) or --diffusion-model");
    if (!files.t5xxl.empty() || !files.llm.empty() || !files.clip_g.empty())
        fail(ErrorKind::ModelMismatch, "--t5xxl/--llm/--clip_g are not used by SD1.x/SD2.x (their text encoder is --clip_l)");

    // Resolve the source of each module (paths only; nothing of the text encoder is read).
    static const SourceRule rules[] = {{"unet", &ModelFiles::diffusion_model, "--diffusion-model"},
                                       {"vae", &ModelFiles::vae, "--vae"},
                                       {"text_encoder", &ModelFiles::clip_l, "--clip_l"}};
    ResolvedSources rs = resolve_sources(files, rules);
    m->te_pre_truncated_ = rs.component("text_encoder") != nullptr;
    m->sched_cfg_ = rs.scheduler_config;
    if (const io::PipelineComponent* tok = rs.component("tokenizer")) {
        // pad_token: special_tokens_map.json, or tokenizer_config.json where transformers 5
        // saved no special_tokens_map.json
        std::error_code ec;
        m->tokenizer_special_ = tok->folder / "special_tokens_map.json";
        if (!std::filesystem::exists(m->tokenizer_special_, ec)) m->tokenizer_special_ = tok->folder / "tokenizer_config.json";
    }
    rs.require(0, "SD1.x/SD2.x pipelines");
    m->dit_src_ = rs.sources[0];
    m->vae_src_ = rs.sources[1];
    m->te_src_ = rs.sources[2];
    m->model_desc_ = rs.model_desc;
    m->take_taesd();

    // UNet configuration from its headers.
    m->dit_idx_ = open_index(m->dit_src_.path, m->dit_src_.flag);
    try {
        m->ucfg_ = infer_unet_config(*m->dit_idx_);
        m->ucfg_.conv_direct = m->opt_.diffusion_conv_direct;
    } catch (const Error& e) {
        if (e.kind() == ErrorKind::ModelMismatch)
            fail(ErrorKind::ModelMismatch, "{}: no SD1.x/SD2.x UNet in this file ({}); pass an SD checkpoint as -m, or the UNet as --diffusion-model",
                 m->dit_src_.named(), e.what());
        throw;
    }
    if (m->ucfg_.context_dim != 768 && m->ucfg_.context_dim != 1024)
        log::debug("UNet cross-attention width {} (not SD1.x 768 / SD2.x 1024): treating as SD1.x-style", m->ucfg_.context_dim);

    // VAE configuration from its headers (latent factor, scaling factor).
    if (!m->vae_src_.path.empty()) {
        if (m->vae_src_.path == m->dit_src_.path && files.diffusion_model.empty()) {
            // the same single file: no second index
        } else {
            m->vae_idx_ = open_index(m->vae_src_.path, m->vae_src_.flag);
        }
        const io::WeightIndex& vi = m->vae_idx_ ? *m->vae_idx_ : *m->dit_idx_;
        m->kl_ = vae::find_autoencoder_kl(vi);
        if (m->kl_) {
            check_vae_kind(vi, *m->kl_, 4, m->vae_src_.named().empty() ? m->dit_src_.named() : m->vae_src_.named(), "SD1.x/SD2.x",
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
        fail(ErrorKind::ModelMismatch, "{}: no AutoencoderKL (VAE) found in it; pass one with --vae FILE", m->vae_src_.named().empty() ? m->dit_src_.named() : m->vae_src_.named());

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
        const io::WeightIndex& ui = *m->dit_idx_;
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
                  m->dit_src_.named(), m->zsnr_src_);
    m->beta_start_ = beta_start;
    m->beta_end_ = beta_end;
    m->zsnr_ = zsnr;
    m->ms_ = std::make_unique<sampling::ModelSampling>(sampling::ModelSampling::discrete(pred, beta_start, beta_end, 1000, zsnr));
    m->add_modules();
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
    return {.channels = 4, .spatial_factor = spatial_factor_, .scaling_factor = scaling_factor_, .shift_factor = 0.0f};
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

void StableDiffusion::te_loaded(const clip::ClipKeys& keys, const clip::ClipConfig& ccfg) {
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
}

void StableDiffusion::lora_targets(LoraTargets& t) {
    UNet2DCondition unet(ucfg_);
    lora::add_unet_targets(t.km, unet, ucfg_);
    t.sources["unet"] = std::make_unique<nn::TensorSource>(make_unet_source(*dit_idx_, ucfg_));
    if (!te_src_.empty()) {
        std::unique_ptr<io::WeightIndex> own;
        clip::ClipKeys keys;
        clip::ClipConfig ccfg;
        const io::WeightIndex& ti = te_headers(own, keys, ccfg);
        clip::ClipTextModel clip(ccfg);
        lora::add_clip_targets(t.km, te_lora_component(), 0, clip, ccfg);
        t.sources[te_lora_component()] = std::make_unique<nn::TensorSource>(clip::make_tensor_source(ti, keys, ccfg));
        if (own) t.own.push_back(std::move(own));
    }
    t.info.family = is_sd2() ? "SD2.x" : "SD1.x";
    t.info.width = ucfg_.context_dim;
    t.info.width_name = "context";
}

void StableDiffusion::add_modules() {
    // te: the CLIP text encoder
    ModuleSlot<TeWhole, PlacedTe>::Hooks th;
    th.load_whole = [this] {
        auto t = std::make_unique<TeWhole>();
        clip::ClipKeys keys;
        clip::ClipConfig ccfg;
        const io::WeightIndex& ti = te_headers(t->own, keys, ccfg);
        t->runner = std::make_unique<runtime::GraphRunner>(opt_.te_device, opt_.threads);
        t->net = std::make_unique<clip::ClipTextModel>(ccfg);
        nn::TensorSource src = clip::make_tensor_source(ti, keys, ccfg);
        nn::LoadOptions tlo = clip::default_load_options(keys, ccfg, ti);
        tlo.weight_type = weight_type_;
        t->params = nn::ParamBuffer::load(*t->net, src, t->runner->buffer_type(), tlo);
        te_loaded(keys, ccfg);
        return t;
    };
    th.load_placed = [this] {  // planned and loaded on the first encoding (the model depends on the clip skip)
        auto p = std::make_unique<PlacedTe>();
        p->index = &te_headers(p->own, p->keys, p->base);
        te_loaded(p->keys, p->base);
        return p;
    };
    th.files = [this]() -> std::vector<std::string> {
        if (te_src_.empty()) return {};
        return {te_src_.path};
    };
    th.costs = [this](int64_t, int64_t) {
        std::vector<placement::ModuleCosts> out;
        if (te_src_.empty()) return out;  // no file has a text encoder
        // one 77-token window, the default clip skip
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
        constexpr int64_t L = text::ClipTokenizer::kMaxLength;
        k->ids.assign((size_t)L, 0);
        nn::LoadOptions tlo = clip::default_load_options(k->keys, k->cfg, ti);
        tlo.weight_type = weight_type_;
        Keep* kp = k.get();
        out.push_back(runtime::self_contained_costs<clip::ClipInputs, clip::ClipState, clip::ClipOutputs>(
            placement::PModule::Te, k, *k->net, *k->net, *k->src, tlo, opt_.threads, opt_.flash_attn_te,
            [kp](runtime::GraphBuilder& g) {
                clip::ClipInputs in;
                in.ids = g.input_i32("ids", {L, 1}, kp->ids);
                return in;
            },
            te_select, fmt::format("CLIP text encoder {} of {} layers (clip skip {}), 1 x {} tokens", k->cfg.layers, base.layers, skip, L)));
        return out;
    };
    te_ = &modules_.add<TeWhole, PlacedTe>(Module::Te, std::move(th));

    // diffusion: the UNet
    unet_ = &modules_.add<UNetWhole, PlacedUNet>(Module::Diffusion, unet_slot_hooks(*dit_idx_, dit_src_, ucfg_, opt_, weight_type_, "SD1.x/SD2.x"));

    // vae: the AutoencoderKL (the VAE flash attention follows --fa), or TAESD for decoding
    add_vae({.kl = kl_, .flash_attn = opt_.flash_attn_te, .tile_factor = spatial_factor_, .taesd_kind = "TAESD (taesd_decoder)",
             .vae_needed = "an SD1.x/SD2.x VAE"});
}

Conditioning StableDiffusion::encode_prompt(const std::string& prompt, int clip_skip) {
    load(Module::Te);
    if (clip_skip <= 0) clip_skip = defaults().clip_skip;
    PlacedTe* placed = te_->placed();
    const clip::ClipConfig& cfg = placed ? placed->base : te_->whole()->net->config();
    // textual inversion: the embeddings of this encoder's width, by name (A1111's lookup)
    text::EmbeddingLookup lookup;
    std::vector<const std::vector<float>*> emb_vectors;
    for (const text::Embedding& e : embeddings_) {
        const std::vector<float>* v = e.for_width(cfg.width);
        if (!v) continue;
        lookup.add(text::ClipTokenizer::builtin(), (int)emb_vectors.size(), e.name, (int)e.n_vectors);
        emb_vectors.push_back(v);
    }
    text::ChunkOptions co;
    co.pad_id = pad_id_;
    if (!lookup.empty()) co.embeddings = &lookup;
    auto chunks = text::tokenize_weighted(text::ClipTokenizer::builtin(), prompt, co);
    const int64_t L = text::ClipTokenizer::kMaxLength;
    const int64_t n = (int64_t)chunks.ids.size();
    std::vector<int32_t> ids;
    for (auto& c : chunks.ids) ids.insert(ids.end(), c.begin(), c.end());
    // the embedding inputs of every window (h = token_embedding(ids) * keep + fix), when one is named
    std::vector<float> emb_keep, emb_fix;
    bool any_fix = false;
    for (const auto& f : chunks.fixes) any_fix = any_fix || !f.empty();
    if (any_fix)
        for (int64_t k = 0; k < n; ++k) {
            text::EmbeddingInputs ei = text::embedding_inputs(chunks, (size_t)k, emb_vectors, cfg.width);
            emb_keep.insert(emb_keep.end(), ei.keep.begin(), ei.keep.end());
            emb_fix.insert(emb_fix.end(), ei.fix.begin(), ei.fix.end());
        }
    const int64_t width = cfg.width;
    auto add_embeddings = [&](runtime::GraphBuilder& g, clip::ClipInputs& in) {
        if (!any_fix) return;
        in.embed_keep = g.input_f32("embed_keep", {1, L, n}, emb_keep);
        in.embed_fix = g.input_f32("embed_fix", {width, L, n}, emb_fix);
    };
    for (int32_t id : ids)
        if (id < 0 || id >= cfg.vocab)
            fail(ErrorKind::ModelMismatch, "token id {} is outside the text encoder's vocabulary of {} (not a CLIP text encoder?)", id,
                 cfg.vocab);
    if (L > cfg.positions) fail(ErrorKind::ModelMismatch, "the text encoder has {} positions; CLIP needs 77", cfg.positions);

    std::vector<runtime::HostTensor> out;
    if (placed) {
        PlacedTe& pt = *placed;
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
                add_embeddings(g, in);
                return in;
            },
            te_select, fmt::format("CLIP text encoder {} of {} layers (clip skip {}), {} x {} tokens", pt.net->n_blocks(), pt.base.layers, k, n, L));
    } else {
        clip::ClipEncodeOptions eo;
        eo.clip_skip = clip_skip;
        eo.final_norm_on_skip = true;
        TeWhole& te = *te_->whole();
        auto& run = *te.runner;
        run.set_threads(opt_.threads);
        out = run.run([&](runtime::GraphBuilder& g) {
            nn::Ctx c{g.ctx(), opt_.flash_attn_te, g.backend()};
            clip::ClipInputs in;
            in.ids = g.input_i32("ids", {L, n}, ids);
            add_embeddings(g, in);
            auto enc = te.net->encode(c, in, eo);
            return std::vector<ggml_tensor*>{enc.context};
        });
        te_->note_compute(run.last_compute_bytes());
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
    if (PlacedUNet* pu = unet_->placed()) {
        pu->run(xs, 1, h, w, std::span<const float>(&t, 1), cond.context, cond.tokens, out);
        return;
    }
    UNetWhole& un = *unet_->whole();
    auto& run = *un.runner;
    run.set_threads(opt_.threads);
    auto res = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), opt_.flash_attn_diffusion, g.backend()};
        UNetInputs in;
        in.sample = g.input_f32("sample", {w, h, cfg.in_channels, 1}, xs);
        in.timestep = g.input_f32("timestep", {1}, std::span<const float>(&t, 1));
        in.context = g.input_f32("context", {cond.dim, cond.tokens, 1}, cond.context);
        return std::vector<ggml_tensor*>{un.unet.net->forward(c, in)};
    });
    unet_->note_compute(run.last_compute_bytes());
    std::copy(res[0].data.begin(), res[0].data.end(), out.begin());
}

vae::HostTensor StableDiffusion::decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) {
    if (latent.c != 4) fail(ErrorKind::InvalidInput, "latent has {} channels; SD1.x/SD2.x latents have 4", latent.c);
    return decode_scaled(latent, tiling, scaling_factor_, 0.0f);  // (TAESD decodes the scaled latent)
}

vae::LatentDist StableDiffusion::encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) { return encode_kl(image, tiling); }

}  // namespace easel::models::sd
