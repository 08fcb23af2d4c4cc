// `easel plan <generate arguments>`: the placement plan and the predicted bytes per device of a
// generate job, without loading weights or running anything (docs/placement.md).
#include "autofit_cli.h"
#include "command.h"
#include "generate_options.h"

#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "models/family.h"
#include "pipeline/generate.h"
#include "pipeline/hires.h"
#include "pipeline/memory_check.h"
#include "pipeline/stages.h"
#include "pipeline/upscale.h"
#include "pipeline/image_io.h"
#include "placement/devices.h"
#include "placement/plan.h"

#include <fmt/format.h>

#include <cstdio>
#include <optional>

namespace {

using namespace easel;

EASEL_COMMAND(
    "plan", "Print the placement plan and predicted memory per device of a generate job, without running it",
    [](CLI::App& sub) -> std::function<int()> {
        auto p = std::make_shared<pipeline::GenerateParams>();
        auto common = std::make_shared<cli::CommonOptions>();
        cli::add_generate_options(sub, *p);
        cli::add_stage_options(sub, *p);
        cli::add_common_options(sub, *common);
        sub.footer("Takes the arguments of `easel generate`; nothing is loaded or run.\n"
                   "Examples:\n"
                   "  easel plan -m sd15.safetensors -p \"a cat\" --backend \"diffusion=CUDA0&CUDA1\"\n"
                   "  easel plan -m sd15.safetensors -W 1024 -H 1024 --backend cuda0 --params-backend diffusion=cpu --stream-layers --max-vram cuda0=2\n"
                   "  easel plan --rpc-servers 127.0.0.1:50052,127.0.0.1:50053 --backend \"diffusion=RPC0&RPC1\"\n"
                   "  easel plan -m flux1-dev.safetensors -W 1024 -H 1024 --auto-fit --max-vram 8");
        return [p, common, &sub]() -> int {
            cli::apply_common_options(*common);
            cli::resolve_generate_options(sub, *p);
            // an upscaler (--upscale-model, or a --hires-upscaler model): its own stage, planned for one tile
            auto model_upscaler_plan = [&](const std::string& model, int repeats, int W, int H) -> placement::ModulePlan {
                pipeline::UpscaleOptions o;
                o.model = model;
                o.repeats = repeats;
                o.tile = p->upscale_tile_size;
                o.threads = p->threads;
                o.placement = p->placement;
                pipeline::ImageUpscaler up(o);
                up.check_memory(W, H);
                int tile = 0;
                placement::ModulePlan pl = up.plan(W, H, &tile);
                fmt::print("upscaler: {}, {}x{} -> {}x{} per pass, {}\n", up.describe(), W, H, W * up.scale(), H * up.scale(),
                           tile > 0 ? fmt::format("tiles of {} px (the upscaler rows are one tile's graph)", tile) : "the whole image at once");
                return pl;
            };
            auto upscaler_plan = [&](int W, int H) -> std::optional<placement::ModulePlan> {
                if (p->upscale_model.empty() || p->upscale_repeats < 1) return std::nullopt;
                return model_upscaler_plan(p->upscale_model, p->upscale_repeats, W, H);
            };
            if (p->mode == "upscale") {  // sd-cli's -M upscale: only the upscaler, at the image's size
                if (p->init_img.empty()) fail(ErrorKind::InvalidInput, "upscale mode needs an image: pass -i IMAGE");
                if (p->upscale_model.empty()) fail(ErrorKind::InvalidInput, "upscale mode needs an upscaler: pass --upscale-model FILE");
                const pipeline::Image img = pipeline::load_image(p->init_img, 3);
                auto pl = upscaler_plan(img.width, img.height);
                if (!pl) fail(ErrorKind::InvalidInput, "--upscale-repeats {} leaves nothing to do in upscale mode", p->upscale_repeats);
                fmt::print("{}", placement::format_plan({*pl}));
                std::fflush(stdout);
                pipeline::check_plans_fit_host({*pl}, pipeline::MemoryJob{}, pipeline::host_ram_bytes());
                return 0;
            }
            if (p->placement.auto_fit) {
                // --auto-fit: the planner's choice (flags, reasons, predicted peaks), then the table
                // below, of the plan its flags give (the same plan: printed once)
                fmt::print("{}\n", placement::format_fit(cli::apply_auto_fit(*p), /*with_table=*/false));
            }
            auto spec = std::make_shared<placement::PlacementSpec>(placement::parse_placement(p->placement, placement::device_names()));
            for (auto& w : spec->warnings) log::warn("{}", w);
            models::ModelFiles files;
            files.model = p->model;
            files.diffusion_model = p->diffusion_model;
            files.vae = p->vae;
            files.taesd = p->taesd;
            files.clip_l = p->clip_l;
            files.clip_g = p->clip_g;
            files.t5xxl = p->t5xxl;
            files.llm = p->llm;
            if (files.model.empty() && files.diffusion_model.empty()) files.model = pipeline::find_demo_model();
            if (files.model.empty() && files.diffusion_model.empty())
                fail(ErrorKind::InvalidInput, "no model: pass -m FILE (the bundled demo model was not found)");
            models::FamilyOptions fo;
            using placement::PModule;
            fo.te_device = placement::find_device((*spec)[PModule::Te].devices.at(0));
            fo.diffusion_device = placement::find_device((*spec)[PModule::Diffusion].devices.at(0));
            fo.vae_device = placement::find_device((*spec)[PModule::Vae].devices.at(0));
            fo.threads = p->threads;
            fo.flash_attn_te = p->flash_attn;
            fo.flash_attn_diffusion = p->flash_attn || p->diffusion_fa;
    fo.vae_conv_direct = p->vae_conv_direct;
    fo.diffusion_conv_direct = p->diffusion_conv_direct;
            fo.weight_type = p->weight_type;
            fo.prediction = p->prediction;
            fo.flow_shift = p->flow_shift;
            fo.placement = spec;
            fo.vae_tile = pipeline::planned_vae_tile(*p);
            // the encode stage (-i, -r): planned at the images' sizes, as generate runs it
            const pipeline::EncodeSizes enc = pipeline::encode_image_sizes(*p);
            fo.vae_encode_sizes = enc.init;
            fo.reference_sizes = enc.references;
            auto fam = models::open_family(files, fo);
            const int f = fam->latent_format().spatial_factor;
            // sizes rounded down to the family's multiple (16 for Z-Image / FLUX), as generate does
            const int mult = fam->size_multiple();
            if (p->width <= 0 || p->height <= 0) fail(ErrorKind::InvalidInput, "size {}x{} must be positive", p->width, p->height);
            // generate takes an init image's size (-i) for the job
            int W0 = enc.init.empty() ? p->width : (int)enc.init[0].second, H0 = enc.init.empty() ? p->height : (int)enc.init[0].first;
            if (!p->load_latent.empty()) {  // ... and a --load-latent latent's
                const pipeline::LoadedLatent z = pipeline::load_latent(platform::u8path(p->load_latent), *fam);
                W0 = (int)z.w * f;
                H0 = (int)z.h * f;
            }
            const int W = std::max(mult, W0 / mult * mult), H = std::max(mult, H0 / mult * mult);
            // --hires: the second pass runs at the larger size (checked before anything is printed)
            const auto hires = pipeline::hires_pass_size(*p, W, H, mult, f);
            const int outW = hires ? hires->target.width : W, outH = hires ? hires->target.height : H;
            fmt::print("{}: {}\n", fam->name(), fam->describe());
            fmt::print("placement: {}\n", placement::describe(*spec));
            fmt::print("job: {}x{} pixels, latent {}x{}x{}, batch 1 per evaluation\n\n", W, H, fam->latent_format().channels, H / f, W / f);
            auto plans = fam->plan_placement(H / f, W / f);
            if (auto up = upscaler_plan(outW, outH); up && !hires) plans.push_back(*up);
            if (plans.empty()) {
                fmt::print("{} has no module run under a placement plan in this build: each module runs whole on its device.\n", fam->name());
                return 0;
            }
            fmt::print("{}", placement::format_plan(plans));
            bool te_planned = false, vae_planned = false;
            for (auto& pl : plans) {
                te_planned = te_planned || pl.module == PModule::Te;
                vae_planned = vae_planned || pl.module == PModule::Vae;
            }
            if (!te_planned) fmt::print("te on {} (whole module, weights on the device)\n", (*spec)[PModule::Te].devices[0]);
            if (!vae_planned)
                fmt::print("vae on {} (whole module, weights on the device; its stage is not in the table)\n", (*spec)[PModule::Vae].devices[0]);
            else if (p->vae_tiling)
                fmt::print("vae decode tiled: tiles of {} latent cells (--vae-tiling), the vae rows are one tile's graph\n", p->vae_tile_size);
            // the planner leaves the CPU unbudgeted: a peak above host RAM is flagged here (exit 1)
            std::fflush(stdout);
            pipeline::MemoryJob job;
            job.width = W;
            job.height = H;
            job.flash_attn = p->flash_attn;
            job.diffusion_fa = p->flash_attn || p->diffusion_fa;
            job.vae_tiling = p->vae_tiling;
            pipeline::check_plans_fit_host(plans, job, pipeline::host_ram_bytes());
            if (hires) {
                // the second pass: the UNet / DiT and the decode at the hires size; a pixel or model
                // upscaler's encode at the upscaled size; the hires model upscaler on the first
                // pass's image; --upscale-model on the final image
                const pipeline::HiresTarget& t = hires->target;
                fmt::print("\nhires second pass ({}): {}x{} pixels, latent {}x{}x{}{}\n\n", hires->up.name, t.width, t.height,
                           fam->latent_format().channels, t.height / f, t.width / f,
                           hires->encodes ? fmt::format(", the upscaled {}x{} image encoded", t.up_width, t.up_height) : std::string());
                models::FamilyOptions fo2 = fo;
                fo2.vae_encode_sizes.clear();
                if (hires->encodes) fo2.vae_encode_sizes.push_back({t.up_height, t.up_width});
                auto fam2 = models::open_family(files, fo2);
                auto plans2 = fam2->plan_placement(t.height / f, t.width / f);
                if (hires->up.kind == pipeline::HiresUpscaler::Kind::Model) plans2.push_back(model_upscaler_plan(hires->up.model_path, 1, W, H));
                if (auto up = upscaler_plan(outW, outH)) plans2.push_back(*up);
                fmt::print("{}", placement::format_plan(plans2));
                std::fflush(stdout);
                pipeline::MemoryJob job2 = job;
                job2.width = t.up_width;
                job2.height = t.up_height;
                pipeline::check_plans_fit_host(plans2, job2, pipeline::host_ram_bytes());
            }
            return 0;
        };
    },
    25);

}  // namespace
