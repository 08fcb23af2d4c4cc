// The parts of the platform layer that standard C++ spells the same everywhere (platform.h).
#include "core/platform.h"

namespace easel::platform {

std::filesystem::path u8path(std::string_view utf8) {
    // C++20: a path from char8_t text is UTF-8 on every implementation (MSVC, libstdc++ on
    // MinGW, POSIX); from char it would be the ANSI code page / the C locale on Windows.
    return std::filesystem::path(std::u8string(utf8.begin(), utf8.end()));
}

std::string path_utf8(const std::filesystem::path& p) {
    const std::u8string s = p.u8string();
    return std::string(s.begin(), s.end());
}

}  // namespace easel::platform
