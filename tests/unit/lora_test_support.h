// Helpers of the LoRA tests: a small safetensors writer, the InvokeAI key lists as TensorInfo
// lists, and full-size module trees (built from configs: no weights) for the key maps.
#pragma once

#include "io/weight_index.h"
#include "lora/lora_file.h"

#include <ggml.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace lora_test {

namespace fs = std::filesystem;

inline const fs::path kData = EASEL_TEST_DATA;

/// One tensor to write: F32 values stored as F32 or F16.
struct StTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values;
    bool f16 = false;
};

/// Writes a safetensors file (tensors in the given order, optional __metadata__).
inline fs::path write_safetensors(const fs::path& path, const std::vector<StTensor>& ts,
                                  const std::map<std::string, std::string>& meta = {}) {
    nlohmann::ordered_json h;
    if (!meta.empty()) h["__metadata__"] = meta;
    std::vector<uint8_t> data;
    for (const auto& t : ts) {
        const size_t begin = data.size();
        if (t.f16) {
            for (float v : t.values) {
                ggml_fp16_t x = ggml_fp32_to_fp16(v);
                const auto* p = reinterpret_cast<const uint8_t*>(&x);
                data.insert(data.end(), p, p + 2);
            }
        } else {
            const auto* p = reinterpret_cast<const uint8_t*>(t.values.data());
            data.insert(data.end(), p, p + t.values.size() * 4);
        }
        h[t.name] = {{"dtype", t.f16 ? "F16" : "F32"}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
    }
    std::string hs = h.dump();
    while ((hs.size() + 8) % 8) hs += ' ';
    std::ofstream f(path, std::ios::binary);
    const uint64_t n = hs.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(hs.data(), (std::streamsize)hs.size());
    f.write(reinterpret_cast<const char*>(data.data()), (std::streamsize)data.size());
    return path;
}

/// A fresh empty folder under the temp dir.
inline fs::path temp_dir(const std::string& name) {
    fs::path d = fs::temp_directory_path() / ("easel_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

/// tests/data/io/lora-keys/<name>.json as (name, shape) infos (F32, no data).
inline std::vector<easel::io::TensorInfo> lora_keys(const std::string& name) {
    std::ifstream f(kData / "io" / "lora-keys" / (name + ".json"));
    auto j = nlohmann::json::parse(f);
    std::vector<easel::io::TensorInfo> v;
    for (auto& [k, s] : j["state_dict_keys"].items()) {
        easel::io::TensorInfo t;
        t.name = k;
        t.shape = s.get<std::vector<int64_t>>();
        t.nbytes = (uint64_t)std::max<int64_t>(t.numel(), 0) * 4;
        v.push_back(std::move(t));
    }
    return v;
}

/// Tensors of the given names/shapes with values v0, v0 + step, ...
inline StTensor ramp(const std::string& name, std::vector<int64_t> shape, float v0 = 0.1f, float step = 0.01f) {
    StTensor t{name, shape, {}};
    int64_t n = 1;
    for (auto d : shape) n *= d;
    for (int64_t i = 0; i < n; ++i) t.values.push_back(v0 + step * (float)(i % 97) - 0.4f * (float)((i / 97) % 2));
    return t;
}

}  // namespace lora_test
