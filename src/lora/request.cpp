// LoRA requests, name resolution and A1111 hashes (see request.h).
#include "lora/request.h"

#include "core/error.h"
#include "io/weight_index.h"

#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <memory>
#include <optional>

namespace easel::lora {

namespace fs = std::filesystem;

namespace {

const char* const kExtensions[] = {".safetensors", ".gguf", ".pt", ".ckpt"};

bool known_extension(const fs::path& p) {
    for (const char* e : kExtensions)
        if (p.extension() == e) return true;
    return false;
}

// Python float() of a multiplier: surrounding spaces, optional '+', finite.
std::optional<float> parse_weight(const std::string& v) {
    const size_t a = v.find_first_not_of(" \t"), b = v.find_last_not_of(" \t");
    if (a == std::string::npos) return std::nullopt;
    std::string_view s(v.data() + a, b - a + 1);
    if (!s.empty() && s[0] == '+') s.remove_prefix(1);
    double d = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
    if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(d)) return std::nullopt;
    return (float)d;
}

// Whether `p` (after resolving symlinks) lies inside `dir`.
bool inside(const fs::path& dir, const fs::path& p) {
    std::error_code ec;
    const fs::path d = fs::weakly_canonical(dir, ec), q = fs::weakly_canonical(p, ec);
    auto di = d.begin(), qi = q.begin();
    for (; di != d.end(); ++di, ++qi)
        if (qi == q.end() || *di != *qi) return false;
    return true;
}

std::string hex(const unsigned char* d, size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string s(n * 2, '0');
    for (size_t i = 0; i < n; ++i) {
        s[2 * i] = digits[d[i] >> 4];
        s[2 * i + 1] = digits[d[i] & 15];
    }
    return s;
}

}  // namespace

ApplyMode parse_apply_mode(const std::string& s) {
    if (s == "auto") return ApplyMode::Auto;
    if (s == "immediately") return ApplyMode::Immediately;
    if (s == "at_runtime") return ApplyMode::AtRuntime;
    fail(ErrorKind::InvalidInput, "--lora-apply-mode '{}' is not one of auto, immediately, at_runtime", s);
}

const char* apply_mode_name(ApplyMode m) {
    switch (m) {
        case ApplyMode::Auto: return "auto";
        case ApplyMode::Immediately: return "immediately";
        case ApplyMode::AtRuntime: return "at_runtime";
    }
    return "?";
}

LoraRequest parse_lora_flag(const std::string& arg) {
    LoraRequest r;
    r.origin = "--lora";
    std::string file = arg;
    const size_t colon = arg.rfind(':');
    if (colon != std::string::npos && !fs::exists(arg)) {
        const std::string w = arg.substr(colon + 1);
        auto v = parse_weight(w);
        if (!v)
            fail(ErrorKind::InvalidInput, "--lora '{}': weight '{}' is not a number; write --lora FILE or --lora FILE:0.8", arg, w);
        file = arg.substr(0, colon);
        r.te_weight = r.diffusion_weight = *v;
    }
    if (file.empty()) fail(ErrorKind::InvalidInput, "--lora '{}' names no file; write --lora FILE[:WEIGHT]", arg);
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) fail(ErrorKind::Io, "--lora: LoRA file '{}' not found", file);
    r.path = file;
    r.name = fs::path(file).stem().string();
    return r;
}

fs::path resolve_lora_name(const fs::path& dir, const std::string& name) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) fail(ErrorKind::Io, "--lora-model-dir '{}' is not a folder", dir.string());
    const fs::path rel(name);
    if (name.empty() || rel.is_absolute() || rel.has_root_name())
        fail(ErrorKind::InvalidInput, "LoRA name '{}' must be a name inside --lora-model-dir, not a path", name);
    for (const auto& part : rel)
        if (part == "..") fail(ErrorKind::InvalidInput, "LoRA name '{}' leaves --lora-model-dir ('..' is not allowed)", name);
    auto check_inside = [&](const fs::path& p) {
        if (!inside(dir, p))
            fail(ErrorKind::InvalidInput, "LoRA '{}' resolves to '{}', outside --lora-model-dir '{}'", name, fs::weakly_canonical(p, ec).string(),
                 dir.string());
        return p;
    };
    if (known_extension(rel) && fs::is_regular_file(dir / rel, ec)) return check_inside(dir / rel);
    for (const char* e : kExtensions) {
        fs::path p = dir / rel;
        p += e;
        if (fs::is_regular_file(p, ec)) return check_inside(p);
    }
    // A1111 lists the folder recursively and matches file names
    std::vector<fs::path> found;
    if (!rel.has_parent_path()) {
        for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
             !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
            if (!it->is_regular_file(ec) || !known_extension(it->path())) continue;
            if (it->path().stem() == name || it->path().filename() == name) found.push_back(it->path());
        }
    }
    std::sort(found.begin(), found.end());
    if (found.size() > 1)
        fail(ErrorKind::InvalidInput, "LoRA name '{}' matches {} files in --lora-model-dir ('{}', '{}'...): write its subfolder, e.g. <lora:{}:1>",
             name, found.size(), fs::relative(found[0], dir, ec).string(), fs::relative(found[1], dir, ec).string(),
             fs::relative(found[0], dir, ec).replace_extension().string());
    if (found.empty())
        fail(ErrorKind::Io, "LoRA '{}' not found in --lora-model-dir '{}' (looked for {}.safetensors, .gguf, .pt, .ckpt, also in subfolders)",
             name, dir.string(), name);
    return check_inside(found[0]);
}

std::vector<LoraRequest> collect_loras(const std::vector<std::string>& flags, const text::PromptTags& prompt,
                                       const text::PromptTags& negative, const fs::path& dir) {
    std::vector<LoraRequest> out;
    auto add = [&](LoraRequest r) {
        std::error_code ec;
        for (auto& o : out)
            if (fs::equivalent(o.path, r.path, ec)) {
                o.te_weight += r.te_weight;
                o.diffusion_weight += r.diffusion_weight;
                return;
            }
        out.push_back(std::move(r));
    };
    for (const std::string& f : flags) add(parse_lora_flag(f));
    for (const auto* tags : {&prompt, &negative})
        for (const text::ExtraNetworkTag& t : tags->loras) {
            if (dir.empty())
                fail(ErrorKind::InvalidInput, "the {} names LoRA '{}' (<{}:{}>) but no --lora-model-dir is given", tags == &prompt ? "prompt" : "negative prompt",
                     t.name, t.kind, t.name);
            LoraRequest r;
            r.name = t.name;
            r.path = resolve_lora_name(dir, t.name);
            r.te_weight = t.multiplier;
            r.diffusion_weight = t.unet_multiplier;
            r.origin = tags == &prompt ? "prompt" : "negative prompt";
            add(std::move(r));
        }
    return out;
}

std::string lora_sha256(const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) fail(ErrorKind::Io, "cannot read '{}' to hash it", file.string());
    uint64_t skip = 0;
    if (file.extension() == ".safetensors") {
        unsigned char h[8] = {};
        if (!in.read(reinterpret_cast<char*>(h), 8)) fail(ErrorKind::Io, "'{}' is too short to be a safetensors file", file.string());
        uint64_t n = 0;
        for (int i = 7; i >= 0; --i) n = (n << 8) | h[i];
        skip = n + 8;
        in.seekg((std::streamoff)skip);
        if (!in) fail(ErrorKind::Io, "'{}': header length {} is past the end of the file", file.string(), n);
    }
    std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
    if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) fail(ErrorKind::Internal, "SHA-256 is unavailable");
    std::vector<char> buf(1 << 20);
    while (in) {
        in.read(buf.data(), (std::streamsize)buf.size());
        const std::streamsize got = in.gcount();
        if (got > 0) EVP_DigestUpdate(ctx.get(), buf.data(), (size_t)got);
    }
    if (in.bad()) fail(ErrorKind::Io, "error reading '{}'", file.string());
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx.get(), md, &len);
    return hex(md, len);
}

std::string a1111_short_hash(const fs::path& file) {
    if (file.extension() == ".safetensors") {
        try {
            const io::WeightIndex idx = io::WeightIndex::open(file);
            auto it = idx.metadata().find("sshs_model_hash");
            if (it != idx.metadata().end() && it->second.kind == io::MetaValue::Kind::String && !it->second.s.empty())
                return it->second.s.substr(0, 12);
        } catch (const Error&) {
            // not a readable safetensors file: hash its bytes
        }
    }
    return lora_sha256(file).substr(0, 12);
}

}  // namespace easel::lora
