// PlacedUNet (see sd_unet.h).
#include "placement/sd_unet.h"

#include "core/log.h"

namespace easel::placement {

using models::sd::UNetInputs;

PlacedUNet::PlacedUNet(const io::WeightIndex& index, const models::sd::UNetConfig& cfg, nn::LoadOptions lo, PlacementSpec spec,
                       int threads, bool flash_attn)
    : index_(index), cfg_(cfg), lo_(std::move(lo)), spec_(std::move(spec)), threads_(threads), flash_(flash_attn),
      src_(models::sd::make_unet_source(index, cfg)), net_(std::make_unique<models::sd::UNet2DCondition>(cfg)) {}

PlacedUNet::~PlacedUNet() = default;

std::unique_ptr<PlacedUNet::Runner> PlacedUNet::make_runner() {
    return std::make_unique<Runner>(*net_, *net_, src_, lo_, threads_, flash_);
}

ModulePlan PlacedUNet::plan(int64_t n, int64_t h, int64_t w, int64_t tokens) {
    auto r = make_runner();
    std::vector<float> x((size_t)(n * cfg_.in_channels * h * w)), t((size_t)n), c((size_t)(n * tokens * cfg_.context_dim));
    auto mk = [&](runtime::GraphBuilder& g) {
        UNetInputs in;
        in.sample = g.input_f32("sample", {w, h, cfg_.in_channels, n}, x);
        in.timestep = g.input_f32("timestep", {n}, t);
        in.context = g.input_f32("context", {cfg_.context_dim, tokens, n}, c);
        return in;
    };
    auto sel = [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; };
    auto costs = r->costs(mk, sel, fmt::format("UNet {} blocks, latent {}x{}x{}x{}", net_->n_blocks(), n, cfg_.in_channels, h, w));
    return plan_module(PModule::Diffusion, spec_[PModule::Diffusion], spec_.stream_layers, costs, resolve_budgets(spec_, list_devices()));
}

void PlacedUNet::run(std::span<const float> x, int64_t n, int64_t h, int64_t w, std::span<const float> t, std::span<const float> context,
                     int64_t tokens, std::span<float> out) {
    const std::array<int64_t, 4> shape{n, h, w, tokens};
    if (!runner_ || shape != shape_) {
        if (runner_) {
            for (auto& [d, b] : runner_->peaks()) peaks_[d] = std::max(peaks_[d], b);
            runner_.reset();
        }
        plan_ = plan(n, h, w, tokens);
        log::info("placement plan for the diffusion model:\n{}", format_plan({plan_}));
        runner_ = make_runner();
        runner_->load(plan_);
        shape_ = shape;
        if (phase_) runner_->begin_phase();
    }
    auto res = runner_->run(
        [&](runtime::GraphBuilder& g) {
            UNetInputs in;
            in.sample = g.input_f32("sample", {w, h, cfg_.in_channels, n}, x);
            in.timestep = g.input_f32("timestep", {n}, t);
            in.context = g.input_f32("context", {cfg_.context_dim, tokens, n}, context);
            return in;
        },
        [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; });
    if (res.at(0).data.size() != out.size())
        fail(ErrorKind::InvalidInput, "UNet output has {} values, the buffer {}", res[0].data.size(), out.size());
    std::copy(res[0].data.begin(), res[0].data.end(), out.begin());
}

std::map<std::string, uint64_t> PlacedUNet::peaks() const {
    auto p = peaks_;
    if (runner_)
        for (auto& [d, b] : runner_->peaks()) p[d] = std::max(p[d], b);
    return p;
}

void PlacedUNet::begin_phase() {
    phase_ = true;
    if (runner_) runner_->begin_phase();
}

void PlacedUNet::end_phase() {
    phase_ = false;
    if (runner_) runner_->end_phase();
}

}  // namespace easel::placement
