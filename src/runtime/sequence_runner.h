// SequenceRunner: runs an nn::Sequence under a placement::ModulePlan.
//
// Each plan segment (blocks [begin, end) on one device, with the prologue and/or epilogue when
// it is the first / last) is one ggml graph on that device's backend. Between segments the
// State crosses as host bytes of every tensor State::visit_tensors names (type and shape kept,
// so I32 tensors stay I32): the next segment starts from fresh inputs of the same shapes.
// Parameters of a segment are
//   * Device:  loaded from the file onto its device by load(),
//   * Host:    loaded into host RAM (pinned where the device offers a host buffer type) or the
//              --params-backend device by load(); copied to the runtime device for a phase, or,
//              for per-eval segments (streaming, --max-vram segments), uploaded into one of the
//              device's slot buffers before each evaluation (see "Upload ring" below),
//   * Disk:    read from the file onto the device when a phase begins, freed when it ends;
//              per-eval Disk segments (a module that fits the device only in pieces) have
//              device twins in the slots like Host ones and are read from the file into a
//              transient host buffer before each evaluation, uploaded, and the buffer freed
//              (one such buffer at a time).
// A phase is begin_phase() .. end_phase() (e.g. the whole denoising loop); run() outside a
// phase is a phase of its own.
//
// Upload ring. A device with per-eval segments has K slot buffers (the plan's
// DeviceUse::slot_count, each the size of its largest per-eval segment); its i-th per-eval
// segment always uses slot i mod K. Uploads are issued strictly in segment order, each as soon
// as its slot's previous segment has finished computing: after a segment's compute is launched
// and again when it has completed, the runner uploads every following segment whose slot is
// free, so up to K segments are on the device ahead of the computing one. Where the device has
// events (caps async + events: CUDA, RPC), the uploads run on a second backend (CUDA: a second
// stream; RPC: the server's one command queue) and each segment's compute waits on its slot's
// event; inside an outer phase (begin_phase), the next evaluation's leading Host segments are
// uploaded while this evaluation's last ones compute. Without events (CPU) the same order is
// kept with synchronous uploads (no overlap; nothing uploaded for an evaluation that has not
// begun). A per-eval Disk segment is read from the file just before its upload (never for an
// evaluation that has not begun), and the host buffer of the previous one is freed first (after
// its upload completed).
// An evaluation that fails empties the ring; the next one starts it again.

//
// Typical use:
//   runtime::SequenceRunner<UNetInputs, UNetState, ggml_tensor*> r(unet, unet, src, opt);
//   auto costs = r.costs(make_inputs, select);          // bytes per block + measured compute
//   auto plan = placement::plan_module(PModule::Diffusion, spec[...], stream, costs, budgets);
//   r.load(plan);
//   auto out = r.run(make_inputs, select);              // HostTensor per selected output
#pragma once

#include "core/error.h"
#include "nn/sequence.h"
#include "placement/plan.h"
#include "placement/row_split.h"
#include "runtime/graph_flops.h"
#include "runtime/graph_runner.h"

#include <ggml-alloc.h>
#include <ggml-backend.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace easel::runtime {

/// The non-template part: devices, parameter buffers, slots, uploads, accounting.
class SegmentExecutor {
public:
    /// root: the module's Block tree; blocks[i]: the parameters of block i (by address);
    /// src/opt: where parameters are read from (kept by reference: must outlive this object).
    SegmentExecutor(nn::Block& root, std::vector<std::vector<nn::Param*>> blocks, const nn::TensorSource& src,
                    nn::LoadOptions opt, int threads);
    ~SegmentExecutor();
    SegmentExecutor(const SegmentExecutor&) = delete;
    SegmentExecutor& operator=(const SegmentExecutor&) = delete;

    /// Parameter bytes per block and outside the blocks (ggml_row_size of the types load() will
    /// choose), for placement::ModuleCosts.
    std::vector<uint64_t> block_bytes() const;
    uint64_t rest_bytes() const;

    /// Allocates and loads what the plan keeps resident (Device and Host residency, slots).
    /// Throws as nn::ParamBuffer::load (ModelMismatch, OutOfMemory) and Error(InvalidInput)
    /// for an unknown device name.
    void load(const placement::ModulePlan& plan);
    const placement::ModulePlan& plan() const { return plan_; }
    bool loaded() const { return loaded_; }

    /// Stages Host (non-per-eval) and Disk segments onto their devices until end_phase().
    void begin_phase();
    void end_phase();
    bool in_phase() const { return in_phase_; }

    /// Largest bytes allocated on each device at one time (parameters, slots, staged copies,
    /// compute buffer) since load() — the measured peak beside the plan's prediction.
    const std::map<std::string, uint64_t>& peaks() const { return peaks_; }

    /// Per-eval segments uploaded on the second backend ahead of their compute (backends with
    /// events: CUDA, RPC; 0 on CPU).
    int prefetched_uploads() const { return prefetched_; }
    /// Slot buffers of each device's upload ring (the plan's DeviceUse::slot_count; devices
    /// without per-eval segments absent).
    std::map<std::string, int> ring_slots() const;
    /// The most per-eval segments of one device held in its slots ahead of their compute at one
    /// time (uploaded or being uploaded, not yet computed) since load(): up to the ring's K.
    int max_uploaded_ahead() const { return ahead_max_; }

    /// Largest host RAM held for parameters at one time since load(): the buffers of Host
    /// segments in host memory plus the transient buffer of a per-eval Disk segment being read
    /// (bytes; the measured figure beside placement::ModulePlan::host_bytes).
    uint64_t host_peak() const { return host_peak_; }
    /// Per-eval Disk segments read from the file so far (one per segment and evaluation).
    int disk_reads() const { return disk_reads_; }

    /// --split-mode row: the module's tensor-parallel rules (placement/row_split.h). With rules,
    /// costs() offers the planner a row split, and load() runs a plan segment whose device is
    /// "A&B..." on ggml's meta device over A, B... Set before costs() / load().
    void set_row_split(std::shared_ptr<const placement::RowSplitRules> rules) { row_rules_ = std::move(rules); }
    /// Block parameter bytes per device under the rules over n devices (slices + mirrored), or
    /// empty when a slice would not be whole quantisation blocks.
    std::vector<uint64_t> row_split_bytes(size_t n) const;

protected:
    struct Device {
        std::string name;
        ggml_backend_dev_t dev = nullptr;
        ggml_backend_t backend = nullptr;
        ggml_backend_t upload = nullptr;         // second backend (stream) for prefetch, or null
        std::vector<ggml_backend_event_t> events;  // per slot: its last upload on `upload`
        ggml_gallocr_t galloc = nullptr;
        std::vector<ggml_backend_buffer_t> slots;  // the upload ring (K slot buffers)
        std::vector<size_t> ring;                  // its per-eval segments (indices into segs_), in order
        // Upload order: per-eval segment i of evaluation e has the sequence number e * ring.size() + i.
        std::vector<int64_t> owner;                // per slot: sequence number of the segment it holds, -1 none
        int64_t next_up = 0;                       // sequence number of the next upload to issue
        int64_t done = -1;                         // last per-eval segment whose compute has completed
        ggml_backend_buffer_t state_bufs[2] = {nullptr, nullptr};  // ping-pong buffers for states kept on the device
        int state_flip = 0;
        // ping-pong contexts for the tensors of those states (kept, reset for reuse, so a state
        // tensor has the same address in every evaluation), their capacity in tensors
        ggml_context* state_ctxs[2] = {nullptr, nullptr};
        size_t state_ctx_cap[2] = {0, 0};
        int ctx_flip = 0;
        uint64_t params = 0, staged = 0, compute = 0;  // bytes now
    };
    struct Seg {
        placement::Segment plan;
        std::vector<nn::Param*> params;                       // its parameter set
        std::vector<std::pair<nn::Param*, ggml_tensor*>> bind;  // tensors to install while building its graph
        nn::ParamBuffer own;                                  // Device: on the device; Host: host copy; Disk: staged
        ggml_context* twins = nullptr;                        // device twins of a Host segment
        std::vector<std::pair<ggml_tensor*, ggml_tensor*>> copies;  // (twin, host source)
        ggml_backend_buffer_t staged = nullptr;               // Host non-per-eval: its device copy for the phase
        nn::ParamBuffer transient;                            // per-eval Disk: the host buffer read from the file, until uploaded
        int slot = -1;                                        // per-eval: slot index (ring_pos mod K)
        int ring_pos = -1;                                    // per-eval: position in its device's ring
        // its graph's context, kept and reset for every evaluation: the graph's tensors then have
        // the same addresses each time (ggml's CUDA backend keys its CUDA graphs by the first
        // node's address and replays one only for an unchanged graph). Untouched pages of its
        // max_nodes capacity are never committed (ggml_init does not clear the buffer).
        ggml_context* graph_ctx = nullptr;
        size_t graph_nodes = 0;
    };

    Device& device(const std::string& name);
    void install(Seg& s);
    /// Starts an evaluation: counts it and (re)starts the upload rings unless the previous
    /// evaluation of this phase left them running. `wrap`: the next evaluation's leading
    /// segments may be uploaded during this one (an outer phase is open).
    void begin_run(bool wrap);
    /// Ends an evaluation that completed (the rings carry over to the next one in the phase).
    void end_run() { ring_live_ = true; }
    /// Makes segment j's parameters present on its device (a per-eval segment: waits for its
    /// upload, or uploads it now when it was not uploaded ahead); call before building its graph.
    void prepare(size_t j);
    /// Issues the uploads whose slots are free, on every device (call after launching a
    /// segment's compute); after_compute(j) records that segment j has completed first.
    void pump_all();
    void after_compute(size_t j);
    /// Sequence number of per-eval segment s in the current evaluation.
    int64_t seq_of(const Device& d, const Seg& s) const { return run_no_ * (int64_t)d.ring.size() + s.ring_pos; }
    /// Waits for in-flight uploads, frees a Disk segment's host buffer, empties every ring.
    void reset_rings();
    void upload(Seg& s, ggml_backend_t via);
    /// Per-eval Disk segment: reads its parameters from the file into s.transient (host RAM)
    /// and points s.copies at them. Throws as nn::ParamBuffer::load_subset.
    void read_from_disk(Seg& s);
    /// Frees s.transient (after its upload completed).
    void drop_transient(Seg& s);
    void note(Device& d);
    /// Installs made-up parameter tensors (types as load() would choose, data pointer set, no
    /// buffer) so graphs can be built and measured before anything is loaded; restore after.
    void install_fake();
    void restore_fake();

    /// Extra compute bytes of a graph on d: ggml's all-reduce staging on a row-split device.
    uint64_t extra_compute(const Device& d, const ggml_cgraph* gf) const;

    nn::Block& root_;
    std::vector<std::vector<nn::Param*>> blocks_;
    std::vector<nn::Param*> rest_;
    /// The non-block parameters a segment running the prologue (but not the epilogue) loads, and
    /// those a segment running the epilogue (but not the prologue) loads: the epilogue graph's own
    /// (measured from its graph), the prologue everything else (so a shape-dependent prologue
    /// parameter, such as a padding token, is always there). Filled by split_rest(); empty = both
    /// load every non-block parameter.
    std::vector<nn::Param*> pro_rest_, epi_rest_;
    bool rest_split_ = false;
    /// Fills pro_rest_ / epi_rest_ from the tensors the prologue's and the epilogue's graphs read
    /// (the parameters' installed tensors found in them).
    void split_rest(const std::unordered_set<const ggml_tensor*>& prologue_tensors,
                    const std::unordered_set<const ggml_tensor*>& epilogue_tensors);
    /// Every tensor a graph's nodes read (sources and the tensors their views look into).
    static std::unordered_set<const ggml_tensor*> graph_reads(ggml_cgraph* gf);
    uint64_t bytes_of(const std::vector<nn::Param*>& ps) const;
    std::unordered_map<const nn::Param*, std::string> names_;
    const nn::TensorSource& src_;
    nn::LoadOptions opt_;
    int threads_;
    placement::ModulePlan plan_;
    std::vector<Seg> segs_;
    std::map<std::string, std::unique_ptr<Device>> devices_;
    std::map<std::string, uint64_t> peaks_;
    bool loaded_ = false, in_phase_ = false;
    int prefetched_ = 0;
    int64_t run_no_ = -1;   // evaluations begun since load()
    bool wrap_ = false;     // this evaluation may upload the next one's leading segments
    bool ring_live_ = false;  // the rings carry over from the previous evaluation
    int ahead_max_ = 0;
    int transient_seg_ = -1;  // the per-eval Disk segment whose host buffer is alive, or -1
    uint64_t host_now_ = 0, host_peak_ = 0;
    int disk_reads_ = 0;
    ggml_context* fake_ctx_ = nullptr;
    std::vector<std::pair<nn::Param*, ggml_tensor*>> saved_;
    std::shared_ptr<const placement::RowSplitRules> row_rules_;
    std::map<std::string, std::unique_ptr<placement::RowSplitDevice>> row_devs_;  // by "A&B" name
};

/// Raw bytes of one state tensor crossing a segment boundary.
struct StateTensor {
    std::string name;
    ggml_type type = GGML_TYPE_F32;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
};

/// Runs a Sequence<I, S, O> under a plan (see the file comment).
template <class I, class S, class O>
class SequenceRunner : public SegmentExecutor {
public:
    using Seq = nn::Sequence<I, S, O>;
    /// Declares the graph inputs (with host data) and returns the Inputs.
    using InputsFn = std::function<I(GraphBuilder&)>;
    /// Picks the output tensors (read back as F32) from the epilogue's Outputs.
    using SelectFn = std::function<std::vector<ggml_tensor*>(O&)>;

    /// root: the Block owning every parameter of seq (usually the same object).
    SequenceRunner(nn::Block& root, const Seq& seq, const nn::TensorSource& src, nn::LoadOptions opt = {}, int threads = 0,
                   bool flash_attn = false)
        : SegmentExecutor(root, block_sets(seq), src, std::move(opt), threads), seq_(seq), flash_(flash_attn) {}

    /// Costs for the planner: parameter bytes, a measure function building the graph of any
    /// block range at the shapes make_inputs declares (ggml_gallocr_reserve_n_size; nothing is
    /// allocated) and a flops function counting the same graph (runtime::graph_flops). `label`
    /// describes the module in the plan table.
    placement::ModuleCosts costs(InputsFn make_inputs, SelectFn select, std::string label) {
        placement::ModuleCosts c;
        c.label = std::move(label);
        c.block_bytes = block_bytes();
        c.prologue_bytes = rest_bytes();
        split_non_block_params(make_inputs, select);
        if (rest_split_) {
            c.prologue_used_bytes = bytes_of(pro_rest_);
            c.epilogue_used_bytes = bytes_of(epi_rest_);
        }
        c.measure = [this, make_inputs, select](int b, int e, bool pro, bool epi, const std::string& dev) {
            return measure(make_inputs, select, b, e, pro, epi, dev);
        };
        c.flops = [this, make_inputs, select](int b, int e, bool pro, bool epi) { return count_flops(make_inputs, select, b, e, pro, epi); };
        c.state_bytes = [this, make_inputs](int e) { return measure_state(make_inputs, e); };
        if (row_rules_ && row_rules_->why_not.empty()) {
            c.row_split = row_rules_;
            c.row_split_bytes = [this](size_t n) { return row_split_bytes(n); };
            c.row_split_partial_bytes = [this, make_inputs, select](int b, int e) { return measure_partial(make_inputs, select, b, e); };
        } else if (row_rules_) {
            c.row_split = row_rules_;  // why_not says why it cannot apply
        }
        return c;
    }

    /// Finds which non-block parameters the prologue's and the epilogue's graphs read (at the
    /// shapes make_inputs declares), so a segment running only one of them loads only its own
    /// (ModuleCosts::prologue_used_bytes / epilogue_used_bytes). costs() does it; call it before
    /// load() on a runner whose costs came from another runner. Idempotent.
    void split_non_block_params(const InputsFn& make_inputs, const SelectFn& select) {
        if (!rest_split_) find_epilogue_params(make_inputs, select);
    }

    /// One evaluation: prologue, every segment on its device, epilogue; returns the selected
    /// outputs as F32. Throws Error(InvalidInput) when not loaded, Error(OutOfMemory) when a
    /// compute buffer cannot be allocated, Error(Unsupported) for an operation the device lacks.
    std::vector<HostTensor> run(const InputsFn& make_inputs, const SelectFn& select, size_t max_nodes = 32768) {
        if (!loaded_) fail(ErrorKind::InvalidInput, "SequenceRunner::run before load()");
        const bool own_phase = !in_phase_;
        if (own_phase) begin_phase();
        begin_run(!own_phase);
        try {
            auto result = run_segments(make_inputs, select, max_nodes);
            end_run();
            if (own_phase) end_phase();
            return result;
        } catch (...) {
            ring_live_ = false;  // the next evaluation starts the rings again
            throw;
        }
    }

private:
    std::vector<HostTensor> run_segments(const InputsFn& make_inputs, const SelectFn& select, size_t max_nodes) {
        std::vector<StateTensor> state;  // the state on the host (next segment on another device)
        DeviceState dstate;              // or on the device (next segment on the same device)
        std::optional<S> tmpl;
        std::vector<HostTensor> result;
        for (size_t j = 0; j < segs_.size(); ++j) {
            Seg& sg = segs_[j];
            Device& d = device(sg.plan.device);
            prepare(j);
            install(sg);
            if (!sg.graph_ctx || sg.graph_nodes != max_nodes) {
                if (sg.graph_ctx) ggml_free(sg.graph_ctx);
                sg.graph_ctx = Graph::new_ctx(max_nodes);
                sg.graph_nodes = max_nodes;
            }
            Graph g(sg.graph_ctx);
            GraphBuilder gb(g.ctx, d.backend);
            nn::Ctx c{g.ctx, flash_, d.backend};
            S s = sg.plan.prologue ? seq_.prologue(c, make_inputs(gb))
                  : (dstate.ctx && dstate.device == d.name) ? from_device_state(*tmpl, dstate)
                                                            : from_state(gb, *tmpl, state);
            s = seq_.forward_range(c, std::move(s), sg.plan.begin, sg.plan.end);
            std::vector<ggml_tensor*> outs;
            std::vector<std::string> names;
            if (sg.plan.epilogue) {
                O o = seq_.epilogue(c, s);
                for (ggml_tensor* t : select(o)) outs.push_back(as_f32(g.ctx, t));
            } else {
                s.visit_tensors([&](const char* name, ggml_tensor*& t) {
                    names.push_back(name);
                    outs.push_back((t->view_src || !ggml_is_contiguous(t)) ? ggml_cont(g.ctx, t) : t);
                });
                tmpl = s;
            }
            ggml_cgraph* gf = g.graph(outs, max_nodes);
            check_ops(d, gf);
            if (!ggml_gallocr_alloc_graph(d.galloc, gf))
                fail(ErrorKind::OutOfMemory, "cannot allocate the compute buffer on {} for blocks {}-{}", d.name, sg.plan.begin, sg.plan.end);
            d.compute = ggml_gallocr_get_buffer_size(d.galloc, 0) + extra_compute(d, gf);
            note(d);
            for (auto& in : gb.inputs())
                if (in.t->buffer) ggml_backend_tensor_set(in.t, in.bytes.data(), 0, in.bytes.size());
            // a graph without nodes (an epilogue that returns its state as it is, run alone
            // after a row split's meta segment) has nothing to compute: ggml's RPC backend
            // asserts on an empty graph
            ggml_status st = ggml_graph_n_nodes(gf) > 0 ? ggml_backend_graph_compute_async(d.backend, gf) : GGML_STATUS_SUCCESS;
            pump_all();  // uploads into the slots already free, while segment j computes
            ggml_backend_synchronize(d.backend);
            if (st != GGML_STATUS_SUCCESS)
                fail(ErrorKind::Internal, "graph compute on {} failed (status {})", d.name, (int)st);
            after_compute(j);  // segment j's slot is free: the uploads behind it start
            if (sg.plan.epilogue) {
                for (ggml_tensor* t : outs) {
                    HostTensor h;
                    h.name = t->name;
                    for (int k = 0; k < 4; ++k) h.ne[k] = t->ne[k];
                    h.data.resize((size_t)ggml_nelements(t));
                    ggml_backend_tensor_get(t, h.data.data(), 0, h.data.size() * sizeof(float));
                    result.push_back(std::move(h));
                }
            } else if (j + 1 < segs_.size() && segs_[j + 1].plan.device == d.name) {
                // next graph on the same device: copy the state out of the compute buffer (the
                // next graph reuses it) into its own device buffer; no trip through the host
                // (outputs may be input state tensors passed through: free the old state after)
                DeviceState next;
                next.device = d.name;
                next.ctx = state_ctx(d, outs.size());
                for (ggml_tensor* o : outs) next.ts.push_back(ggml_new_tensor(next.ctx, o->type, 4, o->ne));
                if (!place_in_state_buffer(d, next)) {  // no preallocated buffer (or too small): one of its own
                    next.buf = ggml_backend_alloc_ctx_tensors_from_buft(next.ctx, ggml_backend_dev_buffer_type(d.dev));
                    if (!next.buf) {
                        fail(ErrorKind::OutOfMemory, "cannot keep the state between blocks on {}", d.name);
                    }
                    d.staged += ggml_backend_buffer_get_size(next.buf);
                    note(d);
                }
                for (size_t k = 0; k < outs.size(); ++k) ggml_backend_tensor_copy(outs[k], next.ts[k]);
                release(dstate);
                dstate = std::move(next);
            } else {
                release(dstate);
                state.clear();
                for (size_t k = 0; k < outs.size(); ++k) {
                    StateTensor st2;
                    st2.name = names[k];
                    st2.type = outs[k]->type;
                    st2.ne.assign(outs[k]->ne, outs[k]->ne + 4);
                    st2.bytes.resize(ggml_nbytes(outs[k]));
                    ggml_backend_tensor_get(outs[k], st2.bytes.data(), 0, st2.bytes.size());
                    state.push_back(std::move(st2));
                }
            }
        }
        release(dstate);
        return result;
    }

    static std::vector<std::vector<nn::Param*>> block_sets(const Seq& seq) {
        std::vector<std::vector<nn::Param*>> out((size_t)seq.n_blocks());
        for (int i = 0; i < seq.n_blocks(); ++i)
            const_cast<nn::Block&>(seq.block_params(i)).visit_params("", [&](const std::string&, nn::Param& p) { out[(size_t)i].push_back(&p); });
        return out;
    }

    /// A no_alloc context and graph.
    struct Graph {
        ggml_context* ctx = nullptr;
        bool own = true;
        explicit Graph(size_t max_nodes) : ctx(new_ctx(max_nodes)) {}
        /// A kept context (Seg::graph_ctx), emptied for a new graph; not freed here.
        explicit Graph(ggml_context* kept) : ctx(kept), own(false) { ggml_reset(ctx); }
        ~Graph() {
            if (own) ggml_free(ctx);
        }
        Graph(const Graph&) = delete;
        Graph& operator=(const Graph&) = delete;
        static ggml_context* new_ctx(size_t max_nodes) {
            ggml_init_params ip{};
            ip.mem_size = ggml_tensor_overhead() * max_nodes + ggml_graph_overhead_custom(max_nodes, false);
            ip.no_alloc = true;
            ggml_context* c = ggml_init(ip);
            if (!c) fail(ErrorKind::OutOfMemory, "cannot create a graph context for {} nodes", max_nodes);
            return c;
        }
        ggml_cgraph* graph(const std::vector<ggml_tensor*>& outs, size_t max_nodes) {
            ggml_cgraph* gf = ggml_new_graph_custom(ctx, max_nodes, false);
            for (ggml_tensor* o : outs) {
                ggml_set_output(o);
                ggml_build_forward_expand(gf, o);
            }
            return gf;
        }
    };

    static ggml_tensor* as_f32(ggml_context* ctx, ggml_tensor* t) {
        if (!t) fail(ErrorKind::Internal, "SequenceRunner: an output selected is null");
        if (t->type != GGML_TYPE_F32) return ggml_cast(ctx, t, GGML_TYPE_F32);
        if (t->view_src || !ggml_is_contiguous(t)) return ggml_cont(ctx, t);
        return t;
    }

    static void check_ops(Device& d, ggml_cgraph* gf) {
        for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
            ggml_tensor* node = ggml_graph_node(gf, i);
            if (!ggml_backend_supports_op(d.backend, node))
                fail(ErrorKind::Unsupported, "device {} cannot run operation {} ({}) of type {}", d.name, ggml_op_desc(node), node->name,
                     ggml_type_name(node->type));
        }
    }

    /// State tensors kept in a device buffer between two segments on one device.
    struct DeviceState {
        std::string device;
        ggml_context* ctx = nullptr;  // one of the device's state_ctxs (not freed by release)
        ggml_backend_buffer_t buf = nullptr;
        std::vector<ggml_tensor*> ts;
    };
    void release(DeviceState& ds) {
        if (ds.buf) {
            Device& d = device(ds.device);
            d.staged -= std::min<uint64_t>(d.staged, ggml_backend_buffer_get_size(ds.buf));
            ggml_backend_buffer_free(ds.buf);
        }
        ds = DeviceState{};
    }
    /// The device's next state context (ping-pong: the other one may still hold the state
    /// entering the graph just run), emptied, for n tensors.
    static ggml_context* state_ctx(Device& d, size_t n) {
        const int k = d.ctx_flip;
        d.ctx_flip ^= 1;
        if (d.state_ctxs[k] && d.state_ctx_cap[k] >= n) {
            ggml_reset(d.state_ctxs[k]);
            return d.state_ctxs[k];
        }
        if (d.state_ctxs[k]) ggml_free(d.state_ctxs[k]);
        d.state_ctxs[k] = new_state_ctx(n);
        d.state_ctx_cap[k] = n;
        return d.state_ctxs[k];
    }
    /// Places ds's tensors in the device's next ping-pong state buffer (allocated by load()
    /// from the plan's state sizes: no allocation, hence no implicit device synchronisation, per
    /// block). False when there is none or it is too small.
    static bool place_in_state_buffer(Device& d, DeviceState& ds) {
        ggml_backend_buffer_t b = d.state_bufs[d.state_flip];
        if (!b) return false;
        const size_t align = ggml_backend_buffer_get_alignment(b), cap = ggml_backend_buffer_get_size(b);
        size_t off = 0;
        for (ggml_tensor* t : ds.ts) off = (off + align - 1) / align * align + ggml_backend_buffer_get_alloc_size(b, t);
        if (off > cap) return false;
        char* base = (char*)ggml_backend_buffer_get_base(b);
        off = 0;
        for (ggml_tensor* t : ds.ts) {
            off = (off + align - 1) / align * align;
            if (ggml_backend_tensor_alloc(b, t, base + off) != GGML_STATUS_SUCCESS) return false;
            off += ggml_backend_buffer_get_alloc_size(b, t);
        }
        d.state_flip ^= 1;
        return true;
    }
    static ggml_context* new_state_ctx(size_t n) {
        ggml_init_params ip{};
        ip.mem_size = ggml_tensor_overhead() * (n + 1);
        ip.no_alloc = true;
        ggml_context* c = ggml_init(ip);
        if (!c) fail(ErrorKind::OutOfMemory, "cannot create a context for {} state tensors", n);
        return c;
    }
    /// A State of `tmpl`'s structure whose tensors are the (allocated) tensors of `ds`.
    static S from_device_state(const S& tmpl, const DeviceState& ds) {
        S s = tmpl;
        size_t k = 0;
        s.visit_tensors([&](const char* name, ggml_tensor*& t) {
            if (k >= ds.ts.size()) fail(ErrorKind::Internal, "state tensor {} has no value from the previous segment", name);
            t = ds.ts[k++];
        });
        return s;
    }

    /// Bytes of the state entering block e, at the shapes make_inputs declares.
    /// Builds the prologue's and the epilogue's graphs shape-only (the epilogue's state entering
    /// as fresh inputs) and splits the non-block parameters by which of them reads each
    /// (split_rest).
    void find_epilogue_params(const InputsFn& make_inputs, const SelectFn& select) {
        const size_t max_nodes = 32768;
        install_fake();
        struct Restore {
            SequenceRunner* x;
            ~Restore() { x->restore_fake(); }
        } restore{this};
        std::unordered_set<const ggml_tensor*> pro_reads, epi_reads;
        {
            Graph g(max_nodes);
            GraphBuilder gb(g.ctx, nullptr);
            nn::Ctx c{g.ctx, flash_, nullptr};
            S s = seq_.prologue(c, make_inputs(gb));
            std::vector<ggml_tensor*> outs;
            s.visit_tensors([&](const char*, ggml_tensor*& t) { outs.push_back(t); });
            pro_reads = graph_reads(g.graph(outs, max_nodes));
        }
        Graph g(max_nodes);
        GraphBuilder gb(g.ctx, nullptr);
        nn::Ctx c{g.ctx, flash_, nullptr};
        S s = seq_.prologue(c, make_inputs(gb));
        s = seq_.forward_range(c, std::move(s), 0, seq_.n_blocks());
        s.visit_tensors([&](const char* name, ggml_tensor*& t) {
            ggml_tensor* in = ggml_new_tensor(g.ctx, t->type, 4, t->ne);
            ggml_set_name(in, name);
            ggml_set_input(in);
            t = in;
        });
        O o = seq_.epilogue(c, s);
        std::vector<ggml_tensor*> outs;
        for (ggml_tensor* t : select(o)) outs.push_back(as_f32(g.ctx, t));
        epi_reads = graph_reads(g.graph(outs, max_nodes));
        split_rest(pro_reads, epi_reads);
    }

    uint64_t measure_state(const InputsFn& make_inputs, int e) {
        install_fake();
        struct Restore {
            SequenceRunner* x;
            ~Restore() { x->restore_fake(); }
        } restore{this};
        Graph g(32768);
        GraphBuilder gb(g.ctx, nullptr);
        nn::Ctx c{g.ctx, flash_, nullptr};
        S s = seq_.forward_range(c, seq_.prologue(c, make_inputs(gb)), 0, e);
        uint64_t bytes = 0;
        s.visit_tensors([&](const char*, ggml_tensor*& t) { bytes += ggml_nbytes(t); });
        return bytes;
    }

    /// A State of `tmpl`'s structure whose tensors are new inputs holding `state`'s bytes.
    static S from_state(GraphBuilder& gb, const S& tmpl, const std::vector<StateTensor>& state) {
        S s = tmpl;
        size_t k = 0;
        s.visit_tensors([&](const char* name, ggml_tensor*& t) {
            if (k >= state.size()) fail(ErrorKind::Internal, "state tensor {} has no value from the previous segment", name);
            const StateTensor& v = state[k++];
            t = gb.input_raw(v.name, v.type, v.ne, v.bytes);
        });
        if (k != state.size()) fail(ErrorKind::Internal, "state has {} tensors, the previous segment gave {}", k, state.size());
        return s;
    }

    uint64_t measure(const InputsFn& make_inputs, const SelectFn& select, int b, int e, bool pro, bool epi, const std::string& dev) {
        size_t size = 0;
        with_range_graph(make_inputs, select, b, e, pro, epi, [&](ggml_cgraph* gf) {
            ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_dev_buffer_type(device(dev).dev));
            ggml_gallocr_reserve_n_size(ga, gf, nullptr, nullptr, &size);
            ggml_gallocr_free(ga);
        });
        return size;
    }

    /// FLOPs of one evaluation of the graph measure() builds for blocks [b, e) (+ prologue /
    /// epilogue): runtime::graph_flops on it (shapes only; nothing is allocated). Without the
    /// prologue the state enters as inputs, so the blocks before b are not counted.
    double count_flops(const InputsFn& make_inputs, const SelectFn& select, int b, int e, bool pro, bool epi) {
        double flops = 0.0;
        with_range_graph(make_inputs, select, b, e, pro, epi, [&](ggml_cgraph* gf) { flops = graph_flops(gf); });
        return flops;
    }

    /// Row split: bytes of the largest partial sum in the graph of blocks [b, e) (state entering
    /// as inputs, as the meta segment runs them): the output of a MUL_MAT whose weight (through
    /// its views) is a parameter with the Row role, what RowSplitDevice::allreduce_bytes finds on
    /// the loaded graph (ggml's meta device stages one such tensor per all-reduce step).
    uint64_t measure_partial(const InputsFn& make_inputs, const SelectFn& select, int b, int e) {
        uint64_t biggest = 0;
        if (!row_rules_) return 0;
        with_range_graph(make_inputs, select, b, e, false, false, [&](ggml_cgraph* gf) {
            std::unordered_map<const ggml_tensor*, const std::string*> param_of;  // stand-in tensor -> parameter name
            for (auto& [p, name] : names_)
                if (p->tensor) param_of[p->tensor] = &name;
            for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
                const ggml_tensor* node = ggml_graph_node(gf, i);
                if (node->op != GGML_OP_MUL_MAT) continue;
                const ggml_tensor* w = node->src[0];
                while (w && w->view_src) w = w->view_src;
                auto it = w ? param_of.find(w) : param_of.end();
                if (it != param_of.end() && row_rules_->rule(*it->second).role == placement::RowRole::Row)
                    biggest = std::max<uint64_t>(biggest, ggml_nbytes(node));
            }
        });
        return biggest;
    }

    /// Builds the no_alloc graph of blocks [b, e) (+ prologue / epilogue; without the prologue
    /// the state enters as inputs) with stand-in parameters installed, and calls f(graph).
    template <class F>
    void with_range_graph(const InputsFn& make_inputs, const SelectFn& select, int b, int e, bool pro, bool epi, F&& f) {
        const size_t max_nodes = 32768;
        install_fake();
        struct Restore {
            SequenceRunner* x;
            ~Restore() { x->restore_fake(); }
        } restore{this};
        Graph g(max_nodes);
        GraphBuilder gb(g.ctx, nullptr);
        nn::Ctx c{g.ctx, flash_, nullptr};
        S s = seq_.prologue(c, make_inputs(gb));
        if (!pro) {
            s = seq_.forward_range(c, std::move(s), 0, b);
            s.visit_tensors([&](const char* name, ggml_tensor*& t) {
                ggml_tensor* in = ggml_new_tensor(g.ctx, t->type, 4, t->ne);
                ggml_set_name(in, name);
                ggml_set_input(in);
                t = in;
            });
        }
        s = seq_.forward_range(c, std::move(s), b, e);
        std::vector<ggml_tensor*> outs;
        if (epi) {
            O o = seq_.epilogue(c, s);
            for (ggml_tensor* t : select(o)) outs.push_back(as_f32(g.ctx, t));
        } else {
            s.visit_tensors([&](const char*, ggml_tensor*& t) {
                outs.push_back((t->view_src || !ggml_is_contiguous(t)) ? ggml_cont(g.ctx, t) : t);
            });
        }
        f(g.graph(outs, max_nodes));
    }

    const Seq& seq_;
    bool flash_;
};

}  // namespace easel::runtime
