// Applying a job's LoRAs to a model: the patches of each loaded module (a KeyMap component) as
// an nn::WeightPatches, which the family registers under the stored tensors its modules load
// (models::FamilyBase::set_loras, nn::register_patches). nn::read_param then merges them into the
// weights at load, or ParamBuffer binds them as run-time terms that nn::weight_matmul adds beside
// each patched matmul (nn/weight_patch.h, docs/lora.md).
//
// Which form a weight gets (--lora-apply-mode, sd.cpp's meanings):
//   immediately  merged at load (a quantised weight is dequantised, patched, re-quantised: one
//                warning about the quality cost)
//   at_runtime   added in the graph: y = x W^T + sum_k m_k s_k (x A_k^T) B_k^T for LoRA patches;
//                other kinds (LoHa, LoKr, full diff, LoCon with a Tucker mid) as their dense update
//                rows, y += m_k x D_k^T; a weight with a DoRA patch, biases, norms and embeddings
//                are merged (they do not meet their input in weight_matmul, or DoRA rescales W)
//   auto         at run time for quantised weights, merged otherwise
// Weights on the row-split meta device are always merged (re-quantised when quantised: the
// meta device takes no run-time terms).
#pragma once

#include "lora/key_map.h"
#include "lora/lora_file.h"
#include "lora/mapping.h"
#include "lora/request.h"
#include "nn/weight_patch.h"

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace easel::lora {

/// The patches of one component's weights from every LoRA of a job (see the file comment).
class ComponentPatches final : public nn::WeightPatches {
public:
    ComponentPatches(ApplyMode mode, std::string component) : mode_(mode), component_(std::move(component)) {}

    /// Adds patch `patch` of `file` with the user's weight `m`, going into `target` at the rows
    /// `dest` say (the destinations of that target only).
    void add(std::shared_ptr<const LoraFile> file, size_t patch, const Target& target, std::vector<Destination> dest, float m);
    /// Number of patched weights (biases counted apart).
    size_t weights() const { return by_weight_.size(); }

    How how(const std::string& name, nn::ParamRole role, ggml_type type, bool row_split) const override;
    void merge(const std::string& name, std::span<float> values) const override;
    std::vector<nn::UpdateTensor> runtime_tensors(const std::string& name) const override;
    std::unique_ptr<nn::RuntimeUpdate> runtime(const std::string& name, std::span<ggml_tensor* const> tensors) const override;
    /// The canonical names of the patched weights and biases, sorted.
    std::vector<std::string> names() const;

private:
    struct Entry {
        std::shared_ptr<const LoraFile> file;
        size_t patch = 0;
        Target target;
        std::vector<Destination> dest;
        float m = 1.0f;
        const Patch& p() const { return file->parsed().patches[patch]; }
        bool low_rank() const { return p().kind == PatchKind::LoRA && p().mid.empty(); }
    };
    /// The update of `e` on its target's rows, dense [rows, row_elems] (alpha / rank applied, not m).
    static Tensor dense_update(const Entry& e);

    ApplyMode mode_;
    std::string component_;
    std::unordered_map<std::string, std::vector<Entry>> by_weight_;  ///< canonical weight name -> entries in order
    std::unordered_map<std::string, std::vector<Entry>> by_bias_;    ///< canonical bias name -> entries with a bias update
    mutable bool warned_requant_ = false;
};

/// One LoRA of a job, opened.
struct OpenedLora {
    LoraRequest request;
    std::shared_ptr<const LoraFile> file;
};

/// Opens the active LoRAs of `requests` and checks their values (Error(InvalidInput) naming a
/// NaN), as generate does before anything runs.
std::vector<OpenedLora> open_loras(const std::vector<LoraRequest>& requests);

/// The patches of every component of `km` for `loras`: each file is mapped onto `km` and
/// fit-checked (check_fit: Error(ModelMismatch) for a LoRA of another family or size; its warning
/// is logged), then each mapped patch is added to its component with the request's te or
/// diffusion weight (Component::module "te" / "diffusion"). Components no LoRA patches are absent.
std::map<std::string, std::shared_ptr<const ComponentPatches>> build_patches(const KeyMap& km, const std::vector<OpenedLora>& loras,
                                                                             const ModelInfo& model, ApplyMode mode);

/// A text identifying a LoRA set for cache keys and fingerprints: each active LoRA's name, the
/// first 16 hex digits of its lora_sha256, its te and diffusion weights ("name@hash:te:unet"), and
/// the apply mode; "" when no LoRA is active.
std::string lora_set_key(const std::vector<LoraRequest>& requests, ApplyMode mode);
/// The text-encoder part of it (only LoRAs with a non-zero te weight; "" when none): what the
/// conditioning depends on (the mode too: merged and run-time results differ in rounding).
std::string te_lora_key(const std::vector<LoraRequest>& requests, ApplyMode mode);

}  // namespace easel::lora
