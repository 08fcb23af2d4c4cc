// PlacedUNet (see placed_unet.h).
#include "models/sd/placed_unet.h"

#include "core/log.h"
#include "models/sd/unet_row_split.h"

namespace easel::models::sd {

using placement::ModuleCosts;
using placement::ModulePlan;
using placement::PModule;

namespace {

/// The UNet's inputs at batch n, latent h x w, `tokens` context tokens, from host buffers
/// (SDXL: the pooled text embeddings `te` [n, add_text_dim] and time ids `ids` [n, add_time_ids]).
std::function<UNetInputs(runtime::GraphBuilder&)> unet_inputs(const UNetConfig& cfg, int64_t n, int64_t h, int64_t w,
                                                              int64_t tokens, std::span<const float> x, std::span<const float> t,
                                                              std::span<const float> c, std::span<const float> te = {},
                                                              std::span<const float> ids = {}) {
    return [=, &cfg](runtime::GraphBuilder& g) {
        UNetInputs in;
        in.sample = g.input_f32("sample", {w, h, cfg.in_channels, n}, x);
        in.timestep = g.input_f32("timestep", {n}, t);
        in.context = g.input_f32("context", {cfg.context_dim, tokens, n}, c);
        if (cfg.has_add_embedding) {
            in.text_embeds = g.input_f32("text_embeds", {cfg.add_text_dim, n}, te);
            in.time_ids = g.input_f32("time_ids", {cfg.add_time_ids, n}, ids);
        }
        return in;
    };
}

std::vector<ggml_tensor*> unet_output(ggml_tensor*& o) { return {o}; }

/// --split-mode row: the UNet's transformer blocks split on ggml's meta device (unet_row_split.h).
std::shared_ptr<const placement::RowSplitRules> unet_row_rules(const UNetConfig& cfg, const UNet2DCondition& net) {
    std::vector<const nn::Block*> blocks;
    for (int i = 0; i < net.n_blocks(); ++i) blocks.push_back(&net.block_params(i));
    return unet_row_split_rules(cfg, net, blocks);
}

std::string unet_label(int blocks, int64_t n, int64_t cin, int64_t h, int64_t w) {
    return fmt::format("UNet {} blocks, latent {}x{}x{}x{}", blocks, n, cin, h, w);
}

}  // namespace

ModuleCosts unet_costs(const io::WeightIndex& index, const UNetConfig& cfg, nn::LoadOptions lo, int threads, bool flash_attn,
                       int64_t n, int64_t h, int64_t w, int64_t tokens) {
    struct Keep {
        UNetConfig cfg;
        nn::TensorSource src;
        UNet2DCondition net;
        std::vector<float> x, t, c, te, ids;
        Keep(const io::WeightIndex& i, const UNetConfig& k) : cfg(k), src(make_unet_source(i, k)), net(k) {}
    };
    auto k = std::make_shared<Keep>(index, cfg);
    k->x.resize((size_t)(n * cfg.in_channels * h * w));
    k->t.resize((size_t)n);
    k->c.resize((size_t)(n * tokens * cfg.context_dim));
    k->te.resize((size_t)(n * cfg.add_text_dim));
    k->ids.resize((size_t)(n * cfg.add_time_ids));
    auto mk = unet_inputs(k->cfg, n, h, w, tokens, k->x, k->t, k->c, k->te, k->ids);  // spans into k, kept alive by the costs
    const std::string label = unet_label(k->net.n_blocks(), n, cfg.in_channels, h, w);
    return runtime::self_contained_costs<UNetInputs, UNetState, ggml_tensor*>(PModule::Diffusion, k, k->net, k->net, k->src, std::move(lo),
                                                                                 threads, flash_attn, mk, unet_output, label,
                                                                                 unet_row_rules(k->cfg, k->net));
}

PlacedUNet::PlacedUNet(const io::WeightIndex& index, const UNetConfig& cfg, nn::LoadOptions lo, placement::PlacementSpec spec,
                       int threads, bool flash_attn)
    : cfg_(cfg), src_(make_unet_source(index, cfg)), net_(std::make_unique<UNet2DCondition>(cfg)),
      placed_(*net_, *net_, src_, std::move(lo), PModule::Diffusion, std::move(spec), threads, flash_attn) {
    placed_.set_row_split(unet_row_rules(cfg_, *net_));
}

PlacedUNet::~PlacedUNet() = default;

ModulePlan PlacedUNet::plan(int64_t n, int64_t h, int64_t w, int64_t tokens) {
    std::vector<float> x((size_t)(n * cfg_.in_channels * h * w)), t((size_t)n), c((size_t)(n * tokens * cfg_.context_dim));
    std::vector<float> te((size_t)(n * cfg_.add_text_dim)), ids((size_t)(n * cfg_.add_time_ids));
    return placed_.plan(unet_inputs(cfg_, n, h, w, tokens, x, t, c, te, ids), unet_output, unet_label(net_->n_blocks(), n, cfg_.in_channels, h, w));
}

void PlacedUNet::run(std::span<const float> x, int64_t n, int64_t h, int64_t w, std::span<const float> t, std::span<const float> context,
                     int64_t tokens, std::span<float> out, std::span<const float> text_embeds, std::span<const float> time_ids) {
    if (cfg_.has_add_embedding &&
        ((int64_t)text_embeds.size() != n * cfg_.add_text_dim || (int64_t)time_ids.size() != n * cfg_.add_time_ids))
        fail(ErrorKind::InvalidInput, "SDXL UNet: {} pooled values and {} time ids for a batch of {}; expected {} and {} per sample",
             text_embeds.size(), time_ids.size(), n, cfg_.add_text_dim, cfg_.add_time_ids);
    auto res = placed_.run({n, h, w, tokens}, unet_inputs(cfg_, n, h, w, tokens, x, t, context, text_embeds, time_ids), unet_output,
                           unet_label(net_->n_blocks(), n, cfg_.in_channels, h, w));
    if (res.at(0).data.size() != out.size())
        fail(ErrorKind::InvalidInput, "UNet output has {} values, the buffer {}", res[0].data.size(), out.size());
    std::copy(res[0].data.begin(), res[0].data.end(), out.begin());
}

std::map<std::string, uint64_t> PlacedUNet::peaks() const { return placed_.peaks(); }

void PlacedUNet::begin_phase() { placed_.begin_phase(); }

void PlacedUNet::end_phase() { placed_.end_phase(); }

}  // namespace easel::models::sd
