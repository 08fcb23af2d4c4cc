// `easel upscale`: an image through an ESRGAN / Real-ESRGAN upscaler (pipeline/upscale.h); also
// what sd-cli's `-M upscale` runs (cmd_generate.cpp).
#include "command.h"
#include "generate_options.h"
#include "placement_options.h"

#include "core/log.h"
#include "pipeline/upscale.h"

#include <cstdio>

namespace {

using namespace easel;

EASEL_COMMAND(
    "upscale", "Upscale an image with an ESRGAN / Real-ESRGAN model (RRDBNet, SRVGGNetCompact; .pth or .safetensors)",
    [](CLI::App& sub) -> std::function<int()> {
        auto p = std::make_shared<pipeline::GenerateParams>();
        auto common = std::make_shared<cli::CommonOptions>();
        sub.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
        sub.add_option("-i,--init-img", p->init_img, "The image to upscale (PNG, JPEG, ...; alpha is dropped)")->required();
        sub.add_option("-o,--output", p->output, "Output PNG (default output.png)");
        cli::add_upscale_options(sub, *p);
        sub.get_option("--upscale-model")->required();
        sub.add_option("-t,--threads", p->threads, "CPU threads (<= 0: all; at most 512)")->check(cli::max_threads_check());
        cli::add_placement_options(sub, p->placement);
        cli::add_common_options(sub, *common);
        sub.footer(
            "The upscaler is the `upscaler` placement module: --backend upscaler=DEV, --params-backend upscaler=cpu|disk, --max-vram.\n"
            "Examples:\n"
            "  easel upscale -i photo.png --upscale-model RealESRGAN_x4plus.pth -o photo_x4.png\n"
            "  easel upscale -i frame.png --upscale-model realesr-animevideov3.pth --upscale-repeats 2 --upscale-tile-size 256\n"
            "  easel -M upscale -i photo.png --upscale-model RealESRGAN_x4plus_anime_6B.pth -o out.png     (sd-cli's form)");
        return [p, common]() -> int {
            cli::apply_common_options(*common);
            return cli::run_upscale_mode(*p);
        };
    },
    22);

}  // namespace
