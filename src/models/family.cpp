#include "models/family.h"
#include "models/recommended.h"
#include "core/platform.h"

#include "core/error.h"
#include "io/detect.h"
#include "io/diffusers.h"
#include "io/weight_index.h"
#include "models/flux/flux1.h"
#include "models/flux/flux2_klein.h"
#include "models/sd/sdxl.h"
#include "models/sd/stable_diffusion.h"
#include "models/zimage/z_image.h"
#include "sampling/names.h"

#include <cctype>
#include <charconv>
#include <cmath>

#include <filesystem>
#include <functional>

namespace easel::models {

namespace fs = std::filesystem;

const char* module_name(Module m) {
    switch (m) {
    case Module::Te: return "te";
    case Module::Diffusion: return "diffusion";
    case Module::VaeDecoder: return "vae";
    case Module::VaeEncoder: return "vae encoder";
    }
    return "?";
}

void Family::set_reference_images(std::span<const vae::HostTensor> images) {
    if (!images.empty())
        fail(ErrorKind::Unsupported, "{} takes no reference images (-r/--ref-image is for edit models such as FLUX.2 Klein)", name());
}

void Family::check_reference_image(int, int) const {
    fail(ErrorKind::Unsupported, "{} takes no reference images (-r/--ref-image is for edit models such as FLUX.2 Klein)", name());
}

namespace {

using Opener = std::function<std::unique_ptr<Family>(const ModelFiles&, const FamilyOptions&)>;

/// io::detect's family name -> the family that runs it. One line per family.
struct FamilyEntry {
    const char* detected;  ///< Detection::family
    Opener open;
};

const std::vector<FamilyEntry>& family_table() {
    static const std::vector<FamilyEntry> t = {
        {"SD1.x", [](const ModelFiles& f, const FamilyOptions& o) -> std::unique_ptr<Family> { return sd::StableDiffusion::open(f, o); }},
        {"SD2.x", [](const ModelFiles& f, const FamilyOptions& o) -> std::unique_ptr<Family> { return sd::StableDiffusion::open(f, o); }},
        {"SDXL", [](const ModelFiles& f, const FamilyOptions& o) -> std::unique_ptr<Family> { return sd::StableDiffusionXL::open(f, o); }},
        {"Z-Image", [](const ModelFiles& f, const FamilyOptions& o) -> std::unique_ptr<Family> { return zimage::ZImage::open(f, o); }},
        {"FLUX.2", [](const ModelFiles& f, const FamilyOptions& o) -> std::unique_ptr<Family> { return flux::Flux2Klein::open(f, o); }},
        {"FLUX.1", [](const ModelFiles& f, const FamilyOptions& o) -> std::unique_ptr<Family> { return flux::Flux1::open(f, o); }},
    };
    return t;
}

/// The file or folder holding the diffusion model and the flag that named it.
std::pair<fs::path, std::string> diffusion_source(const ModelFiles& files) {
    if (!files.diffusion_model.empty()) return {platform::u8path(files.diffusion_model), "--diffusion-model"};
    const fs::path model = platform::u8path(files.model);
    if (io::is_pipeline_folder(model)) {
        for (auto& c : io::list_pipeline_components(model))
            if (c.name == "unet" || c.name == "transformer") return {c.folder, "-m"};
    }
    return {model, "-m"};
}

}  // namespace

RecommendedSettings read_recommended(const std::map<std::string, io::MetaValue>& metadata, const std::string& file) {
    RecommendedSettings r;
    r.file = file;
    auto bad = [&](const std::string& key, const std::string& value, const std::string& want) {
        fail(ErrorKind::InvalidInput,
             "{}: metadata {} = \"{}\" is not {}; fix the file (tools/demo-model/set_meta.py FILE {}=VALUE, or {}= to remove the key)",
             file, key, value, want, key, key);
    };
    // safetensors metadata values are strings; GGUF keeps the type
    auto text = [&](const char* key) -> std::optional<std::string> {
        auto it = metadata.find(key);
        if (it == metadata.end()) return std::nullopt;
        const io::MetaValue& v = it->second;
        switch (v.kind) {
        case io::MetaValue::Kind::String: return v.s;
        case io::MetaValue::Kind::Int: return std::to_string(v.i);
        case io::MetaValue::Kind::Float: return fmt::format("{}", v.f);
        default: bad(key, "(an array or boolean)", "a string or number"); return std::nullopt;
        }
    };
    auto integer = [&](const char* key, int lo, int hi, int multiple, const char* want) -> std::optional<int> {
        auto t = text(key);
        if (!t) return std::nullopt;
        int n = 0;
        const auto [end, ec] = std::from_chars(t->data(), t->data() + t->size(), n);
        if (ec != std::errc() || end != t->data() + t->size() || n < lo || n > hi || n % multiple != 0) bad(key, *t, want);
        return n;
    };
    if (auto t = text("easel.sampler")) {
        try {
            (void)sampling::resolve_sampler_name(*t);
        } catch (const Error&) {
            bad("easel.sampler", *t, "a --sampling-method name (euler, euler_a, dpm++2m, ...)");
        }
        r.sampler = *t;
    }
    if (auto t = text("easel.scheduler")) {
        try {
            (void)sampling::resolve_scheduler_name(*t);
        } catch (const Error&) {
            bad("easel.scheduler", *t, "a --scheduler name (discrete, karras, exponential, ...)");
        }
        r.scheduler = *t;
    }
    if (auto t = text("easel.cfg_scale")) {
        float v = 0;
        const auto [end, ec] = std::from_chars(t->data(), t->data() + t->size(), v);
        if (ec != std::errc() || end != t->data() + t->size() || !std::isfinite(v) || v <= 0) bad("easel.cfg_scale", *t, "a number > 0");
        r.cfg_scale = v;
    }
    r.steps = integer("easel.steps", 1, 10000, 1, "an integer from 1 to 10000");
    r.width = integer("easel.width", 8, 16384, 8, "a multiple of 8 from 8 to 16384");
    r.height = integer("easel.height", 8, 16384, 8, "a multiple of 8 from 8 to 16384");
    return r;
}

RecommendedSettings read_recommended(const ModelFiles& files) {
    if (files.model.empty() && files.diffusion_model.empty()) return {};
    auto [path, flag] = diffusion_source(files);
    std::error_code ec;
    if (!fs::exists(path, ec)) return {};  // open_family says so
    // PyTorch pickles carry no easel.* keys, and parsing one again is not free
    std::string ext = path.extension().string();
    for (auto& c : ext) c = (char)std::tolower((unsigned char)c);
    if (ext == ".ckpt" || ext == ".pt" || ext == ".pth" || ext == ".bin") return {};
    const io::WeightIndex wi = io::WeightIndex::open(path);  // headers only
    return read_recommended(wi.metadata(), platform::path_utf8(path));
}

std::unique_ptr<Family> open_family(const ModelFiles& files, const FamilyOptions& opt) {
    if (files.model.empty() && files.diffusion_model.empty())
        fail(ErrorKind::InvalidInput, "no model given: pass -m MODEL (a checkpoint file or a diffusers folder) or --diffusion-model");
    auto [path, flag] = diffusion_source(files);
    std::error_code ec;
    if (!fs::exists(path, ec)) fail(ErrorKind::Io, "{} {}: no such file or folder", flag, platform::path_utf8(path));
    io::Detection d;
    {
        io::WeightIndex wi = io::WeightIndex::open(path);  // headers only
        d = io::detect(wi);
    }
    for (const auto& e : family_table())
        if (d.family == e.detected) return e.open(files, opt);
    // Not a family of the table. A bare UNet file (--diffusion-model) may be detected only as
    // "diffusion model" parts; let the SD family decide from the UNet's own keys.
    bool has_unet = false;
    for (auto& c : d.components) has_unet = has_unet || c.kind == "unet";
    if (has_unet) return sd::StableDiffusion::open(files, opt);
    std::string found = d.family == "unknown" ? "nothing easel recognises" : d.family + (d.variant.empty() ? "" : " " + d.variant);
    fail(ErrorKind::ModelMismatch,
         "{} {}: holds {}, not a diffusion model easel runs (no SD1.x/SD2.x/SDXL UNet); pass an SD checkpoint as -m, or the UNet as --diffusion-model",
         flag, platform::path_utf8(path), found);
}

}  // namespace easel::models
