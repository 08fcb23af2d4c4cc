// Row-split rules of the Z-Image DiT (see z_image_row_split.h).
#include "models/zimage/z_image_row_split.h"

#include "models/zimage/z_image_dit.h"

#include <fmt/format.h>

namespace easel::models::zimage {

using placement::make_row_split_rules;
using placement::RowRole;

std::shared_ptr<placement::RowSplitRules> zimage_row_split_rules(const ZImageDiT& net) {
    const auto& cfg = net.config();
    std::vector<const nn::Block*> blocks;
    for (int i = 0; i < net.n_blocks(); ++i) blocks.push_back(&net.block_params(i));
    const int64_t hd = cfg.head_dim;
    auto r = make_row_split_rules("Z-Image DiT", net, blocks,
                                  {{"attention.to_q", RowRole::Column, hd},
                                   {"attention.to_k", RowRole::Column, hd},
                                   {"attention.to_v", RowRole::Column, hd},
                                   {"attention.to_out.0", RowRole::Row, hd},
                                   {"feed_forward.w1", RowRole::Column, 1},
                                   {"feed_forward.w3", RowRole::Column, 1},
                                   {"feed_forward.w2", RowRole::Row, 1}});
    if (cfg.n_kv_heads != cfg.n_heads)
        r->why_not = fmt::format("{} query heads share {} key/value heads (ggml's meta device splits equal head counts only)", cfg.n_heads,
                                 cfg.n_kv_heads);
    return r;
}

}  // namespace easel::models::zimage
