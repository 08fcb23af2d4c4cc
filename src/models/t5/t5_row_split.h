// --split-mode row rules (placement/row_split.h) of the T5 encoder (FLUX.1's text_encoder_2):
// which Linear of an encoder block is split along its output features (Column), which along its
// input features (Row: partial sums, all-reduced on ggml's meta device), which is mirrored.
//
// Megatron-style on whole heads (granule d_kv):
//   layer.0.SelfAttention.q / k / v Column, .o Row; the relative position bias table
//   relative_attention_bias [buckets, heads] (block 0; every block for UMT5) split along its
//   heads (ggml axis 0, the Row role), so that block 0's position bias [Lk, Lq, heads] is made
//   on each device for the device's own heads: get_rows of the split table, reshape and permute
//   put the split on ggml axis 2, where the scores q k^T of the same heads are (ggml's meta
//   device adds two tensors split alike; a mirrored bias over split scores would abort in its
//   handle_generic). The bias then passes to the later blocks in the state, still split.
//   layer.1.DenseReluDense.wi_0 / wi_1 (or wi) Column, wo Row. Norms mirrored; the embedding
//   and the final norm run in the prologue / epilogue on the first device.
// T5 computes its attention with its own ops (add the bias, soft_max without mask), which the
// meta device follows with or without --fa. At most `heads` devices (RowSplitRules::max_devices).
#pragma once

#include "placement/row_split.h"

#include <memory>

namespace easel::models::t5 {

class T5Encoder;

/// The rules of `net`'s blocks (see the file comment). why_not is set when a dimension does
/// not divide into whole heads.
std::shared_ptr<placement::RowSplitRules> t5_row_split_rules(const T5Encoder& net);

}  // namespace easel::models::t5
