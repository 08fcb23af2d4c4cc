#include "core/hash.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstdint>

namespace easel {

std::string content_key(const std::vector<std::string>& parts) {
    XXH3_state_t* s = XXH3_createState();
    XXH3_128bits_reset(s);
    for (auto& p : parts) {
        uint64_t n = p.size();
        XXH3_128bits_update(s, &n, sizeof n);
        XXH3_128bits_update(s, p.data(), p.size());
    }
    XXH128_hash_t h = XXH3_128bits_digest(s);
    XXH3_freeState(s);
    return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

}  // namespace easel
