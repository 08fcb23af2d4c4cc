// taesd_decoder_costs and taesd_spec (see placed_taesd.h).
#include "models/vae/placed_taesd.h"

#include "core/error.h"
#include "models/vae/taesd.h"
#include "placement/devices.h"
#include "runtime/graph_flops.h"

#include <fmt/format.h>
#include <ggml-alloc.h>
#include <ggml-backend.h>

#include <map>
#include <memory>
#include <mutex>

namespace easel::vae {

namespace {

/// The decoder tree with its parameters bound to a host buffer (for building graphs only).
struct TaesdKeep {
    std::unique_ptr<vae::TaesdSequential> seq;
    nn::ParamBuffer host;
    std::map<std::string, uint64_t> measured;  // compute bytes per device (the graph is fixed)
    double flops = -1;                         // FLOPs of the decode graph, counted on first use
    std::mutex mu;
};

/// Builds the decode graph of a {w, h, L, 1} latent as vae::run_image_graph does (one no_alloc
/// context, input and output flagged) and calls f(graph).
template <class F>
void with_graph(const vae::TaesdSequential& seq, int64_t h, int64_t w, F&& f) {
    const size_t graph_size = 16384;  // vae::ExecOptions::graph_size's default
    ggml_init_params ip{};
    ip.mem_size = ggml_tensor_overhead() * graph_size + ggml_graph_overhead_custom(graph_size, false);
    ip.no_alloc = true;
    std::unique_ptr<ggml_context, decltype(&ggml_free)> ctx(ggml_init(ip), &ggml_free);
    if (!ctx) fail(ErrorKind::OutOfMemory, "cannot allocate a ggml context of {} bytes for the TAESD graph", ip.mem_size);
    ggml_tensor* x = ggml_new_tensor_4d(ctx.get(), GGML_TYPE_F32, w, h, seq.in_channels(), 1);
    ggml_set_name(x, "vae_input");
    ggml_set_input(x);
    nn::Ctx c{ctx.get(), false};
    ggml_tensor* out = seq.forward(c, x);
    ggml_set_name(out, "vae_output");
    ggml_set_output(out);
    ggml_cgraph* gf = ggml_new_graph_custom(ctx.get(), graph_size, false);
    ggml_build_forward_expand(gf, out);
    f(gf);
}

/// Compute buffer bytes of the decode graph (with_graph) on `device`, allocated with ggml_gallocr
/// on the device's buffer type.
uint64_t measure_graph(const vae::TaesdSequential& seq, int64_t h, int64_t w, const std::string& device) {
    ggml_backend_dev_t dev = placement::find_device(device);
    if (!dev) fail(ErrorKind::InvalidInput, "TAESD costs: no device named '{}'; see `easel devices`", device);
    size_t size = 0;
    with_graph(seq, h, w, [&](ggml_cgraph* gf) {
        std::unique_ptr<ggml_gallocr, decltype(&ggml_gallocr_free)> ga(ggml_gallocr_new(ggml_backend_dev_buffer_type(dev)),
                                                                       &ggml_gallocr_free);
        ggml_gallocr_reserve_n_size(ga.get(), gf, nullptr, nullptr, &size);
    });
    return size;
}

}  // namespace

placement::ModuleCosts taesd_decoder_costs(const io::WeightIndex& index, int64_t h, int64_t w, bool conv_direct) {
    if (h <= 0 || w <= 0) fail(ErrorKind::InvalidInput, "TAESD decoder costs: empty latent {}x{}", w, h);
    const vae::TaesdSource s = vae::find_taesd(index);
    if (!s.decoder_prefix) fail(ErrorKind::ModelMismatch, "--taesd: the file holds no TAESD decoder");
    auto k = std::make_shared<TaesdKeep>();
    k->seq = std::make_unique<vae::TaesdSequential>(vae::parse_taesd_layers(index, *s.decoder_prefix, vae::TaesdPart::Decoder),
                                                    vae::TaesdPart::Decoder);
    nn::set_conv_direct(*k->seq, conv_direct);
    nn::TensorSource ts(index, *s.decoder_prefix);
    nn::LoadOptions lo;  // as TinyAutoencoder::load
    lo.check_unexpected = false;
    lo.weight_type = GGML_TYPE_F32;
    placement::ModuleCosts c;
    c.module = placement::PModule::Vae;
    const int f = k->seq->spatial_factor();
    c.label = fmt::format("TAESD decoder {} layers, latent 1x{}x{}x{} -> {}x{} px", k->seq->layers().size(), k->seq->in_channels(), h, w,
                          h * f, w * f);
    c.block_bytes = {nn::param_bytes(*k->seq, ts, lo)};
    c.prologue_bytes = 0;
    k->host = nn::ParamBuffer::allocate(*k->seq, ggml_backend_cpu_buffer_type());
    c.measure = [k, h, w](int, int, bool, bool, const std::string& device) -> uint64_t {
        std::lock_guard<std::mutex> g(k->mu);
        auto it = k->measured.find(device);
        if (it == k->measured.end()) it = k->measured.emplace(device, measure_graph(*k->seq, h, w, device)).first;
        return it->second;
    };
    // one graph, one block: every range that holds the block is the whole decode
    c.flops = [k, h, w](int b, int e, bool, bool) -> double {
        if (e <= b) return 0.0;
        std::lock_guard<std::mutex> g(k->mu);
        if (k->flops < 0) with_graph(*k->seq, h, w, [&](ggml_cgraph* gf) { k->flops = runtime::graph_flops(gf); });
        return k->flops;
    };
    c.latent_h = h;
    c.latent_w = w;
    return c;
}

placement::PlacementSpec taesd_spec(const placement::PlacementSpec& spec, std::optional<std::string>* warning) {
    placement::PlacementSpec r = spec;
    placement::ModulePlacement& v = r[placement::PModule::Vae];
    if (v.devices.empty()) return r;
    if (v.devices.size() >= 2 && warning) *warning = fmt::format("TAESD runs whole on {}: it is too small to split", v.devices.front());
    v.devices.resize(1);
    v.params.clear();
    v.split = placement::SplitMode::Layer;
    return r;
}

}  // namespace easel::vae
