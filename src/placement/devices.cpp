#include "placement/devices.h"

#include "core/error.h"
#include "core/platform.h"
#include "core/strings.h"

#ifdef EASEL_HAS_RPC
#include <ggml-rpc.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <mutex>
#include <set>

namespace easel::placement {

namespace {


const char* type_name(enum ggml_backend_dev_type t) {
    switch (t) {
        case GGML_BACKEND_DEVICE_TYPE_CPU: return "cpu";
        case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
        case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
        default: return "other";
    }
}

std::mutex g_mu;
std::set<std::string> g_rpc_added;
std::set<std::string> g_rpc_answered;  // endpoints whose server answered a probe (list_devices)

}  // namespace

void init_backends() {
    static std::once_flag once;
    std::call_once(once, [] { ggml_backend_load_all(); });
}

void add_rpc_servers(const std::string& list) {
    init_backends();
    if (list.empty()) return;
#ifndef EASEL_HAS_RPC
    fail(ErrorKind::Unsupported, "--rpc-servers: this easel was built without RPC support (configure with -DEASEL_RPC=ON)");
#else
    size_t start = 0;
    {  // each server is one device, named once: a repeat is refused before any server is contacted
        std::set<std::string> seen;
        size_t at = 0;
        while (at <= list.size()) {
            size_t comma = list.find(',', at);
            std::string ep = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
            at = comma == std::string::npos ? list.size() + 1 : comma + 1;
            ep.erase(0, ep.find_first_not_of(" \t"));
            ep.erase(ep.find_last_not_of(" \t") + 1);
            if (!ep.empty() && !seen.insert(ep).second)
                fail(ErrorKind::InvalidInput,
                     "--rpc-servers: {} is listed twice; each server is one device (RPC0, RPC1, ... in list order): name each server once", ep);
        }
    }
    std::set<std::string> listed;  // within this list: each server is one device, named once
    while (start <= list.size()) {
        size_t comma = list.find(',', start);
        std::string ep = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        start = comma == std::string::npos ? list.size() + 1 : comma + 1;
        // trim
        ep.erase(0, ep.find_first_not_of(" \t"));
        ep.erase(ep.find_last_not_of(" \t") + 1);
        if (ep.empty()) continue;
        size_t colon = ep.rfind(':');
        if (colon == std::string::npos || colon == 0 || colon + 1 >= ep.size() ||
            !std::all_of(ep.begin() + colon + 1, ep.end(), [](char ch) { return std::isdigit((unsigned char)ch); })) {
            fail(ErrorKind::InvalidInput, "--rpc-servers: '{}' is not host:port (example: 127.0.0.1:50052)", ep);
        }
        long port = std::stol(ep.substr(colon + 1));
        if (port <= 0 || port > 65535) fail(ErrorKind::InvalidInput, "--rpc-servers: port {} out of range 1..65535", port);
        if (!listed.insert(ep).second)
            fail(ErrorKind::InvalidInput,
                 "--rpc-servers: {} is listed twice; each server is one device (RPC0, RPC1, ... in list order): name each server once", ep);
        std::lock_guard<std::mutex> lock(g_mu);
        if (g_rpc_added.count(ep)) continue;
        std::string host = ep.substr(0, colon);
        if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
        // ggml's RPC client aborts the process when a server cannot be reached, so easel checks
        // with its own TCP connect (2 s timeout) first and reports an error instead.
        if (!platform::tcp_reachable(host, ep.substr(colon + 1), 2000))
            fail(ErrorKind::Io, "--rpc-servers: cannot connect to RPC server {} (is `easel rpc-server` running there?)", ep);
        ggml_backend_reg_t reg = ggml_backend_rpc_add_server(ep.c_str());
        if (!reg) fail(ErrorKind::Io, "--rpc-servers: cannot connect to RPC server {} (is `easel rpc-server` running there?)", ep);
        ggml_backend_register(reg);
        g_rpc_added.insert(ep);
    }
#endif
}

std::vector<DeviceInfo> list_devices() {
    init_backends();
    std::vector<DeviceInfo> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        DeviceInfo info;
        info.dev = d;
        info.name = ggml_backend_dev_name(d);
        info.description = ggml_backend_dev_description(d);
        info.type = type_name(ggml_backend_dev_type(d));
        size_t free = 0, total = 0;
        // ggml's RPC client aborts the process when its server has gone away: check first.
        // Once a server answered, it is not probed again in this process: an `easel rpc-server`
        // serves one connection at a time, so while this process's own RPC connection is open a
        // probe waits in the server's backlog of one, and a second probe there timed out (2 s
        // each, about every device lookup while planning).
        bool reachable = true;
        if (info.name.rfind("RPC", 0) == 0) {
            const std::string& ep = info.description;
            size_t colon = ep.rfind(':');
            std::lock_guard<std::mutex> lock(g_mu);
            if (colon != std::string::npos && !g_rpc_answered.count(ep)) {
                std::string host = ep.substr(0, colon);
                if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
                reachable = platform::tcp_reachable(host, ep.substr(colon + 1), 2000);
                if (reachable) g_rpc_answered.insert(ep);
            }
        }
        if (reachable) ggml_backend_dev_memory(d, &free, &total);
        else info.description += " (unreachable)";
        info.free_bytes = free;
        info.total_bytes = total;
        out.push_back(std::move(info));
    }
    return out;
}

ggml_backend_dev_t first_local_gpu() {
    init_backends();
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        auto t = ggml_backend_dev_type(d);
        if ((t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) &&
            std::string(ggml_backend_dev_name(d)).rfind("RPC", 0) != 0)
            return d;
    }
    return nullptr;
}

ggml_backend_dev_t find_device(const std::string& name) {
    // names only: no memory query or reachability probe per lookup (list_devices does those)
    init_backends();
    std::vector<DeviceInfo> devs;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        DeviceInfo info;
        info.dev = ggml_backend_dev_get(i);
        info.name = ggml_backend_dev_name(info.dev);
        devs.push_back(std::move(info));
    }
    const std::string want = ascii_lower(name);
    for (auto& d : devs)
        if (ascii_lower(d.name) == want) return d.dev;
    std::vector<const DeviceInfo*> hits;
    for (auto& d : devs)
        if (ascii_lower(d.name).rfind(want, 0) == 0) hits.push_back(&d);
    if (hits.size() == 1) return hits[0]->dev;
    std::string known;
    for (auto& d : devs) known += (known.empty() ? "" : ", ") + d.name;
    if (hits.empty()) fail(ErrorKind::InvalidInput, "unknown device '{}' (devices here: {}; see `easel devices`)", name, known);
    fail(ErrorKind::InvalidInput, "device name '{}' is ambiguous (matches several of: {})", name, known);
}

}  // namespace easel::placement
