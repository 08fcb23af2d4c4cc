// Applying a job's LoRAs to a model (see apply.h).
#include "lora/apply.h"

#include "core/error.h"
#include "core/log.h"
#include "lora/graph.h"
#include "lora/math.h"

#include <fmt/format.h>

#include <algorithm>

namespace easel::lora {

namespace {

int64_t prod_from(const std::vector<int64_t>& s, size_t from) {
    int64_t n = 1;
    for (size_t i = from; i < s.size(); ++i) n *= s[i];
    return n;
}

/// The terms of one weight at run time over tensors in its buffer.
class LoraRuntime final : public nn::RuntimeUpdate {
public:
    struct T {
        ggml_tensor* down = nullptr;  ///< {K, r} (low rank; K = in, or in*kh*kw for a kernel) or null
        ggml_tensor* up = nullptr;    ///< {r, rows} (low rank) or the dense update {K, rows}
        float scale = 1.0f;
    };
    std::vector<T> terms;

    ggml_tensor* apply(ggml_context* ctx, ggml_tensor* x, ggml_tensor* y, int64_t row_begin, int64_t rows, bool weight_first) const override {
        for (const T& t : terms) {
            // the rows [row_begin, row_begin + rows) of the update's output (rows of `up`)
            ggml_tensor* up = t.up;
            if (row_begin != 0 || rows != up->ne[1]) up = ggml_view_2d(ctx, up, up->ne[0], rows, up->nb[1], (size_t)row_begin * up->nb[1]);
            ggml_tensor* z;
            if (t.down) {
                ggml_tensor* down = t.down;  // {K, r}
                if (weight_first) {
                    z = ggml_mul_mat(ctx, up, ggml_mul_mat(ctx, down, x));  // {r, M...} -> {rows, M...}
                } else {
                    ggml_tensor* h = ggml_mul_mat(ctx, x, down);                   // {M, r}
                    z = ggml_mul_mat(ctx, ggml_cont(ctx, ggml_transpose(ctx, h)), up);  // {M, rows}
                }
            } else {
                z = weight_first ? ggml_mul_mat(ctx, up, x) : ggml_mul_mat(ctx, x, up);
            }
            y = ggml_add(ctx, y, ggml_scale(ctx, z, t.scale));
        }
        return y;
    }
};

}  // namespace

void ComponentPatches::add(std::shared_ptr<const LoraFile> file, size_t patch, const Target& target, std::vector<Destination> dest, float m) {
    Entry e{std::move(file), patch, target, std::move(dest), m};
    const Patch& p = e.p();
    if (!target.bias.empty() && (!p.bias.empty() || !p.diff_b.empty())) by_bias_[target.bias].push_back(e);
    if (p.kind != PatchKind::Diff || !p.diff.empty()) by_weight_[target.name].push_back(std::move(e));
}

nn::WeightPatches::How ComponentPatches::how(const std::string& name, nn::ParamRole role, ggml_type type, bool row_split) const {
    if (by_bias_.count(name)) return How::Merge;
    auto it = by_weight_.find(name);
    if (it == by_weight_.end()) return How::None;
    const bool matmul = role == nn::ParamRole::Weight || role == nn::ParamRole::ConvWeight;
    const bool dora = std::any_of(it->second.begin(), it->second.end(), [](const Entry& e) { return !e.p().dora_scale.empty(); });
    bool runtime = false;
    if (matmul && !dora && !row_split) {
        if (mode_ == ApplyMode::AtRuntime) runtime = true;
        else if (mode_ == ApplyMode::Auto) runtime = ggml_is_quantized(type);
    }
    if (runtime) return How::Runtime;
    if (ggml_is_quantized(type) && !warned_requant_) {
        warned_requant_ = true;
        log::warn("LoRA: {} weights of the {} are quantised ({}) and are dequantised, patched and re-quantised{}: this costs quality; "
                  "--lora-apply-mode at_runtime keeps them as they are",
                  component_, component_, ggml_type_name(type), row_split ? " (row split: the meta device takes no run-time terms)" : "");
    }
    return How::Merge;
}

Tensor ComponentPatches::dense_update(const Entry& e) {
    const Target& t = e.target;
    const int64_t rows = t.shape[0], re = t.row_elems();
    Tensor d;
    d.shape = {rows, re};
    d.data.assign((size_t)(rows * re), 0.0f);
    const Tensor full = patch_delta(*e.file, e.p());
    for (const Destination& dst : e.dest) merge_rows(d.data, rows, re, full, dst.rows, 1.0f);
    return d;
}

void ComponentPatches::merge(const std::string& name, std::span<float> values) const {
    if (auto b = by_bias_.find(name); b != by_bias_.end()) {
        for (const Entry& e : b->second) {
            const Tensor bias = patch_bias_delta(*e.file, e.p());
            for (const Destination& d : e.dest) merge_rows(values, (int64_t)values.size(), 1, bias, d.rows, e.m);
        }
        return;
    }
    auto it = by_weight_.find(name);
    if (it == by_weight_.end()) return;
    for (const Entry& e : it->second) {
        const Target& t = e.target;
        const int64_t rows = t.shape[0], re = t.row_elems();
        if ((int64_t)values.size() != rows * re)
            fail(ErrorKind::Internal, "LoRA merge into {}: {} values for {} x {}", name, values.size(), rows, re);
        const Patch& p = e.p();
        if (!p.dora_scale.empty()) {
            const Tensor delta = patch_delta(*e.file, p);
            const Tensor g = e.file->read(p.dora_scale);
            for (const Destination& d : e.dest) merge_dora(values, t.shape, delta, d.rows, g, e.m);
        } else if (e.low_rank()) {
            // W[rows] += m * (s * up[rows] @ down), only the rows this target takes, each update
            // value rounded as lora_delta rounds it (F32 of the F64 sum, then times s)
            const Tensor up = e.file->read(p.up), down = e.file->read(p.down);
            const float s = e.file->scale(p);
            const int64_t r = up.shape[1];
            if (prod_from(down.shape, 1) != re || down.shape[0] != r)
                fail(ErrorKind::InvalidInput, "{}: LoRA '{}' down {} does not fit {} ({} per row)", e.file->what(), p.module, down.shape[0], name, re);
            std::vector<double> acc((size_t)re);
            for (const Destination& d : e.dest)
                for (int64_t o = d.rows.src_begin; o < d.rows.src_end; ++o) {
                    std::fill(acc.begin(), acc.end(), 0.0);
                    for (int64_t k = 0; k < r; ++k) {
                        const double a = up.data[(size_t)(o * r + k)];
                        if (a == 0.0) continue;
                        const float* dr = down.data.data() + k * re;
                        for (int64_t j = 0; j < re; ++j) acc[(size_t)j] += a * dr[j];
                    }
                    float* w = values.data() + (d.rows.dst_begin + o - d.rows.src_begin) * re;
                    for (int64_t j = 0; j < re; ++j) {
                        float v = (float)acc[(size_t)j];
                        v *= s;
                        w[j] += e.m * v;
                    }
                }
        } else {
            const Tensor delta = patch_delta(*e.file, p);
            for (const Destination& d : e.dest) merge_rows(values, rows, re, delta, d.rows, e.m);
        }
    }
}

std::vector<nn::UpdateTensor> ComponentPatches::runtime_tensors(const std::string& name) const {
    std::vector<nn::UpdateTensor> out;
    auto it = by_weight_.find(name);
    if (it == by_weight_.end()) return out;
    for (const Entry& e : it->second) {
        const Target& t = e.target;
        const int64_t rows = t.shape[0], re = t.row_elems();
        if (e.low_rank()) {
            HostTerm h = prepare_term(*e.file, e.p(), t, e.dest);
            const int64_t r = h.up.shape[1];
            nn::UpdateTensor down, up;
            down.ne = {re, r, 1, 1};  // PyTorch [r, in(, kh, kw)] -> {in*kh*kw, r}, the kernel's flattening
            down.data = std::move(h.down.data);
            up.ne = {r, rows, 1, 1};
            up.data = std::move(h.up.data);
            out.push_back(std::move(down));
            out.push_back(std::move(up));
        } else {
            nn::UpdateTensor d;
            d.ne = {re, rows, 1, 1};
            d.data = dense_update(e).data;
            out.push_back(std::move(d));
        }
    }
    return out;
}

std::unique_ptr<nn::RuntimeUpdate> ComponentPatches::runtime(const std::string& name, std::span<ggml_tensor* const> tensors) const {
    auto u = std::make_unique<LoraRuntime>();
    auto it = by_weight_.find(name);
    if (it == by_weight_.end()) return u;
    size_t i = 0;
    for (const Entry& e : it->second) {
        LoraRuntime::T t;
        if (e.low_rank()) {
            t.down = tensors[i++];
            t.up = tensors[i++];
            t.scale = e.m * e.file->scale(e.p());
        } else {
            t.up = tensors[i++];
            t.scale = e.m;
        }
        u->terms.push_back(t);
    }
    return u;
}

std::vector<std::string> ComponentPatches::names() const {
    std::vector<std::string> v;
    for (const auto& [n, e] : by_weight_) v.push_back(n);
    for (const auto& [n, e] : by_bias_)
        if (!by_weight_.count(n)) v.push_back(n);
    std::sort(v.begin(), v.end());
    return v;
}

std::vector<OpenedLora> open_loras(const std::vector<LoraRequest>& requests) {
    std::vector<OpenedLora> out;
    for (const LoraRequest& r : requests) {
        if (!r.active()) continue;
        auto f = std::make_shared<LoraFile>(LoraFile::open(r.path));
        f->check_values();
        out.push_back({r, std::move(f)});
    }
    return out;
}

std::map<std::string, std::shared_ptr<const ComponentPatches>> build_patches(const KeyMap& km, const std::vector<OpenedLora>& loras,
                                                                             const ModelInfo& model, ApplyMode mode) {
    std::map<std::string, std::shared_ptr<ComponentPatches>> build;
    const auto& comps = km.components();
    for (const OpenedLora& l : loras) {
        const LoraFile& f = *l.file;
        const Mapping m = map_patches(f.parsed(), f.index().tensors(), km);
        const std::string warning = check_fit(l.request.name, f.index().tensors(), f.parsed(), m, model);
        if (!warning.empty()) log::warn("{}", warning);
        size_t n_te = 0, n_dm = 0;
        for (const MappedPatch& mp : m.mapped) {
            const Component& c = comps.at((size_t)mp.component);
            const bool te = c.module == "te";
            const float w = te ? l.request.te_weight : l.request.diffusion_weight;
            if (w == 0.0f) continue;
            (te ? n_te : n_dm)++;
            auto& cp = build[c.name];
            if (!cp) cp = std::make_shared<ComponentPatches>(mode, c.name);
            // group the destinations by target
            std::map<int, std::vector<Destination>> per_target;
            for (const Destination& d : mp.dest) per_target[d.target].push_back(d);
            for (auto& [ti, dests] : per_target) cp->add(l.file, mp.patch, c.targets.at((size_t)ti), std::move(dests), w);
        }
        log::info("LoRA '{}': {} text-encoder and {} diffusion-model patches (te weight {}, diffusion weight {}, {})", l.request.name, n_te,
                  n_dm, l.request.te_weight, l.request.diffusion_weight, apply_mode_name(mode));
    }
    return {build.begin(), build.end()};
}

std::string lora_set_key(const std::vector<LoraRequest>& requests, ApplyMode mode) {
    std::string k;
    for (const LoraRequest& r : requests) {
        if (!r.active()) continue;
        k += fmt::format("{}{}@{}:{}:{}", k.empty() ? "" : ", ", r.name, lora_sha256(r.path).substr(0, 16), r.te_weight, r.diffusion_weight);
    }
    if (!k.empty()) k += fmt::format(" ({})", apply_mode_name(mode));
    return k;
}

std::string te_lora_key(const std::vector<LoraRequest>& requests, ApplyMode mode) {
    std::string k;
    for (const LoraRequest& r : requests) {
        if (r.te_weight == 0.0f) continue;
        k += fmt::format("{}{}@{}:{}", k.empty() ? "" : ", ", r.name, lora_sha256(r.path).substr(0, 16), r.te_weight);
    }
    if (!k.empty()) k += fmt::format(" ({})", apply_mode_name(mode));
    return k;
}

}  // namespace easel::lora
