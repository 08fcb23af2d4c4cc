// --split-mode row rules (placement/row_split.h) of the SD UNet.
#pragma once

#include "nn/block.h"
#include "placement/row_split.h"

#include <memory>
#include <vector>

namespace easel::models::sd {

struct UNetConfig;

/// The rules of an SD UNet (UNet2DCondition blocks): in every BasicTransformerBlock attn1/attn2
/// to_q/to_k/to_v column on whole heads (head size from the config), to_out.0 row,
/// ff.net.0.proj (GEGLU [value | gate], 2 segments) column, ff.net.2 row; resnets, convs, group
/// norms, proj_in/proj_out mirrored.
std::shared_ptr<placement::RowSplitRules> unet_row_split_rules(const UNetConfig& cfg, const nn::Block& root,
                                                               const std::vector<const nn::Block*>& blocks);

}  // namespace easel::models::sd
