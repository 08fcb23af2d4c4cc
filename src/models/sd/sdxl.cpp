// The SDXL family (see sdxl.h). Recipe facts from diffusers' pipeline_stable_diffusion_xl.py
// (encode_prompt, _get_add_time_ids, force_zeros_for_empty_prompt) and SDXL base's
// scheduler_config.json / vae config.json; the original single-file names from diffusers'
// loaders/single_file_utils.py (conditioner.embedders.0/1) and Stability's generative-models.
#include "models/sd/sdxl.h"

#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "core/strings.h"
#include "io/diffusers.h"
#include "models/model_files.h"
#include "text/prompt_syntax.h"

#include <algorithm>
#include <filesystem>

namespace easel::models::sd {

namespace fs = std::filesystem;

/// Both text encoders on FamilyOptions::te_device (one runner, one graph per window batch).
struct StableDiffusionXL::TeWhole {
    std::unique_ptr<runtime::GraphRunner> runner;
    std::unique_ptr<io::WeightIndex> own1, own2;
    std::unique_ptr<clip::ClipTextModel> net1, net2;  ///< CLIP-L, OpenCLIP-G (with projection)
    nn::ParamBuffer params1, params2;
    size_t param_bytes() const { return params1.size() + params2.size(); }
};

/// The UNet on FamilyOptions::diffusion_device.
namespace {

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

/// The pad id a diffusers tokenizer folder names (special_tokens_map.json or tokenizer_config.json),
/// or `fallback`.
int32_t tokenizer_pad(const fs::path& special, int32_t fallback) {
    if (special.empty()) return fallback;
    auto tok = read_json(special);
    if (!tok || !tok->contains("pad_token")) return fallback;
    auto& p = (*tok)["pad_token"];
    std::string s = p.is_string() ? p.get<std::string>() : (p.is_object() && p.contains("content") && p["content"].is_string()
                                                                ? p["content"].get<std::string>()
                                                                : "");
    if (s == "<|endoftext|>") return text::ClipTokenizer::kEos;
    if (s == "!") return 0;
    return fallback;
}

fs::path special_tokens_file(const io::PipelineComponent* tok) {
    if (!tok) return {};
    std::error_code ec;
    fs::path p = tok->folder / "special_tokens_map.json";
    if (!fs::exists(p, ec)) p = tok->folder / "tokenizer_config.json";
    return p;
}

}  // namespace

StableDiffusionXL::StableDiffusionXL(const ModelFiles& files, const FamilyOptions& opt) : FamilyBase(files, opt) {}

StableDiffusionXL::~StableDiffusionXL() = default;

std::vector<float> StableDiffusionXL::default_time_ids(int64_t height, int64_t width) {
    return {(float)height, (float)width, 0.0f, 0.0f, (float)height, (float)width};
}

std::pair<StableDiffusionXL::TeHeaders, StableDiffusionXL::TeHeaders> StableDiffusionXL::te_headers(
    std::unique_ptr<io::WeightIndex>& own1, std::unique_ptr<io::WeightIndex>& own2) const {
    if (te1_src_.empty() || te2_src_.empty())
        fail(ErrorKind::ModelMismatch, "no {} text encoder: {} has none; SDXL needs CLIP-L (--clip_l FILE) and OpenCLIP-G (--clip_g FILE)",
             te1_src_.empty() ? "CLIP-L" : "OpenCLIP-G", dit_src_.named());
    TeHeaders a, b;
    a.index = &index_for(te1_src_, own1);
    if (te2_src_.path == te1_src_.path) b.index = a.index;
    else b.index = &index_for(te2_src_, own2);
    auto e1 = clip::find_clip_text_encoders(*a.index);
    auto e2 = b.index == a.index ? e1 : clip::find_clip_text_encoders(*b.index);
    if (e1.empty()) fail(ErrorKind::ModelMismatch, "{}: no CLIP text encoder found in it; pass CLIP-L with --clip_l FILE", te1_src_.named());
    if (e2.empty()) fail(ErrorKind::ModelMismatch, "{}: no CLIP text encoder found in it; pass OpenCLIP-G with --clip_g FILE", te2_src_.named());
    // CLIP-L: embedders.0 (original files), else the one without a projection; OpenCLIP-G:
    // embedders.1, else the one with a projection.
    auto pick = [](const std::vector<clip::ClipKeys>& es, bool g) -> const clip::ClipKeys* {
        if (es.size() == 1) return &es[0];
        for (auto& e : es)
            if (contains(e.prefix, g ? "embedders.1." : "embedders.0.")) return &e;
        for (auto& e : es)
            if (e.projection_name.empty() != g) return &e;
        return nullptr;
    };
    const clip::ClipKeys* k1 = pick(e1, false);
    const clip::ClipKeys* k2 = pick(e2, true);
    if (!k1 || !k2 || (a.index == b.index && k1->prefix == k2->prefix))
        fail(ErrorKind::ModelMismatch, "{}: cannot tell CLIP-L from OpenCLIP-G among its {} text encoders; pass them with --clip_l and --clip_g",
             te1_src_.named(), e1.size());
    a.keys = *k1;
    b.keys = *k2;
    clip::ClipOverrides o1, o2;
    if (const nlohmann::json* cj = a.index->config()) o1 = clip::overrides_from_config_json(*cj);
    if (const nlohmann::json* cj = b.index->config()) o2 = clip::overrides_from_config_json(*cj);
    // OpenCLIP-G in transformers names has gelu (its width 1280 says so; tiny models carry config.json)
    a.cfg = clip::infer_config(*a.index, a.keys, o1);
    b.cfg = clip::infer_config(*b.index, b.keys, o2);
    if (b.cfg.projection <= 0)
        fail(ErrorKind::ModelMismatch, "{}: the OpenCLIP-G text encoder has no text_projection (SDXL's pooled vector needs it); pass "
             "CLIPTextModelWithProjection / OpenCLIP-G weights with --clip_g", te2_src_.named());
    if (a.cfg.width + b.cfg.width != ucfg_.context_dim)
        fail(ErrorKind::ModelMismatch,
             "the text encoders' widths {} + {} do not make the UNet's cross-attention width {}: SDXL expects CLIP-L (768) and OpenCLIP-G (1280)",
             a.cfg.width, b.cfg.width, ucfg_.context_dim);
    if (b.cfg.projection != ucfg_.add_text_dim)
        fail(ErrorKind::ModelMismatch, "OpenCLIP-G's projection width {} does not match the UNet's pooled input {}: wrong --clip_g for this UNet",
             b.cfg.projection, ucfg_.add_text_dim);
    return {a, b};
}

std::unique_ptr<StableDiffusionXL> StableDiffusionXL::open(const ModelFiles& files, const FamilyOptions& opt) {
    std::unique_ptr<StableDiffusionXL> m(new StableDiffusionXL(files, opt));
    if (files.model.empty() && files.diffusion_model.empty())
        fail(ErrorKind::InvalidInput, "no model given: pass -m MODEL (a checkpoint file or a diffusers folder) or --diffusion-model");
    if (!files.t5xxl.empty() || !files.llm.empty())
        fail(ErrorKind::ModelMismatch, "--t5xxl/--llm are not used by SDXL (its text encoders are --clip_l and --clip_g)");

    static const SourceRule rules[] = {{"unet", &ModelFiles::diffusion_model, "--diffusion-model"},
                                       {"vae", &ModelFiles::vae, "--vae"},
                                       {"text_encoder", &ModelFiles::clip_l, "--clip_l"},
                                       {"text_encoder_2", &ModelFiles::clip_g, "--clip_g"}};
    ResolvedSources rs = resolve_sources(files, rules);
    rs.require(0, "SDXL pipelines");
    m->sched_cfg_ = rs.scheduler_config;
    m->tok1_special_ = special_tokens_file(rs.component("tokenizer"));
    m->tok2_special_ = special_tokens_file(rs.component("tokenizer_2"));
    m->dit_src_ = rs.sources[0];
    m->vae_src_ = rs.sources[1];
    m->te1_src_ = rs.sources[2];
    m->te2_src_ = rs.sources[3];
    m->model_desc_ = rs.model_desc;
    if (rs.folder) {
        if (auto mi = read_json(platform::u8path(rs.model) / "model_index.json");
            mi && mi->contains("force_zeros_for_empty_prompt") && (*mi)["force_zeros_for_empty_prompt"].is_boolean()) {
            m->force_zeros_ = (*mi)["force_zeros_for_empty_prompt"].get<bool>();
            m->force_zeros_src_ = "model_index.json";
        }
    }
    m->take_taesd();

    // UNet configuration from its headers.
    m->dit_idx_ = open_index(m->dit_src_.path, m->dit_src_.flag);
    try {
        m->ucfg_ = infer_unet_config(*m->dit_idx_);
        m->ucfg_.conv_direct = m->opt_.diffusion_conv_direct;
    } catch (const Error& e) {
        if (e.kind() == ErrorKind::ModelMismatch)
            fail(ErrorKind::ModelMismatch, "{}: no SDXL UNet in this file ({}); pass an SDXL checkpoint as -m, or the UNet as --diffusion-model",
                 m->dit_src_.named(), e.what());
        throw;
    }
    if (!m->ucfg_.has_add_embedding)
        fail(ErrorKind::ModelMismatch, "{}: the UNet has no add_embedding (text_time conditioning): not an SDXL UNet", m->dit_src_.named());
    if (m->ucfg_.add_time_ids != 6)
        fail(ErrorKind::Unsupported, "{}: an SDXL refiner UNet (5 time ids with the aesthetic score); this build runs SDXL base-style UNets only",
             m->dit_src_.named());
    if (m->ucfg_.in_channels != 4 || m->ucfg_.out_channels != 4)
        fail(ErrorKind::Unsupported, "{}: an SDXL UNet with {} input channels (in-painting?); this build runs 4-channel SDXL UNets only",
             m->dit_src_.named(), m->ucfg_.in_channels);

    // VAE configuration from its headers (latent factor, scaling factor).
    if (!m->vae_src_.path.empty()) {
        if (!(m->vae_src_.path == m->dit_src_.path && files.diffusion_model.empty()))
            m->vae_idx_ = open_index(m->vae_src_.path, m->vae_src_.flag);
        const io::WeightIndex& vi = m->vae_index();
        m->kl_ = vae::find_autoencoder_kl(vi);
        if (m->kl_) {
            const std::string named = m->vae_src_.named().empty() ? m->dit_src_.named() : m->vae_src_.named();
            check_vae_kind(vi, *m->kl_, 4, named, "SDXL", "the 4-channel SDXL VAE (pass the right one with --vae)");
            vae::KLOverrides kov;
            if (const nlohmann::json* vc = vi.config()) kov = vae::kl_overrides_from_diffusers_config(*vc);
            auto kcfg = vae::infer_autoencoder_kl_config(vi, *m->kl_, kov);
            if (kcfg.latent_channels != 4)
                fail(ErrorKind::ModelMismatch, "the VAE has {} latent channels; SDXL needs a 4-channel VAE (pass the right one with --vae)",
                     kcfg.latent_channels);
            m->spatial_factor_ = kcfg.spatial_factor();
            if (const nlohmann::json* vc = vi.config(); vc && vc->contains("scaling_factor") && (*vc)["scaling_factor"].is_number())
                m->scaling_factor_ = (*vc)["scaling_factor"].get<float>();
        } else if (!files.vae.empty()) {
            fail(ErrorKind::ModelMismatch, "--vae {}: no AutoencoderKL (VAE) found in it; pass the SDXL VAE", files.vae);
        }
    }
    if (!m->kl_ && m->taesd_path_.empty())
        fail(ErrorKind::ModelMismatch, "{}: no AutoencoderKL (VAE) found in it; pass one with --vae FILE",
             m->vae_src_.named().empty() ? m->dit_src_.named() : m->vae_src_.named());

    // Noise process: SDXL base's scheduler config unless a folder gives its own.
    double beta_start = 0.00085, beta_end = 0.012;
    sampling::Prediction pred = sampling::Prediction::Eps;
    m->sched_opt_.spacing = sampling::Spacing::Leading;
    m->sched_opt_.steps_offset = 1;
    m->sched_opt_.ays_table = sampling::ScheduleOptions::AysTable::Sdxl;
    bool zsnr = false;
    if (m->sched_cfg_) {
        const auto& sc = *m->sched_cfg_;
        if (sc.contains("beta_start") && sc["beta_start"].is_number()) beta_start = sc["beta_start"].get<double>();
        if (sc.contains("beta_end") && sc["beta_end"].is_number()) beta_end = sc["beta_end"].get<double>();
        if (sc.contains("beta_schedule") && sc["beta_schedule"] != "scaled_linear")
            fail(ErrorKind::Unsupported, "scheduler config beta_schedule {} is not supported (scaled_linear is)", sc["beta_schedule"].dump());
        if (sc.contains("prediction_type") && sc["prediction_type"].is_string()) {
            pred = sc["prediction_type"].get<std::string>() == "v_prediction" ? sampling::Prediction::V : sampling::Prediction::Eps;
            m->pred_src_ = "scheduler_config.json";
        }
        if (sc.contains("rescale_betas_zero_snr") && sc["rescale_betas_zero_snr"].is_boolean())
            zsnr = sc["rescale_betas_zero_snr"].get<bool>();
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
        if (ui.contains("v_pred") || meta_pred == "v_prediction" || meta_pred == "v") {
            pred = sampling::Prediction::V;
            m->pred_src_ = ui.contains("v_pred") ? "v_pred tensor" : "file metadata";
        }
        zsnr = ui.contains("ztsnr");
    }
    if (!opt.prediction.empty()) {
        pred = sampling::parse_prediction(opt.prediction);
        if (pred == sampling::Prediction::Flow)
            fail(ErrorKind::InvalidInput, "--prediction flow does not apply to SDXL (a discrete-time model): use eps or v");
        m->pred_src_ = "--prediction";
    }
    m->ms_ = std::make_unique<sampling::ModelSampling>(sampling::ModelSampling::discrete(pred, beta_start, beta_end, 1000, zsnr));
    m->add_modules();
    return m;
}

std::string StableDiffusionXL::describe() const {
    return fmt::format("SDXL ({}), {}, {} prediction ({}), {} timestep spacing, empty negative prompt {} ({}){}", model_desc_,
                       ucfg_.summary(), sampling::prediction_name(ms_->prediction()), pred_src_,
                       sched_opt_.spacing == sampling::Spacing::Leading ? "leading"
                       : sched_opt_.spacing == sampling::Spacing::Trailing ? "trailing"
                                                                            : "linspace",
                       force_zeros_ ? "zeroed" : "encoded", force_zeros_src_, te_desc_.empty() ? "" : ", text encoders " + te_desc_);
}

LatentFormat StableDiffusionXL::latent_format() const {
    return {.channels = 4, .spatial_factor = spatial_factor_, .scaling_factor = scaling_factor_, .shift_factor = 0.0f};
}

SamplingDefaults StableDiffusionXL::defaults() const {
    SamplingDefaults d;
    d.sampler = "euler_a";
    d.scheduler = "discrete";
    d.steps = 20;
    d.cfg_scale = 7.0f;
    d.clip_skip = 2;  // hidden_states[-2] of both encoders (diffusers clip_skip None; sd.cpp's SDXL default)
    d.width = d.height = 1024;
    return d;
}

void StableDiffusionXL::add_modules() {
    // te: CLIP-L and OpenCLIP-G
    ModuleSlot<TeWhole>::Hooks th;
    th.load_whole = [this] {
        auto t = std::make_unique<TeWhole>();
        auto [a, b] = te_headers(t->own1, t->own2);
        t->runner = std::make_unique<runtime::GraphRunner>(opt_.te_device, opt_.threads);
        auto load = [&](const TeHeaders& h, std::unique_ptr<clip::ClipTextModel>& net, nn::ParamBuffer& params) {
            net = std::make_unique<clip::ClipTextModel>(h.cfg);
            nn::TensorSource src = clip::make_tensor_source(*h.index, h.keys, h.cfg);
            nn::LoadOptions lo = clip::default_load_options(h.keys, h.cfg, *h.index);
            lo.weight_type = weight_type_;
            params = nn::ParamBuffer::load(*net, src, t->runner->buffer_type(), lo);
        };
        load(a, t->net1, t->params1);
        load(b, t->net2, t->params2);
        const bool folder1 = files_.clip_l.empty() && !tok1_special_.empty();
        const bool folder2 = files_.clip_g.empty() && !tok2_special_.empty();
        pad1_ = folder1 ? tokenizer_pad(tok1_special_, text::ClipTokenizer::kEos) : text::ClipTokenizer::kEos;
        pad2_ = folder2 ? tokenizer_pad(tok2_special_, text::ClipTokenizer::kOpenClipPad) : text::ClipTokenizer::kOpenClipPad;
        te_desc_ = fmt::format("CLIP-L width {} x {} layers, OpenCLIP-G width {} x {} layers (projection {})", a.cfg.width, a.cfg.layers,
                               b.cfg.width, b.cfg.layers, b.cfg.projection);
        return t;
    };
    th.files = [this]() -> std::vector<std::string> {
        std::vector<std::string> f;
        if (!te1_src_.empty()) f.push_back(te1_src_.path);
        if (!te2_src_.empty() && te2_src_.path != te1_src_.path) f.push_back(te2_src_.path);
        return f;
    };
    te_ = &modules_.add<TeWhole>(Module::Te, std::move(th));

    // diffusion: the UNet
    unet_ = &modules_.add<UNetWhole, PlacedUNet>(Module::Diffusion, unet_slot_hooks(*dit_idx_, dit_src_, ucfg_, opt_, weight_type_, "SDXL"));

    add_vae({.kl = kl_, .flash_attn = opt_.flash_attn_te, .tile_factor = spatial_factor_, .taesd_kind = "TAESDXL (taesdxl_decoder)",
             .vae_needed = "the SDXL VAE"});
}

Conditioning StableDiffusionXL::encode_prompt(const std::string& prompt, int clip_skip) {
    load(Module::Te);
    if (clip_skip <= 0) clip_skip = defaults().clip_skip;
    TeWhole& te = *te_->whole();
    const clip::ClipConfig& c1 = te.net1->config();
    const clip::ClipConfig& c2 = te.net2->config();
    const int64_t L = text::ClipTokenizer::kMaxLength;
    if (L > c1.positions || L > c2.positions)
        fail(ErrorKind::ModelMismatch, "the text encoders have {} / {} positions; CLIP needs 77", c1.positions, c2.positions);

    text::ChunkOptions co1, co2;
    co1.pad_id = pad1_;
    co2.pad_id = pad2_;
    const auto& tok = text::ClipTokenizer::builtin();
    auto ch1 = text::tokenize_weighted(tok, prompt, co1);
    auto ch2 = text::tokenize_weighted(tok, prompt, co2);
    if (ch1.ids.size() != ch2.ids.size()) fail(ErrorKind::Internal, "SDXL prompt windows differ between the two pad ids");
    const int64_t n = (int64_t)ch1.ids.size();
    std::vector<int32_t> ids1, ids2;
    for (auto& c : ch1.ids) ids1.insert(ids1.end(), c.begin(), c.end());
    for (auto& c : ch2.ids) ids2.insert(ids2.end(), c.begin(), c.end());
    clip::check_token_ids(ids1, c1.vocab);
    clip::check_token_ids(ids2, c2.vocab);
    // the pooled vector: OpenCLIP-G's text_embeds at the first window's EOS (A1111 and sd.cpp
    // pool the first window; diffusers has only one)
    std::vector<int32_t> pool = clip::pool_indices(ids2, L, n, c2.eos_token_id);

    clip::ClipEncodeOptions eo;
    eo.clip_skip = clip_skip;
    eo.final_norm_on_skip = false;  // SDXL takes the hidden state as is
    auto& run = *te.runner;
    run.set_threads(opt_.threads);
    auto out = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), opt_.flash_attn_te, g.backend()};
        clip::ClipInputs in1;
        in1.ids = g.input_i32("ids1", {L, n}, ids1);
        auto e1 = te.net1->encode(c, in1, eo);
        clip::ClipInputs in2;
        in2.ids = g.input_i32("ids2", {L, n}, ids2);
        in2.pool_index = g.input_i32("pool_index", {n}, pool);
        auto e2 = te.net2->encode(c, in2, eo);
        return std::vector<ggml_tensor*>{e1.context, e2.context, e2.out.text_embeds};
    });
    te_->note_compute(run.last_compute_bytes());

    const int64_t D1 = out[0].ne[0], D2 = out[1].ne[0];
    // emphasis on each encoder's windows, then the channels side by side
    for (int64_t k = 0; k < n; ++k) {
        const auto& wk = ch1.weights[(size_t)k];
        bool plain = std::all_of(wk.begin(), wk.end(), [](float w) { return w == 1.0f; });
        if (plain) continue;
        text::apply_emphasis_original(std::span<float>(out[0].data.data() + (size_t)(k * L * D1), (size_t)(L * D1)), (size_t)L, (size_t)D1, wk);
        text::apply_emphasis_original(std::span<float>(out[1].data.data() + (size_t)(k * L * D2), (size_t)(L * D2)), (size_t)L, (size_t)D2, wk);
    }
    Conditioning r;
    r.dim = D1 + D2;
    r.tokens = L * n;
    r.context.resize((size_t)(r.tokens * r.dim));
    for (int64_t t = 0; t < r.tokens; ++t) {
        std::copy_n(out[0].data.data() + t * D1, D1, r.context.data() + t * r.dim);
        std::copy_n(out[1].data.data() + t * D2, D2, r.context.data() + t * r.dim + D1);
    }
    const int64_t P = out[2].ne[0];
    r.pooled.assign(out[2].data.begin(), out[2].data.begin() + P);  // window 0
    r.token_ids = ids1;
    for (auto& w : ch1.weights) r.token_weights.insert(r.token_weights.end(), w.begin(), w.end());
    return r;
}

std::optional<Conditioning> StableDiffusionXL::empty_negative(const Conditioning& positive) const {
    if (!force_zeros_) return std::nullopt;
    Conditioning z;
    z.dim = positive.dim;
    z.tokens = positive.tokens;
    z.context.assign(positive.context.size(), 0.0f);
    z.pooled.assign(positive.pooled.size(), 0.0f);
    return z;
}

void StableDiffusionXL::diffusion(std::span<const float> x, std::span<const float> concat, int64_t h, int64_t w, double timestep,
                                  const Conditioning& cond, std::span<float> out) {
    const UNetConfig& cfg = ucfg_;
    const int64_t C = 4;
    if ((int64_t)x.size() != C * h * w) fail(ErrorKind::InvalidInput, "UNet latent input has {} values, expected {}x{}x{}", x.size(), C, h, w);
    if (!concat.empty()) fail(ErrorKind::InvalidInput, "the SDXL UNet takes no extra input channels ({} given)", concat.size());
    if ((int64_t)out.size() != cfg.out_channels * h * w)
        fail(ErrorKind::InvalidInput, "UNet output buffer has {} values, expected {}x{}x{}", out.size(), cfg.out_channels, h, w);
    if (cond.dim != cfg.context_dim)
        fail(ErrorKind::ModelMismatch, "conditioning width {} does not match the UNet's cross-attention width {}", cond.dim, cfg.context_dim);
    if ((int64_t)cond.context.size() != cond.tokens * cond.dim || cond.tokens <= 0)
        fail(ErrorKind::InvalidInput, "conditioning context has {} values, expected {} tokens x {}", cond.context.size(), cond.tokens, cond.dim);
    if ((int64_t)cond.pooled.size() != cfg.add_text_dim)
        fail(ErrorKind::ModelMismatch, "SDXL conditioning has a pooled vector of {} values; the UNet takes {} (conditioning from another model?)",
             cond.pooled.size(), cfg.add_text_dim);
    load(Module::Diffusion);
    const std::vector<float> ids = default_time_ids(h * spatial_factor_, w * spatial_factor_);
    const float t = (float)timestep;
    if (PlacedUNet* pu = unet_->placed()) {
        pu->run(x, 1, h, w, std::span<const float>(&t, 1), cond.context, cond.tokens, out, cond.pooled, ids);
        return;
    }
    UNetWhole& un = *unet_->whole();
    auto& run = *un.runner;
    run.set_threads(opt_.threads);
    auto res = run.run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), opt_.flash_attn_diffusion, g.backend()};
        UNetInputs in;
        in.sample = g.input_f32("sample", {w, h, cfg.in_channels, 1}, x);
        in.timestep = g.input_f32("timestep", {1}, std::span<const float>(&t, 1));
        in.context = g.input_f32("context", {cond.dim, cond.tokens, 1}, cond.context);
        in.text_embeds = g.input_f32("text_embeds", {cfg.add_text_dim, 1}, cond.pooled);
        in.time_ids = g.input_f32("time_ids", {cfg.add_time_ids, 1}, ids);
        return std::vector<ggml_tensor*>{un.unet.net->forward(c, in)};
    });
    unet_->note_compute(run.last_compute_bytes());
    std::copy(res[0].data.begin(), res[0].data.end(), out.begin());
}

vae::HostTensor StableDiffusionXL::decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) {
    if (latent.c != 4) fail(ErrorKind::InvalidInput, "latent has {} channels; SDXL latents have 4", latent.c);
    return decode_scaled(latent, tiling, scaling_factor_, 0.0f);  // (TAESDXL decodes the scaled latent)
}

vae::LatentDist StableDiffusionXL::encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) { return encode_kl(image, tiling); }

}  // namespace easel::models::sd
