// Generation flags that the opened model does not use: one warning each, naming why (issue 20:
// no sd-cli flag is accepted and silently ignored).
#pragma once

#include "pipeline/generate_params.h"

#include <string>
#include <vector>

namespace easel::models {
class Family;
}

namespace easel::pipeline {

/// The warnings for placement entries that place nothing: controlnet= entries of --backend,
/// --params-backend or --split-mode (easel has no ControlNet module), and upscaler= entries in a
/// job without --upscale-model. Throws nothing.
std::vector<std::string> placement_entry_warnings(const GenerateParams& p);

/// The warnings for the flags of `p` that `fam` does not use, one line each, without the
/// "warning:" prefix: --guidance on a family without a distilled-guidance input
/// (Family::uses_guidance), --prediction on a flow-matching family (its prediction is fixed),
/// --flow-shift on a family that is not flow-matching (SD1.x/SD2.x, SDXL), --clip-skip on a family
/// whose conditioning takes no CLIP hidden layer (defaults().clip_skip 0: Z-Image, FLUX),
/// --vae-tile-size XxY with Y != X (easel's VAE tiles are square: X is used), and
/// placement_entry_warnings(). Empty when
/// every flag applies. Throws nothing.
std::vector<std::string> inapplicable_flag_warnings(const GenerateParams& p, const models::Family& fam);

/// Logs inapplicable_flag_warnings() as warnings (generate calls it once per opened model).
void warn_inapplicable_flags(const GenerateParams& p, const models::Family& fam);

}  // namespace easel::pipeline
