#include "io/diffusers.h"
#include "core/platform.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace easel::io {

bool is_pipeline_folder(const std::filesystem::path& folder) {
    std::error_code ec;
    return std::filesystem::is_regular_file(folder / "model_index.json", ec);
}

std::vector<PipelineComponent> list_pipeline_components(const std::filesystem::path& folder, std::string* pipeline_class) {
    const auto p = folder / "model_index.json";
    std::ifstream f(p, std::ios::binary);
    if (!f) fail(ErrorKind::Io, "cannot read '{}': not a diffusers pipeline folder", platform::path_utf8(p));
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    if (text.size() > (16u << 20)) fail(ErrorKind::InvalidInput, "'{}' is larger than 16 MiB", platform::path_utf8(p));
    nlohmann::ordered_json j;
    try {
        j = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        fail(ErrorKind::InvalidInput, "'{}' is not valid JSON ({})", platform::path_utf8(p), e.what());
    }
    if (!j.is_object()) fail(ErrorKind::InvalidInput, "'{}' is not a JSON object", platform::path_utf8(p));
    if (pipeline_class) *pipeline_class = j.contains("_class_name") && j["_class_name"].is_string() ? j["_class_name"].get<std::string>() : "";
    std::vector<PipelineComponent> out;
    for (auto& [k, v] : j.items()) {
        if (k.empty() || k[0] == '_') continue;
        if (!v.is_array() || v.size() != 2) continue;  // plain config values (e.g. "requires_safety_checker": true)
        if (v[0].is_null() && v[1].is_null()) continue;
        PipelineComponent c;
        c.name = k;
        c.library = v[0].is_string() ? v[0].get<std::string>() : "";
        c.class_name = v[1].is_string() ? v[1].get<std::string>() : "";
        c.folder = folder / platform::u8path(k);
        out.push_back(std::move(c));
    }
    return out;
}

}  // namespace easel::io
