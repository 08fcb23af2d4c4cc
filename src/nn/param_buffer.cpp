// TensorSource, binding checks and ParamBuffer (see block.h).
//
// Kept apart from block.cpp so that code which only declares blocks (and tests that build
// parameters by hand) does not need the weight-file readers.
#include "nn/block.h"
#include "nn/weight_patch.h"

#include "core/error.h"

#include <ggml-alloc.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>

namespace easel::nn {

// ---------------------------------------------------------------- TensorSource

TensorSource::TensorSource(const io::WeightIndex& index, std::string prefix)
    : index_(&index), prefix_(std::move(prefix)) {}

void TensorSource::rename(const std::string& canonical, const std::string& stored) { renames_[canonical] = stored; }

void TensorSource::set_mapper(std::function<std::string(const std::string&)> canonical_to_stored) {
    mapper_ = std::move(canonical_to_stored);
}

std::string TensorSource::stored_name(const std::string& canonical) const {
    if (auto d = derived_.find(canonical); d != derived_.end()) return d->second.stored;
    if (auto r = renames_.find(canonical); r != renames_.end()) return r->second;
    if (mapper_) {
        std::string m = mapper_(canonical);
        if (!m.empty()) return prefix_ + m;
    }
    return prefix_ + canonical;
}

const io::TensorInfo* TensorSource::find(const std::string& canonical) const {
    if (derived_.count(canonical)) {
        auto it = derived_info_.find(canonical);
        return it == derived_info_.end() ? nullptr : &it->second;
    }
    return index_->find(stored_name(canonical));
}

std::vector<std::string> TensorSource::stored_names() const {
    std::vector<std::string> out;
    for (auto& t : index_->tensors())
        if (t.name.compare(0, prefix_.size(), prefix_) == 0) out.push_back(t.name);
    return out;
}

void TensorSource::slice_rows(const std::string& canonical, const std::string& stored, int64_t row_begin,
                              int64_t row_end) {
    Derived d;
    d.stored = stored;
    d.row_begin = row_begin;
    d.row_end = row_end;
    derived_[canonical] = d;
    derived_info_.erase(canonical);
    const io::TensorInfo* t = index_->find(stored);
    if (!t) return;  // reported as missing by check_binding
    io::TensorInfo s = *t;
    int64_t rows = t->shape.empty() ? 1 : t->shape[0];
    int64_t end = row_end < 0 ? rows : row_end;
    s.name = fmt::format("{}[rows {}:{}]", stored, row_begin, end);
    if (t->shape.empty() || row_begin < 0 || end > rows || row_begin >= end || t->nbytes % (uint64_t)rows != 0) {
        // keep an impossible shape so that the binding check reports it as mis-shaped
        s.shape = {end - row_begin};
        s.nbytes = 0;
    } else {
        uint64_t row_bytes = t->nbytes / (uint64_t)rows;
        s.offset = t->offset + row_bytes * (uint64_t)row_begin;
        s.nbytes = row_bytes * (uint64_t)(end - row_begin);
        s.shape[0] = end - row_begin;
    }
    derived_info_[canonical] = std::move(s);
}

void TensorSource::transpose(const std::string& canonical, const std::string& stored) {
    Derived d;
    d.stored = stored;
    d.transpose = true;
    derived_[canonical] = d;
    derived_info_.erase(canonical);
    const io::TensorInfo* t = index_->find(stored);
    if (!t) return;
    io::TensorInfo s = *t;
    s.name = stored + "[transposed]";
    if (t->shape.size() == 2) std::swap(s.shape[0], s.shape[1]);
    else s.shape.push_back(0);  // not 2-D: reported as mis-shaped
    derived_info_[canonical] = std::move(s);
}

const TensorSource::Derived* TensorSource::derived(const std::string& canonical) const {
    auto it = derived_.find(canonical);
    return it == derived_.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------- types and binding

namespace {

bool is_float_dtype(io::DType d) {
    switch (d) {
        case io::DType::F64: case io::DType::F32: case io::DType::F16: case io::DType::BF16:
        case io::DType::F8_E4M3: case io::DType::F8_E5M2: case io::DType::Ggml: return true;
        default: return false;
    }
}

std::vector<int64_t> squeeze(const std::vector<int64_t>& s) {
    std::vector<int64_t> o;
    for (auto v : s)
        if (v != 1) o.push_back(v);
    return o;
}

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

bool is_quantized(ggml_type t) { return ggml_is_quantized(t); }

/// The result of binding one parameter.
struct Bound {
    std::string name;
    Param* param;
    const io::TensorInfo* info;  // nullptr: absent (optional)
};

struct BindReport {
    std::vector<std::string> missing, unexpected, misshaped;
    std::vector<Bound> bound;
    std::string message(const TensorSource& src) const {
        if (missing.empty() && unexpected.empty() && misshaped.empty()) return {};
        auto list = [](const std::vector<std::string>& v) {
            std::string s;
            size_t n = std::min<size_t>(v.size(), 4);
            for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + v[i];
            if (v.size() > n) s += fmt::format(", ... {} more", v.size() - n);
            return s;
        };
        std::string m = fmt::format("weights do not match the model{}:",
                                    src.prefix().empty() ? std::string() : fmt::format(" (prefix '{}')", src.prefix()));
        if (!missing.empty()) m += fmt::format(" {} missing ({});", missing.size(), list(missing));
        if (!misshaped.empty()) m += fmt::format(" {} mis-shaped ({});", misshaped.size(), list(misshaped));
        if (!unexpected.empty()) m += fmt::format(" {} unexpected ({});", unexpected.size(), list(unexpected));
        m += " check that the file is the right model kind and variant for this slot";
        return m;
    }
};

BindReport bind(Block& root, const TensorSource& src, const LoadOptions& opt) {
    BindReport r;
    std::unordered_set<std::string> used;
    root.visit_params("", [&](const std::string& name, Param& p) {
        const io::TensorInfo* t = src.find(name);
        std::string stored = src.stored_name(name);
        used.insert(stored);
        if (!t) {
            if (src.derived(name) && src.index().find(stored)) {
                r.misshaped.push_back(fmt::format("{}: cannot derive from {}", name, stored));
            } else if (!p.optional) {
                r.missing.push_back(stored);
            } else {
                r.bound.push_back({name, &p, nullptr});
            }
            return;
        }
        if (!is_float_dtype(t->dtype)) {
            r.misshaped.push_back(fmt::format("{}: dtype {} is not a float type", t->name, io::dtype_name(t->dtype)));
            return;
        }
        if (t->shape != p.shape && (squeeze(t->shape) != squeeze(p.shape) || t->nbytes == 0)) {
            r.misshaped.push_back(fmt::format("{}: file {} vs model {}", t->name, shape_str(t->shape), shape_str(p.shape)));
            return;
        }
        r.bound.push_back({name, &p, t});
    });
    if (opt.check_unexpected) {
        for (auto& n : src.stored_names()) {
            if (used.count(n)) continue;
            bool ignore = false;
            for (auto& suf : opt.ignore_unexpected_suffixes)
                if (n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0) ignore = true;
            if (!ignore) r.unexpected.push_back(n);
        }
    }
    return r;
}

void fill_from_f32(ggml_tensor* dst, const std::vector<float>& v) {
    const int64_t n = ggml_nelements(dst);
    if ((int64_t)v.size() != n) fail(ErrorKind::Internal, "fill_from_f32: {} values for tensor {} of {}", v.size(), dst->name, n);
    std::vector<uint8_t> buf(ggml_nbytes(dst));
    switch (dst->type) {
        case GGML_TYPE_F32: std::memcpy(buf.data(), v.data(), buf.size()); break;
        case GGML_TYPE_F16: ggml_fp32_to_fp16_row(v.data(), (ggml_fp16_t*)buf.data(), n); break;
        case GGML_TYPE_BF16: ggml_fp32_to_bf16_row(v.data(), (ggml_bf16_t*)buf.data(), n); break;
        default:
            if (ggml_quantize_requires_imatrix(dst->type))
                fail(ErrorKind::Unsupported, "type {} needs an importance matrix; choose another --type", ggml_type_name(dst->type));
            ggml_quantize_chunk(dst->type, v.data(), buf.data(), 0, ggml_nrows(dst), dst->ne[0], nullptr);
    }
    if (dst->buffer) ggml_backend_tensor_set(dst, buf.data(), 0, buf.size());
    else std::memcpy(dst->data, buf.data(), buf.size());  // a tensor in host memory of its context
}

}  // namespace

ggml_type choose_param_type(ParamRole role, const io::TensorInfo& stored, const LoadOptions& opt) {
    ggml_type st = stored.gtype;
    if (st == GGML_TYPE_COUNT) {
        // no ggml type holds it as is: F64 widens to F32, F8 to F16
        st = stored.dtype == io::DType::F64 ? GGML_TYPE_F32 : GGML_TYPE_F16;
    }
    const int64_t ne0 = stored.shape.empty() ? 1 : stored.shape.back();
    switch (role) {
        case ParamRole::Norm:
        case ParamRole::Bias: return GGML_TYPE_F32;
        case ParamRole::ConvWeight: {
            ggml_type want = opt.weight_type != GGML_TYPE_COUNT ? opt.weight_type : st;
            return want == GGML_TYPE_F32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
        }
        case ParamRole::Weight:
        case ParamRole::Embedding: {
            ggml_type want = opt.weight_type != GGML_TYPE_COUNT ? opt.weight_type : st;
            if (is_quantized(want) && ne0 % ggml_blck_size(want) != 0) {
                // rows not a multiple of the block size: keep the stored float type (or F16)
                return is_quantized(st) ? GGML_TYPE_F16 : (st == GGML_TYPE_F32 ? GGML_TYPE_F32 : GGML_TYPE_F16);
            }
            return want;
        }
    }
    return GGML_TYPE_F32;
}

uint64_t param_bytes(const Block& root, const TensorSource& src, const LoadOptions& opt) {
    uint64_t total = 0;
    root.visit_params("", [&](const std::string& name, const Param& p) {
        const io::TensorInfo* t = src.find(name);
        if (!t) return;
        ggml_type type = choose_param_type(p.role, *t, opt);
        int64_t n = 1;
        for (auto d : p.shape) n *= d;
        const int64_t ne0 = p.shape.empty() ? 1 : p.shape.back();
        total += (uint64_t)ggml_row_size(type, ne0) * (uint64_t)(n / std::max<int64_t>(ne0, 1));
    });
    return total;
}

std::string check_binding(Block& root, const TensorSource& src, const LoadOptions& opt) {
    return bind(root, src, opt).message(src);
}

// ---------------------------------------------------------------- ParamBuffer

ParamBuffer::~ParamBuffer() {
    detail::forget_runtime(buf_);  // the run-time updates of its parameters go with it
    if (buf_) ggml_backend_buffer_free(buf_);
    if (ctx_) ggml_free(ctx_);
}

ParamBuffer::ParamBuffer(ParamBuffer&& o) noexcept : ctx_(o.ctx_), buf_(o.buf_) {
    o.ctx_ = nullptr;
    o.buf_ = nullptr;
}

ParamBuffer& ParamBuffer::operator=(ParamBuffer&& o) noexcept {
    if (this != &o) {
        detail::forget_runtime(buf_);
        if (buf_) ggml_backend_buffer_free(buf_);
        if (ctx_) ggml_free(ctx_);
        ctx_ = o.ctx_;
        buf_ = o.buf_;
        o.ctx_ = nullptr;
        o.buf_ = nullptr;
    }
    return *this;
}

size_t ParamBuffer::size() const { return buf_ ? ggml_backend_buffer_get_size(buf_) : 0; }

namespace {

ggml_context* new_param_ctx(size_t n) {
    ggml_init_params ip{};
    ip.mem_size = ggml_tensor_overhead() * (n + 1);
    ip.mem_buffer = nullptr;
    ip.no_alloc = true;
    ggml_context* ctx = ggml_init(ip);
    if (!ctx) fail(ErrorKind::OutOfMemory, "cannot create a ggml context for {} parameters", n);
    return ctx;
}

ggml_tensor* new_param_tensor(ggml_context* ctx, ggml_type type, const std::vector<int64_t>& shape, const std::string& name) {
    if (shape.size() > 4) fail(ErrorKind::Internal, "parameter {} has {} dimensions (at most 4)", name, shape.size());
    int64_t ne[4] = {1, 1, 1, 1};
    for (size_t i = 0; i < shape.size(); ++i) ne[i] = shape[shape.size() - 1 - i];
    ggml_tensor* t = ggml_new_tensor(ctx, type, 4, ne);
    ggml_set_name(t, name.c_str());
    return t;
}

void alloc_buffer(ggml_context* ctx, ggml_backend_buffer_type_t buft, ggml_backend_buffer_t& buf) {
    if (!ggml_get_first_tensor(ctx)) return;
    buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
    if (!buf) {
        size_t need = 0;
        for (ggml_tensor* t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t))
            need += ggml_backend_buft_get_alloc_size(buft, t);
        fail(ErrorKind::OutOfMemory, "cannot allocate {:.1f} MiB of parameters on {}; free memory or place the weights elsewhere",
             need / 1048576.0, ggml_backend_buft_name(buft));
    }
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
}

}  // namespace

ParamBuffer ParamBuffer::allocate(Block& root, ggml_backend_buffer_type_t buft,
                                  const std::function<ggml_type(const std::string&, const Param&)>& type_of) {
    ParamBuffer pb;
    pb.ctx_ = new_param_ctx(root.param_count());
    root.visit_params("", [&](const std::string& name, Param& p) {
        ggml_type t = type_of ? type_of(name, p) : GGML_TYPE_F32;
        p.tensor = new_param_tensor(pb.ctx_, t, p.shape, name);
    });
    alloc_buffer(pb.ctx_, buft, pb.buf_);
    return pb;
}

ParamBuffer ParamBuffer::load(Block& root, const TensorSource& src, ggml_backend_buffer_type_t buft, const LoadOptions& opt) {
    return load_subset(root, src, buft, opt, {});
}

void read_param(const TensorSource& src, const std::string& name, const Param& p, const io::TensorInfo& info, ggml_tensor* dst) {
    // a weight patch registered for this stored tensor (weight_patch.h: a LoRA merged at load)
    const std::optional<FoundPatch> patch = find_patch(src.index(), info);
    const bool merge =
        patch && patch->patches->how(patch->name, p.role, dst->type, detail::row_split_reading()) == WeightPatches::How::Merge;
    const TensorSource::Derived* d = src.derived(name);
    if (d && d->transpose) {
        const io::TensorInfo* st = src.index().find(d->stored);
        std::vector<float> v = src.index().read_f32(*st);
        const int64_t rows = st->shape[0], cols = st->shape[1];
        std::vector<float> tr(v.size());
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j) tr[j * rows + i] = v[i * cols + j];
        if (merge) patch->patches->merge(patch->name, tr);
        fill_from_f32(dst, tr);
        return;
    }
    io::TensorInfo in = info;
    in.shape = p.shape;  // shapes may differ by size-1 dims only (checked by bind)
    if (merge) {
        // F32 values, the update added, then the parameter's type (F16/BF16 rounded as ggml's
        // converters, quantised types re-quantised)
        std::vector<float> v = src.index().read_f32(in);
        patch->patches->merge(patch->name, v);
        fill_from_f32(dst, v);
        return;
    }
    src.index().load_into(in, dst);
}

namespace {

/// The run-time updates (weight_patch.h) of the parameters just loaded into `owner`: their
/// tensors in one more buffer of `buft` (the weight's device), bound to each parameter until
/// `owner` is freed. Parameters without one lose any update an earlier load bound.
void bind_runtime_updates(ggml_backend_buffer_t owner, ggml_backend_buffer_type_t buft, const TensorSource& src,
                          const std::vector<std::pair<ggml_tensor*, const Bound*>>& todo) {
    struct Rt {
        const Bound* b;
        FoundPatch patch;
        std::vector<UpdateTensor> host;
        std::vector<ggml_tensor*> tensors;
    };
    std::vector<Rt> rts;
    size_t n = 0;
    for (auto& [tensor, b] : todo) {
        detail::unbind_runtime(b->param);
        std::optional<FoundPatch> f = find_patch(src.index(), *b->info);
        if (!f || f->patches->how(f->name, b->param->role, tensor->type, false) != WeightPatches::How::Runtime) continue;
        rts.push_back(Rt{b, *f, f->patches->runtime_tensors(f->name), {}});
        n += rts.back().host.size();
    }
    if (rts.empty() || !owner) return;
    struct Keep {
        ggml_context* ctx = nullptr;
        ggml_backend_buffer_t buf = nullptr;
        ~Keep() {
            if (buf) ggml_backend_buffer_free(buf);
            if (ctx) ggml_free(ctx);
        }
    };
    auto keep = std::make_shared<Keep>();
    keep->ctx = new_param_ctx(n);
    for (auto& rt : rts)
        for (size_t i = 0; i < rt.host.size(); ++i) {
            rt.tensors.push_back(ggml_new_tensor(keep->ctx, GGML_TYPE_F32, 4, rt.host[i].ne.data()));
            ggml_set_name(rt.tensors.back(), fmt::format("{}.update{}", rt.b->name, i).c_str());
        }
    alloc_buffer(keep->ctx, buft, keep->buf);
    for (auto& rt : rts) {
        for (size_t i = 0; i < rt.host.size(); ++i) fill_from_f32(rt.tensors[i], rt.host[i].data);
        detail::bind_runtime(rt.b->param, std::shared_ptr<const RuntimeUpdate>(rt.patch.patches->runtime(rt.patch.name, rt.tensors)), owner,
                             keep);
    }
}

}  // namespace

ParamBuffer ParamBuffer::load_subset(Block& root, const TensorSource& src, ggml_backend_buffer_type_t buft,
                                     const LoadOptions& opt, const ParamFilter& keep) {
    BindReport r = bind(root, src, opt);
    if (std::string m = r.message(src); !m.empty()) fail(ErrorKind::ModelMismatch, "{}", m);
    if (keep) std::erase_if(r.bound, [&](const Bound& b) { return !keep(b.name, *b.param); });

    ParamBuffer pb;
    pb.ctx_ = new_param_ctx(r.bound.size());
    std::vector<std::pair<ggml_tensor*, const Bound*>> todo;
    for (auto& b : r.bound) {
        b.param->tensor = nullptr;
        if (!b.info) continue;  // optional and absent
        ggml_type t = choose_param_type(b.param->role, *b.info, opt);
        ggml_tensor* tt = new_param_tensor(pb.ctx_, t, b.param->shape, b.name);
        todo.emplace_back(tt, &b);
    }
    alloc_buffer(pb.ctx_, buft, pb.buf_);
    for (auto& [tensor, b] : todo) {
        read_param(src, b->name, *b->param, *b->info, tensor);
        b->param->tensor = tensor;
    }
    bind_runtime_updates(pb.buf_, buft, src, todo);
    return pb;
}

}  // namespace easel::nn
