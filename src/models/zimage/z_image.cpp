#include "models/zimage/z_image.h"

#include "core/error.h"
#include "models/model_files.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/diffusers.h"
#include "placement/placed_sequence.h"
#include "models/qwen3/qwen3_row_split.h"
#include "placement/row_split.h"
#include "text/qwen_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace easel::models::zimage {

namespace fs = std::filesystem;

namespace {

std::string flag_of(const std::string& flag_and_path) { return flag_and_path.substr(0, flag_and_path.find(' ')); }

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

using TeSeq = placement::EpilogueAdapter<qwen3::Qwen3Inputs, qwen3::Qwen3State, qwen3::Qwen3Outputs, ggml_tensor*>;
using DiTPlaced = placement::PlacedSequence<ZImageInputs, ZImageState, ggml_tensor*>;

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
    std::unique_ptr<placement::PlacedSequence<qwen3::Qwen3Inputs, qwen3::Qwen3State, ggml_tensor*>> placed;
};

struct ZImage::PlacedDiT {
    ZImageDiTConfig cfg;
    std::unique_ptr<ZImageDiT> net;
    std::unique_ptr<nn::TensorSource> src;
    std::unique_ptr<DiTPlaced> placed;
};

ZImage::~ZImage() = default;

const io::WeightIndex& ZImage::te_headers(std::unique_ptr<io::WeightIndex>& own, qwen3::Qwen3Keys& keys, qwen3::Qwen3Config& qc) const {
    if (te_path_.empty()) fail(ErrorKind::ModelMismatch, "no text encoder: pass {} with --llm FILE", expected_te(dcfg_.cap_feat_dim));
    const io::WeightIndex* ti = nullptr;
    if (te_path_ == dit_path_) ti = dit_idx_.get();
    else if (vae_idx_ && te_path_ == vae_path_) ti = vae_idx_.get();
    else {
        own = open_index(te_path_, flag_of(te_flag_));
        ti = own.get();
    }
    // Header checks before any weight is read: a Qwen3 model, of the transformer's width.
    auto k = qwen3::find_qwen3(*ti);
    if (!k)
        fail(ErrorKind::ModelMismatch, "{}: no Qwen3 text encoder found in it; Z-Image expects {}; pass it with --llm FILE", te_flag_,
             expected_te(dcfg_.cap_feat_dim));
    keys = *k;
    qc = qwen3::infer_config(*ti, keys);
    if (qc.hidden != dcfg_.cap_feat_dim)
        fail(ErrorKind::ModelMismatch,
             "{}: the text encoder's hidden size {} does not match the transformer's caption width {}: this Z-Image transformer expects {}",
             te_flag_, qc.hidden, dcfg_.cap_feat_dim, expected_te(dcfg_.cap_feat_dim));
    if (qc.layers < 2)
        fail(ErrorKind::ModelMismatch, "{}: the text encoder has {} layer(s); Z-Image reads hidden_states[-2] and needs at least 2", te_flag_,
             qc.layers);
    return *ti;
}

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
    check_vae_kind(vi, *m->kl_, m->dcfg_.in_channels, m->vae_flag_, "Z-Image", "the FLUX.1 VAE (16 latent channels, ae.safetensors)");
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
    case Module::Te: return te_ != nullptr || placed_te_ != nullptr;
    case Module::Diffusion: return dit_ != nullptr || placed_dit_ != nullptr;
    case Module::VaeDecoder: return vae_dec_ != nullptr || placed_vae_ != nullptr;
    case Module::VaeEncoder: return vae_enc_ != nullptr || placed_vae_enc_ != nullptr;
    }
    return false;
}

// The tokenizer that belongs to the text encoder in use, in this order: the vocabulary in the
// metadata of a GGUF text encoder (llama.cpp's tokenizer.ggml.*; read from its header, no
// weights), the diffusers folder's tokenizer/tokenizer.json, the Qwen3 tokenizer built into the
// library. A GGUF text encoder without tokenizer metadata falls through to the next source
// (its header is then read again on each call; such files are rare).
const text::QwenTokenizer& ZImage::tokenizer() const {
    if (own_tokenizer_) return *own_tokenizer_;
    std::error_code ec;
    if (!te_path_.empty() && fs::is_regular_file(te_path_, ec) && is_gguf_file(te_path_)) {
        std::unique_ptr<io::WeightIndex> own;
        const io::WeightIndex* ti = te_path_ == dit_path_ ? dit_idx_.get() : nullptr;
        if (!ti) {
            own = open_index(te_path_, flag_of(te_flag_));
            ti = own.get();
        }
        if (text::QwenTokenizer::gguf_has_tokenizer(ti->metadata())) {
            own_tokenizer_ = std::make_unique<text::QwenTokenizer>(text::QwenTokenizer::from_gguf_metadata(ti->metadata()));
            log::debug("tokenizer: the vocabulary in the GGUF metadata of {}", te_flag_);
            return *own_tokenizer_;
        }
    }
    if (tokenizer_json_.empty()) return text::QwenTokenizer::builtin();
    own_tokenizer_ = std::make_unique<text::QwenTokenizer>(text::QwenTokenizer::from_file(tokenizer_json_));
    return *own_tokenizer_;
}

void ZImage::load(Module m) {
    if (loaded(m)) return;
    switch (m) {
    case Module::Te: {
        std::unique_ptr<io::WeightIndex> own;
        qwen3::Qwen3Keys keys;
        qwen3::Qwen3Config qc;
        const io::WeightIndex* ti = &te_headers(own, keys, qc);
        te_desc_ = fmt::format("Qwen3 hidden {} x {} layers", qc.hidden, qc.layers);
        if (opt_.placement) {  // planned and loaded on the first encoding (the plan needs the prompt length)
            placed_te_ = std::make_unique<PlacedTe>();
            placed_te_->model = std::make_unique<TeModel>(*ti, keys, qc, weight_type_);
            TeModel& tm = *placed_te_->model;
            placed_te_->own = std::move(own);
            placed_te_->placed = std::make_unique<placement::PlacedSequence<qwen3::Qwen3Inputs, qwen3::Qwen3State, ggml_tensor*>>(
                *tm.net, *tm.seq, *tm.src, tm.lo, placement::PModule::Te, *opt_.placement, opt_.threads, opt_.flash_attn_te);
            // --split-mode te=row: the Qwen3 layers on ggml's meta device (qwen3_row_split.h)
            placed_te_->placed->set_row_split(qwen3::qwen3_row_split_rules(*tm.net, opt_.flash_attn_te));
            break;
        }
        qwen3::Qwen3RunOptions ro;
        ro.device = opt_.te_device;
        ro.threads = opt_.threads;
        ro.weight_type = weight_type_;
        ro.flash_attn = opt_.flash_attn_te;
        te_ = std::make_unique<qwen3::Qwen3TextEncoder>(*ti, ro);
        break;
    }
    case Module::Diffusion: {
        if (opt_.placement) {  // planned and loaded on the first evaluation (the plan needs the shapes)
            auto keys = find_zimage_dit(*dit_idx_);
            placed_dit_ = std::make_unique<PlacedDiT>();
            placed_dit_->cfg = dcfg_;
            placed_dit_->net = std::make_unique<ZImageDiT>(dcfg_);
            placed_dit_->src = std::make_unique<nn::TensorSource>(make_tensor_source(*dit_idx_, *keys, dcfg_));
            nn::LoadOptions lo = default_load_options(*dit_idx_, *keys);
            lo.weight_type = weight_type_;
            placed_dit_->placed = std::make_unique<DiTPlaced>(*placed_dit_->net, *placed_dit_->net, *placed_dit_->src, lo,
                                                              placement::PModule::Diffusion, *opt_.placement, opt_.threads,
                                                              opt_.flash_attn_diffusion);
            // --split-mode row: the DiT's main layers on ggml's meta device (placement/row_split.h)
            placed_dit_->placed->set_row_split(placement::zimage_row_split_rules(*placed_dit_->net));
            break;
        }
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
        if (opt_.placement) {  // planned and loaded on the first decode (the plan needs the latent's shape)
            placed_vae_ = std::make_unique<placement::PlacedVaeDecoder>(vae_source(), *opt_.placement, opt_.threads, false);
            break;
        }
        [[fallthrough]];
    case Module::VaeEncoder: {
        if (m == Module::VaeEncoder && opt_.placement) {  // planned and loaded on the first encode (the plan needs the image's shape)
            placed_vae_enc_ = std::make_unique<placement::PlacedVaeEncoder>(vae_source(), *opt_.placement, opt_.threads, false);
            break;
        }
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
    case Module::Te:
        te_.reset();
        if (placed_te_ && !placed_te_->placed->current_plan().segments.empty()) {
            te_plans_done_ = {placed_te_->placed->current_plan()};
            te_peaks_done_ = placed_te_->placed->peaks();
        }
        placed_te_.reset();
        break;
    case Module::Diffusion:
        dit_.reset();
        if (placed_dit_ && !placed_dit_->placed->current_plan().segments.empty()) {  // the closing memory line names its devices
            dit_plans_done_ = {placed_dit_->placed->current_plan()};
            dit_peaks_done_ = placed_dit_->placed->peaks();
        }
        placed_dit_.reset();
        break;
    case Module::VaeDecoder:
        vae_dec_.reset();
        if (placed_vae_ && !placed_vae_->current_plan().segments.empty()) {
            vae_plans_done_ = {placed_vae_->current_plan()};
            vae_peaks_done_ = placed_vae_->peaks();
        }
        placed_vae_.reset();
        if (!vae_enc_) vae_runner_.reset();
        break;
    case Module::VaeEncoder:
        vae_enc_.reset();
        if (placed_vae_enc_ && !placed_vae_enc_->current_plan().segments.empty()) {
            vae_enc_plans_done_ = {placed_vae_enc_->current_plan()};
            vae_enc_peaks_done_ = placed_vae_enc_->peaks();
        }
        placed_vae_enc_.reset();
        if (!vae_dec_) vae_runner_.reset();
        break;
    }
}

size_t ZImage::param_bytes(Module m) const {
    switch (m) {
    case Module::Te: return te_ ? te_->param_bytes() : 0;
    case Module::Diffusion: return dit_ ? dit_->param_bytes() : 0;
    case Module::VaeDecoder: return vae_dec_ ? bound_bytes(vae_dec_->module()) : placed_vae_ ? placed_vae_->param_bytes() : 0;
    case Module::VaeEncoder: return vae_enc_ ? bound_bytes(vae_enc_->module()) : placed_vae_enc_ ? placed_vae_enc_->param_bytes() : 0;
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
    const int64_t vocab = placed_te_ ? placed_te_->model->cfg.vocab : te_->config().vocab;
    for (int32_t id : ids)
        if (id < 0 || id >= vocab)
            fail(ErrorKind::ModelMismatch, "{}: token id {} is outside the text encoder's vocabulary of {}; Z-Image expects {} with Qwen's vocabulary",
                 te_flag_, id, vocab, expected_te(dcfg_.cap_feat_dim));
    const int64_t L = (int64_t)ids.size();
    std::vector<runtime::HostTensor> hs;
    if (placed_te_) {
        const std::vector<int32_t> pos = qwen3::positions(L);
        hs = placed_te_->placed->run(
            {L},
            [&](runtime::GraphBuilder& g) {
                qwen3::Qwen3Inputs in;
                in.ids = g.input_i32("ids", {L, 1}, ids);
                in.pos = g.input_i32("pos", {L}, pos);
                return in;
            },
            one_output, fmt::format("Qwen3 {} of {} layers (hidden_states[-2]), {} tokens", placed_te_->model->cfg.layers,
                                    placed_te_->model->cfg.layers + 1, L));
    } else {
        const int index = -2;
        hs = te_->run(ids, {}, 1, L, std::span<const int>(&index, 1));
        te_compute_ = std::max(te_compute_, te_->runner().last_compute_bytes());
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
    if (placed_dit_) {
        const ZImageRope rope = make_rope(dcfg_, h, w, cond.tokens);  // validates h, w, L
        auto res = placed_dit_->placed->run({h, w, cond.tokens},
                                            dit_inputs(placed_dit_->cfg, h, w, cond.tokens, x, std::span<const float>(&t_model, 1),
                                                       cond.context, rope),
                                            one_output, dit_label(dcfg_, h, w, cond.tokens));
        if (res.at(0).data.size() != out.size())
            fail(ErrorKind::Internal, "Z-Image transformer: output has {} values, expected {}", res[0].data.size(), out.size());
        std::copy(res[0].data.begin(), res[0].data.end(), out.begin());
    } else {
        dit_->forward(x.data(), h, w, t_model, cond.context.data(), cond.tokens, out.data());
        dit_compute_ = std::max(dit_compute_, dit_->compute_bytes());
    }
    for (float& v : out) v = -v;  // velocity noise - x0 = -(model output)
}

vae::HostTensor ZImage::decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) {
    if (latent.c != dcfg_.in_channels)
        fail(ErrorKind::InvalidInput, "latent has {} channels; Z-Image latents have {}", latent.c, dcfg_.in_channels);
    load(Module::VaeDecoder);
    vae::ExecOptions ex;
    ex.n_threads = opt_.threads;
    ex.compute_bytes = &vae_dec_compute_;  // the stage line's compute figure
    vae::HostTensor z = latent;
    for (auto& v : z.data) v = v / scaling_factor_ + shift_factor_;
    if (placed_vae_) return placed_vae_->decode(z, tiling);
    return vae_dec_->decode(z, tiling, ex);
}

vae::LatentDist ZImage::encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) {
    load(Module::VaeEncoder);
    vae::ExecOptions ex;
    ex.n_threads = opt_.threads;
    ex.compute_bytes = &vae_enc_compute_;  // the stage line's compute figure
    if (placed_vae_enc_) return placed_vae_enc_->encode(image, tiling);
    return vae_enc_->encode(image, tiling, ex);
}

std::vector<placement::ModuleCosts> ZImage::placement_costs(int64_t h, int64_t w) {
    std::vector<placement::ModuleCosts> out;
    const int64_t L = kMaxPromptTokens;
    if (!te_path_.empty() && !costs_skip_te()) {  // te: Qwen3 without its last layer, 512 tokens (none when no --llm / folder te)
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
        out.push_back(placement::self_contained_costs<qwen3::Qwen3Inputs, qwen3::Qwen3State, ggml_tensor*>(
            placement::PModule::Te, k, *tm.net, *tm.seq, *tm.src, tm.lo, opt_.threads, opt_.flash_attn_te,
            [kp, L](runtime::GraphBuilder& g) {
                qwen3::Qwen3Inputs in;
                in.ids = g.input_i32("ids", {L, 1}, kp->ids);
                in.pos = g.input_i32("pos", {L}, kp->pos);
                return in;
            },
            one_output, fmt::format("Qwen3 {} of {} layers (hidden_states[-2]), {} tokens", tm.cfg.layers, qc.layers, L),
            qwen3::qwen3_row_split_rules(*tm.net, opt_.flash_attn_te)));
    }
    {  // diffusion: the transformer at h x w with a 512-token caption
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
        out.push_back(placement::self_contained_costs<ZImageInputs, ZImageState, ggml_tensor*>(
            placement::PModule::Diffusion, k, *k->net, *k->net, *k->src, lo, opt_.threads, opt_.flash_attn_diffusion,
            dit_inputs(k->cfg, h, w, L, k->x, k->t, k->cap, k->rope), one_output, dit_label(dcfg_, h, w, L),
            placement::zimage_row_split_rules(*k->net)));
    }
    if (kl_ && kl_->has_decoder)  // vae: the AutoencoderKL decoder
        out.push_back(placement::vae_decoder_costs(vae_source(), opt_.threads, false, h, w, planned_tiling()));
    return out;
}

placement::VaeDecoderSource ZImage::vae_source() const {
    placement::VaeDecoderSource s;
    s.index = vae_idx_ ? vae_idx_.get() : dit_idx_.get();
    s.src = *kl_;
    if (const nlohmann::json* vc = s.index->config()) s.overrides = vae::kl_overrides_from_diffusers_config(*vc);
    return s;
}

vae::TilingOptions ZImage::planned_tiling() const { return placement::planned_tiling(opt_.vae_tile, spatial_factor_); }

std::optional<placement::ModuleCosts> ZImage::encode_costs(int tile) {
    if (!(kl_ && kl_->has_encoder && !opt_.vae_encode_sizes.empty())) return std::nullopt;
    const auto sizes = placement::encode_sizes_at(opt_.vae_encode_sizes, size_multiple());
    return placement::encode_stage_costs(vae_source(), opt_.threads, false, sizes, placement::planned_tiling(tile, spatial_factor_));
}

std::vector<placement::ModulePlan> ZImage::plan_placement(int64_t h, int64_t w) {
    if (!opt_.placement) return {};
    const auto budgets = placement::resolve_budgets(*opt_.placement, placement::list_devices());
    auto plans = placement::plan_modules(*opt_.placement, placement_costs(h, w), budgets);
    // the encode stage (img2img): the VAE encoder under the vae entry
    if (auto ec = encode_costs(opt_.vae_tile)) plans.push_back(placement::plan_encode_stage(*ec, *opt_.placement, budgets));
    return plans;
}

std::vector<placement::ModulePlan> ZImage::placement_plans() const {
    std::vector<placement::ModulePlan> r;
    if (placed_te_ && !placed_te_->placed->current_plan().segments.empty()) r.push_back(placed_te_->placed->current_plan());
    else r.insert(r.end(), te_plans_done_.begin(), te_plans_done_.end());
    if (placed_dit_ && !placed_dit_->placed->current_plan().segments.empty()) r.push_back(placed_dit_->placed->current_plan());
    else r.insert(r.end(), dit_plans_done_.begin(), dit_plans_done_.end());
    if (placed_vae_ && !placed_vae_->current_plan().segments.empty()) r.push_back(placed_vae_->current_plan());
    else r.insert(r.end(), vae_plans_done_.begin(), vae_plans_done_.end());
    if (placed_vae_enc_ && !placed_vae_enc_->current_plan().segments.empty()) r.push_back(placed_vae_enc_->current_plan());
    else r.insert(r.end(), vae_enc_plans_done_.begin(), vae_enc_plans_done_.end());
    return r;
}

std::map<std::string, uint64_t> ZImage::placement_peaks() const {
    std::map<std::string, uint64_t> p = te_peaks_done_;
    auto merge = [&](const std::map<std::string, uint64_t>& m) {
        for (auto& [d, b] : m) p[d] = std::max(p[d], b);
    };
    if (placed_te_) merge(placed_te_->placed->peaks());
    merge(dit_peaks_done_);
    if (placed_dit_) merge(placed_dit_->placed->peaks());
    merge(vae_peaks_done_);
    if (placed_vae_) merge(placed_vae_->peaks());
    merge(vae_enc_peaks_done_);
    if (placed_vae_enc_) merge(placed_vae_enc_->peaks());
    return p;
}

}  // namespace easel::models::zimage
