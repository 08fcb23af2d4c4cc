#include "models/sd/stable_diffusion.h"

#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/diffusers.h"
#include "text/prompt_syntax.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace easel::models::sd {

namespace fs = std::filesystem;

namespace {

std::unique_ptr<io::WeightIndex> open_index(const std::string& path, const char* flag) {
    std::error_code ec;
    if (!fs::exists(path, ec)) fail(ErrorKind::Io, "{} {}: no such file or folder", flag, path);
    return std::make_unique<io::WeightIndex>(io::WeightIndex::open(path));
}

std::optional<nlohmann::json> read_json(const fs::path& p) {
    std::ifstream f(p);
    if (!f) return std::nullopt;
    try {
        return nlohmann::json::parse(f);
    } catch (const std::exception& e) {
        fail(ErrorKind::InvalidInput, "{}: not valid JSON ({})", p.string(), e.what());
    }
}

/// --type NAME -> ggml type: any float type, or a quantised type ggml can quantise to.
ggml_type parse_weight_type(const std::string& name) {
    if (name.empty()) return GGML_TYPE_COUNT;
    const std::string want = ascii_lower(name);
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char* tn = ggml_type_name((ggml_type)t);
        const auto* tr = ggml_get_type_traits((ggml_type)t);
        if (!tn || tr->blck_size == 0 || ascii_lower(tn) != want) continue;
        if (!tr->is_quantized || tr->from_float_ref) return (ggml_type)t;
    }
    fail(ErrorKind::InvalidInput, "--type {}: unknown weight type (use f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1, q2_K, q3_K, q4_K, q5_K, q6_K)", name);
}

}  // namespace

StableDiffusion::~StableDiffusion() = default;

std::unique_ptr<StableDiffusion> StableDiffusion::load(const SDFiles& files, const SDOptions& opt) {
    std::unique_ptr<StableDiffusion> m(new StableDiffusion());
    m->opt_ = opt;
    m->runner_ = std::make_unique<runtime::GraphRunner>(opt.device, opt.threads);
    ggml_backend_buffer_type_t buft = m->runner_->buffer_type();

    if (files.model.empty() && files.diffusion_model.empty())
        fail(ErrorKind::InvalidInput, "no model given: pass -m MODEL (a checkpoint file or a diffusers folder) or --diffusion-model");

    // Resolve the source of each module.
    io::WeightIndex* model_idx = nullptr;
    io::WeightIndex *unet_idx = nullptr, *vae_idx = nullptr, *te_idx = nullptr;
    std::optional<nlohmann::json> sched_cfg;
    std::optional<nlohmann::json> tok_special;
    auto keep = [&](std::unique_ptr<io::WeightIndex> p) {
        m->indexes_.push_back(std::move(p));
        return m->indexes_.back().get();
    };
    std::string model_desc;
    if (!files.model.empty()) {
        if (io::is_pipeline_folder(files.model)) {
            std::string pipeline_class;
            auto comps = io::list_pipeline_components(files.model, &pipeline_class);
            for (auto& c : comps) {
                if (c.name == "unet" && files.diffusion_model.empty()) unet_idx = keep(open_index(c.folder.string(), "-m"));
                else if (c.name == "vae" && files.vae.empty()) vae_idx = keep(open_index(c.folder.string(), "-m"));
                else if (c.name == "text_encoder" && files.clip_l.empty()) te_idx = keep(open_index(c.folder.string(), "-m"));
                else if (c.name == "scheduler") sched_cfg = read_json(c.folder / "scheduler_config.json");
                else if (c.name == "tokenizer") tok_special = read_json(c.folder / "special_tokens_map.json");
            }
            if (!unet_idx && files.diffusion_model.empty())
                fail(ErrorKind::ModelMismatch, "-m {}: this diffusers pipeline ({}) has no unet folder; SD1.x/SD2.x pipelines have one",
                     files.model, pipeline_class.empty() ? "unknown class" : pipeline_class);
            model_desc = "diffusers folder " + files.model;
        } else {
            model_idx = keep(open_index(files.model, "-m"));
            unet_idx = model_idx;
            vae_idx = model_idx;
            te_idx = model_idx;
            model_desc = files.model;
        }
    }
    if (!files.diffusion_model.empty()) unet_idx = keep(open_index(files.diffusion_model, "--diffusion-model"));
    if (!files.vae.empty()) vae_idx = keep(open_index(files.vae, "--vae"));
    if (!files.clip_l.empty()) te_idx = keep(open_index(files.clip_l, "--clip_l"));

    // UNet
    const std::string unet_flag = files.diffusion_model.empty() ? "-m " + files.model : "--diffusion-model " + files.diffusion_model;
    nn::LoadOptions lo;
    lo.weight_type = parse_weight_type(opt.weight_type);
    try {
        m->unet_ = load_unet(*unet_idx, buft, {}, lo);
    } catch (const Error& e) {
        if (e.kind() == ErrorKind::ModelMismatch)
            fail(ErrorKind::ModelMismatch, "{}: no SD1.x/SD2.x UNet in this file ({}); pass an SD checkpoint as -m, or the UNet as --diffusion-model",
                 unet_flag, e.what());
        throw;
    }
    const UNetConfig& ucfg = m->unet_.net->config();
    if (ucfg.context_dim != 768 && ucfg.context_dim != 1024)
        log::debug("UNet cross-attention width {} (not SD1.x 768 / SD2.x 1024): treating as SD1.x-style", ucfg.context_dim);
    m->sd2_ = ucfg.context_dim == 1024;

    // Text encoder
    if (!te_idx)
        fail(ErrorKind::ModelMismatch, "no text encoder: {} has none; pass one with --clip_l FILE", unet_flag);
    auto encs = clip::find_clip_text_encoders(*te_idx);
    if (encs.empty())
        fail(ErrorKind::ModelMismatch, "{}: no CLIP text encoder found in it; pass one with --clip_l FILE",
             files.clip_l.empty() ? "-m " + files.model : "--clip_l " + files.clip_l);
    const clip::ClipKeys& keys = encs.front();
    clip::ClipOverrides cov;
    if (const nlohmann::json* cj = te_idx->config()) cov = clip::overrides_from_config_json(*cj);
    clip::ClipConfig ccfg = clip::infer_config(*te_idx, keys, cov);
    if (ccfg.width != ucfg.context_dim)
        fail(ErrorKind::ModelMismatch,
             "the text encoder's width {} does not match the UNet's cross-attention width {}: {} expects {}",
             ccfg.width, ucfg.context_dim, m->sd2_ ? "an SD2.x UNet" : "an SD1.x UNet",
             m->sd2_ ? "OpenCLIP ViT-H (width 1024)" : "CLIP ViT-L/14 (width 768)");
    m->te_ = std::make_unique<clip::ClipTextModel>(ccfg);
    {
        nn::TensorSource src = clip::make_tensor_source(*te_idx, keys, ccfg);
        nn::LoadOptions tlo = clip::default_load_options(keys, ccfg, *te_idx);
        tlo.weight_type = lo.weight_type;
        m->te_params_ = nn::ParamBuffer::load(*m->te_, src, buft, tlo);
    }
    // Pad id: the tokenizer's pad token when a diffusers folder says it, else the layout's.
    m->pad_id_ = keys.layout == clip::ClipKeys::Layout::OpenClip ? text::ClipTokenizer::kOpenClipPad : text::ClipTokenizer::kEos;
    if (tok_special && tok_special->contains("pad_token")) {
        auto& p = (*tok_special)["pad_token"];
        std::string s = p.is_string() ? p.get<std::string>() : (p.is_object() && p.contains("content") ? p["content"].get<std::string>() : "");
        if (s == "<|endoftext|>") m->pad_id_ = text::ClipTokenizer::kEos;
        else if (s == "!") m->pad_id_ = 0;
    }

    // VAE (or TAESD)
    if (!files.taesd.empty()) {
        auto* ti = keep(open_index(files.taesd, "--taesd"));
        m->taesd_ = vae::TinyAutoencoder::load(*ti, m->runner_->backend());
    }
    if (!m->taesd_ || opt.need_encoder) {
        if (!vae_idx) fail(ErrorKind::ModelMismatch, "no VAE: pass one with --vae FILE");
        auto kl = vae::find_autoencoder_kl(*vae_idx);
        if (!kl)
            fail(ErrorKind::ModelMismatch, "{}: no AutoencoderKL (VAE) found in it; pass one with --vae FILE",
                 files.vae.empty() ? "-m " + files.model : "--vae " + files.vae);
        m->vae_ = vae::AutoencoderKLModel::load(*vae_idx, *kl, m->runner_->backend(), {},
                                                opt.need_encoder ? vae::KLParts::Both : vae::KLParts::DecoderOnly);
        if (m->vae_->config().latent_channels != 4)
            fail(ErrorKind::ModelMismatch, "the VAE has {} latent channels; SD1.x/SD2.x need a 4-channel VAE (pass the right one with --vae)",
                 m->vae_->config().latent_channels);
        m->spatial_factor_ = m->vae_->config().spatial_factor();
        if (const nlohmann::json* vc = vae_idx->config(); vc && vc->contains("scaling_factor"))
            m->scaling_factor_ = (*vc)["scaling_factor"].get<float>();
    }

    // Noise process and prediction type.
    double beta_start = 0.00085, beta_end = 0.012;
    sampling::Prediction pred = sampling::Prediction::Eps;
    std::string pred_src = "SD1.x default";
    if (sched_cfg) {
        if (sched_cfg->contains("beta_start")) beta_start = (*sched_cfg)["beta_start"].get<double>();
        if (sched_cfg->contains("beta_end")) beta_end = (*sched_cfg)["beta_end"].get<double>();
        if (sched_cfg->contains("beta_schedule") && (*sched_cfg)["beta_schedule"] != "scaled_linear")
            fail(ErrorKind::Unsupported, "scheduler config beta_schedule {} is not supported (scaled_linear is)",
                 (*sched_cfg)["beta_schedule"].dump());
        if (sched_cfg->contains("prediction_type")) {
            std::string p = (*sched_cfg)["prediction_type"].get<std::string>();
            pred = p == "v_prediction" ? sampling::Prediction::V : sampling::Prediction::Eps;
            pred_src = "scheduler_config.json";
        }
    } else if (m->sd2_) {
        pred = sampling::Prediction::V;  // refined below by a test evaluation
        pred_src = "detect";
    }
    if (!opt.prediction.empty()) {
        pred = sampling::parse_prediction(opt.prediction);
        pred_src = "--prediction";
    }
    m->ms_ = std::make_unique<sampling::ModelSampling>(sampling::ModelSampling::discrete(pred, beta_start, beta_end));

    if (pred_src == "detect") {
        // A1111's test (modules/sd_models_config.py is_using_v_parameterization_for_sd2): an
        // eps model given x = 0.5 at t = 999 predicts roughly x; a v model predicts about -x.
        SDConditioning c;
        c.tokens = 77;
        c.dim = ucfg.context_dim;
        c.context.assign((size_t)(77 * c.dim), 0.5f);
        std::vector<float> x((size_t)(ucfg.in_channels * 8 * 8), 0.5f), out((size_t)(4 * 8 * 8));
        m->unet(x, 8, 8, 999.0, c, out);
        double mean = 0;
        for (size_t i = 0; i < out.size(); ++i) mean += out[i] - 0.5;
        mean /= (double)out.size();
        pred = mean < -1.0 ? sampling::Prediction::V : sampling::Prediction::Eps;
        m->ms_ = std::make_unique<sampling::ModelSampling>(sampling::ModelSampling::discrete(pred, beta_start, beta_end));
        pred_src = "test evaluation";
    }
    m->describe_ = fmt::format("{} ({}), UNet {}, text encoder width {} x {} layers, {} prediction ({})", m->name(), model_desc,
                               ucfg.summary(), ccfg.width, ccfg.layers, sampling::prediction_name(pred), pred_src);
    return m;
}

std::string StableDiffusion::name() const {
    return std::string(sd2_ ? "SD2.x" : "SD1.x") + (is_inpaint() ? " inpainting" : "");
}

int64_t StableDiffusion::unet_in_channels() const { return unet_.net->config().in_channels; }

std::string StableDiffusion::describe() const { return describe_; }

size_t StableDiffusion::te_param_bytes() const { return te_params_.size(); }
size_t StableDiffusion::unet_param_bytes() const { return unet_.params.size(); }

SDConditioning StableDiffusion::encode_prompt(const std::string& prompt, int clip_skip) {
    text::ChunkOptions co;
    co.pad_id = pad_id_;
    auto chunks = text::tokenize_weighted(text::ClipTokenizer::builtin(), prompt, co);
    const int64_t L = text::ClipTokenizer::kMaxLength;
    const int64_t n = (int64_t)chunks.ids.size();
    std::vector<int32_t> ids;
    for (auto& c : chunks.ids) ids.insert(ids.end(), c.begin(), c.end());
    const clip::ClipConfig& cfg = te_->config();
    for (int32_t id : ids)
        if (id < 0 || id >= cfg.vocab)
            fail(ErrorKind::ModelMismatch, "token id {} is outside the text encoder's vocabulary of {} (not a CLIP text encoder?)", id,
                 cfg.vocab);
    if (L > cfg.positions)
        fail(ErrorKind::ModelMismatch, "the text encoder has {} positions; CLIP needs 77", cfg.positions);

    clip::ClipEncodeOptions eo;
    eo.clip_skip = clip_skip;
    eo.final_norm_on_skip = true;
    runner_->set_threads(opt_.threads);
    auto out = runner_->run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), opt_.flash_attn_te};
        clip::ClipInputs in;
        in.ids = g.input_i32("ids", {L, n}, ids);
        auto enc = te_->encode(c, in, eo);
        return std::vector<ggml_tensor*>{enc.context};
    });
    te_compute_ = std::max(te_compute_, runner_->last_compute_bytes());
    SDConditioning r;
    r.dim = out[0].ne[0];
    r.tokens = L * n;
    r.context = std::move(out[0].data);
    for (int64_t k = 0; k < n; ++k) {
        bool plain = true;
        for (float w : chunks.weights[(size_t)k]) plain = plain && w == 1.0f;
        if (plain) continue;
        std::span<float> z(r.context.data() + (size_t)(k * L * r.dim), (size_t)(L * r.dim));
        text::apply_emphasis_original(z, (size_t)L, (size_t)r.dim, chunks.weights[(size_t)k]);
    }
    return r;
}

void StableDiffusion::unet(const std::vector<float>& x_in, int64_t h, int64_t w, double timestep, const SDConditioning& cond,
                           std::span<float> out) {
    const UNetConfig& cfg = unet_.net->config();
    if ((int64_t)x_in.size() != cfg.in_channels * h * w)
        fail(ErrorKind::InvalidInput, "UNet input has {} values, expected {}x{}x{}", x_in.size(), cfg.in_channels, h, w);
    if ((int64_t)out.size() != cfg.out_channels * h * w)
        fail(ErrorKind::InvalidInput, "UNet output buffer has {} values, expected {}x{}x{}", out.size(), cfg.out_channels, h, w);
    if (cond.dim != cfg.context_dim)
        fail(ErrorKind::ModelMismatch, "conditioning width {} does not match the UNet's cross-attention width {}", cond.dim, cfg.context_dim);
    const float t = (float)timestep;
    runner_->set_threads(opt_.threads);
    auto res = runner_->run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), opt_.flash_attn_diffusion};
        UNetInputs in;
        in.sample = g.input_f32("sample", {w, h, cfg.in_channels, 1}, x_in);
        in.timestep = g.input_f32("timestep", {1}, std::span<const float>(&t, 1));
        in.context = g.input_f32("context", {cond.dim, cond.tokens, 1}, cond.context);
        return std::vector<ggml_tensor*>{unet_.net->forward(c, in)};
    });
    unet_compute_ = std::max(unet_compute_, runner_->last_compute_bytes());
    std::copy(res[0].data.begin(), res[0].data.end(), out.begin());
}

vae::HostTensor StableDiffusion::decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) {
    vae::ExecOptions ex;
    ex.flash_attn = opt_.flash_attn_te;
    ex.n_threads = opt_.threads;
    if (taesd_) return taesd_->decode(latent, ex);
    vae::HostTensor z = latent;
    for (auto& v : z.data) v /= scaling_factor_;
    return vae_->decode(z, tiling, ex);
}

vae::LatentDist StableDiffusion::encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) {
    if (!vae_ || !vae_->module().has_encoder())
        fail(ErrorKind::Internal, "VAE encoder not loaded (load with need_encoder)");
    vae::ExecOptions ex;
    ex.flash_attn = opt_.flash_attn_te;
    ex.n_threads = opt_.threads;
    return vae_->encode(image, tiling, ex);
}

}  // namespace easel::models::sd
