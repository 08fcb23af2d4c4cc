// A content-addressed cache of artifacts (prompt conditioning, encoded images), so a repeated
// prompt skips the text encoder and a repeated init image skips the VAE encoder.
//
// Layout: <dir>/<kind>/<key>.safetensors, where key is a hash of everything that decides the
// content (cache_key()). Entries are ordinary artifacts (artifact.h): a hit is verified like
// any artifact read (a corrupt entry is deleted and treated as a miss). Each hit sets the
// entry's access time, and after each insertion the least recently used entries (oldest
// access time) are deleted until the cache is within its size cap.
#pragma once

#include "pipeline/artifact.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace easel::pipeline {

/// platform::user_cache_dir() (Windows %LOCALAPPDATA%\easel\cache; elsewhere $XDG_CACHE_HOME/easel,
/// else $HOME/.cache/easel), else ./.easel-cache.
std::filesystem::path default_cache_dir();

/// Hash of the given parts: easel::content_key (core/hash.h: xxh3-128 of their length-prefixed
/// concatenation, 32 hex digits).
/// Stable across builds (content hashes stored in artifacts and checkpoints use it).
std::string hash_parts(const std::vector<std::string>& parts);

/// Key of a cache entry over the given parts: hash_parts of easel's build_identity()
/// (core/build_id.h: version, ggml commit, the binary's build-id) followed by the parts, so an
/// entry written by another build is never found (a stale result cannot mask a change in the
/// code that computes it).
std::string cache_key(const std::vector<std::string>& parts);

/// The cache in one folder with a size cap in bytes.
class ArtifactCache {
public:
    /// Creates the folder when needed. Throws Error(Io) when it cannot be created.
    ArtifactCache(std::filesystem::path dir, uint64_t max_bytes);

    const std::filesystem::path& dir() const { return dir_; }
    /// The entry's path (whether or not it exists).
    std::filesystem::path path(ArtifactKind kind, const std::string& key) const;
    /// The artifact under `key`, or nullopt on a miss (absent, or refused as corrupt: then it is
    /// deleted). Marks the entry as used now.
    std::optional<Artifact> get(ArtifactKind kind, const std::string& key);
    /// Stores `a` under `key` (atomic write), then evicts least recently used entries until
    /// the total is within the cap. I/O failures are logged as warnings, never thrown: the
    /// cache must not fail a job.
    void put(const std::string& key, const Artifact& a);
    /// Bytes of all entries.
    uint64_t total_bytes() const;
    /// Deletes least recently used entries until total_bytes() <= max; returns how many.
    int evict();

private:
    std::filesystem::path dir_;
    uint64_t max_bytes_;
};

}  // namespace easel::pipeline
