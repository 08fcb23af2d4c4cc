// Common layers (see layers.h).
#include "nn/layers.h"

#include "core/error.h"
#include "nn/weight_patch.h"

#include <cmath>

namespace easel::nn {

namespace {

std::string ne_str(const ggml_tensor* t) {
    return fmt::format("{{{}, {}, {}, {}}}", t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
}

void need_tensor(const Param* p, const char* what) {
    if (!p || !p->tensor) fail(ErrorKind::Internal, "{}: parameter not loaded (call ParamBuffer::load first)", what);
}

}  // namespace

ggml_tensor* weight_matmul(Ctx& c, const Param& p, ggml_tensor* w, ggml_tensor* x, int64_t row_begin, WeightSide side) {
    ggml_tensor* y = side == WeightSide::First ? ggml_mul_mat(c.ctx, w, x) : ggml_mul_mat(c.ctx, x, w);
    // a run-time term bound to the weight (weight_patch.h: a LoRA's s B (A x)), for the rows w holds
    if (const RuntimeUpdate* u = runtime_update(p)) y = u->apply(c.ctx, x, y, row_begin, w->ne[1], side == WeightSide::First);
    return y;
}

// ---------------------------------------------------------------- Linear

Linear::Linear(int64_t in_, int64_t out_, bool bias) : in(in_), out(out_) {
    w = &param("weight", {out, in}, ParamRole::Weight);
    if (bias) b = &param("bias", {out}, ParamRole::Bias);
}

ggml_tensor* Linear::forward(Ctx& c, ggml_tensor* x) const {
    need_tensor(w, "Linear");
    if (x->ne[0] != in) fail(ErrorKind::InvalidInput, "Linear expects {} input features (ne[0]), got tensor {}", in, ne_str(x));
    ggml_tensor* y = weight_matmul(c, *w, w->tensor, x);
    if (b && b->tensor) y = ggml_add(c.ctx, y, b->tensor);
    return y;
}

// ---------------------------------------------------------------- Conv2d

Conv2d::Conv2d(int64_t in_, int64_t out_, int kernel_, int stride_, int padding_, bool bias)
    : in(in_), out(out_), kernel(kernel_), stride(stride_), padding(padding_) {
    w = &param("weight", {out, in, kernel, kernel}, ParamRole::ConvWeight);
    if (bias) b = &param("bias", {out}, ParamRole::Bias);
}

ggml_tensor* Conv2d::direct_conv(Ctx& c, ggml_tensor* x) const {
    // a run-time LoRA term is added where the weight meets its input (weight_matmul): im2col keeps it
    if (!direct || runtime_update(*w)) return nullptr;
    ggml_tensor* in_x = ggml_is_contiguous(x) ? x : ggml_cont(c.ctx, x);
    ggml_tensor* d = ggml_conv_2d_direct(c.ctx, w->tensor, in_x, stride, stride, padding, padding, 1, 1);
    // an unsupported node is left unused (not part of the graph); im2col follows
    if (c.backend && !ggml_backend_supports_op(c.backend, d)) return nullptr;
    return d;
}

ggml_tensor* Conv2d::forward(Ctx& c, ggml_tensor* x) const {
    need_tensor(w, "Conv2d");
    if (x->ne[2] != in) fail(ErrorKind::InvalidInput, "Conv2d expects {} input channels (ne[2]), got tensor {}", in, ne_str(x));
    const int64_t ow = (x->ne[0] + 2 * padding - kernel) / stride + 1;
    const int64_t oh = (x->ne[1] + 2 * padding - kernel) / stride + 1;
    if (x->ne[0] + 2 * padding < kernel || x->ne[1] + 2 * padding < kernel || ow <= 0 || oh <= 0)
        fail(ErrorKind::InvalidInput, "Conv2d kernel {} does not fit image {}x{} with padding {}", kernel, x->ne[0], x->ne[1], padding);
    if (w->tensor->type != GGML_TYPE_F32 && w->tensor->type != GGML_TYPE_F16)
        fail(ErrorKind::Internal, "Conv2d kernel must be F32 or F16, got {}", ggml_type_name(w->tensor->type));
    ggml_tensor* y;
    if (kernel == 1 && stride == 1 && padding == 0) {
        // 1x1 convolution is a matmul over channels: {W*H, C, N} x {C, out}
        ggml_tensor* xt = ggml_cont(c.ctx, ggml_permute(c.ctx, x, 1, 2, 0, 3));  // {C, W, H, N}
        ggml_tensor* w2 = ggml_reshape_2d(c.ctx, w->tensor, in, out);
        y = weight_matmul(c, *w, w2, xt);                                      // {out, W, H, N}
        y = ggml_cont(c.ctx, ggml_permute(c.ctx, y, 2, 0, 1, 3));              // {W, H, out, N}
    } else if (ggml_tensor* d = direct_conv(c, x); d) {
        y = d;  // {OW, OH, out, N}
    } else {
        // im2col in the kernel's type (ggml_conv_2d would always round the data to F16), then
        // one matmul: {K*K*C, OW*OH*N} x {K*K*C, out} -> {OW*OH*N, out}
        ggml_tensor* cols = ggml_im2col(c.ctx, w->tensor, x, stride, stride, padding, padding, 1, 1, true, w->tensor->type);
        ggml_tensor* m = weight_matmul(c, *w,
                                       ggml_reshape_2d(c.ctx, w->tensor, w->tensor->ne[0] * w->tensor->ne[1] * w->tensor->ne[2],
                                                       w->tensor->ne[3]),
                                       ggml_reshape_2d(c.ctx, cols, cols->ne[0], cols->ne[1] * cols->ne[2] * cols->ne[3]), 0, WeightSide::Second);
        y = ggml_reshape_4d(c.ctx, m, cols->ne[1], cols->ne[2], cols->ne[3], out);  // {OW, OH, N, out}
        y = ggml_cont(c.ctx, ggml_permute(c.ctx, y, 0, 1, 3, 2));                     // {OW, OH, out, N}
    }
    if (b && b->tensor) y = ggml_add(c.ctx, y, ggml_reshape_4d(c.ctx, b->tensor, 1, 1, out, 1));
    return y;
}

int set_conv_direct(Block& root, bool direct) {
    int n = 0;
    root.visit_blocks([&](Block& b) {
        if (auto* conv = dynamic_cast<Conv2d*>(&b)) {
            conv->direct = direct;
            ++n;
        }
    });
    return n;
}

// ---------------------------------------------------------------- GroupNorm

GroupNorm::GroupNorm(int groups_, int64_t channels_, float eps_, bool affine)
    : groups(groups_), channels(channels_), eps(eps_) {
    if (groups <= 0 || channels % groups != 0)
        fail(ErrorKind::InvalidInput, "GroupNorm: {} channels are not divisible into {} groups", channels, groups);
    if (affine) {
        w = &param("weight", {channels}, ParamRole::Norm);
        b = &param("bias", {channels}, ParamRole::Norm);
    }
}

ggml_tensor* GroupNorm::forward(Ctx& c, ggml_tensor* x) const {
    ggml_tensor* h = x;
    bool seq = false;
    if (x->ne[2] != channels) {
        if (x->ne[1] == channels && x->ne[3] == 1) {
            seq = true;  // {L, C, N} -> {L, 1, C, N}
            h = ggml_reshape_4d(c.ctx, ggml_cont(c.ctx, x), x->ne[0], 1, x->ne[1], x->ne[2]);
        } else {
            fail(ErrorKind::InvalidInput, "GroupNorm expects {} channels at ne[2] (or ne[1]), got tensor {}", channels, ne_str(x));
        }
    }
    if (!ggml_is_contiguous(h)) h = ggml_cont(c.ctx, h);
    h = ggml_group_norm(c.ctx, h, groups, eps);
    if (w && w->tensor) h = ggml_mul(c.ctx, h, ggml_reshape_4d(c.ctx, w->tensor, 1, 1, channels, 1));
    if (b && b->tensor) h = ggml_add(c.ctx, h, ggml_reshape_4d(c.ctx, b->tensor, 1, 1, channels, 1));
    if (seq) h = ggml_reshape_3d(c.ctx, h, x->ne[0], x->ne[1], x->ne[2]);
    return h;
}

// ---------------------------------------------------------------- LayerNorm / RMSNorm

LayerNorm::LayerNorm(int64_t dim_, float eps_, bool affine, bool bias) : dim(dim_), eps(eps_) {
    if (affine) {
        w = &param("weight", {dim}, ParamRole::Norm);
        if (bias) b = &param("bias", {dim}, ParamRole::Norm);
    }
}

ggml_tensor* LayerNorm::forward(Ctx& c, ggml_tensor* x) const {
    if (x->ne[0] != dim) fail(ErrorKind::InvalidInput, "LayerNorm over {} features (ne[0]), got tensor {}", dim, ne_str(x));
    ggml_tensor* h = ggml_norm(c.ctx, x, eps);
    if (w && w->tensor) h = ggml_mul(c.ctx, h, w->tensor);
    if (b && b->tensor) h = ggml_add(c.ctx, h, b->tensor);
    return h;
}

RMSNorm::RMSNorm(int64_t dim_, float eps_, bool affine) : dim(dim_), eps(eps_) {
    if (affine) w = &param("weight", {dim}, ParamRole::Norm);
}

ggml_tensor* RMSNorm::forward(Ctx& c, ggml_tensor* x) const {
    if (x->ne[0] != dim) fail(ErrorKind::InvalidInput, "RMSNorm over {} features (ne[0]), got tensor {}", dim, ne_str(x));
    ggml_tensor* h = ggml_rms_norm(c.ctx, x, eps);
    if (w && w->tensor) h = ggml_mul(c.ctx, h, w->tensor);
    return h;
}

// ---------------------------------------------------------------- Embedding

Embedding::Embedding(int64_t num_, int64_t dim_) : num(num_), dim(dim_) {
    w = &param("weight", {num, dim}, ParamRole::Embedding);
}

ggml_tensor* Embedding::forward(Ctx& c, ggml_tensor* ids) const {
    need_tensor(w, "Embedding");
    if (ids->type != GGML_TYPE_I32) fail(ErrorKind::InvalidInput, "Embedding ids must be I32, got {}", ggml_type_name(ids->type));
    if (ids->ne[2] != 1 || ids->ne[3] != 1) fail(ErrorKind::InvalidInput, "Embedding ids must be {{L, N}}, got {}", ne_str(ids));
    const int64_t L = ids->ne[0], N = ids->ne[1];
    ggml_tensor* flat = ggml_reshape_1d(c.ctx, ggml_is_contiguous(ids) ? ids : ggml_cont(c.ctx, ids), L * N);
    ggml_tensor* e = ggml_get_rows(c.ctx, w->tensor, flat);  // {dim, L*N}
    return ggml_reshape_3d(c.ctx, e, dim, L, N);
}

// ---------------------------------------------------------------- attention

ggml_tensor* attention(Ctx& c, ggml_tensor* q, ggml_tensor* k, ggml_tensor* v, int64_t n_heads_q, int64_t n_heads_kv,
                       ggml_tensor* mask) {
    if (n_heads_q <= 0 || n_heads_kv <= 0 || n_heads_q % n_heads_kv != 0)
        fail(ErrorKind::InvalidInput, "attention: {} query heads are not a multiple of {} key/value heads", n_heads_q, n_heads_kv);
    if (q->ne[0] % n_heads_q != 0)
        fail(ErrorKind::InvalidInput, "attention: query width {} is not divisible by {} heads", q->ne[0], n_heads_q);
    const int64_t D = q->ne[0] / n_heads_q;
    const int64_t Lq = q->ne[1], Lk = k->ne[1], N = q->ne[2];
    if (q->ne[3] != 1 || k->ne[3] != 1 || v->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "attention: q/k/v must be 3-D {{D*H, L, N}}, got q {} k {} v {}", ne_str(q), ne_str(k), ne_str(v));
    if (k->ne[0] != D * n_heads_kv || v->ne[0] != D * n_heads_kv || v->ne[1] != Lk || k->ne[2] != N || v->ne[2] != N)
        fail(ErrorKind::InvalidInput, "attention: shapes do not agree: q {} k {} v {} with {} query / {} kv heads", ne_str(q),
             ne_str(k), ne_str(v), n_heads_q, n_heads_kv);
    if (mask) {
        if (mask->type != GGML_TYPE_F32 && mask->type != GGML_TYPE_F16)
            fail(ErrorKind::InvalidInput, "attention: mask must be F32 or F16, got {}", ggml_type_name(mask->type));
        bool ok = mask->ne[0] == Lk && mask->ne[1] == Lq && mask->ne[2] == 1 && (mask->ne[3] == 1 || mask->ne[3] == N);
        if (!ok)
            fail(ErrorKind::InvalidInput, "attention: mask must be {{Lk={}, Lq={}}} or {{Lk, Lq, 1, N={}}}, got {}", Lk, Lq, N,
                 ne_str(mask));
    }
    const float scale = 1.0f / std::sqrt((float)D);
    ggml_context* ctx = c.ctx;
    // {D*H, L, N} -> {D, H, L, N} -> {D, L, H, N}
    auto heads = [&](ggml_tensor* t, int64_t h) {
        ggml_tensor* r = ggml_reshape_4d(ctx, ggml_is_contiguous(t) ? t : ggml_cont(ctx, t), D, h, t->ne[1], t->ne[2]);
        return ggml_permute(ctx, r, 0, 2, 1, 3);
    };
    ggml_tensor* qh = heads(q, n_heads_q);
    ggml_tensor* kh = heads(k, n_heads_kv);
    ggml_tensor* vh = heads(v, n_heads_kv);
    // a mask of {Lk, Lq, 1, N} is laid out as {Lk, Lq, 1, N}: matches the {.., H, N} broadcast of both paths
    if (c.flash_attn) {
        ggml_tensor* m = mask;
        if (m) {
            if (m->type != GGML_TYPE_F16) m = ggml_cast(ctx, m, GGML_TYPE_F16);
            else if (!ggml_is_contiguous(m)) m = ggml_cont(ctx, m);
        }
        auto fa = [&](ggml_tensor* kk, ggml_tensor* vv) {
            ggml_tensor* o = ggml_flash_attn_ext(ctx, qh, kk, vv, m, scale, 0.0f, 0.0f);  // {D, H, Lq, N}
            ggml_prec_set_acc(o, GGML_PREC_F32);
            return o;
        };
        // an unsupported node is left unused (not part of the graph); the next choice follows
        ggml_tensor* o = fa(kh, vh);
        if (!c.backend || ggml_backend_supports_op(c.backend, o)) return ggml_reshape_3d(ctx, o, D * n_heads_q, Lq, N);
        // GPU flash-attention kernels take F16 keys and values only (ggml-cuda fattn.cu, as
        // llama.cpp's F16 KV cache): F32 activations are cast around the op (accumulation stays F32)
        if (kh->type == GGML_TYPE_F32 || vh->type == GGML_TYPE_F32) {
            ggml_tensor* k16 = kh->type == GGML_TYPE_F32 ? ggml_cast(ctx, kh, GGML_TYPE_F16) : kh;
            ggml_tensor* v16 = vh->type == GGML_TYPE_F32 ? ggml_cast(ctx, vh, GGML_TYPE_F16) : vh;
            o = fa(k16, v16);
            if (ggml_backend_supports_op(c.backend, o)) return ggml_reshape_3d(ctx, o, D * n_heads_q, Lq, N);
        }
    }
    // Contiguous operands let ggml's CPU backend use its blocked GEMM (tinyBLAS) instead of one
    // dot product per output; a head size that is not a multiple of 8 is padded with zeros
    // (which add nothing to q.k) so that the GEMM applies to small heads too.
    ggml_tensor* qc = ggml_cont(ctx, qh);  // {D, Lq, H, N}
    ggml_tensor* kc = ggml_cont(ctx, kh);  // {D, Lk, Hkv, N}
    if (D % 8 != 0) {
        const int pad = (int)(8 - D % 8);
        qc = ggml_pad(ctx, qc, pad, 0, 0, 0);
        kc = ggml_pad(ctx, kc, pad, 0, 0, 0);
    }
    ggml_tensor* kq = ggml_mul_mat(ctx, kc, qc);                      // {Lk, Lq, H, N}
    kq = ggml_soft_max_ext(ctx, kq, mask, scale, 0.0f);
    ggml_tensor* vt = ggml_cont(ctx, ggml_permute(ctx, vh, 1, 0, 2, 3));  // {Lk, D, Hkv, N}
    ggml_tensor* o = ggml_mul_mat(ctx, vt, kq);                       // {D, Lq, H, N}
    o = ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3));             // {D, H, Lq, N}
    return ggml_reshape_3d(ctx, o, D * n_heads_q, Lq, N);
}

// ---------------------------------------------------------------- timestep_embedding

ggml_tensor* timestep_embedding(Ctx& c, ggml_tensor* t, int dim, bool flip_sin_to_cos, float downscale_freq_shift,
                                float scale, float max_period) {
    if (dim < 2) fail(ErrorKind::InvalidInput, "timestep_embedding: dim must be at least 2, got {}", dim);
    if (t->type != GGML_TYPE_F32 || ggml_n_dims(t) != 1)
        fail(ErrorKind::InvalidInput, "timestep_embedding: timesteps must be an F32 vector {{N}}, got {} of type {}", ne_str(t),
             ggml_type_name(t->type));
    const int half = dim / 2;
    if ((float)half - downscale_freq_shift == 0.0f)
        fail(ErrorKind::InvalidInput, "timestep_embedding: dim/2 - downscale_freq_shift must not be 0");
    const int64_t N = t->ne[0];
    ggml_context* ctx = c.ctx;
    ggml_tensor* i = ggml_arange(ctx, 0.0f, (float)half, 1.0f);                                    // {half}
    ggml_tensor* freqs = ggml_exp(ctx, ggml_scale(ctx, i, -std::log(max_period) / ((float)half - downscale_freq_shift)));
    ggml_tensor* args = ggml_mul(ctx, ggml_repeat_4d(ctx, freqs, half, N, 1, 1), ggml_reshape_2d(ctx, t, 1, N));  // {half, N}
    if (scale != 1.0f) args = ggml_scale(ctx, args, scale);
    ggml_tensor* s = ggml_sin(ctx, args);
    ggml_tensor* co = ggml_cos(ctx, args);
    ggml_tensor* e = flip_sin_to_cos ? ggml_concat(ctx, co, s, 0) : ggml_concat(ctx, s, co, 0);  // {2*half, N}
    if (dim % 2 == 1) e = ggml_pad(ctx, e, 1, 0, 0, 0);
    return e;
}

}  // namespace easel::nn
