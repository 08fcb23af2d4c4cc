// PlacementSpec: what the user said about where each module runs and where its weights live,
// parsed from sd-cli's placement flags (stable-diffusion.cpp docs/backend.md) and resolved
// against the ggml device list. The planner (placement/plan.h) turns it into a Plan.
//
//   --backend         NAME | MODULE=NAME[,MODULE=NAME...]   NAME may be a device list A&B
//   --params-backend  same syntax (no device lists), plus the value `disk`
//   --split-mode      layer | row | MODULE=MODE,...
//   --max-vram        GiB | DEV=GiB,...       (0 = no cap; negative = free memory minus |GiB|)
//   --headroom        MiB | DEV=MiB,...       (kept free on a device; default 0)
//   --stream-layers, --offload-to-cpu, --clip-on-cpu, --vae-on-cpu
//
// See docs/placement.md for the full meaning and the examples the unit tests check.
#pragma once

#include "placement/devices.h"

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace easel::placement {

/// The modules a placement names (sd-cli's module names; `te` = every text encoder).
enum class PModule { Diffusion = 0, Te, Vae, ControlNet, Upscaler };
inline constexpr int kModuleCount = 5;
/// "diffusion", "te", "vae", "controlnet", "upscaler".
const char* pmodule_name(PModule m);
/// Parses a module name or one of sd.cpp's aliases (case-insensitive; '-' and '_' ignored):
/// diffusion|model|unet|dit, te|clip|text|textencoder(s)|conditioner|cond|llm|t5|t5xxl,
/// vae|firststage|autoencoder|tae, controlnet|control, upscaler|esrgan|hires.
/// Throws Error(InvalidInput) naming the accepted modules (or saying that sd.cpp's
/// clip_vision / photomaker / detector modules do not exist in easel).
PModule parse_pmodule(const std::string& name);

/// How a module given several devices distributes its work.
enum class SplitMode { Layer, Row };

/// The special parameter location "disk" (weights read from the file per phase, freed after).
inline constexpr const char* kDisk = "disk";

/// One module's resolved placement.
struct ModulePlacement {
    /// Runtime devices (ggml device names, resolved; first = main device). Never empty after
    /// parse_placement().
    std::vector<std::string> devices;
    /// Where the parameters live: "" = on the runtime devices (each block range on its own
    /// device), a device name (e.g. "CPU": host RAM, staged to the runtime device), or "disk".
    std::string params;
    SplitMode split = SplitMode::Layer;
    /// Streaming (--stream-layers with params in host RAM): slots of the upload ring to keep
    /// before leading blocks are made resident (placement/plan.h DeviceUse::slot_count). 0: the
    /// default, 2 slots, leading blocks resident as the budget allows, the room left deepening
    /// the ring. No flag sets it yet (bench/placement_bench.cpp --ring uses it).
    int stream_slots = 0;
};

/// The raw flag values, as typed (empty = flag absent).
struct PlacementFlags {
    std::string backend;         ///< --backend
    std::string params_backend;  ///< --params-backend
    std::string split_mode;      ///< --split-mode
    std::string max_vram;        ///< --max-vram
    std::string headroom;        ///< --headroom
    bool stream_layers = false;  ///< --stream-layers
    bool offload_to_cpu = false; ///< --offload-to-cpu: prepends `*=cpu` to --params-backend
    bool clip_on_cpu = false;    ///< --clip-on-cpu: prepends `te=cpu` to --backend
    bool vae_on_cpu = false;     ///< --vae-on-cpu: prepends `vae=cpu` to --backend
    /// --auto-fit: the planner (placement/autofit.h) fills in every entry the flags above leave
    /// open; the caller replaces these flags with the plan's explicit ones before parsing.
    bool auto_fit = false;
    /// True when any placement flag was given.
    bool any() const {
        return !backend.empty() || !params_backend.empty() || !split_mode.empty() || !max_vram.empty() ||
               !headroom.empty() || stream_layers || offload_to_cpu || clip_on_cpu || vae_on_cpu;
    }
};

/// What the user said, resolved against the device list.
struct PlacementSpec {
    std::array<ModulePlacement, kModuleCount> modules;
    /// --max-vram per resolved device name, in GiB (> 0: cap; < 0: free memory minus |value|).
    std::map<std::string, double> max_vram_gib;
    /// --max-vram given as one number: applies to every non-CPU device without its own entry.
    std::optional<double> max_vram_all_gib;
    /// --headroom per resolved device name and for all devices, in MiB.
    std::map<std::string, double> headroom_mib;
    std::optional<double> headroom_all_mib;
    /// --stream-layers (applies to the diffusion module when its params are in host RAM).
    bool stream_layers = false;
    /// Per module, the parameter location an entry of --params-backend (or --offload-to-cpu)
    /// named, resolved ("" for auto/default, a ggml device name, or "disk"), before `params` is
    /// cleared for naming the module's own runtime device; nullopt where no entry named it.
    /// --auto-fit keeps these entries (the runtime device it picks may differ from the default).
    std::array<std::optional<std::string>, kModuleCount> params_given;
    /// One-line warnings produced while parsing (e.g. row split falling back, ignored
    /// --stream-layers); the caller prints them.
    std::vector<std::string> warnings;

    ModulePlacement& operator[](PModule m) { return modules[(size_t)m]; }
    const ModulePlacement& operator[](PModule m) const { return modules[(size_t)m]; }
};

/// Minimal device description used for name resolution (tests pass made-up lists).
struct DeviceName {
    std::string name;  ///< ggml device name ("CPU", "CUDA0", "RPC0[127.0.0.1:50052]")
    std::string type;  ///< "cpu", "gpu", "igpu", ... (DeviceInfo::type)
    bool rpc = false;  ///< an RPC device (never chosen by `auto` / `gpu`)
};

/// The DeviceName list of list_devices().
std::vector<DeviceName> device_names();

/// Resolves one device name against `devs`: `auto`/`default`/"" = the default device (first
/// local GPU, then integrated GPU, then CPU), `gpu` = first local GPU (then integrated GPU),
/// else exact case-insensitive name or unique case-insensitive prefix. Returns the ggml name.
/// Throws Error(InvalidInput) for unknown or ambiguous names (listing the devices) and for
/// `gpu` on a machine without one. `flag` names the flag in messages.
std::string resolve_device(const std::string& name, const std::vector<DeviceName>& devs, const char* flag = "--backend");

/// Parses and resolves every placement flag. Rules (sd.cpp's):
///  * a bare NAME (or `all=`/`default=`/`*=`) sets the default for modules without their own
///    entry; a MODULE=NAME entry wins over any default regardless of order; for the same key
///    the last entry wins;
///  * `A&B` device lists only in --backend, and only for diffusion and te (a default list
///    gives vae/controlnet/upscaler its first device); no repeated device in a list;
///  * `disk` only in --params-backend; params `auto`/`default` = on the runtime devices;
///  * --split-mode row is kept per module; the planner runs it on ggml's meta device where the
///    module has row-split rules (placement/row_split.h), else warns and uses layer split;
///  * --stream-layers without diffusion params in host RAM is ignored with a warning.
/// Throws Error(InvalidInput) with a one-line message naming the flag and the bad entry.
PlacementSpec parse_placement(const PlacementFlags& flags, const std::vector<DeviceName>& devs);

/// One-line description of a spec ("diffusion: CUDA0&CUDA1 (layer), params on device; te: CPU ...").
std::string describe(const PlacementSpec& spec);

}  // namespace easel::placement
