// The one table of sampler and scheduler names: A1111's display names ("DPM++ 2M Karras",
// "Euler a", ...), their aliases (A1111's k_* names, ComfyUI's sampler / scheduler names) and
// what easel runs for each (--sampling-method / --scheduler names). Used by the CLI's
// --sampling-method / --scheduler (which take any of these names), by the PNG infotext and by
// the server's /sdapi/v1/samplers and /sdapi/v1/schedulers.
//
// Sources: A1111 modules/sd_samplers_kdiffusion.py (samplers_k_diffusion, with each sampler's
// automatic schedule: 'scheduler': 'karras' / 'exponential'), sd_samplers_timesteps.py (DDIM,
// DDIM CFG++, PLMS, UniPC), sd_samplers_lcm.py (LCM), sd_schedulers.py (schedulers and their
// labels); the pre-1.9 combined names ("DPM++ 2M Karras", k_dpmpp_2m_ka) that A1111 still maps
// to (sampler, schedule) when it reads old infotexts; ComfyUI comfy/samplers.py KSAMPLER_NAMES and
// SCHEDULER_NAMES.
#pragma once

#include "sampling/sampler.h"
#include "sampling/schedule.h"

#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace easel::sampling {

/// One sampler name row.
struct SamplerNameRow {
    std::string_view label;                    ///< A1111 display name ("DPM++ 2M Karras"); unique
    std::array<std::string_view, 4> aliases;   ///< A1111 aliases (k_dpmpp_2m_ka), ComfyUI names (dpmpp_2m); "" = unused
    std::optional<SamplerKind> sampler;        ///< what easel runs; nullopt: not available in easel
    /// The schedule the name implies: named in the label ("... Karras") when explicit_scheduler,
    /// else A1111's automatic choice for that sampler (DPM++ 2M: karras, DPM++ 2M SDE:
    /// exponential); nullopt = the model's default.
    std::optional<SchedulerKind> scheduler;
    bool explicit_scheduler = false;
    bool legacy = false;  ///< a pre-1.9 combined name A1111 no longer lists (still read from infotexts)
};

/// One scheduler name row.
struct SchedulerNameRow {
    std::string_view name;                     ///< A1111 scheduler name (karras, align_your_steps, ...)
    std::string_view label;                    ///< A1111 label ("Karras", "Align Your Steps")
    std::array<std::string_view, 3> aliases;   ///< further names (SGMUniform, ComfyUI's, sd.cpp's); "" = unused
    std::optional<SchedulerKind> scheduler;    ///< what easel runs; nullopt: the sampler's / model's default ("Automatic")
    bool available = true;                     ///< false: a known name easel does not have
};

/// Every sampler name row: A1111 1.10's samplers in its order, then the legacy combined names.
std::span<const SamplerNameRow> sampler_name_table();
/// Every scheduler name row (A1111 1.10's schedulers in its order, then easel's others).
std::span<const SchedulerNameRow> scheduler_name_table();

/// A --sampling-method value resolved: the method and the schedule its name implies (see
/// SamplerNameRow::scheduler), and whether the name said so explicitly.
struct ResolvedSampler {
    SamplerKind sampler;
    std::optional<SchedulerKind> scheduler;
    bool explicit_scheduler = false;
};
/// Resolves an easel / sd-cli name (parse_sampler), an A1111 label or alias, or a ComfyUI name
/// (labels and aliases case-insensitive). A known name easel does not run raises
/// Error(Unsupported) naming what to use; an unknown one Error(InvalidInput) (parse_sampler's
/// message).
ResolvedSampler resolve_sampler_name(std::string_view name);
/// Resolves a --scheduler value: an easel / sd-cli name (parse_scheduler), an A1111 name or
/// label ("Karras", "align_your_steps", "SGM Uniform"), a ComfyUI name. nullopt for "Automatic"
/// (the sampler's or model's default). Errors as parse_scheduler.
std::optional<SchedulerKind> resolve_scheduler_name(std::string_view name);

/// The A1111 display name of an easel method (the first non-legacy row that runs it and names no
/// schedule), or its easel name when A1111 has none (ddim_trailing, euler_cfg_pp, ...).
std::string a1111_sampler_label(SamplerKind kind);
/// The A1111 "Schedule type" label of an easel scheduler (discrete -> "Normal", karras ->
/// "Karras", ays -> "Align Your Steps", ...), or its easel name when A1111 has none.
std::string a1111_scheduler_label(SchedulerKind kind);

}  // namespace easel::sampling
