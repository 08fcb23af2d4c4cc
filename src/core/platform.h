// The operating-system layer: everything easel needs from the OS that POSIX and Windows spell
// differently goes through these small functions, so that the rest of the code (src/, apps/)
// includes no <unistd.h>, <sys/...>, <fcntl.h> or <windows.h>.
// Implementations: platform_posix.cpp (Linux, macOS) and platform_win32.cpp (Windows: MinGW-w64
// and MSVC; every path goes through the wide-character APIs).
//
// Paths. On Windows a std::filesystem::path holds UTF-16, and converting it from or to a
// std::string uses the ANSI code page (MSVC) or the C library's locale (MinGW), which mangles
// or refuses a name such as "D:\files\Рабочий стол\model.safetensors". easel keeps path strings
// in UTF-8 everywhere (flags, JSON, messages) and converts at the boundary with u8path() and
// path_utf8(); on POSIX both are plain copies.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace easel::platform {

// ---------------------------------------------------------------------------------------------
// Paths and command line

/// A path from UTF-8 text (any platform; on Windows converted to UTF-16 as UTF-8, not as the
/// ANSI code page).
std::filesystem::path u8path(std::string_view utf8);
/// The path as UTF-8 text (for messages, JSON, and handing to C APIs that take UTF-8 such as
/// ggml's gguf/fopen wrappers).
std::string path_utf8(const std::filesystem::path& p);

/// The command line as UTF-8 strings, argv[0] included. POSIX: argv as given. Windows: read
/// again with GetCommandLineW + CommandLineToArgvW (main's argv is in the ANSI code page, which
/// cannot hold Cyrillic on a Western system), then converted to UTF-8.
std::vector<std::string> utf8_args(int argc, char** argv);

/// One-time console set-up: on Windows the console's output code page becomes UTF-8 (so that
/// UTF-8 messages print as text) and the console handles VT colour escapes; nothing on POSIX.
void init_console();

/// Whether `f` (stdout or stderr) is a terminal (POSIX isatty; Windows: a console handle).
bool is_terminal(std::FILE* f);

/// An environment variable as UTF-8, or nullopt when unset or empty (Windows: _wgetenv).
std::optional<std::string> env(const char* name);

/// easel's default per-user cache folder: Windows %LOCALAPPDATA%\easel\cache; elsewhere
/// $XDG_CACHE_HOME/easel, else $HOME/.cache/easel. Empty when none of these is set.
std::filesystem::path user_cache_dir();

// ---------------------------------------------------------------------------------------------
// Process

/// The process id.
int64_t process_id();
/// The running executable's full path (Linux /proc/self/exe, Windows GetModuleFileNameW);
/// empty when unknown.
std::filesystem::path executable_path();
/// Physical memory of the host in bytes; 0 when unknown.
uint64_t physical_memory_bytes();
/// Memory available to new allocations without swapping (Linux MemAvailable, Windows
/// ullAvailPhys) in bytes; 0 when unknown.
uint64_t available_memory_bytes();
/// Peak resident set size of this process in bytes (Linux VmHWM, else getrusage; Windows
/// PeakWorkingSetSize); 0 when unknown.
uint64_t peak_rss_bytes();
/// Resets the peak resident set size to the current one where the OS allows it (Linux
/// /proc/self/clear_refs; Windows: no); returns whether it did.
bool reset_peak_rss();

/// Installs `handler` for Ctrl-C and termination requests (POSIX SIGINT, SIGTERM, SIGHUP;
/// Windows CTRL_C/CTRL_BREAK/CTRL_CLOSE events). The handler runs in a signal handler (POSIX)
/// or on a separate thread (Windows): it may only do async-signal-safe work, such as setting an
/// atomic flag or writing to a pipe. A null handler restores the default behaviour.
void on_interrupt(void (*handler)(int));
/// Makes a write to a socket or pipe whose reader went away fail with an error (EPIPE) instead of
/// killing the process (POSIX SIGPIPE ignored; nothing to do on Windows).
void ignore_broken_pipe();

// ---------------------------------------------------------------------------------------------
// Files

/// Size and times of a file; nullopt when it cannot be stat'ed. Times in nanoseconds since the
/// Unix epoch.
struct FileInfo {
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    int64_t atime_ns = 0;
    bool is_directory = false;
};
std::optional<FileInfo> file_info(const std::filesystem::path& p);
/// Sets the file's access time to now (used as "last used" by the artifact cache, since
/// relatime/noatime mounts do not); returns false when it could not.
bool touch_access_time(const std::filesystem::path& p);

/// A read-only memory map of a whole file (POSIX mmap MAP_SHARED, Windows CreateFileMappingW +
/// MapViewOfFile). Empty files give an empty mapping (data() == nullptr, size() == 0).
class FileMapping {
public:
    FileMapping() = default;
    ~FileMapping();
    FileMapping(FileMapping&& o) noexcept;
    FileMapping& operator=(FileMapping&& o) noexcept;
    FileMapping(const FileMapping&) = delete;
    FileMapping& operator=(const FileMapping&) = delete;

    /// Maps `path`. Throws Error(Io) naming the file and the OS reason when it cannot be opened,
    /// stat'ed or mapped, and when it is a folder.
    static FileMapping open(const std::filesystem::path& path);

    const uint8_t* data() const { return static_cast<const uint8_t*>(base_); }
    uint64_t size() const { return size_; }

private:
    void* base_ = nullptr;
    uint64_t size_ = 0;
};

/// Writes `bytes` to `path` atomically: a new temporary file in the same folder
/// (".<name>.tmp-<pid>-<random>"), every byte written, the file flushed to the disk (fsync /
/// FlushFileBuffers), renamed over `path` (rename / MoveFileExW with MOVEFILE_REPLACE_EXISTING |
/// MOVEFILE_WRITE_THROUGH), then the folder flushed (fsync of the directory; Windows has no
/// equivalent and relies on the write-through move). A crash or a full disk at any moment leaves
/// either the previous `path` or the new one, never a mix. On failure the temporary file is
/// removed and Error(Io) is thrown with one line: "cannot write <path>: <reason>" (the reason
/// names a full disk as "no space left on the device"); `path` is as it was.
void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> bytes);

/// Flushes a folder's entries (names created, renamed, removed) to the disk. POSIX: fsync of the
/// directory; Windows: nothing (NTFS journals metadata; MOVEFILE_WRITE_THROUGH covers renames).
/// Returns false when it could not.
bool sync_directory(const std::filesystem::path& dir);

/// An exclusive advisory lock on a file (created when missing), held while the object lives
/// (POSIX flock LOCK_EX, Windows LockFileEx). Another process's try_lock on the same file fails
/// while it is held; a crashed holder's lock is released by the OS. The file is removed when the
/// lock is released (POSIX: while still held, and try_lock checks that the file it locked is still
/// the one at the path, so no two processes hold locks on one path).
class FileLock {
public:
    FileLock() = default;
    ~FileLock();
    FileLock(FileLock&& o) noexcept;
    FileLock& operator=(FileLock&& o) noexcept;
    FileLock(const FileLock&) = delete;
    FileLock& operator=(const FileLock&) = delete;

    /// The lock, or nullopt when another process holds it. Throws Error(Io) when the lock file
    /// cannot be created.
    static std::optional<FileLock> try_lock(const std::filesystem::path& path);
    bool held() const { return handle_ != -1; }

private:
    /// Removes the lock file and releases the lock (the destructor, on every exit path that
    /// unwinds; a killed process leaves the file, and the OS releases its lock).
    void release() noexcept;
    intptr_t handle_ = -1;
    std::filesystem::path path_;  ///< the lock file
};

// ---------------------------------------------------------------------------------------------
// Network

/// Whether a TCP connection to host:port succeeds within `timeout_ms` (non-blocking connect +
/// poll; Windows: Winsock, started on first use).
bool tcp_reachable(const std::string& host, const std::string& port, int timeout_ms);

}  // namespace easel::platform
