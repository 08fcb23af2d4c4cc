#include "pipeline/png_meta.h"
#include "core/platform.h"

#include "core/strings.h"
#include "sampling/names.h"

#include "core/error.h"
#include "easel_version.h"
#include "text/unicode.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <fstream>

namespace easel::pipeline {
namespace {

constexpr std::array<uint8_t, 8> kPngSignature{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

uint32_t be32(const uint8_t* p) {
    return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string latin1_to_utf8(std::string_view s) {
    std::string out;
    for (unsigned char c : s) text::utf8_append(out, c);
    return out;
}

// tEXt/zTXt payloads: UTF-8 when valid (sd.cpp writes UTF-8 there), else Latin-1.
std::string decode_text(std::string_view s) { return text::utf8_valid(s) ? std::string(s) : latin1_to_utf8(s); }

std::optional<std::string> inflate_all(std::string_view in) {
    z_stream zs{};
    if (inflateInit(&zs) != Z_OK) return std::nullopt;
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    zs.avail_in = static_cast<uInt>(in.size());
    std::string out;
    std::array<char, 16384> buf;
    int rc = Z_OK;
    while (rc != Z_STREAM_END) {
        zs.next_out = reinterpret_cast<Bytef*>(buf.data());
        zs.avail_out = static_cast<uInt>(buf.size());
        rc = inflate(&zs, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END) break;
        out.append(buf.data(), buf.size() - zs.avail_out);
        if (rc == Z_OK && zs.avail_in == 0 && zs.avail_out != 0) break;  // truncated
        if (out.size() > (64u << 20)) break;                             // refuse text bombs
    }
    inflateEnd(&zs);
    if (rc != Z_STREAM_END) return std::nullopt;
    return out;
}

bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view strip(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

// End (exclusive) of a JSON object/array starting at s[i] ('{' or '['), or npos.
size_t match_json_bracket(std::string_view s, size_t i) {
    std::vector<char> stack;
    bool in_str = false;
    for (size_t j = i; j < s.size(); ++j) {
        const char c = s[j];
        if (in_str) {
            if (c == '\\') ++j;
            else if (c == '"') in_str = false;
            continue;
        }
        if (c == '"') in_str = true;
        else if (c == '{') stack.push_back('}');
        else if (c == '[') stack.push_back(']');
        else if (c == '}' || c == ']') {
            if (stack.empty() || stack.back() != c) return std::string_view::npos;
            stack.pop_back();
            if (stack.empty()) return j + 1;
        }
    }
    return std::string_view::npos;
}

// True if position `e` is where A1111's (?:,|$) can match: a ',' (consumed), the end, or a
// final "\n" at the end. Returns the position after it.
std::optional<size_t> value_end_ok(std::string_view s, size_t e) {
    if (e == s.size()) return e;
    if (s[e] == ',') return e + 1;
    if (e + 1 == s.size() && s[e] == '\n') return e;
    return std::nullopt;
}

// re_param.findall(line) with the JSON-bracket extension.
std::vector<std::pair<std::string, std::string>> find_params(std::string_view s) {
    std::vector<std::pair<std::string, std::string>> out;
    size_t pos = 0;
    while (pos < s.size()) {
        size_t i = pos;
        while (i < s.size() && is_space(s[i])) ++i;
        // (\w[\w \-/]+):
        size_t j = i;
        if (j < s.size() && is_word(s[j])) {
            ++j;
            while (j < s.size() && (is_word(s[j]) || s[j] == ' ' || s[j] == '-' || s[j] == '/')) ++j;
        }
        if (j - i < 2 || j >= s.size() || s[j] != ':') {
            ++pos;
            continue;
        }
        const std::string_view key = s.substr(i, j - i);
        size_t k = j + 1;
        while (k < s.size() && is_space(s[k])) ++k;
        std::optional<std::pair<size_t, size_t>> value;  // [begin, end) and next pos encoded below
        size_t next = 0;
        if (k < s.size() && s[k] == '"') {  // "(?:\\.|[^\\"])+"
            size_t m = k + 1;
            while (m < s.size() && s[m] != '"') m += (s[m] == '\\' && m + 1 < s.size()) ? 2 : 1;
            if (m < s.size() && m > k + 1) {
                if (auto e = value_end_ok(s, m + 1)) {
                    value = std::pair{k, m + 1};
                    next = *e;
                }
            }
        }
        if (!value && k < s.size() && (s[k] == '{' || s[k] == '[')) {  // extension: JSON value
            const size_t e = match_json_bracket(s, k);
            if (e != std::string_view::npos) {
                if (auto after = value_end_ok(s, e)) {
                    value = std::pair{k, e};
                    next = *after;
                }
            }
        }
        if (!value) {  // [^,]*
            size_t m = k;
            while (m < s.size() && s[m] != ',') ++m;
            value = std::pair{k, m};
            next = m < s.size() ? m + 1 : m;
        }
        std::string v(s.substr(value->first, value->second - value->first));
        if (v.size() >= 2 && v.front() == '"' && v.back() == '"') {  // unquote: json.loads, else raw
            try {
                auto j = nlohmann::json::parse(v);
                if (j.is_string()) v = j.get<std::string>();
            } catch (const std::exception&) {
            }
        }
        out.emplace_back(std::string(key), std::move(v));
        pos = next;
    }
    return out;
}

std::string fmt_number(double v) { return fmt::format("{}", v); }

}  // namespace

std::vector<PngTextChunk> read_png_text(std::span<const uint8_t> b, std::string_view what) {
    if (b.empty()) fail(ErrorKind::InvalidInput, "{} is empty (0 bytes), not a PNG", what);
    if (b.size() < 8 || !std::equal(kPngSignature.begin(), kPngSignature.end(), b.begin()))
        fail(ErrorKind::InvalidInput, "{} is not a PNG file (bad signature)", what);
    std::vector<PngTextChunk> out;
    bool seen_idat = false;
    size_t p = 8;
    while (p + 8 <= b.size()) {
        const uint32_t len = be32(&b[p]);
        const std::string type(reinterpret_cast<const char*>(&b[p + 4]), 4);
        if (len > b.size() - p - 8 || b.size() - p - 8 - len < 4)
            fail(ErrorKind::InvalidInput, "{}: PNG chunk '{}' at byte {} runs past the end of the file (truncated?)", what,
                 type, p);
        const std::string_view data(reinterpret_cast<const char*>(&b[p + 8]), len);
        p += 12 + static_cast<size_t>(len);
        if (type == "IDAT") seen_idat = true;
        if (type == "IEND") break;
        if (type != "tEXt" && type != "zTXt" && type != "iTXt") continue;
        const size_t nul = data.find('\0');
        if (nul == std::string_view::npos || nul == 0) continue;  // malformed: no keyword
        PngTextChunk c;
        c.type = type;
        c.keyword = latin1_to_utf8(data.substr(0, nul));
        c.after_idat = seen_idat;
        std::string_view rest = data.substr(nul + 1);
        if (type == "tEXt") {
            c.text = decode_text(rest);
        } else if (type == "zTXt") {
            if (rest.empty() || rest[0] != 0) continue;  // method 0 = deflate
            auto t = inflate_all(rest.substr(1));
            if (!t) continue;
            c.text = decode_text(*t);
        } else {  // iTXt: flag, method, language\0, translated keyword\0, text
            if (rest.size() < 2) continue;
            const bool compressed = rest[0] != 0;
            rest.remove_prefix(2);
            const size_t l1 = rest.find('\0');
            if (l1 == std::string_view::npos) continue;
            const size_t l2 = rest.find('\0', l1 + 1);
            if (l2 == std::string_view::npos) continue;
            rest.remove_prefix(l2 + 1);
            if (compressed) {
                auto t = inflate_all(rest);
                if (!t) continue;
                c.text = *t;
            } else {
                c.text = std::string(rest);
            }
            if (!text::utf8_valid(c.text)) c.text = text::utf8_encode(text::utf8_decode(c.text));
        }
        out.push_back(std::move(c));
    }
    return out;
}

std::vector<PngTextChunk> read_png_text(const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(ErrorKind::Io, "cannot open {}; check that the file exists and is readable", platform::path_utf8(path));
    std::vector<uint8_t> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return read_png_text(data, platform::path_utf8(path));
}

std::optional<std::string> find_png_text(std::span<const PngTextChunk> chunks, std::string_view keyword) {
    for (const auto& c : chunks)
        if (c.keyword == keyword) return c.text;
    return std::nullopt;
}

std::optional<std::string> Infotext::get(std::string_view key) const {
    for (const auto& [k, v] : params)
        if (k == key) return v;
    return std::nullopt;
}

void Infotext::set(std::string_view key, std::string value) {
    for (auto& [k, v] : params)
        if (k == key) {
            v = std::move(value);
            return;
        }
    params.emplace_back(std::string(key), std::move(value));
}

std::optional<double> Infotext::number(std::string_view key) const {
    const auto v = get(key);
    if (!v) return std::nullopt;
    std::string_view s = strip(*v);
    if (!s.empty() && s[0] == '+') s.remove_prefix(1);
    double d = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
    if (ec != std::errc() || ptr != s.data() + s.size() || s.empty() || !std::isfinite(d)) return std::nullopt;
    return d;
}

std::optional<std::pair<int, int>> Infotext::size() const {
    const auto v = get("Size");
    if (!v) return std::nullopt;
    const size_t x = v->find('x');
    if (x == std::string::npos) return std::nullopt;
    int w = 0, h = 0;
    auto r1 = std::from_chars(v->data(), v->data() + x, w);
    auto r2 = std::from_chars(v->data() + x + 1, v->data() + v->size(), h);
    if (r1.ec != std::errc() || r1.ptr != v->data() + x || r2.ec != std::errc() || r2.ptr != v->data() + v->size() ||
        w <= 0 || h <= 0)
        return std::nullopt;
    return std::pair{w, h};
}

std::string infotext_quote(std::string_view value) {
    if (value.find_first_of(",\n:") == std::string_view::npos) return std::string(value);
    // json.dumps(ensure_ascii=False): escapes ", \, control characters; keeps non-ASCII as is.
    return nlohmann::json(std::string(value)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string format_infotext(const Infotext& info) {
    std::string out = info.prompt;
    if (!info.negative_prompt.empty()) out += "\nNegative prompt: " + info.negative_prompt;
    out += "\n";
    bool first = true;
    for (const auto& [k, v] : info.params) {
        if (!first) out += ", ";
        first = false;
        out += (k == v) ? k : k + ": " + infotext_quote(v);
    }
    return std::string(strip(out));
}

Infotext parse_infotext(std::string_view text) {
    Infotext info;
    const std::string_view x = strip(text);
    std::vector<std::string_view> lines;
    for (size_t p = 0;;) {
        const size_t q = x.find('\n', p);
        lines.push_back(x.substr(p, q == std::string_view::npos ? std::string_view::npos : q - p));
        if (q == std::string_view::npos) break;
        p = q + 1;
    }
    std::string_view last = lines.back();
    lines.pop_back();
    auto params = find_params(last);
    if (params.size() < 3) {
        lines.push_back(last);
        params.clear();
    }
    bool done_with_prompt = false;
    for (std::string_view line : lines) {
        line = strip(line);
        if (line.starts_with("Negative prompt:")) {
            done_with_prompt = true;
            line = strip(line.substr(16));
        }
        std::string& dst = done_with_prompt ? info.negative_prompt : info.prompt;
        if (!dst.empty()) dst += "\n";
        dst += line;
    }
    info.params = std::move(params);
    return info;
}

Infotext make_infotext(const GenerationInfo& g) {
    Infotext t;
    t.prompt = g.prompt;
    t.negative_prompt = g.negative_prompt;
    auto add = [&](std::string k, std::string v) { t.params.emplace_back(std::move(k), std::move(v)); };
    add("Steps", std::to_string(g.steps));
    if (!g.sampler.empty()) add("Sampler", g.sampler);
    if (!g.scheduler.empty()) add("Schedule type", g.scheduler);
    add("CFG scale", fmt_number(g.cfg_scale));
    if (g.image_cfg_scale) add("Image CFG scale", fmt_number(*g.image_cfg_scale));
    add("Seed", std::to_string(g.seed));
    add("Size", fmt::format("{}x{}", g.width, g.height));
    if (!g.model_hash.empty()) add("Model hash", g.model_hash);
    if (!g.model.empty()) add("Model", g.model);
    if (!g.vae_hash.empty()) add("VAE hash", g.vae_hash);
    if (!g.vae.empty()) add("VAE", g.vae);
    if (g.denoising_strength) add("Denoising strength", fmt_number(*g.denoising_strength));
    if (g.clip_skip > 1) add("Clip skip", std::to_string(g.clip_skip));
    if (!g.rng.empty()) add("RNG", g.rng);
    for (const auto& [k, v] : g.extra) add(k, v);
    add("Version", g.version.empty() ? std::string("easel ") + EASEL_VERSION : g.version);
    return t;
}

// The names come from the one table of sampling/names.h.
std::string a1111_sampler_name(std::string_view method) {
    const std::string low = ascii_lower(method);
    for (const auto& i : sampling::sampler_infos())
        if (low == i.name) return sampling::a1111_sampler_label(i.kind);
    return std::string(method);
}

std::optional<std::string> sampler_from_a1111_name(std::string_view name) {
    auto try_one = [](std::string_view n) -> std::optional<std::string> {
        try {
            return std::string(sampling::sampler_name(sampling::resolve_sampler_name(n).sampler));
        } catch (const Error&) {
            return std::nullopt;
        }
    };
    if (auto r = try_one(name)) return r;
    // sd.cpp writes "<method> <scheduler>" ("euler discrete"): accept "<sampler> <known schedule>".
    const size_t sp = name.rfind(' ');
    if (sp != std::string_view::npos) {
        try {
            (void)sampling::resolve_scheduler_name(name.substr(sp + 1));
            return try_one(name.substr(0, sp));
        } catch (const Error&) {
        }
    }
    return std::nullopt;
}

std::string a1111_scheduler_name(std::string_view scheduler) {
    try {
        return sampling::a1111_scheduler_label(sampling::parse_scheduler(scheduler));
    } catch (const Error&) {
        return std::string(scheduler);
    }
}

std::string lora_hashes_value(const std::vector<std::pair<std::string, std::string>>& name_hash) {
    std::vector<std::pair<std::string, std::string>> kept;  // a dict in A1111: insertion order, last value wins
    for (const auto& [name, hash] : name_hash) {
        std::string n;
        for (char c : name)
            if (c != ':' && c != ',') n += c;
        if (n.empty() || hash.empty()) continue;
        auto it = std::find_if(kept.begin(), kept.end(), [&](const auto& e) { return e.first == n; });
        if (it != kept.end()) it->second = hash;
        else kept.emplace_back(n, hash);
    }
    std::string out;
    for (const auto& [n, h] : kept) out += (out.empty() ? "" : ", ") + n + ": " + h;
    return out;
}

}  // namespace easel::pipeline
