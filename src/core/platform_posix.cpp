// The platform layer on POSIX systems (Linux; macOS where noted). See platform.h.
#ifndef _WIN32

#include "core/platform.h"

#include "core/error.h"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace easel::platform {

namespace fs = std::filesystem;

std::vector<std::string> utf8_args(int argc, char** argv) { return std::vector<std::string>(argv, argv + argc); }

void init_console() {}

bool is_terminal(std::FILE* f) { return f && ::isatty(::fileno(f)) == 1; }

std::optional<std::string> env(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) return std::nullopt;
    return std::string(v);
}

fs::path user_cache_dir() {
    if (auto x = env("XDG_CACHE_HOME")) return fs::path(*x) / "easel";
    if (auto h = env("HOME")) return fs::path(*h) / ".cache" / "easel";
    return {};
}

int64_t process_id() { return (int64_t)::getpid(); }

fs::path executable_path() {
    std::error_code ec;
    fs::path p = fs::read_symlink("/proc/self/exe", ec);
    return ec ? fs::path() : p;
}

uint64_t physical_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

uint64_t available_memory_bytes() {
    std::ifstream f("/proc/meminfo");
    std::string k, unit;
    uint64_t v = 0;
    while (f >> k >> v >> unit)
        if (k == "MemAvailable:") return v * 1024;
    return 0;
}

uint64_t peak_rss_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmHWM:", 0) == 0) return (uint64_t)std::stoull(line.substr(6)) * 1024;
    rusage ru{};
    if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
#ifdef __APPLE__
    return (uint64_t)ru.ru_maxrss;  // bytes on macOS
#else
    return (uint64_t)ru.ru_maxrss * 1024;  // KiB on Linux
#endif
}

bool reset_peak_rss() {
    std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    const bool ok = std::fputs("5", f) >= 0;  // "5": reset VmHWM to the current RSS
    return std::fclose(f) == 0 && ok;
}

void on_interrupt(void (*handler)(int)) {
    struct sigaction sa {};
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = handler ? handler : SIG_DFL;
    for (int s : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &sa, nullptr);
}

void ignore_broken_pipe() { std::signal(SIGPIPE, SIG_IGN); }

std::optional<FileInfo> file_info(const fs::path& p) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return std::nullopt;
    FileInfo i;
    i.size = (uint64_t)st.st_size;
    i.is_directory = S_ISDIR(st.st_mode);
#ifdef __APPLE__
    i.mtime_ns = (int64_t)st.st_mtimespec.tv_sec * 1000000000 + st.st_mtimespec.tv_nsec;
    i.atime_ns = (int64_t)st.st_atimespec.tv_sec * 1000000000 + st.st_atimespec.tv_nsec;
#else
    i.mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    i.atime_ns = (int64_t)st.st_atim.tv_sec * 1000000000 + st.st_atim.tv_nsec;
#endif
    return i;
}

bool touch_access_time(const fs::path& p) {
    struct timespec ts[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
    return ::utimensat(AT_FDCWD, p.c_str(), ts, 0) == 0;
}

// ---- FileMapping

FileMapping::~FileMapping() {
    if (base_) ::munmap(base_, (size_t)size_);
}
FileMapping::FileMapping(FileMapping&& o) noexcept : base_(o.base_), size_(o.size_) {
    o.base_ = nullptr;
    o.size_ = 0;
}
FileMapping& FileMapping::operator=(FileMapping&& o) noexcept {
    if (this != &o) {
        if (base_) ::munmap(base_, (size_t)size_);
        base_ = o.base_;
        size_ = o.size_;
        o.base_ = nullptr;
        o.size_ = 0;
    }
    return *this;
}

FileMapping FileMapping::open(const fs::path& path) {
    const std::string name = path_utf8(path);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(ErrorKind::Io, "cannot open '{}': {}", name, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        fail(ErrorKind::Io, "cannot stat '{}': {}", name, std::strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        ::close(fd);
        fail(ErrorKind::Io, "'{}' is a folder, not a weight file", name);
    }
    FileMapping m;
    if (st.st_size > 0) {
        void* p = ::mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            ::close(fd);
            fail(ErrorKind::Io, "cannot map '{}' into memory: {}", name, std::strerror(e));
        }
        m.base_ = p;
        m.size_ = (uint64_t)st.st_size;
    }
    ::close(fd);
    return m;
}

// ---- atomic writes

namespace {

std::string reason(int e) { return e == ENOSPC || e == EDQUOT ? "no space left on the device" : std::strerror(e); }

}  // namespace

bool sync_directory(const fs::path& dir) {
    int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return false;
    const bool ok = ::fsync(dfd) == 0;
    ::close(dfd);
    return ok;
}

void write_file_atomic(const fs::path& path, std::span<const uint8_t> bytes) {
    const std::string name = path_utf8(path);
    fs::path dir = path.parent_path();
    if (dir.empty()) dir = ".";
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) fail(ErrorKind::Io, "cannot write {}: folder {} does not exist", name, path_utf8(dir));
    std::random_device rd;
    const fs::path tmp = dir / fmt::format(".{}.tmp-{}-{:08x}", path.filename().string(), process_id(), rd());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) fail(ErrorKind::Io, "cannot write {}: cannot create a temporary file in {} ({})", name, path_utf8(dir), reason(errno));
    auto give_up = [&](const char* step, int e) {
        ::close(fd);
        ::unlink(tmp.c_str());
        fail(ErrorKind::Io, "cannot write {}: {} ({}); the previous file, if any, is unchanged", name, step, reason(e));
    };
    const uint8_t* p = bytes.data();
    size_t n = bytes.size();
    while (n > 0) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            give_up("write failed", errno);
        }
        p += w;
        n -= (size_t)w;
    }
    if (::fsync(fd) != 0) give_up("fsync failed", errno);
    if (::close(fd) != 0) {
        int e = errno;
        ::unlink(tmp.c_str());
        fail(ErrorKind::Io, "cannot write {}: close failed ({}); the previous file, if any, is unchanged", name, reason(e));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        int e = errno;
        ::unlink(tmp.c_str());
        fail(ErrorKind::Io, "cannot write {}: cannot rename the temporary file into place ({})", name, reason(e));
    }
    // The rename is durable once the folder's entry is on the disk.
    sync_directory(dir);
}

// ---- FileLock

void FileLock::release() noexcept {
    if (handle_ == -1) return;
    // unlinked while still held: a process that opened the old file meanwhile finds it gone
    // once it gets the lock (try_lock compares the inodes) and tries again on a new file
    ::unlink(path_.c_str());
    ::close((int)handle_);  // closing the descriptor releases the flock
    handle_ = -1;
}

std::optional<FileLock> FileLock::try_lock(const fs::path& path) {
    for (int attempt = 0; attempt < 16; ++attempt) {
        int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) fail(ErrorKind::Io, "cannot create lock file {} ({})", path_utf8(path), std::strerror(errno));
        if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
            ::close(fd);
            return std::nullopt;
        }
        struct stat held {}, named {};
        if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
            FileLock l;
            l.handle_ = fd;
            l.path_ = path;
            return l;
        }
        ::close(fd);  // the file was removed (released by its holder) after it was opened here: again
    }
    return std::nullopt;
}

// ---- network

bool tcp_reachable(const std::string& host, const std::string& port, int timeout_ms) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || !res) return false;
    bool ok = false;
    for (addrinfo* a = res; a && !ok; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
        int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
        if (r == 0) ok = true;
        else if (errno == EINPROGRESS) {
            pollfd pf{fd, POLLOUT, 0};
            if (::poll(&pf, 1, timeout_ms) == 1) {
                int err = 0;
                socklen_t len = sizeof err;
                ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                ok = err == 0;
            }
        }
        ::close(fd);
    }
    ::freeaddrinfo(res);
    return ok;
}

}  // namespace easel::platform

#endif  // !_WIN32
