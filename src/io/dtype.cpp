// Element types: names, sizes and conversion to float32 (see readers.h).
#include "core/error.h"
#include "io/readers.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace easel::io {

const char* dtype_name(DType d) {
    switch (d) {
        case DType::F64: return "F64";
        case DType::F32: return "F32";
        case DType::F16: return "F16";
        case DType::BF16: return "BF16";
        case DType::F8_E4M3: return "F8_E4M3";
        case DType::F8_E5M2: return "F8_E5M2";
        case DType::I64: return "I64";
        case DType::I32: return "I32";
        case DType::I16: return "I16";
        case DType::I8: return "I8";
        case DType::U8: return "U8";
        case DType::BOOL: return "BOOL";
        case DType::Ggml: return "GGML";
    }
    return "?";
}

}  // namespace easel::io

namespace easel::io::detail {

size_t dtype_size(DType d) {
    switch (d) {
        case DType::F64: case DType::I64: return 8;
        case DType::F32: case DType::I32: return 4;
        case DType::F16: case DType::BF16: case DType::I16: return 2;
        case DType::F8_E4M3: case DType::F8_E5M2: case DType::I8: case DType::U8: case DType::BOOL: return 1;
        case DType::Ggml: return 0;
    }
    return 0;
}

ggml_type dtype_ggml_type(DType d) {
    switch (d) {
        case DType::F64: return GGML_TYPE_F64;
        case DType::F32: return GGML_TYPE_F32;
        case DType::F16: return GGML_TYPE_F16;
        case DType::BF16: return GGML_TYPE_BF16;
        case DType::I64: return GGML_TYPE_I64;
        case DType::I32: return GGML_TYPE_I32;
        case DType::I16: return GGML_TYPE_I16;
        case DType::I8: return GGML_TYPE_I8;
        default: return GGML_TYPE_COUNT;
    }
}

std::optional<DType> dtype_from_name(std::string_view s) {
    static const std::pair<std::string_view, DType> names[] = {
        {"F64", DType::F64}, {"F32", DType::F32},         {"F16", DType::F16},         {"BF16", DType::BF16},
        {"F8_E4M3", DType::F8_E4M3}, {"F8_E5M2", DType::F8_E5M2}, {"I64", DType::I64}, {"I32", DType::I32},
        {"I16", DType::I16}, {"I8", DType::I8},           {"U8", DType::U8},           {"BOOL", DType::BOOL},
    };
    for (auto& [n, d] : names)
        if (n == s) return d;
    return std::nullopt;
}

bool is_float(DType d, ggml_type g) {
    switch (d) {
        case DType::F64: case DType::F32: case DType::F16: case DType::BF16: case DType::F8_E4M3: case DType::F8_E5M2:
            return true;
        case DType::Ggml:
            return g == GGML_TYPE_F32 || g == GGML_TYPE_F16 || g == GGML_TYPE_BF16 || g == GGML_TYPE_F64 || ggml_is_quantized(g);
        default: return false;
    }
}

float f8_e4m3_to_f32(uint8_t v) {
    const int s = v >> 7, e = (v >> 3) & 0xf, m = v & 7;
    float r;
    if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
    if (e == 0) r = std::ldexp((float)m / 8.0f, -6);
    else r = std::ldexp(1.0f + (float)m / 8.0f, e - 7);
    return s ? -r : r;
}

float f8_e5m2_to_f32(uint8_t v) {
    const int s = v >> 7, e = (v >> 2) & 0x1f, m = v & 3;
    float r;
    if (e == 31) r = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
    else if (e == 0) r = std::ldexp((float)m / 4.0f, -14);
    else r = std::ldexp(1.0f + (float)m / 4.0f, e - 15);
    return s ? -r : r;
}

namespace {

template <class T>
void ints_to_f32(const uint8_t* src, int64_t n, float* dst) {
    for (int64_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, src + i * sizeof(T), sizeof(T));
        dst[i] = (float)v;
    }
}

struct F8Tables {
    float e4m3[256], e5m2[256];
    F8Tables() {
        for (int i = 0; i < 256; ++i) {
            e4m3[i] = f8_e4m3_to_f32((uint8_t)i);
            e5m2[i] = f8_e5m2_to_f32((uint8_t)i);
        }
    }
};
const F8Tables& f8_tables() {
    static const F8Tables t;
    return t;
}

// ggml's row converters read whole elements; copy through an aligned buffer when src is not
// aligned for the element type (safetensors data offsets are arbitrary).
template <class T, class F>
void aligned_rows(const uint8_t* src, int64_t n, float* dst, F f) {
    if (reinterpret_cast<uintptr_t>(src) % alignof(T) == 0) {
        f(reinterpret_cast<const T*>(src), dst, n);
        return;
    }
    constexpr int64_t kChunk = 4096;
    T tmp[kChunk];
    for (int64_t i = 0; i < n; i += kChunk) {
        int64_t k = std::min(kChunk, n - i);
        std::memcpy(tmp, src + i * sizeof(T), k * sizeof(T));
        f(tmp, dst + i, k);
    }
}

}  // namespace

void to_f32(const uint8_t* src, DType d, ggml_type g, int64_t n, float* dst) {
    if (n <= 0) return;
    if (d == DType::Ggml) {
        switch (g) {
            case GGML_TYPE_F32: d = DType::F32; break;
            case GGML_TYPE_F16: d = DType::F16; break;
            case GGML_TYPE_BF16: d = DType::BF16; break;
            case GGML_TYPE_F64: d = DType::F64; break;
            case GGML_TYPE_I64: d = DType::I64; break;
            case GGML_TYPE_I32: d = DType::I32; break;
            case GGML_TYPE_I16: d = DType::I16; break;
            case GGML_TYPE_I8: d = DType::I8; break;
            default: {
                const auto* tr = ggml_get_type_traits(g);
                if (!tr || !tr->to_float || tr->blck_size <= 0)
                    fail(ErrorKind::Unsupported, "ggml type {} cannot be converted to float32", ggml_type_name(g));
                if (n % tr->blck_size != 0)
                    fail(ErrorKind::InvalidInput, "{} elements are not a whole number of {} blocks of {}", n, ggml_type_name(g),
                         tr->blck_size);
                // Quantised blocks contain fp16 fields: keep the source aligned to 2 bytes at least.
                const size_t bytes = (size_t)(n / tr->blck_size) * tr->type_size;
                if (reinterpret_cast<uintptr_t>(src) % 4 == 0) {
                    tr->to_float(src, dst, n);
                } else {
                    std::vector<uint8_t> tmp(src, src + bytes);
                    tr->to_float(tmp.data(), dst, n);
                }
                return;
            }
        }
    }
    switch (d) {
        case DType::F32: std::memcpy(dst, src, n * sizeof(float)); return;
        case DType::F64:
            for (int64_t i = 0; i < n; ++i) {
                double v;
                std::memcpy(&v, src + i * 8, 8);
                dst[i] = (float)v;
            }
            return;
        case DType::F16:
            aligned_rows<ggml_fp16_t>(src, n, dst, [](const ggml_fp16_t* s, float* o, int64_t k) { ggml_fp16_to_fp32_row(s, o, k); });
            return;
        case DType::BF16:
            aligned_rows<ggml_bf16_t>(src, n, dst, [](const ggml_bf16_t* s, float* o, int64_t k) { ggml_bf16_to_fp32_row(s, o, k); });
            return;
        case DType::F8_E4M3: {
            const auto& t = f8_tables();
            for (int64_t i = 0; i < n; ++i) dst[i] = t.e4m3[src[i]];
            return;
        }
        case DType::F8_E5M2: {
            const auto& t = f8_tables();
            for (int64_t i = 0; i < n; ++i) dst[i] = t.e5m2[src[i]];
            return;
        }
        case DType::I64: ints_to_f32<int64_t>(src, n, dst); return;
        case DType::I32: ints_to_f32<int32_t>(src, n, dst); return;
        case DType::I16: ints_to_f32<int16_t>(src, n, dst); return;
        case DType::I8: ints_to_f32<int8_t>(src, n, dst); return;
        case DType::U8: ints_to_f32<uint8_t>(src, n, dst); return;
        case DType::BOOL:
            for (int64_t i = 0; i < n; ++i) dst[i] = src[i] ? 1.0f : 0.0f;
            return;
        case DType::Ggml: break;
    }
    fail(ErrorKind::Internal, "to_f32: unhandled dtype");
}

}  // namespace easel::io::detail
