// Row split on ggml's meta device (see row_split.h).
#include "placement/row_split.h"
#include "nn/weight_patch.h"

#include "core/error.h"
#include "core/log.h"
#include "placement/devices.h"

#include <ggml-alloc.h>
#include <ggml-cpu.h>
#include <ggml.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

namespace easel::placement {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
double mib(uint64_t b) { return (double)b / kMiB; }

bool ends_with_path(const std::string& path, const std::string& tail) {
    if (path == tail) return true;
    return path.size() > tail.size() && path.compare(path.size() - tail.size(), tail.size(), tail) == 0 &&
           path[path.size() - tail.size() - 1] == '.';
}

int64_t numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
}

}  // namespace

const char* row_role_name(RowRole r) {
    switch (r) {
        case RowRole::Mirror: return "mirror";
        case RowRole::Column: return "column";
        case RowRole::Row: return "row";
    }
    return "?";
}

const RowSplitRule& RowSplitRules::rule(const std::string& name) const {
    static const RowSplitRule mirror{};
    auto it = by_param.find(name);
    return it == by_param.end() ? mirror : it->second;
}

std::vector<int64_t> split_features(int64_t n, int64_t granule, size_t n_devices) {
    if (granule <= 0 || n % granule != 0 || n_devices == 0)
        fail(ErrorKind::Internal, "split_features: {} features are not whole units of {}", n, granule);
    const int64_t units = n / granule;
    std::vector<int64_t> out(n_devices);
    for (size_t j = 0; j < n_devices; ++j) out[j] = (units / (int64_t)n_devices + ((int64_t)j < units % (int64_t)n_devices ? 1 : 0)) * granule;
    return out;
}

std::shared_ptr<RowSplitRules> make_row_split_rules(std::string module, const nn::Block& root, const std::vector<const nn::Block*>& blocks,
                                                    const std::vector<RowSplitPattern>& patterns) {
    auto r = std::make_shared<RowSplitRules>();
    r->module = std::move(module);
    std::unordered_map<const nn::Param*, std::string> full;
    root.visit_params("", [&](const std::string& n, const nn::Param& p) { full[&p] = n; });
    int matched = 0;
    for (const nn::Block* b : blocks) {
        b->visit_params("", [&](const std::string& rel, const nn::Param& p) {
            const size_t dot = rel.rfind('.');
            if (dot == std::string::npos) return;
            const std::string path = rel.substr(0, dot), leaf = rel.substr(dot + 1);
            for (const auto& pat : patterns) {
                if (!ends_with_path(path, pat.linear)) continue;
                RowSplitRule rule{pat.role, pat.granule, pat.segments, pat.repeat};
                const bool bias = leaf == "bias";
                if (bias && pat.role == RowRole::Row) rule = RowSplitRule{};  // added after the all-reduce
                if (rule.role != RowRole::Mirror) {
                    // the split dimension (PyTorch order): weight [out, in]: out for column, in for row; bias [out]
                    const size_t dim = (rule.role == RowRole::Row) ? 1 : 0;
                    if (p.shape.size() <= dim || (!bias && p.shape.size() != 2)) {
                        r->why_not = fmt::format("{}.{} has shape rank {} (a Linear was expected)", path, leaf, p.shape.size());
                        return;
                    }
                    const int64_t n = p.shape[dim];
                    if (n % (rule.granule * rule.segments) != 0) {
                        r->why_not = fmt::format("{} of {} does not divide into {} x {}", n, full.at(&p), rule.segments, rule.granule);
                        return;
                    }
                    const int64_t units = n / (rule.granule * rule.segments);
                    if (r->max_devices == 0 || units < r->max_devices) {
                        r->max_devices = units;
                        r->max_devices_param = full.at(&p);
                    }
                }
                r->by_param[full.at(&p)] = rule;
                ++matched;
                return;
            }
        });
    }
    if (matched == 0 && r->why_not.empty()) r->why_not = "no Linear layer of its blocks has a row-split rule";
    return r;
}

bool split_state_of(const ggml_tensor* t, const RowSplitRule& rule, size_t n, ggml_backend_meta_split_state& out) {
    std::memset(&out, 0, sizeof(out));
    out.n_segments = 1;
    out.nr[0] = 1;
    if (rule.role == RowRole::Mirror) {
        out.axis = GGML_BACKEND_SPLIT_AXIS_MIRRORED;
        return true;
    }
    const bool vec = ggml_n_dims(t) == 1;
    const int axis = rule.role == RowRole::Row ? 0 : (vec ? 0 : 1);
    const int64_t total = t->ne[axis];
    if (rule.segments < 1 || rule.segments > 16 || total % rule.segments != 0) return false;
    const int64_t seg = total / rule.segments;
    if (seg % rule.granule != 0) return false;
    const auto per = split_features(seg, rule.granule, n);
    if (axis == 0)
        for (auto v : per)
            if (v % ggml_blck_size(t->type) != 0) return false;
    out.axis = (ggml_backend_meta_split_axis)axis;
    if (rule.repeat) {  // one part, repeated: the same slices (RowSplitRule::repeat)
        out.n_segments = 1;
        out.nr[0] = (uint32_t)rule.segments;
        for (size_t j = 0; j < n; ++j) out.ne[j] = per[j];
        return true;
    }
    out.n_segments = (uint32_t)rule.segments;
    for (int s = 0; s < rule.segments; ++s) {
        out.nr[s] = 1;
        for (size_t j = 0; j < n; ++j) out.ne[(size_t)s * n + j] = per[j];
    }
    return true;
}

std::vector<uint64_t> slice_bytes(ggml_type type, const std::vector<int64_t>& shape, const RowSplitRule& rule, size_t n) {
    const int64_t ne0 = shape.empty() ? 1 : shape.back();
    const int64_t rows = std::max<int64_t>(1, numel(shape) / std::max<int64_t>(ne0, 1));
    const uint64_t full = (uint64_t)ggml_row_size(type, ne0) * (uint64_t)rows;
    std::vector<uint64_t> out(n, full);
    if (rule.role == RowRole::Mirror) return out;
    const bool vec = shape.size() == 1;
    if (rule.role == RowRole::Column) {
        const int64_t total = shape[0];
        const auto per = split_features(total / rule.segments, rule.granule, n);
        for (size_t j = 0; j < n; ++j) {
            const int64_t mine = per[j] * rule.segments;
            out[j] = vec ? ggml_row_size(type, mine) : (uint64_t)ggml_row_size(type, ne0) * (uint64_t)mine;
        }
    } else {
        const auto per = split_features(shape.back() / rule.segments, rule.granule, n);
        for (size_t j = 0; j < n; ++j) out[j] = (uint64_t)ggml_row_size(type, per[j] * rule.segments) * (uint64_t)rows;
    }
    return out;
}

// ---------------------------------------------------------------- RowSplitDevice

RowSplitDevice::RowSplitDevice(std::vector<std::string> devices, std::shared_ptr<const RowSplitRules> rules)
    : names_(std::move(devices)), rules_(std::move(rules)) {
    if (!rules_) fail(ErrorKind::Internal, "RowSplitDevice without rules");
    if (names_.size() < 2) fail(ErrorKind::InvalidInput, "a row split needs at least 2 devices, got {}", names_.size());
    if (names_.size() > GGML_BACKEND_META_MAX_DEVICES)
        fail(ErrorKind::Unsupported, "a row split over {} devices: ggml's meta device takes at most {}", names_.size(),
             GGML_BACKEND_META_MAX_DEVICES);
    for (auto& n : names_) devs_.push_back(find_device(n));
    // The all-reduce is ggml's choice (GGML_CUDA_ALLREDUCE; NCCL on Linux). Measured on two H200s
    // with the full-size Z-Image DiT (bf16, output std 0.6): NCCL (BF16 partial sums above 32768
    // elements) 1.33x one GPU's step time, 0.0143 off its output; ggml's generic F32 all-reduce
    // (GGML_CUDA_ALLREDUCE=none) 1.91x and 0.0113 off. The difference is mostly not the
    // all-reduce: one GPU alone moves its output by 0.0108 when its matmuls compute in F32
    // instead of BF16 (GGML_CUDA_CUBLAS_COMPUTE_TYPE=f32), because ggml picks CUDA kernels of
    // different internal precision by matrix shape and a row split changes the shapes
    // (bench/results/README.md, 2026-11-30). So the faster default stays.
    meta_ = ggml_backend_meta_device(devs_.data(), devs_.size(), &RowSplitDevice::callback, this);
    if (!meta_) fail(ErrorKind::Unsupported, "cannot create ggml's meta device over {}", fmt::join(names_, ", "));
}

RowSplitDevice::~RowSplitDevice() {
    if (buf_) ggml_backend_buffer_free(buf_);
    if (ctx_) ggml_free(ctx_);
}

ggml_backend_meta_split_state RowSplitDevice::callback(const ggml_tensor* t, void* ud) {
    auto* self = static_cast<RowSplitDevice*>(ud);
    auto it = self->states_.find(t);
    if (it != self->states_.end()) return it->second;
    ggml_backend_meta_split_state s;
    std::memset(&s, 0, sizeof(s));
    s.axis = GGML_BACKEND_SPLIT_AXIS_MIRRORED;
    s.nr[0] = 1;
    s.n_segments = 1;
    return s;
}

uint64_t RowSplitDevice::param_buffer_bytes() const { return buf_ ? ggml_backend_buffer_get_size(buf_) : 0; }

void RowSplitDevice::load(nn::Block& root, const nn::TensorSource& src, const nn::LoadOptions& opt, const std::vector<std::string>& params) {
    if (ctx_) fail(ErrorKind::Internal, "RowSplitDevice::load called twice");
    if (std::string m = nn::check_binding(root, src, opt); !m.empty()) fail(ErrorKind::ModelMismatch, "{}", m);
    std::unordered_map<std::string, nn::Param*> by_name;
    root.visit_params("", [&](const std::string& n, nn::Param& p) { by_name[n] = &p; });
    ggml_init_params ip{};
    ip.mem_size = ggml_tensor_overhead() * (params.size() + 1);
    ip.no_alloc = true;
    ctx_ = ggml_init(ip);
    if (!ctx_) fail(ErrorKind::OutOfMemory, "cannot create a context for {} parameters", params.size());
    const size_t n = devs_.size();
    predicted_.assign(n, 0);
    struct Todo {
        ggml_tensor* t;
        nn::Param* p;
        const io::TensorInfo* info;
        std::string name;
    };
    std::vector<Todo> todo;
    for (const auto& name : params) {
        auto pit = by_name.find(name);
        if (pit == by_name.end()) fail(ErrorKind::Internal, "row split: {} is not a parameter of the module", name);
        nn::Param* p = pit->second;
        const io::TensorInfo* info = src.find(name);
        if (!info) {
            p->tensor = nullptr;  // optional and absent (check_binding passed)
            continue;
        }
        const ggml_type type = nn::choose_param_type(p->role, *info, opt);
        int64_t ne[4] = {1, 1, 1, 1};
        for (size_t i = 0; i < p->shape.size() && i < 4; ++i) ne[i] = p->shape[p->shape.size() - 1 - i];
        ggml_tensor* t = ggml_new_tensor(ctx_, type, 4, ne);
        ggml_set_name(t, name.c_str());
        const RowSplitRule& rule = rules_->rule(name);
        ggml_backend_meta_split_state st;
        if (!split_state_of(t, rule, n, st))
            fail(ErrorKind::Unsupported, "row split: {} ({}, {}) cannot be cut into whole {} slices for {} devices; use --split-mode layer", name,
                 ggml_type_name(type), row_role_name(rule.role), ggml_blck_size(type) > 1 ? "quantisation-block" : "head", n);
        states_[t] = st;
        auto b = slice_bytes(type, p->shape, rule, n);
        for (size_t j = 0; j < n; ++j) predicted_[j] += b[j];
        todo.push_back({t, p, info, name});
    }
    if (todo.empty()) return;
    buf_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_, ggml_backend_dev_buffer_type(meta_));
    if (!buf_)
        fail(ErrorKind::OutOfMemory, "cannot allocate the row-split parameters ({:.1f} MiB on the largest device) over {}",
             mib(*std::max_element(predicted_.begin(), predicted_.end())), fmt::join(names_, ", "));
    ggml_backend_buffer_set_usage(buf_, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    // each parameter is read into host memory in its loaded type, then handed to the meta
    // buffer whole (ggml slices it per device by its split state)
    for (auto& td : todo) {
        const size_t nbytes = ggml_nbytes(td.t);
        ggml_init_params hp{};
        hp.mem_size = nbytes + ggml_tensor_overhead() + 64;
        hp.no_alloc = false;
        ggml_context* hc = ggml_init(hp);
        if (!hc) fail(ErrorKind::OutOfMemory, "cannot stage {} ({:.1f} MiB) in host memory", td.name, mib(nbytes));
        struct Free {
            ggml_context* c;
            ~Free() { ggml_free(c); }
        } free_hc{hc};
        ggml_tensor* h = ggml_new_tensor(hc, td.t->type, 4, td.t->ne);
        // a LoRA on these parameters is merged here: the meta device takes no run-time terms
        nn::RowSplitReadScope row_split_read;
        nn::read_param(src, td.name, *td.p, *td.info, h);
        ggml_backend_tensor_set(td.t, h->data, 0, nbytes);
        td.p->tensor = td.t;
    }
}

uint64_t RowSplitDevice::allreduce_bytes(const ggml_cgraph* gf) const {
    uint64_t biggest = 0;
    for (int i = 0; i < ggml_graph_n_nodes(const_cast<ggml_cgraph*>(gf)); ++i) {
        const ggml_tensor* node = ggml_graph_node(const_cast<ggml_cgraph*>(gf), i);
        if (node->op != GGML_OP_MUL_MAT) continue;
        const ggml_tensor* w = node->src[0];
        while (w && w->view_src) w = w->view_src;
        auto it = w ? states_.find(w) : states_.end();
        if (it != states_.end() && it->second.axis == GGML_BACKEND_SPLIT_AXIS_0) biggest = std::max<uint64_t>(biggest, ggml_nbytes(node));
    }
    const uint64_t steps = (uint64_t)std::ceil(std::log2((double)devs_.size()));
    return steps * biggest;
}

// ---------------------------------------------------------------- planning

bool is_row_split_device(const std::string& device) { return device.find('&') != std::string::npos; }

std::vector<std::string> row_split_members(const std::string& device) {
    std::vector<std::string> out;
    size_t b = 0;
    while (true) {
        size_t e = device.find('&', b);
        out.push_back(device.substr(b, e == std::string::npos ? std::string::npos : e - b));
        if (e == std::string::npos) break;
        b = e + 1;
    }
    return out;
}

ModulePlan plan_row_split(PModule module, const ModulePlacement& place, const ModuleCosts& c, const std::map<std::string, uint64_t>& budgets) {
    const auto& devs = place.devices;
    const int n = (int)c.block_bytes.size();
    if (devs.size() < 2 || n == 0 || !c.row_split || !c.row_split_bytes)
        fail(ErrorKind::Internal, "plan_row_split: {} devices, {} blocks, rules {}", devs.size(), n, c.row_split ? "present" : "absent");
    const std::vector<uint64_t> per = c.row_split_bytes(devs.size());
    if (per.size() != devs.size()) fail(ErrorKind::Internal, "plan_row_split: no per-device parameter bytes");
    std::string joined;
    for (auto& d : devs) joined += (joined.empty() ? "" : "&") + d;
    ModulePlan p;
    p.module = module;
    p.label = fmt::format("{}; blocks 0-{} row split over {} devices (ggml meta device)", c.label, n, devs.size());
    p.params_location = place.params;

    Segment pro;
    pro.device = devs[0];
    pro.prologue = true;
    pro.param_bytes = c.prologue_bytes;
    pro.compute_bytes = c.measure(0, 0, true, false, devs[0]);
    Segment mid;
    mid.device = joined;
    mid.begin = 0;
    mid.end = n;
    uint64_t blocks = 0;
    for (auto b : c.block_bytes) blocks += b;
    mid.param_bytes = blocks;
    mid.compute_bytes = c.measure(0, n, false, false, devs[0]);
    Segment epi;
    epi.device = devs[0];
    epi.begin = epi.end = n;
    epi.epilogue = true;
    epi.param_bytes = c.prologue_bytes;
    epi.compute_bytes = c.measure(n, n, false, true, devs[0]);
    // the all-reduce staging buffer: one tensor of the largest partial sum per reduction step,
    // measured on the blocks' graph as the runtime does (RowSplitDevice::allreduce_bytes); else
    // bounded by the state between blocks (which may hold more than a hidden state: a mask, a
    // position bias)
    uint64_t partial = 0;
    if (c.row_split_partial_bytes) partial = c.row_split_partial_bytes(0, n);
    else if (c.state_bytes && n > 1) partial = c.state_bytes(1);
    const uint64_t steps = (uint64_t)std::ceil(std::log2((double)devs.size()));
    p.segments = {pro, mid, epi};
    for (size_t j = 0; j < devs.size(); ++j) {
        DeviceUse u;
        u.device = devs[j];
        auto it = budgets.find(devs[j]);
        u.budget = it == budgets.end() ? 0 : it->second;
        u.params = per[j] + (j == 0 ? c.prologue_bytes : 0);  // the prologue and epilogue graphs share one copy
        u.compute = mid.compute_bytes + steps * partial + (j == 0 ? std::max(pro.compute_bytes, epi.compute_bytes) : 0);
        p.devices.push_back(u);
    }
    for (auto& u : p.devices)
        if (u.budget && u.total() > u.budget)
            fail(ErrorKind::OutOfMemory,
                 "{} needs {:.0f} MiB on {} but the budget leaves {:.0f} MiB ({:.0f} params + {:.0f} compute, row split); try --params-backend {}=cpu "
                 "--stream-layers or a larger --max-vram",
                 pmodule_name(module), mib(u.total()), u.device, mib(u.budget), mib(u.params), mib(u.compute), pmodule_name(module));
    return p;
}

}  // namespace easel::placement
