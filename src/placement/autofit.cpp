// --auto-fit (see autofit.h).
#include "placement/autofit.h"

#include "core/error.h"
#include "core/hash.h"
#include "core/log.h"
#include "placement/row_split.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <cstdlib>
#include <numeric>
#include <thread>

namespace easel::placement {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
/// Alignment slack the runtime adds to each slot / state buffer (runtime/sequence_runner.cpp).
constexpr uint64_t kSlack = 8 << 10;

double mib(uint64_t b) { return (double)b / kMiB; }
/// "9480" for large sizes, "1.74" for small ones (the tiny test models are a few MiB).
std::string mibs(uint64_t b) { return b >= 100 * kMiB ? fmt::format("{:.0f}", mib(b)) : fmt::format("{:.2f}", mib(b)); }

/// Defaults of the cost model where a device gives no figure (orders of magnitude: a PCIe 4
/// x16 link moves ~12 GB/s; loopback RPC ~1 GB/s; a discrete GPU ~20 TFLOP/s in f16, a desktop
/// CPU ~0.2 TFLOP/s).
double bandwidth(const FitDevice& d) {
    if (d.h2d_bytes_per_s > 0) return d.h2d_bytes_per_s;
    if (d.is_cpu()) return 2.0e10;
    if (d.name.rfind("RPC", 0) == 0) return 1.0e9;
    return 1.2e10;
}
double flops(const FitDevice& d) {
    if (d.flops > 0) return d.flops;
    return d.is_cpu() ? 2.0e11 : 2.0e13;
}

uint64_t total_params(const ModuleCosts& c) {
    return std::accumulate(c.block_bytes.begin(), c.block_bytes.end(), c.prologue_bytes);
}

/// One evaluated placement of one module.
struct Candidate {
    Tier tier = Tier::TimeShared;
    ModulePlacement place;
    bool stream = false;
    ModulePlan plan;
    double seconds = 0;
    int vae_tile = 0;
    uint64_t ram = 0;                       ///< host RAM held during the stage (Host params, CPU execution)
    std::optional<ModulePlan> encode_plan;  ///< VAE: the encode stage's plan under the same placement
    std::map<std::string, uint64_t> caps;   ///< budgets the planner lowered (max-allocation limits)
    std::string note;                       ///< why this candidate (for the reasons)
    int order = 0;                          ///< enumeration order (fastest device first)
};

/// The smallest miss seen for a module (for the "nothing fits" message).
struct Shortfall {
    uint64_t bytes = UINT64_MAX;  ///< need - available
    uint64_t need = 0, have = 0;
    uint64_t params = 0, compute = 0;  ///< parts of `need` that scale with the weights / the image
    std::string where;            ///< device name, or "host RAM"
    std::string what;             ///< the candidate, in words
    bool ram = false;
};

class Planner {
public:
    explicit Planner(const FitRequest& r) : req_(r) {
        for (auto& d : r.devices) {
            if (d.is_cpu()) cpu_ = &d;
            else if (d.budget > 0) accels_.push_back(&d);
        }
        // fastest first: compute throughput, then bandwidth, each in factor-2 buckets (measured
        // figures of identical devices differ by noise: they keep the given order)
        auto bucket = [](const FitDevice& d) { return std::floor(std::log2(bandwidth(d))); };
        auto fbucket = [](const FitDevice& d) { return std::floor(std::log2(flops(d))); };
        std::stable_sort(accels_.begin(), accels_.end(), [&](const FitDevice* a, const FitDevice* b) {
            if (fbucket(*a) != fbucket(*b)) return fbucket(*a) > fbucket(*b);
            return bucket(*a) > bucket(*b);
        });
        for (auto& d : r.devices) budgets_[d.name] = d.budget;
        if (cpu_ && cpu_->budget == 0) budgets_.erase(cpu_->name);  // host RAM unknown: unlimited
    }

    const FitDevice* device(const std::string& name) const {
        for (auto& d : req_.devices)
            if (d.name == name) return &d;
        return nullptr;
    }
    uint64_t ram_budget() const { return cpu_ ? cpu_->budget : 0; }  // 0 = unknown / unlimited
    const std::vector<const FitDevice*>& accels() const { return accels_; }
    const FitDevice* cpu() const { return cpu_; }
    /// The budgets candidates are planned in (a stage's later module: what the earlier ones leave).
    const std::map<std::string, uint64_t>& budgets() const { return budgets_; }
    void set_budgets(std::map<std::string, uint64_t> b) { budgets_ = std::move(b); }
    /// budgets() less the devices' use in `plans` (the earlier modules of a stage), as
    /// placement::plan_modules plans them at run time.
    std::map<std::string, uint64_t> left_after(const std::vector<const ModulePlan*>& plans) const {
        std::map<std::string, uint64_t> left = budgets_;
        for (auto* p : plans)
            for (auto& u : p->devices)
                if (auto it = left.find(u.device); it != left.end() && it->second > 0)
                    it->second = it->second > u.total() ? it->second - u.total() : 1;  // (0 would mean unlimited)
        return left;
    }

    /// Predicted seconds of module m under plan p (autofit.h "Cost model").
    double seconds(const FitModule& m, const ModulePlan& p, int vae_tile) const {
        const uint64_t all = std::max<uint64_t>(1, total_params(m.costs));
        const double fl = m.flops_per_eval > 0 ? m.flops_per_eval : (double)all;
        double load = 0, per_eval = 0;
        // each segment computes its share of the FLOPs by parameter bytes (the shares of a plan's
        // segments add to 1: parameters outside the blocks held by both the first and the last
        // segment are computed once)
        double seg_sum = 0;
        for (auto& s : p.segments) seg_sum += (double)s.param_bytes;
        if (seg_sum <= 0) seg_sum = (double)all;
        for (size_t i = 0; i < p.segments.size(); ++i) {
            const Segment& s = p.segments[i];
            if (is_row_split_device(s.device)) {  // (weights on the devices: read once, like Device residency)
                per_eval += row_split_seconds(m, s, fl / seg_sum);
                load += (double)s.param_bytes / req_.disk_bytes_per_s;
                continue;
            }
            const FitDevice* d = device(s.device);
            if (!d) continue;
            const double share = (double)s.param_bytes / seg_sum;
            per_eval += fl * share / flops(*d);
            if (s.per_eval) {
                per_eval += (double)s.param_bytes / bandwidth(*d);
                // Disk segments are read from the model file before every upload
                if (s.residency == Residency::Disk) per_eval += (double)s.param_bytes / req_.disk_bytes_per_s;
            } else if (s.residency == Residency::Host) load += (double)s.param_bytes / bandwidth(*d);
            else load += (double)s.param_bytes / req_.disk_bytes_per_s;
            if (i + 1 < p.segments.size() && p.segments[i + 1].device != s.device) {
                const FitDevice* n = device(p.segments[i + 1].device);
                per_eval += (double)s.state_bytes * (1.0 / bandwidth(*d) + (n ? 1.0 / bandwidth(*n) : 0.0));
            }
        }
        // overlapping tiles (overlap 0.5): about (1 / (1 - 0.5))^2 = 4x the pixels decoded
        if (vae_tile > 0) per_eval *= 4.0;
        return load + m.evals * per_eval;
    }

    /// Seconds of one evaluation of a row-split segment (its blocks on ggml's meta device over
    /// the member devices; `flops_per_byte` = the module's FLOPs per parameter byte): each member
    /// computes 1/n of the blocks, the slowest one sets the pace; the partial sums of the two
    /// row-role matmuls of each block (attention out, feed-forward out: a hidden state each,
    /// ModuleCosts::state_bytes(1)) are all-reduced in ceil(log2 n) steps, each step over the
    /// slowest member link in and out (ggml's fallback all-reduce copies between the backends).
    double row_split_seconds(const FitModule& m, const Segment& s, double flops_per_byte) const {
        const std::vector<std::string> members = row_split_members(s.device);
        const double n = (double)members.size();
        double slow_flops = 1e300, slow_bw = 1e300;
        for (auto& name : members) {
            const FitDevice* d = device(name);
            if (!d) continue;
            slow_flops = std::min(slow_flops, flops(*d));
            slow_bw = std::min(slow_bw, bandwidth(*d));
        }
        if (slow_flops >= 1e300) return 0;
        double t = flops_per_byte * (double)s.param_bytes / (n * slow_flops);
        const int blocks = s.end - s.begin;
        if (m.costs.state_bytes && m.costs.block_bytes.size() > 1 && members.size() > 1) {
            const double partial = (double)m.costs.state_bytes(1);
            const double steps = std::ceil(std::log2(n));
            t += (double)blocks * 2.0 * steps * partial * (2.0 / slow_bw);
        }
        return t;
    }

    /// Host RAM a plan holds during its stage.
    uint64_t ram_of(const ModulePlan& p) const {
        uint64_t r = p.host_bytes;
        for (auto& u : p.devices)
            if (const FitDevice* d = device(u.device); d && d->is_cpu()) r += u.total();
        return r;
    }

    /// Largest single buffer the runtime allocates for `p` on each device that exceeds the
    /// device's max allocation; "" when every buffer fits. (Parameters and compute buffers are
    /// split by ggml into buffers of at most the max size; slots and state buffers are one
    /// buffer each: runtime/sequence_runner.cpp.)
    std::string alloc_violation(const ModulePlan& p) const {
        for (size_t i = 0; i < p.segments.size(); ++i) {
            const Segment& s = p.segments[i];
            const FitDevice* d = device(s.device);
            if (!d || d->max_alloc == 0) continue;
            if (s.per_eval && s.param_bytes + kSlack > d->max_alloc)
                return fmt::format("a {:.0f} MiB streaming slot exceeds {}'s {:.0f} MiB max allocation", mib(s.param_bytes + kSlack), d->name,
                                   mib(d->max_alloc));
            if (i + 1 < p.segments.size() && p.segments[i + 1].device == s.device && s.state_bytes + kSlack > d->max_alloc)
                return fmt::format("a {:.0f} MiB state buffer exceeds {}'s {:.0f} MiB max allocation", mib(s.state_bytes + kSlack), d->name,
                                   mib(d->max_alloc));
        }
        return "";
    }

    /// Plans `place` with plan_module; on a max-allocation violation lowers the budget of the
    /// offending device (smaller segments) up to 24 times. Records a shortfall on failure.
    std::optional<Candidate> evaluate(const FitModule& m, Tier tier, ModulePlacement place, bool stream, const ModuleCosts& costs,
                                      int vae_tile, Shortfall& sf, const std::string& what) const {
        std::map<std::string, uint64_t> budgets = budgets_;
        std::map<std::string, uint64_t> caps;
        bool ram_lowered = false;  // a budget was lowered so that disk segments fit the host RAM
        for (int attempt = 0; attempt < 24; ++attempt) {
            ModulePlan p;
            try {
                p = plan_module(m.module, place, stream, costs, budgets);
            } catch (const Error& e) {
                if (e.kind() != ErrorKind::OutOfMemory) throw;
                log::debug("auto-fit: {}: does not fit ({})", what, e.what());
                // (after lowering a budget for the RAM, the RAM shortfall is already recorded)
                if (!ram_lowered) note_shortfall(m, place, stream, costs, sf, what);
                return std::nullopt;
            }
            const std::string viol = alloc_violation(p);
            if (!viol.empty()) {
                log::debug("auto-fit: {}: {}", what, viol);
                // the device whose slot/state is too big: lower its budget by a sixth and retry
                bool lowered = false;
                for (auto& s : p.segments) {
                    const FitDevice* d = device(s.device);
                    if (!d || d->max_alloc == 0 || d->is_cpu()) continue;
                    if ((s.per_eval && s.param_bytes + kSlack > d->max_alloc) || s.state_bytes + kSlack > d->max_alloc) {
                        uint64_t cur = budgets.count(d->name) ? budgets[d->name] : d->budget;
                        uint64_t used = 0;
                        for (auto& u : p.devices)
                            if (u.device == d->name) used = u.total();
                        uint64_t next = std::min(cur, used) / 6 * 5;
                        // a --max-vram cap is written in GiB with 4 decimals: round down to what the flag can say
                        next = (uint64_t)(std::floor((double)(next + d->headroom) / kGiB * 1e4) / 1e4 * kGiB) - d->headroom;
                        budgets[d->name] = caps[d->name] = next;
                        lowered = true;
                        break;
                    }
                }
                if (!lowered) {
                    record(sf, Shortfall{1, 0, 0, 0, 0, p.segments.empty() ? "" : p.segments[0].device, what + ": " + viol, false});
                    return std::nullopt;
                }
                continue;
            }
            Candidate c;
            c.order = counter_++;
            c.tier = tier;
            c.place = place;  // (copies: a retry below plans `place` again)
            c.stream = stream;
            c.plan = std::move(p);
            c.vae_tile = vae_tile;
            c.seconds = seconds(m, c.plan, vae_tile);
            c.ram = ram_of(c.plan);
            c.caps = caps;
            c.note = what;
            if (ram_budget() > 0 && c.ram > ram_budget()) {
                log::debug("auto-fit: {}: needs {:.1f} MiB of host RAM, {:.1f} MiB available", what, mib(c.ram), mib(ram_budget()));
                // Disk segments read per evaluation pass through a host buffer of one segment:
                // smaller segments need less RAM. They are cut to the device budget, so lower it
                // (a --max-vram cap) by twice the excess (two slots), at least by 1/16, and retry.
                const Segment* disk_seg = nullptr;
                for (auto& g : c.plan.segments)
                    if (g.per_eval && g.residency == Residency::Disk) disk_seg = &g;
                const FitDevice* dd = disk_seg ? device(disk_seg->device) : nullptr;
                if (dd && !dd->is_cpu() && c.plan.devices.size() == 1 && c.ram - c.plan.host_bytes < ram_budget()) {
                    if (!ram_lowered) record(sf, ram_shortfall(c, what));
                    const uint64_t cur = std::min(budgets.count(dd->name) ? budgets[dd->name] : dd->budget, c.plan.devices[0].total());
                    const uint64_t cut = std::max(2 * (c.ram - ram_budget()), cur / 16);
                    if (cut < cur) {
                        uint64_t next = cur - cut;
                        next = (uint64_t)(std::floor((double)(next + dd->headroom) / kGiB * 1e4) / 1e4 * kGiB) - dd->headroom;
                        budgets[dd->name] = caps[dd->name] = next;
                        ram_lowered = true;
                        continue;
                    }
                    return std::nullopt;
                }
                record(sf, ram_shortfall(c, what));
                return std::nullopt;
            }
            if (m.encode_costs && !fit_encoder(m, place, vae_tile, budgets, c, sf, what)) return std::nullopt;
            return c;
        }
        record(sf, Shortfall{1, 0, 0, 0, 0, "", what + ": no segmentation respects the max allocation", false});
        return std::nullopt;
    }

    /// The VAE encoder (FitModule::encode_costs at the candidate's tile) planned under the
    /// candidate's placement and budgets, in its own stage: sets c.encode_plan and adds its
    /// predicted time; false (a shortfall recorded) when it does not fit, breaks a max
    /// allocation or the host RAM.
    bool fit_encoder(const FitModule& m, const ModulePlacement& place, int vae_tile, const std::map<std::string, uint64_t>& budgets,
                     Candidate& c, Shortfall& sf, const std::string& what) const {
        const std::string ew = what + ", its encoder" + (vae_tile > 0 ? fmt::format(" tiled {}x{}", vae_tile, vae_tile) : "");
        const ModuleCosts ec = m.encode_costs(vae_tile);
        ModulePlan p;
        try {
            p = plan_module(m.module, place, false, ec, budgets);
        } catch (const Error& e) {
            if (e.kind() != ErrorKind::OutOfMemory) throw;
            log::debug("auto-fit: {}: does not fit ({})", ew, e.what());
            note_shortfall(m, place, false, ec, sf, ew);
            return false;
        }
        p.stage = kVaeEncodeStage;
        if (const std::string viol = alloc_violation(p); !viol.empty()) {
            record(sf, Shortfall{1, 0, 0, 0, 0, p.segments.empty() ? "" : p.segments[0].device, ew + ": " + viol, false});
            return false;
        }
        if (const uint64_t ram = ram_of(p); ram_budget() > 0 && ram > ram_budget()) {
            Candidate e;
            e.plan = p;
            e.ram = ram;
            record(sf, ram_shortfall(e, ew));
            return false;
        }
        FitModule em;  // one encode per image: the tiles are in the plan's graph count
        em.module = m.module;
        em.costs = ec;
        em.evals = 1;
        if (ec.flops) em.flops_per_eval = ec.flops(0, (int)ec.block_bytes.size(), true, true);
        c.seconds += seconds(em, p, vae_tile);
        c.encode_plan = std::move(p);
        return true;
    }

    /// The host-RAM shortfall of candidate c.
    Shortfall ram_shortfall(const Candidate& c, const std::string& what) const {
        Shortfall s;
        s.bytes = c.ram - ram_budget();
        s.need = c.ram;
        s.have = ram_budget();
        s.params = c.plan.host_bytes;
        s.compute = c.ram - c.plan.host_bytes;
        s.where = "host RAM";
        s.what = what;
        s.ram = true;
        return s;
    }

    static void record(Shortfall& best, const Shortfall& s) {
        if (s.bytes < best.bytes) best = s;
    }

    /// The smallest need of a failed candidate against its budget (for the message): the
    /// plan_module configuration with the least device memory for that placement.
    void note_shortfall(const FitModule& m, const ModulePlacement& place, bool stream, const ModuleCosts& c, Shortfall& sf,
                        const std::string& what) const {
        (void)m;
        const int n = (int)c.block_bytes.size();
        const uint64_t params = total_params(c);
        uint64_t have = 0;
        for (auto& d : place.devices) {
            auto it = budgets_.find(d);
            have += it == budgets_.end() ? 0 : it->second;
        }
        const std::string& dev = place.devices[0];
        uint64_t need_params = params, need_comp = c.measure(0, n, true, true, dev);
        // weights in RAM or on disk: cut into per-evaluation segments down to single blocks
        const bool host = !place.params.empty();
        if (n > 0) {
            uint64_t one = 0, state = 0, slot = 0;
            for (int i = 0; i < n; ++i) {
                one = std::max(one, c.measure(i, i + 1, i == 0, i == n - 1, dev));
                slot = std::max(slot, c.block_bytes[(size_t)i] + ((i == 0 || i == n - 1) ? c.prologue_bytes : 0));
            }
            if (c.state_bytes)
                for (int e = 1; e < n; ++e) state = std::max(state, c.state_bytes(e));
            const uint64_t states = state ? 2 * (state + kSlack) : 0;
            if (host || stream) {
                // every block uploaded per evaluation: two slots beside a single-block graph
                need_params = 2 * (slot + kSlack);
                need_comp = one + states;
            } else if (place.devices.size() == 1 && one + states < need_comp) {
                need_comp = one + states;  // one segment per block
            }
        }
        Shortfall s;
        s.need = need_params + need_comp;
        s.have = have;
        s.bytes = s.need > have ? s.need - have : 0;
        s.params = need_params;
        s.compute = need_comp;
        s.where = place.devices.size() == 1 ? dev : join(place.devices);
        s.what = what;
        // an estimate within the budget does not explain why the plan failed (its real segments
        // need more): leave the message to a candidate whose shortfall is known
        if (s.bytes == 0) return;
        record(sf, s);
    }

    static std::string join(const std::vector<std::string>& v) { return fmt::format("{}", fmt::join(v, "&")); }

private:
    const FitRequest& req_;
    const FitDevice* cpu_ = nullptr;
    std::vector<const FitDevice*> accels_;
    std::map<std::string, uint64_t> budgets_;
    mutable int counter_ = 0;
};

bool multi_device_ok(PModule m) { return m == PModule::Diffusion || m == PModule::Te; }

/// Why module costs `c` cannot be row split over `n` devices with parameters at `params` ("" when
/// it can): the conditions under which placement::plan_module runs --split-mode row instead of
/// falling back to layer split (checked here first so that the planner's many trial plans do not
/// each warn).
std::string row_refusal(const ModuleCosts& c, size_t n, const std::string& params) {
    if (n < 2) return "one device";
    if (!c.row_split) return "this module has no row-split rules";
    if (!c.row_split->why_not.empty()) return c.row_split->why_not;
    if (!params.empty()) return "its parameters are not kept on its devices (--params-backend)";
    if (c.row_split->max_devices > 0 && (int64_t)n > c.row_split->max_devices)
        return fmt::format("{} cuts into only {} whole slices (heads) for {} devices", c.row_split->max_devices_param, c.row_split->max_devices, n);
    if (c.block_bytes.empty()) return "it has no blocks";
    if (!c.row_split_bytes || c.row_split_bytes(n).size() != n) return "a weight slice would not be whole quantisation blocks";
    return "";
}

std::string join_devices(const std::vector<std::string>& v) { return fmt::format("{}", fmt::join(v, "&")); }

std::string describe_candidate(const Candidate& c) {
    std::string where = join_devices(c.place.devices);
    std::string s;
    switch (c.tier) {
        case Tier::Resident:
        case Tier::TimeShared: s = fmt::format("whole on {}", where); break;
        case Tier::HostStreamed: {
            int per = 0;
            for (auto& g : c.plan.segments) per += g.per_eval;
            s = fmt::format("on {}, weights in host RAM, {} of {} segment(s) uploaded per evaluation", where, per, c.plan.segments.size());
            break;
        }
        case Tier::LayerSplit: s = fmt::format("{} split over {}", c.place.split == SplitMode::Row ? "row" : "layer", where); break;
        case Tier::Disk: {
            int per = 0;
            for (auto& g : c.plan.segments) per += g.per_eval;
            s = per ? fmt::format("on {}, weights read from disk per evaluation in {} segment(s) through a {} MiB host buffer", where, per,
                                  mibs(c.plan.host_bytes))
                    : fmt::format("on {}, weights read from disk per phase", where);
            break;
        }
        case Tier::Cpu: s = c.place.params == kDisk ? "on the CPU, weights read from the file per phase" : "on the CPU, weights in host RAM"; break;
    }
    if (c.vae_tile > 0) s += fmt::format(", tiled decode ({}x{} latent cells)", c.vae_tile, c.vae_tile);
    return s;
}

/// Suggestion for the smallest shortfall: lower resolution, a quantised --type, or more memory.
std::string cheapest_change(const Shortfall& s, const FitModule& m, const FitJob& job) {
    const double sf = (double)s.bytes;
    // the image-dependent part scales about with the pixel count
    std::string res;
    if (s.compute > 0 && (double)s.compute > sf) {
        const double f = std::sqrt(((double)s.compute - sf) / (double)s.compute);
        const int w = (int)(job.width * f) / 64 * 64, h = (int)(job.height * f) / 64 * 64;
        if (w >= 64 && h >= 64 && (w < job.width || h < job.height)) res = fmt::format("a lower resolution (about {}x{} instead of {}x{})", w, h, job.width, job.height);
        if (w >= job.width * 3 / 4 && h >= job.height * 3 / 4 && !res.empty()) return res;
    }
    // weights: q8_0 = 34 bytes per 32 weights, q4_0 = 18 per 32 (ggml block sizes)
    const uint64_t params = total_params(m.costs);
    if (s.params > 0 && params > 0) {
        const double cur = m.param_count > 0 ? (double)params / (double)m.param_count : 2.0;  // unknown: assume f16
        for (auto [name, bpw] : {std::pair{"q8_0", 34.0 / 32.0}, std::pair{"q4_0", 18.0 / 32.0}}) {
            if (bpw >= cur) continue;
            const double saved = (double)s.params * (1.0 - bpw / cur);
            if (saved >= sf)
                return fmt::format("a quantised --type {} ({} weights {:.0f} -> about {:.0f} MiB)", name, pmodule_name(m.module), mib(params),
                                   mib(params) * bpw / cur);
        }
    }
    if (!res.empty()) return res;
    return s.ram ? fmt::format("{} MiB more host RAM", mibs(s.bytes)) : fmt::format("{} MiB more memory on {} (a larger --max-vram)", mibs(s.bytes), s.where);
}

std::string fmt_gib(double g) {
    std::string s = fmt::format("{:.4f}", g);
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
}

/// The --max-vram value of the plan's flags: the user's entries, except those of a device the
/// planner capped (its cap replaces them: it is at most the user's, whose budget the planner
/// started from), then one DEV=GiB entry per capped device. A user entry is matched to a device
/// as parse_placement resolves it (exact name or unique prefix, case-insensitive), so "rpc0=1"
/// and a cap on "RPC0[127.0.0.1:50052]" give one entry, never the device twice.
std::string merge_max_vram(const FitRequest& req, const std::map<std::string, uint64_t>& caps) {
    std::vector<DeviceName> names;
    for (auto& d : req.devices) names.push_back({d.name, d.type, d.name.rfind("RPC", 0) == 0});
    std::string out;
    size_t pos = 0;
    const std::string& v = req.max_vram;
    while (pos <= v.size() && !v.empty()) {
        const size_t comma = std::min(v.find(',', pos), v.size());
        const std::string e = v.substr(pos, comma - pos);
        pos = comma + 1;
        const size_t eq = e.find('=');
        bool replaced = false;
        if (eq != std::string::npos && !caps.empty()) {
            try {
                replaced = caps.count(resolve_device(e.substr(0, eq), names, "--max-vram")) > 0;
            } catch (const Error&) {
                // (an entry that names no planned device is kept as written)
            }
        }
        if (!replaced && e.find_first_not_of(" \t") != std::string::npos) out += (out.empty() ? "" : ",") + e;
        if (comma == v.size()) break;
    }
    for (auto& cap : caps) {
        const auto& d = cap.first;  // (a named copy: clang 14 cannot capture a structured binding)
        const auto& b = cap.second;
        const uint64_t head = [&] {
            for (auto& dev : req.devices)
                if (dev.name == d) return dev.headroom;
            return uint64_t{0};
        }();
        out += fmt::format("{}{}={}", out.empty() ? "" : ",", d, fmt_gib((double)(b + head) / kGiB));
    }
    return out;
}

}  // namespace

const char* tier_name(Tier t) {
    switch (t) {
        case Tier::Resident: return "resident";
        case Tier::TimeShared: return "time-shared";
        case Tier::HostStreamed: return "host-streamed";
        case Tier::LayerSplit: return "layer split";
        case Tier::Disk: return "disk";
        case Tier::Cpu: return "CPU";
    }
    return "?";
}

std::vector<ModulePlan> FitResult::plans() const {
    std::vector<ModulePlan> v;
    for (auto& c : choices) v.push_back(c.plan);
    for (auto& c : choices)
        if (c.encode_plan) v.push_back(*c.encode_plan);
    return v;
}

namespace {

/// Within 5% of the best counts as a tie: the earliest candidate (fastest device first) wins.
/// Sorts `v` by predicted seconds and moves that candidate to the front.
void best_of(std::vector<Candidate>& v) {
    std::stable_sort(v.begin(), v.end(), [](const Candidate& a, const Candidate& b) { return a.seconds < b.seconds; });
    if (v.size() > 1) {
        std::vector<Candidate> ordered;
        size_t pick = 0;
        for (size_t i = 0; i < v.size(); ++i)
            if (v[i].seconds <= v[0].seconds * 1.05 && v[i].order < v[pick].order) pick = i;
        ordered.push_back(v[pick]);
        for (size_t i = 0; i < v.size(); ++i)
            if (i != pick) ordered.push_back(v[i]);
        v = std::move(ordered);
    }
}

/// One planning pass over a request (whose budgets already include the caps of earlier passes),
/// in named steps:
///   check_pins        the pinned devices exist;
///   choose_module(k)  per module, in order, the candidates of its best tier 2..6 (tier_candidates
///                     per tier; a stage's later modules take the first one's placement in what
///                     the earlier ones leave, siblings_fit keeps the first one's candidates where
///                     the rest of the stage fits beside them); refuse() when none fits;
///   choose_resident   tier 1: every module whole on an accelerator at once, when the sums fit;
///   assemble          the FitResult: choices, reasons, --split-mode, the entries of modules not
///                     planned, predicted peaks, the flags line.
class FitPass {
public:
    explicit FitPass(const FitRequest& req)
        : req_(req), planner_(req), nm_(req.modules.size()), cands_(nm_), shorts_(nm_), whole_(nm_) {}

    /// The pass: see the class comment. `fixed`: the caps already in the request's budgets;
    /// `new_caps` gets the caps a candidate needed beyond them.
    FitResult run(const std::map<std::string, uint64_t>& fixed, std::map<std::string, uint64_t>& new_caps) {
        check_pins();
        for (size_t k = 0; k < nm_; ++k) choose_module(k);
        const bool tier1 = choose_resident();
        return assemble(fixed, new_caps, tier1);
    }

private:
    /// What choose_module knows of module k while it enumerates tiers.
    struct ModuleScope {
        size_t k = 0;
        const FitModule* m = nullptr;
        const char* mn = "";
        std::vector<std::string> pin_dev;   ///< pinned devices (a stage's later module: the first one's)
        std::optional<std::string> pin_par; ///< pinned --params-backend entry (likewise)
        int first = -1;                     ///< the stage's first module, or -1 when k is it
        bool pinned_cpu = false;
        std::vector<std::string> singles;   ///< single devices the module may run on
        /// A --params-backend location v is allowed by the pin.
        bool params_ok(const std::string& v) const { return !pin_par || *pin_par == v || (v != kDisk && !pin_par->empty() && !v.empty()); }
    };

    /// Error(InvalidInput) for a pinned device that is not among the devices.
    void check_pins() const {
        for (size_t i = 0; i < kModuleCount; ++i)
            for (auto& d : req_.pinned_devices[i])
                if (!planner_.device(d)) fail(ErrorKind::InvalidInput, "--auto-fit: {} is pinned to {}, which is not among the devices", pmodule_name((PModule)i), d);
    }

    /// Several modules of one stage (FLUX.1's T5 and CLIP-L are both te): the runtime gives them
    /// one placement (the module's) and loads them together. The index of the first module of
    /// k's stage, or -1 when k is the first.
    int first_of_stage(size_t k) const {
        for (size_t j = 0; j < k; ++j)
            if (req_.modules[j].module == req_.modules[k].module) return (int)j;
        return -1;
    }

    /// The first module of a stage keeps candidate c only where the stage's other modules,
    /// planned the same way, fit beside it (per-device sums within the budgets).
    bool siblings_fit(size_t k, const Candidate& c) {
        std::map<std::string, uint64_t> sum;
        for (auto& u : c.plan.devices) sum[u.device] += u.total();
        const auto saved = planner_.budgets();
        std::vector<ModulePlan> planned{c.plan};
        bool ok = true;
        for (size_t j = k + 1; j < nm_ && ok; ++j) {
            if (req_.modules[j].module != req_.modules[k].module) continue;
            std::vector<const ModulePlan*> before;
            for (auto& p : planned) before.push_back(&p);
            planner_.set_budgets(planner_.left_after(before));
            Shortfall ignored;
            // a sibling that cannot be row split runs as a layer split over the same devices (as
            // plan_module does at run time)
            ModulePlacement sp = c.place;
            if (sp.split == SplitMode::Row && !row_refusal(req_.modules[j].costs, sp.devices.size(), sp.params).empty()) sp.split = SplitMode::Layer;
            auto o = planner_.evaluate(req_.modules[j], c.tier, sp, c.stream, req_.modules[j].costs, 0, ignored, "sibling");
            planner_.set_budgets(saved);
            if (!o) ok = false;
            else {
                for (auto& u : o->plan.devices) sum[u.device] += u.total();
                planned.push_back(o->plan);
            }
        }
        if (!ok) return false;
        for (auto& [d, b] : sum) {
            const FitDevice* dev = planner_.device(d);
            if (dev && dev->budget > 0 && b > dev->budget) {
                log::debug("auto-fit: {} with the rest of its stage needs {:.1f} MiB of {}, budget {:.1f} MiB", c.note, mib(b), d, mib(dev->budget));
                return false;
            }
        }
        return true;
    }

    /// Module k's pins, stage and single devices; for a stage's later module the planner's
    /// budgets become what the earlier ones leave (choose_module restores them). Throws
    /// Error(InvalidInput) for a pinned device list longer than the module's blocks.
    ModuleScope scope_of(size_t k) {
        ModuleScope s;
        s.k = k;
        s.m = &req_.modules[k];
        const FitModule& m = *s.m;
        s.pin_dev = req_.pinned_devices[(size_t)m.module];
        s.pin_par = req_.pinned_params[(size_t)m.module];
        s.first = first_of_stage(k);
        if (s.first >= 0) {  // a later module of a stage: the first one's placement, in what the earlier ones leave
            s.pin_dev = cands_[(size_t)s.first][0].place.devices;
            s.pin_par = cands_[(size_t)s.first][0].place.params;
            std::vector<const ModulePlan*> before;
            for (size_t j = 0; j < k; ++j)
                if (req_.modules[j].module == m.module) before.push_back(&cands_[j][0].plan);
            planner_.set_budgets(planner_.left_after(before));
        }
        s.mn = pmodule_name(m.module);
        s.pinned_cpu = s.pin_dev.size() == 1 && planner_.device(s.pin_dev[0])->is_cpu();
        // a pinned device list longer than the module's blocks can never be a layer split: say
        // so (else every tier skips it and the error blamed the memory)
        if (const int nb = (int)m.costs.block_bytes.size(); s.pin_dev.size() > 1 && (int)s.pin_dev.size() > std::max(1, nb))
            fail(ErrorKind::InvalidInput, "--auto-fit: {} ({}) has {} block(s) to split but --backend names {} devices for it ({}); name at most {}{}",
                 s.mn, m.costs.label, nb, s.pin_dev.size(), join_devices(s.pin_dev), std::max(1, nb),
                 nb <= 1 ? " (one device)" : "");
        // single devices the module may run on (pinned: that one; else every accelerator, fastest first)
        if (s.pin_dev.size() == 1) {
            if (!s.pinned_cpu) s.singles.push_back(s.pin_dev[0]);
        } else if (s.pin_dev.empty()) {
            for (auto* d : planner_.accels()) s.singles.push_back(d->name);
        }
        return s;
    }

    /// Module k's candidates of its best tier (2..6) into cands_[k]; refuse(k) when none fits.
    void choose_module(size_t k) {
        const auto saved_budgets = planner_.budgets();
        const ModuleScope s = scope_of(k);
        for (int tier = 2; tier <= 6 && cands_[k].empty(); ++tier) {
            std::vector<Candidate> got = tier_candidates(s, (Tier)tier);
            if (s.first < 0) got.erase(std::remove_if(got.begin(), got.end(), [&](const Candidate& c) { return !siblings_fit(k, c); }), got.end());
            best_of(got);
            cands_[k] = std::move(got);
        }
        planner_.set_budgets(saved_budgets);
        if (cands_[k].empty()) refuse(k);
    }

    /// The candidates of one tier for a module (autofit.h "Tiers").
    std::vector<Candidate> tier_candidates(const ModuleScope& s, Tier tier) {
        switch (tier) {
            case Tier::TimeShared: return time_shared(s);
            case Tier::HostStreamed: return host_streamed(s);
            case Tier::LayerSplit: return split_over_devices(s);
            case Tier::Disk: return from_disk(s);
            case Tier::Cpu: return on_cpu(s);
            default: return {};
        }
    }

    /// Tier 2: whole on one accelerator in its own stage; a VAE decode that does not fit whole
    /// with the largest tile that fits (only when no device holds the whole decode).
    std::vector<Candidate> time_shared(const ModuleScope& s) {
        std::vector<Candidate> got;
        const FitModule& m = *s.m;
        if (!s.params_ok("")) return got;
        for (auto& d : s.singles) {
            ModulePlacement pl{{d}, "", SplitMode::Layer};
            if (auto c = planner_.evaluate(m, Tier::TimeShared, pl, false, m.costs, 0, shorts_[s.k], fmt::format("{} whole on {}", s.mn, d))) {
                whole_[s.k].push_back(*c);
                got.push_back(std::move(*c));
            } else if (m.module == PModule::Vae && m.measure_tile) {
                // tiled decode, largest tile that fits
                for (int t : {128, 96, 64, 48, 32, 24, 16}) {
                    if (t >= std::max(m.latent_w, m.latent_h)) continue;
                    ModuleCosts tc = m.costs;
                    auto mt = m.measure_tile;
                    tc.measure = [mt, t](int, int, bool, bool, const std::string& dev) { return mt(t, dev); };
                    if (auto c2 = planner_.evaluate(m, Tier::TimeShared, pl, false, tc, t, shorts_[s.k], fmt::format("{} on {} tiled {}x{}", s.mn, d, t, t))) {
                        got.push_back(std::move(*c2));
                        break;
                    }
                }
            }
        }
        // tiling changes the image (seams) and decodes more pixels: only when no
        // device holds the whole decode (and encode)
        if (std::any_of(got.begin(), got.end(), [](const Candidate& c) { return c.vae_tile == 0; }))
            got.erase(std::remove_if(got.begin(), got.end(), [](const Candidate& c) { return c.vae_tile > 0; }), got.end());
        return got;
    }

    /// Tier 3: weights in host RAM, uploaded per evaluation (diffusion: --stream-layers).
    std::vector<Candidate> host_streamed(const ModuleScope& s) {
        std::vector<Candidate> got;
        const FitModule& m = *s.m;
        if (s.pin_par && (s.pin_par->empty() || *s.pin_par == kDisk)) return got;
        const std::string host = s.pin_par && !s.pin_par->empty() && *s.pin_par != kDisk ? *s.pin_par : std::string(planner_.cpu() ? planner_.cpu()->name : "CPU");
        for (auto& d : s.singles) {
            ModulePlacement pl{{d}, host, SplitMode::Layer};
            const bool stream = m.module == PModule::Diffusion;
            if (auto c = planner_.evaluate(m, Tier::HostStreamed, pl, stream, m.costs, 0, shorts_[s.k], fmt::format("{} on {} streamed from host RAM", s.mn, d)))
                got.push_back(std::move(*c));
        }
        return got;
    }

    /// Tier 4: contiguous block ranges over 2..4 accelerators (or the pinned list), and with
    /// --split-mode row a row split over the same sets where the module can be row split (any
    /// row candidate that fits beats the layer splits; else a warning).
    std::vector<Candidate> split_over_devices(const ModuleScope& s) {
        std::vector<Candidate> got;
        const FitModule& m = *s.m;
        // (a VAE decoder only over a list the user named: its need is mostly the
        // compute buffer, which a layer split does not shrink; weights pinned to host
        // RAM or another device are kept, each device's range staged / streamed)
        if (!(multi_device_ok(m.module) || (m.module == PModule::Vae && s.pin_dev.size() > 1)) || (s.pin_par && *s.pin_par == kDisk)) return got;
        std::vector<std::vector<std::string>> sets;
        if (s.pin_dev.size() > 1) sets.push_back(s.pin_dev);
        else if (s.pin_dev.empty()) {
            // every subset of 2..4 accelerators, in speed order
            const auto& A = planner_.accels();
            const int na = (int)A.size();
            for (int mask = 1; mask < (1 << std::min(na, 8)); ++mask) {
                int bits = __builtin_popcount((unsigned)mask);
                if (bits < 2 || bits > 4) continue;
                std::vector<std::string> set;
                for (int i = 0; i < na; ++i)
                    if (mask & (1 << i)) set.push_back(A[(size_t)i]->name);
                sets.push_back(set);
            }
        }
        const bool want_row = req_.split[(size_t)m.module] == SplitMode::Row;
        std::vector<Candidate> rows;
        std::string refused;  // why a set could not be row split (the first reason met)
        bool row_tried = false;
        for (auto& set : sets) {
            if ((int)set.size() > std::max<int>(1, (int)m.costs.block_bytes.size())) continue;
            const std::string par = s.pin_par ? *s.pin_par : "";
            if (want_row) {
                if (const std::string why = row_refusal(m.costs, set.size(), par); !why.empty()) {
                    if (refused.empty()) refused = why;
                } else {
                    row_tried = true;
                    ModulePlacement rp{set, par, SplitMode::Row};
                    if (auto c = planner_.evaluate(m, Tier::LayerSplit, rp, false, m.costs, 0, shorts_[s.k], fmt::format("{} row split over {}", s.mn, join_devices(set))))
                        rows.push_back(std::move(*c));
                }
            }
            ModulePlacement pl{set, par, SplitMode::Layer};
            if (auto c = planner_.evaluate(m, Tier::LayerSplit, pl, false, m.costs, 0, shorts_[s.k], fmt::format("{} layer split over {}", s.mn, join_devices(set))))
                got.push_back(std::move(*c));
        }
        if (!rows.empty()) got = std::move(rows);
        else if (want_row && !got.empty()) {
            // each warning once per module (the te stage's modules are planned one by one)
            warnings_.push_back(fmt::format(
                "--split-mode row for {} ({}): {}; auto-fit plans a layer split", s.mn, m.costs.label,
                row_tried ? "no row split over the candidate devices fits their budgets (each member holds the compute "
                            "buffer of the whole blocks graph and the mirrored weights)"
                          : refused));
        }
        return got;
    }

    /// Tier 5: weights read from the model file (per phase, or per evaluation in --max-vram
    /// segments through one transient host buffer when the device cannot hold them whole).
    std::vector<Candidate> from_disk(const ModuleScope& s) {
        std::vector<Candidate> got;
        const FitModule& m = *s.m;
        if (!s.params_ok(kDisk)) return got;
        for (auto& d : s.singles) {
            ModulePlacement pl{{d}, kDisk, SplitMode::Layer};
            if (auto c = planner_.evaluate(m, Tier::Disk, pl, false, m.costs, 0, shorts_[s.k], fmt::format("{} on {} from disk", s.mn, d)))
                got.push_back(std::move(*c));
        }
        return got;
    }

    /// Tier 6: on the CPU (an explicit --params-backend entry is kept; host RAM is the CPU's own).
    std::vector<Candidate> on_cpu(const ModuleScope& s) {
        std::vector<Candidate> got;
        const FitModule& m = *s.m;
        if (!planner_.cpu() || (!s.pin_dev.empty() && !s.pinned_cpu)) return got;
        const std::string loc = s.pin_par && *s.pin_par != planner_.cpu()->name ? *s.pin_par : "";
        ModulePlacement pl{{planner_.cpu()->name}, loc, SplitMode::Layer};
        if (auto c = planner_.evaluate(m, Tier::Cpu, pl, false, m.costs, 0, shorts_[s.k], fmt::format("{} on the CPU", s.mn)))
            got.push_back(std::move(*c));
        return got;
    }

    /// Nothing fits module k: Error(OutOfMemory) with the closest plan and the cheapest change
    /// (or, without a known shortfall, what to drop or try).
    [[noreturn]] void refuse(size_t k) const {
        const FitModule& m = req_.modules[k];
        const char* mn = pmodule_name(m.module);
        const Shortfall& s = shorts_[k];
        if (s.need == 0) {
            if (!req_.pinned_devices[(size_t)m.module].empty() || req_.pinned_params[(size_t)m.module])
                fail(ErrorKind::OutOfMemory,
                     "--auto-fit: nothing fits {} where your --backend/--params-backend entry puts it ({}){}; drop that entry to let "
                     "--auto-fit choose, or raise --max-vram",
                     mn, s.what.empty() ? join_devices(req_.pinned_devices[(size_t)m.module]) : s.what,
                     m.module == PModule::Vae && req_.pinned_devices[(size_t)m.module].size() > 1
                         ? " (cutting the VAE into layers hardly shrinks its compute buffer: another device order or --vae-tiling may fit)"
                         : "");
            fail(ErrorKind::OutOfMemory, "--auto-fit: nothing fits {}: {}; {}", mn, s.what.empty() ? "no device can run it" : s.what,
                 m.module == PModule::Vae ? "try --vae-on-cpu or other devices (VAE weights stay F32 whatever --type says)"
                                          : "try a quantised --type or other devices");
        }
        fail(ErrorKind::OutOfMemory,
             "--auto-fit: nothing fits {}: the closest plan ({}) needs {} MiB of {} but {} MiB are available (short {} MiB); "
             "cheapest change: {}",
             mn, s.what, mibs(s.need), s.where, mibs(s.have), mibs(s.bytes), cheapest_change(s, m, req_.job));
    }

    /// Tier 1: every module whole on an accelerator, all loaded at once (sums per device fit; a
    /// stage's modules on one placement): the fastest such combination replaces each module's
    /// candidates. True when one was found.
    bool choose_resident() {
        bool tier1 = nm_ > 0;
        for (size_t k = 0; k < nm_; ++k) tier1 &= !whole_[k].empty() && cands_[k][0].tier == Tier::TimeShared && cands_[k][0].vae_tile == 0;
        if (!tier1) return false;
        std::vector<int> cur(nm_, 0), best;
        double best_t = 1e300;
        std::map<std::string, uint64_t> use;
        std::function<void(size_t, double)> rec = [&](size_t k, double t) {
            if (t >= best_t) return;
            if (k == nm_) {
                best_t = t;
                best = cur;
                return;
            }
            const int first = first_of_stage(k);
            for (size_t i = 0; i < whole_[k].size(); ++i) {
                const Candidate& c = whole_[k][i];
                const std::string& d = c.place.devices[0];
                if (first >= 0 && whole_[(size_t)first][(size_t)cur[(size_t)first]].place.devices != c.place.devices) continue;  // one placement per stage
                const uint64_t need = c.plan.devices[0].total();
                const uint64_t budget = planner_.device(d)->budget;
                if (use[d] + need > budget) continue;
                use[d] += need;
                cur[k] = (int)i;
                rec(k + 1, t + c.seconds);
                use[d] -= need;
            }
        };
        rec(0, 0.0);
        if (best.empty()) return false;
        for (size_t k = 0; k < nm_; ++k) {
            cands_[k] = {whole_[k][(size_t)best[k]]};
            cands_[k][0].tier = Tier::Resident;
        }
        return true;
    }

    /// Why a module's chosen candidate is what it is (the reason text after " - ").
    std::string why_chosen(const FitModule& m, const Candidate& c, bool tier1) const {
        switch (c.tier) {
            case Tier::Resident: return "every module fits on the accelerators at once";
            case Tier::TimeShared:
                return c.vae_tile > 0 ? "the whole decode does not fit; the largest tile that fits"
                                      : tier1 ? "" : "fits its device during its own stage (the pipeline frees each module after its stage)";
            case Tier::HostStreamed: return "does not fit any single device whole; host RAM holds the weights";
            case Tier::LayerSplit:
                return !req_.pinned_devices[(size_t)m.module].empty() && req_.pinned_devices[(size_t)m.module].size() > 1
                           ? "split over the devices your --backend entry names"
                       : c.place.split == SplitMode::Row ? "fits neither one device nor host RAM streaming; split by rows (--split-mode row)"
                                                         : "fits neither one device nor host RAM streaming; split by layers";
            case Tier::Disk: {
                bool per = false;
                for (auto& g : c.plan.segments) per |= g.per_eval;
                return per ? "fits no device whole and host RAM cannot hold the weights; each segment is read from the file when it runs"
                           : "weights read from the file per phase";
            }
            case Tier::Cpu: return "no accelerator can hold it";
        }
        return "";
    }

    /// The FitResult of the chosen candidates (see the class comment).
    FitResult assemble(const std::map<std::string, uint64_t>& fixed, std::map<std::string, uint64_t>& new_caps, bool tier1) const {
        FitResult out;
        out.tier = Tier::Resident;
        PlacementFlags& f = out.flags;
        std::string backend, params;
        std::map<std::string, uint64_t> caps = fixed;
        for (size_t k = 0; k < nm_; ++k) {
            const FitModule& m = req_.modules[k];
            const Candidate& c = cands_[k][0];
            FitChoice ch;
            ch.module = m.module;
            ch.tier = c.tier;
            ch.plan = c.plan;
            ch.seconds = c.seconds;
            ch.vae_tile = c.vae_tile;
            ch.row_split = c.place.split == SplitMode::Row;
            ch.encode_plan = c.encode_plan;
            out.choices.push_back(ch);
            out.tier = std::max(out.tier, c.tier);
            out.seconds += c.seconds;
            const char* mn = pmodule_name(m.module);
            if (first_of_stage(k) < 0) {  // (a stage's later modules share its entry)
                backend += fmt::format("{}{}={}", backend.empty() ? "" : ",", mn, join_devices(c.place.devices));
                if (!c.place.params.empty()) params += fmt::format("{}{}={}", params.empty() ? "" : ",", mn, c.place.params);
            }
            if (c.stream) f.stream_layers = true;
            if (c.vae_tile > 0) out.vae_tile = c.vae_tile;
            for (auto& [d, b] : c.caps) {
                caps[d] = caps.count(d) ? std::min(caps[d], b) : b;
                new_caps[d] = caps[d];
            }
            // reasons
            const bool pinned = !req_.pinned_devices[(size_t)m.module].empty() || req_.pinned_params[(size_t)m.module].has_value();
            const std::string why = why_chosen(m, c, tier1);
            uint64_t peak = 0;
            for (auto& u : c.plan.devices) peak = std::max(peak, u.total());
            out.reasons.push_back(fmt::format("{}: tier {} ({}): {}{}{}; predicted {:.0f} MiB, {:.2f} s{}", mn, (int)c.tier, tier_name(c.tier),
                                              describe_candidate(c), why.empty() ? "" : " - ", why, mib(peak), c.seconds,
                                              pinned ? " (kept your --backend/--params-backend entry)" : ""));
            if (c.encode_plan) {
                uint64_t ep = 0;
                for (auto& u : c.encode_plan->devices) ep = std::max(ep, u.total());
                out.reasons.push_back(fmt::format("  {} encoder ({}): the same placement in its own stage ({}); predicted {:.0f} MiB", mn,
                                                  c.encode_plan->label, kVaeEncodeStage, mib(ep)));
            }
            if (cands_[k].size() > 1)
                out.reasons.push_back(fmt::format("  {} beat {} other candidate(s) of the tier (next: {}, {:.2f} s)", describe_candidate(c),
                                                  cands_[k].size() - 1, describe_candidate(cands_[k][1]), cands_[k][1].seconds));
        }
        f.split_mode = split_entries(out);
        for (auto& w : warnings_) out.reasons.push_back("warning: " + w);  // (logged by auto_fit, once)
        out.warnings = warnings_;
        keep_unplanned_entries(backend, params);
        if (out.tier == Tier::Resident) out.reasons.insert(out.reasons.begin(), "tier 1: everything resident on the accelerators at once");
        else
            out.reasons.insert(out.reasons.begin(), fmt::format("tier {} ({}): not everything is resident at once; each module takes its best tier",
                                                                (int)out.tier, tier_name(out.tier)));
        predict_peaks(out);
        f.backend = backend;
        f.params_backend = params;
        f.headroom = req_.headroom;
        f.max_vram = merge_max_vram(req_, caps);
        out.flags_line = flags_line(out);
        for (auto& [d, b] : fixed)
            out.reasons.push_back(planner_.device(d)->max_alloc > 0
                                      ? fmt::format("{}: budget capped at {:.0f} MiB for every module (a --max-vram cap applies to the whole job) "
                                                    "so that no slot or state buffer exceeds its {:.0f} MiB max allocation",
                                                    d, mib(b), mib(planner_.device(d)->max_alloc))
                                      : fmt::format("{}: budget capped at {} MiB for every module (a --max-vram cap applies to the whole job) "
                                                    "so that each weight segment read from disk fits the host RAM it passes through",
                                                    d, mibs(b)));
        return out;
    }

    /// --split-mode: row only for the modules planned as row splits (a module asked for row that
    /// runs on one device or as a layer split gets no entry: the runtime would otherwise row
    /// split a device list the plan made a layer split), and for modules the planner was not
    /// given whose --backend entry names a device list, as the user asked. Adds the "not needed"
    /// reasons to `out`.
    std::string split_entries(FitResult& out) const {
        std::string split;
        for (size_t k = 0; k < nm_; ++k) {
            const FitModule& m = req_.modules[k];
            if (first_of_stage(k) >= 0) continue;
            const Candidate& c = cands_[k][0];
            const char* mn = pmodule_name(m.module);
            if (c.place.split == SplitMode::Row) split += fmt::format("{}{}=row", split.empty() ? "" : ",", mn);
            else if (req_.split[(size_t)m.module] == SplitMode::Row && c.place.devices.size() == 1)
                out.reasons.push_back(fmt::format("{}: --split-mode row not needed: it runs on one device", mn));
        }
        for (size_t i = 0; i < kModuleCount; ++i) {
            if (planned(i)) continue;
            if (req_.split[i] == SplitMode::Row && req_.pinned_devices[i].size() > 1)
                split += fmt::format("{}{}=row", split.empty() ? "" : ",", pmodule_name((PModule)i));
        }
        return split;
    }

    /// True when the request has a module of PModule index i.
    bool planned(size_t i) const {
        return std::any_of(req_.modules.begin(), req_.modules.end(), [&](const FitModule& m) { return (size_t)m.module == i; });
    }

    /// Explicit entries of modules the planner was not given (not costed by the family in this
    /// build, e.g. a TAESD decoder, ControlNet, upscaler) are kept as the user wrote them.
    void keep_unplanned_entries(std::string& backend, std::string& params) const {
        for (size_t i = 0; i < kModuleCount; ++i) {
            if (planned(i)) continue;
            const char* mn = pmodule_name((PModule)i);
            if (!req_.pinned_devices[i].empty())
                backend += fmt::format("{}{}={}", backend.empty() ? "" : ",", mn, join_devices(req_.pinned_devices[i]));
            if (req_.pinned_params[i] && !req_.pinned_params[i]->empty())
                params += fmt::format("{}{}={}", params.empty() ? "" : ",", mn, *req_.pinned_params[i]);
        }
    }

    /// Predicted peaks as the pipeline runs (one stage at a time: the largest stage), and for
    /// tier 1 the bytes of every module loaded at once (what made it tier 1), with their reasons.
    void predict_peaks(FitResult& out) const {
        std::map<std::string, std::map<std::string, uint64_t>> by_stage;  // modules of one stage add
        auto add_stage = [&](const std::string& stage, const ModulePlan& p) {
            std::map<std::string, uint64_t>& here = by_stage[stage];
            for (auto& u : p.devices) here[u.device] += u.total();
            if (p.host_bytes) here[planner_.cpu() ? planner_.cpu()->name : "CPU"] += p.host_bytes;
        };
        for (auto& c : out.choices) {
            add_stage(pmodule_name(c.module), c.plan);
            if (c.encode_plan) add_stage(kVaeEncodeStage, *c.encode_plan);
        }
        for (auto& [stage, here] : by_stage) {
            for (auto& [d, b] : here) {
                out.predicted_peak[d] = std::max(out.predicted_peak[d], b);
                // (the encoder is loaded in its own stage, never with the other modules)
                if (out.tier == Tier::Resident && stage != kVaeEncodeStage) out.resident_bytes[d] += b;
            }
        }
        for (auto& [d, b] : out.resident_bytes)
            out.reasons.push_back(fmt::format("{}: {:.0f} MiB with every module loaded at once, budget {:.0f} MiB", d, mib(b), mib(planner_.device(d)->budget)));
    }

    /// The flags that reproduce the plan (FitResult::flags_line).
    static std::string flags_line(const FitResult& out) {
        const PlacementFlags& f = out.flags;
        std::string line = fmt::format("--backend \"{}\"", f.backend);
        if (!f.params_backend.empty()) line += fmt::format(" --params-backend \"{}\"", f.params_backend);
        if (!f.split_mode.empty()) line += fmt::format(" --split-mode \"{}\"", f.split_mode);
        if (f.stream_layers) line += " --stream-layers";
        if (!f.max_vram.empty()) line += fmt::format(" --max-vram \"{}\"", f.max_vram);
        if (!f.headroom.empty()) line += fmt::format(" --headroom \"{}\"", f.headroom);
        if (out.vae_tile > 0) line += fmt::format(" --vae-tiling --vae-tile-size {}x{}", out.vae_tile, out.vae_tile);
        return line;
    }

    const FitRequest& req_;
    Planner planner_;
    const size_t nm_;
    std::vector<std::vector<Candidate>> cands_;  // per module: the candidates of its best tier
    std::vector<Shortfall> shorts_;
    std::vector<std::vector<Candidate>> whole_;  // single-accelerator device-resident candidates (tier 1 input)
    std::vector<std::string> warnings_;          // FitResult::warnings
};

/// One planning pass over `req` (whose budgets already include `fixed` caps); the caps a
/// candidate needed beyond them are returned in `new_caps`.
FitResult fit_once(const FitRequest& req, const std::map<std::string, uint64_t>& fixed, std::map<std::string, uint64_t>& new_caps) {
    return FitPass(req).run(fixed, new_caps);
}

}  // namespace

FitResult auto_fit(const FitRequest& req) {
    // A budget lowered for one module's max-allocation limit is a --max-vram cap, which the
    // runtime applies to every module on that device: plan again under the caps until none is new.
    FitRequest cur = req;
    std::map<std::string, uint64_t> caps;
    for (int pass = 0; pass < 4; ++pass) {
        std::map<std::string, uint64_t> fresh;
        FitResult r = fit_once(cur, caps, fresh);
        if (fresh.empty()) {
            for (auto& w : r.warnings) log::warn("{}", w);
            return r;
        }
        for (auto& [d, b] : fresh) {
            caps[d] = b;
            for (auto& dev : cur.devices)
                if (dev.name == d) dev.budget = std::min(dev.budget, b);
        }
    }
    fail(ErrorKind::OutOfMemory, "--auto-fit: no plan keeps every buffer within the devices' max allocation sizes; try a quantised --type");
}

std::string format_fit(const FitResult& r, bool with_table) {
    std::string s = fmt::format("auto-fit plan (tier {}, {}), predicted {:.2f} s; as explicit flags:\n  {}\n", (int)r.tier, tier_name(r.tier), r.seconds,
                                r.flags_line);
    for (auto& l : r.reasons) s += "  " + l + "\n";
    if (with_table) s += format_plan(r.plans());
    s += fmt::format("{:<24} {:>14}\n", "device", "peak MiB");  // as the pipeline runs: the largest stage
    for (auto& [d, b] : r.predicted_peak) s += fmt::format("{:<24} {:>14.1f}\n", d, mib(b));
    return s;
}

// --------------------------------------------------------------------------------------------

MeasureCache::MeasureCache(std::filesystem::path dir, const std::vector<std::string>& key_parts) {
    if (dir.empty()) return;
    file_ = dir / "autofit" / (content_key(key_parts) + ".json");
    std::error_code ec;
    if (!std::filesystem::exists(file_, ec)) return;
    try {
        std::ifstream in(file_);
        auto j = nlohmann::json::parse(in);
        for (auto& [k, v] : j.items()) entries_[k] = v.get<uint64_t>();
    } catch (const std::exception& e) {
        log::warn("auto-fit: ignoring an unreadable measurement cache {} ({})", file_.string(), e.what());
        entries_.clear();
    }
}

MeasureCache::~MeasureCache() { flush(); }

void MeasureCache::flush() {
    if (!dirty_ || file_.empty()) return;
    try {
        std::filesystem::create_directories(file_.parent_path());
        nlohmann::json j = nlohmann::json::object();
        for (auto& [k, v] : entries_) j[k] = v;
        const auto tmp = file_.string() + ".tmp";
        {
            std::ofstream o(tmp);
            o << j.dump();
            if (!o) throw std::runtime_error("write failed");
        }
        std::filesystem::rename(tmp, file_);
        dirty_ = false;
    } catch (const std::exception& e) {
        log::warn("auto-fit: cannot write the measurement cache {} ({})", file_.string(), e.what());
    }
}

std::function<uint64_t(int, int, bool, bool, const std::string&)> MeasureCache::wrap(
    std::function<uint64_t(int, int, bool, bool, const std::string&)> measure) {
    return [this, measure](int b, int e, bool p, bool ep, const std::string& dev) -> uint64_t {
        const std::string k = fmt::format("{},{},{},{},{}", b, e, (int)p, (int)ep, dev);
        if (auto it = entries_.find(k); it != entries_.end()) {
            ++hits_;
            return it->second;
        }
        ++misses_;
        const uint64_t v = measure(b, e, p, ep, dev);
        entries_[k] = v;
        dirty_ = true;
        return v;
    };
}

std::function<uint64_t(int, const std::string&)> MeasureCache::wrap_tile(std::function<uint64_t(int, const std::string&)> measure) {
    return [this, measure](int t, const std::string& dev) -> uint64_t {
        const std::string k = fmt::format("tile{},{}", t, dev);
        if (auto it = entries_.find(k); it != entries_.end()) {
            ++hits_;
            return it->second;
        }
        ++misses_;
        const uint64_t v = measure(t, dev);
        entries_[k] = v;
        dirty_ = true;
        return v;
    };
}

uint64_t MeasureCache::value(const std::string& key, const std::function<uint64_t()>& measure) {
    if (auto it = entries_.find(key); it != entries_.end()) {
        ++hits_;
        return it->second;
    }
    ++misses_;
    const uint64_t v = measure();
    entries_[key] = v;
    dirty_ = true;
    return v;
}

double measure_h2d_bandwidth(ggml_backend_dev_t dev, size_t bytes) {
    if (!dev || bytes == 0) return 0;
    ggml_init_params ip{ggml_tensor_overhead() * 2, nullptr, true};
    ggml_context* ctx = ggml_init(ip);
    if (!ctx) return 0;
    ggml_tensor* t = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t)bytes);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_dev_buffer_type(dev));
    double best = 0;
    if (buf) {
        std::vector<uint8_t> host(bytes, 1);
        for (int i = 0; i < 3; ++i) {
            auto t0 = std::chrono::steady_clock::now();
            ggml_backend_tensor_set(t, host.data(), 0, bytes);
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (dt > 0) best = std::max(best, (double)bytes / dt);
        }
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx);
    return best;
}

}  // namespace easel::placement

// -------------------------------------------------------------------------------------------- device speed

namespace easel::placement {

namespace {

/// ggml_backend_dev_init, freed on scope exit.
struct BackendHold {
    ggml_backend_t b = nullptr;
    ~BackendHold() {
        if (b) ggml_backend_free(b);
    }
};

/// Seconds of one ggml_backend_graph_compute of `gf` until its output `y` can be read: one value
/// of it is read back (an RPC backend returns from graph_compute and synchronize before the
/// server has computed; a read is answered after it).
double time_graph(ggml_backend_t be, ggml_cgraph* gf, ggml_tensor* y) {
    const auto t0 = std::chrono::steady_clock::now();
    if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) return -1;
    ggml_backend_synchronize(be);
    float v = 0;
    ggml_backend_tensor_get(y, &v, 0, sizeof(v));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double measure_matmul_flops(ggml_backend_dev_t dev, int threads) {
    if (!dev) return 0;
    BackendHold be{ggml_backend_dev_init(dev, nullptr)};
    if (!be.b) return 0;
    if (ggml_backend_is_cpu(be.b)) ggml_backend_cpu_set_n_threads(be.b, threads > 0 ? threads : (int)std::max(1u, std::thread::hardware_concurrency()));
    constexpr int64_t K = 1024, M = 1024;
    double best = 0;
    for (int64_t N = 64; N <= 16384; N *= 4) {
        ggml_init_params ip{ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
        ggml_context* ctx = ggml_init(ip);
        if (!ctx) return best;
        struct FreeCtx {
            ggml_context* c;
            ~FreeCtx() { ggml_free(c); }
        } free_ctx{ctx};
        ggml_tensor* w = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, K, M);
        ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
        ggml_tensor* y = ggml_mul_mat(ctx, w, x);
        ggml_cgraph* gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, y);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be.b);
        if (!buf) return best;
        struct FreeBuf {
            ggml_backend_buffer_t b;
            ~FreeBuf() { ggml_backend_buffer_free(b); }
        } free_buf{buf};
        // small values (no denormals, no infinities): speed does not depend on them otherwise
        std::vector<ggml_fp16_t> wh((size_t)(K * M));
        for (size_t i = 0; i < wh.size(); ++i) wh[i] = ggml_fp32_to_fp16(0.001f * (float)(i % 97));
        std::vector<float> xh((size_t)(K * N));
        for (size_t i = 0; i < xh.size(); ++i) xh[i] = 0.01f * (float)(i % 89);
        ggml_backend_tensor_set(w, wh.data(), 0, ggml_nbytes(w));
        ggml_backend_tensor_set(x, xh.data(), 0, ggml_nbytes(x));
        if (time_graph(be.b, gf, y) < 0) return best;  // warm-up (CUDA: kernels, cuBLAS handles)
        double t = 1e300;
        for (int i = 0; i < 3; ++i) {
            const double dt = time_graph(be.b, gf, y);
            if (dt < 0) return best;
            t = std::min(t, dt);
        }
        if (t > 0) best = std::max(best, 2.0 * (double)K * (double)M * (double)N / t);
        if (t >= 0.010) break;
    }
    return best;
}

DeviceSpeed measure_device_speed(ggml_backend_dev_t dev, int threads) {
    DeviceSpeed s;
    if (!dev) return s;
    s.flops = measure_matmul_flops(dev, threads);
    if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) s.h2d_bytes_per_s = measure_h2d_bandwidth(dev, 8u << 20);
    return s;
}

namespace {
constexpr const char* kDeviceFormat = "easel-autofit-device-v1";
}

DeviceSpeedCache::DeviceSpeedCache(std::filesystem::path dir, std::string name, std::string description, int threads)
    : name_(std::move(name)), description_(std::move(description)) {
    if (dir.empty()) return;
    file_ = dir / "autofit" / ("device-" + content_key({kDeviceFormat, name_, description_, std::to_string(threads)}) + ".json");
}

DeviceSpeed DeviceSpeedCache::get(const std::function<DeviceSpeed()>& measure) {
    hit_ = false;
    problem_.clear();
    std::error_code ec;
    if (!file_.empty() && std::filesystem::exists(file_, ec)) {
        // every field checked: a file that is not one of ours, or of another device, is refused
        std::string why;
        DeviceSpeed s;
        try {
            std::ifstream in(file_);
            const auto j = nlohmann::json::parse(in);
            auto num = [&](const char* k) -> double {
                if (!j.contains(k) || !j[k].is_number()) throw std::runtime_error(fmt::format("\"{}\" missing or not a number", k));
                return j[k].get<double>();
            };
            if (!j.is_object()) why = "not a JSON object";
            else if (!j.contains("format") || j["format"] != kDeviceFormat) why = fmt::format("\"format\" is not \"{}\"", kDeviceFormat);
            else if (!j.contains("device") || j["device"] != name_) why = fmt::format("\"device\" is not \"{}\"", name_);
            else {
                s.flops = num("flops");
                s.h2d_bytes_per_s = num("h2d_bytes_per_s");
                if (!std::isfinite(s.flops) || s.flops <= 0) why = fmt::format("\"flops\" {} is not a positive number", s.flops);
                else if (!std::isfinite(s.h2d_bytes_per_s) || s.h2d_bytes_per_s < 0)
                    why = fmt::format("\"h2d_bytes_per_s\" {} is negative or not finite", s.h2d_bytes_per_s);
            }
        } catch (const std::exception& e) {
            why = e.what();
        }
        if (why.empty()) {
            hit_ = true;
            return s;
        }
        problem_ = fmt::format("auto-fit: refusing the device measurement cache {} ({}); measuring {} again and replacing it", file_.string(), why,
                               name_);
        log::warn("{}", problem_);
    }
    const DeviceSpeed s = measure();
    if (file_.empty() || s.flops <= 0) return s;  // (a failed measurement is not remembered)
    try {
        std::filesystem::create_directories(file_.parent_path());
        nlohmann::json j = {{"format", kDeviceFormat}, {"device", name_}, {"description", description_}, {"flops", s.flops},
                            {"h2d_bytes_per_s", s.h2d_bytes_per_s}};
        const auto tmp = file_.string() + ".tmp";
        {
            std::ofstream o(tmp);
            o << j.dump(1) << "\n";
            if (!o) throw std::runtime_error("write failed");
        }
        std::filesystem::rename(tmp, file_);
    } catch (const std::exception& e) {
        log::warn("auto-fit: cannot write the device measurement cache {} ({})", file_.string(), e.what());
    }
    return s;
}

bool device_bench_enabled() {
    const char* v = std::getenv("EASEL_AUTOFIT_BENCH");
    if (!v) return true;
    std::string s(v);
    for (auto& ch : s) ch = (char)std::tolower((unsigned char)ch);
    return !(s == "0" || s == "off" || s == "no" || s == "false");
}

}  // namespace easel::placement
