#include "io/mapped_file.h"

#include "core/error.h"

#include <cerrno>
#include <cstring>
#include <memory>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace easel::io {

MappedFile::~MappedFile() {
    if (map_) munmap(map_, (size_t)size_);
}

std::unique_ptr<MappedFile> MappedFile::open(const std::filesystem::path& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(ErrorKind::Io, "cannot open '{}': {}", path.string(), std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        fail(ErrorKind::Io, "cannot stat '{}': {}", path.string(), std::strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        ::close(fd);
        fail(ErrorKind::Io, "'{}' is a folder, not a weight file", path.string());
    }
    auto m = std::make_unique<MappedFile>();
    m->size_ = (uint64_t)st.st_size;
    if (m->size_ > 0) {
        void* p = mmap(nullptr, (size_t)m->size_, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            ::close(fd);
            fail(ErrorKind::Io, "cannot map '{}' into memory: {}", path.string(), std::strerror(e));
        }
        m->map_ = p;
        m->data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
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
