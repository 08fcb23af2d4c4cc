#include "server/samplers.h"

#include <algorithm>

#include "core/error.h"
#include "core/strings.h"
#include "sampling/names.h"
#include "sampling/sampler.h"
#include "sampling/schedule.h"
#include "server/api_error.h"

namespace easel::server {

// Every list and lookup here is a view of the sampling layer's one name table
// (sampling/names.h), the table the CLI's --sampling-method / --scheduler use.

namespace {

std::string trim_copy(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return std::string(s);
}

std::string joined_names() {
    std::string r;
    for (const auto& e : sampler_entries()) r += (r.empty() ? "" : ", ") + e.name;
    return r;
}

}  // namespace

const std::vector<SamplerEntry>& sampler_entries() {
    static const std::vector<SamplerEntry> k = [] {
        std::vector<SamplerEntry> v;
        for (const auto& row : sampling::sampler_name_table()) {
            if (row.legacy || !row.sampler || row.explicit_scheduler) continue;
            SamplerEntry e;
            e.name = std::string(row.label);
            for (auto a : row.aliases)
                if (!a.empty()) e.aliases.emplace_back(a);
            e.method = sampling::sampler_name(*row.sampler);
            if (std::find(e.aliases.begin(), e.aliases.end(), e.method) == e.aliases.end()) e.aliases.push_back(e.method);
            v.push_back(std::move(e));
        }
        return v;
    }();
    return k;
}

const std::vector<SchedulerEntry>& scheduler_entries() {
    static const std::vector<SchedulerEntry> k = [] {
        std::vector<SchedulerEntry> v;
        for (const auto& row : sampling::scheduler_name_table()) {
            if (!row.available) continue;
            SchedulerEntry e;
            e.name = std::string(row.name);
            e.label = std::string(row.label);
            e.method = row.scheduler ? sampling::scheduler_name(*row.scheduler) : "";
            if (row.scheduler && *row.scheduler == sampling::SchedulerKind::Karras) e.default_rho = 7.0;
            v.push_back(std::move(e));
        }
        return v;
    }();
    return k;
}

std::optional<std::string> lookup_a1111_sampler(std::string_view name) {
    try {
        const auto r = sampling::resolve_sampler_name(name);
        return std::string(sampling::sampler_name(r.sampler));
    } catch (const Error&) {
        return std::nullopt;
    }
}

SamplerChoice map_sampler(std::string_view sampler, std::string_view scheduler, const std::string& sampler_field,
                          const std::string& scheduler_field) {
    SamplerChoice c;
    std::optional<sampling::SchedulerKind> sched;
    const std::string sched_text = trim_copy(scheduler);
    if (!sched_text.empty()) {
        try {
            sched = sampling::resolve_scheduler_name(sched_text);
        } catch (const Error& e) {
            refuse(400, scheduler_field, "{} \"{}\": {}", scheduler_field, sched_text, e.what());
        }
    }
    if (sched) c.scheduler = sampling::scheduler_name(*sched);
    const std::string s = trim_copy(sampler);
    if (s.empty() || ascii_lower(s) == "automatic") return c;
    sampling::ResolvedSampler r;
    try {
        r = sampling::resolve_sampler_name(s);
    } catch (const Error& e) {
        refuse(400, sampler_field, "{} \"{}\" is not a sampler easel runs ({}); use one of: {} (GET /sdapi/v1/samplers)", sampler_field, s,
               e.what(), joined_names());
    }
    c.method = sampling::sampler_name(r.sampler);
    if (r.scheduler) {
        if (r.explicit_scheduler && sched && *sched != *r.scheduler)
            refuse(400, scheduler_field, "{} \"{}\" contradicts {} \"{}\" (which names the {} schedule); give one of them", scheduler_field,
                   sched_text, sampler_field, s, sampling::a1111_scheduler_label(*r.scheduler));
        if (!sched) c.scheduler = sampling::scheduler_name(*r.scheduler);
    }
    return c;
}

}  // namespace easel::server
