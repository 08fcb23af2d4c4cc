// Plan: per module, the runtime devices, the contiguous block ranges (segments) each device
// runs, where each segment's parameters live, and the predicted bytes per device.
//
// design.md "Placement is data": PlacementSpec (what the user said) -> Plan (this file) ->
// runtime (runtime/sequence_runner.h). The planner is pure: it gets parameter bytes per block
// and a function that measures the compute buffer of any block range with ggml's graph
// allocator (ggml_gallocr_reserve_n_size on a no_alloc graph at the job's shapes), and the
// budget of each device. A plan that cannot fit throws before anything is allocated.
#pragma once

#include "placement/spec.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace easel::placement {

/// Where a segment's parameters are kept.
enum class Residency {
    Device,  ///< loaded onto the segment's device when the module loads; stay there
    Host,    ///< kept in host RAM (or another device's memory: --params-backend); copied to the
             ///< runtime device for the phase, or for every evaluation when `per_eval`
    Disk,    ///< read from the model file onto the device at the start of a phase, freed after;
             ///< `per_eval` (a module that does not fit the device whole): read into a transient
             ///< host buffer and uploaded into a slot before every evaluation, the buffer freed
};
/// "device", "host", "disk".
const char* residency_name(Residency r);

/// A contiguous range of blocks run as one graph on one device.
struct Segment {
    std::string device;           ///< runtime device (ggml name)
    int begin = 0, end = 0;       ///< blocks [begin, end)
    bool prologue = false;        ///< this graph also runs the prologue (first segment)
    bool epilogue = false;        ///< ... and/or the epilogue (last segment)
    Residency residency = Residency::Device;
    /// Parameters uploaded into one of the device's streaming slots (a ring of
    /// DeviceUse::slot_count) for every evaluation (streamed blocks, --max-vram segments); where
    /// the backend has events the following per-eval segments are uploaded, in order, on a second
    /// stream into the slots as they free up while this one computes. False: resident for the phase.
    bool per_eval = false;
    uint64_t param_bytes = 0;     ///< its parameters (with the prologue/epilogue ones it runs)
    uint64_t compute_bytes = 0;   ///< measured compute buffer of its graph (inputs, state, outputs included)
    uint64_t state_bytes = 0;     ///< bytes of the state it hands to the next segment (0 for the last)
};

/// Predicted bytes on one device for one module.
struct DeviceUse {
    std::string device;
    uint64_t params = 0;   ///< resident parameters (Device, and Host/Disk staged for the phase)
    uint64_t slots = 0;    ///< streaming slots: slot_count x (the largest per-eval segment + 8 KiB alignment slack)
    /// Slots in the device's upload ring (0 without per-eval segments): 2, or for streamed blocks
    /// (--stream-layers with parameters in host RAM) ModulePlacement::stream_slots where given
    /// and as many more as the budget leaves room for after the resident blocks, the compute
    /// buffer and the state (at most one per streamed segment): how many segments can be
    /// uploaded ahead of the one computing.
    int slot_count = 0;
    uint64_t compute = 0;  ///< largest compute buffer of its segments
    /// Largest state kept on the device between two of its segments (copied out of the compute
    /// buffer so the next graph can reuse it; 0 when the device runs one segment).
    uint64_t state = 0;
    uint64_t budget = 0;   ///< 0 = unlimited
    uint64_t total() const { return params + slots + compute + state; }
};

/// The plan of one module.
struct ModulePlan {
    PModule module = PModule::Diffusion;
    std::string label;             ///< e.g. "diffusion (UNet, 12 blocks)"
    /// The pipeline stage during which the module is loaded ("te", "diffusion", "vae": easel
    /// generate loads one module per stage and frees it before the next, see
    /// pipeline/generate.cpp). Plans of one stage are resident together: their bytes on a
    /// device add; plans of different stages time-share the device (the device's peak is the
    /// largest stage). Empty = the module's own name (pmodule_name).
    std::string stage;
    std::string params_location;   ///< spec value: "" (runtime devices), device name, or "disk"
    std::vector<Segment> segments;
    std::vector<DeviceUse> devices;  ///< runtime devices, in the spec's order
    /// Host RAM the plan holds: the parameters kept in host RAM / the params device (Host
    /// residency), or for Disk segments uploaded per evaluation the one transient host buffer
    /// they pass through (the largest segment's parameters + alignment slack).
    uint64_t host_bytes = 0;
};

struct RowSplitRules;  // placement/row_split.h

/// What the planner needs to know about a module (from the model, before loading).
struct ModuleCosts {
    PModule module = PModule::Diffusion;  ///< which module (models::Family::placement_costs fills it)
    std::string label;                  ///< module description for the table
    std::vector<uint64_t> block_bytes;  ///< parameter bytes of each block
    uint64_t prologue_bytes = 0;        ///< parameter bytes outside the blocks (prologue + epilogue)
    /// Of those, the bytes a segment running only the prologue holds and the bytes a segment
    /// running only the epilogue holds (the runtime finds which parameters each graph reads; a
    /// parameter both read counts in both). Both 0 = unknown: such a segment holds all of
    /// prologue_bytes.
    uint64_t prologue_used_bytes = 0, epilogue_used_bytes = 0;
    /// Compute buffer bytes of the graph running blocks [b, e) (+ prologue / epilogue) on `device`,
    /// measured with ggml's graph allocator at the job's shapes.
    std::function<uint64_t(int b, int e, bool prologue, bool epilogue, const std::string& device)> measure;
    /// Floating-point operations (a multiply-add = 2) of one evaluation of blocks [b, e) (+
    /// prologue / epilogue) at the job's shapes, counted from the same graph `measure` builds
    /// (runtime::graph_flops: matmuls, flash attention, direct convolutions; elementwise ops,
    /// norms and softmax left out). Device-independent. Empty = unknown. For --auto-fit's compute
    /// time: FLOPs / the device's matmul FLOP/s (placement/autofit.h "Cost model").
    std::function<double(int b, int e, bool prologue, bool epilogue)> flops;
    /// Bytes of the state entering block e (0 < e < blocks), at the job's shapes. Optional.
    std::function<uint64_t(int e)> state_bytes;
    /// --split-mode row (placement/row_split.h): the module's tensor-parallel rules (null: the
    /// module cannot be row split; a row split then falls back to layer split with a warning),
    /// and the block parameter bytes each of n devices holds under them.
    std::shared_ptr<const RowSplitRules> row_split;
    std::function<std::vector<uint64_t>(size_t n_devices)> row_split_bytes;
    /// Row split: bytes of the largest partial sum in the graph of blocks [b, e) at the job's
    /// shapes (the output of a matmul whose weight has the Row role), i.e. one all-reduce staging
    /// tensor of ggml's meta device (RowSplitDevice::allreduce_bytes measures the same on the
    /// loaded graph). Optional: without it plan_row_split bounds a partial sum by state_bytes(1).
    std::function<uint64_t(int b, int e)> row_split_partial_bytes;
    /// VAE decoder only, for --auto-fit's tiling (placement/autofit.h FitModule::measure_tile):
    /// the compute buffer of decoding one tile of `tile` x `tile` latent cells (clipped to the
    /// latent_h x latent_w latent) as one graph on `device`, measured like `measure`. Empty: the
    /// module cannot be tiled.
    std::function<uint64_t(int tile, const std::string& device)> measure_tile;
    int64_t latent_h = 0, latent_w = 0;  ///< VAE: the job's latent in cells (what measure_tile clips to)
};

/// Budget in bytes per device name; a device absent = unlimited. From --max-vram (GiB; < 0:
/// free minus |value|; 0: no cap; a global value applies to non-CPU devices) and --headroom
/// (MiB, subtracted from the free memory of every device, or from the cap). Without a cap a
/// non-CPU device's budget is its free memory minus the headroom; the CPU is unlimited.
std::map<std::string, uint64_t> resolve_budgets(const PlacementSpec& spec, const std::vector<DeviceInfo>& devs);

/// Plans one module. `place` is the module's resolved placement, `stream` true to stream its
/// blocks (--stream-layers, diffusion with Host params). Layer split: ranges balanced by
/// parameter bytes in proportion to the device budgets (free memory where uncapped); a single
/// device with Host or Disk params that does not fit gets segments that each fit (per-eval
/// uploads; Disk: each read from the file per evaluation).
/// Throws Error(OutOfMemory) "MODULE needs X MiB on DEV but the budget leaves Y MiB; try ..."
/// when a device's predicted peak exceeds its budget; Error(InvalidInput) for more devices
/// than blocks.
ModulePlan plan_module(PModule module, const ModulePlacement& place, bool stream, const ModuleCosts& costs,
                       const std::map<std::string, uint64_t>& budgets);

/// The pipeline stage of the VAE encoder's plans (ModulePlan::stage, ModuleCosts::stage): the
/// encoder is loaded in a stage of its own, so it time-shares each device with te, diffusion and
/// the decoder ("vae").
inline constexpr const char* kVaeEncodeStage = "vae-encode";

/// The stage of a plan: p.stage, or the module's name when empty.
std::string stage_of(const ModulePlan& p);

/// Predicted peak bytes per device over the stages of `plans`: per stage the sum of its plans'
/// DeviceUse::total() on the device (modules of one stage are resident together), and the
/// largest stage (stages time-share the device). Devices absent from every plan are absent.
std::map<std::string, uint64_t> device_peaks(const std::vector<ModulePlan>& plans);

/// Plans every module of `costs` (ModuleCosts::module selects the spec entry; --stream-layers
/// applies to the diffusion module only), each in its own stage (ModulePlan::stage = the
/// module's name; several costs of one module, such as FLUX.1's T5 and CLIP-L, share the stage
/// and each is planned in what the earlier ones leave of the budgets), then checks that on every device each stage's summed prediction fits the
/// device's budget (check_stage_budgets). Throws as plan_module.
std::vector<ModulePlan> plan_modules(const PlacementSpec& spec, const std::vector<ModuleCosts>& costs,
                                     const std::map<std::string, uint64_t>& budgets);

/// Throws Error(OutOfMemory) "on DEV the STAGE stage needs X MiB (te A + diffusion B) but the
/// budget leaves Y MiB; ..." when the modules of one stage together exceed a device's budget
/// (each plan's own DeviceUse::budget; plan_module already checked each module alone).
void check_stage_budgets(const std::vector<ModulePlan>& plans);

/// The memory table of a plan (one line per module and device, MiB), for printing before a run;
/// with more than one plan, a second table per device: each stage's bytes (the modules of a
/// stage add), the device's peak (largest stage) and its budget.
std::string format_plan(const std::vector<ModulePlan>& plans);

/// Measured peaks per device beside the prediction (after a run).
std::string format_peaks(const std::vector<ModulePlan>& plans, const std::map<std::string, uint64_t>& measured);

}  // namespace easel::placement
