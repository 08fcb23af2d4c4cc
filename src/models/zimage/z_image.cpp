#include "models/zimage/z_image.h"

#include "core/error.h"
#include "core/platform.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/diffusers.h"
#include "models/lora_targets.h"
#include "models/model_files.h"
#include "models/qwen3/qwen3_row_split.h"
#include "models/zimage/z_image_row_split.h"
#include "runtime/placed_sequence.h"
#include "text/qwen_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace easel::models::zimage {

namespace fs = std::filesystem;

namespace {

/// True when the file starts with GGUF's magic "GGUF".
bool is_gguf_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    char magic[4] = {};
    return f.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

/// "Qwen3-4B (hidden 2560)" for the real cap_feat_dim, else "a Qwen3 model with hidden size D".
std::string expected_te(int64_t cap_feat_dim) {
    if (cap_feat_dim == 2560) return "Qwen3-4B (hidden size 2560)";
    return fmt::format("a Qwen3 text encoder with hidden size {}", cap_feat_dim);
}

}  // namespace

bool is_zimage(const io::WeightIndex& index) { return find_zimage_dit(index).has_value(); }

namespace {

using TeSeq = runtime::EpilogueAdapter<qwen3::Qwen3Inputs, qwen3::Qwen3State, qwen3::Qwen3Outputs, ggml_tensor*>;
using DiTPlaced = runtime::PlacedSequence<ZImageInputs, ZImageState, ggml_tensor*>;

/// Qwen3 with its last layer left out: its state after the last block is hidden_states[-2] of
/// the full model (the raw output of layer layers - 2), which the epilogue returns as is.
struct TeModel {
    qwen3::Qwen3Config cfg;
    std::unique_ptr<qwen3::Qwen3Model> net;
    std::unique_ptr<nn::TensorSource> src;
    std::unique_ptr<TeSeq> seq;
    nn::LoadOptions lo;
    TeModel(const io::WeightIndex& ti, const qwen3::Qwen3Keys& keys, const qwen3::Qwen3Config& full, ggml_type weight_type) {
        qwen3::Qwen3Overrides ov;
        ov.layers = (int)full.layers - 1;
        cfg = qwen3::infer_config(ti, keys, ov);
        net = std::make_unique<qwen3::Qwen3Model>(cfg);
        src = std::make_unique<nn::TensorSource>(qwen3::make_tensor_source(ti, keys, cfg));
        seq = std::make_unique<TeSeq>(*net, [](nn::Ctx&, qwen3::Qwen3State st) { return st.h; });
        lo = qwen3::default_load_options(keys, cfg, ti);
        lo.weight_type = weight_type;
    }
};

std::vector<ggml_tensor*> one_output(ggml_tensor*& o) { return {o}; }

/// The transformer's inputs for a latent h x w, caption [L, D] and rope tables (host buffers).
std::function<ZImageInputs(runtime::GraphBuilder&)> dit_inputs(const ZImageDiTConfig& cfg, int64_t h, int64_t w, int64_t L,
                                                               std::span<const float> x, std::span<const float> t,
                                                               std::span<const float> cap, const ZImageRope& rope) {
    return [=, &cfg, &rope](runtime::GraphBuilder& g) {
        const int64_t half = cfg.head_dim / 2;
        ZImageInputs in;
        in.x = g.input_f32("x", {w, h, cfg.in_channels, 1}, x);
        in.t = g.input_f32("t", {1}, t);
        in.cap = g.input_f32("cap", {cfg.cap_feat_dim, L, 1}, cap);
        in.rope_cos = g.input_f32("rope_cos", {half, rope.tokens()}, rope.cos);
        in.rope_sin = g.input_f32("rope_sin", {half, rope.tokens()}, rope.sin);
        return in;
    };
}

std::string dit_label(const ZImageDiTConfig& cfg, int64_t h, int64_t w, int64_t L) {
    return fmt::format("Z-Image transformer {} layers, latent {}x{}x{}, caption {} tokens", cfg.n_layers, cfg.in_channels, h, w, L);
}

}  // namespace

struct ZImage::PlacedTe {
    std::unique_ptr<io::WeightIndex> own;
    std::unique_ptr<TeModel> model;
    std::unique_ptr<runtime::PlacedSequence<qwen3::Qwen3Inputs, qwen3::Qwen3State, ggml_tensor*>> placed;
    const placement::ModulePlan& current_plan() const { return placed->current_plan(); }
    std::map<std::string, uint64_t> peaks() const { return placed->peaks(); }
};

struct ZImage::PlacedDiT {
    ZImageDiTConfig cfg;
    std::unique_ptr<ZImageDiT> net;
    std::unique_ptr<nn::TensorSource> src;
    std::unique_ptr<DiTPlaced> placed;
    const placement::ModulePlan& current_plan() const { return placed->current_plan(); }
    std::map<std::string, uint64_t> peaks() const { return placed->peaks(); }
};

ZImage::ZImage(const ModelFiles& files, const FamilyOptions& opt) : FamilyBase(files, opt) {}

ZImage::~ZImage() = default;

const io::WeightIndex& ZImage::te_headers(std::unique_ptr<io::WeightIndex>& own, qwen3::Qwen3Keys& keys, qwen3::Qwen3Config& qc) const {
    if (te_src_.empty()) fail(ErrorKind::ModelMismatch, "no text encoder: pass {} with --llm FILE", expected_te(dcfg_.cap_feat_dim));
    const io::WeightIndex* ti = &index_for(te_src_, own);
    // Header checks before any weight is read: a Qwen3 model, of the transformer's width.
    auto k = qwen3::find_qwen3(*ti);
    if (!k)
        fail(ErrorKind::ModelMismatch, "{}: no Qwen3 text encoder found in it; Z-Image expects {}; pass it with --llm FILE", te_src_.named(),
             expected_te(dcfg_.cap_feat_dim));
    keys = *k;
    qc = qwen3::infer_config(*ti, keys);
    if (qc.hidden != dcfg_.cap_feat_dim)
        fail(ErrorKind::ModelMismatch,
             "{}: the text encoder's hidden size {} does not match the transformer's caption width {}: this Z-Image transformer expects {}",
             te_src_.named(), qc.hidden, dcfg_.cap_feat_dim, expected_te(dcfg_.cap_feat_dim));
    if (qc.layers < 2)
        fail(ErrorKind::ModelMismatch, "{}: the text encoder has {} layer(s); Z-Image reads hidden_states[-2] and needs at least 2", te_src_.named(),
             qc.layers);
    return *ti;
}

std::unique_ptr<ZImage> ZImage::open(const ModelFiles& files, const FamilyOptions& opt) {
    std::unique_ptr<ZImage> m(new ZImage(files, opt));
    if (files.model.empty() && files.diffusion_model.empty())
        fail(ErrorKind::InvalidInput, "no model given: pass -m MODEL (a diffusers folder or a Z-Image file) or --diffusion-model");
    if (!(opt.flow_shift >= 0.0f) || !std::isfinite(opt.flow_shift))
        fail(ErrorKind::InvalidInput, "--flow-shift {}: must be a positive number (0 = the model's default)", opt.flow_shift);

    for (auto [flag, path] : {std::pair<const char*, const std::string*>{"--clip_l", &files.clip_l}, {"--clip_g", &files.clip_g}, {"--t5xxl", &files.t5xxl}})
        note_unused_model_file(flag, *path, "Z-Image", "has no such text encoder (its text encoder is the Qwen3 LLM, --llm)");

    static const SourceRule rules[] = {{"transformer", &ModelFiles::diffusion_model, "--diffusion-model"},
                                       {"vae", &ModelFiles::vae, "--vae"},
                                       {"text_encoder", &ModelFiles::llm, "--llm"}};
    ResolvedSources rs = resolve_sources(files, rules);
    const std::optional<nlohmann::json>& sched_cfg = rs.scheduler_config;
    m->tokenizer_json_ = rs.tokenizer_json;
    rs.require(0, "Z-Image pipelines");
    m->dit_src_ = rs.sources[0];
    m->vae_src_ = rs.sources[1];
    m->te_src_ = rs.sources[2];
    m->model_desc_ = rs.model_desc;

    // Transformer configuration from its headers.
    m->dit_idx_ = open_index(m->dit_src_.path, m->dit_src_.flag);
    auto keys = find_zimage_dit(*m->dit_idx_);
    if (!keys)
        fail(ErrorKind::ModelMismatch, "{}: no Z-Image transformer in it (no x_pad_token / cap_pad_token); pass the Z-Image model as -m or --diffusion-model",
             m->dit_src_.named());
    ZImageOverrides dov;
    if (const nlohmann::json* dc = m->dit_idx_->config()) dov = overrides_from_config_json(*dc);
    m->dcfg_ = infer_config(*m->dit_idx_, *keys, dov);
    if (m->dcfg_.in_channels != 16)
        fail(ErrorKind::ModelMismatch, "{}: the transformer takes {} latent channels; Z-Image's take 16", m->dit_src_.named(), m->dcfg_.in_channels);

    // VAE configuration from its headers.
    VaeExpect ve;
    ve.latent_channels = m->dcfg_.in_channels;
    ve.family = "Z-Image";
    ve.needed = "the FLUX.1 VAE (16 latent channels, ae.safetensors)";
    ve.no_vae = ve.no_kl = "pass the FLUX.1 VAE (ae.safetensors) with --vae FILE";
    ve.wrong_channels = "Z-Image needs the 16-channel FLUX.1 VAE (ae.safetensors)";
    // (--taesd alone, TAEF1 with no --vae: nothing read, no VAE encoder, factor 8)
    const OpenedVae ov = m->open_vae(ve);
    m->kl_ = ov.kl;
    m->spatial_factor_ = ov.spatial_factor;
    m->scaling_factor_ = ov.scaling.value_or(m->scaling_factor_);
    m->shift_factor_ = ov.shift.value_or(m->shift_factor_);

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
    m->add_modules();
    return m;
}

std::string ZImage::name() const { return "Z-Image"; }

std::string ZImage::describe() const {
    return fmt::format("Z-Image ({}), transformer {}, flow shift {} ({}){}", model_desc_, dcfg_.summary(), ms_->shift(), shift_src_,
                       te_desc_.empty() ? "" : ", text encoder " + te_desc_) +
           (taesd_path_.empty() ? "" : ", TAEF1 decoder " + taesd_path_);
}

LatentFormat ZImage::latent_format() const {
    return {.channels = dcfg_.in_channels, .spatial_factor = spatial_factor_, .scaling_factor = scaling_factor_, .shift_factor = shift_factor_};
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

// The tokenizer that belongs to the text encoder in use, in this order: the vocabulary in the
// metadata of a GGUF text encoder (llama.cpp's tokenizer.ggml.*; read from its header, no
// weights), the diffusers folder's tokenizer/tokenizer.json, the Qwen3 tokenizer built into the
// library. A GGUF text encoder without tokenizer metadata falls through to the next source
// (its header is then read again on each call; such files are rare).
const text::QwenTokenizer& ZImage::tokenizer() const {
    if (own_tokenizer_) return *own_tokenizer_;
    std::error_code ec;
    if (!te_src_.empty() && fs::is_regular_file(te_src_.path, ec) && is_gguf_file(te_src_.path)) {
        std::unique_ptr<io::WeightIndex> own;
        const io::WeightIndex* ti = te_src_.path == dit_src_.path ? dit_idx_.get() : nullptr;
        if (!ti) {
            own = open_index(te_src_.path, te_src_.flag);
            ti = own.get();
        }
        if (text::QwenTokenizer::gguf_has_tokenizer(ti->metadata())) {
            own_tokenizer_ = std::make_unique<text::QwenTokenizer>(text::QwenTokenizer::from_gguf_metadata(ti->metadata()));
            log::debug("tokenizer: the vocabulary in the GGUF metadata of {}", te_src_.named());
            return *own_tokenizer_;
        }
    }
    if (tokenizer_json_.empty()) return text::QwenTokenizer::builtin();
    own_tokenizer_ = std::make_unique<text::QwenTokenizer>(text::QwenTokenizer::from_file(tokenizer_json_));
    return *own_tokenizer_;
}

void ZImage::lora_targets(LoraTargets& t) {
    ZImageDiT dit(dcfg_);
    lora::add_zimage_targets(t.km, dit, dcfg_);
    auto keys = find_zimage_dit(*dit_idx_);
    if (!keys) fail(ErrorKind::ModelMismatch, "{}: no Z-Image transformer found", dit_src_.named());
    t.sources["dit"] = std::make_unique<nn::TensorSource>(make_tensor_source(*dit_idx_, *keys, dcfg_));
    if (!te_src_.empty()) {
        std::unique_ptr<io::WeightIndex> own;
        qwen3::Qwen3Keys qk;
        qwen3::Qwen3Config qc;
        const io::WeightIndex& ti = te_headers(own, qk, qc);
        add_qwen3_lora_targets(t, ti, std::move(own), qk, qc);
    }
    t.info = {"Z-Image", dcfg_.dim, "hidden"};
}

void ZImage::add_modules() {
    // te: Qwen3; the context is hidden_states[-2]
    ModuleSlot<qwen3::Qwen3TextEncoder, PlacedTe>::Hooks th;
    th.load_whole = [this] {
        std::unique_ptr<io::WeightIndex> own;
        qwen3::Qwen3Keys keys;
        qwen3::Qwen3Config qc;
        const io::WeightIndex& ti = te_headers(own, keys, qc);
        te_desc_ = fmt::format("Qwen3 hidden {} x {} layers", qc.hidden, qc.layers);
        return std::make_unique<qwen3::Qwen3TextEncoder>(ti, qwen3_run_options());
    };
    th.load_placed = [this] {  // planned and loaded on the first encoding (the plan needs the prompt length)
        auto p = std::make_unique<PlacedTe>();
        qwen3::Qwen3Keys keys;
        qwen3::Qwen3Config qc;
        const io::WeightIndex& ti = te_headers(p->own, keys, qc);
        te_desc_ = fmt::format("Qwen3 hidden {} x {} layers", qc.hidden, qc.layers);
        p->model = std::make_unique<TeModel>(ti, keys, qc, weight_type_);
        TeModel& tm = *p->model;
        p->placed = std::make_unique<runtime::PlacedSequence<qwen3::Qwen3Inputs, qwen3::Qwen3State, ggml_tensor*>>(
            *tm.net, *tm.seq, *tm.src, tm.lo, placement::PModule::Te, *opt_.placement, opt_.threads, opt_.flash_attn_te);
        // --split-mode te=row: the Qwen3 layers on ggml's meta device (qwen3_row_split.h)
        p->placed->set_row_split(qwen3::qwen3_row_split_rules(*tm.net, opt_.flash_attn_te));
        return p;
    };
    th.files = [this] {
        std::vector<std::string> r;
        if (!te_src_.empty()) r.push_back(te_src_.path);
        if (!tokenizer_json_.empty()) r.push_back(tokenizer_json_);
        return r;
    };
    th.costs = [this](int64_t, int64_t) {  // Qwen3 without its last layer, 512 tokens (none when no --llm / folder te)
        std::vector<placement::ModuleCosts> out;
        if (te_src_.empty()) return out;
        constexpr int64_t L = kMaxPromptTokens;
        struct Keep {
            std::unique_ptr<io::WeightIndex> own;
            std::unique_ptr<TeModel> model;
            std::vector<int32_t> ids, pos;
        };
        auto k = std::make_shared<Keep>();
        qwen3::Qwen3Keys keys;
        qwen3::Qwen3Config qc;
        const io::WeightIndex& ti = te_headers(k->own, keys, qc);
        k->model = std::make_unique<TeModel>(ti, keys, qc, weight_type_);
        k->ids.assign((size_t)L, 0);
        k->pos = qwen3::positions(L);
        Keep* kp = k.get();
        TeModel& tm = *k->model;
        out.push_back(runtime::self_contained_costs<qwen3::Qwen3Inputs, qwen3::Qwen3State, ggml_tensor*>(
            placement::PModule::Te, k, *tm.net, *tm.seq, *tm.src, tm.lo, opt_.threads, opt_.flash_attn_te,
            [kp](runtime::GraphBuilder& g) {
                qwen3::Qwen3Inputs in;
                in.ids = g.input_i32("ids", {L, 1}, kp->ids);
                in.pos = g.input_i32("pos", {L}, kp->pos);
                return in;
            },
            one_output, fmt::format("Qwen3 {} of {} layers (hidden_states[-2]), {} tokens", tm.cfg.layers, qc.layers, L),
            qwen3::qwen3_row_split_rules(*tm.net, opt_.flash_attn_te)));
        return out;
    };
    te_ = &modules_.add<qwen3::Qwen3TextEncoder, PlacedTe>(Module::Te, std::move(th));

    // diffusion: the Z-Image transformer
    ModuleSlot<LoadedZImageDiT, PlacedDiT>::Hooks dh;
    dh.load_whole = [this] {
        ZImageLoadOptions lo;
        lo.device = opt_.diffusion_device;
        lo.threads = opt_.threads;
        lo.flash_attn = opt_.flash_attn_diffusion;
        lo.weight_type = weight_type_;
        if (const nlohmann::json* dc = dit_idx_->config()) lo.overrides = overrides_from_config_json(*dc);
        return LoadedZImageDiT::load(*dit_idx_, lo);
    };
    dh.load_placed = [this] {  // planned and loaded on the first evaluation (the plan needs the shapes)
        auto keys = find_zimage_dit(*dit_idx_);
        auto p = std::make_unique<PlacedDiT>();
        p->cfg = dcfg_;
        p->net = std::make_unique<ZImageDiT>(dcfg_);
        p->src = std::make_unique<nn::TensorSource>(make_tensor_source(*dit_idx_, *keys, dcfg_));
        nn::LoadOptions lo = default_load_options(*dit_idx_, *keys);
        lo.weight_type = weight_type_;
        p->placed = std::make_unique<DiTPlaced>(*p->net, *p->net, *p->src, lo, placement::PModule::Diffusion, *opt_.placement, opt_.threads,
                                                opt_.flash_attn_diffusion);
        // --split-mode row: the DiT's main layers on ggml's meta device (placement/row_split.h)
        p->placed->set_row_split(zimage_row_split_rules(*p->net));
        return p;
    };
    dh.files = [this]() -> std::vector<std::string> { return {dit_src_.path}; };
    dh.costs = [this](int64_t h, int64_t w) {  // the transformer at h x w with a 512-token caption
        const int64_t L = kMaxPromptTokens;
        struct Keep {
            ZImageDiTConfig cfg;
            std::unique_ptr<ZImageDiT> net;
            std::unique_ptr<nn::TensorSource> src;
            std::vector<float> x, t, cap;
            ZImageRope rope;
        };
        auto k = std::make_shared<Keep>();
        auto keys = find_zimage_dit(*dit_idx_);
        k->cfg = dcfg_;
        k->net = std::make_unique<ZImageDiT>(dcfg_);
        k->src = std::make_unique<nn::TensorSource>(make_tensor_source(*dit_idx_, *keys, dcfg_));
        k->rope = make_rope(dcfg_, h, w, L);
        k->x.resize((size_t)(dcfg_.in_channels * h * w));
        k->t.resize(1);
        k->cap.resize((size_t)(L * dcfg_.cap_feat_dim));
        nn::LoadOptions lo = default_load_options(*dit_idx_, *keys);
        lo.weight_type = weight_type_;
        return std::vector<placement::ModuleCosts>{runtime::self_contained_costs<ZImageInputs, ZImageState, ggml_tensor*>(
            placement::PModule::Diffusion, k, *k->net, *k->net, *k->src, lo, opt_.threads, opt_.flash_attn_diffusion,
            dit_inputs(k->cfg, h, w, L, k->x, k->t, k->cap, k->rope), one_output, dit_label(dcfg_, h, w, L),
            zimage_row_split_rules(*k->net))};
    };
    dit_ = &modules_.add<LoadedZImageDiT, PlacedDiT>(Module::Diffusion, std::move(dh));

    // vae: the FLUX.1 AutoencoderKL
    // (--taesd: TAEF1, a 16-channel tiny autoencoder, decodes instead of the KL decoder)
    add_vae({.kl = kl_, .tile_factor = spatial_factor_, .taesd_channels = 16, .taesd_kind = "TAEF1 (taef1_decoder)",
             .vae_needed = "the FLUX.1 VAE (ae.safetensors)"});
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
    PlacedTe* placed = te_->placed();
    const int64_t vocab = placed ? placed->model->cfg.vocab : te_->whole()->config().vocab;
    for (int32_t id : ids)
        if (id < 0 || id >= vocab)
            fail(ErrorKind::ModelMismatch, "{}: token id {} is outside the text encoder's vocabulary of {}; Z-Image expects {} with Qwen's vocabulary",
                 te_src_.named(), id, vocab, expected_te(dcfg_.cap_feat_dim));
    const int64_t L = (int64_t)ids.size();
    std::vector<runtime::HostTensor> hs;
    if (placed) {
        const std::vector<int32_t> pos = qwen3::positions(L);
        hs = placed->placed->run(
            {L},
            [&](runtime::GraphBuilder& g) {
                qwen3::Qwen3Inputs in;
                in.ids = g.input_i32("ids", {L, 1}, ids);
                in.pos = g.input_i32("pos", {L}, pos);
                return in;
            },
            one_output, fmt::format("Qwen3 {} of {} layers (hidden_states[-2]), {} tokens", placed->model->cfg.layers,
                                    placed->model->cfg.layers + 1, L));
    } else {
        const int index = -2;
        qwen3::Qwen3TextEncoder& te = *te_->whole();
        hs = te.run(ids, {}, 1, L, std::span<const int>(&index, 1));
        te_->note_compute(te.runner().last_compute_bytes());
    }
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
    if (PlacedDiT* pd = dit_->placed()) {
        const ZImageRope rope = make_rope(dcfg_, h, w, cond.tokens);  // validates h, w, L
        auto res = pd->placed->run({h, w, cond.tokens},
                                            dit_inputs(pd->cfg, h, w, cond.tokens, x, std::span<const float>(&t_model, 1),
                                                       cond.context, rope),
                                            one_output, dit_label(dcfg_, h, w, cond.tokens));
        if (res.at(0).data.size() != out.size())
            fail(ErrorKind::Internal, "Z-Image transformer: output has {} values, expected {}", res[0].data.size(), out.size());
        std::copy(res[0].data.begin(), res[0].data.end(), out.begin());
    } else {
        LoadedZImageDiT& dit = *dit_->whole();
        dit.forward(x.data(), h, w, t_model, cond.context.data(), cond.tokens, out.data());
        dit_->note_compute(dit.compute_bytes());
    }
    for (float& v : out) v = -v;  // velocity noise - x0 = -(model output)
}

vae::HostTensor ZImage::decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) {
    if (latent.c != dcfg_.in_channels)
        fail(ErrorKind::InvalidInput, "latent has {} channels; Z-Image latents have {}", latent.c, dcfg_.in_channels);
    // TAEF1 decodes the latent the DiT works in, (raw - shift) x scale: diffusers' AutoencoderTiny
    // config for it has scaling 1 and shift 0; ComfyUI feeds its decoder (raw - 0.1159) x 0.3611
    return decode_scaled(latent, tiling, scaling_factor_, shift_factor_);
}

vae::LatentDist ZImage::encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) { return encode_kl(image, tiling); }

}  // namespace easel::models::zimage
