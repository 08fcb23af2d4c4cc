// Format parsers and element conversions behind WeightIndex. Internal to src/io.
//
// Each parser takes the whole file as bytes and returns the tensor table (absolute byte
// offsets into those bytes, TensorInfo::file left 0) and the metadata. They validate every
// field before use and throw Error(InvalidInput) with a message naming `label` on any defect.
#pragma once

#include "io/weight_index.h"

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace easel::io::detail {

/// The parsed content of one file.
struct ParsedFile {
    std::string format;                       ///< "safetensors", "gguf", "pytorch" or "pytorch-legacy"
    std::vector<TensorInfo> tensors;          ///< in file order
    std::map<std::string, MetaValue> metadata;
    /// Bytes that tensors with TensorInfo::side refer to (PyTorch strided tensors made
    /// contiguous); empty for the other formats.
    std::vector<uint8_t> side;
};

/// Largest safetensors JSON header accepted (the reference implementation's limit, 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 100ull * 1000 * 1000;
/// Deepest JSON nesting accepted in a safetensors header (real files use 3).
inline constexpr int kMaxJsonDepth = 16;
/// Most dimensions a tensor may have.
inline constexpr size_t kMaxDims = 8;

/// Parses a safetensors file: u64 little-endian header length N, N bytes of JSON
/// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data
/// (offsets relative to 8 + N). Spec: github.com/huggingface/safetensors (README, "Format").
ParsedFile parse_safetensors(std::span<const uint8_t> data, const std::string& label);

/// Parses a GGUF file through ggml's gguf API (gguf_init_from_buffer) after checking what
/// ggml does not: the data section lies inside the file. Shapes are reversed to PyTorch order.
ParsedFile parse_gguf(std::span<const uint8_t> data, const std::string& label);

/// Whether the bytes start like a zip archive (a PyTorch >= 1.6 checkpoint: local header "PK\3\4",
/// or "PK\5\6" of an empty archive).
bool is_pytorch_zip(std::span<const uint8_t> data);
/// Whether the bytes start with the legacy PyTorch magic-number pickle.
bool is_pytorch_legacy(std::span<const uint8_t> data);

/// Parses a PyTorch zip checkpoint (torch.save, PyTorch >= 1.6) with the restricted unpickler
/// (io/pickle.h): the state dict (nested under params_ema / params / state_dict / model ... or at
/// the root) becomes the tensor table; contiguous tensors point into their storage records
/// (which must be stored uncompressed, as torch writes them), strided ones are copied into
/// ParsedFile::side. Root-level numbers and strings (epoch, global_step) become metadata, and so
/// does the wrapper key used ("pytorch.state_dict_key"). Throws Error(InvalidInput) for a damaged
/// zip, a refused pickle, a storage record missing or too short, a tensor reaching past its
/// storage; Error(Unsupported) for a big-endian file.
ParsedFile parse_pytorch_zip(std::span<const uint8_t> data, const std::string& label);
/// Parses a legacy (non-zip) PyTorch checkpoint (torch.save with _use_new_zipfile_serialization=False,
/// or PyTorch < 1.6): the five pickles and the storages that follow them. Same results and errors
/// as parse_pytorch_zip.
ParsedFile parse_pytorch_legacy(std::span<const uint8_t> data, const std::string& label);

/// Bytes per element of a safetensors dtype (0 for DType::Ggml).
size_t dtype_size(DType d);
/// The ggml type that holds a dtype unchanged, or GGML_TYPE_COUNT if none.
ggml_type dtype_ggml_type(DType d);
/// Safetensors dtype from its name ("F32", "BF16", "F8_E4M3", ...); nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view s);
/// Whether values of the dtype are floating point (F64/F32/F16/BF16/F8_*), or a ggml float /
/// quantised type for DType::Ggml.
bool is_float(DType d, ggml_type g);

/// Converts n stored elements starting at src (any alignment) to float32. For DType::Ggml with a
/// quantised type, n must be a multiple of the block size. Integers and BOOL convert by value.
/// Throws Error(Unsupported) for a ggml type without a to_float conversion.
void to_f32(const uint8_t* src, DType d, ggml_type g, int64_t n, float* dst);

/// float value of an FP8 byte: E4M3FN (bias 7, no infinities, 0x7f/0xff NaN) and E5M2 (bias 15,
/// IEEE-like). Source: OCP 8-bit floating point specification (OFP8) v1.0.
float f8_e4m3_to_f32(uint8_t v);
float f8_e5m2_to_f32(uint8_t v);

}  // namespace easel::io::detail
