#include "pipeline/cache.h"

#include "core/build_id.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/platform.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>

namespace easel::pipeline {

namespace fs = std::filesystem;

fs::path default_cache_dir() {
    fs::path d = platform::user_cache_dir();
    return d.empty() ? fs::path(".easel-cache") : d;
}

std::string hash_parts(const std::vector<std::string>& parts) { return content_key(parts); }

std::string cache_key(const std::vector<std::string>& parts) {
    std::vector<std::string> all;
    all.reserve(parts.size() + 1);
    all.push_back(build_identity());
    all.insert(all.end(), parts.begin(), parts.end());
    return hash_parts(all);
}

ArtifactCache::ArtifactCache(fs::path dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) fail(ErrorKind::Io, "cache folder {}: cannot create it ({}); pass --cache-dir DIR or --no-cache", platform::path_utf8(dir_), ec.message());
}

fs::path ArtifactCache::path(ArtifactKind kind, const std::string& key) const {
    return dir_ / artifact_kind_name(kind) / (key + ".safetensors");
}

std::optional<Artifact> ArtifactCache::get(ArtifactKind kind, const std::string& key) {
    const fs::path p = path(kind, key);
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) return std::nullopt;
    try {
        Artifact a = read_artifact(p, kind);
        // Mark as used: access time = now (explicitly, since relatime/noatime mounts may not).
        platform::touch_access_time(p);
        return a;
    } catch (const Error& e) {
        log::warn("cache entry {} refused ({}); deleting it", platform::path_utf8(p), e.what());
        fs::remove(p, ec);
        return std::nullopt;
    }
}

void ArtifactCache::put(const std::string& key, const Artifact& a) {
    const fs::path p = path(a.kind, key);
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
    try {
        write_artifact(p, a);
    } catch (const Error& e) {
        log::warn("cache: cannot store {} ({})", platform::path_utf8(p), e.what());
        return;
    }
    int n = evict();
    if (n > 0) log::info("cache: evicted {} least recently used entr{} (cap {:.0f} MiB)", n, n == 1 ? "y" : "ies", (double)max_bytes_ / 1048576.0);
}

namespace {
struct Entry {
    fs::path path;
    uint64_t bytes;
    int64_t atime_ns;
};
std::vector<Entry> entries(const fs::path& dir) {
    std::vector<Entry> r;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (!it->is_regular_file(ec) || it->path().extension() != ".safetensors") continue;
        const auto st = platform::file_info(it->path());
        if (!st) continue;
        r.push_back({it->path(), st->size, st->atime_ns});
    }
    return r;
}
}  // namespace

uint64_t ArtifactCache::total_bytes() const {
    uint64_t t = 0;
    for (auto& e : entries(dir_)) t += e.bytes;
    return t;
}

int ArtifactCache::evict() {
    auto es = entries(dir_);
    uint64_t total = 0;
    for (auto& e : es) total += e.bytes;
    if (total <= max_bytes_) return 0;
    std::sort(es.begin(), es.end(), [](const Entry& a, const Entry& b) { return a.atime_ns < b.atime_ns; });
    int n = 0;
    std::error_code ec;
    for (auto& e : es) {
        if (total <= max_bytes_) break;
        if (fs::remove(e.path, ec)) {
            total -= e.bytes;
            ++n;
        }
    }
    return n;
}

}  // namespace easel::pipeline
