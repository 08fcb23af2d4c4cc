// Test helper: `easel rpc-server` processes on 127.0.0.1 serving this machine's CPU, registered
// with ggml as RPC devices, for the multi-device placement tests (CPU CI has no second device).
#pragma once

#include "core/error.h"
#include "placement/devices.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace easel::test_support {

/// `n` easel rpc-servers (`--device CPU --threads 1`) on ports base_port + 2 * (pid % 400) + i
/// (so each test file takes a base 1000 apart from the others: 51000, 53000, 54000, 56000, ...),
/// so concurrent test processes (ctest -j) do not collide; a server that cannot bind its port
/// exits, and is started again on another port of the range (up to 8 tries). `devices` holds the
/// ggml names of the ones that came up (empty when the build has no RPC). A server is given up
/// to 60 s to answer:
/// on a GPU build each server process initialises the GPUs' backends first, which takes more
/// than 10 s on a two-GPU machine. The servers are killed on destruction.
struct RpcServers {
    std::vector<pid_t> pids;
    std::vector<std::string> devices;
    RpcServers(int n, int base_port) {
#ifdef EASEL_HAS_RPC
        const int slot0 = (int)(::getpid() % 400);
        for (int i = 0; i < n; ++i) {
            // a port can be taken (another test, or an outgoing connection's ephemeral port: the
            // range overlaps Linux's 32768-60999): a server that exits at once is tried again on
            // another port of this file's range
            bool up = false;
            for (int attempt = 0; attempt < 8 && !up; ++attempt) {
                const int port = base_port + ((slot0 + attempt * 53) % 400) * 2 + i;
                const std::string ps = std::to_string(port);
                const char* argv[] = {EASEL_BINARY, "rpc-server", "--port", ps.c_str(), "--device", "CPU", "--threads", "1", nullptr};
                pid_t pid = 0;
                if (posix_spawn(&pid, EASEL_BINARY, nullptr, nullptr, const_cast<char**>(argv), environ) != 0) break;
                const std::string ep = "127.0.0.1:" + ps;
                bool exited = false;
                for (int k = 0; k < 600 && !up && !exited; ++k) {
                    try {
                        placement::add_rpc_servers(ep);
                        up = true;
                    } catch (const Error&) {
                        exited = ::waitpid(pid, nullptr, WNOHANG) == pid;
                        if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(100));
                    }
                }
                if (up) {
                    pids.push_back(pid);
                    for (auto& d : placement::list_devices())
                        if (d.name.rfind("RPC", 0) == 0 && (d.name + d.description).find(ep) != std::string::npos) devices.push_back(d.name);
                } else if (!exited) {
                    ::kill(pid, SIGTERM);
                    ::waitpid(pid, nullptr, 0);
                }
            }
        }
#else
        (void)n;
        (void)base_port;
#endif
    }
    RpcServers(const RpcServers&) = delete;
    RpcServers& operator=(const RpcServers&) = delete;
    ~RpcServers() {
        for (pid_t p : pids) {
            ::kill(p, SIGTERM);
            ::waitpid(p, nullptr, 0);
        }
    }
};

}  // namespace easel::test_support
