// The planner (see plan.h).
#include "placement/plan.h"
#include "placement/devices.h"

#include "core/error.h"
#include "core/log.h"
#include "placement/row_split.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace easel::placement {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
/// Bytes added to each slot / state buffer for the alignment of its tensors (the runtime
/// allocates the same; runtime/sequence_runner.cpp).
constexpr uint64_t kAlignSlack = 8 << 10;
constexpr double kGiB = 1024.0 * kMiB;

double mib(uint64_t b) { return (double)b / kMiB; }

uint64_t sum(const std::vector<uint64_t>& v, int b, int e) {
    uint64_t s = 0;
    for (int i = b; i < e; ++i) s += v[(size_t)i];
    return s;
}

/// Parameter bytes of a segment: its blocks + the non-block parameters its graph reads when it
/// runs the prologue or the epilogue (loaded with each such segment: they may be on different
/// devices; ModuleCosts::prologue_used_bytes / epilogue_used_bytes when known, else all).
uint64_t seg_params(const ModuleCosts& c, int b, int e, bool pro, bool epi) {
    const bool known = c.prologue_used_bytes || c.epilogue_used_bytes;
    const uint64_t rest = !(pro || epi) ? 0 : (!known || (pro && epi)) ? c.prologue_bytes : pro ? c.prologue_used_bytes : c.epilogue_used_bytes;
    return sum(c.block_bytes, b, e) + rest;
}

Segment make_seg(const ModuleCosts& c, const std::string& dev, int b, int e, int n, Residency r, bool per_eval) {
    Segment s;
    s.device = dev;
    s.begin = b;
    s.end = e;
    s.prologue = b == 0;
    s.epilogue = e == n;
    s.residency = r;
    s.per_eval = per_eval;
    s.param_bytes = seg_params(c, b, e, s.prologue, s.epilogue);
    s.compute_bytes = c.measure(b, e, s.prologue, s.epilogue, dev);
    s.state_bytes = (!s.epilogue && c.state_bytes) ? c.state_bytes(e) : 0;
    return s;
}

/// The device's use under `segs`, with a ring of `ring` streaming slots (when it has per-eval
/// segments; at least 2).
DeviceUse use_of(const std::vector<Segment>& segs, const std::string& dev, uint64_t budget, int ring = 2) {
    DeviceUse u;
    u.device = dev;
    u.budget = budget;
    uint64_t slot = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
        const Segment& s = segs[i];
        if (s.device != dev) continue;
        if (s.per_eval) slot = std::max(slot, s.param_bytes);
        else u.params += s.param_bytes;
        u.compute = std::max(u.compute, s.compute_bytes);
        // the state stays on the device when the next segment runs there too
        // (two buffers of the largest state: the one entering a segment and the one it hands on)
        if (i + 1 < segs.size() && segs[i + 1].device == dev && s.state_bytes)
            u.state = std::max(u.state, 2 * (s.state_bytes + kAlignSlack));
    }
    u.slot_count = slot ? std::max(ring, 2) : 0;
    u.slots = slot ? (uint64_t)u.slot_count * (slot + kAlignSlack) : 0;
    return u;
}

/// Streaming slots for `dev` under `segs` (blocks streamed from host RAM): 2, plus as many more
/// of the largest per-eval segment as the budget has room for beside everything else, at most
/// one per per-eval segment of the device (more could never be filled). Unbudgeted: 2.
int ring_slots(const std::vector<Segment>& segs, const std::string& dev, uint64_t budget) {
    const DeviceUse two = use_of(segs, dev, budget, 2);
    int per_eval = 0;
    for (auto& s : segs) per_eval += s.device == dev && s.per_eval;
    if (two.slot_count == 0 || budget == 0 || two.total() > budget || per_eval <= 2) return 2;
    const uint64_t one = two.slots / 2;
    return (int)std::min<uint64_t>((uint64_t)per_eval, 2 + (budget - two.total()) / one);
}

/// The changes that can shrink `m`'s need on `dev`, as one "try ..." clause. Only what can help
/// on this machine is offered: weights in host RAM (--params-backend M=cpu) only when `dev` is
/// not the CPU (on the CPU they are in host RAM already), a layer split only when another device
/// exists and the module is not split yet, a move to the CPU only from another device.
std::string suggestion(PModule m, Residency r, bool split, const std::string& dev) {
    const char* n = pmodule_name(m);
    std::string d = dev;
    for (auto& ch : d) ch = (char)std::tolower((unsigned char)ch);
    const bool on_cpu = d == "cpu";
    const bool other_devices = list_devices().size() > 1;
    std::vector<std::string> opts;
    // the VAE decoder's need is mostly its compute buffer, which only smaller graphs shrink
    if (m == PModule::Vae) opts.push_back("--vae-tiling with a smaller --vae-tile-size (each tile is one decode)");
    if (r == Residency::Device && !on_cpu)
        opts.push_back(fmt::format("--params-backend {}=cpu{}", n, m == PModule::Diffusion ? " --stream-layers" : ""));
    if (r == Residency::Disk) opts.push_back("a larger --max-vram (weights read from disk are already cut into segments of one block)");
    else opts.push_back("a larger --max-vram");
    if (m != PModule::Te) opts.push_back("a smaller image");
    if (other_devices && !split) opts.push_back(fmt::format("--backend \"{}=DEV1&DEV2\" (layer split)", n));
    if (!on_cpu && (r == Residency::Host || split)) opts.push_back(fmt::format("--backend {}=cpu", n));
    std::string out = "try ";
    for (size_t i = 0; i < opts.size(); ++i) out += (i == 0 ? "" : i + 1 == opts.size() ? ", or " : ", ") + opts[i];
    return out;
}

[[noreturn]] void does_not_fit(PModule m, const DeviceUse& u, Residency r, bool split) {
    fail(ErrorKind::OutOfMemory, "{} needs {:.0f} MiB on {} but the budget leaves {:.0f} MiB ({:.0f} params + {:.0f} streaming slots + {:.0f} compute + {:.0f} state); {}",
         pmodule_name(m), mib(u.total()), u.device, mib(u.budget), mib(u.params), mib(u.slots), mib(u.compute), mib(u.state), suggestion(m, r, split, u.device));
}

}  // namespace

const char* residency_name(Residency r) {
    switch (r) {
        case Residency::Device: return "device";
        case Residency::Host: return "host";
        case Residency::Disk: return "disk";
    }
    return "?";
}

std::map<std::string, uint64_t> resolve_budgets(const PlacementSpec& spec, const std::vector<DeviceInfo>& devs) {
    std::map<std::string, uint64_t> out;
    for (auto& d : devs) {
        double head = spec.headroom_all_mib.value_or(0.0);
        if (auto it = spec.headroom_mib.find(d.name); it != spec.headroom_mib.end()) head = it->second;
        std::optional<double> cap;
        if (auto it = spec.max_vram_gib.find(d.name); it != spec.max_vram_gib.end()) cap = it->second;
        else if (spec.max_vram_all_gib && d.type != "cpu") cap = spec.max_vram_all_gib;
        double bytes;
        if (cap && *cap > 0) bytes = *cap * kGiB;
        else if (cap && *cap < 0) bytes = (double)d.free_bytes + *cap * kGiB;
        else if (d.type == "cpu" && head == 0) continue;  // host RAM: unlimited unless asked
        else if (d.free_bytes == 0 && head == 0) continue;  // free memory unknown, nothing asked: unlimited
        else bytes = (double)d.free_bytes;
        bytes -= head * kMiB;
        // 0 would mean "no cap": a budget the flags leave at or below nothing is 1 byte (every
        // plan then stops with the budget named); a huge one is clamped before the conversion
        out[d.name] = bytes >= 1.0 ? (uint64_t)std::min(bytes, 9.0e18) : 1;
    }
    return out;
}

ModulePlan plan_module(PModule module, const ModulePlacement& place, bool stream, const ModuleCosts& c,
                       const std::map<std::string, uint64_t>& budgets) {
    ModulePlan p;
    p.module = module;
    p.label = c.label;
    p.params_location = place.params;
    const int n = (int)c.block_bytes.size();
    const auto& devs = place.devices;
    if (devs.empty()) fail(ErrorKind::Internal, "plan_module: {} has no device", pmodule_name(module));
    if ((int)devs.size() > std::max(n, 1))
        fail(ErrorKind::InvalidInput, "{}: {} devices but only {} blocks to split", pmodule_name(module), devs.size(), n);
    const Residency r = place.params.empty() ? Residency::Device : place.params == kDisk ? Residency::Disk : Residency::Host;
    if (place.split == SplitMode::Row && devs.size() > 1) {
        // --split-mode row on ggml's meta device (placement/row_split.h); else layer split
        std::string why = !c.row_split ? "this module has no row-split rules"
                          : !c.row_split->why_not.empty() ? c.row_split->why_not
                          : r != Residency::Device ? "its parameters are not kept on its devices (--params-backend)"
                          : c.row_split->max_devices > 0 && (int64_t)devs.size() > c.row_split->max_devices
                              ? fmt::format("{} cuts into only {} whole slices (heads) for {} devices", c.row_split->max_devices_param,
                                            c.row_split->max_devices, devs.size())
                          : n == 0 ? "it has no blocks"
                          : !c.row_split_bytes || c.row_split_bytes(devs.size()).size() != devs.size()
                              ? "a weight slice would not be whole quantisation blocks"
                              : "";
        if (why.empty()) return plan_row_split(module, place, c, budgets);
        log::warn("--split-mode row for {}: {}; using layer split", pmodule_name(module), why);
    }
    auto budget_of = [&](const std::string& d) -> uint64_t {
        auto it = budgets.find(d);
        return it == budgets.end() ? 0 : it->second;
    };
    auto fits = [&](const DeviceUse& u) { return u.budget == 0 || u.total() <= u.budget; };
    std::map<std::string, int> ring;  // streaming slots per device (absent: 2)
    auto finish = [&](std::vector<Segment> segs, bool split) {
        p.segments = std::move(segs);
        p.devices.clear();
        for (auto& d : devs) p.devices.push_back(use_of(p.segments, d, budget_of(d), ring.count(d) ? ring[d] : 2));
        for (auto& u : p.devices)
            if (!fits(u)) does_not_fit(module, u, r, split);
        p.host_bytes = 0;
        if (r == Residency::Host)
            for (auto& s : p.segments) p.host_bytes += s.param_bytes;
        // Disk segments uploaded per evaluation pass through one transient host buffer at a time
        // (runtime/sequence_runner.cpp: read, uploaded, freed before the next one is read)
        if (r == Residency::Disk)
            for (auto& s : p.segments)
                if (s.per_eval) p.host_bytes = std::max(p.host_bytes, s.param_bytes + kAlignSlack);
        return p;
    };

    // Plans blocks [b0, e0) on one device: the whole module on a single device, or one device's
    // range of a layer split. Resident as one graph when it fits (and no streaming is asked);
    // else, with the parameters in host RAM, leading blocks resident and the rest streamed
    // (--stream-layers) or --max-vram segments uploaded per evaluation; with parameters on the
    // device, one graph per block (smaller compute buffers).
    auto plan_range = [&](const std::string& dev, int b0, int e0, bool split) -> std::vector<Segment> {
        const uint64_t budget = budget_of(dev);
        std::vector<Segment> whole{make_seg(c, dev, b0, e0, n, r, false)};
        const DeviceUse whole_use = use_of(whole, dev, budget);
        if (fits(whole_use) && !(stream && r == Residency::Host)) return whole;
        // (Disk that does not fit whole is cut into --max-vram segments like Host: each read from
        // the file into a transient host buffer and uploaded per evaluation)
        if (e0 == b0) return whole;

        // single-block compute buffers (the estimate for cutting; every segment is measured after)
        uint64_t comp = 0, state = 0;
        for (int i = b0; i < e0; ++i) comp = std::max(comp, c.measure(i, i + 1, i == 0, i == n - 1, dev));
        if (c.state_bytes)
            for (int e = std::max(b0, 1); e <= std::min(e0, n - 1); ++e) state = std::max(state, c.state_bytes(e));
        comp += 2 * state;  // the states kept on the device between two graphs (see use_of)

        if (stream && r == Residency::Host) {
            // as many leading blocks resident as the budget allows beside a ring of `want` slots
            // (2 unless ModulePlacement::stream_slots asks for more; at most one per streamed
            // block), the rest streamed block by block (all of them: the whole range, staged for
            // the phase, when it fits)
            if (fits(whole_use)) return whole;
            const int want = std::max(2, place.stream_slots);
            for (int k = e0 - 1; k >= b0; --k) {
                uint64_t resident = k > b0 ? seg_params(c, b0, k, b0 == 0, k == n) : 0;
                uint64_t slot = 0;
                for (int i = k; i < e0; ++i) slot = std::max(slot, seg_params(c, i, i + 1, i == 0, i == n - 1));
                const uint64_t k_slots = (uint64_t)std::max(2, std::min(want, e0 - k));
                const bool room = budget == 0 || resident + k_slots * (slot + kAlignSlack) + comp <= budget;
                if (!room && k > b0) continue;
                std::vector<Segment> segs;
                if (k > b0) segs.push_back(make_seg(c, dev, b0, k, n, r, false));
                for (int i = k; i < e0; ++i) segs.push_back(make_seg(c, dev, i, i + 1, n, r, true));
                // the room the budget leaves beside them deepens the upload ring (runtime/
                // sequence_runner.h: segments uploaded ahead of the one computing, the next
                // evaluation's first ones during this one's last)
                // (every block streamed without room for `want` slots: as many as fit, at least 2)
                ring[dev] = room ? std::max((int)k_slots, ring_slots(segs, dev, budget)) : ring_slots(segs, dev, budget);
                return segs;
            }
        }

        // --max-vram segments: greedy ranges whose parameters fit two slots beside the compute buffer
        if (r == Residency::Device) {
            // parameters stay resident; smaller graphs lower the compute buffer
            std::vector<Segment> segs;
            for (int i = b0; i < e0; ++i) segs.push_back(make_seg(c, dev, i, i + 1, n, r, false));
            if (!fits(use_of(segs, dev, budget))) does_not_fit(module, whole_use, r, split);  // report the plain plan
            return segs;
        }
        // (multi-block graphs can need more than the single-block estimate: shrink until they fit)
        uint64_t avail = budget > comp + 2 * kAlignSlack ? (budget - comp - 2 * kAlignSlack) / 2 : 0;
        while (true) {
            std::vector<Segment> segs;
            int b = b0;
            bool multi = false;
            while (b < e0) {
                int e = b + 1;
                while (e < e0 && seg_params(c, b, e + 1, b == 0, e + 1 == n) <= avail) ++e;
                multi |= e - b > 1;
                segs.push_back(make_seg(c, dev, b, e, n, r, true));
                b = e;
            }
            if (!multi || fits(use_of(segs, dev, budget))) return segs;
            avail = avail * 3 / 4;
        }
    };

    if (devs.size() > 1) {
        // layer split: contiguous ranges with parameter bytes (the first device's including the
        // prologue's, the last one's the epilogue's) in proportion to the budgets; a range that does
        // not fit its device is streamed / cut into segments there when its parameters are in RAM
        std::vector<double> w;
        for (auto& d : devs) w.push_back((double)budget_of(d));
        if (std::any_of(w.begin(), w.end(), [](double x) { return x <= 0; })) std::fill(w.begin(), w.end(), 1.0);
        const double wsum = std::accumulate(w.begin(), w.end(), 0.0);
        const bool known = c.prologue_used_bytes || c.epilogue_used_bytes;
        const double pro = (double)(known ? c.prologue_used_bytes : c.prologue_bytes);
        const double epi = (double)(known ? c.epilogue_used_bytes : c.prologue_bytes);
        const double total = pro + (double)sum(c.block_bytes, 0, n) + epi;
        auto upto = [&](int e) { return pro + (double)sum(c.block_bytes, 0, e); };
        std::vector<Segment> segs;
        int b = 0;
        double acc_w = 0;
        for (size_t d = 0; d < devs.size(); ++d) {
            acc_w += w[d];
            int e = b + 1;
            const int max_e = n - (int)(devs.size() - d - 1);  // leave one block per remaining device
            if (d + 1 == devs.size()) e = n;
            else {
                const double target = total * acc_w / wsum;
                while (e < max_e && std::fabs(upto(e + 1) - target) <= std::fabs(upto(e) - target)) ++e;
            }
            if (r == Residency::Device) segs.push_back(make_seg(c, devs[d], b, e, n, r, false));
            else
                for (auto& sg : plan_range(devs[d], b, e, true)) segs.push_back(std::move(sg));
            b = e;
        }
        return finish(std::move(segs), true);
    }

    return finish(plan_range(devs[0], 0, n, false), false);
}

std::string format_plan(const std::vector<ModulePlan>& plans) {
    std::string s = fmt::format("{:<10} {:<24} {:<14} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "module", "device", "blocks", "params",
                                "slots", "compute", "state", "total", "budget", "host");
    for (auto& p : plans) {
        for (auto& u : p.devices) {
            std::string ranges;
            for (auto& g : p.segments)
                if (g.device == u.device)
                    ranges += fmt::format("{}{}{}-{}{}", ranges.empty() ? "" : ",", g.prologue ? "P" : "", g.begin, g.end,
                                          g.epilogue ? "E" : "");
            if (ranges.size() > 14) {
                int nseg = 0;
                for (auto& g : p.segments) nseg += g.device == u.device;
                ranges = fmt::format("{} segments", nseg);
            }
            s += fmt::format("{:<10} {:<24} {:<14} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9} {:>9.1f}\n", stage_of(p), u.device,
                             ranges, mib(u.params), mib(u.slots), mib(u.compute), mib(u.state), mib(u.total()),
                             u.budget ? fmt::format("{:.1f}", mib(u.budget)) : std::string("-"), mib(p.host_bytes));
        }
        int streamed = 0;
        for (auto& g : p.segments) streamed += g.per_eval;
        std::string res = p.params_location.empty() ? "on the runtime device"
                          : p.params_location != kDisk ? "held in " + p.params_location
                          : streamed ? fmt::format("read from disk per evaluation through a {:.1f} MiB host buffer (host column)", mib(p.host_bytes))
                                     : std::string("read from disk per phase");
        std::string rings;
        for (auto& u : p.devices)
            if (u.slot_count > 0) rings += fmt::format("{}{} {}", rings.empty() ? "" : ", ", u.device, u.slot_count);
        s += fmt::format("  {}: {} segment(s), parameters {}{}\n", p.label, p.segments.size(), res,
                         streamed ? fmt::format(", {} uploaded per evaluation (upload ring slots: {})", streamed, rings) : "");
    }
    s += "(MiB; blocks: P = runs the prologue, E = the epilogue; total = params + slots + compute + state kept between segments)\n";
    if (plans.size() > 1) {
        // per device: the stages time-share it; the modules of one stage add
        std::vector<std::string> stages;
        for (auto& p : plans)
            if (std::find(stages.begin(), stages.end(), stage_of(p)) == stages.end()) stages.push_back(stage_of(p));
        std::map<std::string, std::map<std::string, uint64_t>> by;  // device -> stage -> bytes
        std::map<std::string, uint64_t> budget;
        for (auto& p : plans)
            for (auto& u : p.devices) {
                by[u.device][stage_of(p)] += u.total();
                if (u.budget) budget[u.device] = u.budget;
            }
        s += fmt::format("\nper device, by stage (one stage's modules are loaded together; stages run one after another):\n{:<24}", "device");
        for (auto& st : stages) s += fmt::format(" {:>10}", st);
        s += fmt::format(" {:>10} {:>10}\n", "peak", "budget");
        const auto peaks = device_peaks(plans);
        for (auto& [d, m] : by) {
            s += fmt::format("{:<24}", d);
            for (auto& st : stages) {
                auto it = m.find(st);
                s += fmt::format(" {:>10}", it == m.end() ? std::string("-") : fmt::format("{:.1f}", mib(it->second)));
            }
            auto b = budget.find(d);
            s += fmt::format(" {:>10.1f} {:>10}\n", mib(peaks.at(d)), b == budget.end() ? std::string("-") : fmt::format("{:.1f}", mib(b->second)));
        }
    }
    return s;
}

std::string stage_of(const ModulePlan& p) { return p.stage.empty() ? std::string(pmodule_name(p.module)) : p.stage; }

std::map<std::string, uint64_t> device_peaks(const std::vector<ModulePlan>& plans) {
    std::map<std::string, std::map<std::string, uint64_t>> by;  // device -> stage -> bytes
    for (auto& p : plans)
        for (auto& u : p.devices) by[u.device][stage_of(p)] += u.total();
    std::map<std::string, uint64_t> out;
    for (auto& [d, m] : by)
        for (auto& [st, b] : m) out[d] = std::max(out[d], b);
    return out;
}

void check_stage_budgets(const std::vector<ModulePlan>& plans) {
    std::map<std::pair<std::string, std::string>, std::vector<std::pair<const ModulePlan*, const DeviceUse*>>> by;
    for (auto& p : plans)
        for (auto& u : p.devices) by[{u.device, stage_of(p)}].push_back({&p, &u});
    for (auto& [key, v] : by) {
        if (v.size() < 2) continue;  // one module alone: plan_module checked it
        uint64_t total = 0, budget = 0;
        std::string parts;
        for (auto& [p, u] : v) {
            total += u->total();
            if (u->budget) budget = budget ? std::min(budget, u->budget) : u->budget;
            parts += fmt::format("{}{} {:.0f}", parts.empty() ? "" : " + ", pmodule_name(p->module), mib(u->total()));
        }
        if (budget && total > budget) {
            // only the changes that can help here (see suggestion())
            std::string d = key.first;
            for (auto& ch : d) ch = (char)std::tolower((unsigned char)ch);
            std::vector<std::string> opts;
            if (list_devices().size() > 1) opts.push_back("put one of the modules on another device (--backend MODULE=DEV)");
            if (d != "cpu") opts.push_back("keep its weights in RAM (--params-backend MODULE=cpu)");
            opts.push_back("give a larger --max-vram");
            std::string fix;
            for (size_t i = 0; i < opts.size(); ++i) fix += (i == 0 ? "" : i + 1 == opts.size() ? " or " : ", ") + opts[i];
            fail(ErrorKind::OutOfMemory, "on {} the {} stage needs {:.0f} MiB ({}) but the budget leaves {:.0f} MiB; {}", key.first, key.second,
                 mib(total), parts, mib(budget), fix);
        }
    }
}

std::vector<ModulePlan> plan_modules(const PlacementSpec& spec, const std::vector<ModuleCosts>& costs,
                                     const std::map<std::string, uint64_t>& budgets) {
    std::vector<ModulePlan> plans;
    for (auto& c : costs) {
        // a module of a stage that already has one (FLUX.1's CLIP-L after its T5: both te, loaded
        // together) is planned in what the earlier ones leave of each budget
        std::map<std::string, uint64_t> left = budgets;
        for (auto& p : plans)
            if (p.module == c.module)
                for (auto& u : p.devices)
                    if (auto it = left.find(u.device); it != left.end() && it->second > 0)
                        it->second = it->second > u.total() ? it->second - u.total() : 1;  // (0 would mean unlimited)
        plans.push_back(plan_module(c.module, spec[c.module], c.module == PModule::Diffusion && spec.stream_layers, c, left));
        for (auto& u : plans.back().devices)  // the table and the stage check compare with the device's whole budget
            if (auto it = budgets.find(u.device); it != budgets.end()) u.budget = it->second;
        plans.back().stage = pmodule_name(c.module);
    }
    check_stage_budgets(plans);
    return plans;
}

std::string format_peaks(const std::vector<ModulePlan>& plans, const std::map<std::string, uint64_t>& measured) {
    const std::map<std::string, uint64_t> predicted = device_peaks(plans);
    std::string s = fmt::format("{:<24} {:>14} {:>14}\n", "device", "predicted MiB", "measured MiB");
    for (auto& [d, b] : predicted) {
        auto it = measured.find(d);
        s += fmt::format("{:<24} {:>14.1f} {:>14}\n", d, mib(b), it == measured.end() ? std::string("-") : fmt::format("{:.1f}", mib(it->second)));
    }
    return s;
}

}  // namespace easel::placement
