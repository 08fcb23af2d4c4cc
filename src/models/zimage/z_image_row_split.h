// --split-mode row rules (placement/row_split.h) of the Z-Image DiT.
#pragma once

#include "placement/row_split.h"

#include <memory>

namespace easel::models::zimage {

class ZImageDiT;

/// The rules of the Z-Image DiT's main layers: attention.to_q/k/v column on whole heads,
/// attention.to_out.0 row, feed_forward.w1/w3 column, feed_forward.w2 row (SwiGLU); refiners,
/// embedders, adaLN and the final layer are in the prologue/epilogue or mirrored. Refused
/// (why_not) with n_kv_heads != n_heads (GQA: see placement/row_split.h).
std::shared_ptr<placement::RowSplitRules> zimage_row_split_rules(const ZImageDiT& net);

}  // namespace easel::models::zimage
