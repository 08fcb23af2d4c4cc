// Test helper: `easel rpc-server` processes on 127.0.0.1 serving this machine's CPU, registered
// with ggml as RPC devices, for the multi-device placement tests (CPU CI has no second device).
#pragma once

#include "core/error.h"
#include "placement/devices.h"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace easel::test_support {

/// `n` easel rpc-servers (`--port 0 --device CPU --threads 1`), each on a port the OS hands out
/// and that the server holds (placement/rpc_listen.h), so no two tests can meet on a port and no
/// server already listening is ever used. A server writes "HOST:PORT PID" to its --port-file in
/// this object's temporary folder once its own socket listens; the pid must be the one spawned
/// here (the check that the server is this test's own). A server is given up to 60 s to listen:
/// on a GPU build each server process initialises the GPUs' backends first, which takes more
/// than 10 s on a two-GPU machine.
///
/// The constructor throws easel::Error, naming the server and the last line of its log, when a
/// server does not come up (or the build has no RPC): a multi-device test cannot go green
/// without its devices. `devices` holds the ggml names of the n RPC devices, in order. The
/// servers are killed and their folder removed on destruction.
struct RpcServers {
    std::vector<pid_t> pids;
    std::vector<std::string> devices;
    std::vector<std::string> endpoints;
    std::filesystem::path dir;

    explicit RpcServers(int n) {
#ifdef EASEL_HAS_RPC
        namespace fs = std::filesystem;
        std::string tmpl = (fs::temp_directory_path() / "easel_rpc_XXXXXX").string();
        if (!::mkdtemp(tmpl.data())) fail(ErrorKind::Io, "cannot create a temporary folder {}: {}", tmpl, std::strerror(errno));
        dir = tmpl;
        try {
            for (int i = 0; i < n; ++i) start(i);
        } catch (...) {
            stop();
            throw;
        }
#else
        (void)n;
        throw Error(ErrorKind::Unsupported, "the multi-device tests need RPC: configure with -DEASEL_RPC=ON");
#endif
    }
    RpcServers(const RpcServers&) = delete;
    RpcServers& operator=(const RpcServers&) = delete;
    ~RpcServers() { stop(); }

private:
    static std::string last_line(const std::filesystem::path& p) {
        std::ifstream f(p);
        std::string line, last;
        while (std::getline(f, line))
            if (!line.empty()) last = line;
        return last;
    }

    void start(int i) {
        namespace fs = std::filesystem;
        const fs::path port_file = dir / ("rpc" + std::to_string(i) + ".port");
        const fs::path log = dir / ("rpc" + std::to_string(i) + ".log");
        const std::string pf = port_file.string();
        const char* argv[] = {EASEL_BINARY, "rpc-server", "--port", "0", "--port-file", pf.c_str(), "--device", "CPU", "--threads", "1", nullptr};
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
        pid_t pid = 0;
        const int rc = posix_spawn(&pid, EASEL_BINARY, &fa, nullptr, const_cast<char**>(argv), environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0) fail(ErrorKind::Io, "cannot start {} rpc-server: {}", EASEL_BINARY, std::strerror(rc));
        pids.push_back(pid);
        const auto t0 = std::chrono::steady_clock::now();
        while (!fs::exists(port_file)) {
            int st = 0;
            if (::waitpid(pid, &st, WNOHANG) == pid) {
                pids.pop_back();
                fail(ErrorKind::Io, "rpc-server {} exited ({}) before listening: {}", i,
                     WIFEXITED(st) ? "status " + std::to_string(WEXITSTATUS(st)) : "signal " + std::to_string(WTERMSIG(st)), last_line(log));
            }
            if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60))
                fail(ErrorKind::Io, "rpc-server {} did not listen within 60 s: {}", i, last_line(log));
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        std::string ep;
        long long server_pid = 0;
        {
            std::ifstream f(port_file);
            f >> ep >> server_pid;
        }
        if (server_pid != (long long)pid)
            fail(ErrorKind::Internal, "rpc-server {}: {} names pid {}, but this test started pid {}", i, pf, server_pid, (long long)pid);
        placement::add_rpc_servers(ep);
        std::string name;
        for (auto& d : placement::list_devices())
            if (d.name.rfind("RPC", 0) == 0 && (d.name + d.description).find(ep) != std::string::npos) name = d.name;
        if (name.empty()) fail(ErrorKind::Internal, "rpc-server {} on {}: no ggml RPC device names it", i, ep);
        endpoints.push_back(ep);
        devices.push_back(name);
    }

    void stop() {
        for (pid_t p : pids) {
            ::kill(p, SIGTERM);
            ::waitpid(p, nullptr, 0);
        }
        pids.clear();
        std::error_code ec;
        if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
};

}  // namespace easel::test_support
