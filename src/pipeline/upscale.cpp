// ImageUpscaler and upscale_file (see upscale.h).
#include "pipeline/upscale.h"

#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "models/vae/host_tensor.h"
#include "pipeline/generate.h"
#include "pipeline/memory_check.h"
#include "placement/devices.h"
#include "models/esrgan/placed_upscaler.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <thread>

namespace easel::pipeline {

namespace fs = std::filesystem;

namespace {

std::string mib(uint64_t b) { return fmt::format("{:.1f} MiB", (double)b / 1048576.0); }

}  // namespace

ImageUpscaler::ImageUpscaler(const UpscaleOptions& opt) : opt_(opt) {
    if (opt.model.empty()) fail(ErrorKind::InvalidInput, "no upscaler: pass --upscale-model FILE (an ESRGAN / Real-ESRGAN model)");
    if (opt.repeats < 1) fail(ErrorKind::InvalidInput, "--upscale-repeats {} must be at least 1", opt.repeats);
    std::error_code ec;
    if (!fs::exists(opt.model, ec)) fail(ErrorKind::Io, "--upscale-model {}: the file does not exist", opt.model);
    index_ = std::make_unique<io::WeightIndex>(io::WeightIndex::open(opt.model));
    placement::init_backends();
    placement::PlacementSpec spec = placement::parse_placement(opt.placement, placement::device_names());
    const int threads = opt.threads > 0 ? opt.threads : (int)std::max(1u, std::thread::hardware_concurrency());
    up_ = std::make_unique<esrgan::PlacedUpscaler>(*index_, opt.model, std::move(spec), threads);
}

ImageUpscaler::~ImageUpscaler() = default;

std::string ImageUpscaler::describe() const { return fmt::format("{} ({})", up_->config().describe(), fs::path(opt_.model).filename().string()); }

int ImageUpscaler::scale() const { return up_->config().scale; }

std::pair<int64_t, int64_t> ImageUpscaler::output_size(int64_t width, int64_t height) const {
    int64_t w = width, h = height;
    for (int r = 0; r < opt_.repeats; ++r) {
        w *= scale();
        h *= scale();
        if (w > kMaxOutputSide || h > kMaxOutputSide)
            fail(ErrorKind::InvalidInput,
                 "upscaling {}x{} by {} {} time{} passes the largest output side of {} pixels: use fewer --upscale-repeats or a smaller image",
                 width, height, scale(), opt_.repeats, opt_.repeats == 1 ? "" : "s", kMaxOutputSide);
    }
    return {w, h};
}

void ImageUpscaler::check_memory(int64_t width, int64_t height) const {
    const auto [w, h] = output_size(width, height);
    // the last pass holds its float output and blend weights (16 bytes a pixel), the float input
    // (12 / s^2), the 8-bit result and its PNG encoding (about 6)
    const uint64_t need = (uint64_t)w * (uint64_t)h * 24;
    const uint64_t ram = host_ram_bytes();
    if (ram > 0 && need > ram)
        fail(ErrorKind::OutOfMemory,
             "the upscaled image is {}x{} pixels and needs about {:.1f} GiB of host memory, more than this machine's {:.1f} GiB: upscale a "
             "smaller image or use fewer --upscale-repeats",
             w, h, (double)need / (1ull << 30), (double)ram / (1ull << 30));
}

placement::ModulePlan ImageUpscaler::plan(int64_t width, int64_t height, int* tile_out) {
    int tile = opt_.tile;
    if (tile < 0) tile = up_->choose_tile(height, width);
    if (tile_out) *tile_out = tile;
    if (tile > 0 && (tile < height || tile < width)) return up_->plan(std::min<int64_t>(tile, height), std::min<int64_t>(tile, width));
    return up_->plan(height, width);
}

Image ImageUpscaler::upscale(const Image& in, UpscaleReport* report, const std::function<void(int, int)>& on_tile) {
    if (in.width <= 0 || in.height <= 0) fail(ErrorKind::InvalidInput, "upscale: empty image");
    check_memory(in.width, in.height);
    UpscaleReport r;
    r.in_width = in.width;
    r.in_height = in.height;
    const auto t0 = std::chrono::steady_clock::now();
    Image cur = in;
    if (cur.channels != 3) {
        // gray / gray+alpha / RGBA -> RGB as stb's conversion does (gray replicated, alpha dropped)
        Image rgb;
        rgb.width = cur.width;
        rgb.height = cur.height;
        rgb.channels = 3;
        rgb.pixels.resize((size_t)cur.width * cur.height * 3);
        for (size_t p = 0; p < (size_t)cur.width * cur.height; ++p)
            for (int c = 0; c < 3; ++c) rgb.pixels[p * 3 + c] = cur.pixels[p * cur.channels + (cur.channels >= 3 ? c : 0)];
        cur = std::move(rgb);
    }
    for (int pass = 0; pass < opt_.repeats; ++pass) {
        int tile = opt_.tile;
        if (tile < 0) tile = up_->choose_tile(cur.height, cur.width);
        r.tile = tile;
        vae::HostTensor x(1, 3, cur.height, cur.width);
        x.data = image_to_planar(cur, 0.0f, 1.0f);
        int tiles = 0;
        vae::HostTensor y = up_->upscale(x, tile, -1, [&](int done, int total) {
            tiles = total;
            if (on_tile) on_tile(done, total);
        });
        r.tiles += tiles;
        cur = image_from_planar(y.data, (int)y.w, (int)y.h, 3, 0.0f, 1.0f);
    }
    r.out_width = cur.width;
    r.out_height = cur.height;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.peaks = up_->peaks();
    for (const auto& d : up_->current_plan().devices) r.predicted = std::max(r.predicted, d.total());
    if (report) *report = r;
    return cur;
}

std::string postprocessing_text(const ImageUpscaler& up, int repeats) {
    int s = 1;
    for (int i = 0; i < repeats; ++i) s *= up.scale();
    return fmt::format("Postprocess upscaler: {}, Postprocess upscale by: {}", up.describe(), s);
}

std::string format_upscale_report(const ImageUpscaler& up, const UpscaleReport& r) {
    std::string peaks;
    for (auto& [d, b] : r.peaks) peaks += fmt::format("{}{} {}", peaks.empty() ? "" : ", ", d, mib(b));
    return fmt::format("upscale: {} {}x{} -> {}x{}, {}, {:.2f} s; measured peak {} (plan {})", up.describe(), r.in_width, r.in_height,
                       r.out_width, r.out_height, r.tile > 0 ? fmt::format("{} tiles of {} px", r.tiles, r.tile) : "whole image", r.seconds,
                       peaks.empty() ? "-" : peaks, mib(r.predicted));
}

UpscaleReport upscale_file(const std::string& input, const std::string& output, const UpscaleOptions& opt) {
    if (input.empty()) fail(ErrorKind::InvalidInput, "upscale needs an image: pass -i IMAGE");
    check_output_folder(output, "-o");
    (void)check_output_path(platform::u8path(output), "-o");  // .webp, .bmp: refused before the upscaler loads
    ImageUpscaler up(opt);
    Image img = load_image(input, 4);
    bool alpha = false;
    for (size_t p = 3; p < img.pixels.size(); p += 4) alpha = alpha || img.pixels[p] != 255;
    if (alpha) log::warn("{} has transparent pixels: the upscaler works on RGB, the alpha channel is dropped", input);
    up.check_memory(img.width, img.height);
    UpscaleReport r;
    Image out = up.upscale(img, &r);
    const PngTextEntry text{"postprocessing", postprocessing_text(up, opt.repeats)};
    save_image(output, out, std::span<const PngTextEntry>(&text, 1));  // .png or .jpg by the extension
    log::info("{}", format_upscale_report(up, r));
    return r;
}

}  // namespace easel::pipeline
