#include "io/mapped_file.h"

#include <memory>

namespace easel::io {

std::unique_ptr<MappedFile> MappedFile::open(const std::filesystem::path& path) {
    auto m = std::make_unique<MappedFile>();
    m->map_ = platform::FileMapping::open(path);
    m->data_ = m->map_.data();
    m->size_ = m->map_.size();
    return m;
}

std::unique_ptr<MappedFile> MappedFile::from_memory(std::span<const uint8_t> bytes) {
    auto m = std::make_unique<MappedFile>();
    m->owned_.assign(bytes.begin(), bytes.end());
    m->data_ = m->owned_.data();
    m->size_ = m->owned_.size();
    return m;
}

std::unique_ptr<MappedFile> MappedFile::adopt(std::vector<uint8_t>&& bytes) {
    auto m = std::make_unique<MappedFile>();
    m->owned_ = std::move(bytes);
    m->data_ = m->owned_.data();
    m->size_ = m->owned_.size();
    return m;
}

}  // namespace easel::io
