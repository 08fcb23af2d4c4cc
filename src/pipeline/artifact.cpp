#include "pipeline/artifact.h"

#include "core/error.h"
#include "core/platform.h"
#include "easel_version.h"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace easel::pipeline {

namespace fs = std::filesystem;

namespace {

size_t dtype_size(const std::string& d) {
    if (d == "F32" || d == "I32") return 4;
    if (d == "I64") return 8;
    if (d == "U8") return 1;
    return 0;
}

std::string hex128(XXH128_hash_t h) { return fmt::format("{:016x}{:016x}", h.high64, h.low64); }

void add_tensor(Artifact& a, const std::string& name, const char* dtype, std::vector<int64_t> shape, const void* data, size_t n,
                size_t elem) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if ((size_t)numel != n) fail(ErrorKind::Internal, "artifact tensor {}: {} values for a shape of {}", name, n, numel);
    ArtifactTensor t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.bytes.resize(n * elem);
    if (n) std::memcpy(t.bytes.data(), data, n * elem);
    a.tensors.push_back(std::move(t));
}

template <typename T>
std::vector<T> values(const Artifact& a, const std::string& name, const char* dtype, const std::string& what) {
    const ArtifactTensor* t = a.find(name);
    if (!t) fail(ErrorKind::InvalidInput, "{}: has no tensor '{}'", what, name);
    if (t->dtype != dtype) fail(ErrorKind::InvalidInput, "{}: tensor '{}' is {}, expected {}", what, name, t->dtype, dtype);
    std::vector<T> r(t->bytes.size() / sizeof(T));
    if (!r.empty()) std::memcpy(r.data(), t->bytes.data(), r.size() * sizeof(T));
    return r;
}

void hash_str(XXH3_state_t* s, const std::string& v) {
    uint64_t n = v.size();
    XXH3_128bits_update(s, &n, sizeof n);
    XXH3_128bits_update(s, v.data(), v.size());
}

void hash_tensors(XXH3_state_t* s, const Artifact& a) {
    std::vector<const ArtifactTensor*> ts;
    for (auto& t : a.tensors) ts.push_back(&t);
    std::sort(ts.begin(), ts.end(), [](auto* x, auto* y) { return x->name < y->name; });
    for (auto* t : ts) {
        hash_str(s, t->name);
        hash_str(s, t->dtype);
        uint64_t nd = t->shape.size();
        XXH3_128bits_update(s, &nd, sizeof nd);
        for (int64_t d : t->shape) XXH3_128bits_update(s, &d, sizeof d);
        uint64_t nb = t->bytes.size();
        XXH3_128bits_update(s, &nb, sizeof nb);
        XXH3_128bits_update(s, t->bytes.data(), t->bytes.size());
    }
}

std::map<std::string, std::string> standard_meta(const Artifact& a) {
    std::map<std::string, std::string> m = a.meta;
    m["format"] = "easel-artifact";
    m["kind"] = artifact_kind_name(a.kind);
    m["format_version"] = std::to_string(kArtifactFormatVersion);
    if (!m.count("easel_version")) m["easel_version"] = EASEL_VERSION;
    m.erase("content_hash");
    return m;
}

std::string hash_with_meta(const std::map<std::string, std::string>& meta, const Artifact& a) {
    XXH3_state_t* s = XXH3_createState();
    XXH3_128bits_reset(s);
    for (auto& [k, v] : meta) {
        if (k == "content_hash") continue;
        hash_str(s, k);
        hash_str(s, v);
    }
    hash_tensors(s, a);
    std::string r = "xxh3-128:" + hex128(XXH3_128bits_digest(s));
    XXH3_freeState(s);
    return r;
}

}  // namespace

const char* artifact_kind_name(ArtifactKind k) {
    switch (k) {
    case ArtifactKind::Conditioning: return "conditioning";
    case ArtifactKind::Latent: return "latent";
    case ArtifactKind::Checkpoint: return "checkpoint";
    }
    return "?";
}

void Artifact::add_f32(const std::string& n, std::vector<int64_t> s, std::span<const float> v) { add_tensor(*this, n, "F32", std::move(s), v.data(), v.size(), 4); }
void Artifact::add_i64(const std::string& n, std::vector<int64_t> s, std::span<const int64_t> v) { add_tensor(*this, n, "I64", std::move(s), v.data(), v.size(), 8); }
void Artifact::add_i32(const std::string& n, std::vector<int64_t> s, std::span<const int32_t> v) { add_tensor(*this, n, "I32", std::move(s), v.data(), v.size(), 4); }
void Artifact::add_u8(const std::string& n, std::vector<int64_t> s, std::span<const uint8_t> v) { add_tensor(*this, n, "U8", std::move(s), v.data(), v.size(), 1); }

const ArtifactTensor* Artifact::find(const std::string& name) const {
    for (auto& t : tensors)
        if (t.name == name) return &t;
    return nullptr;
}
std::vector<float> Artifact::f32(const std::string& n, const std::string& w) const { return values<float>(*this, n, "F32", w); }
std::vector<int64_t> Artifact::i64(const std::string& n, const std::string& w) const { return values<int64_t>(*this, n, "I64", w); }
std::vector<int32_t> Artifact::i32(const std::string& n, const std::string& w) const { return values<int32_t>(*this, n, "I32", w); }
std::vector<uint8_t> Artifact::u8(const std::string& n, const std::string& w) const { return values<uint8_t>(*this, n, "U8", w); }

const std::string& Artifact::at(const std::string& key, const std::string& what) const {
    auto it = meta.find(key);
    if (it == meta.end()) fail(ErrorKind::InvalidInput, "{}: metadata has no '{}' entry", what, key);
    return it->second;
}

std::string artifact_content_hash(const Artifact& a) { return hash_with_meta(standard_meta(a), a); }

std::string artifact_data_hash(const Artifact& a) {
    XXH3_state_t* s = XXH3_createState();
    XXH3_128bits_reset(s);
    hash_tensors(s, a);
    std::string r = "xxh3-128:" + hex128(XXH3_128bits_digest(s));
    XXH3_freeState(s);
    return r;
}

std::string xxh3_hex(std::span<const uint8_t> bytes) { return hex128(XXH3_128bits(bytes.data(), bytes.size())); }

std::vector<uint8_t> serialize_artifact(const Artifact& a) {
    auto meta = standard_meta(a);
    meta["content_hash"] = hash_with_meta(meta, a);
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    h["__metadata__"] = meta;
    std::vector<const ArtifactTensor*> ts;
    for (auto& t : a.tensors) ts.push_back(&t);
    std::sort(ts.begin(), ts.end(), [](auto* x, auto* y) { return x->name < y->name; });
    uint64_t off = 0;
    for (auto* t : ts) {
        h[t->name] = {{"dtype", t->dtype}, {"shape", t->shape}, {"data_offsets", {off, off + t->bytes.size()}}};
        off += t->bytes.size();
    }
    std::string hs = h.dump();
    while ((8 + hs.size()) % 8 != 0) hs.push_back(' ');  // data aligned to 8 bytes
    std::vector<uint8_t> out(8 + hs.size() + off);
    uint64_t n = hs.size();
    for (int i = 0; i < 8; ++i) out[(size_t)i] = (uint8_t)(n >> (8 * i));
    std::memcpy(out.data() + 8, hs.data(), hs.size());
    size_t p = 8 + hs.size();
    for (auto* t : ts) {
        if (!t->bytes.empty()) std::memcpy(out.data() + p, t->bytes.data(), t->bytes.size());
        p += t->bytes.size();
    }
    return out;
}

void write_artifact(const fs::path& path, const Artifact& a) {
    const auto bytes = serialize_artifact(a);
    platform::write_file_atomic(path, bytes);
}

Artifact parse_artifact(std::span<const uint8_t> b, ArtifactKind expected, const std::string& what) {
    const char* want = artifact_kind_name(expected);
    if (b.size() < 8) fail(ErrorKind::InvalidInput, "{}: not an easel {} file (only {} bytes: truncated?)", what, want, b.size());
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= (uint64_t)b[(size_t)i] << (8 * i);
    if (n > b.size() - 8 || n > (uint64_t)100 << 20)
        fail(ErrorKind::InvalidInput, "{}: not an easel {} file (header length {} exceeds the file: truncated or not safetensors)", what, want, n);
    nlohmann::json h;
    try {
        h = nlohmann::json::parse(b.begin() + 8, b.begin() + 8 + (ptrdiff_t)n);
    } catch (const std::exception&) {
        fail(ErrorKind::InvalidInput, "{}: not an easel {} file (the safetensors header is not valid JSON)", what, want);
    }
    if (!h.is_object() || !h.contains("__metadata__") || !h["__metadata__"].is_object())
        fail(ErrorKind::InvalidInput, "{}: not an easel artifact (no __metadata__)", what);
    Artifact a;
    for (auto& [k, v] : h["__metadata__"].items()) {
        if (!v.is_string()) fail(ErrorKind::InvalidInput, "{}: metadata entry '{}' is not a string", what, k);
        a.meta[k] = v.get<std::string>();
    }
    if (a.meta["format"] != "easel-artifact") fail(ErrorKind::InvalidInput, "{}: not an easel artifact (metadata format is '{}')", what, a.meta["format"]);
    const std::string kind = a.meta["kind"];
    if (kind != want) fail(ErrorKind::InvalidInput, "{}: is a {} file, expected a {} file", what, kind.empty() ? "(no kind)" : kind, want);
    a.kind = expected;
    int ver = 0;
    try {
        ver = std::stoi(a.meta["format_version"]);
    } catch (...) {
        fail(ErrorKind::InvalidInput, "{}: bad format_version '{}'", what, a.meta["format_version"]);
    }
    if (ver < 1 || ver > kArtifactFormatVersion)
        fail(ErrorKind::Unsupported, "{}: artifact format version {} is newer than this easel reads ({}); update easel", what, ver, kArtifactFormatVersion);
    const uint64_t data0 = 8 + n, data_len = b.size() - data0;
    for (auto& [name, t] : h.items()) {
        if (name == "__metadata__") continue;
        if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets") || !t["dtype"].is_string() ||
            !t["shape"].is_array() || !t["data_offsets"].is_array() || t["data_offsets"].size() != 2)
            fail(ErrorKind::InvalidInput, "{}: malformed header entry for tensor '{}'", what, name);
        ArtifactTensor at;
        at.name = name;
        at.dtype = t["dtype"].get<std::string>();
        const size_t es = dtype_size(at.dtype);
        if (!es) fail(ErrorKind::InvalidInput, "{}: tensor '{}' has dtype {} (artifacts use F32, I64, I32, U8)", what, name, at.dtype);
        uint64_t numel = 1;
        for (auto& d : t["shape"]) {
            if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > ((int64_t)1 << 40))
                fail(ErrorKind::InvalidInput, "{}: tensor '{}' has a bad shape", what, name);
            at.shape.push_back(d.get<int64_t>());
            numel *= (uint64_t)d.get<int64_t>();
            if (numel > ((uint64_t)1 << 40)) fail(ErrorKind::InvalidInput, "{}: tensor '{}' is too large", what, name);
        }
        auto& o = t["data_offsets"];
        if (!o[0].is_number_unsigned() || !o[1].is_number_unsigned())
            fail(ErrorKind::InvalidInput, "{}: tensor '{}' has bad data offsets", what, name);
        const uint64_t s = o[0].get<uint64_t>(), e = o[1].get<uint64_t>();
        if (s > e || e > data_len)
            fail(ErrorKind::InvalidInput, "{}: tensor '{}' lies beyond the end of the file (truncated?)", what, name);
        if (e - s != numel * es) fail(ErrorKind::InvalidInput, "{}: tensor '{}' has {} bytes, its shape needs {}", what, name, e - s, numel * es);
        at.bytes.assign(b.begin() + (ptrdiff_t)(data0 + s), b.begin() + (ptrdiff_t)(data0 + e));
        a.tensors.push_back(std::move(at));
    }
    const std::string stored = a.meta["content_hash"];
    a.meta.erase("format");
    a.meta.erase("kind");
    a.meta.erase("format_version");
    a.meta.erase("content_hash");
    std::map<std::string, std::string> all = a.meta;
    all["format"] = "easel-artifact";
    all["kind"] = kind;
    all["format_version"] = std::to_string(ver);
    const std::string got = hash_with_meta(all, a);
    if (stored != got)
        fail(ErrorKind::InvalidInput, "{}: content hash mismatch (stored {}, computed {}): the file was edited or corrupted; refusing it",
             what, stored.empty() ? "none" : stored, got);
    return a;
}

Artifact read_artifact(const fs::path& path, ArtifactKind expected) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) fail(ErrorKind::Io, "{}: no such file", platform::path_utf8(path));
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(ErrorKind::Io, "{}: cannot open ({})", platform::path_utf8(path), std::strerror(errno));
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return parse_artifact(bytes, expected, platform::path_utf8(path));
}

}  // namespace easel::pipeline
