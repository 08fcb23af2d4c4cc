// `easel inspect FILE...`: what a weight file (or folder) holds.
#include "command.h"
#include "core/platform.h"

#include "core/error.h"
#include "io/detect.h"
#include "io/diffusers.h"
#include "io/weight_index.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>

namespace {

using namespace easel;
using namespace easel::io;

std::string human_bytes(uint64_t b) {
    const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)b;
    int i = 0;
    while (x >= 1024 && i < 4) x /= 1024, ++i;
    return i == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", x, u[i]);
}

std::string type_name(const TensorInfo& t) { return t.dtype == DType::Ggml ? ggml_type_name(t.gtype) : dtype_name(t.dtype); }

// Metadata value as one line, long values cut to `max` characters (0: no limit).
std::string meta_text(const MetaValue& v, size_t max) {
    std::string s;
    auto list = [&](const auto& a, auto f) {
        std::string r = fmt::format("[{} items: ", a.size());
        for (size_t i = 0; i < a.size() && (max == 0 || r.size() < max); ++i) r += (i ? ", " : "") + f(a[i]);
        return r + "]";
    };
    switch (v.kind) {
        case MetaValue::Kind::String: s = v.s; break;
        case MetaValue::Kind::Int: s = std::to_string(v.i); break;
        case MetaValue::Kind::Float: s = fmt::format("{}", v.f); break;
        case MetaValue::Kind::Bool: s = v.b ? "true" : "false"; break;
        case MetaValue::Kind::StringArray: s = list(v.sa, [](const std::string& x) { return x; }); break;
        case MetaValue::Kind::IntArray: s = list(v.ia, [](int64_t x) { return std::to_string(x); }); break;
        case MetaValue::Kind::FloatArray: s = list(v.fa, [](double x) { return fmt::format("{}", x); }); break;
    }
    for (auto& c : s)
        if ((unsigned char)c < 0x20) c = ' ';
    if (max && s.size() > max) s = s.substr(0, max) + fmt::format("... ({} chars)", s.size());
    return s;
}

nlohmann::json meta_json(const MetaValue& v) {
    switch (v.kind) {
        case MetaValue::Kind::String: return v.s;
        case MetaValue::Kind::Int: return v.i;
        case MetaValue::Kind::Float: return v.f;
        case MetaValue::Kind::Bool: return v.b;
        case MetaValue::Kind::StringArray: return v.sa;
        case MetaValue::Kind::IntArray: return v.ia;
        case MetaValue::Kind::FloatArray: return v.fa;
    }
    return nullptr;
}

struct Opts {
    std::vector<std::string> files;
    bool all_metadata = false;
    bool json = false;
    bool tensors = false;
    cli::CommonOptions common;
};

// One section (text) or one JSON object for an opened index.
nlohmann::ordered_json report(const std::string& label, const WeightIndex& wi, const Opts& o) {
    const Detection d = detect(wi);
    std::map<std::string, uint64_t> hist;
    uint64_t total = 0;
    int64_t params = 0;
    for (auto& t : wi.tensors()) {
        hist[type_name(t)]++;
        total += t.nbytes;
        params += t.numel();
    }
    uint64_t fsize = 0;
    for (auto& f : wi.files()) fsize += f.size;
    const std::string format = wi.files().empty() ? "?" : wi.files()[0].format;

    nlohmann::ordered_json j;
    j["path"] = label;
    j["format"] = format;
    j["files"] = wi.files().size();
    j["file_bytes"] = fsize;
    j["tensors"] = wi.tensors().size();
    j["tensor_bytes"] = total;
    j["parameters"] = params;
    j["dtypes"] = hist;
    j["family"] = d.family;
    j["variant"] = d.variant;
    j["layout"] = d.layout;
    auto& comps = j["components"] = nlohmann::ordered_json::array();
    for (auto& c : d.components)
        comps.push_back({{"role", c.role}, {"kind", c.kind}, {"prefix", c.prefix}, {"detail", c.detail}, {"tensors", c.tensors},
                         {"parameters", c.params}, {"bytes", c.param_bytes}});
    j["notes"] = d.notes;
    if (wi.config()) j["config"] = *wi.config();
    auto& mj = j["metadata"] = nlohmann::ordered_json::object();
    for (auto& [k, v] : wi.metadata()) mj[k] = meta_json(v);
    if (o.tensors) {
        auto& tj = j["tensor_list"] = nlohmann::ordered_json::array();
        for (auto& t : wi.tensors()) tj.push_back({{"name", t.name}, {"dtype", type_name(t)}, {"shape", t.shape}, {"bytes", t.nbytes}});
    }
    if (o.json) return j;

    fmt::print("== {}\n", label);
    fmt::print("format:     {} ({} file{}, {})\n", format, wi.files().size(), wi.files().size() == 1 ? "" : "s", human_bytes(fsize));
    std::string h;
    for (auto& [k, n] : hist) h += fmt::format("{}{} {}", h.empty() ? "" : ", ", k, n);
    fmt::print("tensors:    {} ({}), {} parameters, {}\n", wi.tensors().size(), h, params, human_bytes(total));
    fmt::print("family:     {}{}\n", d.family, d.variant.empty() ? "" : " [" + d.variant + "]");
    if (!d.layout.empty()) fmt::print("layout:     {}\n", d.layout);
    if (!d.components.empty()) {
        fmt::print("modules:\n");
        for (auto& c : d.components)
            fmt::print("  {:<24} {:>10}  {:>6} tensors  {}{}\n", c.role, human_bytes(c.param_bytes), c.tensors,
                       c.prefix.empty() ? "" : "[" + c.prefix + "] ", c.detail);
    }
    for (auto& n : d.notes) fmt::print("note:       {}\n", n);
    if (wi.config()) {
        std::string cls = wi.config()->is_object() && wi.config()->contains("_class_name") ? wi.config()->value("_class_name", "") : "";
        fmt::print("config:     config.json{}\n", cls.empty() ? "" : " (" + cls + ")");
    }
    const auto& meta = wi.metadata();
    if (!meta.empty()) {
        const size_t shown = o.all_metadata ? meta.size() : std::min<size_t>(meta.size(), 20);
        fmt::print("metadata:   {} key{}{}\n", meta.size(), meta.size() == 1 ? "" : "s",
                   shown < meta.size() ? fmt::format(" (first {}; --metadata prints all)", shown) : "");
        size_t i = 0;
        for (auto& [k, v] : meta) {
            if (i++ >= shown) break;
            fmt::print("  {} = {}\n", k, meta_text(v, o.all_metadata ? 0 : 120));
        }
    }
    if (o.tensors)
        for (auto& t : wi.tensors()) {
            std::string s;
            for (auto x : t.shape) s += (s.empty() ? "" : ", ") + std::to_string(x);
            fmt::print("  {}  {}  [{}]\n", t.name, type_name(t), s);
        }
    fmt::print("\n");
    return j;
}

EASEL_COMMAND(
    "inspect", "Show what weight files hold: format, tensors, dtypes, detected family, modules, metadata",
    [](CLI::App& sub) -> std::function<int()> {
        auto o = std::make_shared<Opts>();
        sub.add_option("files", o->files,
                       "Weight files (.safetensors, .gguf, *.safetensors.index.json, PyTorch .pth/.pt/.ckpt/.bin read without running "
                       "their pickle) or folders")
            ->required();
        sub.add_flag("--metadata", o->all_metadata, "Print every metadata key, values in full (default: first 20, long values cut)");
        sub.add_flag("--json", o->json, "Machine-readable output: one JSON object per file (an array for several)");
        sub.add_flag("--tensors", o->tensors, "List every tensor (name, dtype, shape)");
        cli::add_common_options(sub, o->common);
        sub.footer(
            "Examples:\n"
            "  easel inspect sd_xl_base_1.0.safetensors\n"
            "  easel inspect flux1-dev-Q4_K.gguf --metadata\n"
            "  easel inspect RealESRGAN_x4plus.pth v1-5-pruned-emaonly.ckpt\n"
            "  easel inspect models/FLUX.1-dev/transformer      (a diffusers component folder)\n"
            "  easel inspect models/stable-diffusion-v1-5       (a diffusers pipeline: one section per component)\n"
            "  easel inspect a.safetensors b.gguf --json\n"
            "Exit status 1 if any file cannot be read (one 'error: ...' line each on stderr).");
        return [o]() -> int {
            cli::apply_common_options(o->common);
            int rc = 0;
            nlohmann::ordered_json all = nlohmann::ordered_json::array();
            for (auto& f : o->files) {
                try {
                    std::vector<std::pair<std::string, std::filesystem::path>> targets;
                    const std::filesystem::path fp = platform::u8path(f);
                    if (is_pipeline_folder(fp)) {
                        for (auto& c : list_pipeline_components(fp)) {
                            std::error_code ec;
                            if (!std::filesystem::is_directory(c.folder, ec)) continue;
                            bool has_weights = false;
                            for (auto& e : std::filesystem::directory_iterator(c.folder, ec)) {
                                const auto n = platform::path_utf8(e.path().filename());
                                if (n.find(".safetensors") != std::string::npos || n.find(".gguf") != std::string::npos ||
                                    n.ends_with(".bin") || n.ends_with(".bin.index.json"))
                                    has_weights = true;
                            }
                            if (has_weights) targets.emplace_back(platform::path_utf8(c.folder) + " (" + c.name + ": " + c.class_name + ")", c.folder);
                        }
                        if (targets.empty()) fail(ErrorKind::InvalidInput, "'{}': pipeline folder without weight files", f);
                    } else {
                        targets.emplace_back(f, fp);
                    }
                    for (auto& [label, p] : targets) {
                        auto wi = WeightIndex::open(p);
                        all.push_back(report(label, wi, *o));
                    }
                } catch (const Error& e) {
                    std::fflush(stdout);
                    std::fprintf(stderr, "error: %s\n", e.what());
                    rc = 1;
                }
            }
            if (o->json && !all.empty()) fmt::print("{}\n", (all.size() == 1 ? all[0] : all).dump(2));
            return rc;
        };
    },
    20);

}  // namespace
