// easel-bench-placement: step time of the full-size SD1.5 UNet with its weights resident on the
// device vs held in host RAM and streamed to the device block by block (--stream-layers), at
// 512x512 and 1024x1024 (latent 64x64 and 128x128), batch 2 (a CFG step). The figure is the
// ratio streamed / resident (issue 5 aims for under 1.3 on a GPU).
//
// Weights are made up (F16 file written to a temporary folder, values uniform in
// +-1/sqrt(fan_in), norms 1/0) and loaded through the placement runtime exactly as
// `easel generate --params-backend diffusion=cpu --stream-layers` loads them.
//
//   easel-bench-placement --device CUDA0 [--sizes 512,1024] [--reps 3] [--warmup 1]
//                         [--budget-mib N] [--ring 4,8] [--json out.json] [--tmp-dir DIR]
//
// --budget-mib caps the device for the streamed run (default: the smallest budget that
// streams every block: 2 slots of the largest block + the compute buffer + 2 state buffers),
// so the measured ratio is the worst case; a larger budget keeps leading blocks resident.
// --ring K,...: one more streamed run per K with every block streamed through an upload ring of
// K slots (placement::ModulePlacement::stream_slots = K under the budget of K slots + the
// compute buffer + the states): how much a deeper ring hides of the uploads (0: none).
#include "bench_common.h"
#include "core/error.h"
#include "io/weight_index.h"
#include "models/sd/unet.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "runtime/sequence_runner.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace easel::bench;
using namespace easel;
using namespace easel::models::sd;

namespace {

/// The SD1.5 UNet2DConditionModel (diffusers config of runwayml/stable-diffusion-v1-5:
/// block_out_channels [320, 640, 1280, 1280], layers_per_block 2, 8 heads, cross_attention_dim
/// 768; channel bookkeeping of diffusers/models/unets/unet_2d_condition.py __init__).
UNetConfig sd15() {
    UNetConfig c;
    const std::vector<int64_t> ch{320, 640, 1280, 1280};
    const int64_t temb = 1280, ctx = 768;
    c.in_channels = c.out_channels = 4;
    c.model_channels = c.time_proj_dim = ch[0];
    c.time_embed_dim = temb;
    c.context_dim = ctx;
    c.layers_per_block = 2;
    auto attn = [&](int64_t C) {
        TransformerSpec t;
        t.channels = t.inner = C;
        t.depth = 1;
        t.heads = 8;
        t.head_dim = C / 8;
        t.context_dim = ctx;
        t.ff_inner = 4 * C;
        t.linear_proj = false;
        return t;
    };
    auto res = [&](int64_t in, int64_t out) { return ResnetSpec{in, out, temb, in != out}; };
    int64_t prev = ch[0];
    for (size_t b = 0; b < ch.size(); ++b) {
        DownBlockSpec d;
        for (int j = 0; j < 2; ++j) {
            d.resnets.push_back(res(j == 0 ? prev : ch[b], ch[b]));
            if (b + 1 < ch.size()) d.attentions.push_back(attn(ch[b]));
        }
        d.downsample = b + 1 < ch.size();
        prev = ch[b];
        c.down.push_back(d);
    }
    c.mid.present = true;
    c.mid.resnets = {res(ch.back(), ch.back()), res(ch.back(), ch.back())};
    c.mid.attentions = {attn(ch.back())};
    const std::vector<int64_t> rev(ch.rbegin(), ch.rend());
    prev = rev[0];
    for (size_t i = 0; i < rev.size(); ++i) {
        UpBlockSpec u;
        const int64_t out = rev[i], input = rev[std::min(i + 1, rev.size() - 1)];
        for (int j = 0; j <= 2; ++j) {
            u.resnets.push_back(res((j == 0 ? prev : out) + (j == 2 ? input : out), out));
            if (i > 0) u.attentions.push_back(attn(out));
        }
        u.upsample = i + 1 < rev.size();
        prev = out;
        c.up.push_back(u);
    }
    return c;
}

/// Writes every parameter of `root` as F16 into a safetensors file (u64 LE header length, JSON
/// header, data; github.com/huggingface/safetensors). Values: see the file comment.
void write_weights(nn::Block& root, const fs::path& path) {
    struct T {
        std::string name;
        std::vector<int64_t> shape;
        nn::ParamRole role;
    };
    std::vector<T> ts;
    root.visit_params("", [&](const std::string& n, nn::Param& p) { ts.push_back({n, p.shape, p.role}); });
    json h = json::object();
    uint64_t off = 0;
    for (auto& t : ts) {
        uint64_t n = 1;
        for (auto d : t.shape) n *= (uint64_t)d;
        h[t.name] = {{"dtype", "F16"}, {"shape", t.shape}, {"data_offsets", {off, off + 2 * n}}};
        off += 2 * n;
    }
    std::string hs = h.dump();
    while (hs.size() % 8) hs += ' ';
    std::ofstream f(path, std::ios::binary);
    if (!f) fail(ErrorKind::Io, "cannot create {}; choose another folder with --tmp-dir", path.string());
    uint64_t len = hs.size();
    f.write((const char*)&len, 8);
    f.write(hs.data(), (std::streamsize)hs.size());
    std::mt19937 rng(1);
    std::vector<float> v;
    std::vector<ggml_fp16_t> half;
    for (auto& t : ts) {
        int64_t n = 1, fan_in = 1;
        for (auto d : t.shape) n *= d;
        for (size_t i = 1; i < t.shape.size(); ++i) fan_in *= t.shape[i];
        v.resize((size_t)n);
        const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
        if (t.role == nn::ParamRole::Norm) std::fill(v.begin(), v.end(), bias ? 0.0f : 1.0f);
        else {
            const float s = (t.role == nn::ParamRole::Weight || t.role == nn::ParamRole::ConvWeight) ? 1.0f / std::sqrt((float)fan_in) : 0.01f;
            std::uniform_real_distribution<float> u(-s, s);
            for (auto& x : v) x = u(rng);
        }
        half.resize(v.size());
        ggml_fp32_to_fp16_row(v.data(), half.data(), (int64_t)v.size());
        f.write((const char*)half.data(), (std::streamsize)(half.size() * 2));
    }
    if (!f) fail(ErrorKind::Io, "writing {} failed (disk full?)", path.string());
}


}  // namespace

int main(int argc, char** argv) try {
    CLI::App app{"easel-bench-placement: SD1.5 UNet step time, weights resident vs streamed from host RAM"};
    std::string device = "auto", sizes = "512,1024", json_out, tmp_dir, rpc;
    int reps = 3, warmup = 1, threads = 0;
    double budget_mib = 0;
    std::string rings = "4,8";
    app.add_option("--device", device, "runtime device (default: first GPU, else CPU)");
    app.add_option("--sizes", sizes, "image sizes in pixels (square), comma-separated (default 512,1024)");
    app.add_option("--reps", reps, "timed steps per case (default 3)");
    app.add_option("--warmup", warmup, "untimed steps first (default 1)");
    app.add_option("--budget-mib", budget_mib, "device budget of the streamed run (default: the minimum that streams every block)");
    app.add_option("--ring", rings, "upload ring depths K for extra runs with every block streamed through K slots, comma-separated (default 4,8; 0 = none)");
    app.add_option("--threads", threads, "CPU threads (default: all)");
    app.add_option("--rpc-servers", rpc, "RPC servers host:port,... (devices RPC0...)");
    app.add_option("--json", json_out, "write the results here");
    app.add_option("--tmp-dir", tmp_dir, "folder for the temporary weight file (default: system temp)");
    CLI11_PARSE(app, argc, argv);

    placement::init_backends();
    if (!rpc.empty()) placement::add_rpc_servers(rpc);
    const std::string dev = placement::resolve_device(device, placement::device_names());
    const fs::path file = (tmp_dir.empty() ? fs::temp_directory_path() : fs::path(tmp_dir)) /
                          fmt::format("easel-bench-placement-{}.safetensors", (long)getpid());
    struct Rm {
        fs::path p;
        ~Rm() {
            std::error_code ec;
            fs::remove(p, ec);
        }
    } rm{file};
    UNet2DCondition net(sd15());
    write_weights(net, file);
    io::WeightIndex idx = io::WeightIndex::open(file);
    nn::TensorSource src = make_unet_source(idx, net.config());
    nn::LoadOptions lo;
    lo.weight_type = GGML_TYPE_F16;

    json results = json::array();
    std::string rest = sizes;
    while (!rest.empty()) {
        size_t comma = rest.find(',');
        const int size = std::stoi(rest.substr(0, comma));
        rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
        const int64_t lat = size / 8;
        std::mt19937 rng(2);
        std::normal_distribution<float> nd;
        std::vector<float> sample((size_t)(lat * lat * 4 * 2)), ctx((size_t)(768 * 77 * 2)), t{981.0f, 981.0f};
        for (auto& x : sample) x = nd(rng);
        for (auto& x : ctx) x = nd(rng);
        auto mk = [&](runtime::GraphBuilder& g) {
            UNetInputs in;
            in.sample = g.input_f32("sample", {lat, lat, 4, 2}, sample);
            in.timestep = g.input_f32("timestep", {2}, t);
            in.context = g.input_f32("context", {768, 77, 2}, ctx);
            return in;
        };
        auto sel = [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; };
        json row;
        row["size"] = size;
        row["device"] = dev;
        row["ring"] = json::array();
        std::vector<float> first;
        // cases: resident, streamed (the planner's plan under the budget), then every block
        // streamed through a ring of K slots for each K of --ring
        std::vector<int> cases{0, 2};
        for (size_t a = 0; a < rings.size();) {
            size_t b = rings.find(',', a);
            if (b == std::string::npos) b = rings.size();
            const int k = std::stoi(rings.substr(a, b - a));
            if (k >= 2) cases.push_back(-k);
            a = b + 1;
        }
        for (int kase : cases) {
            const bool stream = kase != 0;
            const int ring_k = kase < 0 ? -kase : 0;
            runtime::SequenceRunner<UNetInputs, UNetState, ggml_tensor*> r(net, net, src, lo, threads);
            auto costs = r.costs(mk, sel, "SD1.5 UNet");
            placement::ModulePlacement place;
            place.devices = {dev};
            std::map<std::string, uint64_t> budgets;
            if (stream) {
                place.params = "CPU";
                uint64_t maxb = 0, comp = 0, state = 0;
                for (int i = 0; i < net.n_blocks(); ++i) {
                    maxb = std::max(maxb, costs.block_bytes[(size_t)i] + (i == 0 || i + 1 == net.n_blocks() ? costs.prologue_bytes : 0));
                    comp = std::max(comp, costs.measure(i, i + 1, i == 0, i + 1 == net.n_blocks(), dev));
                    if (i > 0) state = std::max(state, costs.state_bytes(i));
                }
                // the smallest budget that streams every block: 2 slots + compute + 2 state buffers (+ slack);
                // a ring of K: K slots (+ the plan's 8 KiB slack each)
                budgets[dev] = ring_k ? (uint64_t)ring_k * (maxb + (8 << 10)) + comp + 2 * state + (1 << 20)
                               : budget_mib > 0 ? (uint64_t)(budget_mib * 1048576.0)
                                                : 2 * maxb + comp + 2 * state + (1 << 20);
                place.stream_slots = ring_k;
            }
            auto plan = placement::plan_module(placement::PModule::Diffusion, place, stream, costs, budgets);
            std::printf("%s", placement::format_plan({plan}).c_str());
            r.load(plan);
            r.begin_phase();
            std::vector<double> times;
            std::vector<float> out;
            for (int i = 0; i < warmup + reps; ++i) {
                auto t0 = Clock::now();
                out = r.run(mk, sel).at(0).data;
                if (i >= warmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
            }
            r.end_phase();
            int streamed = 0;
            for (auto& s : plan.segments) streamed += s.per_eval;
            const std::string key = !stream ? "resident" : ring_k ? fmt::format("ring{}", ring_k) : "streamed";
            json res = {{"median_s", median(times)}, {"times_s", times}, {"segments", plan.segments.size()}, {"streamed_segments", streamed},
                        {"slots", plan.devices[0].slot_count}, {"budget_bytes", plan.devices[0].budget},
                        {"predicted_bytes", plan.devices[0].total()}, {"measured_peak_bytes", r.peaks().at(dev)},
                        {"prefetched_uploads", r.prefetched_uploads()}, {"max_uploaded_ahead", r.max_uploaded_ahead()}};
            if (!stream) first = out;
            else {
                float m = 0;
                for (size_t k = 0; k < out.size(); ++k) m = std::max(m, std::fabs(out[k] - first[k]));
                res[ring_k ? "max_abs_diff_vs_resident" : "max_abs_diff_streamed_vs_resident"] = m;
                if (!ring_k) row["max_abs_diff_streamed_vs_resident"] = m;
                res["ratio"] = median(times) / row["resident"]["median_s"].get<double>();
            }
            fmt::print("  {}x{} {:<8} median {:.3f} s/step ({} segments, {} streamed, {} slots, peak {:.1f} MiB of predicted {:.1f}){}\n", size,
                       size, key, median(times), plan.segments.size(), streamed, plan.devices[0].slot_count, r.peaks().at(dev) / 1048576.0,
                       plan.devices[0].total() / 1048576.0, stream ? fmt::format(", {:.3f} x resident", res["ratio"].get<double>()) : "");
            if (ring_k) {
                res["ring_slots"] = ring_k;
                row["ring"].push_back(res);
            } else {
                row[key] = res;
            }
        }
        row["ratio"] = row["streamed"]["median_s"].get<double>() / row["resident"]["median_s"].get<double>();
        fmt::print("  {}x{} streamed / resident = {:.3f}\n", size, size, row["ratio"].get<double>());
        results.push_back(row);
    }
    if (!json_out.empty()) std::ofstream(json_out) << json{{"bench", "placement"}, {"results", results}}.dump(2) << "\n";
    return 0;
} catch (const easel::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
