// LoRA module names -> model weights (see key_map.h). Prefix conventions from the trainers and
// loaders: kohya sd-scripts (lora_unet_/lora_te{1,2}_), OneTrainer (lora_transformer_),
// SimpleTuner (lycoris_), PEFT (base_model.model.), diffusers (unet./transformer./text_encoder.),
// ComfyUI (diffusion_model.), xlabs (processor.qkv_lora1/2, proj_lora1/2).
#include "lora/key_map.h"

#include "core/error.h"

#include <algorithm>
#include <map>
#include <regex>

namespace easel::lora {

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

std::string underscored(std::string s) {
    std::replace(s.begin(), s.end(), '.', '_');
    return s;
}

bool same(const std::vector<Destination>& a, const std::vector<Destination>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].target != b[i].target || a[i].rows.src_begin != b[i].rows.src_begin || a[i].rows.src_end != b[i].rows.src_end ||
            a[i].rows.dst_begin != b[i].rows.dst_begin)
            return false;
    return true;
}

void sort_dest(std::vector<Destination>& d) {
    std::sort(d.begin(), d.end(), [](const Destination& x, const Destination& y) { return x.rows.src_begin < y.rows.src_begin; });
}

// Old module-name forms -> the current ones (names as stored, before any prefix is stripped).
std::string normalise_module(std::string n) {
    // xlabs: double_blocks.N.processor.{qkv,proj}_lora{1,2} (1 = image stream, 2 = text stream)
    static const std::regex xlabs(R"(^(.*double_blocks\.\d+)\.processor\.(qkv|proj)_lora([12])$)");
    std::smatch m;
    if (std::regex_match(n, m, xlabs)) return m[1].str() + (m[3].str() == "1" ? ".img_attn." : ".txt_attn.") + m[2].str();
    // diffusers attention processors: <attn>.processor.to_q_lora -> <attn>.to_q, to_out_lora -> to_out.0
    if (const size_t p = n.find(".processor."); p != std::string::npos) n = n.substr(0, p) + n.substr(p + 10);
    if (ends_with(n, "_lora")) {
        n = n.substr(0, n.size() - 5);
        if (ends_with(n, ".to_out")) n += ".0";
    }
    return n;
}

struct Prefix {
    const char* text;
    bool kohya;  // the rest is underscored
    int te;      // -2: diffusion model, -1: none (any), >= 0: text encoder index
};

// Longest first where one is a prefix of another.
const Prefix kPrefixes[] = {
    {"lora_unet_", true, -2},        {"lora_transformer_", true, -2}, {"lycoris_", true, -2},  {"lora_te1_", true, 0},
    {"lora_te2_", true, 1},          {"lora_te3_", true, 2},          {"lora_te_", true, 0},   {"model.diffusion_model.", false, -2},
    {"diffusion_model.", false, -2}, {"unet.", false, -2},            {"transformer.", false, -2},
    {"text_encoder_2.", false, 1},   {"text_encoder_3.", false, 2},   {"text_encoder.", false, 0},
};

}  // namespace

int64_t Target::row_elems() const {
    int64_t n = 1;
    for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
    return n;
}

int KeyMap::add_component(const std::string& module, const std::string& name, int te_index, const nn::Block& root) {
    Component c;
    c.module = module;
    c.name = name;
    c.te_index = te_index;
    std::map<std::string, std::vector<int64_t>> all;
    root.visit_params("", [&](const std::string& full, const nn::Param& p) { all[full] = p.shape; });
    root.visit_params("", [&](const std::string& full, const nn::Param& p) {
        if (!ends_with(full, ".weight") || p.shape.empty()) return;
        Target t;
        t.name = full;
        t.shape = p.shape;
        const std::string b = full.substr(0, full.size() - 7) + ".bias";
        if (all.count(b)) t.bias = b;
        c.targets.push_back(std::move(t));
    });
    comps_.push_back(std::move(c));
    names_.emplace_back();
    const int ci = (int)comps_.size() - 1;
    const auto& ts = comps_.back().targets;
    for (int i = 0; i < (int)ts.size(); ++i)
        add_alias(ci, ts[(size_t)i].name.substr(0, ts[(size_t)i].name.size() - 7), {i, {0, ts[(size_t)i].shape[0], 0}});
    return ci;
}

void KeyMap::add_alias(int ci, const std::string& name, const Destination& d) {
    auto& dv = names_[(size_t)ci].dotted[name];
    for (auto& e : dv)
        if (e.target == d.target && e.rows.src_begin == d.rows.src_begin && e.rows.src_end == d.rows.src_end) return;
    dv.push_back(d);
    sort_dest(dv);
    names_[(size_t)ci].kohya[underscored(name)] = dv;
}

void KeyMap::add_layout(int ci, const nn::TensorSource& layout) {
    if (ci < 0 || ci >= (int)comps_.size()) fail(ErrorKind::Internal, "KeyMap: no component {}", ci);
    const auto& ts = comps_[(size_t)ci].targets;
    const std::string& pre = layout.prefix();
    std::map<std::string, std::vector<Destination>> batch;
    for (int i = 0; i < (int)ts.size(); ++i) {
        const Target& t = ts[(size_t)i];
        std::string stored = layout.stored_name(t.name);
        if (!starts_with(stored, pre) || !ends_with(stored, ".weight")) continue;
        stored = stored.substr(pre.size(), stored.size() - pre.size() - 7);
        const nn::TensorSource::Derived* d = layout.derived(t.name);
        if (d && d->transpose) continue;
        Destination dest{i, {0, t.shape[0], 0}};
        if (d) {
            const int64_t end = d->row_end < 0 ? d->row_begin + t.shape[0] : d->row_end;
            dest.rows = {d->row_begin, end, 0};
        }
        batch[stored].push_back(dest);
    }
    auto& nm = names_[(size_t)ci];
    for (auto& [name, dv] : batch) {
        sort_dest(dv);
        auto it = nm.dotted.find(name);
        if (it != nm.dotted.end()) {
            if (!same(it->second, dv)) {
                ambiguous_.push_back(comps_[(size_t)ci].name + ": " + name);
                nm.dotted.erase(it);
                nm.kohya.erase(underscored(name));
            }
            continue;
        }
        nm.dotted[name] = dv;
        const std::string k = underscored(name);
        auto kt = nm.kohya.find(k);
        if (kt != nm.kohya.end() && !same(kt->second, dv)) {
            ambiguous_.push_back(comps_[(size_t)ci].name + ": " + k);
            nm.kohya.erase(kt);
            continue;
        }
        nm.kohya[k] = dv;
    }
}

void KeyMap::add_name_prefix(int ci, const std::string& prefix) { names_.at((size_t)ci).prefixes.push_back(prefix); }

std::vector<Destination> KeyMap::alias(int ci, const std::string& name) const {
    const auto& d = names_.at((size_t)ci).dotted;
    auto it = d.find(name);
    return it == d.end() ? std::vector<Destination>{} : it->second;
}

void KeyMap::set_alias(int ci, const std::string& name, std::vector<Destination> dest) {
    sort_dest(dest);
    names_.at((size_t)ci).dotted[name] = dest;
    names_.at((size_t)ci).kohya[underscored(name)] = dest;
}

const std::vector<Destination>* KeyMap::lookup(int ci, const std::string& body, bool kohya) const {
    const Names& nm = names_[(size_t)ci];
    auto try_one = [&](const std::string& b, bool k) -> const std::vector<Destination>* {
        const auto& tab = k ? nm.kohya : nm.dotted;
        auto it = tab.find(b);
        return it == tab.end() ? nullptr : &it->second;
    };
    std::vector<std::string> bodies{body};
    for (const std::string& p : nm.prefixes) {
        const std::string pp = kohya ? underscored(p) : p;
        if (starts_with(body, pp)) bodies.push_back(body.substr(pp.size()));
    }
    for (const std::string& b : bodies) {
        if (auto* r = try_one(b, kohya)) return r;
        if (!kohya)
            if (auto* r = try_one(underscored(b), true)) return r;  // mixed forms ("transformer.double_blocks_0_...")
    }
    return nullptr;
}

Match KeyMap::find(const std::string& lora_module) const {
    std::string n = normalise_module(lora_module);
    if (starts_with(n, "base_model.model.")) n = n.substr(17);
    int hint = -1;  // -2 diffusion, >= 0 te index, -1 none
    bool kohya = false;
    for (const Prefix& p : kPrefixes)
        if (starts_with(n, p.text)) {
            n = n.substr(std::char_traits<char>::length(p.text));
            kohya = p.kohya;
            hint = p.te;
            break;
        }
    std::vector<int> order;
    auto fits = [&](const Component& c) {
        return hint == -1 || (hint == -2 && c.module != "te") || (hint >= 0 && c.module == "te" && c.te_index == hint);
    };
    for (int i = 0; i < (int)comps_.size(); ++i)
        if (fits(comps_[(size_t)i])) order.push_back(i);
    if (hint == -1)  // no prefix: the diffusion model first
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return comps_[(size_t)a].module != "te" && comps_[(size_t)b].module == "te"; });
    for (int i = 0; i < (int)comps_.size(); ++i)
        if (std::find(order.begin(), order.end(), i) == order.end()) order.push_back(i);
    for (int ci : order)
        if (const auto* d = lookup(ci, n, kohya)) return Match{ci, *d};
    return {};
}

}  // namespace easel::lora
