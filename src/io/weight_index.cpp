// WeightIndex: opening files/folders/shard indexes, data access and dtype conversion on load.
#include "io/weight_index.h"
#include "core/platform.h"

#include "core/error.h"
#include "core/log.h"
#include "io/mapped_file.h"
#include "io/readers.h"

#include <ggml-backend.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>

namespace fs = std::filesystem;

namespace easel::io {

using detail::ParsedFile;

int64_t TensorInfo::numel() const {
    // Readers guarantee the product of the non-zero sizes fits in int64; a zero size anywhere
    // makes the tensor empty (checked first so no partial product can overflow).
    for (int64_t d : shape)
        if (d == 0) return 0;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::array<int64_t, 4> TensorInfo::ggml_ne() const {
    std::array<int64_t, 4> ne{1, 1, 1, 1};
    const size_t nd = shape.size();
    // PyTorch order outermost first -> ggml innermost first. Dimensions beyond 4 fold into ne[3].
    for (size_t i = 0; i < nd; ++i) {
        size_t k = nd - 1 - i;  // ggml index of shape[i]
        if (k < 4) ne[k] = shape[i];
        else ne[3] *= shape[i];
    }
    return ne;
}

struct WeightIndex::Impl {
    std::vector<WeightFile> files;
    std::vector<std::unique_ptr<MappedFile>> maps;  // parallel to files
    std::vector<std::unique_ptr<MappedFile>> sides;  // parallel to files: PyTorch strided tensors' copies, or null
    std::vector<TensorInfo> tensors;
    std::unordered_map<std::string, size_t> by_name;
    std::map<std::string, MetaValue> metadata;
    std::unique_ptr<nlohmann::json> config;

    void add(const std::string& label, const fs::path& path, std::unique_ptr<MappedFile> map) {
        if (map->size() == 0) fail(ErrorKind::InvalidInput, "'{}' is empty (0 bytes): not a weight file", label);
        ParsedFile pf;
        const auto sp = map->span();
        const std::string ext = platform::path_utf8(path.extension());
        const bool gguf_magic = sp.size() >= 4 && std::memcmp(sp.data(), "GGUF", 4) == 0;
        const bool st_like = sp.size() >= 9 && sp[8] == '{';
        const bool torch_ext = ext == ".pth" || ext == ".pt" || ext == ".ckpt" || ext == ".bin";
        if (gguf_magic || ext == ".gguf") pf = detail::parse_gguf(sp, label);
        else if (detail::is_pytorch_zip(sp)) pf = detail::parse_pytorch_zip(sp, label);
        else if (detail::is_pytorch_legacy(sp)) pf = detail::parse_pytorch_legacy(sp, label);
        else if (ext == ".safetensors" || ext == ".sft" || st_like) pf = detail::parse_safetensors(sp, label);
        else if (torch_ext && sp.size() >= 262 && std::memcmp(sp.data() + 257, "ustar", 5) == 0)
            fail(ErrorKind::Unsupported,
                 "'{}' is a tar-format PyTorch checkpoint (PyTorch 0.3 and older), which easel does not read: re-save it with a current torch.save",
                 label);
        else if (torch_ext)
            fail(ErrorKind::InvalidInput,
                 "'{}' is not a PyTorch checkpoint: it starts neither with a zip header nor with torch.save's legacy magic number", label);
        else
            fail(ErrorKind::InvalidInput, "'{}' is neither a safetensors, GGUF nor PyTorch (.pth/.pt/.ckpt/.bin) file", label);

        const uint32_t fi = (uint32_t)files.size();
        for (auto& t : pf.tensors)
            if (by_name.count(t.name))
                fail(ErrorKind::InvalidInput, "tensor '{}' of '{}' is also in '{}': a tensor name may appear only once", t.name,
                     label, platform::path_utf8(files[tensors[by_name[t.name]].file].path));
        files.push_back(WeightFile{path, pf.format, map->size()});
        maps.push_back(std::move(map));
        sides.push_back(pf.side.empty() ? nullptr : MappedFile::adopt(std::move(pf.side)));
        tensors.reserve(tensors.size() + pf.tensors.size());
        for (auto& t : pf.tensors) {
            t.file = fi;
            by_name.emplace(t.name, tensors.size());
            tensors.push_back(std::move(t));
        }
        for (auto& [k, v] : pf.metadata) metadata.emplace(k, std::move(v));
    }
};

namespace {

// Reads a small JSON file (config.json, model_index.json, *.index.json) with a size and depth
// limit; errors name the file.
nlohmann::json read_json_file(const fs::path& p, uint64_t max_bytes = 64ull << 20) {
    auto m = MappedFile::open(p);
    if (m->size() > max_bytes) fail(ErrorKind::InvalidInput, "'{}' is larger than {} bytes: not a config/index file", platform::path_utf8(p), max_bytes);
    int depth = 0, maxd = 0;
    bool in_str = false, esc = false;
    for (uint8_t c : m->span()) {
        if (in_str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') in_str = false;
        } else if (c == '"') in_str = true;
        else if (c == '{' || c == '[') maxd = std::max(maxd, ++depth);
        else if (c == '}' || c == ']') --depth;
    }
    if (maxd > 64) fail(ErrorKind::InvalidInput, "'{}': JSON nested deeper than 64 levels", platform::path_utf8(p));
    try {
        return nlohmann::json::parse(m->data(), m->data() + m->size());
    } catch (const nlohmann::json::exception& e) {
        fail(ErrorKind::InvalidInput, "'{}' is not valid JSON ({})", platform::path_utf8(p), e.what());
    }
}

bool ends_with(const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

void open_index_json(WeightIndex& wi, std::map<std::string, MetaValue>& meta, const fs::path& index_path) {
    nlohmann::json j = read_json_file(index_path);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        fail(ErrorKind::InvalidInput, "'{}' has no \"weight_map\" object: not a safetensors shard index", platform::path_utf8(index_path));
    std::vector<std::string> shards;
    std::set<std::string> seen;
    for (auto& [name, file] : j["weight_map"].items()) {
        if (!file.is_string())
            fail(ErrorKind::InvalidInput, "'{}': weight_map entry '{}' is not a file name", platform::path_utf8(index_path), name);
        std::string f = file.get<std::string>();
        const fs::path fp = platform::u8path(f);
        if (f.empty() || fp.is_absolute() || f.find("..") != std::string::npos)
            fail(ErrorKind::InvalidInput, "'{}': shard name '{}' must be a plain file name beside the index", platform::path_utf8(index_path), f);
        if (seen.insert(f).second) shards.push_back(f);
    }
    for (auto& f : shards) wi.add_file(index_path.parent_path() / platform::u8path(f));
    for (auto& [name, file] : j["weight_map"].items()) {
        const TensorInfo* t = wi.find(name);
        if (!t)
            fail(ErrorKind::InvalidInput, "'{}' lists tensor '{}' in '{}', but that shard does not hold it", platform::path_utf8(index_path), name,
                 file.get<std::string>());
    }
    if (j.contains("metadata") && j["metadata"].is_object())
        for (auto& [k, v] : j["metadata"].items()) {
            MetaValue mv;
            if (v.is_number_integer()) {
                mv.kind = MetaValue::Kind::Int;
                mv.i = v.get<int64_t>();
            } else {
                mv.s = v.is_string() ? v.get<std::string>() : v.dump();
            }
            meta.emplace(k, std::move(mv));
        }
}

// Picks the weight file(s) of a diffusers/transformers component folder.
fs::path pick_in_folder(const fs::path& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    for (auto& e : fs::directory_iterator(dir, ec))
        if (e.is_regular_file(ec)) names.push_back(platform::path_utf8(e.path().filename()));
    if (ec) fail(ErrorKind::Io, "cannot list folder '{}': {}", platform::path_utf8(dir), ec.message());
    std::sort(names.begin(), names.end());
    auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
    for (const char* base : {"diffusion_pytorch_model", "model"}) {
        std::string b = base;
        if (has(b + ".safetensors.index.json")) return dir / platform::u8path(b + ".safetensors.index.json");
        if (has(b + ".safetensors")) return dir / platform::u8path(b + ".safetensors");
    }
    // Variants (diffusion_pytorch_model.fp16.safetensors): prefer fp16, then any.
    for (const char* base : {"diffusion_pytorch_model", "model"}) {
        std::string b = std::string(base) + ".";
        std::vector<std::string> cands;
        for (auto& n : names)
            if (n.rfind(b, 0) == 0 && (ends_with(n, ".safetensors") || ends_with(n, ".safetensors.index.json"))) cands.push_back(n);
        if (cands.empty()) continue;
        for (auto& c : cands)
            if (c == b + "fp16.safetensors.index.json" || c == b + "fp16.safetensors") return dir / platform::u8path(c);
        for (auto& c : cands)
            if (ends_with(c, ".index.json")) return dir / platform::u8path(c);
        return dir / platform::u8path(cands.front());
    }
    // PyTorch weights of older diffusers / transformers folders (read by the restricted unpickler).
    for (const char* base : {"diffusion_pytorch_model", "pytorch_model"}) {
        std::string b = base;
        if (has(b + ".bin.index.json")) return dir / (b + ".bin.index.json");
        if (has(b + ".bin")) return dir / (b + ".bin");
    }
    std::vector<std::string> any;
    for (auto& n : names)
        if (ends_with(n, ".safetensors") || ends_with(n, ".gguf") || ends_with(n, ".safetensors.index.json") || ends_with(n, ".pth") ||
            ends_with(n, ".pt") || ends_with(n, ".ckpt") || ends_with(n, ".bin"))
            any.push_back(n);
    if (any.size() == 1) return dir / platform::u8path(any.front());
    if (has("model_index.json"))
        fail(ErrorKind::InvalidInput,
             "'{}' is a diffusers pipeline folder: give one component's subfolder (e.g. '{}/unet' or '{}/transformer')", platform::path_utf8(dir),
             platform::path_utf8(dir), platform::path_utf8(dir));
    if (any.empty())
        fail(ErrorKind::InvalidInput,
             "no weight file in folder '{}' (looked for diffusion_pytorch_model*.safetensors, model*.safetensors, diffusion_pytorch_model.bin, pytorch_model.bin)",
             platform::path_utf8(dir));
    fail(ErrorKind::InvalidInput, "folder '{}' holds {} weight files and no shard index: give the file to open", platform::path_utf8(dir), any.size());
}

}  // namespace

WeightIndex::WeightIndex() : impl_(std::make_unique<Impl>()) {}
WeightIndex::~WeightIndex() = default;
WeightIndex::WeightIndex(WeightIndex&&) noexcept = default;
WeightIndex& WeightIndex::operator=(WeightIndex&&) noexcept = default;

WeightIndex WeightIndex::open(const fs::path& path) {
    WeightIndex wi;
    std::error_code ec;
    if (!fs::exists(path, ec)) fail(ErrorKind::Io, "'{}' does not exist", platform::path_utf8(path));
    fs::path target = path;
    bool folder = fs::is_directory(path, ec);
    if (folder) target = pick_in_folder(path);
    if (ends_with(platform::path_utf8(target.filename()), ".index.json")) open_index_json(wi, wi.impl_->metadata, target);
    else wi.add_file(target);
    if (folder || ends_with(platform::path_utf8(target.filename()), ".index.json")) {
        fs::path cfg = target.parent_path() / "config.json";
        if (fs::is_regular_file(cfg, ec)) wi.impl_->config = std::make_unique<nlohmann::json>(read_json_file(cfg));
    }
    return wi;
}

WeightIndex WeightIndex::open_memory(std::span<const uint8_t> bytes, const std::string& name) {
    WeightIndex wi;
    wi.impl_->add(name, platform::u8path(name), MappedFile::from_memory(bytes));
    return wi;
}

void WeightIndex::add_file(const fs::path& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) fail(ErrorKind::Io, "'{}' does not exist", platform::path_utf8(path));
    impl_->add(platform::path_utf8(path), path, MappedFile::open(path));
}

const std::vector<WeightFile>& WeightIndex::files() const { return impl_->files; }
const std::vector<TensorInfo>& WeightIndex::tensors() const { return impl_->tensors; }
const std::map<std::string, MetaValue>& WeightIndex::metadata() const { return impl_->metadata; }
const nlohmann::json* WeightIndex::config() const { return impl_->config.get(); }

const TensorInfo* WeightIndex::find(const std::string& name) const {
    auto it = impl_->by_name.find(name);
    return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}

std::span<const uint8_t> WeightIndex::bytes(const TensorInfo& t) const {
    if (t.file >= impl_->maps.size()) fail(ErrorKind::Internal, "tensor '{}' refers to file {} of {}", t.name, t.file, impl_->maps.size());
    const MappedFile* mp = t.side ? impl_->sides[t.file].get() : impl_->maps[t.file].get();
    if (!mp) fail(ErrorKind::Internal, "tensor '{}' refers to a side buffer its file does not have", t.name);
    const auto& m = *mp;
    if (t.offset > m.size() || t.nbytes > m.size() - t.offset)
        fail(ErrorKind::Internal, "tensor '{}' lies outside its file", t.name);
    return {m.data() + t.offset, (size_t)t.nbytes};
}

uint64_t WeightIndex::bytes_with_prefix(const std::string& prefix) const {
    uint64_t s = 0;
    for (auto& t : impl_->tensors)
        if (t.name.compare(0, prefix.size(), prefix) == 0) s += t.nbytes;
    return s;
}

std::vector<float> WeightIndex::read_f32(const TensorInfo& t) const {
    auto b = bytes(t);
    std::vector<float> out((size_t)t.numel());
    detail::to_f32(b.data(), t.dtype, t.gtype, t.numel(), out.data());
    return out;
}

std::vector<int64_t> WeightIndex::read_i64(const TensorInfo& t) const {
    auto b = bytes(t);
    const int64_t n = t.numel();
    std::vector<int64_t> out((size_t)n);
    DType d = t.dtype;
    if (d == DType::Ggml) {
        switch (t.gtype) {
            case GGML_TYPE_I64: d = DType::I64; break;
            case GGML_TYPE_I32: d = DType::I32; break;
            case GGML_TYPE_I16: d = DType::I16; break;
            case GGML_TYPE_I8: d = DType::I8; break;
            default: break;
        }
    }
    auto get = [&](auto tag) {
        using T = decltype(tag);
        for (int64_t i = 0; i < n; ++i) {
            T v;
            std::memcpy(&v, b.data() + i * sizeof(T), sizeof(T));
            out[i] = (int64_t)v;
        }
    };
    switch (d) {
        case DType::I64: get(int64_t{}); break;
        case DType::I32: get(int32_t{}); break;
        case DType::I16: get(int16_t{}); break;
        case DType::I8: get(int8_t{}); break;
        case DType::U8: get(uint8_t{}); break;
        case DType::BOOL:
            for (int64_t i = 0; i < n; ++i) out[i] = b[i] != 0;
            break;
        default:
            fail(ErrorKind::InvalidInput, "tensor '{}' is {}, not an integer type: read it with read_f32", t.name,
                 t.dtype == DType::Ggml ? ggml_type_name(t.gtype) : dtype_name(t.dtype));
    }
    return out;
}

namespace {

// Writes `n` bytes at byte offset `off` of dst, to host memory or through the backend.
void write_dst(ggml_tensor* dst, const void* src, size_t off, size_t n) {
    if (n == 0) return;
    if (dst->buffer && !ggml_backend_buffer_is_host(dst->buffer)) {
        ggml_backend_tensor_set(dst, src, off, n);
        return;
    }
    if (!dst->data) fail(ErrorKind::Internal, "tensor '{}' has no memory: allocate it before loading", ggml_get_name(dst));
    std::memcpy(static_cast<uint8_t*>(dst->data) + off, src, n);
}

std::string type_str(const TensorInfo& t) { return t.dtype == DType::Ggml ? ggml_type_name(t.gtype) : dtype_name(t.dtype); }

}  // namespace

void WeightIndex::load_into(const TensorInfo& t, ggml_tensor* dst) const {
    if (!dst) fail(ErrorKind::Internal, "load_into('{}'): destination tensor is null", t.name);
    const auto ne = t.ggml_ne();
    for (int i = 0; i < 4; ++i)
        if (ne[i] != dst->ne[i])
            fail(ErrorKind::ModelMismatch, "tensor '{}' has ggml shape [{}, {}, {}, {}] but its destination is [{}, {}, {}, {}]", t.name,
                 ne[0], ne[1], ne[2], ne[3], dst->ne[0], dst->ne[1], dst->ne[2], dst->ne[3]);
    if (!ggml_is_contiguous(dst)) fail(ErrorKind::Internal, "load_into('{}'): destination tensor is not contiguous", t.name);
    for (int i = 4; i < GGML_MAX_DIMS; ++i)
        if (dst->ne[i] != 1) fail(ErrorKind::ModelMismatch, "tensor '{}': destination has more than 4 dimensions", t.name);

    const auto src = bytes(t);
    const ggml_type dt = dst->type;
    const size_t dst_bytes = ggml_nbytes(dst);
    const int64_t n = t.numel();

    // Same type: raw copy.
    if (t.gtype == dt) {
        if (dst_bytes != src.size())
            fail(ErrorKind::InvalidInput, "tensor '{}': {} stored bytes but {} needs {}", t.name, src.size(), ggml_type_name(dt), dst_bytes);
        write_dst(dst, src.data(), 0, src.size());
        return;
    }

    const bool src_float = detail::is_float(t.dtype, t.gtype);
    constexpr int64_t kChunk = 1 << 20;  // elements converted at a time

    if (dt == GGML_TYPE_F32 || dt == GGML_TYPE_F16 || dt == GGML_TYPE_BF16) {
        // any stored type -> float through f32, in chunks of whole source blocks.
        int64_t blk = 1;
        size_t blk_bytes = detail::dtype_size(t.dtype);
        if (t.dtype == DType::Ggml) {
            blk = ggml_blck_size(t.gtype);
            blk_bytes = ggml_type_size(t.gtype);
        }
        if (blk <= 0 || n % blk != 0) fail(ErrorKind::InvalidInput, "tensor '{}': {} elements are not whole {} blocks", t.name, n, type_str(t));
        const int64_t chunk = std::max<int64_t>(blk, (kChunk / blk) * blk);
        std::vector<float> f((size_t)std::min(chunk, n));
        std::vector<uint16_t> h(dt == GGML_TYPE_F32 ? 0 : f.size());
        const size_t out_es = ggml_type_size(dt);
        for (int64_t i = 0; i < n; i += chunk) {
            const int64_t k = std::min(chunk, n - i);
            detail::to_f32(src.data() + (size_t)(i / blk) * blk_bytes, t.dtype, t.gtype, k, f.data());
            if (dt == GGML_TYPE_F32) write_dst(dst, f.data(), (size_t)i * 4, (size_t)k * 4);
            else {
                if (dt == GGML_TYPE_F16) ggml_fp32_to_fp16_row(f.data(), reinterpret_cast<ggml_fp16_t*>(h.data()), k);
                else ggml_fp32_to_bf16_row_ref(f.data(), reinterpret_cast<ggml_bf16_t*>(h.data()), k);
                write_dst(dst, h.data(), (size_t)i * out_es, (size_t)k * out_es);
            }
        }
        return;
    }

    if (ggml_is_quantized(dt)) {
        // F32/F16/BF16 (any float safetensors dtype) -> quantised, row by row.
        if (!src_float || (t.dtype == DType::Ggml && ggml_is_quantized(t.gtype)))
            fail(ErrorKind::InvalidInput, "tensor '{}' is {}: only float tensors can be quantised to {}", t.name, type_str(t),
                 ggml_type_name(dt));
        if (ggml_quantize_requires_imatrix(dt))
            fail(ErrorKind::Unsupported, "quantising to {} needs an importance matrix, which easel does not compute: pick another type",
                 ggml_type_name(dt));
        const int64_t per_row = dst->ne[0];
        const int64_t blk = ggml_blck_size(dt);
        if (per_row % blk != 0)
            fail(ErrorKind::InvalidInput, "tensor '{}': rows of {} values are not a multiple of the {} block size {}", t.name, per_row,
                 ggml_type_name(dt), blk);
        const int64_t rows = n / per_row;
        const int64_t rows_per_chunk = std::max<int64_t>(1, kChunk / per_row);
        const size_t row_bytes = ggml_row_size(dt, per_row);
        const size_t es = t.dtype == DType::Ggml ? ggml_type_size(t.gtype) : detail::dtype_size(t.dtype);
        std::vector<float> f((size_t)(std::min(rows_per_chunk, rows) * per_row));
        std::vector<uint8_t> q((size_t)std::min(rows_per_chunk, rows) * row_bytes);
        for (int64_t r = 0; r < rows; r += rows_per_chunk) {
            const int64_t k = std::min(rows_per_chunk, rows - r);
            detail::to_f32(src.data() + (size_t)(r * per_row) * es, t.dtype, t.gtype, k * per_row, f.data());
            size_t w = ggml_quantize_chunk(dt, f.data(), q.data(), 0, k, per_row, nullptr);
            write_dst(dst, q.data(), (size_t)r * row_bytes, w);
        }
        return;
    }

    if (dt == GGML_TYPE_I32 || dt == GGML_TYPE_I16 || dt == GGML_TYPE_I8) {
        if (src_float) fail(ErrorKind::InvalidInput, "tensor '{}' is {}: cannot load floats into {}", t.name, type_str(t), ggml_type_name(dt));
        const auto v = read_i64(t);
        const int64_t lo = dt == GGML_TYPE_I32 ? INT32_MIN : dt == GGML_TYPE_I16 ? INT16_MIN : INT8_MIN;
        const int64_t hi = dt == GGML_TYPE_I32 ? INT32_MAX : dt == GGML_TYPE_I16 ? INT16_MAX : INT8_MAX;
        std::vector<uint8_t> out(dst_bytes);
        const size_t es = ggml_type_size(dt);
        for (int64_t i = 0; i < n; ++i) {
            if (v[i] < lo || v[i] > hi)
                fail(ErrorKind::InvalidInput, "tensor '{}': value {} at index {} does not fit {}", t.name, v[i], i, ggml_type_name(dt));
            if (es == 4) { int32_t x = (int32_t)v[i]; std::memcpy(&out[i * 4], &x, 4); }
            else if (es == 2) { int16_t x = (int16_t)v[i]; std::memcpy(&out[i * 2], &x, 2); }
            else { out[i] = (uint8_t)(int8_t)v[i]; }
        }
        write_dst(dst, out.data(), 0, out.size());
        return;
    }
    fail(ErrorKind::Unsupported, "tensor '{}': cannot convert {} to {}", t.name, type_str(t), ggml_type_name(dt));
}

}  // namespace easel::io
