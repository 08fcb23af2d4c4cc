// Safetensors header parser (see readers.h).
#include "core/error.h"
#include "io/readers.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace easel::io::detail {

namespace {

using json = nlohmann::ordered_json;

// Deepest nesting of [ and { outside strings, stopping early past `limit`. Done before
// nlohmann parses so that a hostile header cannot make a deep tree.
int json_depth(const uint8_t* p, size_t n, int limit) {
    int depth = 0, maxd = 0;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < n; ++i) {
        uint8_t c = p[i];
        if (in_str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') in_str = false;
            continue;
        }
        if (c == '"') in_str = true;
        else if (c == '{' || c == '[') {
            if (++depth > maxd) maxd = depth;
            if (maxd > limit) return maxd;
        } else if (c == '}' || c == ']') --depth;
    }
    return maxd;
}

// Shortens a name for an error message and replaces control characters.
std::string printable(const std::string& s) {
    std::string r;
    for (char c : s.substr(0, 120)) r += ((unsigned char)c < 0x20 || c == 0x7f) ? '?' : c;
    if (s.size() > 120) r += "...";
    return r;
}

}  // namespace

ParsedFile parse_safetensors(std::span<const uint8_t> data, const std::string& label) {
    ParsedFile out;
    out.format = "safetensors";
    const uint64_t size = data.size();
    if (size < 8)
        fail(ErrorKind::InvalidInput, "'{}' is not a safetensors file: {} bytes, shorter than the 8-byte header length", label,
             size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
    if (n > size - 8)
        fail(ErrorKind::InvalidInput,
             "'{}': safetensors header length {} runs past the end of the file ({} bytes): the file is truncated or not safetensors",
             label, n, size);
    if (n > kMaxSafetensorsHeader)
        fail(ErrorKind::InvalidInput, "'{}': safetensors header of {} bytes exceeds the {}-byte limit", label, n,
             kMaxSafetensorsHeader);
    if (n < 2 || data[8] != '{')
        fail(ErrorKind::InvalidInput, "'{}': safetensors header does not start with '{{': not a safetensors file", label);
    const uint8_t* hp = data.data() + 8;
    if (json_depth(hp, n, kMaxJsonDepth) > kMaxJsonDepth)
        fail(ErrorKind::InvalidInput, "'{}': safetensors header JSON is nested deeper than {} levels", label, kMaxJsonDepth);

    // Duplicate keys: nlohmann keeps the last one silently, so track the keys of each object.
    std::vector<std::set<std::string>> seen;
    std::string dup;
    auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) -> bool {
        switch (ev) {
            case json::parse_event_t::object_start: seen.emplace_back(); break;
            case json::parse_event_t::object_end:
                if (!seen.empty()) seen.pop_back();
                break;
            case json::parse_event_t::key:
                if (!seen.empty() && parsed.is_string() && !seen.back().insert(parsed.get<std::string>()).second && dup.empty())
                    dup = parsed.get<std::string>();
                break;
            default: break;
        }
        return true;
    };
    json h;
    try {
        h = json::parse(hp, hp + n, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
    } catch (const json::exception& e) {
        fail(ErrorKind::InvalidInput, "'{}': safetensors header is not valid JSON ({})", label, e.what());
    }
    if (!dup.empty()) fail(ErrorKind::InvalidInput, "'{}': safetensors header has the key '{}' twice", label, printable(dup));
    if (!h.is_object()) fail(ErrorKind::InvalidInput, "'{}': safetensors header is not a JSON object", label);

    const uint64_t base = 8 + n;
    const uint64_t data_size = size - base;
    for (auto it = h.begin(); it != h.end(); ++it) {
        const std::string& name = it.key();
        const json& v = it.value();
        if (name == "__metadata__") {
            if (!v.is_object()) fail(ErrorKind::InvalidInput, "'{}': __metadata__ is not a JSON object", label);
            for (auto m = v.begin(); m != v.end(); ++m) {
                MetaValue mv;
                mv.kind = MetaValue::Kind::String;
                mv.s = m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
                out.metadata[m.key()] = std::move(mv);
            }
            continue;
        }
        const std::string pn = printable(name);
        if (name.empty()) fail(ErrorKind::InvalidInput, "'{}': a tensor has an empty name", label);
        if (!v.is_object()) fail(ErrorKind::InvalidInput, "'{}': entry for tensor '{}' is not a JSON object", label, pn);
        auto dt = v.find("dtype");
        auto sh = v.find("shape");
        auto off = v.find("data_offsets");
        if (dt == v.end() || sh == v.end() || off == v.end())
            fail(ErrorKind::InvalidInput, "'{}': tensor '{}' lacks one of dtype, shape, data_offsets", label, pn);
        if (!dt->is_string()) fail(ErrorKind::InvalidInput, "'{}': tensor '{}' has a non-string dtype", label, pn);
        auto d = dtype_from_name(dt->get<std::string>());
        if (!d)
            fail(ErrorKind::InvalidInput,
                 "'{}': tensor '{}' has unsupported dtype '{}' (supported: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U8 BOOL)",
                 label, pn, printable(dt->get<std::string>()));
        if (!sh->is_array() || sh->size() > kMaxDims)
            fail(ErrorKind::InvalidInput, "'{}': tensor '{}' shape must be an array of at most {} sizes", label, pn, kMaxDims);
        TensorInfo t;
        t.name = name;
        t.dtype = *d;
        t.gtype = dtype_ggml_type(*d);
        uint64_t numel = 1, nz_numel = 1;  // nz_numel: product of the non-zero sizes
        bool overflow = false;
        for (const auto& s : *sh) {
            if (!s.is_number_unsigned())
                fail(ErrorKind::InvalidInput, "'{}': tensor '{}' has a shape entry that is not a non-negative integer", label, pn);
            uint64_t x = s.get<uint64_t>();
            if (x > (uint64_t)INT64_MAX) overflow = true;
            else if (x != 0 && nz_numel > UINT64_MAX / x) overflow = true;
            else if (x != 0) nz_numel *= x;
            numel = (x == 0 || numel == 0) ? 0 : nz_numel;
            t.shape.push_back((int64_t)std::min<uint64_t>(x, (uint64_t)INT64_MAX));
        }
        const uint64_t es = dtype_size(*d);
        if (overflow || nz_numel > (uint64_t)INT64_MAX / es)
            fail(ErrorKind::InvalidInput, "'{}': tensor '{}' has a shape whose size overflows 64 bits", label, pn);
        if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
            fail(ErrorKind::InvalidInput, "'{}': tensor '{}' data_offsets must be [begin, end] non-negative integers", label, pn);
        uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
        if (b > e) fail(ErrorKind::InvalidInput, "'{}': tensor '{}' data_offsets [{}, {}] end before they begin", label, pn, b, e);
        if (e > data_size)
            fail(ErrorKind::InvalidInput,
                 "'{}': tensor '{}' data [{}, {}) runs past the end of the data section ({} bytes): the file is truncated",
                 label, pn, b, e, data_size);
        if (e - b != numel * es)
            fail(ErrorKind::InvalidInput, "'{}': tensor '{}' holds {} bytes but shape and dtype {} need {}", label, pn, e - b,
                 dtype_name(*d), numel * es);
        t.offset = base + b;
        t.nbytes = e - b;
        out.tensors.push_back(std::move(t));
    }

    // Overlapping data ranges mean a corrupt (or hostile) file.
    std::vector<const TensorInfo*> order;
    for (auto& t : out.tensors)
        if (t.nbytes) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < order.size(); ++i)
        if (order[i]->offset < order[i - 1]->offset + order[i - 1]->nbytes)
            fail(ErrorKind::InvalidInput, "'{}': data of tensors '{}' and '{}' overlap", label, printable(order[i - 1]->name),
                 printable(order[i]->name));
    return out;
}

}  // namespace easel::io::detail
