#include "pipeline/fingerprint.h"

#include "core/error.h"
#include "core/platform.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace easel::pipeline {

namespace fs = std::filesystem;

namespace {

/// Regular files standing for `p` (itself, or a folder's files sorted), as (label, path).
std::vector<std::pair<std::string, fs::path>> expand(const std::string& p8) {
    const fs::path p = platform::u8path(p8);
    std::vector<std::pair<std::string, fs::path>> r;
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
        for (auto it = fs::recursive_directory_iterator(p, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
            const auto name = platform::path_utf8(it->path().filename());
            if (!name.empty() && name[0] == '.') {
                if (it->is_directory(ec)) it.disable_recursion_pending();
                continue;
            }
            // labels as '/'-separated UTF-8, so that a fingerprint is the same on every platform
            if (it->is_regular_file(ec)) r.emplace_back(platform::path_utf8(fs::relative(it->path(), p, ec).generic_string<char8_t>()), it->path());
        }
        std::sort(r.begin(), r.end());
    } else {
        r.emplace_back(platform::path_utf8(p.filename()), p);
    }
    return r;
}

void upd(XXH3_state_t* s, const std::string& v) {
    uint64_t n = v.size();
    XXH3_128bits_update(s, &n, sizeof n);
    XXH3_128bits_update(s, v.data(), v.size());
}

std::string digest(XXH3_state_t* s) {
    XXH128_hash_t h = XXH3_128bits_digest(s);
    XXH3_freeState(s);
    return fmt::format("xxh3-128:{:016x}{:016x}", h.high64, h.low64);
}

}  // namespace

std::string model_fingerprint(const std::vector<std::string>& paths, bool full) {
    XXH3_state_t* s = XXH3_createState();
    XXH3_128bits_reset(s);
    upd(s, full ? "full" : "fast");
    std::vector<char> buf(1 << 20);
    for (const auto& p : paths) {
        for (auto& [label, f] : expand(p)) {
            const auto st = platform::file_info(f);
            if (!st) {
                XXH3_freeState(s);
                fail(ErrorKind::Io, "{}: cannot read ({})", platform::path_utf8(f), std::strerror(errno));
            }
            std::ifstream in(f, std::ios::binary);
            if (!in) {
                XXH3_freeState(s);
                fail(ErrorKind::Io, "{}: cannot open ({})", platform::path_utf8(f), std::strerror(errno));
            }
            const uint64_t size = st->size;
            upd(s, label);
            XXH3_128bits_update(s, &size, sizeof size);
            auto read_at = [&](uint64_t off, uint64_t len) {
                in.clear();
                in.seekg((std::streamoff)off);
                while (len > 0) {
                    size_t k = (size_t)std::min<uint64_t>(len, buf.size());
                    in.read(buf.data(), (std::streamsize)k);
                    size_t got = (size_t)in.gcount();
                    XXH3_128bits_update(s, buf.data(), got);
                    if (got < k) break;
                    len -= k;
                }
            };
            if (full || size < (4u << 20)) {
                read_at(0, size);
            } else {
                const int64_t mtime_ns = st->mtime_ns;
                XXH3_128bits_update(s, &mtime_ns, sizeof mtime_ns);
                const uint64_t chunk = 64 << 10;
                read_at(0, 1 << 20);
                for (int i = 0; i < 32; ++i) read_at((size - chunk) / 31 * (uint64_t)i, chunk);
                read_at(size - chunk, chunk);
            }
            if (!full && size < (4u << 20)) {
                const int64_t mtime_ns = st->mtime_ns;
                XXH3_128bits_update(s, &mtime_ns, sizeof mtime_ns);
            }
        }
    }
    return digest(s);
}

std::string file_identity(const std::vector<std::string>& paths) {
    XXH3_state_t* s = XXH3_createState();
    XXH3_128bits_reset(s);
    for (const auto& p : paths) {
        std::error_code ec;
        upd(s, platform::path_utf8(fs::weakly_canonical(platform::u8path(p), ec)));
        for (auto& [label, f] : expand(p)) {
            upd(s, label);
            const auto st = platform::file_info(f);
            if (!st) {
                upd(s, "missing");
                continue;
            }
            const int64_t v[2] = {(int64_t)st->size, st->mtime_ns};
            XXH3_128bits_update(s, v, sizeof v);
        }
    }
    return digest(s);
}

}  // namespace easel::pipeline
