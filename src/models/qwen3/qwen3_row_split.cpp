// Row-split rules of the Qwen3 text encoder (see qwen3_row_split.h).
#include "models/qwen3/qwen3_row_split.h"

#include "models/qwen3/qwen3.h"

namespace easel::models::qwen3 {

using placement::RowRole;
using placement::RowSplitPattern;

std::shared_ptr<placement::RowSplitRules> qwen3_row_split_rules(const Qwen3Model& net, bool flash_attn) {
    const Qwen3Config& cfg = net.config();
    const int64_t D = cfg.head_dim, group = cfg.heads / cfg.kv_heads;  // query heads per kv head
    std::vector<const nn::Block*> blocks;
    for (int i = 0; i < net.n_blocks(); ++i) blocks.push_back(&net.block_params(i));
    std::vector<RowSplitPattern> pats;
    if (cfg.kv_heads == 1) {
        // one kv head: K/V mirrored, query heads split one by one
        pats = {{"self_attn.q_proj", RowRole::Column, D}, {"self_attn.o_proj", RowRole::Row, D}};
    } else {
        // kv heads split; each device's query heads are the groups of its kv heads
        pats = {{"self_attn.q_proj", RowRole::Column, group * D},
                {"self_attn.k_proj", RowRole::Column, D},
                {"self_attn.v_proj", RowRole::Column, D},
                {"self_attn.o_proj", RowRole::Row, group * D}};
    }
    pats.push_back({"mlp.gate_proj", RowRole::Column, 1});
    pats.push_back({"mlp.up_proj", RowRole::Column, 1});
    pats.push_back({"mlp.down_proj", RowRole::Row, 1});
    auto r = placement::make_row_split_rules("Qwen3 text encoder", net, blocks, pats);
    if (r->why_not.empty() && !flash_attn)
        r->why_not = "its masked attention runs on ggml's meta device only as flash attention (add --fa)";
    return r;
}

}  // namespace easel::models::qwen3
