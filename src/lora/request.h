// What the user asks for: LoRAs from --lora FILE[:WEIGHT] and from <lora:NAME:WEIGHT> tags
// (resolved inside --lora-model-dir), the apply mode, and the A1111 hash recorded for each.
//
// sd-cli's meanings: --lora-model-dir DIR holds the files the tags name; a NAME is a path
// relative to DIR without extension (".safetensors", ".gguf", ".pt", ".ckpt" tried in that
// order; subfolders allowed, "sub/name"); a bare name not found there is looked up by file
// name in DIR's subfolders, as A1111 lists its Lora folder. A name that leaves DIR ("..",
// an absolute path, a symlink pointing outside) is refused.
#pragma once

#include "text/prompt_syntax.h"

#include <filesystem>
#include <string>
#include <vector>

namespace easel::lora {

/// --lora-apply-mode (sd.cpp): auto = at run time when a patched weight is quantised or row
/// split, else merged once at load; immediately = merged at load; at_runtime = added in the graph.
enum class ApplyMode { Auto, Immediately, AtRuntime };

/// "auto", "immediately", "at_runtime" -> ApplyMode. Throws Error(InvalidInput) otherwise.
ApplyMode parse_apply_mode(const std::string& s);
const char* apply_mode_name(ApplyMode m);

/// One LoRA to apply.
struct LoraRequest {
    std::string name;              ///< as the user wrote it: the tag's NAME, or --lora's file stem
    std::filesystem::path path;    ///< the resolved file
    float te_weight = 1.0f;        ///< multiplier of its text-encoder patches (A1111 te)
    float diffusion_weight = 1.0f; ///< multiplier of its UNet/DiT patches (A1111 unet)
    std::string origin;            ///< "--lora", "prompt", "negative prompt" (messages)
    bool active() const { return te_weight != 0.0f || diffusion_weight != 0.0f; }
};

/// Parses one --lora argument "FILE[:WEIGHT]" (the text after the last ':' is the weight when
/// it is a number; otherwise the whole argument is the file if it exists). The file must exist.
/// Throws Error(InvalidInput) for a weight that is not a finite number ("--lora 'a.safetensors:x':
/// weight 'x' is not a number") and Error(Io) for a missing file.
LoraRequest parse_lora_flag(const std::string& arg);

/// The file a tag's NAME means inside `dir` (see the header). Throws Error(InvalidInput) for a
/// name that escapes `dir` or matches several files in its subfolders, Error(Io) when nothing
/// matches or `dir` is not a folder.
std::filesystem::path resolve_lora_name(const std::filesystem::path& dir, const std::string& name);

/// Every LoRA of a job: the --lora flags, then the tags of the prompt and of the negative prompt
/// (a LoRA changes the model for both passes), resolved in `dir`. The same file named twice
/// gets the sum of the weights (sd.cpp sums repeated tags). Requests whose weights are all 0
/// are kept (inactive: resolved and hashed for the metadata, never read). Throws what
/// parse_lora_flag / resolve_lora_name throw, and Error(InvalidInput) for a tag when `dir` is
/// empty ("the prompt names LoRA 'x' but no --lora-model-dir is given").
std::vector<LoraRequest> collect_loras(const std::vector<std::string>& flags, const text::PromptTags& prompt,
                                       const text::PromptTags& negative, const std::filesystem::path& dir);

/// SHA-256 of a LoRA file as A1111 computes it (modules/hashes.py): for a .safetensors file the
/// bytes after the header (kohya's "addnet" hash, sd-scripts train_util.addnet_hash_safetensors),
/// for any other file all its bytes; 64 lowercase hex digits. Throws Error(Io) when unreadable.
std::string lora_sha256(const std::filesystem::path& file);

/// A1111's short hash of a LoRA (network.py NetworkOnDisk.shorthash): the first 12 hex digits of
/// lora_sha256, or of the file's "sshs_model_hash" metadata when it has one (A1111 prefers it).
std::string a1111_short_hash(const std::filesystem::path& file);

}  // namespace easel::lora
