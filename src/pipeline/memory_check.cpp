#include "pipeline/memory_check.h"

#include "core/error.h"
#include "core/platform.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>

namespace easel::pipeline {

namespace {

double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

bool is_cpu(const std::string& d) {
    std::string l = d;
    for (auto& c : l) c = (char)std::tolower((unsigned char)c);
    return l == "cpu";
}

}  // namespace

uint64_t host_ram_bytes() {
    return platform::physical_memory_bytes();
}

std::vector<MemoryNeed> whole_module_needs(const std::vector<placement::ModuleCosts>& costs,
                                           const std::function<std::string(placement::PModule)>& device_of) {
    std::vector<MemoryNeed> out;
    for (const auto& c : costs) {
        MemoryNeed n;
        n.module = c.module;
        n.device = device_of(c.module);
        n.params = c.prologue_bytes;
        for (uint64_t b : c.block_bytes) n.params += b;
        if (c.measure) n.compute = c.measure(0, (int)c.block_bytes.size(), true, true, n.device);
        // (several costs of one module, e.g. FLUX.1's T5 and CLIP-L, are resident together)
        auto same = std::find_if(out.begin(), out.end(), [&](const MemoryNeed& o) { return o.module == n.module && o.device == n.device; });
        if (same != out.end()) {
            same->params += n.params;
            same->compute += n.compute;
        } else {
            out.push_back(n);
        }
    }
    return out;
}

std::string memory_refusal(placement::PModule module, const std::string& device, uint64_t params, uint64_t compute, uint64_t capacity,
                           const MemoryJob& job) {
    using placement::PModule;
    std::vector<std::string> fixes;
    if (module == PModule::Te) {
        fixes.push_back("a quantised --type (e.g. q8_0)");
    } else {
        fixes.push_back("a smaller -W/-H");
        if (module == PModule::Vae) {
            fixes.push_back(job.vae_tiling ? "a smaller --vae-tile-size" : "--vae-tiling");
            if (!job.flash_attn) fixes.push_back("--fa (flash attention)");
        } else if (!job.diffusion_fa) {
            fixes.push_back("--diffusion-fa (flash attention)");
        }
    }
    std::string fix;
    for (size_t i = 0; i < fixes.size(); ++i) fix += (i == 0 ? "" : i + 1 == fixes.size() ? " or " : ", ") + fixes[i];
    const std::string has = is_cpu(device) ? fmt::format("host RAM is {:.1f} GiB", gib(capacity))
                                           : fmt::format("{} has {:.1f} GiB", device, gib(capacity));
    return fmt::format("{} needs {:.1f} GiB on {} at {}x{} (parameters {:.1f} GiB + compute {:.1f} GiB) but {}: use {}",
                       placement::pmodule_name(module), gib(params + compute), device, job.width, job.height, gib(params), gib(compute), has,
                       fix);
}

void check_needs_fit(const std::vector<MemoryNeed>& needs, const MemoryJob& job,
                     const std::function<uint64_t(const std::string&)>& capacity) {
    // the first module in run order that does not fit is named with its fixes; later ones that
    // do not fit either are added, so that one change list covers the whole job
    std::string msg;
    for (const auto& n : needs) {
        const uint64_t cap = capacity(n.device);
        if (cap == 0 || n.total() <= cap) continue;
        if (msg.empty()) {
            msg = memory_refusal(n.module, n.device, n.params, n.compute, cap, job);
        } else {
            const std::string more = memory_refusal(n.module, n.device, n.params, n.compute, cap, job);
            const size_t use = more.rfind(": use ");
            msg += fmt::format("; {} needs {:.1f} GiB too{}", placement::pmodule_name(n.module), gib(n.total()),
                               use == std::string::npos ? std::string() : more.substr(use));
        }
    }
    if (!msg.empty()) fail(ErrorKind::OutOfMemory, "{}", msg);
}

void check_plans_fit_host(const std::vector<placement::ModulePlan>& plans, const MemoryJob& job, uint64_t host_ram) {
    if (host_ram == 0) return;
    // per stage: the CPU's bytes of each plan (its DeviceUse on the CPU and the host RAM holding
    // its weights); the plans of one stage are resident together
    struct Part {
        placement::PModule module;
        uint64_t params = 0, compute = 0;
    };
    std::map<std::string, std::vector<Part>> stages;
    for (const auto& p : plans) {
        Part part{p.module};
        part.params = p.host_bytes;
        for (const auto& u : p.devices)
            if (is_cpu(u.device)) {
                part.params += u.params + u.slots;
                part.compute += u.compute + u.state;
            }
        if (part.params + part.compute) stages[placement::stage_of(p)].push_back(part);
    }
    for (const auto& [stage, parts] : stages) {
        uint64_t params = 0, compute = 0;
        const Part* big = &parts.front();
        for (const auto& pt : parts) {
            params += pt.params;
            compute += pt.compute;
            if (pt.params + pt.compute > big->params + big->compute) big = &pt;
        }
        if (params + compute > host_ram)
            fail(ErrorKind::OutOfMemory, "{}", memory_refusal(big->module, "CPU", params, compute, host_ram, job));
    }
}

}  // namespace easel::pipeline
