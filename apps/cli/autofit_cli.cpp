// --auto-fit glue for the CLI (see autofit_cli.h).
#include "autofit_cli.h"

#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "core/strings.h"
#include "models/family.h"
#include "pipeline/cache.h"
#include "pipeline/generate.h"
#include "pipeline/hires.h"
#include "pipeline/stages.h"
#include "placement/devices.h"
#include "placement/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ggml-backend.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

namespace easel::cli {

namespace {

using placement::PModule;

/// Modules named by the entries of a --backend / --params-backend value: a bare NAME or an
/// all=/default=/*= entry names every module.
std::array<bool, placement::kModuleCount> named_modules(const std::string& value) {
    std::array<bool, placement::kModuleCount> out{};
    std::stringstream ss(value);
    std::string e;
    while (std::getline(ss, e, ',')) {
        e.erase(0, e.find_first_not_of(" \t"));
        e.erase(e.find_last_not_of(" \t") + 1);
        if (e.empty()) continue;
        const size_t eq = e.find('=');
        const std::string key = eq == std::string::npos ? "" : ascii_lower(e.substr(0, eq));
        if (key.empty() || key == "all" || key == "default" || key == "*") out.fill(true);
        else out[(size_t)placement::parse_pmodule(key)] = true;
    }
    return out;
}

/// Memory available to new allocations in bytes (platform::available_memory_bytes; 0 when unknown).
uint64_t host_available() { return platform::available_memory_bytes(); }

std::string file_stamp(const std::string& path) {
    std::error_code ec;
    if (path.empty()) return "";
    const std::filesystem::path f = platform::u8path(path);
    auto sz = std::filesystem::is_regular_file(f, ec) ? std::filesystem::file_size(f, ec) : 0;
    auto t = std::filesystem::last_write_time(f, ec);
    return fmt::format("{}:{}:{}", path, sz, ec ? 0 : (long long)t.time_since_epoch().count());
}

}  // namespace

placement::FitResult apply_auto_fit(pipeline::GenerateParams& p) {
    using namespace placement;
    const PlacementFlags user = p.placement;
    const auto names = device_names();
    PlacementSpec uspec = parse_placement(user, names);

    models::ModelFiles files;
    files.model = p.model;
    files.diffusion_model = p.diffusion_model;
    files.vae = p.vae;
    files.taesd = p.taesd;
    files.clip_l = p.clip_l;
    files.clip_g = p.clip_g;
    files.t5xxl = p.t5xxl;
    files.llm = p.llm;
    if (files.model.empty() && files.diffusion_model.empty()) files.model = pipeline::find_demo_model();
    if (files.model.empty() && files.diffusion_model.empty())
        fail(ErrorKind::InvalidInput, "no model: pass -m FILE (the bundled demo model was not found)");
    models::FamilyOptions fo;
    fo.threads = p.threads;
    fo.flash_attn_te = p.flash_attn;
    fo.flash_attn_diffusion = p.flash_attn || p.diffusion_fa;
    fo.vae_conv_direct = p.vae_conv_direct;
    fo.diffusion_conv_direct = p.diffusion_conv_direct;
    fo.weight_type = p.weight_type;
    fo.prediction = p.prediction;
    fo.flow_shift = p.flow_shift;
    pipeline::check_vae_tiling(p);  // (a malformed --vae-tile-size is refused as without --auto-fit)
    if (!p.load_latent.empty() && !p.init_img.empty())
        fail(ErrorKind::InvalidInput, "give either -i IMAGE or --load-latent INIT, not both");
    // the encode stage (-i, -r): planned at the images' sizes, as generate runs it
    const pipeline::EncodeSizes enc = pipeline::encode_image_sizes(p);
    fo.vae_encode_sizes = enc.init;
    fo.reference_sizes = enc.references;
    auto fam = models::open_family(files, fo);
    const int f = fam->latent_format().spatial_factor, mult = fam->size_multiple();
    // generate takes an init image's size (-i) for the job
    int W0 = enc.init.empty() ? p.width : (int)enc.init[0].second, H0 = enc.init.empty() ? p.height : (int)enc.init[0].first;
    if (!p.load_latent.empty()) {  // ... and a --load-latent latent's (in cells)
        const pipeline::LoadedLatent z = pipeline::load_latent(platform::u8path(p.load_latent), *fam);
        W0 = (int)z.w * f;
        H0 = (int)z.h * f;
    }
    int W = std::max(mult, W0 / mult * mult), H = std::max(mult, H0 / mult * mult);
    // --hires: the plan is for the larger second pass (the UNet / DiT and the decode at the hires
    // size; a pixel or model upscaler's encode at the upscaled size), which covers the first
    if (const auto hires = pipeline::hires_pass_size(p, W, H, mult, f)) {
        W = hires->target.width;
        H = hires->target.height;
        if (hires->encodes) {
            fo.vae_encode_sizes.push_back({hires->target.up_height, hires->target.up_width});
            fam = models::open_family(files, fo);
        }
        log::info("--auto-fit: planning for the hires second pass at {}x{}", W, H);
    }
    const int64_t h = H / f, w = W / f;
    auto costs = fam->placement_costs(h, w);
    if (costs.empty())
        fail(ErrorKind::Unsupported, "--auto-fit: {} has no module that runs under a placement plan in this build; use explicit --backend flags",
             fam->name());

    FitRequest req;
    req.job.width = W;
    req.job.height = H;
    req.job.batch = p.batch_count;
    req.job.steps = p.steps;
    req.job.cfg = p.cfg_scale != 1.0f;
    req.max_vram = user.max_vram;
    req.headroom = user.headroom;

    // measurements are cached under the cache dir (--no-cache: measured every time)
    std::filesystem::path cache_dir;
    if (!p.no_cache) cache_dir = p.cache_dir.empty() ? pipeline::default_cache_dir() : platform::u8path(p.cache_dir);

    // devices: budgets as the runtime resolves them, the CPU's = available host RAM; speeds
    // measured (EASEL_AUTOFIT_BENCH=0: the cost model's defaults)
    const bool bench = device_bench_enabled();
    std::vector<std::string> speeds;
    const auto devs = list_devices();
    const auto budgets = resolve_budgets(uspec, devs);
    for (auto& d : devs) {
        if (d.type != "cpu" && d.type != "gpu" && d.type != "igpu" && d.type != "accel") continue;
        FitDevice fd;
        fd.name = d.name;
        fd.type = d.type;
        double head = uspec.headroom_all_mib.value_or(0.0);
        if (auto it = uspec.headroom_mib.find(d.name); it != uspec.headroom_mib.end()) head = it->second;
        fd.headroom = (uint64_t)(head * 1024 * 1024);
        if (auto it = budgets.find(d.name); it != budgets.end()) fd.budget = it->second;
        else if (d.type == "cpu") {
            const uint64_t avail = host_available();
            fd.budget = avail > fd.headroom ? avail - fd.headroom : 0;
        }
        const size_t mx = ggml_backend_buft_get_max_size(ggml_backend_dev_buffer_type(d.dev));
        fd.max_alloc = mx == SIZE_MAX ? 0 : (uint64_t)mx;
        if (bench && (d.type == "cpu" || fd.budget > 0)) {
            // matmul FLOP/s and host-to-device bandwidth, cached per device (and CPU thread
            // count) next to the compute buffers, so planning the same job twice gives the same
            // plan (a fresh measurement varies by a few percent and can flip a choice)
            const int threads = d.type == "cpu" ? (p.threads > 0 ? p.threads : (int)std::max(1u, std::thread::hardware_concurrency())) : 0;
            DeviceSpeedCache dc(cache_dir, d.name, d.description, threads);
            const DeviceSpeed sp = dc.get([&] { return measure_device_speed(d.dev, threads); });
            fd.flops = sp.flops;
            fd.h2d_bytes_per_s = sp.h2d_bytes_per_s;
            speeds.push_back(fmt::format("{} {:.3g} GFLOP/s{}{}", d.name, sp.flops / 1e9,
                                         d.type == "cpu" ? "" : fmt::format(", {:.3g} GB/s", sp.h2d_bytes_per_s / 1e9), dc.hit() ? " (cached)" : ""));
        }
        req.devices.push_back(fd);
    }

    // the user's explicit entries. A --params-backend entry is kept as named (params_given):
    // the spec's `params` is cleared when it names the module's default runtime device (the CPU
    // on a machine without a GPU), but auto-fit may run the module elsewhere (an RPC device),
    // where `diffusion=cpu` means weights in host RAM.
    const auto pin_dev = named_modules(user.backend);
    for (int i = 0; i < kModuleCount; ++i) {
        const PModule m = (PModule)i;
        const bool dev_pinned = pin_dev[(size_t)i] || (m == PModule::Te && user.clip_on_cpu) || (m == PModule::Vae && user.vae_on_cpu);
        if (dev_pinned) req.pinned_devices[(size_t)i] = uspec[m].devices;
        if (uspec.params_given[(size_t)i]) {
            std::string loc = *uspec.params_given[(size_t)i];
            // weights on the one device the module is pinned to = on its runtime device
            if (dev_pinned && uspec[m].devices.size() == 1 && loc == uspec[m].devices[0]) loc.clear();
            req.pinned_params[(size_t)i] = loc;
        }
    }

    // modules, their measurements cached per shape
    std::vector<std::unique_ptr<MeasureCache>> caches;
    std::vector<std::string> work;  // FLOPs per evaluation, per module (for the reasons)
    const double cfg = req.job.cfg ? 2.0 : 1.0;
    for (auto& c : costs) {
        FitModule m;
        m.module = c.module;
        m.costs = c;
        std::vector<std::string> key{"autofit-measure-v2", fam->name(), pmodule_name(c.module), c.label, p.weight_type, std::to_string(h), std::to_string(w),
                                     fo.flash_attn_te ? "fa" : "", fo.flash_attn_diffusion ? "dfa" : ""};
        for (auto* path : {&files.model, &files.diffusion_model, &files.vae, &files.taesd, &files.clip_l, &files.clip_g, &files.t5xxl, &files.llm})
            key.push_back(file_stamp(*path));
        caches.push_back(std::make_unique<MeasureCache>(cache_dir, key));
        m.costs.measure = caches.back()->wrap(c.measure);
        if (c.flops) {  // the work of one evaluation, counted from its graph (cached with the buffers)
            const int n = (int)c.block_bytes.size();
            m.flops_per_eval = (double)caches.back()->value("flops", [&] { return (uint64_t)std::llround(c.flops(0, n, true, true)); });
            work.push_back(fmt::format("{} {:.3g} GFLOP", pmodule_name(c.module), m.flops_per_eval / 1e9));
        }
        if (c.measure_tile) {  // the VAE decoder: tiles measured (and cached) as the planner asks
            m.measure_tile = caches.back()->wrap_tile(c.measure_tile);
            m.latent_w = (int)(c.latent_w > 0 ? c.latent_w : w);
            m.latent_h = (int)(c.latent_h > 0 ? c.latent_h : h);
        }
        if (std::optional<ModuleCosts> ec0; c.module == PModule::Vae && (ec0 = fam->encode_costs(0))) {
            if (ec0->flops)
                work.push_back(fmt::format("vae encoder {:.3g} GFLOP", ec0->flops(0, (int)ec0->block_bytes.size(), true, true) / 1e9));
            // the encoder (its own stage, the same vae entry): costed per tile the planner tries,
            // each tile's measurements cached under a key of the encoded sizes and the tile
            std::vector<std::string> ekey = key;
            ekey.push_back("encoder");
            for (auto [eh, ew] : enc.init) ekey.push_back(fmt::format("i{}x{}", ew, eh));
            for (auto [eh, ew] : enc.references) ekey.push_back(fmt::format("r{}x{}", ew, eh));
            auto enc_caches = std::make_shared<std::map<int, std::shared_ptr<MeasureCache>>>();
            models::Family* fp = fam.get();
            m.encode_costs = [fp, enc_caches, ekey, cache_dir](int tile) {
                std::optional<ModuleCosts> ec = fp->encode_costs(tile);
                if (!ec) fail(ErrorKind::Internal, "--auto-fit: the encoder's costs vanished at tile {}", tile);
                auto& mc = (*enc_caches)[tile];
                if (!mc) {
                    std::vector<std::string> k = ekey;
                    k.push_back(fmt::format("tile{}", tile));
                    mc = std::make_shared<MeasureCache>(cache_dir, k);
                }
                ec->measure = mc->wrap(ec->measure);
                return *ec;
            };
        }
        switch (c.module) {
            case PModule::Diffusion: m.evals = p.steps * cfg * p.batch_count; break;
            case PModule::Te: m.evals = cfg * p.batch_count; break;
            default: m.evals = p.batch_count; break;
        }
        req.modules.push_back(std::move(m));
    }

    for (int i = 0; i < kModuleCount; ++i) req.split[(size_t)i] = uspec[(PModule)i].split;

    FitResult fit = auto_fit(req);
    for (auto& c : caches) c->flush();

    PlacementFlags next = fit.flags;  // (its --split-mode names the modules planned as row splits)
    p.placement = next;
    if (fit.vae_tile > 0) {
        if (p.vae_tiling && pipeline::planned_vae_tile(p) != fit.vae_tile)
            fit.reasons.push_back(fmt::format("vae: your --vae-tile-size {} replaced by {}x{}, the largest tile that fits", p.vae_tile_size, fit.vae_tile,
                                              fit.vae_tile));
        p.vae_tiling = true;
        p.vae_tile_size = fmt::format("{}x{}", fit.vae_tile, fit.vae_tile);
    }
    for (int i = 0; i < kModuleCount; ++i) {
        bool planned = false;
        for (auto& c : fit.choices) planned |= (int)c.module == i;
        const PModule m = (PModule)i;
        if (!planned && (m == PModule::Te || m == PModule::Vae))
            fit.reasons.push_back(fmt::format("{}: not costed by {} in this build: runs whole on the default device", pmodule_name(m), fam->name()));
    }
    fit.reasons.push_back(bench ? fmt::format("device speeds (matmul, host-to-device): {}", fmt::join(speeds, "; "))
                                : "device speeds: not measured (EASEL_AUTOFIT_BENCH=0): the cost model's defaults by device type");
    if (!work.empty())
        fit.reasons.push_back(fmt::format("work per evaluation (matmul FLOPs counted from the graphs at this job's shapes): {}", fmt::join(work, "; ")));
    int hits = 0, misses = 0;
    for (auto& c : caches) hits += c->hits(), misses += c->misses();
    fit.reasons.push_back(fmt::format("compute buffers: {} measured with ggml's graph allocator, {} answered from the cache (the file, or an earlier measurement of this plan){}", misses, hits,
                                      cache_dir.empty() ? " (--no-cache)" : " (" + platform::path_utf8(cache_dir / "autofit") + ")"));
    return fit;
}

}  // namespace easel::cli
