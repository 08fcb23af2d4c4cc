// ggml devices as easel sees them: CPU, GPUs of compiled-in backends, and RPC devices
// added with --rpc-servers.
#pragma once

#include <ggml-backend.h>

#include <cstdint>
#include <string>
#include <vector>

namespace easel::placement {

/// One ggml device.
struct DeviceInfo {
    std::string name;         ///< ggml device name: "CPU", "CUDA0", "Vulkan0", "RPC0[127.0.0.1:50052]"...
    std::string description;  ///< backend's description (GPU model, CPU model, endpoint)
    std::string type;         ///< "cpu", "gpu", "igpu", "accel", "meta"
    uint64_t free_bytes = 0;
    uint64_t total_bytes = 0;
    ggml_backend_dev_t dev = nullptr;
};

/// Loads dynamically built backends (if any). Idempotent.
void init_backends();

/// Registers the RPC servers of a comma-separated "host:port,host:port" list with ggml
/// (ggml_backend_rpc_add_server + ggml_backend_register); their devices then show up in
/// list_devices(). Each endpoint is added once. Throws Error(InvalidInput) on a malformed
/// endpoint, Error(Unsupported) when easel was built without RPC, Error(Io) when a server
/// cannot be reached.
void add_rpc_servers(const std::string& list);

/// Every ggml device, in registry order, with its free / total memory (an RPC device's server
/// is first probed with a TCP connect, 2 s timeout, once per process: an unreachable one shows
/// 0 bytes and "(unreachable)" in its description instead of ggml's abort).
std::vector<DeviceInfo> list_devices();

/// The first GPU of this machine (type GPU or integrated GPU, not an RPC device), or nullptr.
/// RPC devices also report type GPU; jobs go to them only when asked for by name.
ggml_backend_dev_t first_local_gpu();

/// Finds a device by exact name (case-insensitive) or unique case-insensitive prefix, by name
/// only (no memory query, no network traffic). Throws Error(InvalidInput) naming the known
/// devices if none or several match.
ggml_backend_dev_t find_device(const std::string& name);

}  // namespace easel::placement
