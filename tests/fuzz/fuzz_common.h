// Shared body of the reader fuzz targets: open the bytes as a weight file through
// WeightIndex::open_memory; a malformed input must raise easel::Error, nothing else. Every
// tensor that opens is read back (bounded) and detection runs, so conversions are fuzzed too.
#pragma once

#include "core/error.h"
#include "io/detect.h"
#include "io/weight_index.h"

#include <ggml.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace easel::fuzz {

inline void silence_ggml() {
    static bool done = false;
    if (!done) {
        ggml_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
        done = true;
    }
}

inline int run_one(const uint8_t* data, size_t size, const char* name) {
    silence_ggml();
    try {
        auto wi = io::WeightIndex::open_memory(std::span<const uint8_t>(data, size), name);
        for (const auto& t : wi.tensors()) {
            if (t.numel() > (1 << 20)) continue;  // values of huge declared tensors are not the point
            try {
                (void)wi.read_f32(t);
            } catch (const Error&) {
            }
        }
        (void)io::detect(wi);
    } catch (const Error&) {
    }
    return 0;
}

}  // namespace easel::fuzz
