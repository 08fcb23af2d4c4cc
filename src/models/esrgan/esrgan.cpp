// RRDBNet and SRVGGNetCompact (see esrgan.h).
#include "models/esrgan/esrgan.h"

#include "core/error.h"
#include "io/detect.h"

#include <fmt/format.h>
#include <ggml-backend.h>

#include <algorithm>
#include <map>
#include <set>

namespace easel::esrgan {

namespace {

bool starts(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

/// Parses the decimal number at the start of `s` (the index of "12.weight"); -1 when none.
long leading_index(const std::string& s) {
    size_t k = 0;
    while (k < s.size() && k < 9 && s[k] >= '0' && s[k] <= '9') ++k;
    if (k == 0 || k >= s.size() || s[k] != '.') return -1;
    return std::stol(s.substr(0, k));
}

int64_t dim(const io::TensorInfo* t, size_t i) { return t && i < t->shape.size() ? t->shape[i] : -1; }

bool is_conv3(const io::TensorInfo* t) { return t && t->shape.size() == 4 && t->shape[2] == 3 && t->shape[3] == 3; }

int unshuffle_of(int64_t in, int64_t out) {
    for (int u : {1, 2, 4})
        if (in == out * u * u) return u;
    return 0;
}

[[noreturn]] void not_an_upscaler(const io::WeightIndex& index, const std::string& label) {
    const io::Detection d = io::detect(index);
    std::string what = d.family == "unknown" ? "no model easel knows" : "a " + d.family + (d.variant.empty() ? "" : " (" + d.variant + ")");
    if (d.family == "ESRGAN upscaler") what = "an upscaler layout easel does not run (" + d.variant + ")";
    fail(ErrorKind::ModelMismatch,
         "'{}' holds {}, not an ESRGAN upscaler: --upscale-model takes an RRDBNet (ESRGAN, RealESRGAN_x4plus, x4plus_anime_6B, x2plus) "
         "or SRVGGNetCompact (realesr-animevideov3, realesr-general-x4v3) model",
         label, what);
}

EsrganConfig infer_rrdb(const io::WeightIndex& index, const std::string& p, EsrganConfig::Layout layout, const std::string& label) {
    using L = EsrganConfig::Layout;
    EsrganConfig c;
    c.arch = Arch::RRDBNet;
    c.layout = layout;
    c.prefix = p;
    const bool old = layout == L::EsrganOld, trunk = layout == L::EsrganTrunk;
    auto f = [&](const std::string& n) { return index.find(p + n); };
    const io::TensorInfo* first = f(old ? "model.0.weight" : "conv_first.weight");
    const io::TensorInfo* grow =
        f(old ? "model.1.sub.0.RDB1.conv1.0.weight" : trunk ? "RRDB_trunk.0.RDB1.conv1.weight" : "body.0.rdb1.conv1.weight");
    if (!is_conv3(first) || !is_conv3(grow))
        fail(ErrorKind::ModelMismatch, "'{}': RRDBNet conv_first / first RDB conv is not a 3x3 convolution", label);
    c.num_feat = dim(first, 0);
    c.in_channels = dim(first, 1);
    c.num_grow = dim(grow, 0);
    int nb = 0;
    while (f(old     ? fmt::format("model.1.sub.{}.RDB1.conv1.0.weight", nb)
             : trunk ? fmt::format("RRDB_trunk.{}.RDB1.conv1.weight", nb)
                     : fmt::format("body.{}.rdb1.conv1.weight", nb)))
        ++nb;
    c.num_block = nb;
    const io::TensorInfo* last = nullptr;
    if (old) {
        if (!f(fmt::format("model.1.sub.{}.weight", nb)))
            fail(ErrorKind::ModelMismatch, "'{}': ESRGAN (old layout) without its trunk conv model.1.sub.{}.weight", label, nb);
        // the convs after the trunk: upsampling convs at model.3, 6, ..., then HR conv and last conv
        std::vector<long> idx;
        for (const auto& t : index.tensors()) {
            if (!starts(t.name, p + "model.")) continue;
            const long k = leading_index(t.name.substr(p.size() + 6));
            if (k >= 2 && t.name == p + fmt::format("model.{}.weight", k) && t.shape.size() == 4) idx.push_back(k);
        }
        std::sort(idx.begin(), idx.end());
        const int n_up = (int)idx.size() - 2;
        bool ok = n_up >= 0;
        for (int k = 0; ok && k < n_up; ++k) ok = idx[(size_t)k] == 3L * (k + 1);
        ok = ok && idx[(size_t)n_up] == 3L * n_up + 2 && idx[(size_t)n_up + 1] == 3L * n_up + 4;
        if (!ok)
            fail(ErrorKind::Unsupported,
                 "'{}': an ESRGAN (old layout) whose convs after the trunk are not nearest-x2 upsampling stages (a pixel-shuffle or x3 "
                 "model): easel runs the nearest-upsampling ESRGANs",
                 label);
        c.n_upsample = n_up;
        last = f(fmt::format("model.{}.weight", idx.back()));
    } else {
        int n_up = 0;
        while (f(std::string(trunk ? "upconv" : "conv_up") + std::to_string(n_up + 1) + ".weight")) ++n_up;
        c.n_upsample = n_up;
        if (!f(trunk ? "trunk_conv.weight" : "conv_body.weight") || !f(trunk ? "HRconv.weight" : "conv_hr.weight") || !f("conv_last.weight"))
            fail(ErrorKind::ModelMismatch, "'{}': RRDBNet without its trunk conv / HR conv / conv_last", label);
        last = f("conv_last.weight");
    }
    if (c.num_block == 0) fail(ErrorKind::ModelMismatch, "'{}': RRDBNet without RRDB blocks", label);
    if (dim(last, 0) != 3)
        fail(ErrorKind::Unsupported, "'{}': the upscaler gives {} channels; easel runs RGB models (3 output channels)", label, dim(last, 0));
    c.unshuffle = unshuffle_of(c.in_channels, 3);
    if (c.unshuffle == 0)
        fail(ErrorKind::Unsupported, "'{}': the upscaler takes {} input channels; easel runs RGB models (3, or 12 / 48 with pixel unshuffle)",
             label, c.in_channels);
    const int up = 1 << c.n_upsample;
    if (up % c.unshuffle != 0)
        fail(ErrorKind::Unsupported, "'{}': {} upsampling stages cannot undo a pixel unshuffle by {}", label, c.n_upsample, c.unshuffle);
    c.scale = up / c.unshuffle;
    return c;
}

EsrganConfig infer_srvgg(const io::WeightIndex& index, const std::string& p, const std::string& label) {
    EsrganConfig c;
    c.arch = Arch::SRVGGNetCompact;
    c.prefix = p;
    std::map<long, const io::TensorInfo*> w, b;
    for (const auto& t : index.tensors()) {
        if (!starts(t.name, p + "body.")) continue;
        const std::string rest = t.name.substr(p.size() + 5);
        const long k = leading_index(rest);
        if (k < 0) continue;
        const std::string tail = rest.substr(rest.find('.') + 1);
        if (tail == "weight") w[k] = &t;
        else if (tail == "bias") b[k] = &t;
    }
    long L = -1;
    for (auto& [k, t] : w)
        if (t->shape.size() == 4) L = std::max(L, k);
    c.num_feat = dim(w[0], 0);
    if (L < 2 || L % 2 != 0) fail(ErrorKind::ModelMismatch, "'{}': SRVGGNetCompact body without its last conv at an even index", label);
    for (long k = 0; k <= L; ++k) {
        if (k % 2 == 0) {
            if (!is_conv3(w[k]) || !b.count(k) || dim(w[k], 1) != (k == 0 ? 3 : c.num_feat) || (k < L && dim(w[k], 0) != c.num_feat))
                fail(ErrorKind::ModelMismatch, "'{}': SRVGGNetCompact body.{} is not a 3x3 convolution of {} features", label, k, c.num_feat);
        } else if (!w.count(k)) {
            fail(ErrorKind::Unsupported,
                 "'{}': a compact upscaler (SRVGGNetCompact) without PReLU weights at body.{}: its activation (ReLU or LeakyReLU) is not "
                 "in the weights; easel runs the PReLU models (realesr-animevideov3, realesr-general-x4v3)",
                 label, k);
        } else if (w[k]->shape != std::vector<int64_t>{c.num_feat}) {
            fail(ErrorKind::ModelMismatch, "'{}': SRVGGNetCompact PReLU body.{} has shape [{}], expected [{}]", label, k, dim(w[k], 0), c.num_feat);
        }
    }
    const int64_t out = dim(w[L], 0);
    int s = 1;
    while (3LL * s * s < out) ++s;
    if (3LL * s * s != out)
        fail(ErrorKind::Unsupported, "'{}': the compact upscaler's last conv gives {} channels, not 3 x scale^2 (an RGB model)", label, out);
    c.scale = s;
    c.num_block = (int)(L / 2 - 1);
    c.n_upsample = 0;
    return c;
}

// ---------------------------------------------------------------- network blocks

ggml_tensor* lrelu(nn::Ctx& c, ggml_tensor* x) { return ggml_leaky_relu(c.ctx, x, 0.2f, false); }

class ResidualDenseBlock : public nn::Block {
public:
    ResidualDenseBlock(int64_t f, int64_t g) {
        for (int k = 0; k < 5; ++k) conv[k] = &add<nn::Conv2d>(fmt::format("conv{}", k + 1), f + k * g, k == 4 ? f : g, 3, 1, 1);
    }
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const {
        ggml_tensor* cat = x;
        for (int k = 0; k < 4; ++k) {
            ggml_tensor* y = lrelu(c, conv3x3(c, *conv[k], cat));
            cat = ggml_concat(c.ctx, cat, y, 2);
        }
        ggml_tensor* x5 = conv3x3(c, *conv[4], cat);
        return ggml_add(c.ctx, ggml_scale(c.ctx, x5, 0.2f), x);
    }
    nn::Conv2d* conv[5];
};

class RRDB : public nn::Block {
public:
    RRDB(int64_t f, int64_t g) {
        for (int k = 0; k < 3; ++k) rdb[k] = &add<ResidualDenseBlock>(fmt::format("rdb{}", k + 1), f, g);
    }
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const {
        ggml_tensor* h = x;
        for (auto* r : rdb) h = r->forward(c, h);
        return ggml_add(c.ctx, ggml_scale(c.ctx, h, 0.2f), x);
    }
    ResidualDenseBlock* rdb[3];
};

void check_image(const EsrganConfig& cfg, ggml_tensor* x) {
    if (!x || x->ne[2] != 3 || x->ne[3] != 1 || x->ne[0] <= 0 || x->ne[1] <= 0)
        fail(ErrorKind::InvalidInput, "upscaler input must be one RGB image {{W, H, 3, 1}}");
    if (x->ne[0] % cfg.unshuffle != 0 || x->ne[1] % cfg.unshuffle != 0)
        fail(ErrorKind::InvalidInput, "upscaler input {}x{} is not a multiple of the pixel-unshuffle factor {}", x->ne[0], x->ne[1], cfg.unshuffle);
}

class RRDBNet final : public UpscalerNet {
public:
    explicit RRDBNet(const EsrganConfig& cfg) : UpscalerNet(cfg) {
        const int64_t f = cfg.num_feat;
        conv_first = &add<nn::Conv2d>("conv_first", cfg.in_channels, f, 3, 1, 1);
        for (int i = 0; i < cfg.num_block; ++i) body.push_back(&add<RRDB>(fmt::format("body.{}", i), f, cfg.num_grow));
        conv_body = &add<nn::Conv2d>("conv_body", f, f, 3, 1, 1);
        for (int i = 0; i < cfg.n_upsample; ++i) ups.push_back(&add<nn::Conv2d>(fmt::format("conv_up{}", i + 1), f, f, 3, 1, 1));
        conv_hr = &add<nn::Conv2d>("conv_hr", f, f, 3, 1, 1);
        conv_last = &add<nn::Conv2d>("conv_last", f, 3, 3, 1, 1);
    }
    int n_blocks() const override { return (int)body.size(); }
    EsrganState prologue(nn::Ctx& c, const EsrganInputs& in) const override {
        check_image(cfg_, in.x);
        ggml_tensor* h = cfg_.unshuffle > 1 ? pixel_unshuffle(c.ctx, in.x, cfg_.unshuffle) : in.x;
        ggml_tensor* feat = conv3x3(c, *conv_first, h);
        return EsrganState{feat, feat};
    }
    EsrganState block(nn::Ctx& c, int i, EsrganState s) const override {
        s.h = body.at((size_t)i)->forward(c, s.h);
        return s;
    }
    ggml_tensor* epilogue(nn::Ctx& c, EsrganState s) const override {
        ggml_tensor* feat = ggml_add(c.ctx, s.skip, conv3x3(c, *conv_body, s.h));
        for (auto* up : ups) feat = lrelu(c, conv3x3(c, *up, ggml_upscale(c.ctx, feat, 2, GGML_SCALE_MODE_NEAREST)));
        return conv3x3(c, *conv_last, lrelu(c, conv3x3(c, *conv_hr, feat)));
    }
    const nn::Block& block_params(int i) const override { return *body.at((size_t)i); }

private:
    nn::Conv2d *conv_first, *conv_body, *conv_hr, *conv_last;
    std::vector<RRDB*> body;
    std::vector<nn::Conv2d*> ups;
};

/// torch.nn.PReLU(num_parameters=C): max(0, x) + weight[c] * min(0, x).
class PReLU : public nn::Block {
public:
    explicit PReLU(int64_t ch) : channels(ch) { w = &param("weight", {ch}, nn::ParamRole::Norm); }
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const {
        ggml_tensor* r = ggml_relu(c.ctx, x);
        ggml_tensor* neg = ggml_sub(c.ctx, x, r);  // min(0, x), exactly
        return ggml_add(c.ctx, r, ggml_mul(c.ctx, neg, ggml_reshape_4d(c.ctx, w->tensor, 1, 1, channels, 1)));
    }
    int64_t channels;
    nn::Param* w;
};

class CompactUnit : public nn::Block {
public:
    CompactUnit(int64_t in, int64_t f) {
        conv = &add<nn::Conv2d>("conv", in, f, 3, 1, 1);
        act = &add<PReLU>("act", f);
    }
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const { return act->forward(c, conv3x3(c, *conv, x)); }
    nn::Conv2d* conv;
    PReLU* act;
};

class SRVGGNetCompact final : public UpscalerNet {
public:
    explicit SRVGGNetCompact(const EsrganConfig& cfg) : UpscalerNet(cfg) {
        first = &add<CompactUnit>("first", 3, cfg.num_feat);
        for (int i = 0; i < cfg.num_block; ++i) units.push_back(&add<CompactUnit>(fmt::format("units.{}", i), cfg.num_feat, cfg.num_feat));
        conv_last = &add<nn::Conv2d>("conv_last", cfg.num_feat, 3LL * cfg.scale * cfg.scale, 3, 1, 1);
    }
    int n_blocks() const override { return (int)units.size(); }
    EsrganState prologue(nn::Ctx& c, const EsrganInputs& in) const override {
        check_image(cfg_, in.x);
        return EsrganState{in.x, first->forward(c, in.x)};
    }
    EsrganState block(nn::Ctx& c, int i, EsrganState s) const override {
        s.h = units.at((size_t)i)->forward(c, s.h);
        return s;
    }
    ggml_tensor* epilogue(nn::Ctx& c, EsrganState s) const override {
        ggml_tensor* out = pixel_shuffle(c.ctx, conv3x3(c, *conv_last, s.h), cfg_.scale);
        return ggml_add(c.ctx, out, ggml_upscale(c.ctx, s.skip, cfg_.scale, GGML_SCALE_MODE_NEAREST));
    }
    const nn::Block& block_params(int i) const override { return *units.at((size_t)i); }

private:
    CompactUnit* first;
    std::vector<CompactUnit*> units;
    nn::Conv2d* conv_last;
};

}  // namespace

std::string EsrganConfig::describe() const {
    if (arch == Arch::SRVGGNetCompact)
        return fmt::format("SRVGGNetCompact x{} ({} convs, {} features, PReLU)", scale, num_block + 2, num_feat);
    return fmt::format("RRDBNet x{} ({} blocks, {} features, grow {}{}, {} keys)", scale, num_block, num_feat, num_grow,
                       unshuffle > 1 ? fmt::format(", pixel unshuffle {}", unshuffle) : "",
                       layout == Layout::EsrganOld ? "ESRGAN" : layout == Layout::EsrganTrunk ? "ESRGAN RRDB_trunk" : "BasicSR");
}

int64_t context_pixels(const EsrganConfig& cfg) {
    if (cfg.arch == Arch::SRVGGNetCompact) return cfg.num_block + 2;
    return 16LL * cfg.unshuffle;
}

EsrganConfig infer_config(const io::WeightIndex& index, const std::string& label) {
    for (const std::string p : {"", "module."}) {
        using L = EsrganConfig::Layout;
        if (index.contains(p + "conv_first.weight") && index.contains(p + "body.0.rdb1.conv1.weight")) return infer_rrdb(index, p, L::BasicSR, label);
        if (index.contains(p + "conv_first.weight") && index.contains(p + "RRDB_trunk.0.RDB1.conv1.weight"))
            return infer_rrdb(index, p, L::EsrganTrunk, label);
        if (index.contains(p + "model.0.weight") && index.contains(p + "model.1.sub.0.RDB1.conv1.0.weight"))
            return infer_rrdb(index, p, L::EsrganOld, label);
        const io::TensorInfo* b0 = index.find(p + "body.0.weight");
        if (b0 && b0->shape.size() == 4 && b0->shape[1] == 3) {
            bool all_body = true;
            for (const auto& t : index.tensors())
                if (!starts(t.name, p + "body.")) all_body = false;
            if (all_body) return infer_srvgg(index, p, label);
        }
    }
    not_an_upscaler(index, label);
}

std::unique_ptr<UpscalerNet> make_net(const EsrganConfig& cfg) {
    if (cfg.arch == Arch::SRVGGNetCompact) return std::make_unique<SRVGGNetCompact>(cfg);
    return std::make_unique<RRDBNet>(cfg);
}

nn::TensorSource tensor_source(const io::WeightIndex& index, const EsrganConfig& cfg) {
    nn::TensorSource src(index, cfg.prefix);
    if (cfg.arch == Arch::SRVGGNetCompact) {
        const int L = 2 * cfg.num_block + 2;
        src.set_mapper([L](const std::string& n) -> std::string {
            const size_t dot = n.rfind('.');
            const std::string leaf = n.substr(dot + 1);
            if (starts(n, "first.conv.")) return "body.0." + leaf;
            if (starts(n, "first.act.")) return "body.1." + leaf;
            if (starts(n, "conv_last.")) return fmt::format("body.{}.{}", L, leaf);
            if (starts(n, "units.")) {
                const long k = leading_index(n.substr(6));
                const bool act = n.find(".act.") != std::string::npos;
                return fmt::format("body.{}.{}", 2 * k + (act ? 3 : 2), leaf);
            }
            return {};
        });
    } else if (cfg.layout == EsrganConfig::Layout::EsrganTrunk) {
        src.set_mapper([](const std::string& n) -> std::string {
            const size_t dot = n.rfind('.');
            const std::string leaf = n.substr(dot + 1);
            if (starts(n, "conv_body.")) return "trunk_conv." + leaf;
            if (starts(n, "conv_hr.")) return "HRconv." + leaf;
            if (starts(n, "conv_up")) return "upconv" + n.substr(7);
            if (starts(n, "body.")) {
                // body.N.rdbK.convJ.leaf -> RRDB_trunk.N.RDBK.convJ.leaf
                const long blk = leading_index(n.substr(5));
                const size_t r = n.find(".rdb");
                return fmt::format("RRDB_trunk.{}.RDB{}", blk, n.substr(r + 4));
            }
            return {};
        });
    } else if (cfg.layout == EsrganConfig::Layout::EsrganOld) {
        const int nb = cfg.num_block, nu = cfg.n_upsample;
        src.set_mapper([nb, nu](const std::string& n) -> std::string {
            const size_t dot = n.rfind('.');
            const std::string leaf = n.substr(dot + 1);
            if (starts(n, "conv_first.")) return "model.0." + leaf;
            if (starts(n, "conv_body.")) return fmt::format("model.1.sub.{}.{}", nb, leaf);
            if (starts(n, "conv_hr.")) return fmt::format("model.{}.{}", 3 * nu + 2, leaf);
            if (starts(n, "conv_last.")) return fmt::format("model.{}.{}", 3 * nu + 4, leaf);
            if (starts(n, "conv_up")) return fmt::format("model.{}.{}", 3 * std::stol(n.substr(7)), leaf);
            if (starts(n, "body.")) {
                // body.N.rdbK.convJ.leaf -> model.1.sub.N.RDBK.convJ.0.leaf
                const long blk = leading_index(n.substr(5));
                const size_t r = n.find(".rdb");
                const std::string rdb = n.substr(r + 4, 1), conv = n.substr(n.find(".conv", r) + 5, 1);
                return fmt::format("model.1.sub.{}.RDB{}.conv{}.0.{}", blk, rdb, conv, leaf);
            }
            return {};
        });
    }
    return src;
}

nn::LoadOptions load_options() {
    nn::LoadOptions lo;
    lo.weight_type = GGML_TYPE_F32;
    return lo;
}

ggml_tensor* conv3x3(nn::Ctx& c, const nn::Conv2d& conv, ggml_tensor* x) {
    if (!conv.w->tensor) fail(ErrorKind::Internal, "upscaler convolution used before its weights were bound");
    if (x->ne[2] != conv.in) fail(ErrorKind::InvalidInput, "upscaler convolution expects {} channels, got {}", conv.in, x->ne[2]);
    ggml_tensor* y = ggml_conv_2d_direct(c.ctx, conv.w->tensor, x, 1, 1, 1, 1, 1, 1);
    if (c.backend && !ggml_backend_supports_op(c.backend, y)) return conv.forward(c, x);  // im2col + matmul
    if (conv.b && conv.b->tensor) y = ggml_add(c.ctx, y, ggml_reshape_4d(c.ctx, conv.b->tensor, 1, 1, conv.out, 1));
    return y;
}

ggml_tensor* pixel_unshuffle(ggml_context* ctx, ggml_tensor* x, int u) {
    if (u == 1) return x;
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2];
    if (x->ne[3] != 1 || W % u || H % u) fail(ErrorKind::InvalidInput, "pixel_unshuffle by {} of a {}x{} image", u, W, H);
    // rows: {W, (i, Hd), C} -> {W, Hd, i, C}
    ggml_tensor* a = ggml_reshape_4d(ctx, x, W, u, H / u, C);
    a = ggml_cont(ctx, ggml_permute(ctx, a, 0, 2, 1, 3));
    // columns: {(j, Wd), Hd, i*C} -> {Wd, Hd, j, i*C}
    ggml_tensor* b = ggml_reshape_4d(ctx, a, u, W / u, H / u, (int64_t)u * C);
    b = ggml_cont(ctx, ggml_permute(ctx, b, 2, 0, 1, 3));
    return ggml_reshape_4d(ctx, b, W / u, H / u, C * u * u, 1);  // channel = (c*u + i)*u + j
}

ggml_tensor* pixel_shuffle(ggml_context* ctx, ggml_tensor* x, int s) {
    if (s == 1) return x;
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2] / ((int64_t)s * s);
    if (x->ne[3] != 1 || x->ne[2] % ((int64_t)s * s)) fail(ErrorKind::InvalidInput, "pixel_shuffle by {} of {} channels", s, x->ne[2]);
    // {W, H, j, (i, c)} -> {j, W, H, (i, c)}: x' = w*s + j
    ggml_tensor* a = ggml_reshape_4d(ctx, x, W, H, s, (int64_t)s * C);
    a = ggml_cont(ctx, ggml_permute(ctx, a, 1, 2, 0, 3));
    // {X, H, i, c} -> {X, i, H, c}: y' = h*s + i
    ggml_tensor* b = ggml_reshape_4d(ctx, a, W * s, H, s, C);
    b = ggml_cont(ctx, ggml_permute(ctx, b, 0, 2, 1, 3));
    return ggml_reshape_4d(ctx, b, W * s, H * s, C, 1);
}

}  // namespace easel::esrgan
