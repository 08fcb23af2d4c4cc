// --auto-fit: a planner that places every module of a job from measured sizes, explains its
// choices, and never plans a run that would run out of memory (docs/placement.md "--auto-fit").
//
// It is pure: it gets, per module, the placement::ModuleCosts (parameter bytes per block after
// --type, a callback measuring the compute buffer of any block range at the job's shapes with
// ggml's graph allocator), and per device its budget, largest single allocation and
// host-to-device bandwidth. It enumerates candidate placements tier by tier, asks
// placement::plan_module (the same planner the runtime executes) for each candidate's segments
// and predicted bytes, and keeps the first tier with a feasible candidate for each module;
// within a tier the candidate with the least predicted time wins.
//
// Tiers, in order of preference:
//   1 resident      every module whole on an accelerator, all of them loaded at once;
//   2 time-shared   every module whole on an accelerator during its own stage (the pipeline
//                   loads te, then diffusion, then vae, freeing each after its stage); a VAE
//                   decode that no accelerator holds whole is tiled here, with the largest tile
//                   that fits (a whole decode on another device beats any tiled one); with an
//                   image to encode (FitModule::encode_costs) the VAE's placement must also hold
//                   the encoder, in its own stage, at the same tiling;
//   3 host-streamed weights in host RAM, uploaded to the accelerator per evaluation (diffusion:
//                   --stream-layers, leading blocks resident; others: --max-vram segments);
//   4 layer split   contiguous block ranges over several accelerators, balanced by budget; with
//                   --split-mode row for the module (FitRequest::split) a row split (tensor
//                   parallelism on ggml's meta device, placement/row_split.h) over the same
//                   device sets where the module has row-split rules, else layer split with a
//                   warning;
//   5 disk          weights read from the model file onto the accelerator per phase, or, when the
//                   module does not fit the accelerator whole, --max-vram segments read from the
//                   file per evaluation through one transient host buffer of a segment's size
//                   (the only tier for a module larger than both the card and the host RAM);
//   6 CPU           the module runs on the CPU, weights in host RAM.
// The job's tier is the worst of its modules' tiers (stages are independent because the
// pipeline time-shares them; only tier 1 looks at all modules together).
//
// Cost model (predicted seconds of a candidate, per module):
//   load:     resident bytes / disk bandwidth (Device, Disk) or / host-to-device bandwidth (Host staged)
//   per eval: bytes uploaded per evaluation (streamed segments) / host-to-device bandwidth
//           (+ / disk bandwidth for Disk segments read per evaluation)
//           + state bytes crossing devices x (1/bw(from) + 1/bw(to))
//           + flops_per_eval x (share of the module's parameters on the device) / device FLOP/s
//           row split: the blocks' share / (members x the slowest member's FLOP/s), plus the
//           all-reduces: 2 per block of the hidden state (ModuleCosts::state_bytes(1)) x
//           ceil(log2 members) steps, each over the slower member's link (1/bw(a) + 1/bw(b))
//   total = load + evals x per eval.
// FLOP/s and host-to-device bandwidth come from FitDevice (measured at plan time by
// measure_device_speed, cached by DeviceSpeedCache), else defaults by device type; the FLOPs of
// an evaluation from FitModule::flops_per_eval (the CLI: ModuleCosts::flops, the matmul FLOPs
// counted from the module's graph by runtime::graph_flops).
#pragma once

#include "placement/plan.h"
#include "placement/spec.h"

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace easel::placement {

/// One device the planner may use. The CPU (type "cpu") stands for host RAM: its budget is the
/// host RAM the job may use (weights held for streaming count against it too).
struct FitDevice {
    std::string name;              ///< ggml device name ("CUDA0", "RPC0[127.0.0.1:50052]", "CPU")
    std::string type = "gpu";      ///< "cpu", "gpu", "igpu", "accel"
    uint64_t budget = 0;           ///< bytes one stage may use (after --max-vram, --headroom, free memory); 0 = none usable
    uint64_t max_alloc = 0;        ///< largest single buffer (ggml_backend_buft_get_max_size); 0 = unlimited
    double h2d_bytes_per_s = 0;    ///< host-to-device bandwidth in bytes/s (measured: measure_device_speed); 0 = default by type
    double flops = 0;              ///< compute throughput in FLOP/s (measured: measure_device_speed); 0 = default by type (gpu 2e13, cpu 2e11)
    /// The user's --headroom for this device in bytes (already subtracted from `budget`); used
    /// only to write a --max-vram cap that reproduces a budget the planner lowered.
    uint64_t headroom = 0;
    bool is_cpu() const { return type == "cpu"; }
};

/// One module of the job.
struct FitModule {
    PModule module = PModule::Diffusion;
    ModuleCosts costs;             ///< per-block parameter bytes + compute-buffer measurements at the job's shapes
    double evals = 1;              ///< evaluations in the job (diffusion: steps x (CFG ? 2 : 1) x batch)
    double flops_per_eval = 0;     ///< FLOPs of one evaluation; 0 = parameter bytes (relative figure)
    uint64_t param_count = 0;      ///< weights in the module (for the --type suggestion); 0 = unknown
    /// VAE only: compute-buffer bytes of decoding one tile of `tile` x `tile` latent cells on
    /// `device` (measured like ModuleCosts::measure); empty = tiling cannot be planned.
    std::function<uint64_t(int tile, const std::string& device)> measure_tile;
    int latent_w = 0, latent_h = 0;  ///< VAE: the job's latent size in cells (tiles only when smaller)
    /// VAE only, when the job encodes images (img2img -i, in-painting, reference images): the
    /// encoder's costs when the encodes run with tiles of `tile` latent cells (0 = whole; the
    /// pipeline encodes with the decode's --vae-tiling), models::Family::encode_costs. The
    /// encoder runs in a stage of its own (kVaeEncodeStage) under the same `vae` entry as the
    /// decoder, so a candidate placement of the VAE counts only when the encoder's plan fits it
    /// too (FitChoice::encode_plan); a decode tile is then also chosen so that the encoder's
    /// tiles fit. Empty: no encode stage.
    std::function<ModuleCosts(int tile)> encode_costs;
};

/// The job's shapes (for the report and the suggestions).
struct FitJob {
    int width = 512, height = 512;  ///< image pixels
    int batch = 1, steps = 20;
    bool cfg = true;
};

/// Preference tiers (see the file comment).
enum class Tier { Resident = 1, TimeShared = 2, HostStreamed = 3, LayerSplit = 4, Disk = 5, Cpu = 6 };
/// "resident", "time-shared", "host-streamed", "layer split", "disk", "CPU".
const char* tier_name(Tier t);

/// Everything the planner needs.
struct FitRequest {
    std::vector<FitDevice> devices;  ///< candidate devices, any order (the CPU among them, or absent)
    std::vector<FitModule> modules;
    FitJob job;
    /// Explicit user entries, kept as given: --backend MODULE=DEV[&DEV] (non-empty = pinned) and
    /// --params-backend MODULE=LOC ("" = on the runtime device, a device name = host RAM, "disk").
    std::array<std::vector<std::string>, kModuleCount> pinned_devices;
    std::array<std::optional<std::string>, kModuleCount> pinned_params;
    /// The user's --max-vram / --headroom values (copied into the flags unchanged).
    std::string max_vram, headroom;
    double disk_bytes_per_s = 1.0e9;  ///< model file read speed
    /// --split-mode per module (PlacementSpec's). Row: a device list the planner chooses (or a
    /// pinned one) is planned as a row split where the module can be row split (rules, at most
    /// RowSplitRules::max_devices devices, weights on the devices), else as a layer split with a
    /// warning (FitResult::warnings); the flags then say `--split-mode M=row` only for the
    /// modules planned as row splits.
    std::array<SplitMode, kModuleCount> split{};
};

/// The choice made for one module.
struct FitChoice {
    PModule module = PModule::Diffusion;
    Tier tier = Tier::Resident;
    ModulePlan plan;
    double seconds = 0;          ///< predicted time of the module in the job
    int vae_tile = 0;            ///< > 0: decode tiled with tiles of this many latent cells
    bool row_split = false;      ///< the plan is a row split (its blocks on ggml's meta device)
    /// VAE with FitModule::encode_costs: the encode stage's plan under the same placement
    /// (ModulePlan::stage = kVaeEncodeStage); FitResult::plans() and predicted_peak include it.
    std::optional<ModulePlan> encode_plan;
};

/// The plan: what to run, as a spec and as flags, and why.
struct FitResult {
    Tier tier = Tier::Resident;           ///< the worst tier of the modules
    std::vector<FitChoice> choices;       ///< one per module, in request order
    PlacementFlags flags;                 ///< the equivalent explicit flags (parse_placement gives the spec)
    std::string flags_line;               ///< the same as one command-line fragment (copy, edit, rerun)
    int vae_tile = 0;                     ///< > 0: --vae-tiling --vae-tile-size TxT
    std::vector<std::string> reasons;     ///< one line per decision
    /// What the plan does not do as asked (a --split-mode row that falls back to layer split, and
    /// why); also logged with log::warn and listed among the reasons.
    std::vector<std::string> warnings;
    /// Predicted peak bytes per device over the job as the pipeline runs it (one module per
    /// stage, freed after: the largest stage), the figure the measured peak is compared with.
    std::map<std::string, uint64_t> predicted_peak;
    /// Tier 1 only: bytes per device with every module loaded at once (each <= the budget).
    std::map<std::string, uint64_t> resident_bytes;
    double seconds = 0;                   ///< predicted time of the job
    std::vector<ModulePlan> plans() const;  ///< every choice's plan, then its encode_plan (if any)
};

/// Plans the job. Throws Error(OutOfMemory) with one line naming the smallest shortfall among
/// the candidates tried and the cheapest change that would fit (lower resolution, a quantised
/// --type, more RAM / VRAM) when a module fits no tier; Error(InvalidInput) for a pinned device
/// that is not in `devices`.
FitResult auto_fit(const FitRequest& req);

/// The report printed before a run: the flags line, the reasons, the per-device table of
/// format_plan (unless `with_table` is false: `easel plan` prints the table of the plan the
/// flags give instead, once) and the predicted peak per device as the pipeline runs.
std::string format_fit(const FitResult& r, bool with_table = true);

/// Compute-buffer measurements cached per shape on disk, so repeated planning of the same job
/// does not rebuild graphs. File: <dir>/autofit/<key>.json, key = content_key(parts) over what
/// decides the measurement (model files, module, --type, shapes, flash attention). Entries are
/// "b,e,p,e,device" -> bytes. I/O failures never fail a job: the cache is then skipped.
class MeasureCache {
public:
    MeasureCache(std::filesystem::path dir, const std::vector<std::string>& key_parts);
    ~MeasureCache();  ///< writes new entries
    /// `measure` wrapped: answers from the file, else measures and remembers.
    std::function<uint64_t(int, int, bool, bool, const std::string&)> wrap(
        std::function<uint64_t(int, int, bool, bool, const std::string&)> measure);
    /// The value stored under `key`, else `measure()`, remembered (e.g. a device's bandwidth).
    uint64_t value(const std::string& key, const std::function<uint64_t()>& measure);
    /// The same for a VAE tile measurement.
    std::function<uint64_t(int, const std::string&)> wrap_tile(std::function<uint64_t(int, const std::string&)> measure);
    int hits() const { return hits_; }
    int misses() const { return misses_; }
    const std::filesystem::path& file() const { return file_; }
    void flush();

private:
    std::filesystem::path file_;
    std::map<std::string, uint64_t> entries_;
    bool dirty_ = false;
    int hits_ = 0, misses_ = 0;
};

/// Host-to-device bandwidth of `dev` in bytes/s: the best of three ggml_backend_tensor_set
/// uploads of `bytes` into a buffer of the device (0 when the device cannot allocate it).
double measure_h2d_bandwidth(ggml_backend_dev_t dev, size_t bytes = 32u << 20);

/// Measured speed of one device, the cost model's inputs (FitDevice::flops, h2d_bytes_per_s).
struct DeviceSpeed {
    double flops = 0;            ///< FLOP/s of measure_matmul_flops; 0 = unknown (the cost model's default by type)
    double h2d_bytes_per_s = 0;  ///< host-to-device bandwidth, bytes/s; 0 = unknown / not measured (the CPU)
};

/// Matmul throughput of `dev` in FLOP/s: ggml_mul_mat of an F16 weight of ne [1024, 1024] by
/// F32 activations of ne [1024, N] (the layout of a Linear layer on N tokens; 2 x 1024 x 1024 x N
/// FLOPs) as one graph on a backend of the device, N = 64, 256, 1024, ... until one run takes
/// 10 ms or N reaches 16384, then the best of three timed runs after a warm-up. `threads`: the
/// CPU backend's threads (<= 0: hardware threads; other backends ignore it). 0 when the device
/// cannot allocate the tensors or run the graph. A figure for ranking devices and for the cost
/// model's compute term, not the device's peak (which depends on shapes and types).
double measure_matmul_flops(ggml_backend_dev_t dev, int threads);

/// Both figures of `dev`: measure_matmul_flops, and for non-CPU devices measure_h2d_bandwidth
/// with 8 MiB uploads (the CPU's "upload" is a memcpy: left 0).
DeviceSpeed measure_device_speed(ggml_backend_dev_t dev, int threads);

/// Device speeds cached on disk next to the compute-buffer cache, so that planning does not
/// benchmark the devices every time (and gives the same plan twice: a fresh measurement varies
/// by a few percent). File: <dir>/autofit/device-<key>.json, key = content_key (core/hash.h) of the
/// format, the device's name and description and (CPU) the thread count; contents
/// {"format": "easel-autofit-device-v1", "device": NAME, "description": DESC, "flops": F,
/// "h2d_bytes_per_s": B} (F > 0, B >= 0, finite). An empty `dir` (--no-cache) measures every
/// time and writes nothing.
class DeviceSpeedCache {
public:
    DeviceSpeedCache(std::filesystem::path dir, std::string name, std::string description, int threads = 0);
    /// The cached speed when the file holds a valid one; else `measure()`, written to the file
    /// (temporary + rename). A file that exists but is not a valid entry is refused: problem()
    /// names the file and what is wrong, the refusal is logged (log::warn), and the file is
    /// replaced by the new measurement. Write failures are logged, never thrown.
    DeviceSpeed get(const std::function<DeviceSpeed()>& measure);
    bool hit() const { return hit_; }                      ///< the last get() answered from the file
    const std::string& problem() const { return problem_; }  ///< why the file was refused ("" = not refused)
    const std::filesystem::path& file() const { return file_; }

private:
    std::filesystem::path file_;
    std::string name_, description_;
    bool hit_ = false;
    std::string problem_;
};

/// False when the environment variable EASEL_AUTOFIT_BENCH is "0", "off", "no" or "false":
/// --auto-fit then skips the device micro-benchmarks (and their cache) and the cost model uses
/// its defaults by device type (GPU 2e13 FLOP/s and 12 GB/s, RPC 1 GB/s, CPU 2e11 FLOP/s).
bool device_bench_enabled();

}  // namespace easel::placement
