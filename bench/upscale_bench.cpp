// easel-bench-upscale: ESRGAN upscaling time per megapixel, both architectures, whole image and
// tiled, with made-up weights in the published sizes (bench/README.md).
//
//   rrdb   RRDBNet x4 as RealESRGAN_x4plus: 64 features, grow 32, 23 RRDB blocks (16,697,987 parameters)
//   srvgg  SRVGGNetCompact x4 as realesr-animevideov3: 64 features, 16 body convs, PReLU (621,424 parameters)
//
// The weights (uniform in +-1/sqrt(fan_in), PReLU slopes 0.25, fixed seed) are written under the
// BasicSR key names to a temporary safetensors file and opened through the ordinary path
// (esrgan::infer_config, esrgan::PlacedUpscaler on --device, weights F32 as easel keeps them).
// The input is a synthetic --size x --size RGB image; each --tiles entry (0 = the whole image) is
// timed: --warmup untimed runs, then --reps timed ones (median). Reported: seconds per run, per
// input megapixel and per output megapixel, the tile count, the measured peak on the device and
// the output statistics (non_finite must be 0).
#include "bench_common.h"
#include "core/error.h"
#include "easel_version.h"
#include "io/weight_index.h"
#include "models/esrgan/esrgan.h"
#include "placement/devices.h"
#include "models/esrgan/placed_upscaler.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <unistd.h>

namespace {

using namespace easel;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace easel::bench;

/// name -> (shape, values), BasicSR names.
using Weights = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;

void conv(std::mt19937& g, Weights& w, const std::string& n, int64_t in, int64_t out) {
    const float b = 1.0f / std::sqrt((float)(in * 9));
    std::uniform_real_distribution<float> u(-b, b);
    std::vector<float> k((size_t)(out * in * 9)), bias((size_t)out);
    for (auto& x : k) x = u(g);
    for (auto& x : bias) x = u(g);
    w[n + ".weight"] = {{out, in, 3, 3}, std::move(k)};
    w[n + ".bias"] = {{out}, std::move(bias)};
}

Weights made_up(const std::string& what, uint32_t seed) {
    std::mt19937 g(seed);
    Weights w;
    if (what == "rrdb") {
        const int64_t f = 64, gr = 32;
        conv(g, w, "conv_first", 3, f);
        for (int b = 0; b < 23; ++b)
            for (int r = 1; r <= 3; ++r)
                for (int c = 1; c <= 5; ++c)
                    conv(g, w, fmt::format("body.{}.rdb{}.conv{}", b, r, c), f + (c - 1) * gr, c == 5 ? f : gr);
        for (const char* n : {"conv_body", "conv_up1", "conv_up2", "conv_hr"}) conv(g, w, n, f, f);
        conv(g, w, "conv_last", f, 3);
    } else {
        const int64_t f = 64;
        conv(g, w, "body.0", 3, f);
        for (int i = 0; i <= 16; ++i) {
            w[fmt::format("body.{}.weight", 2 * i + 1)] = {{f}, std::vector<float>((size_t)f, 0.25f)};
            if (i < 16) conv(g, w, fmt::format("body.{}", 2 * i + 2), f, f);
        }
        conv(g, w, "body.34", f, 48);
    }
    return w;
}

void write_safetensors(const fs::path& p, const Weights& w) {
    json h;
    uint64_t off = 0;
    for (auto& [n, t] : w) {
        h[n] = {{"dtype", "F32"}, {"shape", t.first}, {"data_offsets", {off, off + t.second.size() * 4}}};
        off += t.second.size() * 4;
    }
    std::string hs = h.dump();
    hs.append((8 - hs.size() % 8) % 8, ' ');
    std::ofstream f(p, std::ios::binary);
    const uint64_t n = hs.size();
    f.write((const char*)&n, 8);
    f.write(hs.data(), (std::streamsize)hs.size());
    for (auto& [name, t] : w) f.write((const char*)t.second.data(), (std::streamsize)(t.second.size() * 4));
}

}  // namespace

int main(int argc, char** argv) {
    std::string device, json_path, tmp_dir, only;
    int threads = 0, reps = 3, warmup = 1, size = 128;
    std::vector<int> tiles{0, 64};
    uint32_t seed = 1;
    CLI::App app{"easel-bench-upscale: ESRGAN upscaling time per megapixel (RRDBNet x4plus, SRVGGNetCompact animevideov3), made-up weights"};
    app.add_option("--device", device, "ggml device name (see `easel devices`); default: the first GPU, else the CPU");
    app.add_option("-t,--threads", threads, "CPU threads (0: all hardware threads)")->check(CLI::NonNegativeNumber);
    app.add_option("--reps", reps, "timed repetitions after the warm-up runs (default 3)")->check(CLI::Range(1, 1000));
    app.add_option("--warmup", warmup, "untimed warm-up runs (default 1)")->check(CLI::Range(0, 100));
    app.add_option("--size", size, "input image side in pixels (default 128; the output is 4x)")->check(CLI::Range(8, 8192));
    app.add_option("--tiles", tiles, "tile sizes to time, 0 = the whole image (default 0 64)")->delimiter(',');
    app.add_option("--only", only, "rrdb or srvgg (default both)")->check(CLI::IsMember({"rrdb", "srvgg"}));
    app.add_option("--json", json_path, "write the results as JSON to this file");
    app.add_option("--tmp-dir", tmp_dir, "folder for the temporary weight files (default: the system temp folder)");
    app.add_option("--seed", seed, "seed of the made-up weights (default 1)");
    CLI11_PARSE(app, argc, argv);
    try {
        placement::init_backends();
        if (threads <= 0) threads = (int)std::max(1u, std::thread::hardware_concurrency());
        placement::PlacementFlags flags;
        if (!device.empty()) flags.backend = "upscaler=" + device;
        const placement::PlacementSpec spec = placement::parse_placement(flags, placement::device_names());
        json out = {{"easel_version", EASEL_VERSION}, {"ggml_commit", EASEL_GGML_COMMIT}, {"ggml_source", EASEL_GGML_SOURCE},
                    {"date", utc_now()}, {"hardware_threads", std::thread::hardware_concurrency()}, {"threads", threads},
                    {"reps", reps}, {"warmup", warmup}, {"size", size}, {"results", json::array()}};
        char host[256] = {0};
        gethostname(host, sizeof host - 1);
        out["host"] = host;
        std::string cmd;
        for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
        out["command_line"] = cmd;
        out["device"] = spec[placement::PModule::Upscaler].devices.front();
        // the input: a smooth pattern in [0, 1]
        vae::HostTensor img(1, 3, size, size);
        for (int c = 0; c < 3; ++c)
            for (int y = 0; y < size; ++y)
                for (int x = 0; x < size; ++x) img.at(0, c, y, x) = 0.5f + 0.4f * std::sin(0.37f * x + 0.23f * y * (c + 1));
        for (const std::string what : {"rrdb", "srvgg"}) {
            if (!only.empty() && only != what) continue;
            TempFile tf{(tmp_dir.empty() ? fs::temp_directory_path() : fs::path(tmp_dir)) /
                        fmt::format("easel-bench-upscale-{}-{}.safetensors", what, getpid())};
            const Weights w = made_up(what, seed);
            int64_t nparams = 0;
            for (auto& [n, t] : w) nparams += (int64_t)t.second.size();
            write_safetensors(tf.path, w);
            auto index = io::WeightIndex::open(tf.path);
            for (int tile : tiles) {
                esrgan::PlacedUpscaler up(index, tf.path.string(), spec, threads);
                std::vector<double> warm, times;
                int ntiles = 0;
                vae::HostTensor y;
                for (int r = 0; r < warmup + reps; ++r) {
                    const auto t0 = Clock::now();
                    y = up.upscale(img, tile, -1, [&](int, int total) { ntiles = total; });
                    (r < warmup ? warm : times).push_back(seconds_since(t0));
                }
                const double med = median(times), in_mp = (double)size * size / 1e6, out_mp = in_mp * 16;
                uint64_t peak = 0;
                for (auto& [d, b] : up.peaks()) peak = std::max(peak, b);
                json r = {{"what", what}, {"config", up.config().describe()}, {"param_count", nparams}, {"tile", tile}, {"tiles", ntiles},
                          {"input", fmt::format("{}x{} RGB", size, size)}, {"median_s", med},
                          {"min_s", *std::min_element(times.begin(), times.end())}, {"times_s", times}, {"warmup_s", warm},
                          {"s_per_input_mp", med / in_mp}, {"s_per_output_mp", med / out_mp}, {"peak_bytes", peak},
                          {"output", output_stats(y.data)}};
                std::printf("%-5s %-62s tile %4d (%3d tiles): %8.3f s = %8.2f s per input MP, %7.3f s per output MP, peak %.1f MiB\n",
                            what.c_str(), up.config().describe().c_str(), tile, ntiles, med, med / in_mp, med / out_mp, (double)peak / 1048576.0);
                std::fflush(stdout);
                out["results"].push_back(r);
            }
        }
        if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
