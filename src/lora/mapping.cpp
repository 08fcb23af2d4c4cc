// A LoRA file against a model (see mapping.h).
#include "lora/mapping.h"

#include "core/error.h"
#include "io/detect.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <unordered_map>

namespace easel::lora {

namespace {

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }
bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

bool te_name(const std::string& m) {
    return starts_with(m, "lora_te") || starts_with(m, "text_encoder") || m.find("text_model") != std::string::npos;
}

// "a, b, c (and 7 more)"
std::string first_few(const std::vector<std::string>& v, size_t n = 5) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < n; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > n) s += fmt::format(" (and {} more)", v.size() - n);
    return s;
}

// The module's shape as the LoRA sees it: [rows, per-row...].
std::string lora_shape(const Patch& p, int64_t rows) {
    if (p.delta_shape.empty()) return fmt::format("[{}] (bias)", rows);
    return shape_str(p.delta_shape);
}

}  // namespace

Mapping map_patches(const ParsedLora& parsed, const std::vector<io::TensorInfo>& tensors, const KeyMap& km) {
    std::unordered_map<std::string, const io::TensorInfo*> by_name;
    for (auto& t : tensors) by_name[t.name] = &t;
    Mapping m;
    for (size_t i = 0; i < parsed.patches.size(); ++i) {
        const Patch& p = parsed.patches[i];
        Match hit = km.find(p.module);
        if (hit.component < 0 || hit.dest.empty()) {
            m.unmapped.push_back(p.module);
            continue;
        }
        const Component& c = km.components()[(size_t)hit.component];
        int64_t rows = p.out_rows();
        if (p.delta_shape.empty() && !p.diff_b.empty()) rows = by_name.at(p.diff_b)->shape[0];
        std::string why;
        // the destinations must take the update's rows exactly once, in order
        int64_t covered = 0;
        for (const Destination& d : hit.dest) {
            if (d.rows.src_begin != covered) break;
            covered = d.rows.src_end;
        }
        const Target& t0 = c.targets[(size_t)hit.dest[0].target];
        auto model_rows = [&]() {
            int64_t r = 0;
            for (const Destination& d : hit.dest) r = std::max(r, d.rows.src_end);
            return r;
        };
        if (covered != rows || model_rows() != rows) {
            why = hit.dest.size() == 1 ? fmt::format("LoRA {} vs model {}", lora_shape(p, rows), shape_str(t0.shape))
                                       : fmt::format("LoRA {} rows vs {} rows of the fused layer", rows, model_rows());
        }
        for (const Destination& d : hit.dest) {
            if (!why.empty()) break;
            const Target& t = c.targets[(size_t)d.target];
            const int64_t n = d.rows.src_end - d.rows.src_begin;
            if (d.rows.dst_begin < 0 || d.rows.dst_begin + n > t.shape[0])
                why = fmt::format("rows {}..{} outside {} {}", d.rows.dst_begin, d.rows.dst_begin + n, t.name, shape_str(t.shape));
            else if (!p.delta_shape.empty() && p.row_elems() != t.row_elems())
                why = hit.dest.size() == 1 ? fmt::format("LoRA {} vs model {}", shape_str(p.delta_shape), shape_str(t.shape))
                                           : fmt::format("LoRA {} vs model {} of {}", shape_str(p.delta_shape), shape_str(t.shape), t.name);
            else if ((!p.bias.empty() || !p.diff_b.empty()) && t.bias.empty())
                why = fmt::format("a bias update for {}, which has no bias", t.name);
        }
        if (why.empty() && !p.dora_scale.empty()) {
            const io::TensorInfo* g = by_name.at(p.dora_scale);
            auto ones_after = [&](size_t from) {
                for (size_t k = from; k < g->shape.size(); ++k)
                    if (g->shape[k] != 1) return false;
                return true;
            };
            const bool out_axis = !g->shape.empty() && g->shape[0] == rows && ones_after(1);
            const bool in_axis = !out_axis && g->shape.size() >= 2 && g->shape[0] == 1 && ones_after(2) && t0.shape.size() >= 2 &&
                                 g->shape[1] == t0.shape[1];
            if (!out_axis && !in_axis)
                why = fmt::format("DoRA magnitude {} fits neither the {} rows nor the inputs of {}", shape_str(g->shape), rows,
                                  shape_str(t0.shape));
            else if (in_axis && (hit.dest.size() != 1 || hit.dest[0].rows.dst_begin != 0 || rows != t0.shape[0]))
                why = fmt::format("a per-input DoRA magnitude {} on part of a fused layer", shape_str(g->shape));
        }
        if (!why.empty()) {
            m.mismatched.push_back(fmt::format("{} -> {}: {}", p.module, t0.name, why));
            continue;
        }
        m.mapped.push_back({i, hit.component, hit.dest});
    }
    return m;
}

bool family_supported(const std::string& f) {
    return f == "SD1.x" || f == "SD2.x" || f == "SDXL" || f == "Z-Image" || f == "FLUX.1" || starts_with(f, "FLUX.2");
}

LoraTarget guess_target(const std::vector<io::TensorInfo>& tensors, const ParsedLora& p) {
    LoraTarget g;
    std::vector<std::string> notes;
    g.family = io::detect_lora_target(tensors, &notes);
    if (g.family == "unknown model") g.family.clear();
    for (const std::string& n : notes)
        if (n.find("assumed") != std::string::npos) g.weak = true;
    if (g.family.find("(transformer_blocks only)") != std::string::npos) g.weak = true;
    const bool unet = g.family == "SD1.x" || g.family == "SD2.x" || g.family == "SDXL";
    std::map<int64_t, int> count;
    for (const Patch& q : p.patches) {
        if (te_name(q.module) || q.delta_shape.empty()) continue;
        if (unet) {
            if (q.module.find("attn2") != std::string::npos && q.module.find("to_k") != std::string::npos) {
                g.width = q.row_elems();
                g.width_name = "context";
                break;
            }
            continue;
        }
        ++count[q.row_elems()];
    }
    if (!unet) {
        int best = 0;
        for (auto& [w, n] : count)
            if (n > best) {
                best = n;
                g.width = w;
            }
    }
    bool img_in = false;
    for (const Patch& q : p.patches)
        if (q.module.find("img_in") != std::string::npos || q.module.find("x_embedder") != std::string::npos) img_in = true;
    g.control = img_in && !p.unknown.empty() && starts_with(g.family, "FLUX");
    return g;
}

std::string check_fit(const std::string& name, const std::vector<io::TensorInfo>& tensors, const ParsedLora& p, const Mapping& m,
                      const ModelInfo& model) {
    const size_t total = p.patches.size();
    auto sized = [](const std::string& family, int64_t w, const std::string& what) {
        return w > 0 ? fmt::format("{} ({} {})", family, what, w) : family;
    };
    const std::string model_s = sized(model.family, model.width, model.width_name);
    const LoraTarget g = guess_target(tensors, p);
    const bool same_family =
        !g.family.empty() && (g.family == model.family || (starts_with(g.family, "FLUX.2") && starts_with(model.family, "FLUX.2")));
    const bool other_family = !g.family.empty() && !same_family;
    const bool exact = m.mismatched.empty() && !m.mapped.empty() && m.unmapped.empty();
    if (g.control)
        fail(ErrorKind::ModelMismatch,
             "LoRA '{}' is a FLUX Control LoRA (Canny/Depth: it widens img_in for a control image and replaces norms), which easel "
             "does not run; the model is {}", name, model_s);
    if (other_family && !family_supported(g.family) && (!g.weak || !exact))
        fail(ErrorKind::ModelMismatch, "LoRA '{}' targets {}, a model family easel does not run; the model is {}", name, g.family, model_s);
    if (!m.mismatched.empty() || m.mapped.empty() || (!m.unmapped.empty() && other_family && !g.weak)) {
        if (other_family)
            fail(ErrorKind::ModelMismatch, "LoRA '{}' targets {}, the model is {}: use a LoRA made for {}", name,
                 sized(g.family, g.width, g.width_name), model_s, model.family);
        if (same_family && g.width > 0 && model.width > 0 && g.width != model.width && g.width_name == model.width_name)
            fail(ErrorKind::ModelMismatch, "LoRA '{}' targets {}, the model is {}: it was made for another size of {}", name,
                 sized(g.family, g.width, g.width_name), model_s, model.family);
        if (m.mapped.empty() && m.mismatched.empty())
            fail(ErrorKind::ModelMismatch, "LoRA '{}' patches nothing in the {} model: none of its {} modules ({}) is a layer of it", name,
                 model_s, total, first_few(m.unmapped, 3));
        fail(ErrorKind::ModelMismatch, "LoRA '{}' does not fit the {} model: {} of its {} modules differ in shape ({})", name, model_s,
             m.mismatched.size(), total, first_few(m.mismatched, 2));
    }
    std::vector<std::string> parts;
    if (other_family)
        parts.push_back(fmt::format("its names also fit {}; applied as {} layers, which they match exactly", g.family, model.family));
    if (!m.unmapped.empty())
        parts.push_back(fmt::format("{} of its {} modules match no layer of the {} model and are not applied: {}", m.unmapped.size(), total,
                                    model.family, first_few(m.unmapped)));
    if (!p.unknown.empty())
        parts.push_back(fmt::format("{} tensors of no LoRA kind are not applied: {}", p.unknown.size(), first_few(p.unknown)));
    if (!p.embeddings.empty())
        parts.push_back(fmt::format("{} bundled embedding vectors ({}) are not applied: put them in --embd-dir to use them",
                                    p.embeddings.size(), first_few(p.embeddings, 3)));
    if (parts.empty()) return {};
    std::string w = fmt::format("LoRA '{}': ", name);
    for (size_t i = 0; i < parts.size(); ++i) w += (i ? "; " : "") + parts[i];
    return w;
}

}  // namespace easel::lora
