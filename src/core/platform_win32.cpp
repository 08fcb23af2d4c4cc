// The platform layer on Windows (MinGW-w64 and MSVC). See platform.h. Every path goes through
// the wide-character (UTF-16) APIs; text crosses into easel as UTF-8.
#ifdef _WIN32

#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#if !defined(_WIN32_WINNT) || _WIN32_WINNT < 0x0600
#undef _WIN32_WINNT
#define _WIN32_WINNT 0x0600  // WSAPoll: Windows Vista and later
#endif
#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>
#include <psapi.h>
#include <shellapi.h>
#include <io.h>

#include "core/platform.h"

#include "core/error.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <random>

namespace easel::platform {

namespace fs = std::filesystem;

namespace {

std::string to_utf8(const wchar_t* w, int n = -1) {
    if (!w) return {};
    int len = WideCharToMultiByte(CP_UTF8, 0, w, n, nullptr, 0, nullptr, nullptr);
    if (len <= 0) return {};
    std::string s((size_t)len, '\0');
    WideCharToMultiByte(CP_UTF8, 0, w, n, s.data(), len, nullptr, nullptr);
    if (n == -1 && !s.empty() && s.back() == '\0') s.pop_back();
    return s;
}

std::wstring to_wide(std::string_view s) {
    if (s.empty()) return {};
    int len = MultiByteToWideChar(CP_UTF8, 0, s.data(), (int)s.size(), nullptr, 0);
    std::wstring w((size_t)len, L'\0');
    MultiByteToWideChar(CP_UTF8, 0, s.data(), (int)s.size(), w.data(), len);
    return w;
}

/// The system's message for a Win32 error code, as one UTF-8 line.
std::string win_error(DWORD e) {
    if (e == ERROR_DISK_FULL || e == ERROR_HANDLE_DISK_FULL) return "no space left on the device";
    wchar_t* buf = nullptr;
    DWORD n = FormatMessageW(FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, nullptr, e,
                             MAKELANGID(LANG_NEUTRAL, SUBLANG_DEFAULT), (LPWSTR)&buf, 0, nullptr);
    std::string s = n ? to_utf8(buf, (int)n) : "Windows error " + std::to_string((unsigned long)e);
    if (buf) LocalFree(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '.')) s.pop_back();
    return s;
}

int64_t filetime_ns(const FILETIME& ft) {
    // FILETIME: 100 ns ticks since 1601-01-01; the Unix epoch is 11644473600 s later.
    const uint64_t t = ((uint64_t)ft.dwHighDateTime << 32) | ft.dwLowDateTime;
    return ((int64_t)t - 116444736000000000LL) * 100;
}

}  // namespace

std::vector<std::string> utf8_args(int argc, char** argv) {
    int n = 0;
    LPWSTR* w = CommandLineToArgvW(GetCommandLineW(), &n);
    if (!w) return std::vector<std::string>(argv, argv + argc);
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) out.push_back(to_utf8(w[i]));
    LocalFree(w);
    return out;
}

void init_console() {
    SetConsoleOutputCP(CP_UTF8);
    for (DWORD h : {STD_OUTPUT_HANDLE, STD_ERROR_HANDLE}) {
        HANDLE hd = GetStdHandle(h);
        DWORD mode = 0;
        if (hd != INVALID_HANDLE_VALUE && GetConsoleMode(hd, &mode)) SetConsoleMode(hd, mode | 0x0004 /* ENABLE_VIRTUAL_TERMINAL_PROCESSING */);
    }
}

bool is_terminal(std::FILE* f) {
    if (!f) return false;
    HANDLE h = (HANDLE)_get_osfhandle(_fileno(f));
    DWORD mode = 0;
    return h != INVALID_HANDLE_VALUE && GetConsoleMode(h, &mode);
}

std::optional<std::string> env(const char* name) {
    const wchar_t* v = _wgetenv(to_wide(name).c_str());
    if (!v || !*v) return std::nullopt;
    return to_utf8(v);
}

fs::path user_cache_dir() {
    if (auto x = env("LOCALAPPDATA")) return u8path(*x) / "easel" / "cache";
    if (auto h = env("USERPROFILE")) return u8path(*h) / ".cache" / "easel";
    return {};
}

int64_t process_id() { return (int64_t)GetCurrentProcessId(); }

fs::path executable_path() {
    std::wstring buf(32768, L'\0');
    DWORD n = GetModuleFileNameW(nullptr, buf.data(), (DWORD)buf.size());
    if (n == 0 || n >= buf.size()) return {};
    buf.resize(n);
    return fs::path(buf);
}

uint64_t physical_memory_bytes() {
    MEMORYSTATUSEX m{};
    m.dwLength = sizeof m;
    return GlobalMemoryStatusEx(&m) ? (uint64_t)m.ullTotalPhys : 0;
}

uint64_t available_memory_bytes() {
    MEMORYSTATUSEX m{};
    m.dwLength = sizeof m;
    return GlobalMemoryStatusEx(&m) ? (uint64_t)m.ullAvailPhys : 0;
}

uint64_t peak_rss_bytes() {
    PROCESS_MEMORY_COUNTERS pmc{};
    pmc.cb = sizeof pmc;
    return GetProcessMemoryInfo(GetCurrentProcess(), &pmc, sizeof pmc) ? (uint64_t)pmc.PeakWorkingSetSize : 0;
}

bool reset_peak_rss() { return false; }

namespace {
std::atomic<void (*)(int)> g_interrupt{nullptr};
BOOL WINAPI console_handler(DWORD type) {
    void (*h)(int) = g_interrupt.load();
    if (!h) return FALSE;
    switch (type) {
    case CTRL_C_EVENT: h(2); return TRUE;       // as SIGINT
    case CTRL_BREAK_EVENT:
    case CTRL_CLOSE_EVENT: h(15); return TRUE;  // as SIGTERM
    default: return FALSE;
    }
}
}  // namespace

void on_interrupt(void (*handler)(int)) {
    static std::once_flag once;
    std::call_once(once, [] { SetConsoleCtrlHandler(console_handler, TRUE); });
    g_interrupt.store(handler);
}

void ignore_broken_pipe() {}

std::optional<FileInfo> file_info(const fs::path& p) {
    WIN32_FILE_ATTRIBUTE_DATA d{};
    if (!GetFileAttributesExW(p.c_str(), GetFileExInfoStandard, &d)) return std::nullopt;
    FileInfo i;
    i.size = ((uint64_t)d.nFileSizeHigh << 32) | d.nFileSizeLow;
    i.mtime_ns = filetime_ns(d.ftLastWriteTime);
    i.atime_ns = filetime_ns(d.ftLastAccessTime);
    i.is_directory = (d.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) != 0;
    return i;
}

bool touch_access_time(const fs::path& p) {
    HANDLE h = CreateFileW(p.c_str(), FILE_WRITE_ATTRIBUTES, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr, OPEN_EXISTING,
                           FILE_ATTRIBUTE_NORMAL, nullptr);
    if (h == INVALID_HANDLE_VALUE) return false;
    FILETIME now{};
    GetSystemTimeAsFileTime(&now);
    const BOOL ok = SetFileTime(h, nullptr, &now, nullptr);
    CloseHandle(h);
    return ok != 0;
}

// ---- FileMapping

FileMapping::~FileMapping() {
    if (base_) UnmapViewOfFile(base_);
}
FileMapping::FileMapping(FileMapping&& o) noexcept : base_(o.base_), size_(o.size_) {
    o.base_ = nullptr;
    o.size_ = 0;
}
FileMapping& FileMapping::operator=(FileMapping&& o) noexcept {
    if (this != &o) {
        if (base_) UnmapViewOfFile(base_);
        base_ = o.base_;
        size_ = o.size_;
        o.base_ = nullptr;
        o.size_ = 0;
    }
    return *this;
}

FileMapping FileMapping::open(const fs::path& path) {
    const std::string name = path_utf8(path);
    std::error_code ec;
    if (fs::is_directory(path, ec)) fail(ErrorKind::Io, "'{}' is a folder, not a weight file", name);
    HANDLE f = CreateFileW(path.c_str(), GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_DELETE, nullptr, OPEN_EXISTING,
                           FILE_ATTRIBUTE_NORMAL, nullptr);
    if (f == INVALID_HANDLE_VALUE) fail(ErrorKind::Io, "cannot open '{}': {}", name, win_error(GetLastError()));
    LARGE_INTEGER size{};
    if (!GetFileSizeEx(f, &size)) {
        DWORD e = GetLastError();
        CloseHandle(f);
        fail(ErrorKind::Io, "cannot stat '{}': {}", name, win_error(e));
    }
    FileMapping m;
    if (size.QuadPart > 0) {
        HANDLE map = CreateFileMappingW(f, nullptr, PAGE_READONLY, 0, 0, nullptr);
        if (!map) {
            DWORD e = GetLastError();
            CloseHandle(f);
            fail(ErrorKind::Io, "cannot map '{}' into memory: {}", name, win_error(e));
        }
        void* p = MapViewOfFile(map, FILE_MAP_READ, 0, 0, 0);
        DWORD e = GetLastError();
        CloseHandle(map);  // the view keeps the mapping alive
        if (!p) {
            CloseHandle(f);
            fail(ErrorKind::Io, "cannot map '{}' into memory: {}", name, win_error(e));
        }
        m.base_ = p;
        m.size_ = (uint64_t)size.QuadPart;
    }
    CloseHandle(f);
    return m;
}

// ---- atomic writes

bool sync_directory(const fs::path&) { return true; }

void write_file_atomic(const fs::path& path, std::span<const uint8_t> bytes) {
    const std::string name = path_utf8(path);
    fs::path dir = path.parent_path();
    if (dir.empty()) dir = ".";
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) fail(ErrorKind::Io, "cannot write {}: folder {} does not exist", name, path_utf8(dir));
    std::random_device rd;
    const fs::path tmp = dir / (L"." + path.filename().wstring() + L".tmp-" + std::to_wstring(process_id()) + L"-" + std::to_wstring(rd()));
    HANDLE f = CreateFileW(tmp.c_str(), GENERIC_WRITE, 0, nullptr, CREATE_NEW, FILE_ATTRIBUTE_NORMAL, nullptr);
    if (f == INVALID_HANDLE_VALUE)
        fail(ErrorKind::Io, "cannot write {}: cannot create a temporary file in {} ({})", name, path_utf8(dir), win_error(GetLastError()));
    auto give_up = [&](const char* step, DWORD e) {
        CloseHandle(f);
        DeleteFileW(tmp.c_str());
        fail(ErrorKind::Io, "cannot write {}: {} ({}); the previous file, if any, is unchanged", name, step, win_error(e));
    };
    const uint8_t* p = bytes.data();
    size_t n = bytes.size();
    while (n > 0) {
        const DWORD chunk = (DWORD)std::min<size_t>(n, 1u << 30);
        DWORD w = 0;
        if (!WriteFile(f, p, chunk, &w, nullptr)) give_up("write failed", GetLastError());
        p += w;
        n -= w;
    }
    if (!FlushFileBuffers(f)) give_up("flush failed", GetLastError());
    CloseHandle(f);
    if (!MoveFileExW(tmp.c_str(), path.c_str(), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) {
        DWORD e = GetLastError();
        DeleteFileW(tmp.c_str());
        fail(ErrorKind::Io, "cannot write {}: cannot rename the temporary file into place ({})", name, win_error(e));
    }
}

// ---- FileLock

void FileLock::release() noexcept {
    if (handle_ == -1) return;
    CloseHandle((HANDLE)handle_);  // closing the handle releases the lock
    handle_ = -1;
    DeleteFileW(path_.c_str());  // best effort: a process that holds it open keeps it until it closes it
}

std::optional<FileLock> FileLock::try_lock(const fs::path& path) {
    HANDLE h = CreateFileW(path.c_str(), GENERIC_READ | GENERIC_WRITE, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                           OPEN_ALWAYS, FILE_ATTRIBUTE_NORMAL, nullptr);
    if (h == INVALID_HANDLE_VALUE) fail(ErrorKind::Io, "cannot create lock file {} ({})", path_utf8(path), win_error(GetLastError()));
    OVERLAPPED ov{};
    if (!LockFileEx(h, LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ov)) {
        CloseHandle(h);
        return std::nullopt;
    }
    FileLock l;
    l.handle_ = (intptr_t)h;
    l.path_ = path;
    return l;
}

// ---- network

bool tcp_reachable(const std::string& host, const std::string& port, int timeout_ms) {
    static const bool wsa_ok = [] {
        WSADATA d;
        return WSAStartup(MAKEWORD(2, 2), &d) == 0;
    }();
    if (!wsa_ok) return false;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || !res) return false;
    bool ok = false;
    for (addrinfo* a = res; a && !ok; a = a->ai_next) {
        SOCKET s = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (s == INVALID_SOCKET) continue;
        u_long nb = 1;
        ioctlsocket(s, FIONBIO, &nb);
        int r = connect(s, a->ai_addr, (int)a->ai_addrlen);
        if (r == 0) ok = true;
        else if (WSAGetLastError() == WSAEWOULDBLOCK) {
            WSAPOLLFD pf{s, POLLOUT, 0};
            if (WSAPoll(&pf, 1, timeout_ms) == 1) {
                int err = 0;
                int len = sizeof err;
                getsockopt(s, SOL_SOCKET, SO_ERROR, (char*)&err, &len);
                ok = err == 0;
            }
        }
        closesocket(s);
    }
    freeaddrinfo(res);
    return ok;
}

}  // namespace easel::platform

#endif  // _WIN32
