// Sampler and scheduler names as clients send them (AUTOMATIC1111 display names such as
// "Euler a" or "DPM++ 2M Karras", their k_* aliases, A1111 scheduler names and labels, sd.cpp /
// easel names) mapped to easel's --sampling-method / --scheduler names, and the lists that
// /sdapi/v1/samplers and /sdapi/v1/schedulers return.
//
// All of it is a view of the sampling layer's one name table (sampling/names.h), the one the
// CLI's --sampling-method / --scheduler read.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace easel::server {

/// easel names; empty = the model family's default.
struct SamplerChoice {
    std::string method;     ///< --sampling-method name (euler_a, dpm++2m, ...)
    std::string scheduler;  ///< --scheduler name (karras, discrete, ...)
};

/// The easel --sampling-method name of an A1111 sampler display name ("Euler a"), alias
/// ("k_euler_a") or easel / sd.cpp name ("euler_a"), case-insensitive; nullopt when unknown.
std::optional<std::string> lookup_a1111_sampler(std::string_view name);

/// Maps a request's sampler and scheduler names. `sampler` may carry an old-style schedule
/// suffix ("DPM++ 2M Karras" = DPM++ 2M on the Karras schedule). Empty or "Automatic" = the
/// family default. Throws ApiError(400) naming sampler_field / scheduler_field for a name that
/// is unknown or that easel does not run (listing the ones it does), and for a suffix that
/// contradicts the scheduler given.
SamplerChoice map_sampler(std::string_view sampler, std::string_view scheduler, const std::string& sampler_field,
                          const std::string& scheduler_field);

/// An entry of /sdapi/v1/samplers.
struct SamplerEntry {
    std::string name;                  ///< A1111 display name
    std::vector<std::string> aliases;  ///< A1111's k_* aliases, then easel's name
    std::string method;                ///< easel name
};
/// Every sampler easel runs, in A1111's list order.
const std::vector<SamplerEntry>& sampler_entries();

/// An entry of /sdapi/v1/schedulers.
struct SchedulerEntry {
    std::string name;    ///< A1111 scheduler name ("karras"), or easel's for easel-only ones ("flux")
    std::string label;   ///< A1111 label ("Karras")
    std::string method;  ///< easel --scheduler name; "" for automatic (the family default)
    std::optional<double> default_rho;  ///< A1111's (karras: 7)
};
const std::vector<SchedulerEntry>& scheduler_entries();

}  // namespace easel::server
