// `easel generate`: text-to-image, image-to-image and inpainting with sd-cli's flags.
#include "autofit_cli.h"
#include "command.h"
#include "generate_options.h"

#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "pipeline/generate.h"

#include <fmt/format.h>

#include <cstdio>

namespace {

using namespace easel;

std::string mib(size_t b) { return fmt::format("{:.1f} MiB", (double)b / (1024.0 * 1024.0)); }

EASEL_COMMAND(
    "generate", "Generate images from a prompt (txt2img, img2img with -i, inpainting with --mask)",
    [](CLI::App& sub) -> std::function<int()> {
        auto p = std::make_shared<pipeline::GenerateParams>();
        auto common = std::make_shared<cli::CommonOptions>();
        cli::add_generate_options(sub, *p);
        cli::add_stage_options(sub, *p);
        sub.add_option("--stage", p->stage, "Run one stage only: te-encode, llm-encode, vae-encode, diffuse, vae-decode "
                                            "(= easel encode-prompt, encode-image, denoise, decode)")->group("Stages and files");
        cli::add_common_options(sub, *common);
        sub.footer(
            "sd-cli's flags work as they are, also without the word `generate` (easel -m ... -p ...).\n"
            "Examples:\n"
            "  easel generate -m models/demo/easel-demo-shapes.safetensors -p \"a large red circle in the centre, blue background\"      (no sampler, CFG, steps or size flag: the file's recommended settings)\n"
            "  easel generate -m sd15.safetensors -p \"a lighthouse at dusk, (oil painting:1.2)\" -n \"blurry\" --sampling-method dpm++2m --scheduler karras --steps 25 -s -1\n"
            "  easel generate -m sd15.safetensors -p \"a cat\" -i photo.png --strength 0.6 -o cat.png\n"
            "  easel generate -m sd15-inpainting.safetensors -p \"a red door\" -i house.png --mask door-mask.png\n"
            "  easel generate -m sd15.safetensors -p \"a cat\" --upscale-model RealESRGAN_x4plus.pth      (upscaled before it is written)\n"
            "  easel -M upscale -i photo.png --upscale-model RealESRGAN_x4plus.pth -o big.png              (= easel upscale)");
        return [p, common, &sub]() -> int {
            cli::apply_common_options(*common);
            if (p->mode == "upscale") {
                // sd-cli's -M upscale: only the upscaler runs; generation flags have nothing to act on
                for (const char* f : {"--model", "--diffusion-model", "--prompt", "--negative-prompt", "--steps", "--cfg-scale", "--vae",
                                      "--strength", "--mask", "--seed", "--width", "--height", "--batch-count", "--stage"})
                    if (sub.count(f) > 0) log::warn("-M upscale: {} is not used (upscale mode runs only the upscaler on -i)", f);
                return cli::run_upscale_mode(*p);
            }
            // `easel generate` alone: refused rather than a 512x512 job on an empty prompt that
            // overwrites output.png (sd-cli likewise stops without a model)
            // (nothing that says what to draw or with what: no prompt, prompt file, model or image)
            if (p->prompt.empty() && p->prompt_file.empty() && p->model.empty() && p->diffusion_model.empty() && p->init_img.empty() &&
                p->load_embeddings.empty() && p->load_latent.empty())
                fail(ErrorKind::InvalidInput, "easel generate: nothing to do: pass -p PROMPT (and -m MODEL; without it the bundled demo model "
                                              "draws), see `easel generate --help`");
            // flags left out take the model file's recommended settings (easel.* metadata), else the
            // family's defaults (steps, CFG scale; the sampler and scheduler when their names are empty);
            // prompt files; notes
            cli::resolve_generate_options(sub, *p);
            cli::warn_flags_without_their_switch(sub, *p);  // --hires-* without --hires, --strength without -i, ...
            const bool tty = platform::is_terminal(stderr);
            auto t_last = std::chrono::steady_clock::now();
            double sum = 0;
            int count = 0;
            auto progress = [&](int image, int step, int steps, double dt) {
                sum += dt;
                ++count;
                double avg = sum / count;
                if (tty) {
                    int width = 30, fill = steps > 0 ? step * width / steps : width;
                    std::fprintf(stderr, "\r  image %d [%s%s] %d/%d %s", image + 1, std::string((size_t)fill, '#').c_str(),
                                 std::string((size_t)(width - fill), '.').c_str(), step, steps,
                                 avg >= 1.0 ? fmt::format("{:.2f} s/it", avg).c_str() : fmt::format("{:.2f} it/s", 1.0 / avg).c_str());
                    if (step == steps) std::fputc('\n', stderr);
                    std::fflush(stderr);
                } else {
                    log::debug("image {} step {}/{}: {:.3f} s", image + 1, step, steps, dt);
                }
                (void)t_last;
            };
            if (p->placement.auto_fit) {
                // --auto-fit: the plan as explicit flags and the per-device table, before anything is loaded
                const auto fit = cli::apply_auto_fit(*p);
                log::info("{}", placement::format_fit(fit));
            }
            if (!p->stage.empty()) {
                for (auto& f : pipeline::run_stage(pipeline::parse_stage(p->stage), *p, progress)) std::printf("%s\n", f.c_str());
                return 0;
            }
            auto rep = pipeline::generate(*p, progress);
            double steps_total = 0;
            for (double s : rep.step_s) steps_total += s;
            log::info("timings: load {:.2f} s, text encoding {:.2f} s, denoising {:.2f} s ({} steps, {:.3f} s/it), VAE {:.2f} s",
                      rep.load_s, rep.te_s, steps_total, rep.step_s.size(),
                      rep.step_s.empty() ? 0.0 : steps_total / (double)rep.step_s.size(), rep.vae_s);
            if (rep.placed_peak_bytes.empty()) {
                log::info("memory on {}: parameters {}, largest compute buffer {}; host peak RSS {}", rep.device, mib(rep.param_bytes),
                          mib(rep.compute_peak_bytes), mib(rep.host_peak_rss_bytes));
            } else {
                // placed modules: no one device holds every module; the measured peak per device
                std::string peaks;
                for (auto& [d, b] : rep.placed_peak_bytes) peaks += fmt::format("{}{} {}", peaks.empty() ? "" : ", ", d, mib(b));
                log::info("memory: parameters {} over all modules, largest compute buffer {}; measured peak per device: {}; host peak RSS {}",
                          mib(rep.param_bytes), mib(rep.compute_peak_bytes), peaks, mib(rep.host_peak_rss_bytes));
            }
            for (auto& o : rep.outputs) std::printf("%s\n", o.c_str());
            return 0;
        };
    },
    20);

}  // namespace
