#include "server/job_request.h"

#include "core/error.h"
#include "pipeline/image_io.h"
#include "server/base64.h"
#include "server/samplers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>

namespace easel::server {

using nlohmann::json;

namespace {

std::string type_name(const json& v) {
    switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number with a fraction";
    default: return "a number";
    }
}

/// Typed access to the fields of one JSON object; every refusal names the field (with `prefix`
/// for nested objects: "sample_params.sample_steps"). null counts as absent (pydantic Optional).
class Fields {
public:
    Fields(const json& obj, std::string prefix = "") : j_(obj), prefix_(std::move(prefix)) {}

    std::string name(const std::string& key) const { return prefix_ + key; }
    const json* get(const std::string& key) const {
        auto it = j_.find(key);
        if (it == j_.end() || it->is_null()) return nullptr;
        return &*it;
    }
    bool has(const std::string& key) const { return get(key) != nullptr; }

    std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) const {
        const json* v = get(key);
        if (!v) return std::nullopt;
        int64_t x = 0;
        if (v->is_number_integer()) {
            if (v->is_number_unsigned() && v->get<uint64_t>() > (uint64_t)std::numeric_limits<int64_t>::max())
                refuse(400, name(key), "{} {} is out of range ({} to {})", name(key), v->dump(), lo, hi);
            x = v->get<int64_t>();
        } else if (v->is_number_float()) {
            const double d = v->get<double>();
            if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e18)
                refuse(400, name(key), "{} must be an integer, got {}", name(key), v->dump());
            x = (int64_t)d;
        } else {
            refuse(400, name(key), "{} must be an integer, got {}", name(key), type_name(*v));
        }
        if (x < lo || x > hi) refuse(400, name(key), "{} {} is out of range ({} to {})", name(key), x, lo, hi);
        return x;
    }

    std::optional<double> number(const std::string& key, double lo, double hi) const {
        const json* v = get(key);
        if (!v) return std::nullopt;
        if (!v->is_number()) refuse(400, name(key), "{} must be a number, got {}", name(key), type_name(*v));
        const double d = v->get<double>();
        if (!std::isfinite(d) || d < lo || d > hi) refuse(400, name(key), "{} {} is out of range ({} to {})", name(key), v->dump(), lo, hi);
        return d;
    }

    std::optional<std::string> string(const std::string& key, size_t max_bytes) const {
        const json* v = get(key);
        if (!v) return std::nullopt;
        if (!v->is_string()) refuse(400, name(key), "{} must be a string, got {}", name(key), type_name(*v));
        const auto& s = v->get_ref<const std::string&>();
        if (s.size() > max_bytes) refuse(413, name(key), "{} is {} bytes; at most {} are accepted", name(key), s.size(), max_bytes);
        return s;
    }

    /// true/false, or 0/1 (A1111's int flags such as inpainting_mask_invert).
    std::optional<bool> boolean(const std::string& key) const {
        const json* v = get(key);
        if (!v) return std::nullopt;
        if (v->is_boolean()) return v->get<bool>();
        if (v->is_number_integer() && (v->get<int64_t>() == 0 || v->get<int64_t>() == 1)) return v->get<int64_t>() == 1;
        refuse(400, name(key), "{} must be true or false, got {}", name(key), v->dump().substr(0, 64));
    }

    const json* object(const std::string& key) const {
        const json* v = get(key);
        if (v && !v->is_object()) refuse(400, name(key), "{} must be an object, got {}", name(key), type_name(*v));
        return v;
    }
    const json* array(const std::string& key) const {
        const json* v = get(key);
        if (v && !v->is_array()) refuse(400, name(key), "{} must be an array, got {}", name(key), type_name(*v));
        return v;
    }

    /// A field easel has no use for except at one value: absent, null, or `ok` pass; anything
    /// else is refused naming what easel does instead.
    void only(const std::string& key, const json& ok, std::string_view why) const {
        const json* v = get(key);
        if (!v || *v == ok) return;
        if (ok.is_number() && v->is_number() && v->get<double>() == ok.get<double>()) return;
        if (ok.is_boolean() && v->is_number_integer() && v->get<int64_t>() == (ok.get<bool>() ? 1 : 0)) return;
        refuse(400, name(key), "{} {} is not supported: {} (send {} or leave it out)", name(key), v->dump().substr(0, 64), why, ok.dump());
    }
    /// Refuses the object's first key (in key order) that is not in `keys`: sd-server drops such
    /// a key silently, so a misspelt field ("sample_step") would pass unnoticed. `where` names
    /// the object in the message, which lists the fields it takes.
    void known(std::initializer_list<std::string_view> keys, std::string_view where) const {
        if (!j_.is_object()) return;
        for (auto it = j_.begin(); it != j_.end(); ++it) {
            if (std::find(keys.begin(), keys.end(), it.key()) != keys.end()) continue;
            std::string list;
            for (std::string_view k : keys) list += fmt::format("{}{}", list.empty() ? "" : ", ", k);
            refuse(400, name(it.key()).substr(0, 128), "{} is not a field of {} (easel refuses unknown fields rather than dropping them; "
                   "the fields are: {})", name(it.key()).substr(0, 128), where, list);
        }
    }
    /// An array / object / string field accepted only when empty.
    void only_empty(const std::string& key, std::string_view why) const {
        const json* v = get(key);
        if (!v || ((v->is_array() || v->is_object()) && v->empty()) || (v->is_string() && v->get_ref<const std::string&>().empty())) return;
        refuse(400, name(key), "{} is not supported: {} (leave it out or empty)", name(key), why);
    }

private:
    const json& j_;
    std::string prefix_;
};

/// Decodes an image field (base64 or data URL), checking its size; `what` names the field.
std::vector<uint8_t> image_field(const json& v, const std::string& what, const Limits& limits) {
    if (!v.is_string()) refuse(400, what, "{} must be a base64 string (or a data: URL), got {}", what, type_name(v));
    const auto& s = v.get_ref<const std::string&>();
    if (s.rfind("http://", 0) == 0 || s.rfind("https://", 0) == 0)
        refuse(400, what, "{}: image URLs are not fetched; send the image as base64", what);
    if (s.size() / 4 * 3 > limits.max_image_bytes + 3)
        refuse(413, what, "{} is {} bytes of base64; an image may have at most {} bytes", what, s.size(), limits.max_image_bytes);
    auto bytes = base64_decode(s, limits.max_image_bytes);
    if (!bytes) refuse(400, what, "{} is not valid base64 (or a data:image/...;base64, URL)", what);
    (void)check_image(*bytes, what, limits);
    return std::move(*bytes);
}

void check_size(int64_t v, const std::string& field, const Limits& limits) {
    if (v < 8 || v > limits.max_side) refuse(400, field, "{} {} is out of range (8 to {} pixels)", field, v, limits.max_side);
}

/// "WxH" (OpenAI size): the two sides; "auto" or empty: {0, 0}.
std::pair<int, int> parse_size(const std::string& s, const Limits& limits) {
    if (s.empty() || s == "auto") return {0, 0};
    static const std::regex re("([0-9]{1,6})x([0-9]{1,6})");
    std::smatch m;
    if (!std::regex_match(s, m, re)) refuse(400, "size", "size \"{}\" must be WIDTHxHEIGHT (e.g. 512x512) or auto", s.substr(0, 32));
    const int w = std::stoi(m[1].str()), h = std::stoi(m[2].str());
    check_size(w, "size", limits);
    check_size(h, "size", limits);
    return {w, h};
}

void set_prompt(JobRequest& r, const Fields& f, const std::string& key, const Limits& limits, bool negative = false) {
    if (auto p = f.string(key, limits.max_prompt_bytes)) (negative ? r.negative_prompt : r.prompt) = *p;
}

/// sd.cpp's native fields (its img_gen body and the OpenAI <sd_cpp_extra_args> block) onto `r`.
/// Every field sd-server reads (SDGenerationParams::from_json_str, plus output_format and
/// output_compression) is applied, accepted at the one value easel runs, or accepted as having
/// no effect where sd-server's has none either without its input image (control_strength,
/// ip_adapter_strength, vace_strength, moe_boundary, the ref-image switches); any other key is
/// refused naming it. `where` names the object in messages.
void apply_sdcpp_fields(JobRequest& r, const json& body, const Limits& limits, std::string_view where) {
    Fields f(body);
    f.known({"prompt", "negative_prompt", "clip_skip", "width", "height", "strength", "seed", "batch_count", "init_image", "mask_image",
             "sample_params", "lora", "hires", "ref_images", "control_image", "ip_adapter_image", "end_image", "control_frames",
             "embed_image_metadata", "output_format", "output_compression", "cache_mode", "cache_option", "scm_mask", "ad_model",
             "ad_prompt", "ad_negative_prompt", "extra_ad_args", "high_noise_sample_params", "vae_tiling_params", "video_frames", "fps",
             "upscale_repeats", "qwen_image_layers", "control_strength", "ip_adapter_strength", "vace_strength", "moe_boundary",
             "auto_resize_ref_image", "increase_ref_index"},
            where);
    set_prompt(r, f, "prompt", limits);
    set_prompt(r, f, "negative_prompt", limits, true);
    if (auto v = f.integer("clip_skip", -1, 12)) r.clip_skip = *v <= 0 ? std::nullopt : std::optional<int>((int)*v);
    if (auto v = f.integer("width", -1, limits.max_side); v && *v > 0) {
        check_size(*v, "width", limits);
        r.width = (int)*v;
    }
    if (auto v = f.integer("height", -1, limits.max_side); v && *v > 0) {
        check_size(*v, "height", limits);
        r.height = (int)*v;
    }
    if (auto v = f.number("strength", 0.0, 1.0)) r.strength = *v;
    if (auto v = f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) r.seed = *v < 0 ? -1 : *v;
    if (auto v = f.integer("batch_count", 1, limits.max_batch)) r.batch = (int)*v;
    if (const json* v = f.get("init_image")) {
        r.init_image = image_field(*v, "init_image", limits);
        r.type = "img2img";
    }
    if (const json* v = f.get("mask_image")) r.mask = image_field(*v, "mask_image", limits);
    f.only_empty("ref_images", "reference images are not taken by the server yet");
    f.only("control_image", nullptr, "easel has no ControlNet");
    f.only("ip_adapter_image", nullptr, "easel has no IP-Adapter");
    f.only("embed_image_metadata", true, "easel always writes the PNG parameters");
    f.only("output_format", "png", "easel writes PNG");
    if (f.string("cache_mode", 64).value_or("") != "")  // "" is sd-server's default: no cache
        f.only("cache_mode", "disabled", "easel has no step cache");
    f.only_empty("cache_option", "easel has no step cache");
    f.only_empty("scm_mask", "easel has no step cache");
    for (const char* k : {"ad_model", "ad_prompt", "ad_negative_prompt", "extra_ad_args"}) f.only_empty(k, "easel has no after-detailer pass");
    f.only("end_image", nullptr, "easel makes images, not videos");
    f.only_empty("control_frames", "easel makes images, not videos");
    f.only("video_frames", 1, "easel makes images, not videos");
    (void)f.integer("fps", 0, 1000);  // video only: no effect on an image, as in sd-server
    f.only("upscale_repeats", 1, "the server's upscaler runs once (--upscale-model)");
    (void)f.integer("qwen_image_layers", 0, 1000);  // Qwen-Image-Layered only: no effect here, as in sd-server
    f.only_empty("high_noise_sample_params", "easel has no high-noise (Wan 2.2) model");
    f.only_empty("vae_tiling_params", "VAE tiling is the server's --vae-tiling");
    // the strengths of inputs easel refuses (control / IP-Adapter / VACE images, a MoE model):
    // no effect without them, as in sd-server
    for (const char* k : {"control_strength", "ip_adapter_strength", "vace_strength", "moe_boundary"}) (void)f.number(k, -1000.0, 1000.0);
    (void)f.boolean("auto_resize_ref_image");
    (void)f.boolean("increase_ref_index");
    (void)f.integer("output_compression", 0, 100);  // JPEG / WebP quality: easel writes lossless PNG
    if (const json* sp = f.object("sample_params")) {
        Fields s(*sp, "sample_params.");
        s.known({"sample_method", "scheduler", "sample_steps", "eta", "shifted_timestep", "flow_shift", "custom_sigmas", "extra_sample_args",
                 "guidance"},
                fmt::format("{}'s sample_params", where));
        s.only_empty("extra_sample_args", "easel's samplers take no extra arguments");
        auto sampler = s.string("sample_method", 64).value_or("");
        auto sched = s.string("scheduler", 64).value_or("");
        const SamplerChoice c = map_sampler(sampler, sched, "sample_params.sample_method", "sample_params.scheduler");
        r.sampler = c.method;
        r.scheduler = c.scheduler;
        if (auto v = s.integer("sample_steps", -1, limits.max_steps); v && *v > 0) r.steps = (int)*v;
        if (auto v = s.number("eta", 0.0, 100.0)) r.eta = *v;
        s.only("shifted_timestep", 0, "easel has no timestep shift");
        s.only_empty("custom_sigmas", "easel takes no custom sigmas");
        s.only("flow_shift", nullptr, "the flow shift is the server's --flow-shift");
        if (const json* g = s.object("guidance")) {
            Fields gf(*g, "sample_params.guidance.");
            gf.known({"txt_cfg", "img_cfg", "distilled_guidance", "slg"}, fmt::format("{}'s sample_params.guidance", where));
            if (auto v = gf.number("txt_cfg", 0.0, 100.0)) r.cfg_scale = *v;
            gf.only("img_cfg", nullptr, "easel has no image CFG");
            gf.only("distilled_guidance", nullptr, "the distilled guidance is the server's --guidance");
            if (const json* slg = gf.object("slg")) {
                Fields sf(*slg, "sample_params.guidance.slg.");
                sf.known({"scale", "layers", "layer_start", "layer_end"}, fmt::format("{}'s sample_params.guidance.slg", where));
                sf.only("scale", 0, "easel has no skip-layer guidance");
                (void)sf.array("layers");  // no effect at scale 0, as in sd-server
                (void)sf.number("layer_start", 0.0, 1.0);
                (void)sf.number("layer_end", 0.0, 1.0);
            }
        }
    }
    if (const json* l = f.array("lora")) {
        for (size_t i = 0; i < l->size() && i < 64; ++i) {
            const std::string field = fmt::format("lora[{}]", i);
            if (!(*l)[i].is_object()) refuse(400, field, "{} must be an object {{\"path\": ..., \"multiplier\": ...}}", field);
            Fields lf((*l)[i], field + ".");
            lf.known({"path", "multiplier", "is_high_noise"}, fmt::format("{}'s {}", where, field));
            LoraRef ref;
            ref.name = lf.string("path", 1024).value_or("");
            if (ref.name.empty()) refuse(400, field + ".path", "{}.path is required", field);
            ref.multiplier = lf.number("multiplier", -100.0, 100.0).value_or(1.0);
            lf.only("is_high_noise", false, "easel has no high-noise model");
            r.loras.push_back(std::move(ref));
        }
        if (l->size() > 64) refuse(400, "lora", "lora lists {} entries; at most 64", l->size());
    }
    if (const json* h = f.object("hires")) {
        // sd-server's hires object (its defaults: Latent, scale 2, strength 0.7; upscaler None = off)
        Fields hf(*h, "hires.");
        hf.known({"enabled", "upscaler", "scale", "target_width", "target_height", "steps", "denoising_strength", "custom_sigmas",
                  "upscale_tile_size"},
                 fmt::format("{}'s hires", where));
        const std::string up = hf.string("upscaler", 256).value_or("Latent");
        r.hires = hf.boolean("enabled").value_or(false) && up != "None";
        if (auto v = hf.number("scale", 0.01, 16.0)) r.hr_scale = *v;
        if (auto v = hf.integer("target_width", 0, limits.max_side * 16)) r.hr_resize_x = (int)*v;
        if (auto v = hf.integer("target_height", 0, limits.max_side * 16)) r.hr_resize_y = (int)*v;
        if (auto v = hf.integer("steps", 0, limits.max_steps)) r.hr_steps = (int)*v;
        r.hires_strength = 0.7;
        if (auto v = hf.number("denoising_strength", 0.0, 1.0)) {
            if (*v <= 0) refuse(400, "hires.denoising_strength", "hires.denoising_strength must be in (0, 1]");
            r.hires_strength = *v;
        }
        r.hr_upscaler = up;
        hf.only_empty("custom_sigmas", "the server's hires pass cuts its schedule by denoising_strength");
        hf.only("upscale_tile_size", 128, "the upscaler's tile is the server's --upscale-tile-size (sd.cpp's default 128 is accepted)");
        if (!r.hires) r.hr_upscaler.clear();
    }
}

/// Removes sd-server's <sd_cpp_extra_args>{json}</sd_cpp_extra_args> block from a prompt and
/// returns its JSON (nullopt when none).
std::optional<json> take_extra_args(std::string& prompt, const Limits& limits) {
    static const std::string open = "<sd_cpp_extra_args>", close = "</sd_cpp_extra_args>";
    const size_t a = prompt.find(open);
    if (a == std::string::npos) return std::nullopt;
    const size_t b = prompt.find(close, a + open.size());
    if (b == std::string::npos) refuse(400, "prompt", "prompt has <sd_cpp_extra_args> without </sd_cpp_extra_args>");
    const std::string body = prompt.substr(a + open.size(), b - a - open.size());
    prompt.erase(a, b + close.size() - a);
    json j;
    try {
        j = parse_json_body(body, limits);
    } catch (const ApiError& e) {
        refuse(400, "prompt", "prompt: its <sd_cpp_extra_args> block: {}", e.what());
    }
    return j;
}

}  // namespace

bool valid_job_id(std::string_view id) {
    if (id.empty() || id.size() > 64) return false;
    for (char c : id)
        if (!(std::isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.' || c == '(' || c == ')')) return false;
    return id != "." && id != "..";
}

ImageShape check_image(const std::vector<uint8_t>& bytes, const std::string& field, const Limits& limits) {
    if (bytes.size() > limits.max_image_bytes)
        refuse(413, field, "{} is {} bytes; an image may have at most {}", field, bytes.size(), limits.max_image_bytes);
    pipeline::ImageInfo info;
    try {
        info = pipeline::probe_image(bytes, field);
    } catch (const Error& e) {
        refuse(400, field, "{}", e.what());
    }
    if (info.width <= 0 || info.height <= 0 || (int64_t)info.width * info.height > limits.max_image_pixels)
        refuse(413, field, "{} is {}x{} pixels; at most {} pixels are accepted", field, info.width, info.height, limits.max_image_pixels);
    return {info.width, info.height, info.channels};
}

json parse_json_body(std::string_view body, const Limits& limits) {
    if (body.size() > limits.max_body_bytes)
        refuse(413, "", "request body is {} bytes, over the limit of {} bytes (set by --max-body-mib); send a smaller body", body.size(),
               limits.max_body_bytes);
    if (body.empty()) refuse(400, "", "request body is missing (empty, or no Content-Length): send a JSON object with Content-Type: application/json");
    // nesting is bounded before parsing: nlohmann's recursive parser would exhaust the stack
    int depth = 0, max_depth = 0;
    bool in_string = false, escaped = false;
    for (char c : body) {
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') in_string = true;
        else if (c == '{' || c == '[') max_depth = std::max(max_depth, ++depth);
        else if (c == '}' || c == ']') --depth;
    }
    if (max_depth > 32) refuse(400, "", "request body nests {} levels deep; at most 32", max_depth);
    json j;
    try {
        j = json::parse(body);
    } catch (const json::parse_error& e) {
        refuse(400, "", "request body is not valid JSON (byte {}): {}", e.byte, std::string(e.what()).substr(0, 200));
    } catch (const json::exception& e) {  // e.g. a number too large for a double (out_of_range 406)
        refuse(400, "", "request body is not usable JSON: {}", std::string(e.what()).substr(0, 200));
    }
    if (!j.is_object()) refuse(400, "", "request body must be a JSON object, got {}", type_name(j));
    return j;
}

JobRequest parse_a1111(const json& body, bool img2img, const Limits& limits) {
    if (!body.is_object()) refuse(400, "", "request body must be a JSON object");
    Fields f(body);
    JobRequest r;
    r.type = img2img ? "img2img" : "txt2img";
    set_prompt(r, f, "prompt", limits);
    set_prompt(r, f, "negative_prompt", limits, true);
    f.only_empty("styles", "easel has no prompt styles");
    if (auto v = f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) r.seed = *v < 0 ? -1 : *v;
    f.only("subseed_strength", 0, "easel has no variation seeds");
    f.only("seed_resize_from_h", -1, "easel does not resize seeds");
    f.only("seed_resize_from_w", -1, "easel does not resize seeds");
    {
        std::string sampler = f.string("sampler_name", 64).value_or("");
        if (sampler.empty()) sampler = f.string("sampler_index", 64).value_or("");
        const SamplerChoice c = map_sampler(sampler, f.string("scheduler", 64).value_or(""),
                                            f.has("sampler_name") ? "sampler_name" : "sampler_index", "scheduler");
        r.sampler = c.method;
        r.scheduler = c.scheduler;
    }
    const int64_t bs = f.integer("batch_size", 1, limits.max_batch).value_or(1);
    const int64_t ni = f.integer("n_iter", 1, limits.max_batch).value_or(1);
    if (bs * ni > limits.max_batch)
        refuse(400, "batch_size", "batch_size {} x n_iter {} = {} images; at most {} per request", bs, ni, bs * ni, limits.max_batch);
    r.batch = (int)(bs * ni);
    if (auto v = f.integer("steps", 1, limits.max_steps)) r.steps = (int)*v;
    if (auto v = f.number("cfg_scale", 0.0, 100.0)) r.cfg_scale = *v;
    if (auto v = f.integer("width", 8, limits.max_side)) r.width = (int)*v;
    if (auto v = f.integer("height", 8, limits.max_side)) r.height = (int)*v;
    if (auto v = f.number("eta", 0.0, 100.0)) r.eta = *v;
    if (auto v = f.integer("clip_skip", -1, 12); v && *v > 0) r.clip_skip = (int)*v;
    f.only("restore_faces", false, "easel has no face restoration");
    f.only("tiling", false, "easel has no seamless tiling");
    if (!img2img && f.boolean("enable_hr").value_or(false)) {
        // A1111 StableDiffusionProcessingTxt2Img's hires fix (docs/server.md)
        r.hires = true;
        if (auto v = f.number("hr_scale", 0.01, 16.0)) r.hr_scale = *v;
        if (auto v = f.integer("hr_resize_x", 0, limits.max_side * 16)) r.hr_resize_x = (int)*v;
        if (auto v = f.integer("hr_resize_y", 0, limits.max_side * 16)) r.hr_resize_y = (int)*v;
        if (auto v = f.integer("hr_second_pass_steps", 0, limits.max_steps)) r.hr_steps = (int)*v;
        if (auto v = f.number("denoising_strength", 0.0, 1.0)) {
            if (*v <= 0) refuse(400, "denoising_strength", "denoising_strength 0 leaves the hires pass nothing to do; give (0, 1] or enable_hr false");
            r.hires_strength = *v;
        }
        r.hr_upscaler = f.string("hr_upscaler", 256).value_or("");
        f.only("hr_sampler_name", nullptr, "the hires pass uses the first pass's sampler");
        f.only("hr_scheduler", nullptr, "the hires pass uses the first pass's scheduler");
        f.only("hr_checkpoint_name", nullptr, "the hires pass uses the loaded model");
        f.only("hr_cfg", nullptr, "the hires pass uses cfg_scale");
        f.only("hr_prompt", "", "the hires pass uses the prompt");
        f.only("hr_negative_prompt", "", "the hires pass uses the negative prompt");
    } else {
        (void)f.boolean("enable_hr");
    }
    f.only("s_churn", 0, "easel's samplers take no churn");
    f.only("s_noise", 1, "easel's samplers use s_noise 1");
    f.only("script_name", nullptr, "easel runs no scripts");
    f.only("infotext", nullptr, "easel does not read settings from an infotext");
    f.only_empty("script_args", "easel runs no scripts");
    f.only_empty("alwayson_scripts", "easel runs no scripts");
    (void)f.boolean("send_images");
    (void)f.boolean("save_images");
    (void)f.boolean("do_not_save_samples");
    (void)f.boolean("do_not_save_grid");
    if (auto id = f.string("force_task_id", 256)) {
        if (!valid_job_id(*id)) refuse(400, "force_task_id", "force_task_id must be 1-64 characters of A-Z a-z 0-9 _ - . ( )");
        r.force_id = *id;
    }
    if (const json* o = f.object("override_settings")) {
        Fields of(*o, "override_settings.");
        for (auto it = o->begin(); it != o->end(); ++it) {
            const std::string& k = it.key();
            if (k == "CLIP_stop_at_last_layers") {
                if (auto v = of.integer(k, 1, 12)) r.clip_skip = (int)*v;
            } else if (k == "sd_model_checkpoint") {
                r.model_checkpoint = of.string(k, 1024).value_or("");
            } else if (k == "sd_vae") {
                of.only(k, "Automatic", "the VAE is the server's --vae");
            } else if (k == "samples_format") {
                of.only(k, "png", "easel writes PNG");
            } else {
                refuse(400, "override_settings." + k,
                       "override_settings.{} is not an option easel applies per request (it applies CLIP_stop_at_last_layers, "
                       "sd_model_checkpoint = the loaded model, sd_vae Automatic, samples_format png)",
                       k.substr(0, 64));
            }
        }
    }
    if (img2img) {
        const json* inits = f.array("init_images");
        if (!inits || inits->empty()) refuse(400, "init_images", "init_images is required: a list with one base64 image");
        if (inits->size() > 1) refuse(400, "init_images", "init_images has {} images; easel takes one", inits->size());
        r.init_image = image_field((*inits)[0], "init_images[0]", limits);
        if (const json* m = f.get("mask")) r.mask = image_field(*m, "mask", limits);
        if (auto v = f.number("denoising_strength", 0.0, 1.0)) r.strength = *v;
        r.mask_blur = (int)f.integer("mask_blur", 0, 64).value_or(4);
        if (auto x = f.integer("mask_blur_x", 0, 64), y = f.integer("mask_blur_y", 0, 64); (x || y) && !f.has("mask_blur")) {
            if (x.value_or(4) != y.value_or(4))
                refuse(400, "mask_blur_x", "mask_blur_x {} and mask_blur_y {} differ; easel blurs the mask evenly", x.value_or(4), y.value_or(4));
            r.mask_blur = (int)x.value_or(4);
        }
        r.mask_invert = f.boolean("inpainting_mask_invert").value_or(false);
        f.only("inpainting_fill", 1, "easel in-paints from the original image (inpainting_fill 1)");
        f.only("inpaint_full_res", false, "easel in-paints the whole picture (inpaint_full_res false)");
        (void)f.integer("inpaint_full_res_padding", 0, 4096);
        f.only("resize_mode", 0, "easel resizes the init image to width x height (resize_mode 0)");
        f.only("image_cfg_scale", nullptr, "easel has no image CFG");
        f.only("initial_noise_multiplier", 1, "easel noises the init latent by the schedule alone");
        f.only("latent_mask", nullptr, "easel takes the mask from `mask`");
    }
    // the `parameters` A1111 echoes: the body, without the images unless include_init_images
    r.parameters = body;
    const bool keep_images = img2img && f.boolean("include_init_images").value_or(false);
    if (!keep_images && r.parameters.contains("init_images")) r.parameters["init_images"] = nullptr;
    if (!keep_images && r.parameters.contains("mask")) r.parameters["mask"] = nullptr;
    return r;
}

JobRequest parse_easel_job(const json& body, const Limits& limits) {
    if (!body.is_object()) refuse(400, "", "request body must be a JSON object");
    std::string type = body.contains("init_images") && !body["init_images"].is_null() ? "img2img" : "txt2img";
    if (auto t = Fields(body).string("type", 16)) type = *t;
    if (type != "txt2img" && type != "img2img") refuse(400, "type", "type \"{}\" must be txt2img or img2img", type);
    json rest = body;
    rest.erase("type");
    JobRequest r = parse_a1111(rest, type == "img2img", limits);
    return r;
}

OpenAIRequest parse_openai_generation(const json& body, const Limits& limits) {
    if (!body.is_object()) refuse(400, "", "request body must be a JSON object");
    Fields f(body);
    OpenAIRequest o;
    JobRequest& r = o.job;
    r.prompt = f.string("prompt", limits.max_prompt_bytes).value_or("");
    if (r.prompt.empty()) refuse(400, "prompt", "prompt is required");
    if (auto n = f.integer("n", 1, limits.max_batch)) r.batch = (int)*n;
    if (auto s = f.string("size", 32)) std::tie(r.width, r.height) = parse_size(*s, limits);
    o.response_format = f.string("response_format", 16).value_or("b64_json");
    if (o.response_format != "b64_json" && o.response_format != "url")
        refuse(400, "response_format", "response_format \"{}\" must be b64_json or url", o.response_format);
    f.only("output_format", "png", "easel writes PNG");
    f.only("stream", false, "easel does not stream partial images");
    f.only("background", "auto", "easel draws opaque images");
    for (const char* k : {"model", "quality", "style", "user", "moderation"}) (void)f.string(k, 256);
    (void)f.integer("output_compression", 0, 100);
    if (auto extra = take_extra_args(r.prompt, limits)) apply_sdcpp_fields(r, *extra, limits, "<sd_cpp_extra_args>");
    return o;
}

OpenAIRequest parse_openai_edit(const std::vector<FormPart>& parts, const Limits& limits) {
    OpenAIRequest o;
    JobRequest& r = o.job;
    r.type = "img2img";
    auto text = [&](const std::string& key) -> std::optional<std::string> {
        for (const auto& p : parts)
            if (p.name == key) {
                if (!p.filename.empty()) refuse(400, key, "{} must be a text field, not a file", key);
                if (p.content.size() > limits.max_prompt_bytes)
                    refuse(413, key, "{} is {} bytes; at most {}", key, p.content.size(), limits.max_prompt_bytes);
                return p.content;
            }
        return std::nullopt;
    };
    auto integer = [&](const std::string& key, int lo, int hi) -> std::optional<int> {
        auto s = text(key);
        if (!s) return std::nullopt;
        static const std::regex re("-?[0-9]{1,9}");
        if (!std::regex_match(*s, re)) refuse(400, key, "{} must be an integer, got \"{}\"", key, s->substr(0, 32));
        const int v = std::stoi(*s);
        if (v < lo || v > hi) refuse(400, key, "{} {} is out of range ({} to {})", key, v, lo, hi);
        return v;
    };
    r.prompt = text("prompt").value_or("");
    if (r.prompt.empty()) refuse(400, "prompt", "prompt is required");
    const FormPart* image = nullptr;
    const FormPart* mask = nullptr;
    size_t images = 0;
    for (const auto& p : parts) {
        if (p.name == "image" || p.name == "image[]") {
            ++images;
            if (!image) image = &p;
        } else if (p.name == "mask") {
            mask = &p;
        }
    }
    if (!image) refuse(400, "image", "image is required: the image to edit as a file part (PNG, JPEG, ...)");
    if (images > 1) refuse(400, "image", "{} images were sent; easel edits one", images);
    r.init_image.assign(image->content.begin(), image->content.end());
    const ImageShape ishape = check_image(r.init_image, "image", limits);
    if (mask) {
        r.mask.assign(mask->content.begin(), mask->content.end());
        const ImageShape ms = check_image(r.mask, "mask", limits);
        if (ms.width != ishape.width || ms.height != ishape.height)
            refuse(400, "mask", "mask is {}x{} but image is {}x{}; they must be the same size", ms.width, ms.height, ishape.width, ishape.height);
        r.mask_from_alpha = ms.channels == 2 || ms.channels == 4;  // OpenAI: transparent = edit here
    }
    if (auto n = integer("n", 1, limits.max_batch)) r.batch = *n;
    if (auto s = text("size")) std::tie(r.width, r.height) = parse_size(*s, limits);
    o.response_format = text("response_format").value_or("b64_json");
    if (o.response_format != "b64_json" && o.response_format != "url")
        refuse(400, "response_format", "response_format \"{}\" must be b64_json or url", o.response_format);
    if (auto v = text("output_format"); v && *v != "png") refuse(400, "output_format", "output_format \"{}\" is not supported: easel writes PNG", *v);
    if (auto v = text("background"); v && *v != "auto" && *v != "opaque")
        refuse(400, "background", "background \"{}\" is not supported: easel draws opaque images", *v);
    if (auto v = text("stream"); v && *v != "false") refuse(400, "stream", "stream is not supported: easel does not stream partial images");
    if (auto extra = take_extra_args(r.prompt, limits)) {
        apply_sdcpp_fields(r, *extra, limits, "<sd_cpp_extra_args>");
        r.type = "img2img";
    }
    return o;
}

JobRequest parse_sdcpp_img_gen(const json& body, const Limits& limits) {
    if (!body.is_object()) refuse(400, "", "request body must be a JSON object");
    JobRequest r;
    apply_sdcpp_fields(r, body, limits, "the img_gen body");
    if (!r.mask.empty() && r.init_image.empty()) refuse(400, "mask_image", "mask_image needs init_image");
    return r;
}

json JobRequest::to_json() const {
    json j = {{"type", type},         {"prompt", prompt}, {"negative_prompt", negative_prompt}, {"width", width}, {"height", height},
              {"sampler", sampler},   {"scheduler", scheduler}, {"seed", seed}, {"batch", batch}, {"mask_invert", mask_invert},
              {"mask_from_alpha", mask_from_alpha}, {"mask_blur", mask_blur}, {"force_id", force_id}, {"model_checkpoint", model_checkpoint},
              {"parameters", parameters}};
    if (steps) j["steps"] = *steps;
    if (cfg_scale) j["cfg_scale"] = *cfg_scale;
    if (strength) j["strength"] = *strength;
    if (clip_skip) j["clip_skip"] = *clip_skip;
    if (eta) j["eta"] = *eta;
    if (hires)
        j["hires"] = {{"scale", hr_scale}, {"resize_x", hr_resize_x}, {"resize_y", hr_resize_y}, {"steps", hr_steps},
                      {"strength", hires_strength}, {"upscaler", hr_upscaler}};
    j["loras"] = json::array();
    for (const auto& l : loras) j["loras"].push_back({{"name", l.name}, {"multiplier", l.multiplier}});
    return j;
}

JobRequest JobRequest::from_json(const json& j) {
    JobRequest r;
    try {
        r.type = j.at("type").get<std::string>();
        r.prompt = j.at("prompt").get<std::string>();
        r.negative_prompt = j.at("negative_prompt").get<std::string>();
        r.width = j.at("width").get<int>();
        r.height = j.at("height").get<int>();
        r.sampler = j.at("sampler").get<std::string>();
        r.scheduler = j.at("scheduler").get<std::string>();
        r.seed = j.at("seed").get<int64_t>();
        r.batch = j.at("batch").get<int>();
        r.mask_invert = j.value("mask_invert", false);
        r.mask_from_alpha = j.value("mask_from_alpha", false);
        r.mask_blur = j.value("mask_blur", 0);
        r.force_id = j.value("force_id", "");
        r.model_checkpoint = j.value("model_checkpoint", "");
        r.parameters = j.value("parameters", json::object());
        if (j.contains("steps")) r.steps = j["steps"].get<int>();
        if (j.contains("cfg_scale")) r.cfg_scale = j["cfg_scale"].get<double>();
        if (j.contains("strength")) r.strength = j["strength"].get<double>();
        if (j.contains("clip_skip")) r.clip_skip = j["clip_skip"].get<int>();
        if (j.contains("eta")) r.eta = j["eta"].get<double>();
        if (j.contains("hires")) {
            const json& h = j["hires"];
            r.hires = true;
            r.hr_scale = h.at("scale").get<double>();
            r.hr_resize_x = h.at("resize_x").get<int>();
            r.hr_resize_y = h.at("resize_y").get<int>();
            r.hr_steps = h.at("steps").get<int>();
            r.hires_strength = h.at("strength").get<double>();
            r.hr_upscaler = h.at("upscaler").get<std::string>();
        }
        for (const auto& l : j.value("loras", json::array())) r.loras.push_back({l.at("name").get<std::string>(), l.at("multiplier").get<double>()});
    } catch (const json::exception& e) {
        refuse(400, "", "stored job request is malformed: {}", e.what());
    }
    return r;
}

}  // namespace easel::server
