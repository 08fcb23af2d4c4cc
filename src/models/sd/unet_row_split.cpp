// Row-split rules of the SD UNet (see unet_row_split.h).
#include "models/sd/unet_row_split.h"

#include "models/sd/unet_config.h"

#include <fmt/format.h>

#include <map>
#include <numeric>
#include <unordered_map>

namespace easel::models::sd {

using placement::make_row_split_rules;
using placement::RowRole;

std::shared_ptr<placement::RowSplitRules> unet_row_split_rules(const UNetConfig& cfg, const nn::Block& root,
                                                               const std::vector<const nn::Block*>& blocks) {
    // head size per attention width (every TransformerSpec of the config)
    std::map<int64_t, int64_t> head_of;
    auto add = [&](const std::vector<TransformerSpec>& ts) {
        for (auto& t : ts) {
            auto [it, fresh] = head_of.emplace(t.inner, t.head_dim);
            if (!fresh && it->second != t.head_dim) it->second = std::lcm(it->second, t.head_dim);
        }
    };
    for (auto& d : cfg.down) add(d.attentions);
    add(cfg.mid.attentions);
    for (auto& u : cfg.up) add(u.attentions);
    // granule 1 first; the attention projections then get the head size of their width
    std::vector<placement::RowSplitPattern> pats;
    for (const char* a : {"attn1", "attn2"}) {
        for (const char* l : {"to_q", "to_k", "to_v"}) pats.push_back({fmt::format("{}.{}", a, l), RowRole::Column, 1});
        pats.push_back({fmt::format("{}.to_out.0", a), RowRole::Row, 1});
    }
    pats.push_back({"ff.net.0.proj", RowRole::Column, 1, 2});  // GEGLU [value | gate]
    pats.push_back({"ff.net.2", RowRole::Row, 1});
    auto r = make_row_split_rules("SD UNet", root, blocks, pats);
    if (!r->why_not.empty()) return r;
    std::unordered_map<const nn::Param*, std::string> full;
    root.visit_params("", [&](const std::string& n, const nn::Param& p) { full[&p] = n; });
    for (const nn::Block* b : blocks)
        b->visit_params("", [&](const std::string& rel, const nn::Param& p) {
            auto it = r->by_param.find(full.at(&p));
            if (it == r->by_param.end() || it->second.role == RowRole::Mirror) return;
            if (rel.find("attn1.") == std::string::npos && rel.find("attn2.") == std::string::npos) return;
            const int64_t width = it->second.role == RowRole::Row ? p.shape.at(1) : p.shape.at(0);
            auto h = head_of.find(width);
            if (h == head_of.end() || h->second <= 0 || width % h->second != 0) {
                r->why_not = fmt::format("no head size known for the attention width {} of {}", width, full.at(&p));
                return;
            }
            it->second.granule = h->second;
            const int64_t units = width / h->second / it->second.segments;  // whole heads now
            if (units < r->max_devices) {
                r->max_devices = units;
                r->max_devices_param = full.at(&p);
            }
        });
    return r;
}

}  // namespace easel::models::sd
