// SegmentExecutor (see sequence_runner.h).
#include "runtime/sequence_runner.h"

#include "nn/weight_patch.h"

#include "core/log.h"
#include "placement/devices.h"

#include <algorithm>
#include <thread>
#include <unordered_set>

namespace easel::runtime {

namespace {

/// Run-time LoRA terms (nn/weight_patch.h) live in a buffer of the type load_subset was given: host
/// memory for weights kept in RAM or read from disk, which only a CPU device reads in its graphs.
/// Throws Error(Unsupported) when a parameter of `params` has one and `dev` is not a CPU device.
void refuse_host_runtime_terms(const std::vector<nn::Param*>& params, const std::unordered_map<const nn::Param*, std::string>& names,
                               ggml_backend_dev_t dev, const std::string& device) {
    if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) return;
    for (const nn::Param* p : params)
        if (nn::runtime_update(*p))
            fail(ErrorKind::Unsupported,
                 "{}: a LoRA at run time on weights kept in RAM or on disk for {} is not supported yet; use --lora-apply-mode "
                 "immediately (merged at load) or keep the module's weights on the device",
                 names.at(p), device);
}

uint64_t param_size(const nn::TensorSource& src, const std::string& name, const nn::Param& p, const nn::LoadOptions& opt) {
    const io::TensorInfo* t = src.find(name);
    if (!t) return 0;
    ggml_type type = nn::choose_param_type(p.role, *t, opt);
    int64_t n = 1;
    for (auto d : p.shape) n *= d;
    const int64_t ne0 = p.shape.empty() ? 1 : p.shape.back();
    return (uint64_t)ggml_row_size(type, ne0) * (uint64_t)(n / std::max<int64_t>(ne0, 1));
}

ggml_context* new_ctx(size_t n) {
    ggml_init_params ip{};
    ip.mem_size = ggml_tensor_overhead() * (n + 1);
    ip.no_alloc = true;
    ggml_context* c = ggml_init(ip);
    if (!c) fail(ErrorKind::OutOfMemory, "cannot create a ggml context for {} tensors", n);
    return c;
}

size_t aligned(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace

SegmentExecutor::SegmentExecutor(nn::Block& root, std::vector<std::vector<nn::Param*>> blocks, const nn::TensorSource& src,
                                 nn::LoadOptions opt, int threads)
    : root_(root), blocks_(std::move(blocks)), src_(src), opt_(std::move(opt)), threads_(threads) {
    std::unordered_set<const nn::Param*> in_block;
    for (auto& b : blocks_)
        for (auto* p : b) in_block.insert(p);
    root_.visit_params("", [&](const std::string& name, nn::Param& p) {
        names_[&p] = name;
        if (!in_block.count(&p)) rest_.push_back(&p);
    });
    for (auto& b : blocks_)
        for (auto* p : b)
            if (!names_.count(p)) fail(ErrorKind::Internal, "a block parameter is not in the module's tree");
}

SegmentExecutor::~SegmentExecutor() {
    if (in_phase_) end_phase();
    for (auto& [n, d] : devices_)
        if (d->upload) ggml_backend_synchronize(d->upload);  // no upload may still write a slot
    for (auto& s : segs_) {
        if (s.staged) ggml_backend_buffer_free(s.staged);
        if (s.twins) ggml_free(s.twins);
        if (s.graph_ctx) ggml_free(s.graph_ctx);
    }
    segs_.clear();
    for (auto& [n, d] : devices_) {
        for (auto* c : d->state_ctxs)
            if (c) ggml_free(c);
        for (auto* b : d->slots)
            if (b) ggml_backend_buffer_free(b);
        for (auto* b : d->state_bufs)
            if (b) ggml_backend_buffer_free(b);
        for (auto* e : d->events)
            if (e) ggml_backend_event_free(e);
        if (d->galloc) ggml_gallocr_free(d->galloc);
        if (d->upload) ggml_backend_free(d->upload);
        if (d->backend) ggml_backend_free(d->backend);
    }
    if (fake_ctx_) ggml_free(fake_ctx_);
}

std::vector<uint64_t> SegmentExecutor::block_bytes() const {
    std::vector<uint64_t> out;
    for (auto& b : blocks_) {
        uint64_t s = 0;
        for (auto* p : b) s += param_size(src_, names_.at(p), *p, opt_);
        out.push_back(s);
    }
    return out;
}

uint64_t SegmentExecutor::bytes_of(const std::vector<nn::Param*>& ps) const {
    uint64_t s = 0;
    for (auto* p : ps) s += param_size(src_, names_.at(p), *p, opt_);
    return s;
}

std::unordered_set<const ggml_tensor*> SegmentExecutor::graph_reads(ggml_cgraph* gf) {
    std::unordered_set<const ggml_tensor*> used;
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        const ggml_tensor* n = ggml_graph_node(gf, i);
        used.insert(n);
        for (int j = 0; j < GGML_MAX_SRC; ++j)
            for (const ggml_tensor* t = n->src[j]; t; t = t->view_src) used.insert(t);
        for (const ggml_tensor* t = n->view_src; t; t = t->view_src) used.insert(t);
    }
    return used;
}

void SegmentExecutor::split_rest(const std::unordered_set<const ggml_tensor*>& prologue_tensors,
                                 const std::unordered_set<const ggml_tensor*>& epilogue_tensors) {
    pro_rest_.clear();
    epi_rest_.clear();
    for (auto* p : rest_) {
        const bool pro = p->tensor && prologue_tensors.count(p->tensor);
        const bool epi = p->tensor && epilogue_tensors.count(p->tensor);
        if (epi) epi_rest_.push_back(p);
        // the prologue keeps everything the epilogue does not read alone (a parameter its graph
        // reads only at other shapes, such as a padding token, stays with it)
        if (pro || !epi) pro_rest_.push_back(p);
    }
    rest_split_ = true;
}

uint64_t SegmentExecutor::rest_bytes() const {
    uint64_t s = 0;
    for (auto* p : rest_) s += param_size(src_, names_.at(p), *p, opt_);
    return s;
}

SegmentExecutor::Device& SegmentExecutor::device(const std::string& name) {
    auto it = devices_.find(name);
    if (it != devices_.end()) return *it->second;
    auto d = std::make_unique<Device>();
    d->name = name;
    if (placement::is_row_split_device(name)) {
        // --split-mode row: ggml's meta device over the named devices (placement/row_split.h)
        if (!row_rules_) fail(ErrorKind::Internal, "segment device {} is a row split but the module has no row-split rules", name);
        auto rs = std::make_unique<placement::RowSplitDevice>(placement::row_split_members(name), row_rules_);
        d->dev = rs->device();
        row_devs_[name] = std::move(rs);
    } else {
        d->dev = placement::find_device(name);
    }
    d->backend = ggml_backend_dev_init(d->dev, nullptr);
    if (!d->backend) fail(ErrorKind::Unsupported, "cannot initialise a backend on device {}", name);
    if (ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(d->dev)) {
        auto fn = (ggml_backend_set_n_threads_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
        int n = threads_ > 0 ? threads_ : (int)std::max(1u, std::thread::hardware_concurrency());
        if (fn) fn(d->backend, n);
    }
    d->galloc = ggml_gallocr_new(ggml_backend_dev_buffer_type(d->dev));
    auto& ref = *d;
    devices_[name] = std::move(d);
    return ref;
}

void SegmentExecutor::note(Device& d) {
    uint64_t& p = peaks_[d.name];
    p = std::max<uint64_t>(p, d.params + d.staged + d.compute);
    if (row_devs_.empty()) return;
    // row split: each member device holds its share of the meta device's buffers (parameters:
    // the largest share; compute: ggml allocates the whole graph's buffer on every member) plus
    // what its own graphs (prologue, epilogue) hold
    std::map<std::string, uint64_t> now;
    for (auto& [n, dv] : devices_) {
        const uint64_t u = dv->params + dv->staged + dv->compute;
        if (placement::is_row_split_device(n))
            for (auto& m : placement::row_split_members(n)) now[m] += u;
        else now[n] += u;
    }
    for (auto& [m, u] : now) peaks_[m] = std::max(peaks_[m], u);
}

uint64_t SegmentExecutor::extra_compute(const Device& d, const ggml_cgraph* gf) const {
    auto it = row_devs_.find(d.name);
    return it == row_devs_.end() ? 0 : it->second->allreduce_bytes(gf);
}

std::vector<uint64_t> SegmentExecutor::row_split_bytes(size_t n) const {
    std::vector<uint64_t> out(n, 0);
    if (!row_rules_) return {};
    for (auto& b : blocks_)
        for (auto* p : b) {
            const std::string& name = names_.at(p);
            const io::TensorInfo* t = src_.find(name);
            if (!t) continue;
            const ggml_type type = nn::choose_param_type(p->role, *t, opt_);
            const placement::RowSplitRule& rule = row_rules_->rule(name);
            if (rule.role == placement::RowRole::Row && ggml_blck_size(type) > 1) {
                const auto per = placement::split_features(p->shape.back() / rule.segments, rule.granule, n);
                for (auto v : per)
                    if (v % ggml_blck_size(type) != 0) return {};
            }
            auto sb = placement::slice_bytes(type, p->shape, rule, n);
            for (size_t j = 0; j < n; ++j) out[j] += sb[j];
        }
    return out;
}

void SegmentExecutor::load(const placement::ModulePlan& plan) {
    if (loaded_) fail(ErrorKind::Internal, "SequenceRunner::load called twice");
    plan_ = plan;
    segs_.clear();
    segs_.resize(plan.segments.size());
    // which devices host a Host residency copy: the params location ("CPU" = pinned host memory
    // of the runtime device where it has one)
    std::map<std::string, uint64_t> slot_bytes;
    // a row-split plan runs the prologue and the epilogue as two graphs on its first device:
    // they share one resident copy of the non-block parameters (placement/row_split.h)
    bool row_plan = false;
    for (auto& g : plan.segments) row_plan |= placement::is_row_split_device(g.device);
    std::string rest_resident_on;
    bool binding_checked = false;
    for (size_t j = 0; j < plan.segments.size(); ++j) {
        Seg& s = segs_[j];
        s.plan = plan.segments[j];
        if (s.plan.end > (int)blocks_.size() || s.plan.begin < 0 || s.plan.begin > s.plan.end)
            fail(ErrorKind::Internal, "plan segment {}-{} outside the {} blocks", s.plan.begin, s.plan.end, blocks_.size());
        for (int i = s.plan.begin; i < s.plan.end; ++i) s.params.insert(s.params.end(), blocks_[(size_t)i].begin(), blocks_[(size_t)i].end());
        if (s.plan.prologue || s.plan.epilogue) {
            // the non-block parameters this segment's graph reads (see split_rest)
            const auto& rest = !rest_split_ || (s.plan.prologue && s.plan.epilogue) || row_plan ? rest_ : s.plan.prologue ? pro_rest_ : epi_rest_;
            s.params.insert(s.params.end(), rest.begin(), rest.end());
        }
        std::unordered_set<std::string> keep;
        for (auto* p : s.params) keep.insert(names_.at(p));
        const bool share_rest = row_plan && (s.plan.prologue || s.plan.epilogue) && s.plan.residency == placement::Residency::Device;
        if (share_rest && rest_resident_on == s.plan.device)
            for (auto* p : rest_) keep.erase(names_.at(p));  // bound to the first copy (Param::tensor still points there)
        else if (share_rest) rest_resident_on = s.plan.device;
        auto filter = [&](const std::string& n, const nn::Param&) { return keep.count(n) > 0; };
        Device& d = device(s.plan.device);
        auto record = [&] {
            s.bind.clear();
            for (auto* p : s.params) s.bind.emplace_back(p, p->tensor);
        };
        if (auto rs = row_devs_.find(d.name); rs != row_devs_.end()) {
            // row split: slices and mirrored copies in one meta buffer over the member devices
            if (s.plan.residency != placement::Residency::Device)
                fail(ErrorKind::Unsupported, "a row split keeps its parameters on its devices (no --params-backend for {})", d.name);
            std::vector<std::string> names;
            for (auto* p : s.params) names.push_back(names_.at(p));
            rs->second->load(root_, src_, opt_, names);
            record();
            d.params += rs->second->param_buffer_bytes();
            note(d);
        } else if (s.plan.residency == placement::Residency::Device) {
            s.own = nn::ParamBuffer::load_subset(root_, src_, ggml_backend_dev_buffer_type(d.dev), opt_, filter);
            record();
            d.params += s.own.size();
            note(d);
        } else if (s.plan.residency == placement::Residency::Host) {
            ggml_backend_buffer_type_t hb = nullptr;
            ggml_backend_dev_t pdev = placement::find_device(plan.params_location);
            if (ggml_backend_dev_type(pdev) == GGML_BACKEND_DEVICE_TYPE_CPU) hb = ggml_backend_dev_host_buffer_type(d.dev);
            if (!hb) hb = ggml_backend_dev_buffer_type(pdev);
            s.own = nn::ParamBuffer::load_subset(root_, src_, hb, opt_, filter);
            refuse_host_runtime_terms(s.params, names_, d.dev, d.name);
            record();
            if (s.own.buffer() && ggml_backend_buffer_is_host(s.own.buffer())) {
                host_now_ += s.own.size();
                host_peak_ = std::max(host_peak_, host_now_);
            }
            // device twins: same types and shapes, allocated in a slot (per-eval) or per phase
            s.twins = new_ctx(s.bind.size());
            for (auto& [p, t] : s.bind) {
                if (!t) continue;
                ggml_tensor* tw = ggml_new_tensor(s.twins, t->type, 4, t->ne);
                ggml_set_name(tw, t->name);
                s.copies.emplace_back(tw, t);
            }
        } else if (s.plan.residency == placement::Residency::Disk && s.plan.per_eval) {
            // nothing is read now: the file is checked as load() would, and device twins of the
            // types and shapes load_subset() will give (as install_fake) are placed in a slot;
            // read_from_disk() fills a host copy before each evaluation
            if (!binding_checked) {
                const std::string why = nn::check_binding(root_, src_, opt_);
                if (!why.empty()) fail(ErrorKind::ModelMismatch, "{}", why);
                binding_checked = true;
            }
            s.twins = new_ctx(s.params.size());
            for (auto* p : s.params) {
                const std::string& name = names_.at(p);
                const io::TensorInfo* t = src_.find(name);
                if (!t) {  // an optional parameter the file lacks
                    s.bind.emplace_back(p, nullptr);
                    continue;
                }
                int64_t ne[4] = {1, 1, 1, 1};
                for (size_t i = 0; i < p->shape.size() && i < 4; ++i) ne[i] = p->shape[p->shape.size() - 1 - i];
                ggml_tensor* tw = ggml_new_tensor(s.twins, nn::choose_param_type(p->role, *t, opt_), 4, ne);
                ggml_set_name(tw, name.c_str());
                s.bind.emplace_back(p, tw);
                s.copies.emplace_back(tw, nullptr);
            }
        }
        if (s.plan.per_eval && s.twins) {
            const ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(d.dev);
            const size_t align = ggml_backend_buft_get_alignment(buft);
            size_t off = 0;
            for (auto& [tw, t] : s.copies) off = aligned(off, align) + ggml_backend_buft_get_alloc_size(buft, tw);
            slot_bytes[d.name] = std::max<uint64_t>(slot_bytes[d.name], aligned(off, align));
        }
    }
    // the upload rings: K slots per device (the plan's slot_count), then twins placed in them
    // (a device's i-th per-eval segment in slot i mod K)
    for (auto& [name, bytes] : slot_bytes) {
        Device& d = device(name);
        int k = 2;
        for (auto& u : plan.devices)
            if (u.device == name && u.slot_count > 0) k = u.slot_count;
        const ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(d.dev);
        d.slots.assign((size_t)k, nullptr);
        d.owner.assign((size_t)k, -1);
        for (auto& b : d.slots) {
            b = ggml_backend_buft_alloc_buffer(buft, bytes + (8 << 10));  // + the plan's alignment slack
            if (!b) fail(ErrorKind::OutOfMemory, "cannot allocate a {:.1f} MiB streaming slot on {}", bytes / 1048576.0, name);
            d.params += ggml_backend_buffer_get_size(b);
        }
        note(d);
        ggml_backend_dev_props props;
        ggml_backend_dev_get_props(d.dev, &props);
        if (props.caps.async && props.caps.events) {
            d.upload = ggml_backend_dev_init(d.dev, nullptr);
            d.events.assign((size_t)k, nullptr);
            bool ok = d.upload != nullptr;
            for (auto& e : d.events) ok = ok && (e = ggml_backend_event_new(d.dev)) != nullptr;
            if (!ok) {
                log::warn("{}: no second stream/events; uploads of streamed blocks will not overlap compute", name);
                for (auto& e : d.events)
                    if (e) ggml_backend_event_free(e);
                d.events.clear();
                if (d.upload) ggml_backend_free(d.upload), d.upload = nullptr;
            }
        }
    }
    // ping-pong buffers for the state between consecutive segments of one device (sizes from
    // the plan; + 8 KiB for the alignment of each state tensor; a state that does not fit gets
    // a buffer of its own)
    std::map<std::string, uint64_t> state_need;
    for (size_t j = 0; j + 1 < plan.segments.size(); ++j)
        if (plan.segments[j + 1].device == plan.segments[j].device && plan.segments[j].state_bytes > 0)
            state_need[plan.segments[j].device] = std::max(state_need[plan.segments[j].device], plan.segments[j].state_bytes);
    for (auto& [name, bytes] : state_need) {
        Device& d = device(name);
        for (auto& b : d.state_bufs) {
            b = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(d.dev), bytes + (8 << 10));
            if (!b) fail(ErrorKind::OutOfMemory, "cannot allocate {:.1f} MiB for the state between blocks on {}", bytes / 1048576.0, name);
            d.params += ggml_backend_buffer_get_size(b);
        }
        note(d);
    }
    for (size_t j = 0; j < segs_.size(); ++j) {
        Seg& s = segs_[j];
        if (!s.plan.per_eval) continue;
        Device& d = device(s.plan.device);
        if (d.slots.empty()) fail(ErrorKind::Internal, "per-eval segment {}-{} on {} has no slot", s.plan.begin, s.plan.end, d.name);
        s.ring_pos = (int)d.ring.size();
        s.slot = s.ring_pos % (int)d.slots.size();
        d.ring.push_back(j);
        const size_t align = ggml_backend_buft_get_alignment(ggml_backend_dev_buffer_type(d.dev));
        char* base = (char*)ggml_backend_buffer_get_base(d.slots[s.slot]);
        size_t off = 0;
        for (auto& [tw, t] : s.copies) {
            off = aligned(off, align);
            if (ggml_backend_tensor_alloc(d.slots[s.slot], tw, base + off) != GGML_STATUS_SUCCESS)
                fail(ErrorKind::Internal, "cannot place {} in the streaming slot of {}", tw->name, d.name);
            off += ggml_backend_buft_get_alloc_size(ggml_backend_dev_buffer_type(d.dev), tw);
        }
    }
    // Host segments: bind each parameter to the device twin of its host tensor
    for (auto& s : segs_) {
        if (s.plan.residency != placement::Residency::Host) continue;
        std::unordered_map<const ggml_tensor*, ggml_tensor*> twin_of;
        for (auto& [tw, t] : s.copies) twin_of[t] = tw;
        for (auto& [p, t] : s.bind) t = t ? twin_of.at(t) : nullptr;  // host tensor -> its twin
    }
    // Param::tensor now points at the last loaded buffer; every graph installs its segment's binding
    loaded_ = true;
}

void SegmentExecutor::install(Seg& s) {
    for (auto& [p, t] : s.bind) p->tensor = t;
}

std::map<std::string, int> SegmentExecutor::ring_slots() const {
    std::map<std::string, int> out;
    for (auto& [n, d] : devices_)
        if (!d->slots.empty()) out[n] = (int)d->slots.size();
    return out;
}

void SegmentExecutor::begin_phase() {
    if (in_phase_) return;
    ring_live_ = false;
    for (auto& s : segs_) {
        Device& d = device(s.plan.device);
        if (s.plan.residency == placement::Residency::Disk && !s.plan.per_eval) {
            std::unordered_set<std::string> keep;
            for (auto* p : s.params) keep.insert(names_.at(p));
            s.own = nn::ParamBuffer::load_subset(root_, src_, ggml_backend_dev_buffer_type(d.dev), opt_,
                                                 [&](const std::string& n, const nn::Param&) { return keep.count(n) > 0; });
            s.bind.clear();
            for (auto* p : s.params) s.bind.emplace_back(p, p->tensor);
            d.staged += s.own.size();
            note(d);
        } else if (s.plan.residency == placement::Residency::Host && !s.plan.per_eval) {
            s.staged = ggml_backend_alloc_ctx_tensors_from_buft(s.twins, ggml_backend_dev_buffer_type(d.dev));
            if (!s.staged && !s.copies.empty())
                fail(ErrorKind::OutOfMemory, "cannot stage {:.1f} MiB of parameters on {}", s.plan.param_bytes / 1048576.0, d.name);
            if (s.staged) d.staged += ggml_backend_buffer_get_size(s.staged);
            note(d);
            upload(s, nullptr);
        }
    }
    in_phase_ = true;
}

void SegmentExecutor::end_phase() {
    if (!in_phase_) return;
    reset_rings();  // (uploads of a next evaluation that will not come: waited for, dropped)
    for (auto& s : segs_) {
        Device& d = device(s.plan.device);
        if (s.plan.residency == placement::Residency::Disk && s.plan.per_eval) {
            drop_transient(s);  // (only left over when an evaluation failed)
        } else if (s.plan.residency == placement::Residency::Disk) {
            d.staged -= std::min<uint64_t>(d.staged, s.own.size());
            s.own = nn::ParamBuffer();
            for (auto& [p, t] : s.bind) t = nullptr;
        } else if (s.staged) {
            d.staged -= std::min<uint64_t>(d.staged, ggml_backend_buffer_get_size(s.staged));
            ggml_backend_buffer_free(s.staged);
            s.staged = nullptr;
            // twins keep stale buffer pointers: recreate them for the next phase
            ggml_context* fresh = new_ctx(s.copies.size());
            std::unordered_map<ggml_tensor*, ggml_tensor*> remap;
            for (auto& [tw, t] : s.copies) {
                ggml_tensor* n = ggml_new_tensor(fresh, t->type, 4, t->ne);
                ggml_set_name(n, t->name);
                remap[tw] = n;
                tw = n;
            }
            for (auto& [p, t] : s.bind)
                if (t) t = remap.at(t);
            ggml_free(s.twins);
            s.twins = fresh;
        }
    }
    in_phase_ = false;
}

void SegmentExecutor::upload(Seg& s, ggml_backend_t via) {
    for (auto& [tw, t] : s.copies) {
        if (t->buffer && ggml_backend_buffer_is_host(t->buffer)) {
            if (via) ggml_backend_tensor_set_async(via, tw, t->data, 0, ggml_nbytes(t));
            else ggml_backend_tensor_set(tw, t->data, 0, ggml_nbytes(t));
        } else {
            ggml_backend_tensor_copy(t, tw);
        }
    }
}

void SegmentExecutor::read_from_disk(Seg& s) {
    std::unordered_set<std::string> keep;
    for (auto* p : s.params) keep.insert(names_.at(p));
    drop_transient(s);
    s.transient = nn::ParamBuffer::load_subset(root_, src_, ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)),
                                               opt_, [&](const std::string& n, const nn::Param&) { return keep.count(n) > 0; });
    host_now_ += s.transient.size();
    host_peak_ = std::max(host_peak_, host_now_);
    ++disk_reads_;
    refuse_host_runtime_terms(s.params, names_, device(s.plan.device).dev, s.plan.device);
    // load_subset bound each parameter to its host tensor: those are the upload sources
    size_t k = 0;
    for (auto& [p, tw] : s.bind) {
        if (!tw) continue;
        const ggml_tensor* h = p->tensor;
        if (!h || h->type != tw->type || ggml_nbytes(h) != ggml_nbytes(tw))
            fail(ErrorKind::Internal, "{}: the parameter read from the file ({}) differs from its slot twin ({}, {} bytes)", tw->name,
                 h ? ggml_type_name(h->type) : "absent", ggml_type_name(tw->type), ggml_nbytes(tw));
        s.copies.at(k++).second = p->tensor;
    }
}

void SegmentExecutor::drop_transient(Seg& s) {
    if (!s.transient.buffer()) return;
    host_now_ -= std::min<uint64_t>(host_now_, s.transient.size());
    s.transient = nn::ParamBuffer();
    for (auto& c : s.copies) c.second = nullptr;
}

void SegmentExecutor::begin_run(bool wrap) {
    ++run_no_;
    wrap_ = wrap;
    if (!ring_live_) {
        reset_rings();
        for (auto& [n, d] : devices_) {
            d->next_up = run_no_ * (int64_t)d->ring.size();
            d->done = d->next_up - 1;
        }
    }
    ring_live_ = false;  // until this evaluation completes (end_run)
    for (auto& [n, d] : devices_) d->state_flip = d->ctx_flip = 0;  // the same buffers for the same segment every evaluation
}

void SegmentExecutor::reset_rings() {
    for (auto& [n, d] : devices_) {
        if (d->upload) ggml_backend_synchronize(d->upload);
        std::fill(d->owner.begin(), d->owner.end(), -1);
    }
    if (transient_seg_ >= 0) drop_transient(segs_[(size_t)transient_seg_]);
    transient_seg_ = -1;
    ring_live_ = false;
}

void SegmentExecutor::prepare(size_t j) {
    Seg& s = segs_[j];
    if (!s.plan.per_eval) return;
    Device& d = device(s.plan.device);
    const bool disk = s.plan.residency == placement::Residency::Disk;
    const int64_t g = seq_of(d, s);
    if (d.owner[(size_t)s.slot] == g) {  // uploaded ahead
        if (d.upload) {
            ggml_backend_event_wait(d.backend, d.events[(size_t)s.slot]);
            if (disk && transient_seg_ == (int)j) {  // the host copy may go once its upload has completed
                ggml_backend_event_synchronize(d.events[(size_t)s.slot]);
                drop_transient(s);
                transient_seg_ = -1;
            }
        }
        return;
    }
    // not uploaded yet: it is the next upload of the ring (every earlier segment has computed,
    // so its slot is free)
    if (d.next_up != g)
        fail(ErrorKind::Internal, "upload ring of {}: segment {}-{} is upload {} but upload {} is next", d.name, s.plan.begin, s.plan.end, g,
             d.next_up);
    if (disk) {
        if (transient_seg_ >= 0) {
            drop_transient(segs_[(size_t)transient_seg_]);
            transient_seg_ = -1;
        }
        read_from_disk(s);
    }
    upload(s, nullptr);
    if (disk) drop_transient(s);
    d.owner[(size_t)s.slot] = g;
    ++d.next_up;
}

void SegmentExecutor::after_compute(size_t j) {
    Seg& s = segs_[j];
    if (s.plan.per_eval) device(s.plan.device).done = seq_of(device(s.plan.device), s);
    pump_all();
}

void SegmentExecutor::pump_all() {
    for (auto& [name, dp] : devices_) {
        Device& d = *dp;
        if (d.ring.empty()) continue;
        const int64_t n = (int64_t)d.ring.size();
        // this evaluation's segments; with an outer phase on a device with events, the next one's too
        const int64_t limit = (run_no_ + ((wrap_ && d.upload) ? 2 : 1)) * n;
        while (d.next_up < limit) {
            const size_t j = d.ring[(size_t)(d.next_up % n)];
            Seg& s = segs_[j];
            if (d.owner[(size_t)s.slot] > d.done) break;  // its slot holds a segment not computed yet
            const bool disk = s.plan.residency == placement::Residency::Disk;
            if (disk && d.next_up >= (run_no_ + 1) * n) break;  // no file read for an evaluation not begun
            if (disk) {
                if (transient_seg_ >= 0) {  // one host buffer at a time: the previous one's upload must end first
                    Seg& o = segs_[(size_t)transient_seg_];
                    Device& od = device(o.plan.device);
                    if (od.upload) ggml_backend_event_synchronize(od.events[(size_t)o.slot]);
                    drop_transient(o);
                    transient_seg_ = -1;
                }
                read_from_disk(s);
            }
            if (d.upload) {
                upload(s, d.upload);
                ggml_backend_event_record(d.events[(size_t)s.slot], d.upload);
                ++prefetched_;
                if (disk) transient_seg_ = (int)j;
            } else {
                upload(s, nullptr);
                if (disk) drop_transient(s);
            }
            d.owner[(size_t)s.slot] = d.next_up++;
            ahead_max_ = std::max(ahead_max_, (int)(d.next_up - 1 - d.done));
        }
    }
}

void SegmentExecutor::install_fake() {
    if (!fake_ctx_) {
        fake_ctx_ = new_ctx(names_.size());
        alignas(64) static char dummy[64];
        for (auto& [p, name] : names_) {
            const io::TensorInfo* t = src_.find(name);
            if (!t) continue;
            int64_t ne[4] = {1, 1, 1, 1};
            for (size_t i = 0; i < p->shape.size() && i < 4; ++i) ne[i] = p->shape[p->shape.size() - 1 - i];
            ggml_tensor* f = ggml_new_tensor(fake_ctx_, nn::choose_param_type(p->role, *t, opt_), 4, ne);
            ggml_set_name(f, name.c_str());
            f->data = dummy;  // "allocated" for ggml-alloc; never read (the graph is only measured)
            saved_.emplace_back(const_cast<nn::Param*>(p), f);
        }
    }
    for (auto& [p, f] : saved_) std::swap(p->tensor, f);
}

void SegmentExecutor::restore_fake() {
    for (auto& [p, f] : saved_) std::swap(p->tensor, f);
}

}  // namespace easel::runtime
