// LoRA file keys -> patches (see lora_file.h). Suffixes and shape rules follow the trainers'
// own layouts: kohya sd-scripts networks/lora.py, PEFT tuners/lora, diffusers loaders,
// LyCORIS modules/{locon,loha,lokr}.py, XLabs-AI x-flux; the load paths of ComfyUI
// (comfy/weight_adapter) and A1111 (extensions-builtin/Lora) for what is accepted.
#include "lora/lora_file.h"

#include "core/error.h"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <unordered_map>

namespace easel::lora {

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

enum class Role { Up, Down, Mid, Bias, Alpha, Dora, W1a, W1b, W2a, W2b, T1, T2, K1, K1a, K1b, K2, K2a, K2b, Kt2, Diff, DiffB };

struct Suffix {
    const char* text;
    Role role;
};

// Longest first where one suffix ends another (".lora_linear_layer.up.weight" before ".up.weight").
const Suffix kSuffixes[] = {
    {".lora_linear_layer.up.weight", Role::Up},
    {".lora_linear_layer.down.weight", Role::Down},
    {".lora_up.weight", Role::Up},
    {".lora_down.weight", Role::Down},
    {".lora_mid.weight", Role::Mid},
    {".lora_B.weight", Role::Up},
    {".lora_A.weight", Role::Down},
    {".lora_B.bias", Role::Bias},
    {".lora.up.weight", Role::Up},
    {".lora.down.weight", Role::Down},
    {".lora_magnitude_vector.weight", Role::Dora},
    {".lora_magnitude_vector", Role::Dora},
    {".dora_scale", Role::Dora},
    {".alpha", Role::Alpha},
    {".hada_w1_a", Role::W1a},
    {".hada_w1_b", Role::W1b},
    {".hada_w2_a", Role::W2a},
    {".hada_w2_b", Role::W2b},
    {".hada_t1", Role::T1},
    {".hada_t2", Role::T2},
    {".lokr_w1", Role::K1},
    {".lokr_w1_a", Role::K1a},
    {".lokr_w1_b", Role::K1b},
    {".lokr_w2", Role::K2},
    {".lokr_w2_a", Role::K2a},
    {".lokr_w2_b", Role::K2b},
    {".lokr_t2", Role::Kt2},
    {".diff_b", Role::DiffB},
    {".diff", Role::Diff},
};

// xlabs (double_blocks.N.processor.qkv_lora1.up.weight) and diffusers' attention processors
// (...attn1.processor.to_q_lora.up.weight) end in a plain .up/.down after a "*_lora[12]" module.
bool xlabs_like_module(const std::string& m) {
    return ends_with(m, "_lora") || ends_with(m, "_lora1") || ends_with(m, "_lora2");
}

bool is_embedding_key(const std::string& n) {
    return starts_with(n, "<") || n == "emb_params" || starts_with(n, "string_to_param.") || starts_with(n, "bundle_emb.") ||
           n == "clip_l" || n == "clip_g";
}

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

struct Group {
    std::map<Role, const io::TensorInfo*> t;
    size_t first = 0;  // index of the first key, for file order
};

}  // namespace

const char* patch_kind_name(PatchKind k) {
    switch (k) {
        case PatchKind::LoRA: return "LoRA";
        case PatchKind::LoHa: return "LoHa";
        case PatchKind::LoKr: return "LoKr";
        case PatchKind::Diff: return "full diff";
    }
    return "?";
}

int64_t Patch::out_rows() const { return delta_shape.empty() ? 0 : delta_shape[0]; }

int64_t Patch::row_elems() const {
    if (delta_shape.empty()) return 0;
    int64_t n = 1;
    for (size_t i = 1; i < delta_shape.size(); ++i) n *= delta_shape[i];
    return n;
}

int64_t Tensor::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

ParsedLora parse_keys(const std::vector<io::TensorInfo>& tensors, const std::string& what) {
    ParsedLora out;
    for (auto& t : tensors)
        if (t.name.find(':') != std::string::npos && (ends_with(t.name, ":up") || ends_with(t.name, ":down")))
            fail(ErrorKind::Unsupported,
                 "{} is a cloneofsimo/lora file (keys like '{}' number the patched layers and name none): an early format that "
                 "easel, sd.cpp, A1111 and ComfyUI do not load; use a LoRA saved in the kohya or diffusers (PEFT) format",
                 what, t.name);

    std::unordered_map<std::string, Group> groups;
    std::vector<std::string> order;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const io::TensorInfo& t = tensors[i];
        const Suffix* hit = nullptr;
        for (const Suffix& s : kSuffixes)
            if (ends_with(t.name, s.text)) {
                hit = &s;
                break;
            }
        std::string module;
        Role role{};
        if (hit) {
            module = t.name.substr(0, t.name.size() - std::char_traits<char>::length(hit->text));
            role = hit->role;
        } else if (ends_with(t.name, ".up.weight") && xlabs_like_module(t.name.substr(0, t.name.size() - 10))) {
            module = t.name.substr(0, t.name.size() - 10);
            role = Role::Up;
        } else if (ends_with(t.name, ".down.weight") && xlabs_like_module(t.name.substr(0, t.name.size() - 12))) {
            module = t.name.substr(0, t.name.size() - 12);
            role = Role::Down;
        } else {
            (is_embedding_key(t.name) ? out.embeddings : out.unknown).push_back(t.name);
            continue;
        }
        if (module.empty()) {
            out.unknown.push_back(t.name);
            continue;
        }
        auto [it, fresh] = groups.try_emplace(module);
        if (fresh) {
            it->second.first = i;
            order.push_back(module);
        }
        it->second.t[role] = &t;
    }

    for (const std::string& module : order) {
        const Group& g = groups.at(module);
        auto get = [&](Role r) -> const io::TensorInfo* {
            auto it = g.t.find(r);
            return it == g.t.end() ? nullptr : it->second;
        };
        auto name = [&](Role r) { return get(r) ? get(r)->name : std::string(); };
        auto bad = [&](const std::string& msg) { fail(ErrorKind::InvalidInput, "{}: LoRA module '{}': {}", what, module, msg); };
        auto need_pair = [&](Role a, Role b, const char* an, const char* bn) {
            if (get(a) && !get(b)) bad(fmt::format("has {} without {}; the file is incomplete", an, bn));
            if (get(b) && !get(a)) bad(fmt::format("has {} without {}; the file is incomplete", bn, an));
        };
        need_pair(Role::Up, Role::Down, "an up (lora_B) weight", "a down (lora_A) weight");
        need_pair(Role::W1a, Role::W1b, "hada_w1_a", "hada_w1_b");
        need_pair(Role::W2a, Role::W2b, "hada_w2_a", "hada_w2_b");
        need_pair(Role::K1a, Role::K1b, "lokr_w1_a", "lokr_w1_b");
        need_pair(Role::K2a, Role::K2b, "lokr_w2_a", "lokr_w2_b");
        const bool lora = get(Role::Up) != nullptr, loha = get(Role::W1a) || get(Role::W2a),
                   lokr = get(Role::K1) || get(Role::K1a) || get(Role::K2) || get(Role::K2a), diff = get(Role::Diff) || get(Role::DiffB);
        const int kinds = (int)lora + (int)loha + (int)lokr + (int)diff;
        if (kinds == 0) {
            if (get(Role::Mid) || get(Role::T1) || get(Role::T2) || get(Role::Kt2) || get(Role::Bias))
                bad("has Tucker/bias tensors but no weights they belong to");
            continue;  // only an alpha / dora_scale: nothing to apply
        }
        if (kinds > 1) bad("mixes tensors of different adapter kinds (LoRA, LoHa, LoKr, full diff)");

        Patch p;
        p.module = module;
        p.alpha = name(Role::Alpha);
        p.dora_scale = name(Role::Dora);
        p.bias = name(Role::Bias);
        auto dims = [&](const io::TensorInfo* t, std::initializer_list<size_t> allowed, const char* what_t) {
            for (size_t d : allowed)
                if (t->shape.size() == d) return;
            bad(fmt::format("{} '{}' has shape {}", what_t, t->name, shape_str(t->shape)));
        };
        auto trailing_ones = [&](const io::TensorInfo* t, const char* what_t) {
            for (size_t i = 2; i < t->shape.size(); ++i)
                if (t->shape[i] != 1) bad(fmt::format("{} '{}' of shape {} is not a 1x1 kernel", what_t, t->name, shape_str(t->shape)));
        };
        if (lora) {
            p.kind = PatchKind::LoRA;
            const io::TensorInfo *up = get(Role::Up), *down = get(Role::Down), *mid = get(Role::Mid);
            p.up = up->name;
            p.down = down->name;
            dims(up, {2, 4}, "up weight");
            dims(down, {2, 4}, "down weight");
            trailing_ones(up, "up weight");
            p.rank = down->shape[0];
            if (mid) {
                p.mid = mid->name;
                dims(mid, {4}, "mid weight");
                trailing_ones(down, "down weight (with a mid)");
                if (mid->shape[0] != up->shape[1] || mid->shape[1] != down->shape[0])
                    bad(fmt::format("ranks disagree: up {}, mid {}, down {}", shape_str(up->shape), shape_str(mid->shape),
                                    shape_str(down->shape)));
                p.delta_shape = {up->shape[0], down->shape[1], mid->shape[2], mid->shape[3]};
            } else {
                if (up->shape[1] != down->shape[0])
                    bad(fmt::format("ranks disagree: up {} and down {}", shape_str(up->shape), shape_str(down->shape)));
                p.delta_shape = {up->shape[0]};
                for (size_t i = 1; i < down->shape.size(); ++i) p.delta_shape.push_back(down->shape[i]);
            }
            if (const io::TensorInfo* b = get(Role::Bias); b && (b->shape.size() != 1 || b->shape[0] != up->shape[0]))
                bad(fmt::format("lora_B bias {} does not match the {} output rows", shape_str(b->shape), up->shape[0]));
        } else if (loha) {
            p.kind = PatchKind::LoHa;
            if (!get(Role::W1a) || !get(Role::W2a)) bad("LoHa needs hada_w1_a/b and hada_w2_a/b");
            const io::TensorInfo *w1a = get(Role::W1a), *w1b = get(Role::W1b), *w2a = get(Role::W2a), *w2b = get(Role::W2b),
                                 *t1 = get(Role::T1), *t2 = get(Role::T2);
            p.hada_w1_a = w1a->name;
            p.hada_w1_b = w1b->name;
            p.hada_w2_a = w2a->name;
            p.hada_w2_b = w2b->name;
            for (auto* t : {w1a, w1b, w2a, w2b}) dims(t, {2}, "LoHa factor");
            if ((t1 == nullptr) != (t2 == nullptr)) bad("LoHa Tucker needs both hada_t1 and hada_t2");
            p.rank = w1b->shape[0];
            if (t1) {
                // LyCORIS Tucker: w_a [r, out], w_b [r, in], t [r, r, k, k] -> [out, in, k, k]
                p.hada_t1 = t1->name;
                p.hada_t2 = t2->name;
                dims(t1, {4}, "hada_t1");
                dims(t2, {4}, "hada_t2");
                if (t1->shape[0] != w1a->shape[0] || t1->shape[1] != w1b->shape[0] || t2->shape[0] != w2a->shape[0] ||
                    t2->shape[1] != w2b->shape[0] || w1a->shape[1] != w2a->shape[1] || w1b->shape[1] != w2b->shape[1] ||
                    t1->shape[2] != t2->shape[2] || t1->shape[3] != t2->shape[3])
                    bad("LoHa Tucker factors have inconsistent shapes");
                p.delta_shape = {w1a->shape[1], w1b->shape[1], t1->shape[2], t1->shape[3]};
            } else {
                if (w1a->shape[1] != w1b->shape[0] || w2a->shape[1] != w2b->shape[0] || w1a->shape[0] != w2a->shape[0] ||
                    w1b->shape[1] != w2b->shape[1])
                    bad(fmt::format("LoHa factors disagree: w1 {} x {}, w2 {} x {}", shape_str(w1a->shape), shape_str(w1b->shape),
                                    shape_str(w2a->shape), shape_str(w2b->shape)));
                p.delta_shape = {w1a->shape[0], w1b->shape[1]};
            }
        } else if (lokr) {
            p.kind = PatchKind::LoKr;
            const io::TensorInfo *k1 = get(Role::K1), *k1a = get(Role::K1a), *k1b = get(Role::K1b), *k2 = get(Role::K2),
                                 *k2a = get(Role::K2a), *k2b = get(Role::K2b), *kt2 = get(Role::Kt2);
            if (!k1 && !k1a) bad("LoKr needs lokr_w1 (or lokr_w1_a and lokr_w1_b)");
            if (!k2 && !k2a) bad("LoKr needs lokr_w2 (or lokr_w2_a and lokr_w2_b)");
            if (k1 && k1a) bad("LoKr has both lokr_w1 and its factors lokr_w1_a/b");
            if (k2 && k2a) bad("LoKr has both lokr_w2 and its factors lokr_w2_a/b");
            int64_t a, b;  // w1 [a, b]
            if (k1) {
                p.lokr_w1 = k1->name;
                dims(k1, {2}, "lokr_w1");
                a = k1->shape[0];
                b = k1->shape[1];
            } else {
                p.lokr_w1_a = k1a->name;
                p.lokr_w1_b = k1b->name;
                dims(k1a, {2}, "lokr_w1_a");
                dims(k1b, {2}, "lokr_w1_b");
                if (k1a->shape[1] != k1b->shape[0]) bad("lokr_w1_a and lokr_w1_b ranks disagree");
                a = k1a->shape[0];
                b = k1b->shape[1];
                p.rank = k1b->shape[0];
            }
            std::vector<int64_t> w2;  // [c, d] or [c, d, k, k]
            if (k2) {
                p.lokr_w2 = k2->name;
                dims(k2, {2, 4}, "lokr_w2");
                w2 = k2->shape;
            } else {
                p.lokr_w2_a = k2a->name;
                p.lokr_w2_b = k2b->name;
                dims(k2a, {2}, "lokr_w2_a");
                dims(k2b, {2}, "lokr_w2_b");
                if (kt2) {
                    // Tucker: t2 [r, r, k, k], w2_a [r, c], w2_b [r, d] -> [c, d, k, k]
                    p.lokr_t2 = kt2->name;
                    dims(kt2, {4}, "lokr_t2");
                    if (kt2->shape[0] != k2a->shape[0] || kt2->shape[1] != k2b->shape[0]) bad("lokr_t2 and lokr_w2_a/b ranks disagree");
                    w2 = {k2a->shape[1], k2b->shape[1], kt2->shape[2], kt2->shape[3]};
                } else {
                    if (k2a->shape[1] != k2b->shape[0]) bad("lokr_w2_a and lokr_w2_b ranks disagree");
                    w2 = {k2a->shape[0], k2b->shape[1]};
                }
                p.rank = k2b->shape[0];  // the w2 factorisation's rank wins (ComfyUI, LyCORIS)
            }
            if (kt2 && !k2a) bad("lokr_t2 without lokr_w2_a/b");
            p.delta_shape = {a * w2[0], b * w2[1]};
            if (w2.size() == 4) {
                p.delta_shape.push_back(w2[2]);
                p.delta_shape.push_back(w2[3]);
            }
        } else {
            p.kind = PatchKind::Diff;
            p.diff = name(Role::Diff);
            p.diff_b = name(Role::DiffB);
            if (const io::TensorInfo* d = get(Role::Diff)) {
                if (d->shape.empty()) bad("diff is a scalar");
                p.delta_shape = d->shape;
            }
            if (const io::TensorInfo* d = get(Role::DiffB)) {
                if (d->shape.size() != 1) bad(fmt::format("diff_b has shape {}", shape_str(d->shape)));
                if (!p.delta_shape.empty() && p.delta_shape[0] != d->shape[0])
                    bad(fmt::format("diff_b {} does not match diff {}", shape_str(d->shape), shape_str(p.delta_shape)));
            }
        }
        if (p.rank < 0) bad("negative rank");
        if (const io::TensorInfo* al = get(Role::Alpha); al && al->numel() != 1)
            bad(fmt::format("alpha has shape {} (one number expected)", shape_str(al->shape)));
        out.patches.push_back(std::move(p));
    }
    return out;
}

// ---------------------------------------------------------------------------------- LoraFile

LoraFile LoraFile::open(const std::filesystem::path& path) {
    LoraFile f = from_index(io::WeightIndex::open(path), path.string());
    f.path_ = path;
    if (path.filename() == "adapter_model.safetensors") {
        // PEFT's save_pretrained: the config (lora_alpha) is the adapter_config.json beside it
        std::ifstream in(path.parent_path() / "adapter_config.json");
        if (in) {
            try {
                const nlohmann::json j = nlohmann::json::parse(in);
                PeftScaling sc;
                sc.lora_alpha = j.value("lora_alpha", 0.0);
                sc.rslora = j.value("use_rslora", false);
                if (auto ap = j.find("alpha_pattern"); ap != j.end() && ap->is_object())
                    for (auto& [k, v] : ap->items())
                        if (v.is_number()) sc.alpha_pattern.emplace_back(k, v.get<double>());
                if (sc.lora_alpha > 0) f.peft_.emplace_back("base_model.model.", sc);
            } catch (const nlohmann::json::exception&) {
                fail(ErrorKind::InvalidInput, "{}: adapter_config.json beside it is not valid JSON", path.string());
            }
        }
    }
    return f;
}

void LoraFile::read_peft_configs() {
    // diffusers' save_lora_weights: __metadata__["lora_adapter_metadata"] = JSON {"<prefix>.lora_alpha": 8, "<prefix>.r": 4, ...}
    const auto& meta = index_.metadata();
    auto it = meta.find("lora_adapter_metadata");
    if (it == meta.end() || it->second.kind != io::MetaValue::Kind::String) return;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(it->second.s);
    } catch (const nlohmann::json::exception&) {
        fail(ErrorKind::InvalidInput, "{}: its lora_adapter_metadata is not valid JSON", what_);
    }
    if (!j.is_object()) return;
    std::map<std::string, PeftScaling> by_prefix;
    for (auto& [k, v] : j.items()) {
        const size_t dot = k.rfind('.');
        if (dot == std::string::npos) continue;
        const std::string prefix = k.substr(0, dot + 1), field = k.substr(dot + 1);
        PeftScaling& sc = by_prefix[prefix];
        if (field == "lora_alpha" && v.is_number()) sc.lora_alpha = v.get<double>();
        else if (field == "use_rslora" && v.is_boolean()) sc.rslora = v.get<bool>();
        else if (field == "alpha_pattern" && v.is_object())
            for (auto& [pk, pv] : v.items())
                if (pv.is_number()) sc.alpha_pattern.emplace_back(pk, pv.get<double>());
    }
    for (auto& [prefix, sc] : by_prefix)
        if (sc.lora_alpha > 0) peft_.emplace_back(prefix, sc);
}

LoraFile LoraFile::from_index(io::WeightIndex index, const std::string& what) {
    LoraFile f;
    f.what_ = what;
    f.index_ = std::move(index);
    f.parsed_ = parse_keys(f.index_.tensors(), what);
    f.read_peft_configs();
    if (f.parsed_.patches.empty())
        fail(ErrorKind::InvalidInput, "{} holds no LoRA tensors ({} tensors, none with a LoRA/LoHa/LoKr/diff suffix); pass a LoRA file",
             what, f.index_.tensors().size());
    return f;
}

Tensor LoraFile::read(const std::string& name) const {
    const io::TensorInfo* t = index_.find(name);
    if (!t) fail(ErrorKind::Internal, "{}: tensor '{}' not found", what_, name);
    Tensor r;
    r.shape = t->shape;
    r.data = index_.read_f32(*t);
    for (size_t i = 0; i < r.data.size(); ++i)
        if (!std::isfinite(r.data[i]))
            fail(ErrorKind::InvalidInput, "{}: tensor '{}' holds a non-finite value ({}) at element {}; the LoRA file is broken", what_, name,
                 r.data[i], i);
    return r;
}

void LoraFile::check_values() const {
    for (const Patch& p : parsed_.patches)
        for (const std::string* n : {&p.up, &p.down, &p.mid, &p.hada_w1_a, &p.hada_w1_b, &p.hada_w2_a, &p.hada_w2_b, &p.hada_t1, &p.hada_t2,
                                     &p.lokr_w1, &p.lokr_w1_a, &p.lokr_w1_b, &p.lokr_w2, &p.lokr_w2_a, &p.lokr_w2_b, &p.lokr_t2, &p.diff,
                                     &p.diff_b, &p.bias, &p.alpha, &p.dora_scale})
            if (!n->empty()) (void)read(*n);
}

float LoraFile::scale(const Patch& p) const {
    if (p.rank == 0) return 1.0f;
    if (p.alpha.empty()) {
        if (p.kind != PatchKind::LoRA) return 1.0f;
        for (const auto& [prefix, sc] : peft_) {
            if (p.module.compare(0, prefix.size(), prefix) != 0) continue;
            // PEFT get_pattern_key: the first pattern with re.match(rf"(.*\.)?({key})$", module)
            const std::string name = p.module.substr(prefix.size());
            double alpha = sc.lora_alpha;
            for (const auto& [pat, a] : sc.alpha_pattern) {
                try {
                    if (std::regex_match(name, std::regex("(.*\\.)?(" + pat + ")"))) {
                        alpha = a;
                        break;
                    }
                } catch (const std::regex_error&) {
                    fail(ErrorKind::InvalidInput, "{}: alpha_pattern '{}' of its adapter config is not a regular expression", what_, pat);
                }
            }
            return (float)(alpha / (sc.rslora ? std::sqrt((double)p.rank) : (double)p.rank));
        }
        return 1.0f;
    }
    Tensor a = read(p.alpha);
    if (a.data.size() != 1) fail(ErrorKind::InvalidInput, "{}: alpha '{}' is not one number", what_, p.alpha);
    return (float)((double)a.data[0] / (double)p.rank);  // as Python's alpha / r, rounded once
}

}  // namespace easel::lora
