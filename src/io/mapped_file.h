// Read-only memory mapping of a whole file (platform::FileMapping: mmap / MapViewOfFile), or an
// owned in-memory copy.
// Internal to src/io.
#pragma once

#include "core/platform.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

namespace easel::io {

/// A read-only byte range backed by a file mapping (files) or by an owned vector (open_memory()).
/// Errors: open() throws Error(Io) naming the file and the OS reason when it cannot be opened,
/// stat'ed or mapped. An empty file is mapped as an empty span (no error here).
class MappedFile {
public:
    MappedFile() = default;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    /// Maps `path` read-only.
    static std::unique_ptr<MappedFile> open(const std::filesystem::path& path);
    /// Takes a copy of `bytes`.
    static std::unique_ptr<MappedFile> from_memory(std::span<const uint8_t> bytes);
    /// Takes ownership of `bytes` (no copy).
    static std::unique_ptr<MappedFile> adopt(std::vector<uint8_t>&& bytes);

    const uint8_t* data() const { return data_; }
    uint64_t size() const { return size_; }
    std::span<const uint8_t> span() const { return {data_, (size_t)size_}; }

private:
    const uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
    platform::FileMapping map_;  // the mapping when mapped
    std::vector<uint8_t> owned_;
};

}  // namespace easel::io
