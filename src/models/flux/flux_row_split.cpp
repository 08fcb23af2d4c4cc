// Row-split rules of the FLUX DiTs (see flux_row_split.h).
#include "models/flux/flux_row_split.h"

#include "models/flux/flux2_dit.h"
#include "models/flux/flux_dit.h"

namespace easel::models::flux {

using placement::RowRole;
using placement::RowSplitPattern;


std::shared_ptr<placement::RowSplitRules> flux1_row_split_rules(const FluxDiT& net) {
    const FluxDiTConfig& cfg = net.config();
    const int64_t hd = cfg.head_dim;
    std::vector<const nn::Block*> blocks;
    // single blocks: with M a multiple of D their MLP runs as D-wide chunks (FluxSingleBlock);
    // otherwise they are left out (mirrored)
    const bool single = cfg.n_single > 0 && cfg.mlp_hidden % cfg.hidden == 0;
    for (int i = 0; i < (single ? net.n_blocks() : cfg.n_double); ++i) blocks.push_back(&net.block_params(i));
    std::vector<RowSplitPattern> pats = {
        {"attn.to_q", RowRole::Column, hd},          {"attn.to_k", RowRole::Column, hd},      {"attn.to_v", RowRole::Column, hd},
        {"attn.add_q_proj", RowRole::Column, hd},    {"attn.add_k_proj", RowRole::Column, hd}, {"attn.add_v_proj", RowRole::Column, hd},
        {"attn.to_out.0", RowRole::Row, hd},         {"attn.to_add_out", RowRole::Row, hd},    {"ff.net.0.proj", RowRole::Column, 1},
        {"ff_context.net.0.proj", RowRole::Column, 1}, {"ff.net.2", RowRole::Row, 1},          {"ff_context.net.2", RowRole::Row, 1},
    };
    if (single) {
        // proj_mlp read chunk by chunk (views of one D-wide part: repeat), each chunk split as
        // the heads are; proj_out's input [attention | chunks] in 1 + M/D parts
        const int k = (int)(cfg.mlp_hidden / cfg.hidden);
        pats.push_back({"proj_mlp", RowRole::Column, hd, k, true});
        pats.push_back({"proj_out", RowRole::Row, hd, 1 + k});
    }
    return placement::make_row_split_rules("FLUX.1 DiT", net, blocks, pats);
}

std::shared_ptr<placement::RowSplitRules> flux2_row_split_rules(const Flux2DiT& net) {
    const Flux2DiTConfig& cfg = net.config();
    const int64_t hd = cfg.head_dim;
    std::vector<const nn::Block*> blocks;
    const bool single = cfg.n_single > 0 && cfg.mlp_hidden % cfg.hidden == 0;
    for (int i = 0; i < (single ? net.n_blocks() : cfg.n_double); ++i) blocks.push_back(&net.block_params(i));
    std::vector<RowSplitPattern> pats = {{"attn.to_q", RowRole::Column, hd},
                                            {"attn.to_k", RowRole::Column, hd},
                                            {"attn.to_v", RowRole::Column, hd},
                                            {"attn.add_q_proj", RowRole::Column, hd},
                                            {"attn.add_k_proj", RowRole::Column, hd},
                                            {"attn.add_v_proj", RowRole::Column, hd},
                                            {"attn.to_out.0", RowRole::Row, hd},
                                            {"attn.to_add_out", RowRole::Row, hd},
                                            {"ff.linear_in", RowRole::Column, 1, 2},
                                            {"ff_context.linear_in", RowRole::Column, 1, 2},
                                            {"ff.linear_out", RowRole::Row, 1},
                                            {"ff_context.linear_out", RowRole::Row, 1}};
    if (single) {
        // to_qkv_mlp_proj read as D-wide parts [q | k | v | gate chunks | value chunks] (views of
        // one part: repeat), each split as the heads are; to_out's input [attention | mlp chunks]
        const int k = (int)(cfg.mlp_hidden / cfg.hidden);
        pats.push_back({"attn.to_qkv_mlp_proj", RowRole::Column, hd, 3 + 2 * k, true});
        pats.push_back({"attn.to_out", RowRole::Row, hd, 1 + k});
    }
    return placement::make_row_split_rules("FLUX.2 DiT", net, blocks, pats);
}

}  // namespace easel::models::flux
