// The sampler / scheduler name table: see names.h for the sources.
#include "sampling/names.h"

#include "core/error.h"
#include "core/strings.h"

namespace easel::sampling {

namespace {

using SK = SamplerKind;
using CK = SchedulerKind;
constexpr std::nullopt_t kNone = std::nullopt;

// label, aliases, easel sampler, implied schedule, explicit, legacy
const SamplerNameRow kSamplerRows[] = {
    // A1111 1.10 samplers_k_diffusion (label, aliases, the 'scheduler' option = its automatic schedule)
    {"DPM++ 2M", {"k_dpmpp_2m", "dpmpp_2m"}, SK::DpmPP2M, CK::Karras},
    {"DPM++ SDE", {"k_dpmpp_sde", "dpmpp_sde", "dpmpp_sde_gpu"}, SK::DpmPPSde, CK::Karras},
    {"DPM++ 2M SDE", {"k_dpmpp_2m_sde", "dpmpp_2m_sde", "dpmpp_2m_sde_gpu"}, SK::DpmPP2MSdeBt, CK::Exponential},
    {"DPM++ 2M SDE Heun", {"k_dpmpp_2m_sde_heun", "dpmpp_2m_sde_heun", "dpmpp_2m_sde_heun_gpu"}, kNone, CK::Exponential},
    {"DPM++ 2S a", {"k_dpmpp_2s_a", "dpmpp_2s_ancestral"}, SK::DpmPP2SA, CK::Karras},
    {"DPM++ 3M SDE", {"k_dpmpp_3m_sde", "dpmpp_3m_sde", "dpmpp_3m_sde_gpu"}, kNone, CK::Exponential},
    {"Euler a", {"k_euler_a", "k_euler_ancestral", "euler_ancestral"}, SK::EulerA, kNone},
    {"Euler", {"k_euler"}, SK::Euler, kNone},
    {"LMS", {"k_lms"}, SK::Lms, kNone},
    {"Heun", {"k_heun"}, SK::Heun, kNone},
    {"DPM2", {"k_dpm_2", "dpm_2"}, SK::Dpm2, CK::Karras},
    {"DPM2 a", {"k_dpm_2_a", "dpm_2_ancestral"}, SK::Dpm2A, CK::Karras},
    {"DPM fast", {"k_dpm_fast", "dpm_fast"}, kNone, kNone},
    {"DPM adaptive", {"k_dpm_ad", "dpm_adaptive"}, kNone, kNone},
    {"Restart", {"restart"}, kNone, CK::Karras},
    // sd_samplers_timesteps.py, sd_samplers_lcm.py
    {"DDIM", {"ddim"}, SK::Ddim, kNone},
    {"DDIM CFG++", {"ddim_cfgpp"}, kNone, kNone},
    {"PLMS", {"plms"}, kNone, kNone},
    {"UniPC", {"unipc", "uni_pc_bh2"}, SK::UniPc, kNone},
    {"LCM", {"k_lcm"}, SK::Lcm, kNone},
    // ComfyUI / Forge names of methods easel has under another name
    {"Euler CFG++", {"euler_cfg_pp"}, SK::EulerCfgPP, kNone},
    {"Euler a CFG++", {"euler_ancestral_cfg_pp"}, SK::EulerACfgPP, kNone},
    {"DEIS", {"deis"}, SK::Deis, kNone},
    {"iPNDM", {"ipndm"}, SK::Ipndm, kNone},
    {"iPNDM_v", {"ipndm_v"}, SK::IpndmV, kNone},
    {"ER SDE", {"er_sde"}, SK::ErSde, kNone},
    {"Res Multistep", {"res_multistep"}, SK::ResMultistep, kNone},
    {"TCD", {"tcd"}, SK::Tcd, kNone},
    // pre-1.9 combined names (sampler + schedule)
    {"LMS Karras", {"k_lms_ka"}, SK::Lms, CK::Karras, true, true},
    {"DPM2 Karras", {"k_dpm_2_ka"}, SK::Dpm2, CK::Karras, true, true},
    {"DPM2 a Karras", {"k_dpm_2_a_ka"}, SK::Dpm2A, CK::Karras, true, true},
    {"DPM++ 2S a Karras", {"k_dpmpp_2s_a_ka"}, SK::DpmPP2SA, CK::Karras, true, true},
    {"DPM++ 2M Karras", {"k_dpmpp_2m_ka"}, SK::DpmPP2M, CK::Karras, true, true},
    {"DPM++ SDE Karras", {"k_dpmpp_sde_ka"}, SK::DpmPPSde, CK::Karras, true, true},
    {"DPM++ 2M SDE Karras", {"k_dpmpp_2m_sde_ka"}, SK::DpmPP2MSdeBt, CK::Karras, true, true},
    {"DPM++ 2M SDE Exponential", {"k_dpmpp_2m_sde_exp"}, SK::DpmPP2MSdeBt, CK::Exponential, true, true},
    {"DPM++ 2M SDE Heun Karras", {"k_dpmpp_2m_sde_heun_ka"}, kNone, CK::Karras, true, true},
    {"DPM++ 2M SDE Heun Exponential", {"k_dpmpp_2m_sde_heun_exp"}, kNone, CK::Exponential, true, true},
    {"DPM++ 3M SDE Karras", {"k_dpmpp_3m_sde_ka"}, kNone, CK::Karras, true, true},
    {"DPM++ 3M SDE Exponential", {"k_dpmpp_3m_sde_exp"}, kNone, CK::Exponential, true, true},
};

// name, label, aliases, easel scheduler, available
const SchedulerNameRow kSchedulerRows[] = {
    // A1111 1.10 sd_schedulers.py
    {"automatic", "Automatic", {}, kNone},
    {"uniform", "Uniform", {}, CK::Discrete},
    {"karras", "Karras", {}, CK::Karras},
    {"exponential", "Exponential", {}, CK::Exponential},
    {"polyexponential", "Polyexponential", {}, CK::Exponential},  // A1111's default rho 1 is exponential
    {"sgm_uniform", "SGM Uniform", {"SGMUniform"}, CK::SgmUniform},
    {"kl_optimal", "KL Optimal", {}, CK::KlOptimal},
    {"align_your_steps", "Align Your Steps", {"ays", "AYS SD1"}, CK::Ays},
    {"simple", "Simple", {}, CK::Simple},
    {"normal", "Normal", {"discrete", "default"}, CK::Discrete},
    {"ddim", "DDIM", {"ddim_uniform"}, CK::DdimUniform},
    {"beta", "Beta", {}, CK::Beta},
    // others (sd.cpp / ComfyUI / diffusers pipelines)
    {"gits", "GITS", {}, CK::Gits},
    {"smoothstep", "Smoothstep", {}, CK::Smoothstep},
    {"lcm", "LCM", {}, CK::Lcm},
    {"flux", "Flux", {}, CK::Flux},
    {"flux2", "Flux2", {}, CK::Flux2},
    {"linear_quadratic", "Linear Quadratic", {}, kNone, false},
    {"bong_tangent", "Bong Tangent", {}, kNone, false},
};

bool same(std::string_view a, std::string_view b) { return !a.empty() && ascii_lower(a) == ascii_lower(b); }

template <typename Row>
bool row_matches(const Row& r, std::string_view name, std::string_view label) {
    if (same(label, name)) return true;
    for (auto a : r.aliases)
        if (same(a, name)) return true;
    return false;
}

}  // namespace

std::span<const SamplerNameRow> sampler_name_table() { return kSamplerRows; }
std::span<const SchedulerNameRow> scheduler_name_table() { return kSchedulerRows; }

ResolvedSampler resolve_sampler_name(std::string_view name) {
    const std::string low = ascii_lower(name);
    for (const auto& i : sampler_infos())
        if (low == i.name) return {i.kind, std::nullopt, false};
    for (const auto& r : kSamplerRows) {
        if (!row_matches(r, name, r.label)) continue;
        if (!r.sampler)
            fail(ErrorKind::Unsupported, "sampler '{}' is not available in easel; close ones: DPM++ 2M SDE (dpm++2m_sde_bt), "
                 "DPM++ SDE (dpm++_sde), Euler a (euler_a), UniPC (uni_pc); all: easel --help", r.label);
        return {*r.sampler, r.scheduler, r.explicit_scheduler};
    }
    return {parse_sampler(name), std::nullopt, false};  // throws with the list of names
}

std::optional<SchedulerKind> resolve_scheduler_name(std::string_view name) {
    const std::string low = ascii_lower(name);
    for (const auto& r : kSchedulerRows) {
        if (!same(r.name, name) && !row_matches(r, name, r.label)) continue;
        if (!r.available)
            fail(ErrorKind::Unsupported, "scheduler '{}' is not available in easel: use one of {}", name, scheduler_names());
        return r.scheduler;
    }
    return parse_scheduler(name);  // throws with the list of names
}

std::string a1111_sampler_label(SamplerKind kind) {
    for (const auto& r : kSamplerRows)
        if (r.sampler == kind && !r.explicit_scheduler && !r.legacy) return std::string(r.label);
    return sampler_name(kind);
}

std::string a1111_scheduler_label(SchedulerKind kind) {
    // A1111's own label first (uniform and normal both run discrete: "Normal" is what A1111 writes for
    // its default normal schedule)
    if (kind == SchedulerKind::Discrete) return "Normal";
    for (const auto& r : kSchedulerRows)
        if (r.scheduler == kind && r.available) return std::string(r.label);
    return scheduler_name(kind);
}

}  // namespace easel::sampling
