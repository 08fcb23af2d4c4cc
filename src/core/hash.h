// Content keys: a hash naming a thing by everything that decides it (cache entries, measured
// sizes), shared by the layers that keep such records (pipeline/cache.h, placement/autofit.h).
#pragma once

#include <string>
#include <vector>

namespace easel {

/// Key over the given parts: XXH3-128 of their length-prefixed concatenation (each part's byte
/// count as a uint64_t in host order, then its bytes), as 32 lowercase hex digits (high 64 bits
/// first). Distinct part lists give distinct inputs (the lengths delimit the parts). Throws nothing.
std::string content_key(const std::vector<std::string>& parts);

}  // namespace easel
