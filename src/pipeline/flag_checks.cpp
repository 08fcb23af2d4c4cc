// inapplicable_flag_warnings (see flag_checks.h).
#include "pipeline/flag_checks.h"

#include "core/error.h"
#include "core/log.h"
#include "models/family.h"
#include "placement/spec.h"
#include "sampling/schedule.h"

#include <fmt/format.h>

#include <cstdio>

namespace easel::pipeline {

namespace {

/// The entries of a placement flag value (MODULE=VALUE,...) whose module is `m`.
std::vector<std::string> entries_for(const std::string& value, placement::PModule m) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= value.size()) {
        size_t comma = value.find(',', start);
        std::string e = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        start = comma == std::string::npos ? value.size() + 1 : comma + 1;
        const size_t eq = e.find('=');
        if (eq == std::string::npos) continue;
        std::string key = e.substr(0, eq);
        key.erase(0, key.find_first_not_of(" \t"));
        key.erase(key.find_last_not_of(" \t") + 1);
        try {
            if (placement::parse_pmodule(key) == m) out.push_back(e);
        } catch (const Error&) {  // all=, *=, default= and unknown keys: parse_placement's to judge
        }
    }
    return out;
}

}  // namespace

std::vector<std::string> placement_entry_warnings(const GenerateParams& p) {
    std::vector<std::string> w;
    const std::pair<const char*, const std::string*> flags[] = {
        {"--backend", &p.placement.backend}, {"--params-backend", &p.placement.params_backend}, {"--split-mode", &p.placement.split_mode}};
    const bool upscaler = !p.upscale_model.empty() && p.upscale_repeats > 0;
    for (auto [flag, value] : flags) {
        for (const auto& e : entries_for(*value, placement::PModule::ControlNet))
            w.push_back(fmt::format("{} {}: easel has no ControlNet module yet (no --control-net flag), so the entry places nothing", flag, e));
        if (!upscaler)
            for (const auto& e : entries_for(*value, placement::PModule::Upscaler))
                w.push_back(fmt::format("{} {}: no upscaler runs in this job (no --upscale-model), so the entry places nothing", flag, e));
    }
    return w;
}

std::vector<std::string> inapplicable_flag_warnings(const GenerateParams& p, const models::Family& fam) {
    std::vector<std::string> w = placement_entry_warnings(p);
    if (p.guidance_given && !fam.uses_guidance())
        w.push_back(fmt::format("--guidance {}: {} has no distilled-guidance input (only FLUX.1 dev has one), so it is not used; "
                                "the guidance of this model is --cfg-scale",
                                p.guidance, fam.name()));
    if (!p.prediction.empty() && fam.model_sampling().is_flow())
        w.push_back(fmt::format("--prediction {}: {} is a flow-matching model with a fixed prediction (the velocity); the flag "
                                "overrides SD1.x/SD2.x's eps / v only and is not used",
                                p.prediction, fam.name()));
    if (p.flow_shift != 0.0f && !fam.model_sampling().is_flow())
        w.push_back(fmt::format("--flow-shift {}: {} is not a flow-matching model (its prediction is {}); the flag shifts the schedules of "
                                "flow models (Z-Image, FLUX) only and is not used",
                                p.flow_shift, fam.name(), sampling::prediction_name(fam.model_sampling().prediction())));
    if (p.diffusion_conv_direct && fam.model_sampling().is_flow())
        w.push_back(fmt::format("--diffusion-conv-direct: {}'s diffusion model is a transformer with no convolutions (its patches are "
                                "embedded by a matrix product), so the flag changes nothing; --vae-conv-direct acts on its VAE",
                                fam.name()));
    if (p.clip_skip > 0 && fam.defaults().clip_skip <= 0)
        w.push_back(fmt::format("--clip-skip {}: {} takes no hidden layer of a CLIP text encoder (clip skip acts on SD1.x/SD2.x/SDXL), so "
                                "it is not used",
                                p.clip_skip, fam.name()));
    if (p.vae_tiling && p.vae_relative_tile_size.empty()) {
        int tx = 0, ty = 0;
        if (std::sscanf(p.vae_tile_size.c_str(), "%dx%d", &tx, &ty) == 2 && ty != tx)
            w.push_back(fmt::format("--vae-tile-size {}: easel's VAE tiles are square; tiles of {}x{} latent cells are used", p.vae_tile_size,
                                    tx, tx));
    }
    return w;
}

void warn_inapplicable_flags(const GenerateParams& p, const models::Family& fam) {
    for (const std::string& line : inapplicable_flag_warnings(p, fam)) log::warn("{}", line);
}

}  // namespace easel::pipeline
