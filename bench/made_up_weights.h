// Made-up weight files for the full-size benchmarks: every parameter of a Block tree written
// as BF16 (the released checkpoints' type) to a safetensors file from a fixed-seed generator,
// so the model is then loaded through easel's ordinary load path (configuration inferred from
// the weights). Shared by easel-bench-zimage, easel-bench-flux and easel-bench-multigpu.
//
// Value distribution: matmul weights uniform in +-1/sqrt(fan_in) (fan_in = the innermost
// PyTorch dimension), other parameters uniform in +-0.02, norm scales 1 (the `ones` predicate).
#pragma once

#include "core/error.h"
#include "nn/block.h"

#include <ggml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace easel::bench {

/// splitmix64 (Steele, Lea, Flood 2014); one stream per tensor (seed ^ FNV-1a of the name).
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float sym() { return float((next() >> 40) * (1.0 / 8388608.0) - 1.0); }  ///< uniform in [-1, 1)
};

/// FNV-1a 64 of a string.
inline uint64_t name_hash(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
    return h;
}

/// Norm scales are 1: every Norm-role parameter (the default predicate of write_made_up_bf16).
inline bool norm_role_is_one(const std::string&, nn::ParamRole role) { return role == nn::ParamRole::Norm; }

/// `n` values uniform in [-1, 1) from stream `seed` (bench inputs).
inline std::vector<float> uniform_values(size_t n, uint64_t seed) {
    Rng r{seed};
    std::vector<float> v(n);
    for (auto& x : v) x = r.sym();
    return v;
}

/// Number of parameters (elements) in `root`.
inline int64_t count_params(nn::Block& root) {
    int64_t count = 0;
    root.visit_params("", [&](const std::string&, nn::Param& p) {
        int64_t n = 1;
        for (int64_t d : p.shape) n *= d;
        count += n;
    });
    return count;
}

/// Writes every parameter of `root` (its diffusers names) as BF16 made-up values (see the file
/// comment) to the safetensors file `path`; `ones(name, role)` says which parameters are norm
/// scales set to 1; `producer` goes into __metadata__. `threads` tensors are generated at a time
/// on as many threads (each tensor has its own stream, so the bytes do not depend on it).
/// Returns the parameter count. Throws Error(Io) when the file cannot be written (naming
/// --tmp-dir as the fix).
inline int64_t write_made_up_bf16(const std::filesystem::path& path, nn::Block& root, uint64_t seed, const std::string& producer,
                                  const std::function<bool(const std::string&, nn::ParamRole)>& ones = norm_role_is_one, int threads = 1) {
    struct P {
        std::string name;
        std::vector<int64_t> shape;
        nn::ParamRole role;
    };
    std::vector<P> ps;
    root.visit_params("", [&](const std::string& n, nn::Param& p) { ps.push_back({n, p.shape, p.role}); });
    nlohmann::json header = nlohmann::json::object();
    uint64_t off = 0;
    int64_t count = 0;
    for (auto& p : ps) {
        int64_t n = 1;
        for (int64_t d : p.shape) n *= d;
        header[p.name] = {{"dtype", "BF16"}, {"shape", p.shape}, {"data_offsets", {off, off + 2 * (uint64_t)n}}};
        off += 2 * (uint64_t)n;
        count += n;
    }
    header["__metadata__"] = {{"format", "pt"}, {"producer", producer}};
    std::string h = header.dump();
    while (h.size() % 8 != 0) h.push_back(' ');
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) fail(ErrorKind::Io, "cannot create the temporary weight file {}: choose another folder with --tmp-dir", path.string());
    uint64_t hl = h.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = (unsigned char)(hl >> (8 * i));
    f.write((const char*)le, 8);
    f.write(h.data(), (std::streamsize)h.size());
    // the values of tensor i as BF16
    auto fill = [&](const P& p, std::vector<ggml_bf16_t>& bf) {
        int64_t n = 1;
        for (int64_t d : p.shape) n *= d;
        std::vector<float> v((size_t)n);
        if (ones(p.name, p.role)) {
            std::fill(v.begin(), v.end(), 1.0f);
        } else {
            const float scale = p.role == nn::ParamRole::Weight ? 1.0f / std::sqrt((float)p.shape.back()) : 0.02f;
            Rng rng{seed ^ name_hash(p.name)};
            for (auto& x : v) x = scale * rng.sym();
        }
        bf.resize(v.size());
        ggml_fp32_to_bf16_row(v.data(), bf.data(), (int64_t)v.size());
    };
    const size_t group = (size_t)std::max(1, threads);
    std::vector<std::vector<ggml_bf16_t>> bufs(group);
    for (size_t first = 0; first < ps.size(); first += group) {
        const size_t last = std::min(ps.size(), first + group);
        if (last - first == 1) {
            fill(ps[first], bufs[0]);
        } else {
            std::vector<std::thread> pool;
            for (size_t i = first; i < last; ++i) pool.emplace_back([&, i] { fill(ps[i], bufs[i - first]); });
            for (auto& t : pool) t.join();
        }
        for (size_t i = first; i < last; ++i)
            f.write((const char*)bufs[i - first].data(), (std::streamsize)(bufs[i - first].size() * sizeof(ggml_bf16_t)));
    }
    f.close();
    if (!f) fail(ErrorKind::Io, "writing {} failed (disk full?): choose another folder with --tmp-dir", path.string());
    return count;
}

}  // namespace easel::bench
