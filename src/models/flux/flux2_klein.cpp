// The FLUX.2 [klein] family (see flux2_klein.h).
#include "models/flux/flux2_klein.h"

#include "core/error.h"
#include "core/log.h"
#include "io/diffusers.h"
#include "models/lora_targets.h"
#include "models/flux/flux_common.h"
#include "models/flux/flux_row_split.h"
#include "models/model_files.h"
#include "models/qwen3/qwen3_row_split.h"
#include "runtime/placed_sequence.h"
#include "text/qwen_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>

namespace easel::models::flux {

namespace fs = std::filesystem;

namespace {

// ---- Pillow's Lanczos resampling (libImaging/Resample.c), 8 bits per channel ----------------

constexpr int kPrecisionBits = 32 - 8 - 2;

double sinc(double x) {
    if (x == 0.0) return 1.0;
    x *= std::numbers::pi;  // M_PI is not standard C++ (MinGW and MSVC leave it out)
    return std::sin(x) / x;
}

double lanczos3(double x) { return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0; }

struct Coeffs {
    int ksize = 0;
    std::vector<int> bounds;  // per output: xmin, count
    std::vector<int32_t> k;   // per output: ksize fixed-point weights
};

// precompute_coeffs + normalize_coeffs_8bpc for a box [0, in_size).
Coeffs precompute(int in_size, int out_size) {
    Coeffs c;
    const double scale = (double)in_size / out_size;
    const double filterscale = std::max(1.0, scale);
    const double support = 3.0 * filterscale;
    c.ksize = (int)std::ceil(support) * 2 + 1;
    c.bounds.resize((size_t)out_size * 2);
    c.k.assign((size_t)out_size * c.ksize, 0);
    std::vector<double> kk((size_t)c.ksize);
    for (int xx = 0; xx < out_size; ++xx) {
        const double center = (xx + 0.5) * scale;
        const double ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double ww = 0.0;
        std::fill(kk.begin(), kk.end(), 0.0);
        for (int x = 0; x < xmax; ++x) {
            const double w = lanczos3((x + xmin - center + 0.5) * ss);
            kk[(size_t)x] = w;
            ww += w;
        }
        for (int x = 0; x < xmax; ++x)
            if (ww != 0.0) kk[(size_t)x] /= ww;
        for (int x = 0; x < c.ksize; ++x) {
            const double v = kk[(size_t)x] * (double)(1 << kPrecisionBits);
            c.k[(size_t)xx * c.ksize + x] = (int32_t)(v < 0 ? -0.5 + v : 0.5 + v);
        }
        c.bounds[(size_t)xx * 2] = xmin;
        c.bounds[(size_t)xx * 2 + 1] = xmax;
    }
    return c;
}

uint8_t clip8(int64_t v) {
    v >>= kPrecisionBits;
    return (uint8_t)std::clamp<int64_t>(v, 0, 255);
}

}  // namespace

std::vector<uint8_t> pil_lanczos_resize(std::span<const uint8_t> pixels, int W, int H, int C, int w, int h) {
    if (W <= 0 || H <= 0 || C <= 0 || w <= 0 || h <= 0)
        fail(ErrorKind::InvalidInput, "Lanczos resize from {}x{} to {}x{}: sizes must be positive", W, H, w, h);
    if (pixels.size() != (size_t)W * H * C)
        fail(ErrorKind::InvalidInput, "Lanczos resize: {} bytes for a {}x{}x{} image", pixels.size(), W, H, C);
    std::vector<uint8_t> cur(pixels.begin(), pixels.end());
    int cw = W, ch = H;
    if (w != W) {  // horizontal pass
        Coeffs k = precompute(W, w);
        std::vector<uint8_t> out((size_t)w * ch * C);
        for (int y = 0; y < ch; ++y)
            for (int xx = 0; xx < w; ++xx) {
                const int xmin = k.bounds[(size_t)xx * 2], xmax = k.bounds[(size_t)xx * 2 + 1];
                const int32_t* kw = &k.k[(size_t)xx * k.ksize];
                for (int c = 0; c < C; ++c) {
                    int64_t ss = (int64_t)1 << (kPrecisionBits - 1);
                    for (int x = 0; x < xmax; ++x) ss += (int64_t)cur[((size_t)y * cw + x + xmin) * C + c] * kw[x];
                    out[((size_t)y * w + xx) * C + c] = clip8(ss);
                }
            }
        cur = std::move(out);
        cw = w;
    }
    if (h != H) {  // vertical pass
        Coeffs k = precompute(H, h);
        std::vector<uint8_t> out((size_t)cw * h * C);
        for (int yy = 0; yy < h; ++yy) {
            const int ymin = k.bounds[(size_t)yy * 2], ymax = k.bounds[(size_t)yy * 2 + 1];
            const int32_t* kw = &k.k[(size_t)yy * k.ksize];
            for (int x = 0; x < cw; ++x)
                for (int c = 0; c < C; ++c) {
                    int64_t ss = (int64_t)1 << (kPrecisionBits - 1);
                    for (int y = 0; y < ymax; ++y) ss += (int64_t)cur[((size_t)(y + ymin) * cw + x) * C + c] * kw[y];
                    out[((size_t)yy * cw + x) * C + c] = clip8(ss);
                }
        }
        cur = std::move(out);
        ch = h;
    }
    return cur;
}

std::string klein_expected_text_encoder(int64_t joint_dim) {
    if (joint_dim == 7680) return "Qwen3-4B (hidden size 2560)";
    if (joint_dim == 12288) return "Qwen3-8B (hidden size 4096)";
    if (joint_dim % 3 == 0) return fmt::format("a Qwen3 text encoder with hidden size {}", joint_dim / 3);
    return fmt::format("a text encoder whose three stacked hidden states make {} features", joint_dim);
}

int64_t klein_prompt_tokens(const text::QwenTokenizer& tok, const std::string& prompt, std::vector<int32_t>& ids,
                            std::vector<int32_t>& mask01) {
    ids = tok.encode(text::QwenTokenizer::chat_prompt(prompt, /*empty_think=*/true));
    if ((int64_t)ids.size() > kKleinPromptTokens) {
        log::warn("the prompt has {} tokens with the chat template; FLUX.2 Klein reads the first {} (diffusers' max_sequence_length)",
                  ids.size(), kKleinPromptTokens);
        ids.resize((size_t)kKleinPromptTokens);
    }
    const int64_t n = (int64_t)ids.size();
    mask01.assign((size_t)kKleinPromptTokens, 0);
    std::fill(mask01.begin(), mask01.begin() + n, 1);
    ids.resize((size_t)kKleinPromptTokens, text::QwenTokenizer::kEndOfText);
    return n;
}

void klein_check_reference_size(int64_t W, int64_t H) {
    // Flux2ImageProcessor.check_image_input
    if (W < 64 || H < 64)
        fail(ErrorKind::InvalidInput, "reference image {}x{} is too small: both sides must be at least 64 pixels (as diffusers' Flux2 pipelines require)",
             W, H);
    if (std::max((double)W / H, (double)H / W) > 8.0)
        fail(ErrorKind::InvalidInput, "reference image {}x{}: the aspect ratio exceeds 8:1 (diffusers' limit)", W, H);
}

vae::HostTensor klein_prepare_reference(const vae::HostTensor& image, int multiple) {
    if (image.n != 1 || image.c != 3)
        fail(ErrorKind::InvalidInput, "reference image: expected one RGB image, got [{}, {}, {}, {}]", image.n, image.c, image.h, image.w);
    if (multiple <= 0) fail(ErrorKind::InvalidInput, "reference image: size multiple {} must be positive", multiple);
    int64_t W = image.w, H = image.h;
    klein_check_reference_size(W, H);
    vae::HostTensor img = image;
    if (W * H > kKleinMaxRefPixels) {
        // _resize_to_target_area: PIL Lanczos on the 8-bit image
        const double s = std::sqrt((double)kKleinMaxRefPixels / (double)(W * H));
        const int w = (int)((double)W * s), h = (int)((double)H * s);
        std::vector<uint8_t> px((size_t)W * H * 3);
        for (int64_t y = 0; y < H; ++y)
            for (int64_t x = 0; x < W; ++x)
                for (int c = 0; c < 3; ++c) {
                    const float v = std::round((image.at(0, c, y, x) + 1.0f) * 0.5f * 255.0f);
                    px[((size_t)y * W + x) * 3 + c] = (uint8_t)std::clamp(v, 0.0f, 255.0f);
                }
        auto r = pil_lanczos_resize(px, (int)W, (int)H, 3, w, h);
        img = vae::HostTensor(1, 3, h, w);
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x)
                for (int c = 0; c < 3; ++c) img.at(0, c, y, x) = (float)r[((size_t)y * w + x) * 3 + c] / 255.0f * 2.0f - 1.0f;
        log::info("reference image {}x{} resized to {}x{} (about 1024x1024 pixels, as diffusers does)", W, H, w, h);
        W = w;
        H = h;
    }
    const int64_t w = W / multiple * multiple, h = H / multiple * multiple;
    if (w == W && h == H) return img;
    log::info("reference image {}x{} centre-cropped to {}x{} (a multiple of {})", W, H, w, h, multiple);
    return img.crop((H - h) / 2, (W - w) / 2, h, w);
}

KleinReferences klein_pack_references(std::span<const vae::HostTensor> latents) {
    KleinReferences r;
    for (size_t i = 0; i < latents.size(); ++i) {
        const vae::HostTensor& z = latents[i];
        if (z.n != 1) fail(ErrorKind::InvalidInput, "reference latent {}: expected one image, got {}", i, z.n);
        if (i == 0) r.channels = z.c;
        else if (z.c != r.channels)
            fail(ErrorKind::InvalidInput, "reference latent {} has {} channels, the first has {}", i, z.c, r.channels);
        auto tok = flux2_pack_tokens(z);
        r.tokens.insert(r.tokens.end(), tok.begin(), tok.end());
        auto ids = flux2_image_ids(z.h, z.w, kKleinRefTimeScale * (float)(i + 1));
        r.ids.insert(r.ids.end(), ids.begin(), ids.end());
        r.count += z.h * z.w;
    }
    return r;
}

// ---------------------------------------------------------------------------------------------


std::unique_ptr<Flux2Klein> Flux2Klein::open(const ModelFiles& files, const FamilyOptions& opt) {
    std::unique_ptr<Flux2Klein> m(new Flux2Klein(files, opt));
    if (files.model.empty() && files.diffusion_model.empty())
        fail(ErrorKind::InvalidInput, "no model given: pass -m MODEL (a diffusers folder or a FLUX.2 Klein file) or --diffusion-model");
    for (auto [flag, path] : {std::pair<const char*, const std::string*>{"--clip_l", &files.clip_l}, {"--clip_g", &files.clip_g}, {"--t5xxl", &files.t5xxl}})
        note_unused_model_file(flag, *path, "FLUX.2 Klein", "has no such text encoder (its text encoder is the Qwen3 LLM, --llm)");

    static const SourceRule rules[] = {{"transformer", &ModelFiles::diffusion_model, "--diffusion-model"},
                                       {"vae", &ModelFiles::vae, "--vae"},
                                       {"text_encoder", &ModelFiles::llm, "--llm"}};
    ResolvedSources rs = resolve_sources(files, rules);
    const std::optional<nlohmann::json>& sched_cfg = rs.scheduler_config;
    m->tokenizer_json_ = rs.tokenizer_json;
    rs.require(0, "FLUX.2 Klein pipelines");
    if (rs.folder) {
        if (auto mi = read_json(fs::path(files.model) / "model_index.json"); mi && mi->is_object()) {
            if (auto it = mi->find("is_distilled"); it != mi->end() && it->is_boolean()) {
                m->distilled_ = it->get<bool>();
                m->distilled_src_ = "model_index.json";
            }
        }
    }
    m->dit_src_ = rs.sources[0];
    m->vae_src_ = rs.sources[1];
    m->te_src_ = rs.sources[2];
    m->model_desc_ = rs.model_desc;
    m->take_taesd();
    if (m->distilled_src_.empty()) m->distilled_src_ = "assumed for single files";

    // Transformer configuration from its headers.
    m->dit_idx_ = open_index(m->dit_src_.path, m->dit_src_.flag);
    auto src = find_flux2_dit(*m->dit_idx_);
    if (!src)
        fail(ErrorKind::ModelMismatch, "{}: no FLUX.2 transformer in it (no double_stream_modulation_img); pass the FLUX.2 Klein model as -m or "
             "--diffusion-model", m->dit_src_.named());
    m->dcfg_ = infer_flux2_dit_config(*m->dit_idx_, *src);
    if (m->dcfg_.guidance_embeds || m->dcfg_.joint_dim == 15360)
        fail(ErrorKind::ModelMismatch,
             "{}: this is FLUX.2 [dev] (guidance embedder, context width {} from the Mistral-3 text encoder); easel runs FLUX.2 [klein] "
             "(Qwen3 text encoder, no guidance embedder)", m->dit_src_.named(), m->dcfg_.joint_dim);
    if (m->dcfg_.in_channels % 4 != 0 || m->dcfg_.out_channels != m->dcfg_.in_channels)
        fail(ErrorKind::ModelMismatch, "{}: the transformer takes {} and returns {} channels; FLUX.2 takes 4 x the VAE's latent channels "
             "and returns as many", m->dit_src_.named(), m->dcfg_.in_channels, m->dcfg_.out_channels);
    if (m->dcfg_.joint_dim % 3 != 0)
        fail(ErrorKind::ModelMismatch, "{}: context width {} is not 3 x a Qwen3 hidden size (FLUX.2 Klein stacks 3 hidden states)",
             m->dit_src_.named(), m->dcfg_.joint_dim);

    // VAE: headers + BatchNorm statistics (also needed to decode with TAEF2).
    VaeExpect ve;
    ve.latent_channels = m->dcfg_.in_channels / 4;
    ve.family = "FLUX.2 Klein";
    ve.needed = fmt::format("the FLUX.2 VAE ({} latent channels, flux2-vae.safetensors)", ve.latent_channels);
    ve.no_vae = "pass the FLUX.2 VAE (flux2-vae.safetensors / ae.safetensors) with --vae FILE (also with --taesd: its latent statistics are needed)";
    ve.no_kl = "pass the FLUX.2 VAE with --vae FILE";
    ve.wrong_channels = fmt::format("this transformer needs the {}-channel FLUX.2 VAE", ve.latent_channels);
    const VaeHeaders vh = m->read_vae_headers(ve);
    m->kl_ = vh.kl;
    m->vae_factor_ = vh.cfg.spatial_factor();
    const io::WeightIndex& vi = m->vae_index();
    try {
        m->stats_ = Flux2LatentStats::load(vi);
    } catch (const Error& e) {
        fail(ErrorKind::ModelMismatch, "{}: {}; FLUX.2 needs the FLUX.2 VAE (with bn.running_mean / bn.running_var)", m->vae_src_.named(), e.what());
    }
    if ((int64_t)m->stats_.mean.size() != m->dcfg_.in_channels)
        fail(ErrorKind::ModelMismatch, "{}: the VAE's latent statistics have {} channels, the transformer takes {}", m->vae_src_.named(),
             m->stats_.mean.size(), m->dcfg_.in_channels);

    double shift = 3.0;
    if (sched_cfg && sched_cfg->contains("shift") && (*sched_cfg)["shift"].is_number()) shift = (*sched_cfg)["shift"].get<double>();
    if (opt.flow_shift > 0.0f) shift = opt.flow_shift;
    m->ms_ = std::make_unique<sampling::ModelSampling>(sampling::ModelSampling::flow(shift));
    m->add_modules();
    return m;
}

std::string Flux2Klein::name() const { return "FLUX.2 Klein"; }

std::string Flux2Klein::describe() const {
    return fmt::format("FLUX.2 Klein ({}), transformer D={} heads={} double={} single={} context {}, {} ({}){}{}", model_desc_,
                       dcfg_.hidden, dcfg_.heads, dcfg_.n_double, dcfg_.n_single, dcfg_.joint_dim, distilled_ ? "distilled" : "base",
                       distilled_src_, te_desc_.empty() ? "" : ", text encoder " + te_desc_,
                       taesd_path_.empty() ? "" : ", TAEF2 decoder " + taesd_path_);
}

LatentFormat Flux2Klein::latent_format() const {
    return {.channels = dcfg_.in_channels, .spatial_factor = vae_factor_ * 2, .scaling_factor = 1.0f, .shift_factor = 0.0f};
}

const sampling::ModelSampling& Flux2Klein::model_sampling() const { return *ms_; }

SamplingDefaults Flux2Klein::defaults() const {
    SamplingDefaults d;
    d.sampler = "euler";
    d.scheduler = "flux2";
    d.steps = distilled_ ? 4 : 50;
    d.cfg_scale = distilled_ ? 1.0f : 4.0f;
    d.clip_skip = 0;
    d.width = d.height = 1024;
    return d;
}

sampling::ScheduleOptions Flux2Klein::schedule_options() const {
    sampling::ScheduleOptions o;
    o.flow_pipeline_sigmas = true;
    return o;
}

namespace {

/// State of the Klein text encoder: Qwen3's, plus hidden_states 9 and 18 once their layers ran.
struct KleinTeState {
    qwen3::Qwen3State q;
    ggml_tensor* h9 = nullptr;
    ggml_tensor* h18 = nullptr;
    /// "h", "mask", "pos", then "h9" and "h18" when set.
    void visit_tensors(const nn::StateTensorFn& f) {
        q.visit_tensors(f);
        if (h9) f("h9", h9);
        if (h18) f("h18", h18);
    }
};

/// The three hidden states the context stacks, each {hidden, L, N}.
struct KleinTeOutputs {
    ggml_tensor* h[3] = {nullptr, nullptr, nullptr};
};

/// Qwen3 (built with kKleinTextLayers[2] layers) as a Sequence whose output is hidden_states 9,
/// 18 and 27 (transformers' output_hidden_states: index i = raw output of layer i - 1): the
/// state keeps h9 / h18 from the block that makes them; the epilogue is the raw state.
class KleinTeSeq : public nn::Sequence<qwen3::Qwen3Inputs, KleinTeState, KleinTeOutputs> {
public:
    explicit KleinTeSeq(const qwen3::Qwen3Model& m) : m_(m) {}
    int n_blocks() const override { return m_.n_blocks(); }
    KleinTeState prologue(nn::Ctx& c, const qwen3::Qwen3Inputs& in) const override { return {m_.prologue(c, in)}; }
    KleinTeState block(nn::Ctx& c, int i, KleinTeState s) const override {
        s.q = m_.block(c, i, s.q);
        if (i + 1 == kKleinTextLayers[0]) s.h9 = s.q.h;
        if (i + 1 == kKleinTextLayers[1]) s.h18 = s.q.h;
        return s;
    }
    KleinTeOutputs epilogue(nn::Ctx&, KleinTeState s) const override {
        if (!s.h9 || !s.h18) fail(ErrorKind::Internal, "FLUX.2 Klein text encoder: hidden states 9 / 18 were not made");
        KleinTeOutputs o;
        o.h[0] = s.h9;
        o.h[1] = s.h18;
        o.h[2] = s.q.h;
        return o;
    }
    const nn::Block& block_params(int i) const override { return m_.block_params(i); }

private:
    const qwen3::Qwen3Model& m_;
};

using TePlaced = runtime::PlacedSequence<qwen3::Qwen3Inputs, KleinTeState, KleinTeOutputs>;
using DiTPlaced = runtime::PlacedSequence<Flux2Inputs, Flux2State, FluxOutputs>;

/// Qwen3 with kKleinTextLayers[2] layers: tree, source, load options (no weights).
struct TeModel {
    qwen3::Qwen3Config cfg;
    std::unique_ptr<qwen3::Qwen3Model> net;
    std::unique_ptr<nn::TensorSource> src;
    std::unique_ptr<KleinTeSeq> seq;
    nn::LoadOptions lo;
    TeModel(const io::WeightIndex& ti, const qwen3::Qwen3Keys& keys, ggml_type weight_type) {
        qwen3::Qwen3Overrides ov;
        ov.layers = kKleinTextLayers[2];
        cfg = qwen3::infer_config(ti, keys, ov);
        net = std::make_unique<qwen3::Qwen3Model>(cfg);
        src = std::make_unique<nn::TensorSource>(qwen3::make_tensor_source(ti, keys, cfg));
        seq = std::make_unique<KleinTeSeq>(*net);
        lo = qwen3::default_load_options(keys, cfg, ti);
        lo.weight_type = weight_type;
    }
};

/// The transformer's tree and source (BFL renames / slices applied), no weights.
struct DiTModel {
    Flux2DiTConfig cfg;
    std::unique_ptr<Flux2DiT> net;
    std::unique_ptr<nn::TensorSource> src;
    nn::LoadOptions lo;
    DiTModel(const io::WeightIndex& idx, const FluxSource& s, const Flux2DiTConfig& c, ggml_type weight_type) : cfg(c) {
        net = std::make_unique<Flux2DiT>(cfg, s.layout == FluxLayout::Bfl);
        src = std::make_unique<nn::TensorSource>(idx, s.prefix);
        configure_flux2_source(*src, cfg, s);
        lo.weight_type = weight_type;
    }
};

/// Host data of the text encoder: ids [L], additive mask [L, L], positions [L].
struct TeHost {
    std::vector<int32_t> ids, pos;
    std::vector<float> mask;
    int64_t L = 0;
};

std::function<qwen3::Qwen3Inputs(runtime::GraphBuilder&)> te_inputs(const TeHost& d) {
    return [&d](runtime::GraphBuilder& g) {
        qwen3::Qwen3Inputs in;
        in.ids = g.input_i32("ids", {d.L, 1}, d.ids);
        in.mask = g.input_f32("mask", {d.L, d.L, 1, 1}, d.mask);
        in.pos = g.input_i32("pos", {d.L}, d.pos);
        return in;
    };
}

std::vector<ggml_tensor*> te_outputs(KleinTeOutputs& o) { return {o.h[0], o.h[1], o.h[2]}; }
std::vector<ggml_tensor*> dit_output(FluxOutputs& o) { return {o.sample}; }

/// Host data of one transformer evaluation: tokens [L, C] (image then reference tokens),
/// context [Lt, J], timestep, rotary tables of [txt; img; refs].
struct DiTHost {
    std::vector<float> img, txt, t{0.0f};
    RopeTables rope;
    int64_t L = 0, Lt = 0;
};

std::function<Flux2Inputs(runtime::GraphBuilder&)> dit_inputs(const Flux2DiTConfig& cfg, const DiTHost& d) {
    return [&cfg, &d](runtime::GraphBuilder& g) {
        Flux2Inputs in;
        in.img = g.input_f32("img", {cfg.in_channels, d.L, 1}, d.img);
        in.txt = g.input_f32("txt", {cfg.joint_dim, d.Lt, 1}, d.txt);
        in.timestep = g.input_f32("t", {1}, d.t);
        in.rope_cos = g.input_f32("rope_cos", {d.rope.half_dim, d.rope.tokens}, d.rope.cos);
        in.rope_sin = g.input_f32("rope_sin", {d.rope.half_dim, d.rope.tokens}, d.rope.sin);
        return in;
    };
}

/// Rotary tables of the sequence [Lt text tokens; h x w image tokens; reference tokens].
RopeTables klein_rope(const Flux2DiTConfig& cfg, int64_t Lt, int64_t h, int64_t w, const std::vector<float>& ref_ids) {
    std::vector<float> ids = flux2_text_ids(Lt);
    auto iids = flux2_image_ids(h, w, 0.0f);
    ids.insert(ids.end(), iids.begin(), iids.end());
    ids.insert(ids.end(), ref_ids.begin(), ref_ids.end());
    return rope_tables(ids, Lt + h * w + (int64_t)ref_ids.size() / 4, cfg.axes_dims, cfg.theta);
}

std::string te_label(const qwen3::Qwen3Config& cfg, int64_t L) {
    return fmt::format("Qwen3 {} layers (hidden_states 9, 18, 27), {} tokens", cfg.layers, L);
}
std::string dit_label(const Flux2DiTConfig& cfg, int64_t h, int64_t w, int64_t Lr, int64_t Lt) {
    return fmt::format("FLUX.2 DiT {} double + {} single blocks, latent {}x{}x{}{}, context {} tokens", cfg.n_double, cfg.n_single,
                       cfg.in_channels, h, w, Lr ? fmt::format(" + {} reference tokens", Lr) : std::string(), Lt);
}

}  // namespace

struct Flux2Klein::PlacedTe {
    std::unique_ptr<io::WeightIndex> own;
    std::unique_ptr<TeModel> model;
    std::unique_ptr<TePlaced> placed;
    const placement::ModulePlan& current_plan() const { return placed->current_plan(); }
    std::map<std::string, uint64_t> peaks() const { return placed->peaks(); }
};

/// The transformer on FamilyOptions::diffusion_device.
struct Flux2Klein::DiTWhole {
    std::unique_ptr<runtime::GraphRunner> runner;
    std::unique_ptr<Flux2DiTModel> dit;
    size_t param_bytes() const { return dit->params.size(); }
};

struct Flux2Klein::PlacedDiT {
    std::unique_ptr<DiTModel> model;
    std::unique_ptr<DiTPlaced> placed;
    const placement::ModulePlan& current_plan() const { return placed->current_plan(); }
    std::map<std::string, uint64_t> peaks() const { return placed->peaks(); }
};

Flux2Klein::Flux2Klein(const ModelFiles& files, const FamilyOptions& opt) : FamilyBase(files, opt) {}

Flux2Klein::~Flux2Klein() = default;

const text::QwenTokenizer& Flux2Klein::tokenizer() const {
    if (tokenizer_json_.empty()) return text::QwenTokenizer::builtin();
    if (!own_tokenizer_) own_tokenizer_ = std::make_unique<text::QwenTokenizer>(text::QwenTokenizer::from_file(tokenizer_json_));
    return *own_tokenizer_;
}

const io::WeightIndex& Flux2Klein::te_headers(std::unique_ptr<io::WeightIndex>& own, qwen3::Qwen3Keys& keys, qwen3::Qwen3Config& cfg) const {
    const std::string expected = klein_expected_text_encoder(dcfg_.joint_dim);
    if (te_src_.empty()) fail(ErrorKind::ModelMismatch, "no text encoder: pass {} with --llm FILE", expected);
    const io::WeightIndex* ti = &index_for(te_src_, own);
    auto k = qwen3::find_qwen3(*ti);
    if (!k)
        fail(ErrorKind::ModelMismatch, "{}: no Qwen3 text encoder found in it; this FLUX.2 Klein transformer expects {}; pass it with --llm FILE",
             te_src_.named(), expected);
    keys = *k;
    cfg = qwen3::infer_config(*ti, keys);
    if (cfg.hidden * 3 != dcfg_.joint_dim)
        fail(ErrorKind::ModelMismatch,
             "{}: a Qwen3 text encoder of hidden size {} gives {} context features, but the transformer's context_embedder takes {}: this "
             "FLUX.2 Klein model expects {}",
             te_src_.named(), cfg.hidden, cfg.hidden * 3, dcfg_.joint_dim, expected);
    const int need_layers = kKleinTextLayers[2];
    if (cfg.layers < need_layers)
        fail(ErrorKind::ModelMismatch, "{}: the text encoder has {} layers; FLUX.2 Klein reads hidden state {} and needs at least {} ({})",
             te_src_.named(), cfg.layers, need_layers, need_layers, expected);
    return *ti;
}

void Flux2Klein::lora_targets(LoraTargets& t) {
    const FluxSource src = *find_flux2_dit(*dit_idx_);
    const bool bfl = src.layout == FluxLayout::Bfl;
    Flux2DiT dit(dcfg_, bfl);
    lora::add_flux2_targets(t.km, dit, dcfg_, bfl);
    auto ds = std::make_unique<nn::TensorSource>(*dit_idx_, src.prefix);
    configure_flux2_source(*ds, dcfg_, src);
    t.sources["dit"] = std::move(ds);
    if (!te_src_.empty()) {
        std::unique_ptr<io::WeightIndex> own;
        qwen3::Qwen3Keys keys;
        qwen3::Qwen3Config qc;
        const io::WeightIndex& ti = te_headers(own, keys, qc);
        add_qwen3_lora_targets(t, ti, std::move(own), keys, qc);
    }
    t.info = {"FLUX.2 Klein", dcfg_.hidden, "hidden"};
}

void Flux2Klein::add_modules() {
    // te: Qwen3, its hidden states 9, 18 and 27
    ModuleSlot<qwen3::Qwen3TextEncoder, PlacedTe>::Hooks th;
    th.load_whole = [this] {
        std::unique_ptr<io::WeightIndex> own;
        qwen3::Qwen3Keys keys;
        qwen3::Qwen3Config qc;
        const io::WeightIndex& ti = te_headers(own, keys, qc);
        qwen3::Qwen3RunOptions ro = qwen3_run_options();
        // hidden_states[27] is the raw output of layer 26 when the model has more than 27 layers:
        // 28 layers give the same value and the deeper ones are never read.
        const int max_index = kKleinTextLayers[2];
        if (qc.layers > max_index + 1) ro.overrides.layers = max_index + 1;
        auto te = std::make_unique<qwen3::Qwen3TextEncoder>(ti, ro);
        te_desc_ = fmt::format("Qwen3 hidden {} x {} layers{}", qc.hidden, qc.layers,
                               ro.overrides.layers ? fmt::format(" (first {} loaded)", *ro.overrides.layers) : std::string());
        return te;
    };
    th.load_placed = [this] {  // planned and loaded on the first encoding
        auto p = std::make_unique<PlacedTe>();
        qwen3::Qwen3Keys keys;
        qwen3::Qwen3Config qc;
        const io::WeightIndex& ti = te_headers(p->own, keys, qc);
        p->model = std::make_unique<TeModel>(ti, keys, weight_type_);
        TeModel& tm = *p->model;
        p->placed = std::make_unique<TePlaced>(*tm.net, *tm.seq, *tm.src, tm.lo, placement::PModule::Te, *opt_.placement, opt_.threads,
                                               opt_.flash_attn_te);
        // --split-mode te=row: the Qwen3 layers on ggml's meta device (qwen3_row_split.h)
        p->placed->set_row_split(qwen3::qwen3_row_split_rules(*tm.net, opt_.flash_attn_te));
        te_desc_ = fmt::format("Qwen3 hidden {} x {} layers (first {} loaded)", qc.hidden, qc.layers, tm.cfg.layers);
        return p;
    };
    th.files = [this] {
        std::vector<std::string> r;
        if (!te_src_.empty()) r.push_back(te_src_.path);
        if (!tokenizer_json_.empty()) r.push_back(tokenizer_json_);
        return r;
    };
    th.costs = [this](int64_t, int64_t) {  // Qwen3 of 27 layers at 512 tokens with the padding mask
        std::vector<placement::ModuleCosts> out;
        if (te_src_.empty()) return out;
        const int64_t Lt = kKleinPromptTokens;
        struct Keep {
            std::unique_ptr<io::WeightIndex> own;
            std::unique_ptr<TeModel> model;
            TeHost d;
        };
        auto k = std::make_shared<Keep>();
        qwen3::Qwen3Keys keys;
        qwen3::Qwen3Config qc;
        const io::WeightIndex& ti = te_headers(k->own, keys, qc);
        k->model = std::make_unique<TeModel>(ti, keys, weight_type_);
        k->d.L = Lt;
        k->d.ids.assign((size_t)Lt, 0);
        k->d.mask = qwen3::attention_mask(std::vector<int32_t>((size_t)Lt, 1), Lt, 1);
        k->d.pos = qwen3::positions(Lt);
        TeModel& tm = *k->model;
        out.push_back(runtime::self_contained_costs<qwen3::Qwen3Inputs, KleinTeState, KleinTeOutputs>(
            placement::PModule::Te, k, *tm.net, *tm.seq, *tm.src, tm.lo, opt_.threads, opt_.flash_attn_te, te_inputs(k->d), te_outputs,
            te_label(tm.cfg, Lt), qwen3::qwen3_row_split_rules(*tm.net, opt_.flash_attn_te)));
        return out;
    };
    te_ = &modules_.add<qwen3::Qwen3TextEncoder, PlacedTe>(Module::Te, std::move(th));

    // diffusion: the FLUX.2 transformer
    ModuleSlot<DiTWhole, PlacedDiT>::Hooks dh;
    dh.load_whole = [this] {
        auto d = std::make_unique<DiTWhole>();
        d->runner = std::make_unique<runtime::GraphRunner>(opt_.diffusion_device, opt_.threads);
        nn::LoadOptions lo;
        lo.weight_type = weight_type_;
        d->dit = std::make_unique<Flux2DiTModel>(Flux2DiTModel::load(*dit_idx_, d->runner->buffer_type(), lo, dcfg_.axes_dims));
        return d;
    };
    dh.load_placed = [this] {  // planned and loaded on the first evaluation (the plan needs the shapes)
        auto p = std::make_unique<PlacedDiT>();
        p->model = std::make_unique<DiTModel>(*dit_idx_, *find_flux2_dit(*dit_idx_), dcfg_, weight_type_);
        DiTModel& dm = *p->model;
        p->placed = std::make_unique<DiTPlaced>(*dm.net, *dm.net, *dm.src, dm.lo, placement::PModule::Diffusion, *opt_.placement, opt_.threads,
                                                opt_.flash_attn_diffusion);
        p->placed->set_row_split(flux2_row_split_rules(*dm.net));
        return p;
    };
    dh.files = [this]() -> std::vector<std::string> { return {dit_src_.path}; };
    dh.costs = [this](int64_t h, int64_t w) {  // h x w image tokens (+ the reference tokens set so far) and a 512-token context
        const int64_t Lt = kKleinPromptTokens;
        struct Keep {
            std::unique_ptr<DiTModel> model;
            DiTHost d;
        };
        auto k = std::make_shared<Keep>();
        k->model = std::make_unique<DiTModel>(*dit_idx_, *find_flux2_dit(*dit_idx_), dcfg_, weight_type_);
        DiTHost& d = k->d;
        d.L = h * w + refs_.count;
        d.Lt = Lt;
        d.img.assign((size_t)(d.L * dcfg_.in_channels), 0.0f);
        d.txt.assign((size_t)(Lt * dcfg_.joint_dim), 0.0f);
        d.rope = klein_rope(dcfg_, Lt, h, w, refs_.ids);
        DiTModel& m = *k->model;
        return std::vector<placement::ModuleCosts>{runtime::self_contained_costs<Flux2Inputs, Flux2State, FluxOutputs>(
            placement::PModule::Diffusion, k, *m.net, *m.net, *m.src, m.lo, opt_.threads, opt_.flash_attn_diffusion, dit_inputs(m.cfg, d),
            dit_output, dit_label(dcfg_, h, w, refs_.count, Lt), flux2_row_split_rules(*m.net))};
    };
    dit_ = &modules_.add<DiTWhole, PlacedDiT>(Module::Diffusion, std::move(dh));

    // vae: AutoencoderKLFlux2 on the VAE latent of the job (the sampler's latent is 2x2-patchified,
    // so the VAE's is 2h x 2w), or TAEF2 for decoding (the VAE file still gives the statistics)
    VaeSetup v;
    v.kl = kl_;
    v.tile_factor = latent_format().spatial_factor;
    v.latent_scale = 2;
    v.taesd_reads_vae_file = true;
    v.taesd_channels = dcfg_.in_channels / 4;  // the VAE latent before the 2x2 patchify
    v.taesd_latents = "FLUX.2 VAE latents";
    v.taesd_kind = "TAEF2 (taef2_decoder)";
    add_vae(std::move(v));
}

Conditioning Flux2Klein::encode_prompt(const std::string& prompt, int /*clip_skip*/) {
    std::vector<int32_t> ids, mask01;
    klein_prompt_tokens(tokenizer(), prompt, ids, mask01);
    load(Module::Te);
    PlacedTe* placed = te_->placed();
    const int64_t vocab = placed ? placed->model->cfg.vocab : te_->whole()->config().vocab;
    for (int32_t id : ids)
        if (id < 0 || id >= vocab)
            fail(ErrorKind::ModelMismatch, "{}: token id {} is outside the text encoder's vocabulary of {}; FLUX.2 Klein expects {} with Qwen's vocabulary",
                 te_src_.named(), id, vocab, klein_expected_text_encoder(dcfg_.joint_dim));
    std::vector<runtime::HostTensor> hs;
    if (placed) {
        TeHost d;
        d.L = kKleinPromptTokens;
        d.ids = ids;
        d.mask = qwen3::attention_mask(mask01, d.L, 1);
        d.pos = qwen3::positions(d.L);
        hs = placed->placed->run({d.L}, te_inputs(d), te_outputs, te_label(placed->model->cfg, d.L));
    } else {
        qwen3::Qwen3TextEncoder& te = *te_->whole();
        hs = te.run(ids, mask01, 1, kKleinPromptTokens, std::span<const int>(kKleinTextLayers, 3));
        te_->note_compute(te.runner().last_compute_bytes());
    }
    runtime::HostTensor st = qwen3::stack_hidden_states(hs);
    Conditioning r;
    r.dim = st.ne[0];
    r.tokens = st.ne[1];
    r.context = std::move(st.data);
    r.token_ids = std::move(ids);
    return r;
}

void Flux2Klein::diffusion(std::span<const float> x, std::span<const float> concat, int64_t h, int64_t w, double timestep,
                           const Conditioning& cond, std::span<float> out) {
    const int64_t C = dcfg_.in_channels;
    if (!concat.empty())
        fail(ErrorKind::InvalidInput, "FLUX.2 Klein's transformer takes no extra input channels (got {} values); in-painting is not supported",
             concat.size());
    if (h <= 0 || w <= 0) fail(ErrorKind::InvalidInput, "latent size {}x{} must be positive", w, h);
    if ((int64_t)x.size() != C * h * w)
        fail(ErrorKind::InvalidInput, "transformer latent input has {} values, expected {}x{}x{}", x.size(), C, h, w);
    if ((int64_t)out.size() != C * h * w)
        fail(ErrorKind::InvalidInput, "transformer output buffer has {} values, expected {}x{}x{}", out.size(), C, h, w);
    if (cond.dim != dcfg_.joint_dim)
        fail(ErrorKind::ModelMismatch, "conditioning width {} does not match the transformer's context width {} ({} expected)", cond.dim,
             dcfg_.joint_dim, klein_expected_text_encoder(dcfg_.joint_dim));
    if (cond.tokens <= 0 || (int64_t)cond.context.size() != cond.tokens * cond.dim)
        fail(ErrorKind::InvalidInput, "conditioning context has {} values, expected {} tokens x {}", cond.context.size(), cond.tokens, cond.dim);
    if (!std::isfinite(timestep)) fail(ErrorKind::InvalidInput, "timestep {} is not finite", timestep);
    if (refs_.count > 0 && refs_.channels != C)
        fail(ErrorKind::InvalidInput, "reference tokens have {} channels, the transformer takes {}", refs_.channels, C);
    load(Module::Diffusion);

    // Image tokens (packed latent) then reference tokens; ids [txt; img; refs].
    const int64_t Li = h * w, Lr = refs_.count, Lt = cond.tokens, L = Li + Lr;
    vae::HostTensor xt(1, C, h, w);
    std::copy(x.begin(), x.end(), xt.data.begin());
    std::vector<float> img = flux2_pack_tokens(xt);
    img.insert(img.end(), refs_.tokens.begin(), refs_.tokens.end());
    std::vector<float> ids = flux2_text_ids(Lt);
    auto iids = flux2_image_ids(h, w, 0.0f);
    ids.insert(ids.end(), iids.begin(), iids.end());
    ids.insert(ids.end(), refs_.ids.begin(), refs_.ids.end());
    const RopeTables rope = rope_tables(ids, Lt + L, dcfg_.axes_dims, dcfg_.theta);
    // Flux2KleinPipeline: timestep = t / 1000 in float32, t = sigma * 1000 (float32)
    const float t_model = (float)timestep / 1000.0f;
    if (PlacedDiT* pd = dit_->placed()) {
        DiTHost d;
        d.img = std::move(img);
        d.txt = cond.context;
        d.t = {t_model};
        d.rope = rope;
        d.L = L;
        d.Lt = Lt;
        auto res = pd->placed->run({h, w, Lr, Lt}, dit_inputs(pd->model->cfg, d), dit_output, dit_label(dcfg_, h, w, Lr, Lt));
        if ((int64_t)res.at(0).data.size() != C * L)
            fail(ErrorKind::Internal, "FLUX.2 transformer: output has {} values, expected {}", res[0].data.size(), C * L);
        res[0].data.resize((size_t)(C * Li));
        vae::HostTensor o = flux2_unpack_tokens(res[0].data, 1, C, h, w);
        std::copy(o.data.begin(), o.data.end(), out.begin());
        return;
    }
    DiTWhole& dw = *dit_->whole();
    dw.runner->set_threads(opt_.threads);
    auto res = dw.runner->run([&](runtime::GraphBuilder& g) {
        nn::Ctx c{g.ctx(), opt_.flash_attn_diffusion, g.backend()};
        Flux2Inputs in;
        in.img = g.input_f32("img", {C, L, 1}, img);
        in.txt = g.input_f32("txt", {cond.dim, Lt, 1}, cond.context);
        in.timestep = g.input_f32("t", {1}, std::span<const float>(&t_model, 1));
        in.rope_cos = g.input_f32("rope_cos", {rope.half_dim, rope.tokens}, rope.cos);
        in.rope_sin = g.input_f32("rope_sin", {rope.half_dim, rope.tokens}, rope.sin);
        return std::vector<ggml_tensor*>{dw.dit->module->forward(c, in).sample};
    });
    dit_->note_compute(dw.runner->last_compute_bytes());
    if ((int64_t)res[0].data.size() != C * L)
        fail(ErrorKind::Internal, "FLUX.2 transformer: output has {} values, expected {}", res[0].data.size(), C * L);
    // noise_pred[:, :Li]: the image tokens, back to [C, h, w]
    res[0].data.resize((size_t)(C * Li));
    vae::HostTensor o = flux2_unpack_tokens(res[0].data, 1, C, h, w);
    std::copy(o.data.begin(), o.data.end(), out.begin());
}

vae::HostTensor Flux2Klein::decode(const vae::HostTensor& latent, const vae::TilingOptions& tiling) {
    if (latent.c != dcfg_.in_channels)
        fail(ErrorKind::InvalidInput, "latent has {} channels; FLUX.2 Klein latents have {}", latent.c, dcfg_.in_channels);
    load(Module::VaeDecoder);
    vae::HostTensor z = flux2_diffusion_to_vae(latent, stats_);
    if (decodes_with_taesd()) return decode_taesd(z);
    return decode_kl(z, tiling);
}

vae::HostTensor Flux2Klein::vae_encode_mean(const vae::HostTensor& image, const vae::TilingOptions& tiling, vae::HostTensor* logvar) {
    vae::LatentDist d = encode_kl(image, tiling);
    if (logvar) *logvar = std::move(d.logvar);
    return std::move(d.mean);
}

vae::LatentDist Flux2Klein::encode(const vae::HostTensor& image, const vae::TilingOptions& tiling) {
    const int f = latent_format().spatial_factor;
    if (image.h % f != 0 || image.w % f != 0)
        fail(ErrorKind::InvalidInput, "image {}x{}: FLUX.2 Klein needs sides that are multiples of {}", image.w, image.h, f);
    vae::HostTensor logvar;
    vae::HostTensor mean = vae_encode_mean(image, tiling, &logvar);
    vae::LatentDist d;
    d.mean = flux2_vae_to_diffusion(mean, stats_);
    d.logvar = patchify_2x2(logvar);
    const int64_t hw = d.logvar.h * d.logvar.w;
    for (int64_t n = 0; n < d.logvar.n; ++n)
        for (int64_t c = 0; c < d.logvar.c; ++c) {
            const float s = std::log(stats_.var[(size_t)c] + stats_.eps);
            float* p = d.logvar.data.data() + (size_t)((n * d.logvar.c + c) * hw);
            for (int64_t i = 0; i < hw; ++i) p[i] -= s;
        }
    return d;
}

void Flux2Klein::check_reference_image(int width, int height) const { klein_check_reference_size(width, height); }

void Flux2Klein::set_reference_images(std::span<const vae::HostTensor> images) {
    refs_ = {};
    if (images.empty()) return;
    const int f = latent_format().spatial_factor;
    std::vector<vae::HostTensor> lat;
    for (size_t i = 0; i < images.size(); ++i) {
        vae::HostTensor img = klein_prepare_reference(images[i], f);
        // Flux2KleinPipeline._encode_vae_image: retrieve_latents(sample_mode="argmax") = the mean
        vae::HostTensor mean = vae_encode_mean(img, {}, nullptr);
        lat.push_back(flux2_vae_to_diffusion(mean, stats_));
        log::info("reference image {}: {}x{} pixels -> {} tokens", i + 1, img.w, img.h, lat.back().h * lat.back().w);
    }
    refs_ = klein_pack_references(lat);
}

void Flux2Klein::check_planned_latent(int64_t h, int64_t w) const {
    if (h <= 0 || w <= 0) fail(ErrorKind::InvalidInput, "latent size {}x{} must be positive", w, h);
}

namespace {

/// The size {h, w} pixels klein_prepare_reference encodes a reference image of H x W pixels at
/// (resized to about kKleinMaxRefPixels when larger, then cropped to a multiple of `multiple`),
/// for planning the encode stage; {0, 0} for a size it refuses (the run stops there).
std::pair<int64_t, int64_t> klein_reference_size(int64_t H, int64_t W, int multiple) {
    if (W < 64 || H < 64 || std::max((double)W / H, (double)H / W) > 8.0 || multiple <= 0) return {0, 0};
    if (W * H > kKleinMaxRefPixels) {
        const double s = std::sqrt((double)kKleinMaxRefPixels / (double)(W * H));
        W = (int64_t)((double)W * s);
        H = (int64_t)((double)H * s);
    }
    return {H / multiple * multiple, W / multiple * multiple};
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> Flux2Klein::encode_sizes() const {
    const int64_t m = latent_format().spatial_factor;
    auto sizes = vae::encode_sizes_at(opt_.vae_encode_sizes, m);
    for (auto [H, W] : opt_.reference_sizes)
        if (auto r = klein_reference_size(H, W, (int)m); r.first > 0 && r.second > 0) sizes.push_back(r);
    return sizes;
}

}  // namespace easel::models::flux
