// Artifacts: the files the pipeline's stages write and read (prompt conditioning, latents,
// sampler checkpoints). Each is a standard safetensors file (8-byte little-endian header length,
// JSON header with `__metadata__`, then the tensor data), so any safetensors tool reads it
// (Python: safetensors.torch.load_file / safe_open(...).metadata()).
//
// Metadata every artifact carries (all values are strings, as safetensors requires):
//   format          "easel-artifact"
//   kind            "conditioning" | "latent" | "checkpoint"
//   format_version  kArtifactFormatVersion ("1")
//   easel_version   the writer's easel version
//   content_hash    "xxh3-128:<32 hex>" over every other metadata entry and every tensor's name,
//                   dtype, shape and bytes (artifact_content_hash); a reader recomputes it, so a
//                   truncated file or an edited value is refused
// plus what the stage adds (model, model_fingerprint, params as JSON, ...; docs/artifacts.md).
//
// Writes are atomic (platform::write_file_atomic): a temporary file in the same folder, fsync,
// rename over the target, fsync of the folder. A crash leaves either the old file or the new one, never half of one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace easel::pipeline {

/// The artifact kinds.
enum class ArtifactKind { Conditioning, Latent, Checkpoint };
/// "conditioning", "latent", "checkpoint".
const char* artifact_kind_name(ArtifactKind k);

/// Version of the layout described in docs/artifacts.md; readers refuse newer versions.
inline constexpr int kArtifactFormatVersion = 1;

/// One stored tensor: dtype "F32", "I64", "I32" or "U8"; shape outermost first (row-major,
/// innermost fastest); little-endian bytes.
struct ArtifactTensor {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

/// An artifact in memory.
struct Artifact {
    ArtifactKind kind = ArtifactKind::Latent;
    /// Metadata besides the standard entries (which write_artifact sets and read_artifact
    /// checks): e.g. "model", "model_fingerprint", "params".
    std::map<std::string, std::string> meta;
    std::vector<ArtifactTensor> tensors;

    void add_f32(const std::string& name, std::vector<int64_t> shape, std::span<const float> v);
    void add_i64(const std::string& name, std::vector<int64_t> shape, std::span<const int64_t> v);
    void add_i32(const std::string& name, std::vector<int64_t> shape, std::span<const int32_t> v);
    void add_u8(const std::string& name, std::vector<int64_t> shape, std::span<const uint8_t> v);

    /// nullptr when absent.
    const ArtifactTensor* find(const std::string& name) const;
    bool has(const std::string& name) const { return find(name) != nullptr; }
    /// The tensor's values; throws Error(InvalidInput) naming the artifact entry when it is
    /// absent or of another dtype. `what` names the file in messages.
    std::vector<float> f32(const std::string& name, const std::string& what = "artifact") const;
    std::vector<int64_t> i64(const std::string& name, const std::string& what = "artifact") const;
    std::vector<int32_t> i32(const std::string& name, const std::string& what = "artifact") const;
    std::vector<uint8_t> u8(const std::string& name, const std::string& what = "artifact") const;
    /// A metadata value; throws Error(InvalidInput) when absent.
    const std::string& at(const std::string& key, const std::string& what = "artifact") const;
};

/// "xxh3-128:<32 lowercase hex>" (XXH3 128-bit, xxhash library) over the metadata entries
/// except content_hash (sorted by key) and the tensors (sorted by name).
std::string artifact_content_hash(const Artifact& a);
/// The same hash over the tensors only (names, dtypes, shapes, bytes): equal for equal data
/// whatever the metadata (used as the conditioning hash of checkpoints and cache entries).
std::string artifact_data_hash(const Artifact& a);

/// Serialises `a` (standard metadata added, content hash computed) into safetensors bytes.
std::vector<uint8_t> serialize_artifact(const Artifact& a);
/// Writes `a` to `path` atomically (platform::write_file_atomic: temp file in the same folder,
/// fsync, rename, fsync of the folder). Throws Error(Io) with one line when the folder does not
/// exist or the write fails (a full disk included): the target is left as it was and no
/// temporary file remains.
void write_artifact(const std::filesystem::path& path, const Artifact& a);
/// Reads an artifact and checks it: a safetensors header within bounds, format
/// "easel-artifact", kind == expected, format_version <= kArtifactFormatVersion, and the
/// content hash. Throws Error(Io) when unreadable, Error(InvalidInput) with a one-line message
/// naming the file and what is wrong (truncated, not an easel artifact, wrong kind, edited or
/// corrupted: content hash mismatch).
Artifact read_artifact(const std::filesystem::path& path, ArtifactKind expected);
/// As read_artifact, from bytes (`what` names them in messages).
Artifact parse_artifact(std::span<const uint8_t> bytes, ArtifactKind expected, const std::string& what);

/// XXH3-128 of bytes as 32 lowercase hex digits.
std::string xxh3_hex(std::span<const uint8_t> bytes);

}  // namespace easel::pipeline
