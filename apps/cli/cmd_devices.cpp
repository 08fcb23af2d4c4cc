// `easel devices` and `easel rpc-server`.
#include "command.h"

#include "core/error.h"
#include "core/log.h"
#include "placement/devices.h"
#include "placement/rpc_listen.h"

#ifdef EASEL_HAS_RPC
#include <ggml-rpc.h>
#endif

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#ifndef _WIN32
#include <unistd.h>
#endif

namespace {

using namespace easel;

std::string mib(uint64_t b) { return fmt::format("{:.0f} MiB", (double)b / (1024.0 * 1024.0)); }

EASEL_COMMAND(
    "devices", "List every ggml device (CPU, GPUs, RPC devices) with free and total memory",
    [](CLI::App& sub) -> std::function<int()> {
        auto common = std::make_shared<cli::CommonOptions>();
        cli::add_common_options(sub, *common);
        sub.footer("Examples:\n  easel devices\n  easel devices --rpc-servers 127.0.0.1:50052,127.0.0.1:50053");
        return [common]() {
            cli::apply_common_options(*common);
            auto devs = placement::list_devices();
            fmt::print("{:<28} {:<6} {:>12} {:>12}  {}\n", "name", "type", "free", "total", "description");
            for (auto& d : devs)
                fmt::print("{:<28} {:<6} {:>12} {:>12}  {}\n", d.name, d.type, mib(d.free_bytes), mib(d.total_bytes), d.description);
            return 0;
        };
    },
    10);

EASEL_COMMAND(
    "rpc-server", "Serve this machine's devices to other easel processes (ggml RPC)",
    [](CLI::App& sub) -> std::function<int()> {
        struct O {
            std::string host = "127.0.0.1";
            int port = 50052;
            std::vector<std::string> devices;
            int threads = 0;
            std::string cache_dir;
            std::string port_file;
            cli::CommonOptions common;
        };
        auto o = std::make_shared<O>();
        sub.add_option("-H,--host", o->host, "Address to listen on (default 127.0.0.1; 0.0.0.0 exposes it to the network, unauthenticated)");
        sub.add_option("-p,--port", o->port, "TCP port (default 50052; 0: a free port the OS picks, see --port-file)")->check(cli::number_check(0, 65535, true));
        sub.add_option("-d,--device", o->devices, "Device(s) to serve (repeatable; default: the first GPU, else the CPU)");
        sub.add_option("-t,--threads", o->threads, "CPU threads for a served CPU device (default: all cores; at most 512)")
            ->check(CLI::NonNegativeNumber)
            ->check(cli::max_threads_check());
        sub.add_option("--cache-dir", o->cache_dir, "Folder where the server caches tensors sent to it (optional)");
        sub.add_option("--port-file", o->port_file,
                       "Once the server listens, write \"HOST:PORT PID\" (one line) to this file: the port it got with --port 0, "
                       "and this process's id");
        cli::add_common_options(sub, o->common);
        sub.footer("Examples:\n  easel rpc-server --port 50052 --device CPU\n"
                   "  easel generate ... --rpc-servers 127.0.0.1:50052 --backend diffusion=RPC0\n"
                   "  easel rpc-server --port 0 --port-file /tmp/rpc.port   (a free port; the file names it)");
        return [o]() -> int {
            cli::apply_common_options(o->common);
#ifndef EASEL_HAS_RPC
            fail(ErrorKind::Unsupported, "this easel was built without RPC support (configure with -DEASEL_RPC=ON)");
#else
            placement::init_backends();
            std::vector<ggml_backend_dev_t> devs;
            for (auto& n : o->devices) devs.push_back(placement::find_device(n));
            if (devs.empty()) {
                ggml_backend_dev_t pick = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU);
                if (!pick) pick = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
                if (!pick) fail(ErrorKind::Unsupported, "no device to serve");
                devs.push_back(pick);
            }
            size_t threads = o->threads > 0 ? (size_t)o->threads : std::max(1u, std::thread::hardware_concurrency());
            // (A client that dies mid-run closes its connection: main() ignores SIGPIPE, so the
            // server's next write to it fails with EPIPE, ggml drops the connection and serves the
            // next client.)
            std::optional<placement::PortReservation> reserved;
            int port = o->port;
            if (port == 0) {
                reserved.emplace(o->host);
                port = reserved->port();
            }
            const std::string endpoint = o->host + ":" + std::to_string(port);
            for (auto d : devs) log::info("rpc-server: serving {} ({}) on {}", ggml_backend_dev_name(d), ggml_backend_dev_description(d), endpoint);
            std::fflush(stderr);
            // ggml's server loop runs until it cannot accept; this thread waits until it listens
            // (or gave up: its bind failed) to report the endpoint and write --port-file.
            std::atomic<bool> ended{false};
            std::thread server([&] {
                ggml_backend_rpc_start_server(endpoint.c_str(), o->cache_dir.empty() ? nullptr : o->cache_dir.c_str(), threads,
                                              devs.size(), devs.data());
                ended = true;
            });
            while (!ended && !placement::self_listening_on(port)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
            if (ended) {
                server.join();
                fail(ErrorKind::Io, "rpc-server: cannot listen on {} (the port is in use, or the address is not this machine's): "
                     "pick another --port, or --port 0 for a free one", endpoint);
            }
#ifdef _WIN32
            const long long pid = 0;
#else
            const long long pid = (long long)::getpid();
#endif
            log::info("rpc-server: listening on {} (pid {})", endpoint, pid);
            std::fflush(stderr);
            if (!o->port_file.empty()) {
                // written whole under another name, then renamed: a reader never sees half a line.
                // ggml's server thread cannot be stopped: a failure here ends the process at once.
                const std::filesystem::path pf = o->port_file, tmp = pf.string() + ".tmp";
                bool ok = false;
                {
                    std::ofstream f(tmp, std::ios::trunc);
                    f << endpoint << " " << pid << "\n";
                    ok = (bool)f.flush();
                }
                std::error_code ec;
                if (ok) std::filesystem::rename(tmp, pf, ec);
                if (!ok || ec) {
                    std::fprintf(stderr, "error: rpc-server: cannot write --port-file %s (is its folder there and writable?)\n",
                                 o->port_file.c_str());
                    std::fflush(stderr);
                    std::_Exit(1);
                }
            }
            server.join();
            fail(ErrorKind::Io, "rpc-server: stopped accepting connections on {}", endpoint);
#endif
        };
    },
    90);

}  // namespace
