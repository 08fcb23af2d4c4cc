// The parts of the platform layer that standard C++ spells the same everywhere (platform.h).
#include "core/platform.h"

#include <utility>

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

// FileLock's moves and destructor, over each platform's release()
FileLock::~FileLock() { release(); }
FileLock::FileLock(FileLock&& o) noexcept : handle_(o.handle_), path_(std::move(o.path_)) { o.handle_ = -1; }
FileLock& FileLock::operator=(FileLock&& o) noexcept {
    if (this != &o) {
        release();
        handle_ = o.handle_;
        path_ = std::move(o.path_);
        o.handle_ = -1;
    }
    return *this;
}

}  // namespace easel::platform
