// Row-split rules of the T5 encoder (see t5_row_split.h).
#include "models/t5/t5_row_split.h"

#include "models/t5/t5_encoder.h"

namespace easel::models::t5 {

using placement::RowRole;
using placement::RowSplitPattern;

std::shared_ptr<placement::RowSplitRules> t5_row_split_rules(const T5Encoder& net) {
    const T5Config& cfg = net.config();
    const int64_t D = cfg.d_kv;
    std::vector<const nn::Block*> blocks;
    for (int i = 0; i < net.n_blocks(); ++i) blocks.push_back(&net.block_params(i));
    const std::vector<RowSplitPattern> pats = {
        {"layer.0.SelfAttention.q", RowRole::Column, D},
        {"layer.0.SelfAttention.k", RowRole::Column, D},
        {"layer.0.SelfAttention.v", RowRole::Column, D},
        {"layer.0.SelfAttention.o", RowRole::Row, D},
        // [buckets, heads]: split along heads (ggml axis 0), one head per unit
        {"layer.0.SelfAttention.relative_attention_bias", RowRole::Row, 1},
        {"layer.1.DenseReluDense.wi_0", RowRole::Column, 1},
        {"layer.1.DenseReluDense.wi_1", RowRole::Column, 1},
        {"layer.1.DenseReluDense.wi", RowRole::Column, 1},
        {"layer.1.DenseReluDense.wo", RowRole::Row, 1},
    };
    return placement::make_row_split_rules("T5 encoder", net, blocks, pats);
}

}  // namespace easel::models::t5
