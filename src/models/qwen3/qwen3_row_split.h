// --split-mode row rules (placement/row_split.h) of the Qwen3 text encoder (Z-Image's and
// FLUX.2 Klein's te): which Linear of a decoder layer is split along its output features
// (Column), which along its input features (Row: partial sums, all-reduced on ggml's meta
// device), which is mirrored.
//
// Megatron-style, as the DiTs' rules, with grouped-query attention (heads = r x kv_heads):
//   * kv_heads > 1: self_attn.k_proj / v_proj Column on whole kv heads (granule head_dim),
//     q_proj Column on whole GROUPS of r query heads (granule r x head_dim) and o_proj Row on
//     the same groups, so that each device holds query heads g*r .. g*r+r-1 with their kv head
//     g: ggml's flash attention then pairs them by its own broadcast (local q heads / local kv
//     heads = r). At most kv_heads devices (RowSplitRules::max_devices).
//   * kv_heads == 1 (the tiny fixtures; Qwen3-0.6B has 8): k_proj / v_proj mirrored (every
//     device computes the one kv head), q_proj Column and o_proj Row on whole query heads: every
//     local query head broadcasts over the one kv head, which is right only because there is
//     one (with kv_heads > 1 a mirrored K/V would pair device 1's first query head with kv head
//     0). At most `heads` devices.
//   * mlp.gate_proj / up_proj Column, mlp.down_proj Row; RMSNorms (input, post-attention, the
//     per-head q_norm / k_norm) mirrored; the embedding and the final norm run in the prologue /
//     epilogue on the first device.
// Only the flash-attention path works on the meta device (third_party/ggml/ggml/src/
// ggml-backend-meta.cpp): flash_attn_ext takes query heads split on ggml axis 2 with K/V split
// the same way or mirrored, and a mirrored mask; the plain path needs a GQA matmul of unequal
// head counts (split_states_equal asserts) and a soft_max of split scores with a mirrored mask
// (handle_generic asserts). So without flash attention (--fa) the rules say why_not and the
// planner falls back to layer split with a warning. A backend that cannot run flash attention
// for the head size (nn::attention then takes the plain path) is not detected here.
#pragma once

#include "placement/row_split.h"

#include <memory>

namespace easel::models::qwen3 {

class Qwen3Model;

/// The rules of `net`'s decoder layers (see the file comment). `flash_attn`: whether the module
/// runs its attention as ggml_flash_attn_ext (FamilyOptions::flash_attn_te); false sets why_not.
/// why_not is also set when a dimension does not divide into whole heads.
std::shared_ptr<placement::RowSplitRules> qwen3_row_split_rules(const Qwen3Model& net, bool flash_attn);

}  // namespace easel::models::qwen3
