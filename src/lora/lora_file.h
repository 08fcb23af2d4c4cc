// LoRA files: which tensors patch which module, for every common format, recognised from the
// keys (no format flag).
//
// A LoRA file is a flat name -> tensor table (safetensors or GGUF; PyTorch pickles through the
// io::WeightIndex reader once it reads them). Each key is "<module><suffix>"; the suffix says
// what the tensor is, the module part names the patched layer in the trainer's naming (mapped
// onto easel's canonical names by lora::KeyMap, key_map.h). Suffixes understood:
//
//   LoRA / LoCon   kohya .lora_up.weight / .lora_down.weight / .lora_mid.weight (conv Tucker),
//                  PEFT .lora_B.weight / .lora_A.weight (+ .lora_B.bias, PEFT lora_bias),
//                  diffusers .lora.up.weight / .lora.down.weight, .lora_linear_layer.up/down.weight,
//                  xlabs <name>_lora1.up.weight / .down.weight; .alpha (scale alpha / rank)
//   LoHa           LyCORIS .hada_w1_a, .hada_w1_b, .hada_w2_a, .hada_w2_b (+ .hada_t1, .hada_t2: Tucker)
//   LoKr           LyCORIS .lokr_w1 | .lokr_w1_a + .lokr_w1_b, .lokr_w2 | .lokr_w2_a + .lokr_w2_b (+ .lokr_t2)
//   full diff      .diff (weight difference), .diff_b (bias difference)
//   DoRA           .dora_scale (LyCORIS / kohya / OneTrainer), .lora_magnitude_vector[.weight] (PEFT)
//
// Formulas (lora/math.h): LoRA delta = (alpha / rank) * up @ down (diffusers/PEFT scaling =
// lora_alpha / r; kohya/LyCORIS alpha / lora_dim); LoHa (w1a w1b) * (w2a w2b) * alpha / rank;
// LoKr kron(w1, w2) * alpha / rank (rank of the factorised matrix, scale 1 when neither is
// factorised, as LyCORIS and ComfyUI).
//
// Refused here, each with one line: the cloneofsimo format (unet:N:up, no module names), a patch
// whose tensors are incomplete or of inconsistent ranks, non-finite values (when read).
#pragma once

#include "io/weight_index.h"

#include <filesystem>
#include <string>
#include <vector>

namespace easel::lora {

/// What kind of update a patch carries.
enum class PatchKind {
    LoRA,  ///< low rank: up @ down (conv: up [out, r, 1, 1] and down [r, in, k, k], or a Tucker mid)
    LoHa,  ///< Hadamard product of two low-rank products
    LoKr,  ///< Kronecker product of two (possibly low-rank) factors
    Diff,  ///< full weight / bias difference
};

/// Display name: "LoRA", "LoHa", "LoKr", "full diff".
const char* patch_kind_name(PatchKind k);

/// One patched module of a LoRA file: the full stored names of its tensors ("" = absent) and
/// the shape of the update it makes. Names are as stored in the file.
struct Patch {
    std::string module;  ///< the key without its suffix, e.g. "lora_unet_down_blocks_0_attentions_0_proj_in"
    PatchKind kind = PatchKind::LoRA;
    std::string up, down, mid;                                       ///< LoRA / LoCon
    std::string hada_w1_a, hada_w1_b, hada_w2_a, hada_w2_b, hada_t1, hada_t2;  ///< LoHa
    std::string lokr_w1, lokr_w1_a, lokr_w1_b, lokr_w2, lokr_w2_a, lokr_w2_b, lokr_t2;  ///< LoKr
    std::string diff, diff_b;                                        ///< full difference
    std::string bias;        ///< PEFT lora_B.bias: a bias difference (scaled like the weight)
    std::string alpha;       ///< 0-d or 1-element tensor
    std::string dora_scale;  ///< DoRA magnitude: [out, 1...] / 1-D [out] (output axis) or [1, in...] (input axis)

    /// Shape of the weight update, PyTorch order: [out, in] or [out, in, kh, kw] (LoHa/LoKr
    /// without Tucker: [out, in * kh * kw] - reshaped onto the target, whose element count per
    /// row it must match). Empty for a bias-only diff.
    std::vector<int64_t> delta_shape;
    int64_t rank = 0;  ///< the rank alpha is divided by (0: the scale is 1 whatever alpha says)
    /// Rows of the update (delta_shape[0], or the bias length of a bias-only patch).
    int64_t out_rows() const;
    /// Elements per row of the update (product of delta_shape[1:]; 0 for bias-only).
    int64_t row_elems() const;
};

/// The patches of a file and what else it holds.
struct ParsedLora {
    std::vector<Patch> patches;           ///< in the order of their first key in the file
    std::vector<std::string> unknown;     ///< keys of no LoRA suffix (full tensors, other adapter kinds)
    std::vector<std::string> embeddings;  ///< bundled textual-inversion vectors (pivotal tuning: "<s1>", emb_params): not applied
};

/// Groups `tensors` (names and shapes; no data read) into patches. `what` names the file in
/// errors. Throws Error(Unsupported) for the cloneofsimo format and Error(InvalidInput) for
/// a patch with a missing partner tensor (an up without its down, w1_a without w1_b, ...),
/// tensors of the wrong number of dimensions, or ranks that disagree. An alpha with no
/// weights beside it is ignored (it patches nothing).
ParsedLora parse_keys(const std::vector<io::TensorInfo>& tensors, const std::string& what);

/// F32 host tensor in PyTorch order (row-major, outermost first).
struct Tensor {
    std::vector<int64_t> shape;
    std::vector<float> data;
    int64_t numel() const;
};

/// An opened LoRA file: its index (tensors stay memory-mapped) and its patches.
class LoraFile {
public:
    /// Opens `path` through io::WeightIndex (safetensors, GGUF; a PyTorch .pt/.ckpt is read
    /// when io's reader supports pickles - until then it refuses them with its own message)
    /// and parses its keys. Throws what WeightIndex::open and parse_keys throw.
    static LoraFile open(const std::filesystem::path& path);
    /// The same over an index already opened (tests, fuzzers); `what` names it in errors.
    static LoraFile from_index(io::WeightIndex index, const std::string& what);

    const std::filesystem::path& path() const { return path_; }
    const io::WeightIndex& index() const { return index_; }
    const ParsedLora& parsed() const { return parsed_; }

    /// A tensor as F32 (any stored float or quantised type). Throws Error(InvalidInput) naming
    /// the file and tensor when a value is NaN or infinite.
    Tensor read(const std::string& name) const;
    /// Reads every tensor of every patch once: Error(InvalidInput) naming the first non-finite value.
    void check_values() const;
    /// The scale of a patch's update: its alpha tensor / rank; for a LoRA without an alpha
    /// tensor, the adapter config diffusers saves in the file's "lora_adapter_metadata"
    /// (per component prefix: lora_alpha, alpha_pattern, use_rslora: alpha / sqrt(rank)) or PEFT's
    /// adapter_config.json beside an adapter_model.safetensors; else 1 (diffusers' default alpha =
    /// rank). Throws Error(InvalidInput) for an alpha that is not one finite number.
    float scale(const Patch& p) const;

    /// How the file is named in messages (its path, or the `what` given to from_index).
    const std::string& what() const { return what_; }

private:
    /// A PEFT LoraConfig's scaling fields (from diffusers' metadata or adapter_config.json).
    struct PeftScaling {
        double lora_alpha = 0;
        bool rslora = false;
        std::vector<std::pair<std::string, double>> alpha_pattern;  ///< module-name pattern -> alpha
    };
    void read_peft_configs();

    std::filesystem::path path_;
    std::string what_;
    std::vector<std::pair<std::string, PeftScaling>> peft_;  ///< module-name prefix ("unet.", "transformer.", "base_model.model.") -> scaling
    io::WeightIndex index_;
    ParsedLora parsed_;
};

}  // namespace easel::lora
