// `easel devices` and `easel rpc-server`.
#include "command.h"

#include "core/error.h"
#include "core/log.h"
#include "placement/devices.h"

#ifdef EASEL_HAS_RPC
#include <ggml-rpc.h>
#endif

#include <fmt/format.h>

#include <thread>

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
            cli::CommonOptions common;
        };
        auto o = std::make_shared<O>();
        sub.add_option("-H,--host", o->host, "Address to listen on (default 127.0.0.1; 0.0.0.0 exposes it to the network, unauthenticated)");
        sub.add_option("-p,--port", o->port, "TCP port (default 50052)")->check(CLI::Range(1, 65535));
        sub.add_option("-d,--device", o->devices, "Device(s) to serve (repeatable; default: the first GPU, else the CPU)");
        sub.add_option("-t,--threads", o->threads, "CPU threads for a served CPU device (default: all cores; at most 512)")
            ->check(CLI::NonNegativeNumber)
            ->check(cli::max_threads_check());
        sub.add_option("--cache-dir", o->cache_dir, "Folder where the server caches tensors sent to it (optional)");
        cli::add_common_options(sub, o->common);
        sub.footer("Examples:\n  easel rpc-server --port 50052 --device CPU\n"
                   "  easel generate ... --rpc-servers 127.0.0.1:50052 --backend diffusion=RPC0");
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
            std::string endpoint = o->host + ":" + std::to_string(o->port);
            for (auto d : devs) log::info("rpc-server: serving {} ({}) on {}", ggml_backend_dev_name(d), ggml_backend_dev_description(d), endpoint);
            std::fflush(stderr);
            ggml_backend_rpc_start_server(endpoint.c_str(), o->cache_dir.empty() ? nullptr : o->cache_dir.c_str(), threads,
                                          devs.size(), devs.data());
            return 0;
#endif
        };
    },
    90);

}  // namespace
