// easel-bench-flux: one denoising step of a full-size FLUX DiT with made-up weights, timed like
// easel-bench (bench/README.md: median of --reps after --warmup runs).
//
//   --model flux1 (default): FLUX.1-dev architecture (diffusers FluxTransformer2DModel config of
//       black-forest-labs/FLUX.1-dev: hidden 3072 = 24 heads x 128, 19 double + 38 single blocks,
//       MLP 12288, in/out 64 (16 latent channels x 2x2), T5-XXL context width 4096, pooled CLIP-L
//       768, guidance embedding, RoPE axes (16, 56, 56)); context of --tokens (default 512) T5
//       tokens, guidance 3.5. About 11.9 B parameters.
//   --model flux2: FLUX.2 [klein] 9B architecture (Flux2Transformer2DModel: hidden 4096 = 32 heads
//       x 128, 8 double + 24 single blocks, mlp_ratio 3, in/out 128 (32 latent channels x 2x2),
//       context width 12288 = 3 x Qwen3-8B hidden 4096, no guidance embedding, no biases, RoPE
//       axes (32, 32, 32, 32), theta 2000); --tokens (default 512) text tokens.
// At --size 1024 the latent is (size/8)^2 cells packed 2x2 into (size/16)^2 = 4096 image tokens.
//
// The bench builds the tree with easel's model code (models/flux/flux_dit.h, flux2_dit.h), writes
// every parameter under its diffusers name as BF16 (the released checkpoints' type) from a
// fixed-seed generator to a temporary safetensors file (--tmp-dir; about 24 GB for FLUX.1-dev,
// 18 GB for klein 9B), and loads it through the ordinary load path (FluxDiTModel::load: the
// configuration inferred from the weights), matmul weights kept BF16 or converted to Q8_0
// (--type, as `easel generate --type q8_0`). One step = one transformer evaluation, batch 1
// (FLUX.1-dev is guidance-distilled: no CFG batch), t = 0.5.
//
// Values: matmul weights uniform in +-1/sqrt(fan_in), biases uniform in +-0.02, norm scales 1;
// inputs uniform in +-1. The output statistics show whether anything overflowed (non_finite 0).
#include "bench_common.h"
#include "full_size_configs.h"
#include "made_up_weights.h"
#include "core/error.h"
#include "easel_version.h"
#include "io/weight_index.h"
#include "models/flux/flux2_dit.h"
#include "models/flux/flux_dit.h"
#include "placement/devices.h"
#include "runtime/graph_runner.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <ggml-backend.h>
#include <ggml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using namespace easel;
namespace fs = std::filesystem;
namespace flux = easel::models::flux;
using json = nlohmann::json;
using namespace easel::bench;

int main_impl(int argc, char** argv) {
    std::string device, type = "bf16", json_path, tmp_dir, weights_file, model_name = "flux1";
    int threads = 0, reps = 3, warmup = 1, tokens = 512, size = 1024, dbl = -1, sgl = -1;
    bool fa = false;
    uint64_t seed = 1;
    CLI::App app{"easel-bench-flux: one FLUX DiT step (full-size FLUX.1-dev or FLUX.2 klein 9B architecture) with made-up weights"};
    app.add_option("--model", model_name, "flux1 (FLUX.1-dev, default) or flux2 (FLUX.2 klein 9B)")->check(CLI::IsMember({"flux1", "flux2"}));
    app.add_option("--device", device, "ggml device name (see `easel devices`); default: the first GPU, else the CPU");
    app.add_option("-t,--threads", threads, "CPU threads (0: all hardware threads)")->check(CLI::NonNegativeNumber);
    app.add_option("--reps", reps, "timed repetitions after the warm-up runs (default 3)")->check(CLI::Range(1, 1000));
    app.add_option("--warmup", warmup, "untimed warm-up runs (default 1)")->check(CLI::Range(0, 100));
    app.add_option("--type", type, "matmul weight type: bf16 (as stored) or q8_0 (default bf16)")->check(CLI::IsMember({"bf16", "q8_0"}));
    app.add_option("--size", size, "image side in pixels, a multiple of 16 (default 1024)")->check(CLI::Range(16, 4096));
    app.add_option("--tokens", tokens, "text tokens (default 512)")->check(CLI::Range(1, 4096));
    app.add_option("--double", dbl, "double-stream blocks (default: the real model's; fewer for a quick check)")->check(CLI::Range(0, 64));
    app.add_option("--single", sgl, "single-stream blocks (default: the real model's)")->check(CLI::Range(0, 128));
    app.add_flag("--fa", fa, "flash attention where the backend supports it");
    app.add_option("--json", json_path, "write the results as JSON to this file");
    app.add_option("--tmp-dir", tmp_dir, "folder for the temporary made-up weight file (default: the system temp folder)");
    app.add_option("--weights", weights_file, "made-up weight file to reuse: written when absent and then kept, so several runs (e.g. bf16 and q8_0) share it; it must have been made with the same architecture options")->check(CLI::NonexistentPath | CLI::ExistingFile);
    app.add_option("--seed", seed, "seed of the made-up weights and inputs (default 1)");
    CLI11_PARSE(app, argc, argv);
    if (size % 16 != 0) fail(ErrorKind::InvalidInput, "--size {} is not a multiple of 16 (8 pixels per latent cell, 2x2 packing)", size);
    const bool f1 = model_name == "flux1";
    if (dbl < 0) dbl = f1 ? 19 : 8;
    if (sgl < 0) sgl = f1 ? 38 : 24;

    placement::init_backends();
    ggml_backend_dev_t dev = nullptr;
    if (!device.empty()) dev = placement::find_device(device);
    else if (!(dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU))) dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    fmt::print("easel-bench-flux: {} on device {} ({}), {}x{}, {} text tokens, {} double + {} single blocks, {} weights, fa {}, {} reps, "
               "ggml {}\n",
               f1 ? "FLUX.1-dev" : "FLUX.2 klein 9B", ggml_backend_dev_name(dev), ggml_backend_dev_description(dev), size, size, tokens,
               dbl, sgl, type, fa ? "on" : "off", reps, EASEL_GGML_COMMIT);

    runtime::GraphRunner run(dev, threads);
    const fs::path dir = tmp_dir.empty() ? fs::temp_directory_path() : fs::path(tmp_dir);
    TempFile tmp;
    const fs::path wpath = weights_file.empty() ? dir / fmt::format("easel-bench-flux-{}.safetensors", (long)getpid()) : fs::path(weights_file);
    if (weights_file.empty()) tmp.path = wpath;
    const bool reuse = !weights_file.empty() && fs::exists(wpath);
    auto t0 = Clock::now();
    int64_t count;
    if (f1) {
        flux::FluxDiT shape_only(flux1_dev_config(dbl, sgl));
        count = reuse ? count_params(shape_only) : write_made_up_bf16(wpath, shape_only, seed, "easel-bench-flux made-up weights");
    } else {
        flux::Flux2DiT shape_only(klein9b_config(dbl, sgl));
        count = reuse ? count_params(shape_only) : write_made_up_bf16(wpath, shape_only, seed, "easel-bench-flux made-up weights");
    }
    const double write_s = seconds_since(t0);
    t0 = Clock::now();
    io::WeightIndex idx = io::WeightIndex::open(wpath);
    nn::LoadOptions lo;
    lo.weight_type = type == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_COUNT;
    flux::FluxDiTModel m1;
    flux::Flux2DiTModel m2;
    size_t param_bytes;
    if (f1) {
        m1 = flux::FluxDiTModel::load(idx, run.buffer_type(), lo);
        param_bytes = m1.params.size();
    } else {
        m2 = flux::Flux2DiTModel::load(idx, run.buffer_type(), lo);
        param_bytes = m2.params.size();
    }
    const double load_s = seconds_since(t0);
    fmt::print("  {} parameters ({:.1f} MiB loaded); written in {:.1f} s, loaded in {:.1f} s\n", count, param_bytes / 1048576.0, write_s,
               load_s);

    // inputs: packed latent tokens, text features, ids -> rotary tables
    const int64_t side = size / 16, Li = side * side, Lt = tokens;
    const int64_t C = f1 ? m1.module->config().in_channels : m2.module->config().in_channels;
    const int64_t J = f1 ? m1.module->config().joint_dim : m2.module->config().joint_dim;
    const std::vector<int>& axes = f1 ? m1.module->config().axes_dims : m2.module->config().axes_dims;
    const double theta = f1 ? m1.module->config().theta : m2.module->config().theta;
    std::vector<float> img = uniform_values(size_t(C * Li), seed ^ 0x5eedull), txt = uniform_values(size_t(J * Lt), seed ^ 0x7e77ull);
    std::vector<float> pooled = uniform_values(768, seed ^ 0x9001ull), t{0.5f}, g{3.5f};
    std::vector<float> ids;
    if (f1) {
        ids.assign(size_t(Lt * 3), 0.0f);
        auto im = flux::flux1_image_ids(side, side);
        ids.insert(ids.end(), im.begin(), im.end());
    } else {
        ids = flux::flux2_text_ids(Lt);
        auto im = flux::flux2_image_ids(side, side);
        ids.insert(ids.end(), im.begin(), im.end());
    }
    const flux::RopeTables rope = flux::rope_tables(ids, Lt + Li, axes, theta);

    auto once = [&]() {
        return run.run([&](runtime::GraphBuilder& gb) {
            nn::Ctx c{gb.ctx(), fa, gb.backend()};
            ggml_tensor* x = gb.input_f32("img", {C, Li, 1}, img);
            ggml_tensor* y = gb.input_f32("txt", {J, Lt, 1}, txt);
            ggml_tensor* ts = gb.input_f32("t", {1}, t);
            ggml_tensor* cs = gb.input_f32("cos", {rope.half_dim, rope.tokens}, rope.cos);
            ggml_tensor* sn = gb.input_f32("sin", {rope.half_dim, rope.tokens}, rope.sin);
            if (f1) {
                flux::FluxInputs in{x, y, gb.input_f32("pooled", {768, 1}, pooled), ts, gb.input_f32("g", {1}, g), cs, sn};
                return std::vector<ggml_tensor*>{m1.module->forward(c, in).sample};
            }
            flux::Flux2Inputs in{x, y, ts, nullptr, cs, sn};
            return std::vector<ggml_tensor*>{m2.module->forward(c, in).sample};
        });
    };
    std::vector<double> warm, times;
    std::vector<runtime::HostTensor> out;
    for (int i = 0; i < warmup; ++i) {
        t0 = Clock::now();
        out = once();
        warm.push_back(seconds_since(t0));
    }
    for (int i = 0; i < reps; ++i) {
        t0 = Clock::now();
        out = once();
        times.push_back(seconds_since(t0));
    }
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double med = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    const std::string what = f1 ? "flux1_dev_dit_step" : "flux2_klein9b_dit_step";
    json r = {{"what", what},
              {"type", type},
              {"flash_attn", fa},
              {"median_s", med},
              {"min_s", sorted.front()},
              {"times_s", times},
              {"warmup_s", warm},
              {"compute_bytes", run.last_compute_bytes()},
              {"param_bytes", param_bytes},
              {"param_count", count},
              {"blocks", {{"double", dbl}, {"single", sgl}}},
              {"input", fmt::format("{} image tokens x {} ({}x{} px), {} text tokens x {}, t 0.5{}, batch 1", Li, C, size, size, Lt, J,
                                    f1 ? ", guidance 3.5" : "")},
              {"output", output_stats(out.at(0).data)},
              {"write_s", write_s},
              {"load_s", load_s}};
    fmt::print("  {} {:<5} median {:.3f} s/it over {} reps; params {:.1f} MiB; compute buffer {:.1f} MiB; output mean {:.4g} std {:.4g}, "
               "non-finite {}\n",
               what, type, med, reps, param_bytes / 1048576.0, run.last_compute_bytes() / 1048576.0, r["output"]["mean"].get<double>(),
               r["output"]["std"].get<double>(), r["output"]["non_finite"].get<int64_t>());
    if (!json_path.empty()) {
        std::string command_line;
        for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);
        char host[256] = {};
        gethostname(host, sizeof host - 1);
        json doc = {{"easel_version", EASEL_VERSION},
                    {"command_line", command_line},
                    {"host", host},
                    {"ggml_commit", EASEL_GGML_COMMIT},
                    {"date", utc_now()},
                    {"device", {{"name", ggml_backend_dev_name(dev)}, {"description", ggml_backend_dev_description(dev)}}},
                    {"threads", threads},
                    {"results", json::array({r})}};
        std::ofstream f(json_path);
        f << doc.dump(2) << "\n";
        if (!f) fail(ErrorKind::Io, "cannot write {}", json_path);
        fmt::print("results written to {}\n", json_path);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return main_impl(argc, argv);
    } catch (const easel::Error& e) {
        std::fprintf(stderr, "easel-bench-flux: %s\n", e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "easel-bench-flux: %s\n", e.what());
        return 1;
    }
}
