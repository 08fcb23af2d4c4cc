// The pipeline's stages as commands: `easel encode-prompt`, `encode-image`, `denoise`, `decode`.
// Each takes generate's model and sampling flags (generate_options.h) with the same meaning,
// loads only the modules its stage needs, writes its result as an artifact file
// (docs/artifacts.md), frees its modules and prints the files it wrote, one per line.
#include "autofit_cli.h"
#include "command.h"
#include "generate_options.h"

#include "core/log.h"
#include "pipeline/generate.h"

#include <cstdio>

namespace {

using namespace easel;

std::function<std::function<int()>(CLI::App&)> stage_command(pipeline::Stage stage, std::string footer) {
    return [stage, footer](CLI::App& sub) -> std::function<int()> {
        auto p = std::make_shared<pipeline::GenerateParams>();
        auto common = std::make_shared<cli::CommonOptions>();
        cli::add_generate_options(sub, *p);
        cli::add_stage_options(sub, *p);
        cli::add_common_options(sub, *common);
        sub.footer(footer);
        return [p, common, stage, &sub]() -> int {
            cli::apply_common_options(*common);
            cli::resolve_generate_options(sub, *p);  // the family's steps / CFG scale when not given, as generate
            auto progress = [](int image, int step, int steps, double dt) {
                log::info("image {} step {}/{}: {:.3f} s", image + 1, step, steps, dt);
            };
            if (p->placement.auto_fit)  // --auto-fit: as `easel generate --stage ... --auto-fit` plans it
                log::info("{}", placement::format_fit(cli::apply_auto_fit(*p)));
            for (auto& f : pipeline::run_stage(stage, *p, progress)) std::printf("%s\n", f.c_str());
            return 0;
        };
    };
}

EASEL_COMMAND("encode-prompt", "Prompt -> conditioning file (loads only the text encoder)",
              stage_command(pipeline::Stage::EncodePrompt,
                            "Example:\n  easel encode-prompt -m sd15.safetensors -p \"a lighthouse at dusk\" -n \"blurry\" --save-embeddings cond.safetensors"),
              30);
EASEL_COMMAND("encode-image", "Image -> latent file (loads only the VAE encoder)",
              stage_command(pipeline::Stage::EncodeImage,
                            "Example:\n  easel encode-image -m sd15.safetensors -i photo.png --save-latent photo.latent.safetensors"),
              31);
EASEL_COMMAND("denoise", "Conditioning [+ init latent] -> final latent, with a checkpoint after every step (loads only the diffusion model)",
              stage_command(pipeline::Stage::Denoise,
                            "Examples:\n"
                            "  easel denoise -m sd15.safetensors --load-embeddings cond.safetensors -W 512 -H 512 --steps 30 -s 7 \\\n"
                            "      --save-latent final.safetensors --checkpoint-dir ckpt\n"
                            "  easel denoise ... --checkpoint-dir ckpt --resume          # after a crash: continue from the last step\n"
                            "  easel denoise ... --load-latent photo.latent.safetensors --strength 0.6   # img2img"),
              32);
EASEL_COMMAND("decode", "Latent file -> PNG (loads only the VAE decoder)",
              stage_command(pipeline::Stage::Decode,
                            "Example:\n  easel decode -m sd15.safetensors --load-latent final.safetensors -o out.png"),
              33);

}  // namespace
