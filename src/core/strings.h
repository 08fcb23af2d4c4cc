// Small string helpers shared across the library.
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace easel {

/// ASCII lower-case copy of s (for case-insensitive option and device names; not Unicode).
inline std::string ascii_lower(std::string_view s) {
    std::string r(s);
    for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return r;
}

}  // namespace easel
