// WeightIndex: one name -> tensor table over all weight files of a model component.
//
// Formats: safetensors (memory-mapped; also sharded via *.safetensors.index.json), GGUF
// (through ggml's gguf API) and PyTorch checkpoints (.pth/.pt/.ckpt/.bin: zip or legacy format,
// read by a restricted unpickler that runs nothing, io/pickle.h; storages memory-mapped in place).
// A diffusers folder is opened per component subfolder (see open_diffusers_component()).
//
// Shape convention: TensorInfo::shape is in PyTorch order, outermost dimension first
// (a Linear weight is [out, in], a Conv2d weight [out, in, kh, kw]). GGUF stores ggml's ne[]
// (innermost first); the reader reverses it so both formats agree. ggml_ne() gives ggml order.
//
// Errors: every malformed file raises easel::Error(InvalidInput or Io) with a one-line
// message naming the file and the problem; no reader aborts or reads out of bounds.
#pragma once

#include <ggml.h>
#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

struct ggml_backend_buffer;

namespace easel::io {

/// Element type of a stored tensor. Safetensors dtypes map 1:1; GGUF tensors use Ggml with
/// TensorInfo::ggml_type saying which ggml type (F32, F16, BF16, Q8_0, Q4_K, ...).
enum class DType { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL, Ggml };

/// Safetensors name of a dtype ("F32", "BF16", ...); for Ggml the ggml type name.
const char* dtype_name(DType d);

/// One tensor stored in a file.
struct TensorInfo {
    std::string name;
    std::vector<int64_t> shape;   ///< PyTorch order, outermost first; empty for a scalar
    DType dtype = DType::F32;
    ggml_type gtype = GGML_TYPE_F32;  ///< the ggml type holding it without conversion, or GGML_TYPE_COUNT if none
    uint32_t file = 0;            ///< index into WeightIndex::files()
    uint64_t offset = 0;          ///< absolute byte offset of the data in the file
    uint64_t nbytes = 0;          ///< stored bytes
    /// The data lie in the file's side buffer (a PyTorch strided tensor copied contiguously at
    /// open), `offset` counting from its start, not in the mapped file.
    bool side = false;

    int64_t numel() const;
    /// ggml ne[] (innermost first), padded with 1 to 4 dimensions.
    std::array<int64_t, 4> ggml_ne() const;
};

/// One opened weight file.
struct WeightFile {
    std::filesystem::path path;
    std::string format;  ///< "safetensors", "gguf", "pytorch" (zip) or "pytorch-legacy"
    uint64_t size = 0;   ///< bytes
};

/// A metadata value: safetensors __metadata__ entries are strings; GGUF key/values keep type.
struct MetaValue {
    enum class Kind { String, Int, Float, Bool, StringArray, IntArray, FloatArray } kind = Kind::String;
    std::string s;
    int64_t i = 0;
    double f = 0;
    bool b = false;
    std::vector<std::string> sa;
    std::vector<int64_t> ia;
    std::vector<double> fa;
};

/// Name -> TensorInfo over one or more files, with mmap-backed data access.
class WeightIndex {
public:
    WeightIndex();
    ~WeightIndex();
    WeightIndex(WeightIndex&&) noexcept;
    WeightIndex& operator=(WeightIndex&&) noexcept;

    /// Opens a .safetensors file, a *.safetensors.index.json shard index, a .gguf file, a PyTorch
    /// checkpoint (.pth, .pt, .ckpt, .bin; *.bin.index.json shards), or a folder holding one of
    /// those (diffusion_pytorch_model*.safetensors, model*.safetensors, then the .bin names).
    /// Throws Error(Io) if unreadable, Error(InvalidInput) if malformed.
    static WeightIndex open(const std::filesystem::path& path);

    /// Opens a safetensors, GGUF or PyTorch file held in memory (the bytes are copied); `name` labels it
    /// in errors and in files(). Used by the fuzzers. Throws Error(InvalidInput) if malformed.
    static WeightIndex open_memory(std::span<const uint8_t> bytes, const std::string& name = "<memory>");

    /// Adds all tensors of another file; duplicate names across files are an error.
    void add_file(const std::filesystem::path& path);

    const std::vector<WeightFile>& files() const;
    const std::vector<TensorInfo>& tensors() const;
    /// nullptr when absent. Pointers into tensors() stay valid until the next add_file().
    const TensorInfo* find(const std::string& name) const;
    bool contains(const std::string& name) const { return find(name) != nullptr; }

    /// Metadata of all files merged (safetensors __metadata__, GGUF key/values).
    const std::map<std::string, MetaValue>& metadata() const;

    /// The stored bytes of a tensor (memory-mapped; valid while the index lives).
    std::span<const uint8_t> bytes(const TensorInfo& t) const;

    /// Copies a tensor into dst (host or backend memory), converting its dtype to dst->type:
    /// float types convert among F32/F16/BF16 (and from F64, F8); to a quantised dst type the
    /// data are quantised with ggml's quantize API. Shapes must match (numel and ggml ne).
    /// Throws Error(InvalidInput) on a shape mismatch or an impossible conversion.
    void load_into(const TensorInfo& t, ggml_tensor* dst) const;

    /// Reads a tensor as float32 values (any float or quantised type), in stored order.
    std::vector<float> read_f32(const TensorInfo& t) const;

    /// Reads an integer or BOOL tensor (I64, I32, I16, I8, U8, BOOL; GGUF I8..I64) as int64 values,
    /// in stored order. Throws Error(InvalidInput) for float types.
    std::vector<int64_t> read_i64(const TensorInfo& t) const;

    /// The component's config.json (diffusers/transformers) when the index was opened from a
    /// folder or a shard index that has one beside it; nullptr otherwise. Config in a folder wins
    /// over what is inferred from weight shapes.
    const nlohmann::json* config() const;

    /// Total stored bytes of all tensors whose name starts with prefix.
    uint64_t bytes_with_prefix(const std::string& prefix) const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace easel::io
