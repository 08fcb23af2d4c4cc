// LoRA at run time in ggml graphs (see graph.h).
#include "lora/graph.h"

#include "core/error.h"

#include <fmt/ranges.h>

#include <cmath>

namespace easel::lora {

namespace {

std::string ne_str(const ggml_tensor* t) { return fmt::format("{{{}, {}, {}, {}}}", t->ne[0], t->ne[1], t->ne[2], t->ne[3]); }
std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

ggml_tensor* f32(ggml_context* ctx, ggml_tensor* t) { return t->type == GGML_TYPE_F32 ? t : ggml_cast(ctx, t, GGML_TYPE_F32); }

// x * s over features: s F32 {n} multiplies ne[0] (linear) or ne[2] (conv) of x.
ggml_tensor* scale_features(ggml_context* ctx, ggml_tensor* x, ggml_tensor* s, bool conv) {
    if (!s) return x;
    const int64_t n = conv ? x->ne[2] : x->ne[0];
    if (ggml_nelements(s) != n) fail(ErrorKind::InvalidInput, "LoRA DoRA scale of {} values for {} features", ggml_nelements(s), n);
    return ggml_mul(ctx, x, conv ? ggml_reshape_4d(ctx, s, 1, 1, n, 1) : ggml_reshape_1d(ctx, s, n));
}

ggml_tensor* kron_term(ggml_context* ctx, ggml_tensor* x, ggml_tensor* w1, ggml_tensor* w2, float s) {
    // W1 {b, a}, W2 {d, c}; x {b*d, L...} -> X {d, b, L}; T = W2 X -> {c, b, L}; R = W1 T^T -> {a, c, L}; out {c, a, L} -> {a*c, L}
    const int64_t b = w1->ne[0], a = w1->ne[1], d = w2->ne[0], c = w2->ne[1];
    if (x->ne[0] != b * d)
        fail(ErrorKind::InvalidInput, "LoKr term: input {} has not the {} x {} features of its factors", ne_str(x), b, d);
    const int64_t L = ggml_nelements(x) / x->ne[0];
    ggml_tensor* X = ggml_reshape_3d(ctx, ggml_is_contiguous(x) ? x : ggml_cont(ctx, x), d, b, L);
    ggml_tensor* T = ggml_mul_mat(ctx, w2, X);                              // {c, b, L}
    ggml_tensor* Tt = ggml_cont(ctx, ggml_permute(ctx, T, 1, 0, 2, 3));     // {b, c, L}
    ggml_tensor* R = ggml_mul_mat(ctx, w1, Tt);                             // {a, c, L}
    ggml_tensor* O = ggml_cont(ctx, ggml_permute(ctx, R, 1, 0, 2, 3));      // {c, a, L}
    ggml_tensor* y = ggml_reshape_4d(ctx, O, a * c, x->ne[1], x->ne[2], x->ne[3]);
    return s == 1.0f ? y : ggml_scale(ctx, y, s);
}

}  // namespace

ggml_tensor* low_rank_term(ggml_context* ctx, ggml_tensor* x, ggml_tensor* down, ggml_tensor* up, float s) {
    if (down->ne[0] != x->ne[0] || up->ne[0] != down->ne[1])
        fail(ErrorKind::InvalidInput, "LoRA term: input {} down {} up {} disagree", ne_str(x), ne_str(down), ne_str(up));
    ggml_tensor* h = ggml_mul_mat(ctx, down, x);  // {r, ...}
    if (s != 1.0f) h = ggml_scale(ctx, h, s);
    return ggml_mul_mat(ctx, up, h);              // {out, ...}
}

ggml_tensor* patched_linear(ggml_context* ctx, ggml_tensor* x, ggml_tensor* w, ggml_tensor* b, const Terms& t) {
    if (x->ne[0] != w->ne[0]) fail(ErrorKind::InvalidInput, "linear: input {} for weight {}", ne_str(x), ne_str(w));
    ggml_tensor* y = ggml_mul_mat(ctx, w, scale_features(ctx, x, t.base_in_scale, false));
    y = scale_features(ctx, y, t.base_out_scale, false);
    for (const Term& term : t.terms) {
        ggml_tensor* xi = scale_features(ctx, x, term.in_scale, false);
        ggml_tensor* d = nullptr;
        switch (term.kind) {
            case Term::Kind::LowRank: d = low_rank_term(ctx, xi, term.down, term.up, term.scale); break;
            case Term::Kind::Dense:
                if (!term.delta) continue;  // a bias-only update
                if (term.delta->ne[0] != x->ne[0] || term.delta->ne[1] != w->ne[1])
                    fail(ErrorKind::InvalidInput, "LoRA dense update {} for weight {}", ne_str(term.delta), ne_str(w));
                d = ggml_mul_mat(ctx, term.delta, xi);
                if (term.scale != 1.0f) d = ggml_scale(ctx, d, term.scale);
                break;
            case Term::Kind::Kron: d = kron_term(ctx, xi, term.w1, term.w2, term.scale); break;
        }
        if (d->ne[0] != y->ne[0]) fail(ErrorKind::InvalidInput, "LoRA update {} for output {}", ne_str(d), ne_str(y));
        y = ggml_add(ctx, y, scale_features(ctx, d, term.out_scale, false));
    }
    if (b) y = ggml_add(ctx, y, b);
    return y;
}

ggml_tensor* conv2d(ggml_context* ctx, ggml_tensor* x, ggml_tensor* k, int stride, int padding) {
    const int64_t kw = k->ne[0], kh = k->ne[1], in = k->ne[2], out = k->ne[3];
    if (x->ne[2] != in) fail(ErrorKind::InvalidInput, "conv: input {} for kernel {}", ne_str(x), ne_str(k));
    if (x->ne[0] + 2 * padding < kw || x->ne[1] + 2 * padding < kh)
        fail(ErrorKind::InvalidInput, "conv: kernel {} does not fit input {}", ne_str(k), ne_str(x));
    if (kw == 1 && kh == 1 && stride == 1 && padding == 0) {
        ggml_tensor* xt = ggml_cont(ctx, ggml_permute(ctx, x, 1, 2, 0, 3));            // {C, W, H, N}
        ggml_tensor* y = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, k, in, out), xt);       // {out, W, H, N}
        return ggml_cont(ctx, ggml_permute(ctx, y, 2, 0, 1, 3));                        // {W, H, out, N}
    }
    ggml_tensor* cols = ggml_im2col(ctx, k, x, stride, stride, padding, padding, 1, 1, true, k->type);
    ggml_tensor* m = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, cols, cols->ne[0], cols->ne[1] * cols->ne[2] * cols->ne[3]),
                                  ggml_reshape_2d(ctx, k, kw * kh * in, out));
    ggml_tensor* y = ggml_reshape_4d(ctx, m, cols->ne[1], cols->ne[2], cols->ne[3], out);  // {OW, OH, N, out}
    return ggml_cont(ctx, ggml_permute(ctx, y, 0, 1, 3, 2));                               // {OW, OH, out, N}
}

ggml_tensor* patched_conv2d(ggml_context* ctx, ggml_tensor* x, ggml_tensor* kernel, ggml_tensor* b, int stride, int padding,
                            const Terms& t) {
    ggml_tensor* y = conv2d(ctx, scale_features(ctx, x, t.base_in_scale, true), kernel, stride, padding);
    y = scale_features(ctx, y, t.base_out_scale, true);
    for (const Term& term : t.terms) {
        ggml_tensor* xi = scale_features(ctx, x, term.in_scale, true);
        ggml_tensor* d = nullptr;
        if (term.kind == Term::Kind::LowRank) {
            ggml_tensor* up = term.up;
            const int64_t r_up = ggml_nelements(up) / kernel->ne[3];
            up = ggml_reshape_4d(ctx, up, 1, 1, r_up, kernel->ne[3]);
            ggml_tensor* h;
            if (term.mid) {
                h = conv2d(ctx, xi, term.down, 1, 0);
                h = conv2d(ctx, h, term.mid, stride, padding);
            } else {
                h = conv2d(ctx, xi, term.down, stride, padding);
            }
            if (term.scale != 1.0f) h = ggml_scale(ctx, h, term.scale);
            d = conv2d(ctx, h, up, 1, 0);
        } else if (term.kind == Term::Kind::Dense) {
            if (!term.delta) continue;
            d = conv2d(ctx, xi, term.delta, stride, padding);
            if (term.scale != 1.0f) d = ggml_scale(ctx, d, term.scale);
        } else {
            fail(ErrorKind::InvalidInput, "a factored LoKr update on a convolution must be given as a dense update");
        }
        y = ggml_add(ctx, y, scale_features(ctx, d, term.out_scale, true));
    }
    if (b) y = ggml_add(ctx, y, ggml_reshape_4d(ctx, b, 1, 1, kernel->ne[3], 1));
    return y;
}

ggml_tensor* loha_delta_graph(ggml_context* ctx, ggml_tensor* w1a, ggml_tensor* w1b, ggml_tensor* w2a, ggml_tensor* w2b) {
    // PyTorch w_a [out, r] is ggml {r, out}; w_b [r, in] is {in, r}: (w_a @ w_b) as ggml {in, out} = mul_mat(w_b^T {r, in}, w_a {r, out})
    auto prod = [&](ggml_tensor* a, ggml_tensor* b) {
        return ggml_mul_mat(ctx, ggml_cont(ctx, ggml_transpose(ctx, f32(ctx, b))), f32(ctx, a));
    };
    return ggml_mul(ctx, prod(w1a, w1b), prod(w2a, w2b));
}

ggml_tensor* kron_graph(ggml_context* ctx, ggml_tensor* w1, ggml_tensor* w2) {
    const int64_t b = w1->ne[0], a = w1->ne[1], d = w2->ne[0], c = w2->ne[1];
    ggml_tensor* r2 = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, f32(ctx, w2), d, 1, c, 1), d, b, c, a);
    ggml_tensor* k = ggml_mul(ctx, r2, ggml_reshape_4d(ctx, f32(ctx, w1), 1, b, 1, a));  // {d, b, c, a}
    return ggml_reshape_2d(ctx, k, b * d, a * c);
}

// ---------------------------------------------------------------------------------- host side

HostTerm prepare_term(const LoraFile& f, const Patch& p, const Target& t, const std::vector<Destination>& dest) {
    HostTerm h;
    const int64_t rows = t.shape[0], row_elems = t.row_elems();
    const bool exact = dest.size() == 1 && dest[0].rows.src_begin == 0 && dest[0].rows.dst_begin == 0 &&
                       dest[0].rows.src_end == rows && p.out_rows() == rows;
    auto place = [&](const Tensor& src, int64_t per_row) {
        Tensor o;
        o.shape = {rows, per_row};
        o.data.assign((size_t)(rows * per_row), 0.0f);
        for (const Destination& d : dest)
            for (int64_t r = d.rows.src_begin; r < d.rows.src_end; ++r)
                std::copy_n(src.data.begin() + r * per_row, per_row, o.data.begin() + (d.rows.dst_begin + r - d.rows.src_begin) * per_row);
        return o;
    };
    Tensor bias = patch_bias_delta(f, p);
    if (!bias.data.empty()) {
        h.bias = place(bias, 1);
        h.bias.shape = {rows};
    }
    if (p.kind == PatchKind::LoRA) {
        h.kind = Term::Kind::LowRank;
        h.scale = f.scale(p);
        h.down = f.read(p.down);
        if (!p.mid.empty()) h.mid = f.read(p.mid);
        Tensor up = f.read(p.up);
        const int64_t r = up.shape[1];
        up.shape = {up.shape[0], r};
        h.up = exact ? up : place(up, r);
        return h;
    }
    if (p.kind == PatchKind::LoKr && exact && t.shape.size() == 2 && p.lokr_t2.empty() && p.delta_shape.size() == 2) {
        h.kind = Term::Kind::Kron;
        h.scale = f.scale(p);
        h.w1 = p.lokr_w1.empty() ? matmul(f.read(p.lokr_w1_a), f.read(p.lokr_w1_b)) : f.read(p.lokr_w1);
        h.w2 = p.lokr_w2.empty() ? matmul(f.read(p.lokr_w2_a), f.read(p.lokr_w2_b)) : f.read(p.lokr_w2);
        return h;
    }
    h.kind = Term::Kind::Dense;
    Tensor d = patch_delta(f, p);
    if (d.data.empty()) return h;  // bias only
    if (d.numel() != p.out_rows() * row_elems)
        fail(ErrorKind::InvalidInput, "{}: update {} of '{}' does not fit {} {}", f.what(), shape_str(d.shape), p.module, t.name,
             shape_str(t.shape));
    h.delta = place(d, row_elems);
    h.delta.shape = t.shape;
    return h;
}

DoraScales dora_runtime_scales(const Tensor& w, const std::vector<DoraUpdate>& ups) {
    if (w.shape.size() < 2) fail(ErrorKind::InvalidInput, "DoRA needs a weight of at least 2 dims, got {}", shape_str(w.shape));
    const int64_t rows = w.shape[0], in = w.shape[1], row_elems = w.numel() / rows, kk = row_elems / in;
    const size_t n = ups.size();
    // factor (f) and c = 1 - m + m f of each DoRA update, and its axis
    std::vector<std::vector<float>> fac(n), cfac(n);
    std::vector<int> axis(n, 0);  // 0 none, 1 out, 2 in
    Tensor cur = w;                // W_{k-1}
    for (size_t k = 0; k < n; ++k) {
        const Tensor& d = *ups[k].delta;
        if (d.numel() != w.numel()) fail(ErrorKind::InvalidInput, "DoRA scales: update {} for weight {}", shape_str(d.shape), shape_str(w.shape));
        const float m = ups[k].m;
        if (!ups[k].magnitude) {
            for (size_t i = 0; i < cur.data.size(); ++i) cur.data[i] += m * d.data[i];
            continue;
        }
        const Tensor& g = *ups[k].magnitude;
        const bool out_axis = g.numel() == rows && g.shape[0] == rows;
        const bool in_axis = !out_axis && g.numel() == in && g.shape.size() >= 2 && g.shape[0] == 1;
        if (!out_axis && !in_axis) fail(ErrorKind::InvalidInput, "DoRA magnitude {} for weight {}", shape_str(g.shape), shape_str(w.shape));
        axis[k] = out_axis ? 1 : 2;
        const int64_t nf = out_axis ? rows : in;
        std::vector<double> ss((size_t)nf, 0.0);
        for (int64_t o = 0; o < rows; ++o)
            for (int64_t c = 0; c < in; ++c)
                for (int64_t e = 0; e < kk; ++e) {
                    const size_t i = (size_t)((o * in + c) * kk + e);
                    const double v = (double)cur.data[i] + d.data[i];
                    ss[(size_t)(out_axis ? o : c)] += v * v;
                }
        fac[k].resize((size_t)nf);
        cfac[k].resize((size_t)nf);
        for (int64_t j = 0; j < nf; ++j) {
            const double norm = std::sqrt(ss[(size_t)j]);
            fac[k][(size_t)j] = norm > 0 ? (float)(g.data[(size_t)j] / norm) : 1.0f;
            cfac[k][(size_t)j] = 1.0f - m + m * fac[k][(size_t)j];
        }
        // W_k = W_{k-1} + m (f (W_{k-1} + d) - W_{k-1})
        for (int64_t o = 0; o < rows; ++o)
            for (int64_t c = 0; c < in; ++c)
                for (int64_t e = 0; e < kk; ++e) {
                    const size_t i = (size_t)((o * in + c) * kk + e);
                    const float fv = fac[k][(size_t)(out_axis ? o : c)];
                    cur.data[i] += m * ((cur.data[i] + d.data[i]) * fv - cur.data[i]);
                }
    }
    // products of the c factors of the DoRA updates after each position
    DoraScales s;
    s.in.resize(n);
    s.out.resize(n);
    auto mul_into = [](std::vector<float>& acc, const std::vector<float>& v) {
        if (acc.empty()) acc = v;
        else
            for (size_t i = 0; i < acc.size(); ++i) acc[i] *= v[i];
    };
    std::vector<float> after_in, after_out;  // products over updates > k
    for (size_t kk2 = n; kk2-- > 0;) {
        s.in[kk2] = after_in;
        s.out[kk2] = after_out;
        if (axis[kk2] == 1) mul_into(s.out[kk2], fac[kk2]);
        if (axis[kk2] == 2) mul_into(s.in[kk2], fac[kk2]);
        if (axis[kk2] == 1) mul_into(after_out, cfac[kk2]);
        if (axis[kk2] == 2) mul_into(after_in, cfac[kk2]);
    }
    s.base_in = after_in;
    s.base_out = after_out;
    return s;
}

}  // namespace easel::lora
