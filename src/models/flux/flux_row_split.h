// --split-mode row rules (placement/row_split.h) of the FLUX.1 and FLUX.2 DiTs: which Linear of
// a block is split along its output features (Column), which along its input features (Row:
// partial sums, all-reduced on ggml's meta device) and which is mirrored.
//
// Megatron-style, as the Z-Image DiT's rules:
//   double-stream blocks (both): attn.to_q/to_k/to_v and attn.add_{q,k,v}_proj Column on whole
//     heads; attn.to_out.0 and attn.to_add_out Row on whole heads; the first MLP Linear Column
//     (FLUX.1 ff.net.0.proj / ff_context.net.0.proj; FLUX.2 ff.linear_in / ff_context.linear_in,
//     SwiGLU [gate | value]: 2 segments split one by one so that each device holds matching
//     gate and value rows), the second Row (ff.net.2 / ff.linear_out ...);
//   single-stream blocks (M a multiple of D, as in every released model; else they are mirrored):
//     their fused layers are read in D-wide parts so that each device holds matching slices:
//     FLUX.1 attn.to_q/to_k/to_v Column on whole heads, proj_mlp Column in M/D parts (one part
//     repeated: the block reads each part through a view of the weight, linear_rows), proj_out
//     Row in 1 + M/D parts (its input [attention | mlp] is built by join_rows as D-wide rows);
//     FLUX.2 attn.to_qkv_mlp_proj Column in 3 + 2M/D parts [q | k | v | gate chunks | value
//     chunks] (repeated, read by views), attn.to_out Row in 1 + M/D parts. Every part is split
//     like the heads (granule head_dim), so a device's attention heads and MLP chunks line up
//     with its slice of the out projection.
//   Everything else (adaLN modulation, norms, embedders, final layer) is mirrored or runs in the
//   prologue / epilogue on the first device.
#pragma once

#include "placement/row_split.h"

#include <memory>

namespace easel::models::flux {

class FluxDiT;
class Flux2DiT;

/// The rules of a FLUX.1 DiT (see the file comment). why_not is set when a dimension does not
/// divide into whole heads / segments.
std::shared_ptr<placement::RowSplitRules> flux1_row_split_rules(const FluxDiT& net);

/// The rules of a FLUX.2 DiT (see the file comment).
std::shared_ptr<placement::RowSplitRules> flux2_row_split_rules(const Flux2DiT& net);

}  // namespace easel::models::flux
