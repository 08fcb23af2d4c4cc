// GGUF parser through ggml's gguf API (see readers.h).
//
// ggml's gguf_init_from_buffer validates the header (magic, version, counts, string and array
// lengths, types, block sizes, sequential offsets) and returns nullptr on defects, logging
// the reason through ggml's logger. We capture that reason for our one-line error instead of
// letting it reach stderr, then check what it leaves to the caller (data inside the file).
#include "core/error.h"
#include "io/readers.h"

#include <gguf.h>

#include <algorithm>
#include <cstring>
#include <mutex>

namespace easel::io::detail {

namespace {

struct LogCapture {
    std::string last;
};

void capture_log(enum ggml_log_level level, const char* text, void* ud) {
    auto* c = static_cast<LogCapture*>(ud);
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        std::string s(text ? text : "");
        while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
        // Keep the first, most specific reason; the later ones are "failed to read ..." summaries.
        if (!s.empty() && c->last.empty()) c->last = s;
    }
}

// Serialises the swap of ggml's global log callback.
std::mutex& log_mutex() {
    static std::mutex m;
    return m;
}

struct GgufFree {
    void operator()(gguf_context* c) const { gguf_free(c); }
};

// Bounded little-endian reader used to recover each tensor's number of dimensions, which
// gguf.h does not expose (gguf_get_tensor_ne pads to 4 with 1).
struct Walker {
    const uint8_t* p;
    uint64_t n, pos = 0;
    bool ok = true;
    template <class T>
    T get() {
        T v{};
        if (!ok || n - pos < sizeof(T)) {
            ok = false;
            return v;
        }
        std::memcpy(&v, p + pos, sizeof(T));
        pos += sizeof(T);
        return v;
    }
    void skip(uint64_t k) {
        if (!ok || n - pos < k) ok = false;
        else pos += k;
    }
    void skip_string() { skip(get<uint64_t>()); }
};

uint64_t gguf_scalar_size(int t) {
    switch (t) {
        case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
        case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
        case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
        case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
        default: return 0;
    }
}

// n_dims of each tensor in file order, or empty if the walk fails (then shapes are trimmed).
std::vector<uint32_t> tensor_ndims(std::span<const uint8_t> data, int64_t n_kv, int64_t n_tensors) {
    Walker w{data.data(), data.size()};
    w.skip(4 + 4 + 8 + 8);
    for (int64_t i = 0; w.ok && i < n_kv; ++i) {
        w.skip_string();
        int32_t t = w.get<int32_t>();
        if (t == GGUF_TYPE_ARRAY) {
            int32_t et = w.get<int32_t>();
            uint64_t cnt = w.get<uint64_t>();
            if (et == GGUF_TYPE_STRING) {
                for (uint64_t j = 0; w.ok && j < cnt; ++j) w.skip_string();
            } else {
                uint64_t es = gguf_scalar_size(et);
                if (es == 0 || cnt > (w.n - w.pos) / es) return {};
                w.skip(cnt * es);
            }
        } else if (t == GGUF_TYPE_STRING) {
            w.skip_string();
        } else {
            uint64_t es = gguf_scalar_size(t);
            if (es == 0) return {};
            w.skip(es);
        }
    }
    std::vector<uint32_t> nd;
    for (int64_t i = 0; w.ok && i < n_tensors; ++i) {
        w.skip_string();
        uint32_t k = w.get<uint32_t>();
        if (k > GGML_MAX_DIMS) return {};
        w.skip(8ull * k + 4 + 8);
        nd.push_back(k);
    }
    if (!w.ok) return {};
    return nd;
}

// Walks the header before ggml does, rejecting what ggml would only catch after loading an
// out-of-range enum value (undefined behaviour under UBSan) and counts so large that ggml's
// quadratic duplicate-name checks would stall. Throws Error(InvalidInput).
constexpr int64_t kMaxGgufTensors = 65536;
constexpr int64_t kMaxGgufKv = 65536;

void prevalidate(std::span<const uint8_t> data, const std::string& label) {
    Walker w{data.data(), data.size()};
    w.skip(4);
    const uint32_t version = w.get<uint32_t>();
    const int64_t n_t = w.get<int64_t>(), n_kv = w.get<int64_t>();
    if (!w.ok) fail(ErrorKind::InvalidInput, "'{}': GGUF header truncated", label);
    if (version != 2 && version != 3)
        fail(ErrorKind::InvalidInput, "'{}': GGUF version {} is not supported (2 or 3; a byte-swapped file reads as a huge number)", label,
             version);
    if (n_t < 0 || n_t > kMaxGgufTensors)
        fail(ErrorKind::InvalidInput, "'{}': GGUF header claims {} tensors (limit {})", label, n_t, kMaxGgufTensors);
    if (n_kv < 0 || n_kv > kMaxGgufKv)
        fail(ErrorKind::InvalidInput, "'{}': GGUF header claims {} metadata keys (limit {})", label, n_kv, kMaxGgufKv);
    auto string = [&](const char* what, int64_t i) {
        const uint64_t len = w.get<uint64_t>();
        if (!w.ok || len > w.n - w.pos)
            fail(ErrorKind::InvalidInput, "'{}': GGUF {} {} has a length past the end of the file: truncated or corrupt", label, what, i);
        w.skip(len);
    };
    for (int64_t i = 0; i < n_kv; ++i) {
        string("key", i);
        int32_t t = w.get<int32_t>();
        if (!w.ok) fail(ErrorKind::InvalidInput, "'{}': GGUF metadata truncated at key {}", label, i);
        if (t == GGUF_TYPE_ARRAY) {
            const int32_t et = w.get<int32_t>();
            const uint64_t cnt = w.get<uint64_t>();
            if (!w.ok) fail(ErrorKind::InvalidInput, "'{}': GGUF metadata truncated at key {}", label, i);
            if (et < 0 || et >= GGUF_TYPE_COUNT || et == GGUF_TYPE_ARRAY)
                fail(ErrorKind::InvalidInput, "'{}': GGUF key {} is an array of invalid type {}", label, i, et);
            if (et == GGUF_TYPE_STRING) {
                if (cnt > (w.n - w.pos) / 8)
                    fail(ErrorKind::InvalidInput, "'{}': GGUF key {} claims {} strings, more than the file holds", label, i, cnt);
                for (uint64_t j = 0; j < cnt; ++j) string("array string of key", i);
            } else {
                const uint64_t es = gguf_scalar_size(et);
                if (cnt > (w.n - w.pos) / es)
                    fail(ErrorKind::InvalidInput, "'{}': GGUF key {} claims {} values, more than the file holds", label, i, cnt);
                w.skip(cnt * es);
            }
        } else if (t == GGUF_TYPE_STRING) {
            string("string value of key", i);
        } else {
            const uint64_t es = (t >= 0 && t < GGUF_TYPE_COUNT) ? gguf_scalar_size(t) : 0;
            if (es == 0) fail(ErrorKind::InvalidInput, "'{}': GGUF key {} has invalid type {}", label, i, t);
            w.skip(es);
        }
        if (!w.ok) fail(ErrorKind::InvalidInput, "'{}': GGUF metadata truncated at key {}", label, i);
    }
    for (int64_t i = 0; i < n_t; ++i) {
        string("tensor name", i);
        const uint32_t nd = w.get<uint32_t>();
        if (!w.ok) fail(ErrorKind::InvalidInput, "'{}': GGUF tensor info truncated at tensor {}", label, i);
        if (nd > GGML_MAX_DIMS) fail(ErrorKind::InvalidInput, "'{}': GGUF tensor {} has {} dimensions (at most {})", label, i, nd, GGML_MAX_DIMS);
        unsigned __int128 numel = 1;
        for (uint32_t d = 0; d < nd; ++d) {
            const int64_t ne = w.get<int64_t>();
            if (!w.ok) break;
            if (ne < 0) fail(ErrorKind::InvalidInput, "'{}': GGUF tensor {} has a negative dimension {}", label, i, ne);
            if (ne > 0) numel *= (uint64_t)ne;  // zero sizes skipped: ggml multiplies the others too
            if (numel > (unsigned __int128)INT64_MAX)
                fail(ErrorKind::InvalidInput, "'{}': GGUF tensor {} has a shape whose element count overflows 64 bits", label, i);
        }
        const int32_t t = w.get<int32_t>();
        w.skip(8);
        if (!w.ok) fail(ErrorKind::InvalidInput, "'{}': GGUF tensor info truncated at tensor {}", label, i);
        if (t < 0 || t >= GGML_TYPE_COUNT)
            fail(ErrorKind::InvalidInput, "'{}': GGUF tensor {} has invalid ggml type {}", label, i, t);
    }
}

MetaValue kv_value(const gguf_context* g, int64_t id) {
    MetaValue v;
    const gguf_type t = gguf_get_kv_type(g, id);
    auto scalar_int = [&](gguf_type tt, const void* p) -> int64_t {
        switch (tt) {
            case GGUF_TYPE_UINT8: return *(const uint8_t*)p;
            case GGUF_TYPE_INT8: return *(const int8_t*)p;
            case GGUF_TYPE_UINT16: return *(const uint16_t*)p;
            case GGUF_TYPE_INT16: return *(const int16_t*)p;
            case GGUF_TYPE_UINT32: return *(const uint32_t*)p;
            case GGUF_TYPE_INT32: return *(const int32_t*)p;
            case GGUF_TYPE_UINT64: return (int64_t)*(const uint64_t*)p;
            case GGUF_TYPE_INT64: return *(const int64_t*)p;
            case GGUF_TYPE_BOOL: return *(const int8_t*)p != 0;
            default: return 0;
        }
    };
    auto is_int = [](gguf_type tt) {
        return tt != GGUF_TYPE_FLOAT32 && tt != GGUF_TYPE_FLOAT64 && tt != GGUF_TYPE_STRING && tt != GGUF_TYPE_ARRAY &&
               tt != GGUF_TYPE_BOOL;
    };
    if (t == GGUF_TYPE_ARRAY) {
        const gguf_type et = gguf_get_arr_type(g, id);
        const size_t n = gguf_get_arr_n(g, id);
        if (et == GGUF_TYPE_STRING) {
            v.kind = MetaValue::Kind::StringArray;
            v.sa.reserve(n);
            for (size_t i = 0; i < n; ++i) v.sa.emplace_back(gguf_get_arr_str(g, id, i));
        } else if (et == GGUF_TYPE_FLOAT32 || et == GGUF_TYPE_FLOAT64) {
            v.kind = MetaValue::Kind::FloatArray;
            const void* d = gguf_get_arr_data(g, id);
            v.fa.resize(n);
            for (size_t i = 0; i < n; ++i)
                v.fa[i] = et == GGUF_TYPE_FLOAT32 ? (double)((const float*)d)[i] : ((const double*)d)[i];
        } else {
            v.kind = MetaValue::Kind::IntArray;
            const uint8_t* d = (const uint8_t*)gguf_get_arr_data(g, id);
            const size_t es = gguf_scalar_size(et);
            v.ia.resize(n);
            for (size_t i = 0; i < n; ++i) v.ia[i] = scalar_int(et, d + i * es);
        }
        return v;
    }
    switch (t) {
        case GGUF_TYPE_STRING: v.kind = MetaValue::Kind::String; v.s = gguf_get_val_str(g, id); break;
        case GGUF_TYPE_FLOAT32: v.kind = MetaValue::Kind::Float; v.f = gguf_get_val_f32(g, id); break;
        case GGUF_TYPE_FLOAT64: v.kind = MetaValue::Kind::Float; v.f = gguf_get_val_f64(g, id); break;
        case GGUF_TYPE_BOOL: v.kind = MetaValue::Kind::Bool; v.b = gguf_get_val_bool(g, id); v.i = v.b; break;
        default:
            if (is_int(t)) {
                v.kind = MetaValue::Kind::Int;
                v.i = scalar_int(t, gguf_get_val_data(g, id));
            }
            break;
    }
    return v;
}

}  // namespace

ParsedFile parse_gguf(std::span<const uint8_t> data, const std::string& label) {
    if (data.size() < 4 || std::memcmp(data.data(), "GGUF", 4) != 0)
        fail(ErrorKind::InvalidInput, "'{}' is not a GGUF file (the first 4 bytes are not 'GGUF')", label);
    if (data.size() < 24) fail(ErrorKind::InvalidInput, "'{}': GGUF header truncated ({} bytes)", label, data.size());
    prevalidate(data, label);

    std::unique_ptr<gguf_context, GgufFree> g;
    LogCapture cap;
    {
        std::lock_guard<std::mutex> lock(log_mutex());
        ggml_log_callback old_cb = nullptr;
        void* old_ud = nullptr;
        ggml_log_get(&old_cb, &old_ud);
        ggml_log_set(capture_log, &cap);
        gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
        try {
            g.reset(gguf_init_from_buffer(data.data(), data.size(), params));
        } catch (...) {
            ggml_log_set(old_cb, old_ud);
            fail(ErrorKind::InvalidInput, "'{}': GGUF header could not be read (out of memory while parsing)", label);
        }
        ggml_log_set(old_cb, old_ud);
    }
    if (!g) {
        std::string why = cap.last;
        // ggml prefixes "gguf_init_from_reader: "; drop the function name.
        if (auto p = why.find(": "); p != std::string::npos && p < 40) why = why.substr(p + 2);
        for (auto& c : why)
            if ((unsigned char)c < 0x20) c = ' ';
        if (why.size() > 200) why = why.substr(0, 200) + "...";
        fail(ErrorKind::InvalidInput, "'{}': malformed GGUF file: {}", label, why.empty() ? "header rejected by ggml" : why);
    }

    ParsedFile out;
    out.format = "gguf";
    const int64_t n_kv = gguf_get_n_kv(g.get());
    for (int64_t i = 0; i < n_kv; ++i) out.metadata[gguf_get_key(g.get(), i)] = kv_value(g.get(), i);

    const int64_t n_t = gguf_get_n_tensors(g.get());
    const uint64_t data_off = gguf_get_data_offset(g.get());
    const std::vector<uint32_t> nd = tensor_ndims(data, n_kv, n_t);
    out.tensors.reserve((size_t)n_t);
    for (int64_t i = 0; i < n_t; ++i) {
        TensorInfo t;
        t.name = gguf_get_tensor_name(g.get(), i);
        t.dtype = DType::Ggml;
        t.gtype = gguf_get_tensor_type(g.get(), i);
        const int64_t* ne = gguf_get_tensor_ne(g.get(), i);
        int dims = GGML_MAX_DIMS;
        if (!nd.empty()) dims = (int)nd[i];
        else
            while (dims > 1 && ne[dims - 1] == 1) --dims;
        for (int d = dims - 1; d >= 0; --d) t.shape.push_back(ne[d]);
        // ggml's own guard skips shapes whose element count wraps to 0 (e.g. 2^40 x 2^40), so
        // recompute numel and bytes with overflow checks and compare.
        unsigned __int128 numel = 1;
        for (int d = 0; d < GGML_MAX_DIMS; ++d) {
            numel *= (unsigned __int128)(uint64_t)ne[d];
            if (numel > (unsigned __int128)INT64_MAX)
                fail(ErrorKind::InvalidInput, "'{}': GGUF tensor '{}' has a shape whose element count overflows 64 bits", label,
                     t.name.substr(0, 120));
        }
        const int64_t blk = ggml_blck_size(t.gtype);
        const unsigned __int128 want = blk > 0 ? numel / (unsigned)blk * ggml_type_size(t.gtype) : 0;
        const uint64_t rel = gguf_get_tensor_offset(g.get(), i);
        t.nbytes = gguf_get_tensor_size(g.get(), i);
        if (blk <= 0 || want != t.nbytes)
            fail(ErrorKind::InvalidInput, "'{}': GGUF tensor '{}' has an inconsistent size for its shape and type {}", label,
                 t.name.substr(0, 120), ggml_type_name(t.gtype));
        if (data_off > data.size() || rel > data.size() - data_off || t.nbytes > data.size() - data_off - rel)
            fail(ErrorKind::InvalidInput,
                 "'{}': GGUF tensor '{}' data [{}, {}) runs past the end of the file ({} bytes): the file is truncated", label,
                 t.name.substr(0, 120), data_off + rel, data_off + rel + t.nbytes, data.size());
        t.offset = data_off + rel;
        out.tensors.push_back(std::move(t));
    }
    return out;
}

}  // namespace easel::io::detail
