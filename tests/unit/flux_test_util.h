// Helpers of the FLUX tests: fixture access, in-memory safetensors files, error measures.
#pragma once

#include "io/weight_index.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace easel::fluxtest {

inline std::filesystem::path ref(const std::string& name) { return std::filesystem::path(EASEL_TEST_DATA) / "reference" / name; }

/// A float tensor by name (PyTorch shape, row-major values).
struct T {
    std::vector<int64_t> shape;
    std::vector<float> data;
};
using TensorMap = std::map<std::string, T>;

/// Every tensor of a fixture file as F32 (integer inputs converted), split into weights
/// (names without "__") and the rest.
inline void read_fixture(const io::WeightIndex& idx, TensorMap& weights, TensorMap& io) {
    for (const auto& t : idx.tensors()) {
        if (t.shape.empty()) continue;  // scalar buffers (num_batches_tracked)
        T v{t.shape, {}};
        if (t.dtype == io::DType::I64) {
            auto i = idx.read_i64(t);
            v.data.assign(i.begin(), i.end());
        } else {
            v.data = idx.read_f32(t);
        }
        (t.name.rfind("__", 0) == 0 ? io : weights)[t.name] = std::move(v);
    }
}

/// An F32 safetensors file image of `ts` (to open with io::WeightIndex::open_memory).
inline std::vector<uint8_t> safetensors_bytes(const TensorMap& ts) {
    nlohmann::json h = nlohmann::json::object();
    size_t off = 0;
    for (const auto& [name, t] : ts) {
        h[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + t.data.size() * 4}}};
        off += t.data.size() * 4;
    }
    std::string hs = h.dump();
    while (hs.size() % 8) hs += ' ';
    std::vector<uint8_t> out(8 + hs.size() + off);
    const uint64_t n = hs.size();
    std::memcpy(out.data(), &n, 8);
    std::memcpy(out.data() + 8, hs.data(), hs.size());
    size_t p = 8 + hs.size();
    for (const auto& [name, t] : ts) {
        std::memcpy(out.data() + p, t.data.data(), t.data.size() * 4);
        p += t.data.size() * 4;
    }
    return out;
}

/// Rows of several tensors stacked along dim 0 (torch.cat(dim=0)).
inline T cat_rows(const std::vector<const T*>& parts) {
    T r{parts.at(0)->shape, {}};
    r.shape[0] = 0;
    for (const T* p : parts) {
        r.shape[0] += p->shape[0];
        r.data.insert(r.data.end(), p->data.begin(), p->data.end());
    }
    return r;
}

/// The two row halves of a tensor swapped (diffusers swap_scale_shift).
inline T swap_halves(const T& t) {
    T r = t;
    const size_t half = t.data.size() / 2;
    std::copy(t.data.begin() + long(half), t.data.end(), r.data.begin());
    std::copy(t.data.begin(), t.data.begin() + long(half), r.data.begin() + long(t.data.size() - half));
    return r;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

}  // namespace easel::fluxtest
