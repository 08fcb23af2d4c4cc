// easel-bench-zimage: one denoising step of the full-size Z-Image transformer (Z-Image-Turbo
// architecture, diffusers ZImageTransformer2DModel config: dim 3840, 30 layers, 2 noise + 2
// context refiner layers, 30 heads of 128, SwiGLU hidden 10240, caption width 2560 (Qwen3-4B),
// 16 latent channels, patch 2) with made-up weights, timed like easel-bench (bench/README.md:
// median of --reps after --warmup runs).
//
// The bench builds the tree with easel's model code (models/zimage/z_image_dit.h), lists its
// parameters under the diffusers names, writes them as BF16 (the released checkpoints' type) from
// a fixed-seed generator to a temporary safetensors file (about 12.3 GB for the 6.15 B parameters;
// --tmp-dir), and loads it through the ordinary load path (LoadedZImageDiT::load: configuration
// inferred from the weights) with matmul weights kept BF16 or converted to Q8_0 (--type, as
// `easel generate --type q8_0`). One step = one transformer evaluation (Z-Image-Turbo runs without
// CFG): latent 16 x (size/8)^2, a caption of --tokens tokens, t = 0.5.
//
// Value distribution: matmul weights uniform in +-1/sqrt(fan_in), biases and pad tokens uniform in
// +-0.02, norm scales 1; inputs uniform in +-1. The output statistics show whether anything
// overflowed (non_finite must be 0).
#include "bench_common.h"
#include "full_size_configs.h"
#include "made_up_weights.h"
#include "core/error.h"
#include "easel_version.h"
#include "io/weight_index.h"
#include "models/zimage/z_image_dit.h"
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
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using namespace easel;
namespace fs = std::filesystem;
namespace zi = easel::models::zimage;
using json = nlohmann::json;
using namespace easel::bench;

/// Z-Image's norm scales are 1, except the x/cap pad tokens (Norm role, but embeddings).
bool zimage_ones(const std::string& name, nn::ParamRole role) {
    return role == nn::ParamRole::Norm && name.find("pad_token") == std::string::npos;
}

int main_impl(int argc, char** argv) {
    std::string device, type = "bf16", json_path, tmp_dir, weights_file;
    int threads = 0, reps = 3, warmup = 1, tokens = 128, layers = 30, refiners = 2, size = 1024;
    bool fa = false;
    uint64_t seed = 1;
    CLI::App app{"easel-bench-zimage: one Z-Image transformer step (full-size architecture) with made-up weights"};
    app.add_option("--device", device, "ggml device name (see `easel devices`); default: the first GPU, else the CPU");
    app.add_option("-t,--threads", threads, "CPU threads (0: all hardware threads)")->check(CLI::NonNegativeNumber);
    app.add_option("--reps", reps, "timed repetitions after the warm-up runs (default 3)")->check(CLI::Range(1, 1000));
    app.add_option("--warmup", warmup, "untimed warm-up runs (default 1)")->check(CLI::Range(0, 100));
    app.add_option("--type", type, "matmul weight type: bf16 (as stored) or q8_0 (default bf16)")->check(CLI::IsMember({"bf16", "q8_0"}));
    app.add_option("--size", size, "image side in pixels, a multiple of 16 (default 1024; latent side size/8)")->check(CLI::Range(16, 4096));
    app.add_option("--tokens", tokens, "caption tokens (default 128)")->check(CLI::Range(1, 1024));
    app.add_option("--layers", layers, "main layers (default 30; fewer for a quick check)")->check(CLI::Range(1, 30));
    app.add_option("--refiners", refiners, "noise and context refiner layers each (default 2)")->check(CLI::Range(0, 2));
    app.add_flag("--fa", fa, "flash attention where the backend supports it");
    app.add_option("--json", json_path, "write the results as JSON to this file");
    app.add_option("--tmp-dir", tmp_dir, "folder for the temporary made-up weight file (default: the system temp folder)");
    app.add_option("--weights", weights_file, "made-up weight file to reuse: written when absent and then kept, so several runs (e.g. bf16 and q8_0) share it; it must have been made with the same architecture options")->check(CLI::NonexistentPath | CLI::ExistingFile);
    app.add_option("--seed", seed, "seed of the made-up weights (default 1)");
    CLI11_PARSE(app, argc, argv);
    if (size % 16 != 0) fail(ErrorKind::InvalidInput, "--size {} is not a multiple of 16 (8 pixels per latent cell, patch 2)", size);

    placement::init_backends();
    ggml_backend_dev_t dev = nullptr;
    if (!device.empty()) dev = placement::find_device(device);
    else if (!(dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU))) dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    fmt::print("easel-bench-zimage: device {} ({}), {}x{}, {} caption tokens, {} layers + {}+{} refiners, {} weights, fa {}, {} reps, ggml {}\n",
               ggml_backend_dev_name(dev), ggml_backend_dev_description(dev), size, size, tokens, layers, refiners, refiners, type,
               fa ? "on" : "off", reps, EASEL_GGML_COMMIT);

    // made-up weights through the real load path
    const fs::path dir = tmp_dir.empty() ? fs::temp_directory_path() : fs::path(tmp_dir);
    TempFile tmp;
    const fs::path wpath = weights_file.empty() ? dir / fmt::format("easel-bench-zimage-{}.safetensors", (long)getpid()) : fs::path(weights_file);
    if (weights_file.empty()) tmp.path = wpath;
    const bool reuse = !weights_file.empty() && fs::exists(wpath);
    auto t0 = Clock::now();
    int64_t count;
    {
        zi::ZImageDiT shape_only(turbo_config(layers, refiners));
        count = reuse ? count_params(shape_only) : write_made_up_bf16(wpath, shape_only, seed, "easel-bench-zimage made-up weights", zimage_ones);
    }
    const double write_s = seconds_since(t0);
    t0 = Clock::now();
    io::WeightIndex idx = io::WeightIndex::open(wpath);
    zi::ZImageLoadOptions opt;
    opt.device = dev;
    opt.threads = threads;
    opt.flash_attn = fa;
    opt.weight_type = type == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_COUNT;
    auto model = zi::LoadedZImageDiT::load(idx, opt);
    const double load_s = seconds_since(t0);
    const zi::ZImageDiTConfig& cfg = model->config();
    fmt::print("  {} ({} parameters, {:.1f} MiB loaded); written in {:.1f} s, loaded in {:.1f} s\n", cfg.summary(), count,
               model->param_bytes() / 1048576.0, write_s, load_s);

    // inputs
    const int64_t lat = size / 8, C = cfg.in_channels, D = cfg.cap_feat_dim;
    std::vector<float> x((size_t)(C * lat * lat)), cap((size_t)(tokens * D)), out(x.size());
    Rng rx{seed ^ 0x5eedull};
    for (auto& v : x) v = rx.sym();
    for (auto& v : cap) v = rx.sym();
    const float t = 0.5f;
    std::vector<double> warm, times;
    for (int i = 0; i < warmup; ++i) {
        t0 = Clock::now();
        model->forward(x.data(), lat, lat, t, cap.data(), tokens, out.data());
        warm.push_back(seconds_since(t0));
    }
    for (int i = 0; i < reps; ++i) {
        t0 = Clock::now();
        model->forward(x.data(), lat, lat, t, cap.data(), tokens, out.data());
        times.push_back(seconds_since(t0));
    }
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double med = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    const int64_t img_tokens = (lat / 2) * (lat / 2);
    json r = {{"what", "zimage_dit_step"},
              {"type", type},
              {"flash_attn", fa},
              {"median_s", med},
              {"min_s", sorted.front()},
              {"times_s", times},
              {"warmup_s", warm},
              {"compute_bytes", model->compute_bytes()},
              {"param_bytes", model->param_bytes()},
              {"param_count", count},
              {"config", cfg.summary()},
              {"input", fmt::format("latent 16x{}x{} ({} image tokens), caption {}x{}, t 0.5, batch 1", lat, lat, img_tokens, tokens, D)},
              {"output", output_stats(out)},
              {"write_s", write_s},
              {"load_s", load_s}};
    fmt::print("  zimage step {:<5} median {:.3f} s/it over {} reps; params {:.1f} MiB; compute buffer {:.1f} MiB; output mean {:.4g} "
               "std {:.4g}, non-finite {}\n",
               type, med, reps, model->param_bytes() / 1048576.0, model->compute_bytes() / 1048576.0, r["output"]["mean"].get<double>(),
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
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    try {
        return main_impl(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "easel-bench-zimage: %s\n", e.what());
        return 1;
    }
}
