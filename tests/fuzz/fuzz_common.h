// Shared pieces of the libFuzzer targets (tests/fuzz/fuzz_*.cpp; tests/fuzz/README.md).
// Contract of every target: any input ends in a return or an easel::Error; anything else (a
// crash, an abort, a sanitizer report, another exception type, a broken round trip that the
// target checks with EASEL_FUZZ_CHECK) is a finding.
#pragma once

#include "core/error.h"
#include "io/detect.h"
#include "io/weight_index.h"

#include <ggml.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

/// Aborts (a finding) with the condition's text when `cond` is false.
#define EASEL_FUZZ_CHECK(cond)                                                              \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            std::fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            std::abort();                                                                   \
        }                                                                                   \
    } while (0)

namespace easel::fuzz {

inline void silence_ggml() {
    static bool done = false;
    if (!done) {
        ggml_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
        done = true;
    }
}

/// Reads an input piece by piece: a byte, a length-prefixed string, the rest.
struct Reader {
    const uint8_t* p;
    size_t n;
    uint8_t byte() {
        if (!n) return 0;
        --n;
        return *p++;
    }
    /// A string of up to 255 bytes (its length is the next byte).
    std::string str() {
        size_t k = byte();
        if (k > n) k = n;
        std::string s((const char*)p, k);
        p += k;
        n -= k;
        return s;
    }
    std::string_view rest() const { return {(const char*)p, n}; }
};

/// The weight-file readers: open the bytes through WeightIndex::open_memory; every tensor that
/// opens is read back (bounded) and detection runs, so dtype conversions are fuzzed too.
inline int run_weight_file(const uint8_t* data, size_t size, const char* name) {
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
