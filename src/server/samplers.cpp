#include "server/samplers.h"

#include "core/error.h"
#include "core/strings.h"
#include "sampling/sampler.h"
#include "sampling/schedule.h"
#include "server/api_error.h"

namespace easel::server {

namespace {

std::string lower(std::string_view s) { return ascii_lower(s); }

std::string trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return std::string(s);
}

std::string joined_names() {
    std::string r;
    for (const auto& e : sampler_entries()) r += (r.empty() ? "" : ", ") + e.name;
    return r;
}

std::string joined_schedulers() {
    std::string r;
    for (const auto& e : scheduler_entries()) r += (r.empty() ? "" : ", ") + e.name;
    return r;
}

/// The easel scheduler name of an A1111 scheduler name or label, or an easel name; nullopt when
/// unknown. "" = automatic.
std::optional<std::string> lookup_scheduler(std::string_view name) {
    const std::string n = lower(trim(name));
    if (n.empty()) return std::string();
    for (const auto& e : scheduler_entries())
        if (lower(e.name) == n || lower(e.label) == n || e.method == n) return e.method;
    return std::nullopt;
}

}  // namespace

const std::vector<SamplerEntry>& sampler_entries() {
    // A1111 modules/sd_samplers_kdiffusion.py / sd_samplers_lcm.py / sd_samplers_timesteps.py names and aliases
    static const std::vector<SamplerEntry> k = {
        {"DPM++ 2M", {"k_dpmpp_2m", "dpm++2m"}, "dpm++2m"},
        {"DPM++ 2S a", {"k_dpmpp_2s_a", "dpm++2s_a"}, "dpm++2s_a"},
        {"Euler a", {"k_euler_a", "k_euler_ancestral", "euler_a"}, "euler_a"},
        {"Euler", {"k_euler", "euler"}, "euler"},
        {"Heun", {"k_heun", "heun"}, "heun"},
        {"DPM2", {"k_dpm_2", "dpm2"}, "dpm2"},
        {"LCM", {"k_lcm", "lcm"}, "lcm"},
        {"DDIM", {"ddim", "ddim_trailing"}, "ddim_trailing"},
    };
    return k;
}

const std::vector<SchedulerEntry>& scheduler_entries() {
    // A1111 modules/sd_schedulers.py names/labels for the schedules easel has; then easel's own
    static const std::vector<SchedulerEntry> k = {
        {"automatic", "Automatic", "", std::nullopt},
        {"normal", "Normal", "discrete", std::nullopt},
        {"karras", "Karras", "karras", 7.0},
        {"exponential", "Exponential", "exponential", std::nullopt},
        {"sgm_uniform", "SGM Uniform", "sgm_uniform", std::nullopt},
        {"simple", "Simple", "simple", std::nullopt},
        {"discrete", "Discrete", "discrete", std::nullopt},
        {"lcm", "LCM", "lcm", std::nullopt},
        {"flux", "Flux", "flux", std::nullopt},
        {"flux2", "Flux2", "flux2", std::nullopt},
    };
    return k;
}

std::optional<std::string> lookup_a1111_sampler(std::string_view name) {
    const std::string n = lower(trim(name));
    for (const auto& e : sampler_entries()) {
        if (lower(e.name) == n) return e.method;
        for (const auto& a : e.aliases)
            if (lower(a) == n) return e.method;
    }
    return std::nullopt;
}

SamplerChoice map_sampler(std::string_view sampler, std::string_view scheduler, const std::string& sampler_field,
                          const std::string& scheduler_field) {
    SamplerChoice c;
    std::optional<std::string> sched = lookup_scheduler(scheduler);
    if (!sched)
        refuse(400, scheduler_field, "{} \"{}\" is not a scheduler easel has; use one of: {}", scheduler_field, std::string(scheduler),
               joined_schedulers());
    c.scheduler = *sched;
    const std::string s = trim(sampler);
    if (s.empty() || lower(s) == "automatic") return c;
    if (auto m = lookup_a1111_sampler(s)) {
        c.method = *m;
    } else {
        // old A1111 names carry the schedule: "DPM++ 2M Karras", "DPM++ 2M SGM Uniform"
        bool found = false;
        for (const auto& e : scheduler_entries()) {
            if (e.method.empty() || e.label.empty()) continue;
            const std::string suffix = " " + lower(e.label);
            const std::string ls = lower(s);
            if (ls.size() > suffix.size() && ls.compare(ls.size() - suffix.size(), suffix.size(), suffix) == 0) {
                if (auto m = lookup_a1111_sampler(s.substr(0, s.size() - suffix.size()))) {
                    if (!c.scheduler.empty() && c.scheduler != e.method)
                        refuse(400, scheduler_field, "{} \"{}\" contradicts {} \"{}\" (which names the {} schedule); give one of them",
                               scheduler_field, std::string(scheduler), sampler_field, s, e.label);
                    c.method = *m;
                    c.scheduler = e.method;
                    found = true;
                    break;
                }
            }
        }
        if (!found)
            refuse(400, sampler_field, "{} \"{}\" is not a sampler easel runs; use one of: {} (GET /sdapi/v1/samplers)", sampler_field, s,
                   joined_names());
    }
    try {  // the sampling layer has the last word on what runs
        (void)sampling::parse_sampler(c.method);
        if (!c.scheduler.empty()) (void)sampling::parse_scheduler(c.scheduler);
    } catch (const Error& e) {
        refuse(400, sampler_field, "{}: {}", sampler_field, e.what());
    }
    return c;
}

}  // namespace easel::server
