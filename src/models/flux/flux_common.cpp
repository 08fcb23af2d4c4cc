// Shared FLUX pieces (see flux_common.h).
#include "models/flux/flux_common.h"

#include "core/error.h"

#include <ggml-cpu.h>

#include <cmath>
#include <string>

namespace easel::models::flux {

RopeTables rope_tables(std::span<const float> ids, int64_t tokens, std::span<const int> axes, double theta) {
    const int64_t n_axes = int64_t(axes.size());
    if (n_axes == 0 || tokens < 0 || int64_t(ids.size()) != tokens * n_axes)
        fail(ErrorKind::InvalidInput, "rope_tables: {} position values do not form {} tokens x {} axes", ids.size(), tokens, n_axes);
    int64_t dim = 0;
    for (int a : axes) {
        if (a <= 0 || a % 2 != 0) fail(ErrorKind::InvalidInput, "rope_tables: axis size {} must be positive and even", a);
        dim += a;
    }
    RopeTables r;
    r.half_dim = dim / 2;
    r.tokens = tokens;
    r.cos.resize(size_t(tokens * r.half_dim));
    r.sin.resize(r.cos.size());
    for (int64_t t = 0; t < tokens; ++t) {
        int64_t j0 = 0;
        for (int64_t a = 0; a < n_axes; ++a) {
            const int d = axes[size_t(a)];
            const double pos = double(ids[size_t(t * n_axes + a)]);
            for (int j = 0; j < d / 2; ++j) {
                // diffusers: 1.0 / theta ** (arange(0, d, 2) / d), outer product with pos, in float64
                const double freq = 1.0 / std::pow(theta, double(2 * j) / double(d));
                const double ang = pos * freq;
                r.cos[size_t(t * r.half_dim + j0 + j)] = float(std::cos(ang));
                r.sin[size_t(t * r.half_dim + j0 + j)] = float(std::sin(ang));
            }
            j0 += d / 2;
        }
    }
    return r;
}

ggml_tensor* apply_rope(nn::Ctx& c, ggml_tensor* x, ggml_tensor* cos, ggml_tensor* sin) {
    const int64_t D = x->ne[0], H = x->ne[1], L = x->ne[2], N = x->ne[3];
    if (D % 2 != 0 || cos->ne[0] * 2 != D || cos->ne[1] != L || !ggml_are_same_shape(cos, sin) || cos->ne[2] != 1 ||
        cos->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "apply_rope: rotary tables {{{}, {}}} do not match heads {{{}, {}, {}, {}}} (need {{D/2, L}})",
             cos->ne[0], cos->ne[1], D, H, L, N);
    ggml_context* ctx = c.ctx;
    if (!ggml_is_contiguous(x)) x = ggml_cont(ctx, x);
    // out = x * C + swap(x) * S, where swap exchanges the two channels of each pair and the
    // full-width tables are C = (cos, cos) and S = (-sin, sin) per pair, {D, 1, L} (repeated over
    // heads; over the batch because L*N tiles L). The products run on whole contiguous rows.
    // The pair swap views x as {2, D/2, H, L*N} and takes the even / odd channels with the
    // heads axis kept whole (strides of x along H and L): ggml's meta device (--split-mode row,
    // heads split across devices) can split such a view along H, which it cannot for a view
    // that flattens heads and tokens into one strided axis.
    const size_t es = ggml_element_size(x);
    ggml_tensor* xp = ggml_reshape_4d(ctx, x, 2, D / 2, H, L * N);
    ggml_tensor* x0 = ggml_view_4d(ctx, xp, 1, D / 2, H, L * N, xp->nb[1], xp->nb[2], xp->nb[3], 0);
    ggml_tensor* x1 = ggml_view_4d(ctx, xp, 1, D / 2, H, L * N, xp->nb[1], xp->nb[2], xp->nb[3], es);
    ggml_tensor* sw = ggml_reshape_4d(ctx, ggml_concat(ctx, x1, x0, 0), D, H, L * N, 1);
    ggml_tensor* cs = ggml_reshape_3d(ctx, cos, 1, D / 2, L);
    ggml_tensor* sn = ggml_reshape_3d(ctx, sin, 1, D / 2, L);
    ggml_tensor* C = ggml_reshape_4d(ctx, ggml_concat(ctx, cs, cs, 0), D, 1, L, 1);
    ggml_tensor* S = ggml_reshape_4d(ctx, ggml_concat(ctx, ggml_neg(ctx, sn), sn, 0), D, 1, L, 1);
    ggml_tensor* xr = ggml_reshape_4d(ctx, x, D, H, L * N, 1);
    ggml_tensor* o = ggml_add(ctx, ggml_mul(ctx, xr, C), ggml_mul(ctx, sw, S));
    return ggml_reshape_4d(ctx, o, D, H, L, N);
}

namespace {

/// True when `b` runs on a GPU backend whose GELU is computed in F32 (CUDA, Vulkan, Metal).
/// The CPU backend (also behind RPC servers and ggml's meta device) reads an F16 table instead.
bool f32_gelu_backend(ggml_backend_t b) {
    if (!b) return false;
    ggml_backend_dev_t d = ggml_backend_get_device(b);
    if (!d) return false;
    ggml_backend_reg_t r = ggml_backend_dev_backend_reg(d);
    const std::string name = r ? ggml_backend_reg_name(r) : "";
    return name == "CUDA" || name == "Vulkan" || name == "Metal";
}

}  // namespace

ggml_tensor* gelu_tanh(nn::Ctx& c, ggml_tensor* x) {
    if (f32_gelu_backend(c.backend)) return ggml_gelu(c.ctx, x);
    ggml_context* ctx = c.ctx;
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    ggml_tensor* x3 = ggml_mul(ctx, ggml_sqr(ctx, x), x);
    ggml_tensor* inner = ggml_scale(ctx, ggml_add(ctx, x, ggml_scale(ctx, x3, 0.044715f)), k);
    ggml_tensor* t = ggml_scale_bias(ctx, ggml_tanh(ctx, inner), 0.5f, 0.5f);  // 0.5 (1 + tanh)
    return ggml_mul(ctx, x, t);
}

ggml_tensor* mod_chunk(nn::Ctx& c, ggml_tensor* mod, int i, int64_t d) {
    if (mod->ne[0] < (i + 1) * d || mod->ne[2] != 1 || mod->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "modulation vector {{{}, {}}} has no chunk {} of width {}", mod->ne[0], mod->ne[1], i, d);
    ggml_tensor* v = ggml_view_3d(c.ctx, mod, d, 1, mod->ne[1], mod->nb[1], mod->nb[1], size_t(i * d) * ggml_element_size(mod));
    return ggml_cont(c.ctx, v);
}

ggml_tensor* modulate(nn::Ctx& c, ggml_tensor* x, ggml_tensor* shift, ggml_tensor* scale) {
    ggml_tensor* s1 = ggml_scale_bias(c.ctx, scale, 1.0f, 1.0f);
    return ggml_add(c.ctx, ggml_mul(c.ctx, x, s1), shift);
}

ggml_tensor* seq_slice(nn::Ctx& c, ggml_tensor* x, int64_t begin, int64_t len) {
    if (begin < 0 || len < 0 || begin + len > x->ne[1])
        fail(ErrorKind::InvalidInput, "sequence slice [{}, {}) outside {} tokens", begin, begin + len, x->ne[1]);
    ggml_tensor* v = ggml_view_3d(c.ctx, x, x->ne[0], len, x->ne[2], x->nb[1], x->nb[2], size_t(begin) * x->nb[1]);
    return ggml_cont(c.ctx, v);
}

std::vector<float> pack_latents(std::span<const float> latent, int64_t n, int64_t c, int64_t h, int64_t w) {
    if (h % 2 != 0 || w % 2 != 0 || n <= 0 || c <= 0 || int64_t(latent.size()) != n * c * h * w)
        fail(ErrorKind::InvalidInput, "pack_latents: latent of {} values is not [{}, {}, {}, {}] with even H and W", latent.size(), n,
             c, h, w);
    const int64_t h2 = h / 2, w2 = w / 2, f = 4 * c;
    std::vector<float> out(latent.size());
    for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < c; ++ch)
            for (int64_t y = 0; y < h; ++y)
                for (int64_t x = 0; x < w; ++x) {
                    const int64_t tok = (y / 2) * w2 + x / 2, feat = ch * 4 + (y % 2) * 2 + (x % 2);
                    out[size_t((b * h2 * w2 + tok) * f + feat)] = latent[size_t(((b * c + ch) * h + y) * w + x)];
                }
    return out;
}

std::vector<float> unpack_latents(std::span<const float> tokens, int64_t n, int64_t c, int64_t h, int64_t w) {
    if (h % 2 != 0 || w % 2 != 0 || n <= 0 || c <= 0 || int64_t(tokens.size()) != n * c * h * w)
        fail(ErrorKind::InvalidInput, "unpack_latents: {} token values do not unpack to [{}, {}, {}, {}] with even H and W",
             tokens.size(), n, c, h, w);
    const int64_t h2 = h / 2, w2 = w / 2, f = 4 * c;
    std::vector<float> out(tokens.size());
    for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < c; ++ch)
            for (int64_t y = 0; y < h; ++y)
                for (int64_t x = 0; x < w; ++x) {
                    const int64_t tok = (y / 2) * w2 + x / 2, feat = ch * 4 + (y % 2) * 2 + (x % 2);
                    out[size_t(((b * c + ch) * h + y) * w + x)] = tokens[size_t((b * h2 * w2 + tok) * f + feat)];
                }
    return out;
}

std::vector<float> flux1_image_ids(int64_t rows, int64_t cols) {
    std::vector<float> ids(size_t(rows * cols * 3), 0.0f);
    for (int64_t y = 0; y < rows; ++y)
        for (int64_t x = 0; x < cols; ++x) {
            ids[size_t((y * cols + x) * 3 + 1)] = float(y);
            ids[size_t((y * cols + x) * 3 + 2)] = float(x);
        }
    return ids;
}

std::vector<float> flux2_image_ids(int64_t rows, int64_t cols, float t) {
    std::vector<float> ids(size_t(rows * cols * 4), 0.0f);
    for (int64_t y = 0; y < rows; ++y)
        for (int64_t x = 0; x < cols; ++x) {
            ids[size_t((y * cols + x) * 4 + 0)] = t;
            ids[size_t((y * cols + x) * 4 + 1)] = float(y);
            ids[size_t((y * cols + x) * 4 + 2)] = float(x);
        }
    return ids;
}

std::vector<float> flux2_text_ids(int64_t tokens) {
    std::vector<float> ids(size_t(tokens * 4), 0.0f);
    for (int64_t l = 0; l < tokens; ++l) ids[size_t(l * 4 + 3)] = float(l);
    return ids;
}

std::string ne_str(const ggml_tensor* t) { return fmt::format("{{{}, {}, {}, {}}}", t->ne[0], t->ne[1], t->ne[2], t->ne[3]); }

int count_indexed(const io::WeightIndex& idx, const std::string& prefix, const std::string& suffix) {
    int n = 0;
    while (idx.find(prefix + std::to_string(n) + suffix)) ++n;
    return n;
}

const io::TensorInfo& need_tensor(const io::WeightIndex& idx, const std::string& name, size_t rank, const char* model) {
    const io::TensorInfo* t = idx.find(name);
    if (!t) fail(ErrorKind::ModelMismatch, "{} DiT: tensor '{}' is missing; the file is not a complete {} transformer", model, name, model);
    if (t->shape.size() != rank)
        fail(ErrorKind::ModelMismatch, "{} DiT: tensor '{}' has {} dimensions, expected {}", model, name, t->shape.size(), rank);
    return *t;
}

ggml_tensor* split_heads(nn::Ctx& c, ggml_tensor* x, int64_t hd, int64_t h) {
    return ggml_reshape_4d(c.ctx, x, hd, h, x->ne[1], x->ne[2]);
}

ggml_tensor* merge_heads(nn::Ctx& c, ggml_tensor* x) { return ggml_reshape_3d(c.ctx, x, x->ne[0] * x->ne[1], x->ne[2], x->ne[3]); }

ggml_tensor* layer_norm(nn::Ctx& c, ggml_tensor* x) { return ggml_norm(c.ctx, x, 1e-6f); }

ggml_tensor* linear_rows(nn::Ctx& c, const nn::Linear& l, ggml_tensor* x, int64_t begin, int64_t n) {
    if (!l.w || !l.w->tensor) fail(ErrorKind::Internal, "linear_rows: the layer's weight is not loaded");
    if (begin < 0 || n <= 0 || begin + n > l.out)
        fail(ErrorKind::InvalidInput, "linear_rows: rows [{}, {}) outside the layer's {} outputs", begin, begin + n, l.out);
    if (x->ne[0] != l.in) fail(ErrorKind::InvalidInput, "linear_rows: the layer takes {} input features, got {}", l.in, ne_str(x));
    ggml_tensor* w = l.w->tensor;
    ggml_tensor* wv = ggml_view_2d(c.ctx, w, w->ne[0], n, w->nb[1], size_t(begin) * w->nb[1]);
    ggml_tensor* y = nn::weight_matmul(c, *l.w, wv, x, begin);
    if (l.b && l.b->tensor) {
        ggml_tensor* b = l.b->tensor;
        y = ggml_add(c.ctx, y, ggml_view_1d(c.ctx, b, n, size_t(begin) * ggml_element_size(b)));
    }
    return y;
}

ggml_tensor* join_rows(nn::Ctx& c, const std::vector<ggml_tensor*>& parts) {
    if (parts.empty()) fail(ErrorKind::InvalidInput, "join_rows: no parts");
    ggml_context* ctx = c.ctx;
    const int64_t D = parts[0]->ne[0], L = parts[0]->ne[1], N = parts[0]->ne[2];
    ggml_tensor* acc = nullptr;
    for (ggml_tensor* p : parts) {
        if (p->ne[0] != D || p->ne[1] != L || p->ne[2] != N || p->ne[3] != 1)
            fail(ErrorKind::InvalidInput, "join_rows: part {} differs from {}", ne_str(p), ne_str(parts[0]));
        ggml_tensor* r = ggml_reshape_3d(ctx, ggml_is_contiguous(p) ? p : ggml_cont(ctx, p), D, 1, L * N);
        acc = acc ? ggml_concat(ctx, acc, r, 1) : r;
    }
    return ggml_reshape_3d(ctx, acc, D * (int64_t)parts.size(), L, N);
}

}  // namespace easel::models::flux
