// Parsing of sd-cli's placement flags (see spec.h; meaning from stable-diffusion.cpp
// docs/backend.md).
#include "placement/spec.h"

#include "core/error.h"
#include "core/strings.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace easel::placement {

namespace {

std::string trim(std::string s) {
    s.erase(0, s.find_first_not_of(" \t"));
    s.erase(s.find_last_not_of(" \t") + 1);
    return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    size_t start = 0;
    while (true) {
        size_t p = s.find(sep, start);
        out.push_back(trim(s.substr(start, p == std::string::npos ? std::string::npos : p - start)));
        if (p == std::string::npos) break;
        start = p + 1;
    }
    return out;
}

bool is_default_key(const std::string& k) {
    std::string l = ascii_lower(k);
    return l == "all" || l == "default" || l == "*";
}

std::string device_list_text(const std::vector<DeviceName>& devs) {
    std::string s;
    for (auto& d : devs) s += (s.empty() ? "" : ", ") + d.name;
    return s;
}

/// One entry of an assignment: key (empty = default) and value.
struct Entry {
    std::string key;  // "" = default
    std::string value;
};

/// Splits "a,te=b,all=c" into entries; keys are validated by the caller.
std::vector<Entry> entries(const std::string& text, const char* flag) {
    std::vector<Entry> out;
    if (trim(text).empty()) return out;
    for (auto& part : split(text, ',')) {
        if (part.empty()) fail(ErrorKind::InvalidInput, "{}: empty entry in '{}' (remove the extra comma)", flag, text);
        size_t eq = part.find('=');
        if (eq == std::string::npos) {
            out.push_back({"", part});
            continue;
        }
        std::string k = trim(part.substr(0, eq)), v = trim(part.substr(eq + 1));
        if (k.empty()) fail(ErrorKind::InvalidInput, "{}: '{}' has no name before '=' (write MODULE=NAME, e.g. te=cpu)", flag, part);
        if (v.find('=') != std::string::npos)
            fail(ErrorKind::InvalidInput, "{}: '{}' has two '=' (separate entries with commas)", flag, part);
        out.push_back({is_default_key(k) ? "" : k, v});
    }
    return out;
}

double parse_number(const std::string& s, const char* flag, const std::string& entry) {
    if (s.empty()) fail(ErrorKind::InvalidInput, "{}: '{}' has no number", flag, entry);
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
        fail(ErrorKind::InvalidInput, "{}: '{}' is not a number", flag, entry);
    return v;
}

/// Applies an assignment (backend or params) with sd.cpp's precedence: module entries win
/// over defaults; the last entry of a key wins.
template <class F>
void apply_assignment(const std::vector<Entry>& es, F&& set) {
    std::optional<std::string> def;
    std::array<std::optional<std::string>, kModuleCount> mod;
    for (auto& e : es) {
        if (e.key.empty()) def = e.value;
        else mod[(size_t)parse_pmodule(e.key)] = e.value;
    }
    for (int i = 0; i < kModuleCount; ++i) {
        if (mod[(size_t)i]) set((PModule)i, *mod[(size_t)i], false);
        else if (def) set((PModule)i, *def, true);
    }
}

}  // namespace

const char* pmodule_name(PModule m) {
    switch (m) {
        case PModule::Diffusion: return "diffusion";
        case PModule::Te: return "te";
        case PModule::Vae: return "vae";
        case PModule::ControlNet: return "controlnet";
        case PModule::Upscaler: return "upscaler";
    }
    return "?";
}

PModule parse_pmodule(const std::string& name) {
    std::string n;
    for (char c : ascii_lower(name))
        if (c != '-' && c != '_') n += c;
    static const std::vector<std::pair<PModule, std::vector<const char*>>> table = {
        {PModule::Diffusion, {"diffusion", "model", "unet", "dit"}},
        {PModule::Te, {"te", "clip", "text", "textencoder", "textencoders", "conditioner", "cond", "llm", "t5", "t5xxl"}},
        {PModule::Vae, {"vae", "firststage", "autoencoder", "tae"}},
        {PModule::ControlNet, {"controlnet", "control"}},
        {PModule::Upscaler, {"upscaler", "esrgan", "hires"}},
    };
    for (auto& [m, names] : table)
        for (auto* a : names)
            if (n == a) return m;
    for (auto* other : {"clipvision", "vision", "photomaker", "photomakerid", "pmid", "photo", "detector", "adetailer", "yolo"})
        if (n == other)
            fail(ErrorKind::InvalidInput, "placement: module '{}' (an sd.cpp module) does not exist in easel; modules: diffusion, te, vae, controlnet, upscaler",
                 name);
    fail(ErrorKind::InvalidInput, "placement: unknown module '{}'; modules: diffusion, te (clip), vae, controlnet, upscaler", name);
}

std::vector<DeviceName> device_names() {
    std::vector<DeviceName> out;
    for (auto& d : list_devices()) out.push_back({d.name, d.type, d.name.rfind("RPC", 0) == 0});
    return out;
}

std::string resolve_device(const std::string& raw, const std::vector<DeviceName>& devs, const char* flag) {
    const std::string name = ascii_lower(trim(raw));
    auto first_of = [&](const char* type) -> const DeviceName* {
        for (auto& d : devs)
            if (d.type == type && !d.rpc) return &d;
        return nullptr;
    };
    if (name.empty() || name == "auto" || name == "default") {
        for (auto* t : {"gpu", "igpu", "cpu"})
            if (auto* d = first_of(t)) return d->name;
        fail(ErrorKind::InvalidInput, "{}: no device to use by default (devices: {})", flag, device_list_text(devs));
    }
    if (name == "gpu") {
        for (auto* t : {"gpu", "igpu"})
            if (auto* d = first_of(t)) return d->name;
        fail(ErrorKind::InvalidInput, "{}: 'gpu' but this machine has no GPU (devices: {}); use cpu", flag, device_list_text(devs));
    }
    for (auto& d : devs)
        if (ascii_lower(d.name) == name) return d.name;
    std::vector<const DeviceName*> hits;
    for (auto& d : devs)
        if (ascii_lower(d.name).rfind(name, 0) == 0) hits.push_back(&d);
    if (hits.size() == 1) return hits[0]->name;
    if (hits.empty())
        fail(ErrorKind::InvalidInput, "{}: unknown device '{}' (devices: {}; see easel devices)", flag, raw, device_list_text(devs));
    std::string amb;
    for (auto* h : hits) amb += (amb.empty() ? "" : ", ") + h->name;
    fail(ErrorKind::InvalidInput, "{}: device '{}' is ambiguous ({}); give more of the name", flag, raw, amb);
}

PlacementSpec parse_placement(const PlacementFlags& f, const std::vector<DeviceName>& devs) {
    PlacementSpec spec;
    // legacy flags prepend entries (sd.cpp's example argument layer), so explicit ones win
    std::string backend = f.backend, params = f.params_backend;
    if (f.vae_on_cpu) backend = "vae=cpu" + (backend.empty() ? "" : "," + backend);
    if (f.clip_on_cpu) backend = "te=cpu" + (backend.empty() ? "" : "," + backend);
    if (f.offload_to_cpu) params = "*=cpu" + (params.empty() ? "" : "," + params);

    const std::string def_dev = resolve_device("auto", devs);
    for (auto& m : spec.modules) m.devices = {def_dev};

    apply_assignment(entries(backend, "--backend"), [&](PModule m, const std::string& v, bool from_default) {
        auto names = split(v, '&');
        if (ascii_lower(trim(v)) == kDisk)
            fail(ErrorKind::InvalidInput, "--backend: 'disk' is a parameter location, not a compute device; use --params-backend {}=disk",
                 pmodule_name(m));
        // a default list splits diffusion and te; vae only when named (its decode is one graph
        // per tile, a split seldom pays)
        const bool multi = m == PModule::Diffusion || m == PModule::Te || (m == PModule::Vae && !from_default);
        if (names.size() > 1 && !multi) {
            if (!from_default)
                fail(ErrorKind::InvalidInput, "--backend: '{}={}': only diffusion, te and vae can be split over several devices", pmodule_name(m), v);
            names.resize(1);
        }
        std::vector<std::string> out;
        for (auto& n : names) {
            if (names.size() > 1 && n.empty())
                fail(ErrorKind::InvalidInput, "--backend: empty device name in the list '{}'", v);
            std::string d = resolve_device(n, devs, "--backend");
            if (std::find(out.begin(), out.end(), d) != out.end())
                fail(ErrorKind::InvalidInput, "--backend: device {} appears twice in '{}'", d, v);
            out.push_back(d);
        }
        spec[m].devices = out;
    });

    apply_assignment(entries(params, "--params-backend"), [&](PModule m, const std::string& v, bool) {
        std::string l = ascii_lower(v);
        if (v.find('&') != std::string::npos)
            fail(ErrorKind::InvalidInput, "--params-backend: '{}' is a device list; parameters have one location (device lists go in --backend)", v);
        if (l == kDisk) spec[m].params = kDisk;
        else if (l.empty() || l == "auto" || l == "default") spec[m].params.clear();
        else spec[m].params = resolve_device(v, devs, "--params-backend");
        spec.params_given[(size_t)m] = spec[m].params;
    });
    // params on the module's only runtime device = resident there (no staging)
    for (auto& m : spec.modules)
        if (m.devices.size() == 1 && m.params == m.devices[0]) m.params.clear();

    // --split-mode
    for (auto& e : entries(f.split_mode, "--split-mode")) {
        std::string v = ascii_lower(e.value);
        if (v != "layer" && v != "row")
            fail(ErrorKind::InvalidInput, "--split-mode: '{}' is not layer or row", e.value);
        SplitMode sm = v == "row" ? SplitMode::Row : SplitMode::Layer;
        if (e.key.empty())
            for (auto& m : spec.modules) m.split = sm;
        else spec[parse_pmodule(e.key)].split = sm;
    }
    // row split is decided per module by the planner (placement/row_split.h): modules with
    // row-split rules run on ggml's meta device, the others warn there and use layer split

    // --max-vram
    for (auto& e : entries(f.max_vram, "--max-vram")) {
        double gib = parse_number(e.value, "--max-vram", e.key.empty() ? e.value : e.key + "=" + e.value);
        if (e.key.empty()) spec.max_vram_all_gib = gib;
        else spec.max_vram_gib[resolve_device(e.key, devs, "--max-vram")] = gib;
    }
    // --headroom
    for (auto& e : entries(f.headroom, "--headroom")) {
        double mib = parse_number(e.value, "--headroom", e.key.empty() ? e.value : e.key + "=" + e.value);
        if (mib < 0) fail(ErrorKind::InvalidInput, "--headroom: '{}' is negative (MiB kept free on a device)", e.value);
        if (e.key.empty()) spec.headroom_all_mib = mib;
        else spec.headroom_mib[resolve_device(e.key, devs, "--headroom")] = mib;
    }

    spec.stream_layers = f.stream_layers;
    if (f.stream_layers) {
        const auto& d = spec[PModule::Diffusion];
        bool host = false;
        for (auto& dn : devs)
            if (dn.name == d.params && dn.type == "cpu") host = true;
        if (!host) {
            spec.warnings.push_back("--stream-layers has no effect unless the diffusion parameters are in host RAM (--params-backend diffusion=cpu); ignoring it");
            spec.stream_layers = false;
        }
    }
    return spec;
}

std::string describe(const PlacementSpec& spec) {
    std::string s;
    for (int i = 0; i < kModuleCount; ++i) {
        auto& m = spec.modules[(size_t)i];
        std::string devs;
        for (auto& d : m.devices) devs += (devs.empty() ? "" : "&") + d;
        s += fmt::format("{}{}: {}{}{}", s.empty() ? "" : "; ", pmodule_name((PModule)i), devs,
                         m.devices.size() > 1 ? (m.split == SplitMode::Row ? " (row)" : " (layer)") : "",
                         m.params.empty() ? "" : ", params " + m.params);
    }
    return s;
}

}  // namespace easel::placement
