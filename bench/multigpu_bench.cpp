// easel-bench-multigpu: the full-size Z-Image DiT (Z-Image-Turbo architecture, made-up BF16
// weights, bench/full_size_configs.h) run one step at a time under different placements, side by
// side in one process (issue 10):
//
//   single   every block resident on the first device (the reference output)
//   layer    --backend "diffusion=DEV0&DEV1" --split-mode layer: contiguous block ranges per
//            device, balanced by the planner in proportion to the budgets
//   row      --backend "diffusion=DEV0&DEV1" --split-mode row: tensor parallelism inside each
//            block on ggml's meta device (placement/row_split.h; partial sums all-reduced, NCCL
//            on CUDA)
//   capped   --backend "diffusion=DEV0&DEV1" --params-backend diffusion=cpu --stream-layers
//            --max-vram DEV0=G,DEV1=G: weights in pinned host RAM, each device capped (the two
//            6 GB cards of our users, simulated by caps; --cap-gib)
//   MODE@f32 (asked for by name) any mode with ggml's cuBLAS matmuls computing in F32 (see below)
//   autofit  (asked for by name) the plan --auto-fit's planner (placement/autofit.h) picks for
//            the devices capped at --cap-gib with host RAM beside them, run like the others: its
//            predicted peaks against the measured ones (issue 9's accuracy check at full size)
//
// For each mode: the median step time (and its ratio to `single`), the largest difference of the
// output from `single`, each device's predicted peak (the plan) beside the measured peak (the
// runtime's accounting of every buffer it allocated), and the bytes crossing between devices per
// step (the state handed from a segment to a segment on another device; it goes device -> host ->
// device) plus, for `capped`, the weight bytes uploaded per step.
//
//   easel-bench-multigpu [--devices CUDA0,CUDA1] [--modes single,layer,row,capped] [--size 1024]
//                        [--tokens 128] [--type bf16|q8_0|f32] [--cap-gib 6] [--reps 3] [--warmup 1]
//                        [--layers 30] [--json out.json] [--tmp-dir DIR] [--rpc-servers ...]
//   easel-bench-multigpu --write-pipeline DIR [--layers 30] [--te-layers 36] [--keep-existing]
//
// --write-pipeline DIR writes the whole Z-Image pipeline of made-up BF16 weights (DiT, Qwen3-4B
// text encoder, FLUX.1 VAE: bench/pipeline_weights.h) as three files for `easel generate
// --diffusion-model DIR/z_image_dit.safetensors --llm DIR/qwen3_4b.safetensors --vae
// DIR/flux1_vae.safetensors`, prints their paths and exits (no device needed).
//
// With one GPU, GGML_CUDA_DEVICES=2 (this ggml's CUDA backend option) shows it as two devices.
#include "bench_common.h"
#include "core/error.h"
#include "easel_version.h"
#include "full_size_configs.h"
#include "io/weight_index.h"
#include "made_up_weights.h"
#include "models/zimage/z_image_dit.h"
#include "models/zimage/z_image_row_split.h"
#include "pipeline_weights.h"
#include "placement/autofit.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "placement/row_split.h"
#include "runtime/sequence_runner.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using namespace easel;
using namespace easel::bench;
namespace fs = std::filesystem;
namespace zi = easel::models::zimage;
using json = nlohmann::json;

std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
    return out;
}

int main_impl(int argc, char** argv) {
    std::string devices_arg, modes_arg = "single,layer,row,capped", type = "bf16", json_path, tmp_dir, weights_file, rpc, pipeline_dir;
    int threads = 0, reps = 3, warmup = 1, tokens = 128, layers = 30, size = 1024, te_layers = 36;
    bool keep_existing = false;
    double cap_gib = 6.0;
    bool fa = true;
    uint64_t seed = 1;
    CLI::App app{"easel-bench-multigpu: the full-size Z-Image DiT under single-device, layer-split, row-split and capped placements"};
    app.add_option("--devices", devices_arg, "two or more runtime devices, comma-separated (default: every GPU)");
    app.add_option("--modes", modes_arg, "modes to run, comma-separated: single, ulp (one device, input moved by one ulp), layer, row, capped, autofit; MODE@f32: F32 matmul compute (default single,layer,row,capped)");
    app.add_option("--size", size, "image side in pixels, a multiple of 16 (default 1024)")->check(CLI::Range(16, 4096));
    app.add_option("--tokens", tokens, "caption tokens (default 128)")->check(CLI::Range(1, 1024));
    app.add_option("--type", type, "matmul weight type: bf16, q8_0 or f32 (default bf16; f32: the BF16 file converted at load, cuBLAS in full F32)")->check(CLI::IsMember({"bf16", "q8_0", "f32"}));
    app.add_option("--cap-gib", cap_gib, "per-device cap of the capped and autofit modes, GiB (default 6)");
    app.add_option("--layers", layers, "main layers (default 30)")->check(CLI::Range(2, 30));
    app.add_option("--reps", reps, "timed steps per mode (default 3)")->check(CLI::Range(1, 100));
    app.add_option("--warmup", warmup, "untimed steps first (default 1)")->check(CLI::Range(0, 10));
    app.add_option("-t,--threads", threads, "CPU threads (0: all)");
    app.add_flag("--fa,!--no-fa", fa, "flash attention (default on)");
    app.add_option("--rpc-servers", rpc, "RPC servers host:port,... (devices RPC0...)");
    app.add_option("--json", json_path, "write the results here");
    app.add_option("--tmp-dir", tmp_dir, "folder for the temporary made-up weight file (about 12.3 GB)");
    app.add_option("--weights", weights_file, "made-up weight file to reuse: written when absent and then kept, so several runs (e.g. bf16 and q8_0) share it; it must have been made with the same architecture options")->check(CLI::NonexistentPath | CLI::ExistingFile);
    app.add_option("--write-pipeline", pipeline_dir,
                   "write the whole Z-Image pipeline of made-up BF16 weights into DIR (z_image_dit, qwen3_4b, flux1_vae .safetensors; about 20.5 GB at full size) and exit");
    app.add_option("--te-layers", te_layers, "--write-pipeline: Qwen3-4B layers (default 36)")->check(CLI::Range(2, 36));
    app.add_flag("--keep-existing", keep_existing, "--write-pipeline: keep files already in DIR (written with the same options)");
    CLI11_PARSE(app, argc, argv);
    if (!pipeline_dir.empty()) {
        const auto t_write = Clock::now();
        const PipelineFiles files = write_zimage_pipeline(pipeline_dir, layers, te_layers, seed, keep_existing, threads);
        fmt::print("easel-bench-multigpu: made-up Z-Image pipeline ({} DiT layers, {} text-encoder layers) in {:.1f} s:\n", layers, te_layers,
                   seconds_since(t_write));
        for (const auto& [flag, path] : {std::pair{"--diffusion-model", files.dit}, std::pair{"--llm", files.llm}, std::pair{"--vae", files.vae}})
            fmt::print("  {} {} ({:.2f} GB)\n", flag, path.string(), std::filesystem::file_size(path) / 1e9);
        return 0;
    }
    if (size % 16) fail(ErrorKind::InvalidInput, "--size {} is not a multiple of 16", size);

    placement::init_backends();
    if (!rpc.empty()) placement::add_rpc_servers(rpc);
    std::vector<std::string> devs;
    if (devices_arg.empty()) {
        for (auto& d : placement::list_devices())
            if (d.type == "gpu") devs.push_back(d.name);
    } else {
        for (auto& n : split_list(devices_arg)) devs.push_back(placement::resolve_device(n, placement::device_names(), "--devices"));
    }
    if (devs.size() < 2)
        fail(ErrorKind::InvalidInput, "easel-bench-multigpu needs two or more devices (found {}); on one GPU set GGML_CUDA_DEVICES=2",
             devs.size());
    const std::vector<std::string> modes = split_list(modes_arg);
    fmt::print("easel-bench-multigpu: devices {}, {}x{}, {} caption tokens, {} layers, {} weights, fa {}, ggml {}\n", fmt::join(devs, "&"), size,
               size, tokens, layers, type, fa ? "on" : "off", EASEL_GGML_COMMIT);

    const fs::path dir = tmp_dir.empty() ? fs::temp_directory_path() : fs::path(tmp_dir);
    TempFile tmp;
    const fs::path wpath = weights_file.empty() ? dir / fmt::format("easel-bench-multigpu-{}.safetensors", (long)getpid()) : fs::path(weights_file);
    if (weights_file.empty()) tmp.path = wpath;
    const bool reuse = !weights_file.empty() && fs::exists(wpath);
    auto t0 = Clock::now();
    {
        zi::ZImageDiT shape_only(turbo_config(layers, 2));
        if (!reuse) write_made_up_bf16(wpath, shape_only, seed, "easel-bench-multigpu made-up weights", zimage_dit_ones);
    }
    fmt::print("  weights {} in {:.1f} s\n", reuse ? "reused" : "written", seconds_since(t0));
    io::WeightIndex idx = io::WeightIndex::open(wpath);
    auto keys = zi::find_zimage_dit(idx);
    if (!keys) fail(ErrorKind::ModelMismatch, "made-up file holds no Z-Image transformer");
    const zi::ZImageDiTConfig cfg = zi::infer_config(idx, *keys);
    zi::ZImageDiT net(cfg);
    nn::TensorSource src = zi::make_tensor_source(idx, *keys, cfg);
    nn::LoadOptions lo = zi::default_load_options(idx, *keys);
    lo.weight_type = type == "q8_0" ? GGML_TYPE_Q8_0 : type == "f32" ? GGML_TYPE_F32 : GGML_TYPE_COUNT;

    const int64_t lat = size / 8, C = cfg.in_channels, D = cfg.cap_feat_dim;
    const std::vector<float> x = uniform_values((size_t)(C * lat * lat), seed ^ 0x5eedull);
    // mode "ulp": the input latent with every element moved to the next float up (one unit in
    // the last place), run on one device: the output's change is the network's own sensitivity
    // to float32 rounding, the floor any split's summation order is measured against
    std::vector<float> x_ulp(x);
    for (auto& v : x_ulp) v = std::nextafter(v, INFINITY);
    const std::vector<float>* x_in = &x;
    const std::vector<float> cap = uniform_values((size_t)(tokens * D), seed ^ 0xca9ull);
    const std::vector<float> tv{0.5f};
    const zi::ZImageRope rope = zi::make_rope(cfg, lat, lat, tokens);
    const int64_t half = cfg.head_dim / 2;
    auto mk = [&](runtime::GraphBuilder& g) {
        zi::ZImageInputs in;
        in.x = g.input_f32("x", {lat, lat, C, 1}, *x_in);
        in.t = g.input_f32("t", {1}, tv);
        in.cap = g.input_f32("cap", {D, tokens, 1}, cap);
        in.rope_cos = g.input_f32("rope_cos", {half, rope.tokens()}, rope.cos);
        in.rope_sin = g.input_f32("rope_sin", {half, rope.tokens()}, rope.sin);
        return in;
    };
    auto sel = [](ggml_tensor*& o) { return std::vector<ggml_tensor*>{o}; };

    json results = json::array();
    std::vector<float> reference;
    double single_s = 0;
    std::map<std::string, std::vector<float>> reference_f32;  // "single@f32"'s output
    for (const std::string& mode_arg : modes) {
        // MODE@f32: the mode with ggml's cuBLAS matmuls computing in F32 (GGML_CUDA_CUBLAS_COMPUTE_TYPE,
        // read by ggml at every matmul), so a bf16 model's activations are not rounded to bf16:
        // two runs then differ only by the order of F32 sums, and the difference of `single@f32`
        // from `single` is the size of a change of matmul kernel, for comparison with a split's
        const bool f32 = mode_arg.size() > 4 && mode_arg.compare(mode_arg.size() - 4, 4, "@f32") == 0;
        const std::string mode = f32 ? mode_arg.substr(0, mode_arg.size() - 4) : mode_arg;
        if (f32) ::setenv("GGML_CUDA_CUBLAS_COMPUTE_TYPE", "f32", 1);
        else ::unsetenv("GGML_CUDA_CUBLAS_COMPUTE_TYPE");
        if (mode != "single" && mode != "ulp" && mode != "layer" && mode != "row" && mode != "capped" && mode != "autofit")
            fail(ErrorKind::InvalidInput, "unknown mode '{}' (single, ulp, layer, row, capped, autofit)", mode);
        x_in = mode == "ulp" ? &x_ulp : &x;
        runtime::SequenceRunner<zi::ZImageInputs, zi::ZImageState, ggml_tensor*> r(net, net, src, lo, threads, fa);
        if (mode == "row") r.set_row_split(models::zimage::zimage_row_split_rules(net));
        auto costs = r.costs(mk, sel, "Z-Image DiT");
        placement::ModulePlacement place;
        std::map<std::string, uint64_t> budgets;
        bool stream = false;
        if (mode == "single" || mode == "ulp") {
            place.devices = {devs[0]};
        } else {
            place.devices = devs;
            place.split = mode == "row" ? placement::SplitMode::Row : placement::SplitMode::Layer;
        }
        if (mode == "capped") {
            place.params = "CPU";
            stream = true;
            for (auto& d : devs) budgets[d] = (uint64_t)(cap_gib * 1073741824.0);
        } else {
            for (auto& d : placement::list_devices())
                if (std::find(devs.begin(), devs.end(), d.name) != devs.end()) budgets[d.name] = d.free_bytes;
        }
        placement::ModulePlan plan;
        if (mode == "autofit") {
            // --auto-fit's planner (placement/autofit.h) on the devices capped at --cap-gib, host
            // RAM as the CPU device: the plan it picks is run and its peaks measured
            placement::FitRequest req;
            for (auto& d : placement::list_devices()) {
                const bool use = std::find(devs.begin(), devs.end(), d.name) != devs.end();
                if (!use && d.type != "cpu") continue;
                placement::FitDevice fd;
                fd.name = d.name;
                fd.type = d.type == "cpu" ? "cpu" : "gpu";
                fd.budget = use ? std::min<uint64_t>(d.free_bytes, (uint64_t)(cap_gib * 1073741824.0)) : d.free_bytes;
                if (use) fd.h2d_bytes_per_s = placement::measure_h2d_bandwidth(d.dev, 64u << 20);
                req.devices.push_back(fd);
            }
            placement::FitModule fm;
            fm.module = placement::PModule::Diffusion;
            fm.costs = costs;
            fm.evals = 1;
            req.modules.push_back(fm);
            req.job.width = req.job.height = size;
            req.job.steps = 1;
            req.job.cfg = false;
            const placement::FitResult fit = placement::auto_fit(req);
            std::printf("%s", placement::format_fit(fit).c_str());
            plan = fit.choices.at(0).plan;
        } else {
            plan = placement::plan_module(placement::PModule::Diffusion, place, stream, costs, budgets);
        }
        std::printf("%s", placement::format_plan({plan}).c_str());
        t0 = Clock::now();
        r.load(plan);
        const double load_s = seconds_since(t0);
        r.begin_phase();
        std::vector<double> times;
        std::vector<float> out;
        for (int i = 0; i < warmup + reps; ++i) {
            auto ts = Clock::now();
            out = r.run(mk, sel).at(0).data;
            if (i >= warmup) times.push_back(seconds_since(ts));
        }
        r.end_phase();
        const double med = median(times);
        uint64_t crossing = 0, uploaded = 0;
        for (size_t j = 0; j < plan.segments.size(); ++j) {
            if (j + 1 < plan.segments.size() && plan.segments[j + 1].device != plan.segments[j].device) crossing += plan.segments[j].state_bytes;
            if (plan.segments[j].per_eval) uploaded += plan.segments[j].param_bytes;
        }
        json row = {{"mode", mode_arg},
                    {"median_s", med},
                    {"times_s", times},
                    {"load_s", load_s},
                    {"segments", plan.segments.size()},
                    {"state_bytes_crossing_devices_per_step", crossing},
                    {"weight_bytes_uploaded_per_step", uploaded},
                    {"prefetched_uploads", r.prefetched_uploads()},
                    {"output", output_stats(out)}};
        json per_dev = json::array();
        for (auto& du : plan.devices) {
            const uint64_t measured = r.peaks().count(du.device) ? r.peaks().at(du.device) : 0;
            per_dev.push_back({{"device", du.device},
                               {"predicted_bytes", du.total()},
                               {"measured_peak_bytes", measured},
                               {"budget_bytes", du.budget},
                               {"measured_over_predicted", du.total() ? (double)measured / (double)du.total() : 0.0}});
            fmt::print("  {:<7} {:<10} predicted {:9.1f} MiB, measured peak {:9.1f} MiB ({:+.1f} %){}\n", mode_arg, du.device, du.total() / 1048576.0,
                       measured / 1048576.0, du.total() ? 100.0 * ((double)measured / (double)du.total() - 1.0) : 0.0,
                       du.budget ? fmt::format(", cap {:.1f} MiB", du.budget / 1048576.0) : "");
        }
        row["devices"] = per_dev;
        if (f32 && mode == "single") reference_f32["single"] = out;
        else if (f32 && reference_f32.count("single")) {
            float m = 0;
            const auto& ref = reference_f32.at("single");
            for (size_t k = 0; k < out.size(); ++k) m = std::max(m, std::fabs(out[k] - ref[k]));
            row["max_abs_diff_vs_single_f32"] = m;
            fmt::print("  {:<7} max |out - single@f32| {:.3g}\n", mode_arg, m);
        }
        if (mode == "single" && !f32) {
            reference = out;
            single_s = med;
        } else if (!reference.empty()) {
            float m = 0;
            for (size_t k = 0; k < out.size(); ++k) m = std::max(m, std::fabs(out[k] - reference[k]));
            row["max_abs_diff_vs_single"] = m;
            row["ratio_vs_single"] = med / single_s;
        }
        fmt::print("  {:<7} median {:.3f} s/step{}; {} segments; state crossing devices {:.2f} MiB/step; weights uploaded {:.1f} MiB/step{}\n", mode_arg, med,
                   single_s > 0 && mode_arg != "single" ? fmt::format(" ({:.3f} x single)", med / single_s) : "", plan.segments.size(), crossing / 1048576.0,
                   uploaded / 1048576.0,
                   row.contains("max_abs_diff_vs_single") ? fmt::format("; max |out - single| {:.3g}", row["max_abs_diff_vs_single"].get<float>()) : "");
        results.push_back(row);
    }
    if (!json_path.empty()) {
        std::string command_line;
        for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);
        // the variables that change the CUDA arithmetic (TF32 tensor cores, the device count,
        // the all-reduce of a row split), so a result file says what precision it measured
        json env = json::object();
        for (const char* v : {"NVIDIA_TF32_OVERRIDE", "GGML_CUDA_ALLREDUCE", "GGML_CUDA_DEVICES"})
            if (const char* val = std::getenv(v)) env[v] = val;
        json doc = {{"bench", "multigpu"},       {"easel_version", EASEL_VERSION}, {"ggml_commit", EASEL_GGML_COMMIT}, {"environment", env},
                    {"date", utc_now()},         {"command_line", command_line},   {"config", cfg.summary()},
                    {"devices", devs},           {"results", results}};
        std::ofstream f(json_path);
        f << doc.dump(2) << "\n";
        if (!f) fail(ErrorKind::Io, "cannot write {}", json_path);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    try {
        return main_impl(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "easel-bench-multigpu: %s\n", e.what());
        return 1;
    }
}
