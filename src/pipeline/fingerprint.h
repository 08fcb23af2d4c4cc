// Model fingerprints: a short hash that says "the same weight files" for artifacts, resume
// checks and cache keys.
//
// fast (default): per file its name, size, modification time (ns), and XXH3-128 of the first
//   1 MiB (the header: tensor names, shapes, metadata) plus 32 chunks of 64 KiB at evenly spaced
//   offsets and the last 64 KiB; files under 4 MiB are hashed whole. Reads ~3 MiB per file.
// full: per file its name, size and the XXH3-128 of every byte (mtime not included, so a copy
//   of the file has the same full fingerprint).
// A folder (diffusers component, sharded model) stands for its regular files, recursively,
// in sorted order, hidden files excluded.
#pragma once

#include <string>
#include <vector>

namespace easel::pipeline {

/// "xxh3-128:<32 hex>" over the files (in the order given). Throws Error(Io) when a file
/// cannot be read.
std::string model_fingerprint(const std::vector<std::string>& paths, bool full = false);

/// Identity of files from stat() alone (canonical path, size, mtime ns): no file is opened, so
/// it can key a cache without touching a text encoder's weights. A missing file contributes
/// "missing". Returns "xxh3-128:<32 hex>".
std::string file_identity(const std::vector<std::string>& paths);

}  // namespace easel::pipeline
