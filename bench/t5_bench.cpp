// easel-bench-t5: T5-XXL prompt encoding (the text_encoder_2 of FLUX.1, text_encoder_3 of SD3) with
// made-up weights, timed like easel-bench (bench/README.md: median of --reps after --warmup runs).
//
// The bench builds the T5 v1.1 XXL encoder with easel's model code (models/t5/t5_encoder.h) in the
// published configuration (google/t5-v1_1-xxl config.json: d_model 4096, d_kv 64, num_heads 64,
// d_ff 10240, num_layers 24, relative_attention_num_buckets 32, max_distance 128,
// feed_forward_proj gated-gelu, vocab 32128), lists its parameters under the transformers names
// (shared.weight, encoder.block.N....), writes them as F16 values from a fixed-seed generator to a
// temporary safetensors file (about 9.5 GB for 24 layers; --tmp-dir), and loads it through the
// ordinary load path with matmul weights kept F16 or converted to Q8_0 (--type, as
// `easel generate --type q8_0`). Input: a real prompt through the T5 tokenizer, padded with <pad>
// to --tokens (512: FLUX.1-dev's max_sequence_length; schnell uses 256), batch 1, no attention
// mask (as FluxPipeline); output last_hidden_state {4096, 512}.
//
// Value distribution: matmul weights uniform in +-1/sqrt(fan_in), the embedding uniform in +-1,
// the relative position bias table uniform in +-0.5, norm scales 1; the output statistics in the
// results show whether anything overflowed (non_finite must be 0).
#include "bench_common.h"
#include "core/error.h"
#include "easel_version.h"
#include "io/weight_index.h"
#include "models/t5/t5_encoder.h"
#include "placement/devices.h"
#include "runtime/graph_runner.h"
#include "text/t5_tokenizer.h"

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
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

using namespace easel;
namespace fs = std::filesystem;
namespace t5 = easel::models::t5;
using json = nlohmann::json;
using namespace easel::bench;

/// splitmix64 (Steele, Lea, Flood 2014); one stream per tensor (seed ^ FNV-1a of the name).
struct SplitMix64 {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float sym() { return float((next() >> 40) * (1.0 / 8388608.0) - 1.0); }  ///< uniform in [-1, 1)
};

uint64_t fnv1a(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
    return h;
}

/// T5 v1.1 XXL (google/t5-v1_1-xxl config.json), with `layers` encoder blocks.
t5::T5Config xxl_config(int layers) {
    t5::T5Config c;
    c.vocab = 32128;
    c.d_model = 4096;
    c.d_kv = 64;
    c.heads = 64;
    c.d_ff = 10240;
    c.layers = layers;
    c.num_buckets = 32;
    c.max_distance = 128;
    c.ff = t5::FeedForward::GatedGelu;
    return c;
}

/// Writes every parameter of `root` as F16 made-up values to a safetensors file (format:
/// u64 little-endian header length, JSON header, data). Returns the parameter count.
/// Throws Error(Io) when the file cannot be written.
int64_t write_made_up(const fs::path& path, nn::Block& root, uint64_t seed) {
    struct T {
        std::string name;
        std::vector<int64_t> shape;
        nn::ParamRole role;
    };
    std::vector<T> ts;
    root.visit_params("", [&](const std::string& n, nn::Param& p) { ts.push_back({n, p.shape, p.role}); });
    json header = json::object();
    uint64_t off = 0;
    int64_t count = 0;
    for (auto& t : ts) {
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        header[t.name] = {{"dtype", "F16"}, {"shape", t.shape}, {"data_offsets", {off, off + 2 * (uint64_t)n}}};
        off += 2 * (uint64_t)n;
        count += n;
    }
    header["__metadata__"] = {{"format", "pt"}, {"producer", "easel-bench-t5 made-up weights"}};
    std::string h = header.dump();
    while (h.size() % 8 != 0) h.push_back(' ');
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) fail(ErrorKind::Io, "cannot create the temporary weight file {}: choose another folder with --tmp-dir", path.string());
    uint64_t hl = h.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = (unsigned char)(hl >> (8 * i));
    f.write((const char*)le, 8);
    f.write(h.data(), (std::streamsize)h.size());
    std::vector<float> v;
    std::vector<ggml_fp16_t> half;
    for (auto& t : ts) {
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        v.resize((size_t)n);
        const bool rel = t.name.find("relative_attention_bias") != std::string::npos;
        if (t.role == nn::ParamRole::Norm && !rel) {
            std::fill(v.begin(), v.end(), 1.0f);
        } else {
            float scale = rel ? 0.5f : 1.0f;
            if (t.role == nn::ParamRole::Weight) scale = 1.0f / std::sqrt((float)t.shape.back());
            SplitMix64 rng{seed ^ fnv1a(t.name)};
            for (auto& x : v) x = scale * rng.sym();
        }
        half.resize(v.size());
        ggml_fp32_to_fp16_row(v.data(), half.data(), (int64_t)v.size());
        f.write((const char*)half.data(), (std::streamsize)(half.size() * sizeof(ggml_fp16_t)));
    }
    f.close();
    if (!f) fail(ErrorKind::Io, "writing {} failed (disk full?): choose another folder with --tmp-dir", path.string());
    return count;
}





int main_impl(int argc, char** argv) {
    std::string device, type = "f16", json_path, tmp_dir;
    int threads = 0, reps = 3, warmup = 1, tokens = 512, layers = 24;
    uint64_t seed = 1;
    CLI::App app{"easel-bench-t5: T5-XXL prompt encoding (FLUX.1 / SD3 text encoder) with made-up weights"};
    app.add_option("--device", device, "ggml device name (see `easel devices`); default: the first GPU, else the CPU");
    app.add_option("-t,--threads", threads, "CPU threads (0: all hardware threads)")->check(CLI::NonNegativeNumber);
    app.add_option("--reps", reps, "timed repetitions after the warm-up runs (default 3)")->check(CLI::Range(1, 1000));
    app.add_option("--warmup", warmup, "untimed warm-up runs (default 1)")->check(CLI::Range(0, 100));
    app.add_option("--type", type, "matmul weight type: f16 or q8_0 (default f16)")->check(CLI::IsMember({"f16", "q8_0"}));
    app.add_option("--tokens", tokens, "sequence length (default 512, FLUX.1-dev)")->check(CLI::Range(1, 4096));
    app.add_option("--layers", layers, "encoder blocks (default 24 = XXL; fewer for a quick check)")->check(CLI::Range(1, 24));
    app.add_option("--json", json_path, "write the results as JSON to this file");
    app.add_option("--tmp-dir", tmp_dir, "folder for the temporary made-up weight file (default: the system temp folder)");
    app.add_option("--seed", seed, "seed of the made-up weights (default 1)");
    CLI11_PARSE(app, argc, argv);

    placement::init_backends();
    ggml_backend_dev_t dev = nullptr;
    if (!device.empty()) dev = placement::find_device(device);
    else if (!(dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU))) dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    runtime::GraphRunner run(dev, threads);
    fmt::print("easel-bench-t5: device {} ({}), T5-XXL {} layers, {} tokens, {} weights, {} reps, ggml {}\n", ggml_backend_dev_name(dev),
               ggml_backend_dev_description(dev), layers, tokens, type, reps, EASEL_GGML_COMMIT);

    // made-up weights through the real load path
    const fs::path dir = tmp_dir.empty() ? fs::temp_directory_path() : fs::path(tmp_dir);
    TempFile tmp{dir / fmt::format("easel-bench-t5-{}.safetensors", (long)getpid())};
    auto t0 = Clock::now();
    int64_t count;
    {
        t5::T5Encoder shape_only(xxl_config(layers));
        count = write_made_up(tmp.path, shape_only, seed);
    }
    const double write_s = seconds_since(t0);
    t0 = Clock::now();
    io::WeightIndex idx = io::WeightIndex::open(tmp.path);
    auto keys = t5::find_t5_encoder(idx);
    if (!keys) fail(ErrorKind::Internal, "made-up T5 file: no T5 encoder found");
    const t5::T5Config cfg = t5::infer_config(idx, *keys);
    t5::T5Encoder model(cfg);
    nn::LoadOptions lo = t5::default_load_options(idx, *keys);
    lo.weight_type = type == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    nn::ParamBuffer params = nn::ParamBuffer::load(model, t5::make_tensor_source(idx, *keys), run.buffer_type(), lo);
    const double load_s = seconds_since(t0);
    fmt::print("  T5 d_model {}, {} heads x {}, d_ff {}, {} layers, vocab {} ({} parameters, {:.1f} MiB loaded); written in {:.1f} s, "
               "loaded in {:.1f} s\n",
               cfg.d_model, cfg.heads, cfg.d_kv, cfg.d_ff, cfg.layers, cfg.vocab, count, params.size() / 1048576.0, write_s, load_s);

    const auto& tok = text::T5Tokenizer::builtin();
    const std::string prompt = "a photograph of a red fox sitting in a snowy forest at dawn, soft golden light, shallow depth of field";
    const std::vector<int32_t> ids = tok.encode_padded(prompt, tokens);
    t5::check_token_ids(ids, cfg.vocab);
    const auto buckets = t5::relative_position_buckets(tokens, cfg.num_buckets, cfg.max_distance);
    auto once = [&] {
        return run.run([&](runtime::GraphBuilder& g) {
            nn::Ctx c{g.ctx(), false, g.backend()};
            t5::T5Inputs in;
            in.ids = g.input_i32("ids", {tokens, 1}, ids);
            in.buckets = g.input_i32("buckets", {(int64_t)tokens * tokens}, buckets);
            return std::vector<ggml_tensor*>{model.forward(c, in).last_hidden_state};
        })[0];
    };
    runtime::HostTensor out;
    std::vector<double> warm, times;
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
    json r = {{"what", "t5xxl"},
              {"type", type},
              {"median_s", med},
              {"min_s", sorted.front()},
              {"times_s", times},
              {"warmup_s", warm},
              {"compute_bytes", run.last_compute_bytes()},
              {"param_bytes", params.size()},
              {"param_count", count},
              {"input", fmt::format("{} prompt tokens + </s>, <pad> to {}, batch 1, no mask", tok.encode(prompt).size(), tokens)},
              {"output_shape_ggml", out.ne},
              {"output", output_stats(out.data)},
              {"write_s", write_s},
              {"load_s", load_s}};
    fmt::print("  t5xxl {:<5} median {:.3f} s over {} reps; params {:.1f} MiB; compute buffer {:.1f} MiB; output mean {:.4g} std {:.4g}, "
               "non-finite {}\n",
               type, med, reps, params.size() / 1048576.0, run.last_compute_bytes() / 1048576.0, r["output"]["mean"].get<double>(),
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
        std::fprintf(stderr, "easel-bench-t5: %s\n", e.what());
        return 1;
    }
}
