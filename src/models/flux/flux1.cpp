// The FLUX.1 family (see flux1.h).
#include "models/flux/flux1.h"

#include "core/error.h"
#include "core/platform.h"
#include "core/log.h"
#include "io/diffusers.h"
#include "models/lora_targets.h"
#include "models/flux/flux_common.h"
#include "models/flux/flux_row_split.h"
#include "models/model_files.h"
#include "models/qwen3/qwen3.h"
#include "models/t5/t5_row_split.h"
#include "runtime/placed_sequence.h"
#include "text/clip_tokenizer.h"
#include "text/t5_tokenizer.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

namespace easel::models::flux {

namespace fs = std::filesystem;

namespace {

/// What a text-encoder file holds instead of the expected encoder, for refusal messages (never
/// throws: a file whose shapes cannot be read is described by its kind only).
std::string what_it_holds(const io::WeightIndex& idx) {
    const auto sized = [](const char* what, const char* dim, const std::function<int64_t()>& f) {
        try {
            return fmt::format("{} ({} {})", what, dim, f());
        } catch (const Error&) {
            return std::string(what);
        }
    };
    if (auto k = qwen3::find_qwen3(idx)) return sized("a Qwen3 LLM", "hidden size", [&] { return qwen3::infer_config(idx, *k).hidden; });
    if (auto k = t5::find_t5_encoder(idx)) return sized("a T5 encoder", "d_model", [&] { return t5::infer_config(idx, *k).d_model; });
    auto ck = clip::find_clip_text_encoders(idx);
    if (!ck.empty()) return sized("a CLIP text encoder", "hidden size", [&] { return clip::infer_config(idx, ck.front()).width; });
    if (find_flux_dit(idx)) return "a FLUX.1 DiT";
    if (vae::find_autoencoder_kl(idx)) return "a VAE";
    return "no text encoder easel recognises";
}

}  // namespace

std::string flux1_expected_t5(int64_t joint_dim) {
    if (joint_dim == 4096) return "T5-XXL (d_model 4096, e.g. t5xxl_fp16.safetensors)";
    return fmt::format("a T5 encoder with d_model {}", joint_dim);
}

std::string flux1_expected_clip(int64_t pooled_dim) {
    if (pooled_dim == 768) return "CLIP-L (hidden size 768, e.g. clip_l.safetensors)";
    return fmt::format("a CLIP text encoder with hidden size {}", pooled_dim);
}

/// The loaded text encoders, each with its runner.
struct Flux1::TeModels {
    std::unique_ptr<io::WeightIndex> t5_own, clip_own;
    t5::T5Config t5cfg;
    std::unique_ptr<t5::T5Encoder> t5;
    nn::ParamBuffer t5_params;
    clip::ClipConfig clipcfg;
    std::unique_ptr<clip::ClipTextModel> clip;
    nn::ParamBuffer clip_params;
    std::unique_ptr<runtime::GraphRunner> runner;
    std::string desc;
    size_t param_bytes() const { return t5_params.size() + clip_params.size(); }
};

namespace {

using T5Placed = runtime::PlacedSequence<t5::T5Inputs, t5::T5State, t5::T5Outputs>;
using ClipPlaced = runtime::PlacedSequence<clip::ClipInputs, clip::ClipState, clip::ClipOutputs>;
using DiTPlaced = runtime::PlacedSequence<FluxInputs, FluxState, FluxOutputs>;

/// The T5 encoder's tree, source and load options (no weights).
struct T5Model {
    t5::T5Config cfg;
    std::unique_ptr<t5::T5Encoder> net;
    std::unique_ptr<nn::TensorSource> src;
    nn::LoadOptions lo;
    T5Model(const io::WeightIndex& ti, const t5::T5Keys& keys, const t5::T5Config& c, ggml_type weight_type) : cfg(c) {
        net = std::make_unique<t5::T5Encoder>(cfg);
        src = std::make_unique<nn::TensorSource>(t5::make_tensor_source(ti, keys));
        lo = t5::default_load_options(ti, keys);
        lo.weight_type = weight_type;
    }
};

/// CLIP-L's tree, source and load options (no weights).
struct ClipModel {
    clip::ClipConfig cfg;
    std::unique_ptr<clip::ClipTextModel> net;
    std::unique_ptr<nn::TensorSource> src;
    nn::LoadOptions lo;
    ClipModel(const io::WeightIndex& ci, const clip::ClipKeys& keys, const clip::ClipConfig& c, ggml_type weight_type) : cfg(c) {
        net = std::make_unique<clip::ClipTextModel>(cfg);
        src = std::make_unique<nn::TensorSource>(clip::make_tensor_source(ci, keys, cfg));
        lo = clip::default_load_options(keys, cfg, ci);
        lo.weight_type = weight_type;
    }
};

/// The DiT's tree and source (BFL renames / slices applied), no weights.
struct DiTModel {
    FluxDiTConfig cfg;
    std::unique_ptr<FluxDiT> net;
    std::unique_ptr<nn::TensorSource> src;
    nn::LoadOptions lo;
    DiTModel(const io::WeightIndex& idx, const FluxSource& s, const FluxDiTConfig& c, ggml_type weight_type) : cfg(c) {
        net = std::make_unique<FluxDiT>(cfg, s.layout == FluxLayout::Bfl);
        src = std::make_unique<nn::TensorSource>(idx, s.prefix);
        configure_flux_source(*src, cfg, s);
        lo.weight_type = weight_type;
    }
};

/// T5 inputs: ids {L, 1}, relative-position buckets {L*L}, no mask (FluxPipeline runs T5 without one).
std::function<t5::T5Inputs(runtime::GraphBuilder&)> t5_inputs(int64_t L, std::span<const int32_t> ids, std::span<const int32_t> buckets) {
    return [=](runtime::GraphBuilder& g) {
        t5::T5Inputs in;
        in.ids = g.input_i32("t5_ids", {L, 1}, ids);
        in.buckets = g.input_i32("t5_buckets", {L * L}, buckets);
        return in;
    };
}

/// CLIP inputs: ids {Lc, 1}, the pooled token's row {1}.
std::function<clip::ClipInputs(runtime::GraphBuilder&)> clip_inputs(int64_t Lc, std::span<const int32_t> ids, std::span<const int32_t> pool) {
    return [=](runtime::GraphBuilder& g) {
        clip::ClipInputs in;
        in.ids = g.input_i32("clip_ids", {Lc, 1}, ids);
        in.pool_index = g.input_i32("clip_pool", {1}, pool);
        return in;
    };
}

std::vector<ggml_tensor*> t5_output(t5::T5Outputs& o) { return {o.last_hidden_state}; }
std::vector<ggml_tensor*> clip_output(clip::ClipOutputs& o) { return {o.pooler_output}; }
std::vector<ggml_tensor*> dit_output(FluxOutputs& o) { return {o.sample}; }

/// Host data of one DiT evaluation: packed image tokens [Li, 64], context [Lt, J], pooled [P],
/// timestep, guidance, rotary tables of [txt ids; img ids].
struct DiTHost {
    std::vector<float> img, txt, pooled, t{0.0f}, g{0.0f};
    RopeTables rope;
    int64_t Li = 0, Lt = 0;
};

/// The DiT's inputs from `d` (which must outlive the returned function's calls).
std::function<FluxInputs(runtime::GraphBuilder&)> dit_inputs(const FluxDiTConfig& cfg, const DiTHost& d) {
    return [&cfg, &d](runtime::GraphBuilder& gb) {
        FluxInputs in;
        in.img = gb.input_f32("img", {cfg.in_channels, d.Li, 1}, d.img);
        in.txt = gb.input_f32("txt", {cfg.joint_dim, d.Lt, 1}, d.txt);
        in.pooled = gb.input_f32("pooled", {cfg.pooled_dim, 1}, d.pooled);
        in.timestep = gb.input_f32("timestep", {1}, d.t);
        if (cfg.guidance_embeds) in.guidance = gb.input_f32("guidance", {1}, d.g);
        in.rope_cos = gb.input_f32("rope_cos", {d.rope.half_dim, d.rope.tokens}, d.rope.cos);
        in.rope_sin = gb.input_f32("rope_sin", {d.rope.half_dim, d.rope.tokens}, d.rope.sin);
        return in;
    };
}

/// Rotary tables of FLUX.1's sequence: Lt text tokens (ids 0), then the rows x cols image tokens (0, y, x).
RopeTables flux1_rope(const FluxDiTConfig& cfg, int64_t Lt, int64_t rows, int64_t cols) {
    std::vector<float> ids((size_t)(Lt * 3), 0.0f);
    const std::vector<float> img_ids = flux1_image_ids(rows, cols);
    ids.insert(ids.end(), img_ids.begin(), img_ids.end());
    return rope_tables(ids, Lt + rows * cols, cfg.axes_dims, cfg.theta);
}

std::string dit_label(const FluxDiTConfig& cfg, int64_t h, int64_t w, int64_t Lt) {
    return fmt::format("FLUX.1 DiT {} double + {} single blocks, latent 16x{}x{}, context {} tokens", cfg.n_double, cfg.n_single, h, w, Lt);
}

}  // namespace

struct Flux1::PlacedTe {
    std::unique_ptr<io::WeightIndex> t5_own, clip_own;
    std::unique_ptr<T5Model> t5;
    std::unique_ptr<ClipModel> clip;
    std::unique_ptr<T5Placed> t5p;
    std::unique_ptr<ClipPlaced> clipp;
    /// T5's plan, then CLIP's, each once it ran.
    std::vector<placement::ModulePlan> plans() const {
        std::vector<placement::ModulePlan> r;
        if (!t5p->current_plan().segments.empty()) r.push_back(t5p->current_plan());
        if (!clipp->current_plan().segments.empty()) r.push_back(clipp->current_plan());
        return r;
    }
    /// Measured peaks of the text encoders per device: T5's and CLIP's runners are loaded
    /// together (one stage), so their peaks add on a device they share.
    std::map<std::string, uint64_t> peaks() const {
        std::map<std::string, uint64_t> p = t5p->peaks();
        for (auto& [d, b] : clipp->peaks()) p[d] += b;
        return p;
    }
};

/// The DiT on FamilyOptions::diffusion_device.
struct Flux1::DiTWhole {
    std::unique_ptr<runtime::GraphRunner> runner;
    std::unique_ptr<FluxDiTModel> dit;
    size_t param_bytes() const { return dit->params.size(); }
};

struct Flux1::PlacedDiT {
    std::unique_ptr<DiTModel> model;
    std::unique_ptr<DiTPlaced> placed;
    const placement::ModulePlan& current_plan() const { return placed->current_plan(); }
    std::map<std::string, uint64_t> peaks() const { return placed->peaks(); }
};

Flux1::Flux1(const ModelFiles& files, const FamilyOptions& opt) : FamilyBase(files, opt) {}

Flux1::~Flux1() = default;

const io::WeightIndex& Flux1::t5_headers(std::unique_ptr<io::WeightIndex>& own, t5::T5Keys& keys, t5::T5Config& cfg) const {
    const std::string want = flux1_expected_t5(dcfg_.joint_dim);
    if (t5_src_.empty()) fail(ErrorKind::ModelMismatch, "no T5 text encoder: FLUX.1 needs {}; pass it with --t5xxl FILE", want);
    const io::WeightIndex& ti = index_for(t5_src_, own);
    auto k = t5::find_t5_encoder(ti);
    if (!k) fail(ErrorKind::ModelMismatch, "{}: holds {}, not a T5 encoder; FLUX.1 expects {} as --t5xxl", t5_src_.named(), what_it_holds(ti), want);
    keys = *k;
    cfg = t5::infer_config(ti, keys);
    if (cfg.d_model != dcfg_.joint_dim)
        fail(ErrorKind::ModelMismatch, "{}: the T5 encoder's d_model {} does not match the DiT's context width {}: this FLUX.1 model expects {}",
             t5_src_.named(), cfg.d_model, dcfg_.joint_dim, want);
    return ti;
}

const io::WeightIndex& Flux1::clip_headers(std::unique_ptr<io::WeightIndex>& own, clip::ClipKeys& keys, clip::ClipConfig& cfg) const {
    const std::string want = flux1_expected_clip(dcfg_.pooled_dim);
    if (clip_src_.empty()) fail(ErrorKind::ModelMismatch, "no CLIP text encoder: FLUX.1 needs {}; pass it with --clip_l FILE", want);
    const io::WeightIndex& ti = index_for(clip_src_, own);
    auto ks = clip::find_clip_text_encoders(ti);
    // A single file with several CLIP models (unusual for FLUX.1): the one of the pooled width.
    std::optional<clip::ClipKeys> pick;
    std::vector<std::string> widths;
    for (auto& k : ks) {
        clip::ClipOverrides ov;
        if (const nlohmann::json* c = ti.config()) ov = clip::overrides_from_config_json(*c);
        auto c = clip::infer_config(ti, k, ov);
        widths.push_back(std::to_string(c.width));
        if (c.width == dcfg_.pooled_dim && !pick) {
            pick = k;
            cfg = c;
        }
    }
    if (ks.empty())
        fail(ErrorKind::ModelMismatch, "{}: holds {}, not a CLIP text encoder; FLUX.1 expects {} as --clip_l", clip_src_.named(), what_it_holds(ti), want);
    if (!pick)
        fail(ErrorKind::ModelMismatch, "{}: the CLIP text encoder's hidden size {} does not match the DiT's pooled width {}: this FLUX.1 model expects {}",
             clip_src_.named(), fmt::join(widths, "/"), dcfg_.pooled_dim, want);
    keys = *pick;
    return ti;
}

std::unique_ptr<Flux1> Flux1::open(const ModelFiles& files, const FamilyOptions& opt) {
    std::unique_ptr<Flux1> m(new Flux1(files, opt));
    if (files.model.empty() && files.diffusion_model.empty())
        fail(ErrorKind::InvalidInput, "no model given: pass -m MODEL (a diffusers folder or a FLUX.1 file) or --diffusion-model");
    if (!(opt.flow_shift >= 0.0f) || !std::isfinite(opt.flow_shift))
        fail(ErrorKind::InvalidInput, "--flow-shift {}: must be a positive number (0 = the model's default)", opt.flow_shift);
    if (!std::isfinite(opt.guidance) || opt.guidance < 0.0f)
        fail(ErrorKind::InvalidInput, "--guidance {}: must be a finite number >= 0", opt.guidance);
    m->guidance_ = opt.guidance;
    if (!files.llm.empty())
        fail(ErrorKind::ModelMismatch,
             "--llm {}: FLUX.1 takes no LLM text encoder; pass T5-XXL with --t5xxl FILE and CLIP-L with --clip_l FILE", files.llm);
    if (!files.clip_g.empty())
        fail(ErrorKind::ModelMismatch, "--clip_g {}: FLUX.1 takes no CLIP-G; pass T5-XXL with --t5xxl FILE and CLIP-L with --clip_l FILE",
             files.clip_g);

    static const SourceRule rules[] = {{"transformer", &ModelFiles::diffusion_model, "--diffusion-model"},
                                       {"vae", &ModelFiles::vae, "--vae"},
                                       {"text_encoder_2", &ModelFiles::t5xxl, "--t5xxl"},
                                       {"text_encoder", &ModelFiles::clip_l, "--clip_l"}};
    ResolvedSources rs = resolve_sources(files, rules);
    const std::optional<nlohmann::json>& sched_cfg = rs.scheduler_config;
    rs.require(0, "FluxPipeline folders");
    m->dit_src_ = rs.sources[0];
    m->vae_src_ = rs.sources[1];
    m->t5_src_ = rs.sources[2];
    m->clip_src_ = rs.sources[3];
    m->model_desc_ = rs.model_desc;

    // DiT configuration from its headers (and config.json beside it for the rotary axes).
    m->dit_idx_ = open_index(m->dit_src_.path, m->dit_src_.flag);
    auto src = find_flux_dit(*m->dit_idx_);
    if (!src)
        fail(ErrorKind::ModelMismatch,
             "{}: no FLUX.1 DiT in it (no double_blocks / transformer_blocks with per-block modulation); pass the FLUX.1 model as -m or "
             "--diffusion-model",
             m->dit_src_.named());
    m->dsrc_ = *src;
    m->dcfg_ = infer_flux_dit_config(*m->dit_idx_, m->dsrc_);
    if (m->dcfg_.in_channels != 64 || m->dcfg_.out_channels != 64)
        fail(ErrorKind::ModelMismatch, "{}: the DiT takes {} / gives {} features per token; FLUX.1 text-to-image DiTs take 64 (16 channels x 2x2)",
             m->dit_src_.named(), m->dcfg_.in_channels, m->dcfg_.out_channels);

    // VAE configuration from its headers.
    VaeExpect ve;
    ve.latent_channels = 16;
    ve.family = "FLUX.1";
    ve.needed = "its VAE (16 latent channels, ae.safetensors)";
    ve.no_vae = ve.no_kl = "pass the FLUX.1 VAE (ae.safetensors) with --vae FILE";
    ve.wrong_channels = "FLUX.1 needs its 16-channel VAE (ae.safetensors)";
    // (--taesd alone, TAEF1 with no --vae: nothing read, no VAE encoder, factor 8)
    const OpenedVae ov = m->open_vae(ve);
    m->kl_ = ov.kl;
    m->spatial_factor_ = ov.spatial_factor;
    m->scaling_factor_ = ov.scaling.value_or(m->scaling_factor_);
    m->shift_factor_ = ov.shift.value_or(m->shift_factor_);

    // Noise process and the pipeline's schedule parameters.
    double shift = 1.0;
    m->shift_src_ = "FLUX.1 default";
    m->sched_opt_.flow_pipeline_sigmas = true;
    if (sched_cfg) {
        const auto num = [&](const char* k, double& v) {
            if (sched_cfg->contains(k) && (*sched_cfg)[k].is_number()) v = (*sched_cfg)[k].get<double>();
        };
        num("base_image_seq_len", m->sched_opt_.base_seq_len);
        num("max_image_seq_len", m->sched_opt_.max_seq_len);
        num("base_shift", m->sched_opt_.base_shift);
        num("max_shift", m->sched_opt_.max_shift);
        if (!sched_cfg->value("use_dynamic_shifting", false) && sched_cfg->contains("shift") && (*sched_cfg)["shift"].is_number()) {
            shift = (*sched_cfg)["shift"].get<double>();
            m->shift_src_ = "scheduler_config.json";
        }
    }
    if (opt.flow_shift > 0.0f) {
        shift = opt.flow_shift;
        m->shift_src_ = "--flow-shift";
    }
    m->ms_ = std::make_unique<sampling::ModelSampling>(sampling::ModelSampling::flow(shift));
    m->add_modules();
    return m;
}

std::string Flux1::name() const { return dcfg_.guidance_embeds ? "FLUX.1 dev" : "FLUX.1 schnell"; }

std::string Flux1::describe() const {
    return fmt::format("{} ({}), DiT hidden {} x ({} double + {} single blocks){}, flow shift {} ({}){}", name(), model_desc_, dcfg_.hidden,
                       dcfg_.n_double, dcfg_.n_single, dcfg_.guidance_embeds ? fmt::format(", guidance {}", guidance_) : "",
                       ms_->shift(), shift_src_, te_->whole() ? ", text encoders " + te_->whole()->desc : "") +
           (taesd_path_.empty() ? "" : ", TAEF1 decoder " + taesd_path_);
}

LatentFormat Flux1::latent_format() const {
    return {.channels = 16, .spatial_factor = spatial_factor_, .scaling_factor = scaling_factor_, .shift_factor = shift_factor_};
}

const sampling::ModelSampling& Flux1::model_sampling() const { return *ms_; }

SamplingDefaults Flux1::defaults() const {
    SamplingDefaults d;
    d.sampler = "euler";
    d.scheduler = dcfg_.guidance_embeds ? "flux" : "discrete";
    d.steps = dcfg_.guidance_embeds ? 20 : 4;
    d.cfg_scale = 1.0f;
    d.clip_skip = 0;
    d.width = d.height = 1024;
    return d;
}

sampling::ScheduleOptions Flux1::schedule_options() const { return sched_opt_; }

void Flux1::check_planned_latent(int64_t h, int64_t w) const {
    if (h <= 0 || w <= 0 || h % 2 != 0 || w % 2 != 0)
        fail(ErrorKind::InvalidInput, "latent size {}x{}: FLUX.1 needs an even number of latent cells", w, h);
}

void Flux1::lora_targets(LoraTargets& t) {
    const bool bfl = dsrc_.layout == FluxLayout::Bfl;
    FluxDiT dit(dcfg_, bfl);
    lora::add_flux1_targets(t.km, dit, dcfg_, bfl);
    auto ds = std::make_unique<nn::TensorSource>(*dit_idx_, dsrc_.prefix);
    configure_flux_source(*ds, dcfg_, dsrc_);
    t.sources["dit"] = std::move(ds);
    if (!clip_src_.empty()) {
        std::unique_ptr<io::WeightIndex> own;
        clip::ClipKeys keys;
        clip::ClipConfig cfg;
        const io::WeightIndex& ci = clip_headers(own, keys, cfg);
        clip::ClipTextModel clip(cfg);
        lora::add_clip_targets(t.km, "clip_l", 0, clip, cfg);
        t.sources["clip_l"] = std::make_unique<nn::TensorSource>(clip::make_tensor_source(ci, keys, cfg));
        if (own) t.own.push_back(std::move(own));
    }
    if (!t5_src_.empty()) {
        std::unique_ptr<io::WeightIndex> own;
        t5::T5Keys keys;
        t5::T5Config cfg;
        const io::WeightIndex& ti = t5_headers(own, keys, cfg);
        t5::T5Encoder t5(cfg);
        lora::add_t5_targets(t.km, 1, t5);
        t.sources["t5xxl"] = std::make_unique<nn::TensorSource>(t5::make_tensor_source(ti, keys));
        if (own) t.own.push_back(std::move(own));
    }
    t.info = {"FLUX.1", dcfg_.hidden, "hidden"};
}

void Flux1::add_modules() {
    // te: T5-XXL (context) and CLIP-L (pooled), loaded together in one stage
    ModuleSlot<TeModels, PlacedTe>::Hooks th;
    th.load_whole = [this] {
        auto te = std::make_unique<TeModels>();
        // Both encoders' headers are checked before anything is loaded.
        t5::T5Keys tk;
        clip::ClipKeys ck;
        const io::WeightIndex& ti = t5_headers(te->t5_own, tk, te->t5cfg);
        const io::WeightIndex& ci = clip_headers(te->clip_own, ck, te->clipcfg);
        te->runner = std::make_unique<runtime::GraphRunner>(opt_.te_device, opt_.threads);
        te->t5 = std::make_unique<t5::T5Encoder>(te->t5cfg);
        nn::LoadOptions lo = t5::default_load_options(ti, tk);
        lo.weight_type = weight_type_;
        te->t5_params = nn::ParamBuffer::load(*te->t5, t5::make_tensor_source(ti, tk), te->runner->buffer_type(), lo);
        te->clip = std::make_unique<clip::ClipTextModel>(te->clipcfg);
        nn::LoadOptions clo = clip::default_load_options(ck, te->clipcfg, ci);
        clo.weight_type = weight_type_;
        te->clip_params = nn::ParamBuffer::load(*te->clip, clip::make_tensor_source(ci, ck, te->clipcfg), te->runner->buffer_type(), clo);
        te->desc = fmt::format("T5 d_model {} x {} layers + CLIP hidden {} x {} layers", te->t5cfg.d_model, te->t5cfg.layers,
                               te->clipcfg.width, te->clipcfg.layers);
        return te;
    };
    th.load_placed = [this] {  // planned and loaded on the first encoding
        auto p = std::make_unique<PlacedTe>();
        t5::T5Keys tk;
        clip::ClipKeys ck;
        t5::T5Config tc;
        clip::ClipConfig cc;
        const io::WeightIndex& ti = t5_headers(p->t5_own, tk, tc);
        const io::WeightIndex& ci = clip_headers(p->clip_own, ck, cc);
        p->t5 = std::make_unique<T5Model>(ti, tk, tc, weight_type_);
        p->clip = std::make_unique<ClipModel>(ci, ck, cc, weight_type_);
        p->t5p = std::make_unique<T5Placed>(*p->t5->net, *p->t5->net, *p->t5->src, p->t5->lo, placement::PModule::Te, *opt_.placement,
                                            opt_.threads, opt_.flash_attn_te);
        // --split-mode te=row: T5's blocks on ggml's meta device (t5_row_split.h); CLIP-L has
        // no rules and runs as layer split (the planner warns)
        p->t5p->set_row_split(t5::t5_row_split_rules(*p->t5->net));
        p->clipp = std::make_unique<ClipPlaced>(*p->clip->net, *p->clip->net, *p->clip->src, p->clip->lo, placement::PModule::Te,
                                                *opt_.placement, opt_.threads, opt_.flash_attn_te);
        return p;
    };
    th.files = [this] {
        std::vector<std::string> r;
        if (!t5_src_.empty()) r.push_back(t5_src_.path);
        if (!clip_src_.empty() && clip_src_.path != t5_src_.path) r.push_back(clip_src_.path);
        return r;
    };
    th.costs = [this](int64_t, int64_t) {
        std::vector<placement::ModuleCosts> out;
        const int64_t L = kFlux1T5Tokens;
        if (!t5_src_.empty()) {  // T5 at 512 tokens
            struct Keep {
                std::unique_ptr<io::WeightIndex> own;
                std::unique_ptr<T5Model> model;
                std::vector<int32_t> ids, buckets;
            };
            auto k = std::make_shared<Keep>();
            t5::T5Keys keys;
            t5::T5Config tc;
            const io::WeightIndex& ti = t5_headers(k->own, keys, tc);
            k->model = std::make_unique<T5Model>(ti, keys, tc, weight_type_);
            k->ids.assign((size_t)L, 0);
            k->buckets = t5::relative_position_buckets(L, tc.num_buckets, tc.max_distance);
            T5Model& m = *k->model;
            out.push_back(runtime::self_contained_costs<t5::T5Inputs, t5::T5State, t5::T5Outputs>(
                placement::PModule::Te, k, *m.net, *m.net, *m.src, m.lo, opt_.threads, opt_.flash_attn_te, t5_inputs(L, k->ids, k->buckets),
                t5_output, fmt::format("T5 {} layers, {} tokens", tc.layers, L), t5::t5_row_split_rules(*m.net)));
        }
        if (!clip_src_.empty()) {  // CLIP-L: one 77-token window
            struct Keep {
                std::unique_ptr<io::WeightIndex> own;
                std::unique_ptr<ClipModel> model;
                std::vector<int32_t> ids, pool;
            };
            auto k = std::make_shared<Keep>();
            clip::ClipKeys keys;
            clip::ClipConfig cc;
            const io::WeightIndex& ci = clip_headers(k->own, keys, cc);
            k->model = std::make_unique<ClipModel>(ci, keys, cc, weight_type_);
            const int64_t Lc = std::min<int64_t>(77, cc.positions);
            k->ids.assign((size_t)Lc, 0);
            k->pool = {0};
            ClipModel& m = *k->model;
            out.push_back(runtime::self_contained_costs<clip::ClipInputs, clip::ClipState, clip::ClipOutputs>(
                placement::PModule::Te, k, *m.net, *m.net, *m.src, m.lo, opt_.threads, opt_.flash_attn_te, clip_inputs(Lc, k->ids, k->pool),
                clip_output, fmt::format("CLIP {} layers (pooled), {} tokens", cc.layers, Lc)));
        }
        return out;
    };
    te_ = &modules_.add<TeModels, PlacedTe>(Module::Te, std::move(th));

    // diffusion: the FLUX.1 DiT
    ModuleSlot<DiTWhole, PlacedDiT>::Hooks dh;
    dh.load_whole = [this] {
        auto d = std::make_unique<DiTWhole>();
        d->runner = std::make_unique<runtime::GraphRunner>(opt_.diffusion_device, opt_.threads);
        nn::LoadOptions lo;
        lo.weight_type = weight_type_;
        d->dit = std::make_unique<FluxDiTModel>(FluxDiTModel::load(*dit_idx_, d->runner->buffer_type(), lo, dcfg_.axes_dims));
        return d;
    };
    dh.load_placed = [this] {  // planned and loaded on the first evaluation (the plan needs the shapes)
        auto p = std::make_unique<PlacedDiT>();
        p->model = std::make_unique<DiTModel>(*dit_idx_, dsrc_, dcfg_, weight_type_);
        DiTModel& dm = *p->model;
        p->placed = std::make_unique<DiTPlaced>(*dm.net, *dm.net, *dm.src, dm.lo, placement::PModule::Diffusion, *opt_.placement, opt_.threads,
                                                opt_.flash_attn_diffusion);
        p->placed->set_row_split(flux1_row_split_rules(*dm.net));
        return p;
    };
    dh.files = [this]() -> std::vector<std::string> { return {dit_src_.path}; };
    dh.costs = [this](int64_t h, int64_t w) {  // the DiT at h x w with a 512-token context
        const int64_t L = kFlux1T5Tokens;
        struct Keep {
            std::unique_ptr<DiTModel> model;
            DiTHost d;
        };
        auto k = std::make_shared<Keep>();
        k->model = std::make_unique<DiTModel>(*dit_idx_, dsrc_, dcfg_, weight_type_);
        DiTHost& d = k->d;
        d.Li = (h / 2) * (w / 2);
        d.Lt = L;
        d.img.assign((size_t)(d.Li * dcfg_.in_channels), 0.0f);
        d.txt.assign((size_t)(L * dcfg_.joint_dim), 0.0f);
        d.pooled.assign((size_t)dcfg_.pooled_dim, 0.0f);
        d.rope = flux1_rope(dcfg_, L, h / 2, w / 2);
        DiTModel& m = *k->model;
        return std::vector<placement::ModuleCosts>{runtime::self_contained_costs<FluxInputs, FluxState, FluxOutputs>(
            placement::PModule::Diffusion, k, *m.net, *m.net, *m.src, m.lo, opt_.threads, opt_.flash_attn_diffusion, dit_inputs(m.cfg, d),
            dit_output, dit_label(dcfg_, h, w, L), flux1_row_split_rules(*m.net))};
    };
    dit_ = &modules_.add<DiTWhole, PlacedDiT>(Module::Diffusion, std::move(dh));

    // vae: the 16-channel FLUX.1 AutoencoderKL on the job's latent (factor 8)
    // (--taesd: TAEF1, a 16-channel tiny autoencoder, decodes instead of the KL decoder)
    add_vae({.kl = kl_, .tile_factor = spatial_factor_, .taesd_channels = 16, .taesd_kind = "TAEF1 (taef1_decoder)",
             .vae_needed = "the FLUX.1 VAE (ae.safetensors)"});
}

Conditioning Flux1::encode_prompt(const std::string& prompt, int /*clip_skip*/) {
    // Token ids first (no module needed), then the encoders (headers checked in load()).
    std::vector<int32_t> t5_ids = text::T5Tokenizer::builtin().encode_padded(prompt, (int)kFlux1T5Tokens);
    std::vector<int32_t> clip_ids = text::ClipTokenizer::builtin().encode_window(prompt, text::ClipTokenizer::kEos);
    load(Module::Te);
    if (PlacedTe* pt = te_->placed()) {
        PlacedTe& p = *pt;
        t5::check_token_ids(t5_ids, p.t5->cfg.vocab);
        clip::check_token_ids(clip_ids, p.clip->cfg.vocab);
        const int64_t L = kFlux1T5Tokens, Lc = (int64_t)clip_ids.size();
        if (Lc > p.clip->cfg.positions)
            fail(ErrorKind::ModelMismatch, "{}: the CLIP text encoder has {} positions; FLUX.1's CLIP-L takes {}", clip_src_.named(), p.clip->cfg.positions,
                 Lc);
        const auto buckets = t5::relative_position_buckets(L, p.t5->cfg.num_buckets, p.t5->cfg.max_distance);
        const std::vector<int32_t> pool = clip::pool_indices(clip_ids, Lc, 1, p.clip->cfg.eos_token_id);
        auto ctx = p.t5p->run({L}, t5_inputs(L, t5_ids, buckets), t5_output,
                              fmt::format("T5 {} layers, {} tokens", p.t5->cfg.layers, L));
        auto pooled = p.clipp->run({Lc}, clip_inputs(Lc, clip_ids, pool), clip_output,
                                   fmt::format("CLIP {} layers (pooled), {} tokens", p.clip->cfg.layers, Lc));
        Conditioning r;
        r.dim = ctx.at(0).ne[0];
        r.tokens = ctx[0].ne[1];
        r.context = std::move(ctx[0].data);
        r.pooled = std::move(pooled.at(0).data);
        r.token_ids = std::move(t5_ids);
        return r;
    }
    TeModels& te = *te_->whole();
    t5::check_token_ids(t5_ids, te.t5cfg.vocab);
    clip::check_token_ids(clip_ids, te.clipcfg.vocab);
    const int64_t L = kFlux1T5Tokens, Lc = (int64_t)clip_ids.size();
    if (Lc > te.clipcfg.positions)
        fail(ErrorKind::ModelMismatch, "{}: the CLIP text encoder has {} positions; FLUX.1's CLIP-L takes {}", clip_src_.named(), te.clipcfg.positions, Lc);
    const auto buckets = t5::relative_position_buckets(L, te.t5cfg.num_buckets, te.t5cfg.max_distance);
    const std::vector<int32_t> pool = clip::pool_indices(clip_ids, Lc, 1, te.clipcfg.eos_token_id);
    auto out = te.runner->run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), opt_.flash_attn_te, g.backend()};
        t5::T5Inputs ti;
        ti.ids = g.input_i32("t5_ids", {L, 1}, t5_ids);
        ti.buckets = g.input_i32("t5_buckets", {L * L}, buckets);
        clip::ClipInputs ci;
        ci.ids = g.input_i32("clip_ids", {Lc, 1}, clip_ids);
        ci.pool_index = g.input_i32("clip_pool", {1}, pool);
        return std::vector<ggml_tensor*>{te.t5->forward(c, ti).last_hidden_state, te.clip->forward(c, ci).pooler_output};
    });
    te_->note_compute(te.runner->last_compute_bytes());
    Conditioning r;
    r.dim = out[0].ne[0];
    r.tokens = out[0].ne[1];
    r.context = std::move(out[0].data);
    r.pooled = std::move(out[1].data);
    r.token_ids = std::move(t5_ids);
    return r;
}

void Flux1::diffusion(std::span<const float> x, std::span<const float> concat, int64_t h, int64_t w, double timestep,
                      const Conditioning& cond, std::span<float> out) {
    const int64_t C = 16;
    if (!concat.empty())
        fail(ErrorKind::InvalidInput, "FLUX.1's DiT takes no extra input channels (got {} values); in-painting is not supported", concat.size());
    if (h <= 0 || w <= 0 || h % 2 != 0 || w % 2 != 0)
        fail(ErrorKind::InvalidInput, "latent size {}x{}: FLUX.1 needs an even number of latent cells (image sides a multiple of {} pixels)", w, h,
             size_multiple());
    if ((int64_t)x.size() != C * h * w) fail(ErrorKind::InvalidInput, "DiT latent input has {} values, expected {}x{}x{}", x.size(), C, h, w);
    if ((int64_t)out.size() != C * h * w)
        fail(ErrorKind::InvalidInput, "DiT output buffer has {} values, expected {}x{}x{}", out.size(), C, h, w);
    if (cond.dim != dcfg_.joint_dim)
        fail(ErrorKind::ModelMismatch, "conditioning width {} does not match the DiT's context width {} ({} expected)", cond.dim, dcfg_.joint_dim,
             flux1_expected_t5(dcfg_.joint_dim));
    if (cond.tokens <= 0 || (int64_t)cond.context.size() != cond.tokens * cond.dim)
        fail(ErrorKind::InvalidInput, "conditioning context has {} values, expected {} tokens x {}", cond.context.size(), cond.tokens, cond.dim);
    if ((int64_t)cond.pooled.size() != dcfg_.pooled_dim)
        fail(ErrorKind::ModelMismatch, "the pooled conditioning has {} values; the DiT takes {} ({} pooled output)", cond.pooled.size(),
             dcfg_.pooled_dim, flux1_expected_clip(dcfg_.pooled_dim));
    if (!std::isfinite(timestep)) fail(ErrorKind::InvalidInput, "timestep {} is not finite", timestep);
    load(Module::Diffusion);
    const auto& cfg = dcfg_;
    const int64_t rows = h / 2, cols = w / 2, Li = rows * cols, Lt = cond.tokens;
    std::vector<float> img = pack_latents(x, 1, C, h, w);
    // position ids: text tokens (0, 0, 0), then image tokens (0, y, x)
    const RopeTables rope = flux1_rope(cfg, Lt, rows, cols);
    // FluxPipeline: timestep = t / 1000 in float32 (t = sigma * 1000 from the scheduler)
    const float t_model = (float)timestep / 1000.0f;
    const float g = guidance_;
    if (PlacedDiT* pd = dit_->placed()) {
        DiTHost d;
        d.img = std::move(img);
        d.txt = cond.context;
        d.pooled = cond.pooled;
        d.t = {t_model};
        d.g = {g};
        d.rope = rope;
        d.Li = Li;
        d.Lt = Lt;
        auto res = pd->placed->run({h, w, Lt}, dit_inputs(pd->model->cfg, d), dit_output, dit_label(cfg, h, w, Lt));
        if (res.at(0).numel() != Li * cfg.out_channels)
            fail(ErrorKind::Internal, "FLUX.1 DiT: output has {} values, expected {}", res[0].numel(), Li * cfg.out_channels);
        std::vector<float> lat = unpack_latents(res[0].data, 1, C, h, w);
        std::copy(lat.begin(), lat.end(), out.begin());
        return;
    }
    DiTWhole& dw = *dit_->whole();
    auto res = dw.runner->run([&](runtime::GraphBuilder& gb) {
        nn::Ctx c{gb.ctx(), opt_.flash_attn_diffusion, gb.backend()};
        FluxInputs in;
        in.img = gb.input_f32("img", {cfg.in_channels, Li, 1}, img);
        in.txt = gb.input_f32("txt", {cfg.joint_dim, Lt, 1}, cond.context);
        in.pooled = gb.input_f32("pooled", {cfg.pooled_dim, 1}, cond.pooled);
        in.timestep = gb.input_f32("timestep", {1}, std::span<const float>(&t_model, 1));
        if (cfg.guidance_embeds) in.guidance = gb.input_f32("guidance", {1}, std::span<const float>(&g, 1));
        in.rope_cos = gb.input_f32("rope_cos", {rope.half_dim, rope.tokens}, rope.cos);
        in.rope_sin = gb.input_f32("rope_sin", {rope.half_dim, rope.tokens}, rope.sin);
        return std::vector<ggml_tensor*>{dw.dit->module->forward(c, in).sample};
    });
    dit_->note_compute(dw.runner->last_compute_bytes());
    if (res.at(0).numel() != Li * cfg.out_channels)
        fail(ErrorKind::Internal, "FLUX.1 DiT: output has {} values, expected {}", res[0].numel(), Li * cfg.out_channels);
    std::vector<float> lat = unpack_latents(res[0].data, 1, C, h, w);
    std::copy(lat.begin(), lat.end(), out.begin());
}

vae::HostTensor Flux1::decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) {
    if (latent.c != 16) fail(ErrorKind::InvalidInput, "latent has {} channels; FLUX.1 latents have 16", latent.c);
    // TAEF1 decodes the latent the DiT works in, (raw - shift) x scale: diffusers' AutoencoderTiny
    // config for it has scaling 1 and shift 0; ComfyUI feeds its decoder (raw - 0.1159) x 0.3611
    return decode_scaled(latent, tiling, scaling_factor_, shift_factor_);
}

vae::LatentDist Flux1::encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) { return encode_kl(image, tiling); }

}  // namespace easel::models::flux
