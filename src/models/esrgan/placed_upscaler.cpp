// PlacedUpscaler and upscaler_costs (see upscaler.h).
#include "models/esrgan/placed_upscaler.h"

#include "core/error.h"
#include "models/esrgan/tiling.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>

namespace easel::esrgan {

using namespace placement;
using runtime::PlacedSequence;


namespace {

/// The network, its TensorSource and load options.
struct UpscalerModel {
    esrgan::EsrganConfig cfg;
    std::unique_ptr<esrgan::UpscalerNet> net;
    std::unique_ptr<nn::TensorSource> src;
    nn::LoadOptions lo = esrgan::load_options();
    UpscalerModel(const io::WeightIndex& index, const std::string& label) {
        cfg = esrgan::infer_config(index, label);
        net = esrgan::make_net(cfg);
        src = std::make_unique<nn::TensorSource>(esrgan::tensor_source(index, cfg));
        if (std::string why = nn::check_binding(*net, *src, lo); !why.empty())
            fail(ErrorKind::ModelMismatch, "'{}' ({}): {}", label, cfg.describe(), why);
    }
};

std::function<EsrganInputs(runtime::GraphBuilder&)> image_inputs(int64_t h, int64_t w, std::span<const float> x) {
    return [=](runtime::GraphBuilder& g) { return EsrganInputs{g.input_f32("upscaler_input", {w, h, 3, 1}, x)}; };
}

std::vector<ggml_tensor*> image_output(ggml_tensor*& o) { return {o}; }

std::string graph_label(const esrgan::EsrganConfig& cfg, int64_t h, int64_t w) {
    return fmt::format("upscaler {}, {}x{} -> {}x{} px", cfg.describe(), w, h, w * cfg.scale, h * cfg.scale);
}

}  // namespace

ModuleCosts upscaler_costs(const io::WeightIndex& index, const std::string& label, int threads, int64_t h, int64_t w) {
    if (h <= 0 || w <= 0) fail(ErrorKind::InvalidInput, "upscaler costs: empty image {}x{}", w, h);
    struct Keep {
        UpscalerModel m;
        std::vector<float> x;
        Keep(const io::WeightIndex& i, const std::string& l) : m(i, l) {}
    };
    auto k = std::make_shared<Keep>(index, label);
    const int64_t u = k->m.cfg.unshuffle;
    h = (h + u - 1) / u * u;
    w = (w + u - 1) / u * u;
    k->x.assign((size_t)(3 * h * w), 0.0f);
    return self_contained_costs<EsrganInputs, EsrganState, ggml_tensor*>(PModule::Upscaler, k, *k->m.net, *k->m.net, *k->m.src, k->m.lo,
                                                                         threads, false, image_inputs(h, w, k->x), image_output,
                                                                         graph_label(k->m.cfg, h, w));
}

struct PlacedUpscaler::Model : UpscalerModel {
    using UpscalerModel::UpscalerModel;
};

PlacedUpscaler::PlacedUpscaler(const io::WeightIndex& index, const std::string& label, PlacementSpec spec, int threads)
    : model_(std::make_unique<Model>(index, label)), spec_(std::move(spec)) {
    ModulePlacement& m = spec_[PModule::Upscaler];
    if (m.devices.empty()) fail(ErrorKind::Internal, "placement spec without an upscaler device");
    placed_ = std::make_unique<PlacedSequence<EsrganInputs, EsrganState, ggml_tensor*>>(*model_->net, *model_->net, *model_->src,
                                                                                          model_->lo, PModule::Upscaler, spec_, threads, false);
}

PlacedUpscaler::~PlacedUpscaler() = default;

const esrgan::EsrganConfig& PlacedUpscaler::config() const { return model_->cfg; }
const std::string& PlacedUpscaler::device() const { return spec_[PModule::Upscaler].devices.front(); }

ModulePlan PlacedUpscaler::plan(int64_t h, int64_t w) {
    if (h <= 0 || w <= 0) fail(ErrorKind::InvalidInput, "upscaler plan: empty image {}x{}", w, h);
    const int64_t u = model_->cfg.unshuffle;
    h = (h + u - 1) / u * u;
    w = (w + u - 1) / u * u;
    std::vector<float> x((size_t)(3 * h * w));
    ModulePlan p = placed_->plan(image_inputs(h, w, x), image_output, graph_label(model_->cfg, h, w));
    return p;
}

int PlacedUpscaler::choose_tile(int64_t H, int64_t W) {
    const int u = model_->cfg.unshuffle;
    // the CPU is unbudgeted in the planner: 3/4 of its free memory here
    uint64_t cpu_budget = 0;
    for (const auto& d : list_devices())
        if (d.type == "cpu") cpu_budget = d.free_bytes / 4 * 3;
    const bool cpu = [&] {
        for (const auto& d : list_devices())
            if (d.name == device()) return d.type == "cpu";
        return false;
    }();
    auto fits = [&](int64_t h, int64_t w, uint64_t* need) {
        try {
            const ModulePlan p = plan(h, w);
            uint64_t total = 0;
            for (const auto& d : p.devices) total = std::max(total, d.total());
            *need = total;
            return !cpu || cpu_budget == 0 || total <= cpu_budget;
        } catch (const Error& e) {
            if (e.kind() != ErrorKind::OutOfMemory) throw;
            *need = UINT64_MAX;
            return false;
        }
    };
    uint64_t need = 0;
    if (fits(H, W, &need)) return 0;
    static const int ladder[] = {1024, 768, 512, 384, 256, 192, 128, 96, 64, 48, 32};
    for (int t : ladder) {
        const int tt = t / u * u;
        if (tt >= std::max(H, W)) continue;
        if (fits(std::min<int64_t>(tt, H), std::min<int64_t>(tt, W), &need)) return tt;
    }
    fail(ErrorKind::OutOfMemory,
         "the upscaler does not fit on {} even in tiles of 32 pixels ({}): free memory there, or run it elsewhere with --backend upscaler=cpu",
         device(), need == UINT64_MAX ? "the planner refused it" : fmt::format("{:.1f} MiB needed", (double)need / 1048576.0));
}

vae::HostTensor PlacedUpscaler::upscale(const vae::HostTensor& img, int tile, int overlap, const std::function<void(int, int)>& on_tile) {
    const auto& cfg = model_->cfg;
    if (img.n != 1 || img.c != 3 || img.h <= 0 || img.w <= 0)
        fail(ErrorKind::InvalidInput, "the upscaler takes one RGB image, got {}x{}x{}x{}", img.n, img.c, img.h, img.w);
    const int64_t u = cfg.unshuffle;
    const vae::HostTensor x = esrgan::pad_reflect_to_multiple(img, u);
    int64_t t = tile > 0 ? tile / u * u : 0;
    if (tile > 0 && t == 0) t = u;
    const bool whole = t <= 0 || (t >= x.h && t >= x.w);
    // one plan for every graph: the tiles all have the first tile's shape (edge tiles are moved
    // inward, not cropped)
    const int64_t gh = whole ? x.h : std::min(t, x.h), gw = whole ? x.w : std::min(t, x.w);
    const std::vector<int64_t> key{gh, gw};
    const int64_t ov = overlap >= 0 ? overlap / u * u : esrgan::default_overlap(t, u, esrgan::context_pixels(cfg));
    vae::HostTensor out = esrgan::tiled_upscale(
        x, whole ? 0 : t, ov, cfg.scale, u,
        [&](const vae::HostTensor& tt) {
            auto res = placed_->run(key, image_inputs(tt.h, tt.w, tt.data), image_output, graph_label(cfg, gh, gw));
            const runtime::HostTensor& o = res.at(0);
            vae::HostTensor r;
            r.n = o.ne[3], r.c = o.ne[2], r.h = o.ne[1], r.w = o.ne[0];
            r.data = std::move(res[0].data);
            return r;
        },
        on_tile);
    if (x.h != img.h || x.w != img.w) out = out.crop(0, 0, img.h * cfg.scale, img.w * cfg.scale);
    return out;
}

const ModulePlan& PlacedUpscaler::current_plan() const { return placed_->current_plan(); }
std::map<std::string, uint64_t> PlacedUpscaler::peaks() const { return placed_->peaks(); }

uint64_t PlacedUpscaler::param_bytes() const {
    uint64_t b = 0;
    for (auto& s : current_plan().segments) b += s.param_bytes;
    return b;
}

}  // namespace easel::esrgan
