// LoRA math on host F32 tensors (see math.h for the formulas and their sources).
#include "lora/math.h"

#include "core/error.h"

#include <fmt/ranges.h>

#include <cmath>
#include <cstring>

namespace easel::lora {

namespace {

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int64_t prod(const std::vector<int64_t>& s, size_t from = 0) {
    int64_t n = 1;
    for (size_t i = from; i < s.size(); ++i) n *= s[i];
    return n;
}

void scale_in_place(Tensor& t, float s) {
    if (s == 1.0f) return;
    for (float& v : t.data) v *= s;
}

// t with its dims after the first flattened: [d0, rest]
Tensor as_2d(const Tensor& t) {
    Tensor r;
    r.shape = {t.shape.empty() ? 1 : t.shape[0], t.shape.empty() ? 1 : prod(t.shape, 1)};
    r.data = t.data;
    return r;
}

Tensor transpose_2d(const Tensor& t) {
    const int64_t m = t.shape[0], n = prod(t.shape, 1);
    Tensor r;
    r.shape = {n, m};
    r.data.resize(t.data.size());
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) r.data[(size_t)(j * m + i)] = t.data[(size_t)(i * n + j)];
    return r;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
    if (a.shape.empty() || b.shape.empty()) fail(ErrorKind::InvalidInput, "matmul of a scalar");
    const int64_t m = a.shape[0], k = prod(a.shape, 1);
    if (b.shape[0] != k)
        fail(ErrorKind::InvalidInput, "matmul: {} @ {} (inner sizes {} and {} differ)", shape_str(a.shape), shape_str(b.shape), k, b.shape[0]);
    const int64_t n = prod(b.shape, 1);
    Tensor r;
    r.shape = {m};
    for (size_t i = 1; i < b.shape.size(); ++i) r.shape.push_back(b.shape[i]);
    r.data.assign((size_t)(m * n), 0.0f);
    std::vector<double> acc((size_t)n);
    for (int64_t i = 0; i < m; ++i) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t p = 0; p < k; ++p) {
            const double av = a.data[(size_t)(i * k + p)];
            if (av == 0.0) continue;
            const float* br = b.data.data() + p * n;
            for (int64_t j = 0; j < n; ++j) acc[(size_t)j] += av * br[j];
        }
        for (int64_t j = 0; j < n; ++j) r.data[(size_t)(i * n + j)] = (float)acc[(size_t)j];
    }
    return r;
}

Tensor lora_delta(const Tensor& up, const Tensor& down, const Tensor* mid, float s) {
    Tensor up2 = as_2d(up);  // [out, r] (a conv up is [out, r, 1, 1])
    Tensor r;
    if (!mid) {
        r = matmul(up2, down);  // [out, in(, kh, kw)]
    } else {
        // M[i, c, y, x] = sum_j mid[i, j, y, x] down[j, c]; delta = up @ M
        if (mid->shape.size() != 4) fail(ErrorKind::InvalidInput, "LoRA mid {} is not 4-D", shape_str(mid->shape));
        const int64_t ri = mid->shape[0], rj = mid->shape[1], kk = mid->shape[2] * mid->shape[3];
        const int64_t in = down.shape.size() > 1 ? down.shape[1] : 0;
        if (down.shape[0] != rj || prod(down.shape, 1) != in)
            fail(ErrorKind::InvalidInput, "LoRA mid {} and down {} disagree", shape_str(mid->shape), shape_str(down.shape));
        Tensor m;
        m.shape = {ri, in, mid->shape[2], mid->shape[3]};
        m.data.assign((size_t)(ri * in * kk), 0.0f);
        for (int64_t i = 0; i < ri; ++i)
            for (int64_t c = 0; c < in; ++c)
                for (int64_t q = 0; q < kk; ++q) {
                    double acc = 0;
                    for (int64_t j = 0; j < rj; ++j)
                        acc += (double)mid->data[(size_t)((i * rj + j) * kk + q)] * down.data[(size_t)(j * in + c)];
                    m.data[(size_t)((i * in + c) * kk + q)] = (float)acc;
                }
        r = matmul(up2, m);
    }
    scale_in_place(r, s);
    return r;
}

Tensor tucker_rebuild(const Tensor& t, const Tensor& w_a, const Tensor& w_b) {
    if (t.shape.size() < 2 || w_a.shape.size() != 2 || w_b.shape.size() != 2 || t.shape[0] != w_a.shape[0] || t.shape[1] != w_b.shape[0])
        fail(ErrorKind::InvalidInput, "Tucker core {} does not fit factors {} and {}", shape_str(t.shape), shape_str(w_a.shape),
             shape_str(w_b.shape));
    const int64_t r1 = t.shape[0], r2 = t.shape[1], kk = prod(t.shape, 2), q = w_b.shape[1];
    // tmp[i, q, ...] = sum_j t[i, j, ...] w_b[j, q]
    Tensor tmp;
    tmp.shape = {r1, q, kk};
    tmp.data.assign((size_t)(r1 * q * kk), 0.0f);
    for (int64_t i = 0; i < r1; ++i)
        for (int64_t c = 0; c < q; ++c)
            for (int64_t e = 0; e < kk; ++e) {
                double acc = 0;
                for (int64_t j = 0; j < r2; ++j) acc += (double)t.data[(size_t)((i * r2 + j) * kk + e)] * w_b.data[(size_t)(j * q + c)];
                tmp.data[(size_t)((i * q + c) * kk + e)] = (float)acc;
            }
    // out[p, q, ...] = sum_i w_a[i, p] tmp[i, q, ...]
    Tensor out = matmul(transpose_2d(w_a), tmp);
    out.shape = {w_a.shape[1], q};
    for (size_t i = 2; i < t.shape.size(); ++i) out.shape.push_back(t.shape[i]);
    return out;
}

Tensor loha_delta(const Tensor& w1a, const Tensor& w1b, const Tensor& w2a, const Tensor& w2b, const Tensor* t1, const Tensor* t2,
                  float s) {
    if ((t1 == nullptr) != (t2 == nullptr)) fail(ErrorKind::InvalidInput, "LoHa Tucker needs both cores");
    Tensor m1 = t1 ? tucker_rebuild(*t1, w1a, w1b) : matmul(w1a, w1b);
    Tensor m2 = t2 ? tucker_rebuild(*t2, w2a, w2b) : matmul(w2a, w2b);
    if (m1.shape != m2.shape)
        fail(ErrorKind::InvalidInput, "LoHa halves {} and {} differ in shape", shape_str(m1.shape), shape_str(m2.shape));
    for (size_t i = 0; i < m1.data.size(); ++i) m1.data[i] = m1.data[i] * m2.data[i] * s;
    return m1;
}

Tensor lokr_delta(const Tensor& w1, const Tensor& w2, float s) {
    if (w1.shape.size() != 2 || (w2.shape.size() != 2 && w2.shape.size() != 4))
        fail(ErrorKind::InvalidInput, "LoKr factors {} and {} are not 2-D / 4-D", shape_str(w1.shape), shape_str(w2.shape));
    const int64_t a = w1.shape[0], b = w1.shape[1], c = w2.shape[0], d = w2.shape[1], kk = prod(w2.shape, 2);
    Tensor r;
    r.shape = {a * c, b * d};
    if (w2.shape.size() == 4) {
        r.shape.push_back(w2.shape[2]);
        r.shape.push_back(w2.shape[3]);
    }
    r.data.resize((size_t)(a * c * b * d * kk));
    for (int64_t i1 = 0; i1 < a; ++i1)
        for (int64_t i2 = 0; i2 < c; ++i2)
            for (int64_t j1 = 0; j1 < b; ++j1) {
                const float v1 = w1.data[(size_t)(i1 * b + j1)];
                for (int64_t j2 = 0; j2 < d; ++j2)
                    for (int64_t e = 0; e < kk; ++e)
                        r.data[(size_t)((((i1 * c + i2) * (b * d)) + j1 * d + j2) * kk + e)] =
                            v1 * w2.data[(size_t)((i2 * d + j2) * kk + e)] * s;
            }
    return r;
}

Tensor patch_delta(const LoraFile& f, const Patch& p) {
    const float s = f.scale(p);
    switch (p.kind) {
        case PatchKind::LoRA: {
            Tensor up = f.read(p.up), down = f.read(p.down);
            if (p.mid.empty()) return lora_delta(up, down, nullptr, s);
            Tensor mid = f.read(p.mid);
            return lora_delta(up, down, &mid, s);
        }
        case PatchKind::LoHa: {
            Tensor w1a = f.read(p.hada_w1_a), w1b = f.read(p.hada_w1_b), w2a = f.read(p.hada_w2_a), w2b = f.read(p.hada_w2_b);
            if (p.hada_t1.empty()) return loha_delta(w1a, w1b, w2a, w2b, nullptr, nullptr, s);
            Tensor t1 = f.read(p.hada_t1), t2 = f.read(p.hada_t2);
            return loha_delta(w1a, w1b, w2a, w2b, &t1, &t2, s);
        }
        case PatchKind::LoKr: {
            Tensor w1 = p.lokr_w1.empty() ? matmul(f.read(p.lokr_w1_a), f.read(p.lokr_w1_b)) : f.read(p.lokr_w1);
            Tensor w2;
            if (!p.lokr_w2.empty()) w2 = f.read(p.lokr_w2);
            else if (!p.lokr_t2.empty()) w2 = tucker_rebuild(f.read(p.lokr_t2), f.read(p.lokr_w2_a), f.read(p.lokr_w2_b));
            else w2 = matmul(f.read(p.lokr_w2_a), f.read(p.lokr_w2_b));
            return lokr_delta(w1, w2, s);
        }
        case PatchKind::Diff:
            return p.diff.empty() ? Tensor{} : f.read(p.diff);
    }
    return {};
}

Tensor patch_bias_delta(const LoraFile& f, const Patch& p) {
    if (p.kind == PatchKind::Diff) return p.diff_b.empty() ? Tensor{} : f.read(p.diff_b);
    if (p.bias.empty()) return {};
    Tensor b = f.read(p.bias);
    scale_in_place(b, f.scale(p));
    return b;
}

void merge_rows(std::span<float> w, int64_t rows, int64_t row_elems, const Tensor& delta, const RowSlice& sl, float m) {
    const int64_t d_rows = delta.shape.empty() ? 0 : delta.shape[0];
    const int64_t n = sl.src_end - sl.src_begin;
    if ((int64_t)w.size() != rows * row_elems || delta.numel() != d_rows * row_elems || sl.src_begin < 0 || n <= 0 ||
        sl.src_end > d_rows || sl.dst_begin < 0 || sl.dst_begin + n > rows)
        fail(ErrorKind::InvalidInput, "LoRA merge: update {} rows [{}, {}) do not fit a weight of {} rows x {} (at row {})",
             shape_str(delta.shape), sl.src_begin, sl.src_end, rows, row_elems, sl.dst_begin);
    const float* src = delta.data.data() + sl.src_begin * row_elems;
    float* dst = w.data() + sl.dst_begin * row_elems;
    for (int64_t i = 0; i < n * row_elems; ++i) dst[i] += m * src[i];
}

void merge_dora(std::span<float> w, const std::vector<int64_t>& w_shape, const Tensor& delta, const RowSlice& sl, const Tensor& g,
                float m) {
    if (w_shape.size() < 2) fail(ErrorKind::InvalidInput, "DoRA needs a weight of at least 2 dims, got {}", shape_str(w_shape));
    const int64_t rows = w_shape[0], in = w_shape[1], row_elems = prod(w_shape, 1), kk = prod(w_shape, 2);
    const int64_t d_rows = delta.shape.empty() ? 0 : delta.shape[0];
    const int64_t n = sl.src_end - sl.src_begin;
    if ((int64_t)w.size() != rows * row_elems || delta.numel() != d_rows * row_elems || sl.src_begin < 0 || n <= 0 ||
        sl.src_end > d_rows || sl.dst_begin < 0 || sl.dst_begin + n > rows)
        fail(ErrorKind::InvalidInput, "DoRA merge: update {} does not fit weight {}", shape_str(delta.shape), shape_str(w_shape));
    auto ones_after = [&](size_t from) {
        for (size_t i = from; i < g.shape.size(); ++i)
            if (g.shape[i] != 1) return false;
        return true;
    };
    const bool out_axis = !g.shape.empty() && g.shape[0] == d_rows && ones_after(1);
    const bool in_axis = !out_axis && g.shape.size() >= 2 && g.shape[0] == 1 && g.shape[1] == in && ones_after(2);
    if (!out_axis && !in_axis)
        fail(ErrorKind::InvalidInput, "DoRA magnitude {} fits neither the {} output rows nor the {} input channels of the update {}",
             shape_str(g.shape), d_rows, in, shape_str(delta.shape));
    const float* dsrc = delta.data.data() + sl.src_begin * row_elems;
    float* wdst = w.data() + sl.dst_begin * row_elems;
    if (out_axis) {
        std::vector<float> v((size_t)row_elems);
        for (int64_t r = 0; r < n; ++r) {
            float* wr = wdst + r * row_elems;
            double ss = 0;
            for (int64_t e = 0; e < row_elems; ++e) {
                v[(size_t)e] = wr[e] + dsrc[r * row_elems + e];
                ss += (double)v[(size_t)e] * v[(size_t)e];
            }
            const double norm = std::sqrt(ss);
            const float f = norm > 0 ? (float)(g.data[(size_t)(sl.src_begin + r)] / norm) : 1.0f;
            for (int64_t e = 0; e < row_elems; ++e) wr[e] += m * (v[(size_t)e] * f - wr[e]);
        }
        return;
    }
    if (sl.src_begin != 0 || n != rows || sl.dst_begin != 0)
        fail(ErrorKind::InvalidInput,
             "DoRA with a per-input-channel magnitude {} patches rows [{}, {}) of a fused weight of {} rows: the norm would span "
             "modules the LoRA does not patch",
             shape_str(g.shape), sl.dst_begin, sl.dst_begin + n, rows);
    std::vector<float> v(w.size());
    std::vector<double> ss((size_t)in, 0.0);
    for (int64_t o = 0; o < rows; ++o)
        for (int64_t c = 0; c < in; ++c)
            for (int64_t e = 0; e < kk; ++e) {
                const size_t i = (size_t)((o * in + c) * kk + e);
                v[i] = w[i] + dsrc[i];
                ss[(size_t)c] += (double)v[i] * v[i];
            }
    for (int64_t o = 0; o < rows; ++o)
        for (int64_t c = 0; c < in; ++c) {
            const double norm = std::sqrt(ss[(size_t)c]);
            const float f = norm > 0 ? (float)(g.data[(size_t)c] / norm) : 1.0f;
            for (int64_t e = 0; e < kk; ++e) {
                const size_t i = (size_t)((o * in + c) * kk + e);
                w[i] += m * (v[i] * f - w[i]);
            }
        }
}

std::vector<float> to_f32(std::span<const uint8_t> bytes, ggml_type type, int64_t numel) {
    if (type >= GGML_TYPE_COUNT) fail(ErrorKind::InvalidInput, "weight of unknown ggml type {}", (int)type);
    const int64_t blck = ggml_blck_size(type);
    if (numel % blck != 0 || bytes.size() != (size_t)(numel / blck) * ggml_type_size(type))
        fail(ErrorKind::InvalidInput, "{} bytes of {} do not hold {} values", bytes.size(), ggml_type_name(type), numel);
    std::vector<float> out((size_t)numel);
    if (type == GGML_TYPE_F32) {
        std::memcpy(out.data(), bytes.data(), bytes.size());
        return out;
    }
    const ggml_type_traits* tr = ggml_get_type_traits(type);
    if (!tr || !tr->to_float) fail(ErrorKind::Unsupported, "weights of type {} cannot be read as F32", ggml_type_name(type));
    tr->to_float(bytes.data(), out.data(), numel);
    return out;
}

std::vector<uint8_t> from_f32(std::span<const float> v, ggml_type type, int64_t row_len) {
    const int64_t n = (int64_t)v.size();
    if (row_len <= 0 || n % row_len != 0) fail(ErrorKind::InvalidInput, "{} values are not rows of {}", n, row_len);
    std::vector<uint8_t> out;
    switch (type) {
        case GGML_TYPE_F32:
            out.resize((size_t)n * 4);
            std::memcpy(out.data(), v.data(), out.size());
            return out;
        case GGML_TYPE_F16:
            out.resize((size_t)n * 2);
            ggml_fp32_to_fp16_row(v.data(), reinterpret_cast<ggml_fp16_t*>(out.data()), n);
            return out;
        case GGML_TYPE_BF16:
            out.resize((size_t)n * 2);
            ggml_fp32_to_bf16_row_ref(v.data(), reinterpret_cast<ggml_bf16_t*>(out.data()), n);
            return out;
        default: break;
    }
    if (type >= GGML_TYPE_COUNT || !ggml_is_quantized(type))
        fail(ErrorKind::Unsupported, "cannot write LoRA-patched weights as {}", type < GGML_TYPE_COUNT ? ggml_type_name(type) : "?");
    if (ggml_quantize_requires_imatrix(type))
        fail(ErrorKind::Unsupported, "re-quantising to {} needs an importance matrix; apply the LoRA at run time instead",
             ggml_type_name(type));
    if (row_len % ggml_blck_size(type) != 0)
        fail(ErrorKind::Unsupported, "rows of {} values cannot be quantised as {} (blocks of {})", row_len, ggml_type_name(type),
             ggml_blck_size(type));
    const int64_t rows = n / row_len;
    out.resize(ggml_row_size(type, row_len) * (size_t)rows);
    ggml_quantize_chunk(type, v.data(), out.data(), 0, rows, row_len, nullptr);
    return out;
}

}  // namespace easel::lora
