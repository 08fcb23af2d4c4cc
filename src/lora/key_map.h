// Which model weight a LoRA module name patches, for every naming scheme trainers use.
//
// A KeyMap is built from the loaded model itself (ComfyUI's approach): each component (the
// diffusion model, each text encoder) adds its Block tree, whose parameter names are easel's
// canonical names (diffusers / transformers naming, docs/formats.md), and the other file layouts
// of that module as nn::TensorSources (BFL/ComfyUI names of the FLUX DiTs, LDM names of the SD
// UNet, OpenCLIP names, the original Z-Image names, llama.cpp GGUF names). Every canonical weight
// then answers under each of its stored names, dotted and with '.' -> '_' (kohya), and a fused
// stored tensor (BFL img_attn.qkv, linear1, Z-Image attention.qkv, OpenCLIP in_proj) answers
// with the row ranges of the canonical weights it holds, so a LoRA trained on the fused layer
// is split over them and one trained on to_q/to_k/to_v patches their rows.
//
// LoRA-side prefixes understood (stripped before the lookup; the text-encoder ones pick the
// component by its te_index):
//   kohya / LyCORIS  lora_unet_, lora_transformer_ (OneTrainer), lycoris_ (SimpleTuner),
//                    lora_te_ / lora_te1_ (te 0), lora_te2_ (te 1), lora_te3_ (te 2)
//   diffusers/PEFT   base_model.model., unet., transformer., text_encoder. (te 0),
//                    text_encoder_2. (te 1), text_encoder_3. (te 2)
//   ComfyUI / BFL    diffusion_model., model.diffusion_model.
//   none             the diffusion model first, then the text encoders
// and the module-name forms of older trainers: diffusers attention processors
// (attn1.processor.to_q_lora -> attn1.to_q, to_out_lora -> to_out.0) and xlabs
// (double_blocks.N.processor.qkv_lora1 -> img_attn.qkv, qkv_lora2 -> txt_attn.qkv, proj_lora1/2
// -> img_attn.proj / txt_attn.proj).
#pragma once

#include "lora/math.h"
#include "nn/block.h"

#include <string>
#include <unordered_map>
#include <vector>

namespace easel::lora {

/// A weight a LoRA can patch: one parameter of a loaded module, by canonical name.
struct Target {
    std::string name;                 ///< canonical weight name, e.g. "transformer_blocks.0.attn.to_q.weight"
    std::vector<int64_t> shape;       ///< PyTorch order
    std::string bias;                 ///< canonical name of the layer's bias; "" when it has none
    int64_t row_elems() const;        ///< product of shape[1:] (1 for a 1-D weight)
};

/// One loaded module whose weights LoRAs patch.
struct Component {
    std::string module;  ///< the Family module holding it: "diffusion" or "te"
    std::string name;    ///< "unet", "dit", "clip_l", "clip_g", "t5xxl", "qwen3"
    int te_index = -1;   ///< text encoders: 0 for kohya lora_te_/lora_te1_ and diffusers text_encoder., 1 for *_te2_ / text_encoder_2., ...
    std::vector<Target> targets;
};

/// Rows of a patch's update that go into one target.
struct Destination {
    int target = -1;  ///< index into Component::targets
    RowSlice rows;    ///< update rows [src_begin, src_end) -> target rows from dst_begin
};

/// Where a LoRA module name points: a component and the targets (more than one for a fused
/// stored layer) with their rows; component -1 when nothing matches.
struct Match {
    int component = -1;
    std::vector<Destination> dest;
};

/// LoRA module name -> model weights (see the header comment).
class KeyMap {
public:
    /// Adds a component whose targets are the parameters of `root` named "*.weight" (any
    /// rank: a full-difference patch may target a norm). Returns its index.
    int add_component(const std::string& module, const std::string& name, int te_index, const nn::Block& root);
    /// Every target of `component` also answers under its stored name in `layout` (without
    /// the layout's prefix); targets bound to row slices of one stored tensor are grouped
    /// under that tensor's name. Transposed bindings are skipped.
    void add_layout(int component, const nn::TensorSource& layout);
    /// A prefix the component's own file layout puts before the canonical names, which LoRA
    /// names may carry ("text_model." of CLIPTextModel, "model." of Qwen3ForCausalLM).
    void add_name_prefix(int component, const std::string& prefix);
    /// The destinations of a dotted alias ("" list when absent).
    std::vector<Destination> alias(int component, const std::string& name) const;
    /// Replaces (or adds) a dotted alias and its kohya form, e.g. to swap row halves where a
    /// layout stores them in the other order (FLUX norm_out / final_layer.adaLN_modulation.1).
    void set_alias(int component, const std::string& name, std::vector<Destination> dest);

    /// The weights a LoRA module name patches.
    Match find(const std::string& lora_module) const;

    const std::vector<Component>& components() const { return comps_; }
    /// Aliases that two different layouts gave different meanings (kept out of the map); for tests.
    const std::vector<std::string>& ambiguous() const { return ambiguous_; }

private:
    struct Names {
        std::unordered_map<std::string, std::vector<Destination>> dotted, kohya;
        std::vector<std::string> prefixes;
    };
    void add_alias(int component, const std::string& name, const Destination& d);
    const std::vector<Destination>* lookup(int component, const std::string& body, bool underscored) const;

    std::vector<Component> comps_;
    std::vector<Names> names_;
    std::vector<std::string> ambiguous_;
};

}  // namespace easel::lora
