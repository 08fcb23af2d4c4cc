// libFuzzer target: the placement flags (placement/spec.h parse_placement: --backend,
// --params-backend, --split-mode, --max-vram, --headroom and the boolean flags) against a made-up
// device list (CPU, two CUDA GPUs, an integrated GPU, two RPC devices). Input: a flag byte, then
// five length-prefixed strings (the five flags' values).
#include "fuzz_common.h"

#include "placement/spec.h"

#include <cmath>

using namespace easel;
using namespace easel::placement;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::vector<DeviceName> devs = {{"CPU", "cpu", false},
                                                 {"CUDA0", "gpu", false},
                                                 {"CUDA1", "gpu", false},
                                                 {"Vulkan0", "igpu", false},
                                                 {"RPC0[127.0.0.1:50052]", "gpu", true},
                                                 {"RPC1[127.0.0.1:50053]", "gpu", true}};
    fuzz::Reader r{data, size};
    PlacementFlags f;
    const uint8_t bits = r.byte();
    f.stream_layers = bits & 1;
    f.offload_to_cpu = bits & 2;
    f.clip_on_cpu = bits & 4;
    f.vae_on_cpu = bits & 8;
    f.auto_fit = bits & 16;
    f.backend = r.str();
    f.params_backend = r.str();
    f.split_mode = r.str();
    f.max_vram = r.str();
    f.headroom = r.str();
    try {
        PlacementSpec s = parse_placement(f, devs);
        (void)describe(s);
        for (auto& [d, gib] : s.max_vram_gib) EASEL_FUZZ_CHECK(!d.empty() && !std::isnan(gib));  // a resolved name, a number
    } catch (const Error&) {
    }
    return 0;
}
