// PlacedSequence: any nn::Sequence<I, S, O> run under a placement plan, planned for the job's
// shapes on the first evaluation and again whenever the shapes change. It is what a family
// uses to run a module (UNet, DiT, text encoder) under FamilyOptions::placement; PlacedUNet
// (models/sd/placed_unet.h) is one instance. How a family adopts it: docs/placement.md, "Placing a
// module of a new family".
//
// The caller owns the module's Block tree and its TensorSource (both must outlive the object)
// and describes one evaluation with two callbacks:
//   make_inputs(GraphBuilder&) -> I   declares the graph inputs with their host data,
//   select(O&) -> {ggml_tensor*...}   picks the outputs read back as F32.
// A "shape key" (any int64 vector, e.g. {n, h, w, tokens}) tells when the plan must be redone.
//
// self_contained_costs() gives the planner inputs (placement::ModuleCosts) of a module without
// loading anything, owning everything its measure callbacks touch: what
// models::Family::placement_costs returns.
#pragma once

#include "core/error.h"
#include "core/log.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "runtime/sequence_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace easel::runtime {

/// A Sequence that runs `base`'s prologue and blocks but has its own epilogue (e.g. a hidden
/// state instead of the final norm: Z-Image reads Qwen3's hidden_states[-2], the raw output of
/// the second-to-last layer, from a model built with one layer fewer). `base` must outlive it.
template <class I, class S, class O, class O2>
class EpilogueAdapter : public nn::Sequence<I, S, O2> {
public:
    using Epilogue = std::function<O2(nn::Ctx&, S)>;
    EpilogueAdapter(const nn::Sequence<I, S, O>& base, Epilogue epilogue) : base_(base), epi_(std::move(epilogue)) {}
    int n_blocks() const override { return base_.n_blocks(); }
    S prologue(nn::Ctx& c, const I& in) const override { return base_.prologue(c, in); }
    S block(nn::Ctx& c, int i, S s) const override { return base_.block(c, i, std::move(s)); }
    O2 epilogue(nn::Ctx& c, S s) const override { return epi_(c, std::move(s)); }
    const nn::Block& block_params(int i) const override { return base_.block_params(i); }

private:
    const nn::Sequence<I, S, O>& base_;
    Epilogue epi_;
};

/// Planner inputs of a module that own what their callbacks use: `keep` (the module's Block
/// tree, TensorSource, weight index... whatever root/seq/src live in) and the SequenceRunner
/// the measure and flops functions build graphs with. make_inputs must own its host data (capture by
/// value): it runs whenever the planner measures. Nothing is loaded; measuring builds graphs
/// with stand-in parameter tensors and sizes them with ggml's graph allocator on the device
/// named in each call. `row_split`: the module's tensor-parallel rules (placement/row_split.h)
/// for --split-mode row, or null. Throws Error(ModelMismatch) when the weights do not bind
/// (nn::check_binding: missing, unexpected or mis-shaped tensors), else as SequenceRunner's constructor.
template <class I, class S, class O>
placement::ModuleCosts self_contained_costs(placement::PModule module, std::shared_ptr<void> keep, nn::Block& root,
                                            const nn::Sequence<I, S, O>& seq, const nn::TensorSource& src, nn::LoadOptions lo, int threads,
                                            bool flash_attn, typename SequenceRunner<I, S, O>::InputsFn make_inputs,
                                            typename SequenceRunner<I, S, O>::SelectFn select, std::string label,
                                            std::shared_ptr<const placement::RowSplitRules> row_split = nullptr) {
    using Runner = SequenceRunner<I, S, O>;
    // the file's headers checked against the module as loading will (the same binding): a
    // missing or mis-shaped tensor is reported when the family is costed, before any stage runs
    if (std::string why = nn::check_binding(root, src, lo); !why.empty()) fail(ErrorKind::ModelMismatch, "{}", why);
    auto runner = std::make_shared<Runner>(root, seq, src, std::move(lo), threads, flash_attn);
    if (row_split) runner->set_row_split(std::move(row_split));
    placement::ModuleCosts c = runner->costs(std::move(make_inputs), std::move(select), std::move(label));
    // pair members are destroyed second first: the runner before what it points into
    auto hold = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<Runner>>>(std::move(keep), runner);
    c.measure = [hold, m = c.measure](int b, int e, bool pro, bool epi, const std::string& dev) { return m(b, e, pro, epi, dev); };
    c.flops = [hold, f = c.flops](int b, int e, bool pro, bool epi) { return f(b, e, pro, epi); };
    c.state_bytes = [hold, f = c.state_bytes](int e) { return f(e); };
    if (c.row_split_bytes) c.row_split_bytes = [hold, f = c.row_split_bytes](size_t n) { return f(n); };
    if (c.row_split_partial_bytes) c.row_split_partial_bytes = [hold, f = c.row_split_partial_bytes](int b, int e) { return f(b, e); };
    c.module = module;
    return c;
}

/// A Sequence run under the `module` entry of a placement spec (see the file comment).
template <class I, class S, class O>
class PlacedSequence {
public:
    using Runner = SequenceRunner<I, S, O>;
    using Seq = nn::Sequence<I, S, O>;
    using InputsFn = typename Runner::InputsFn;
    using SelectFn = typename Runner::SelectFn;

    /// root: the Block owning every parameter of seq (often the same object); src/lo: where and
    /// how parameters load (--type); spec: the resolved placement; module: which entry of it;
    /// stream: stream the blocks (--stream-layers; the spec's flag applies to the diffusion
    /// module). root, seq and src are kept by reference: they must outlive this object.
    PlacedSequence(nn::Block& root, const Seq& seq, const nn::TensorSource& src, nn::LoadOptions lo, placement::PModule module,
                   placement::PlacementSpec spec, int threads, bool flash_attn)
        : root_(root), seq_(seq), src_(src), lo_(std::move(lo)), module_(module), spec_(std::move(spec)), threads_(threads),
          flash_(flash_attn) {}

    /// The plan for one evaluation at the shapes make_inputs declares, without loading anything.
    /// Throws Error(OutOfMemory) with the planner's message when it does not fit.
    placement::ModulePlan plan(const InputsFn& make_inputs, const SelectFn& select, const std::string& label) {
        auto r = make_runner();
        auto costs = r->costs(make_inputs, select, label);
        costs.module = module_;
        placement::ModulePlan p = placement::plan_module(module_, spec_[module_], module_ == placement::PModule::Diffusion && spec_.stream_layers,
                                                         costs, placement::resolve_budgets(spec_, placement::list_devices()));
        p.stage = placement::pmodule_name(module_);
        return p;
    }

    /// One evaluation. `shape` keys the plan: on the first call the module is planned (the table
    /// logged), loaded and, inside a phase, staged; for a new shape it is planned again and
    /// reloaded only when the segments differ (same layout: the loaded weights are kept and the
    /// plan's compute/state bytes become the larger of the two). Returns the selected outputs as F32 host tensors. Throws as plan() and
    /// SequenceRunner::run().
    std::vector<HostTensor> run(const std::vector<int64_t>& shape, const InputsFn& make_inputs, const SelectFn& select,
                                         const std::string& label) {
        if (!runner_ || shape != shape_) {
            auto it = plans_.find(shape);
            if (it == plans_.end()) it = plans_.emplace(shape, plan(make_inputs, select, label)).first;
            const placement::ModulePlan& p = it->second;
            if (runner_ && same_layout(p, runner_->plan())) {
                // same segments, devices and residencies (e.g. the positive and the negative
                // prompt of CFG, captions of different lengths): keep the loaded weights; the
                // compute buffer grows as needed, the prediction is the larger of the two
                widen(plan_, p);
            } else {
                if (runner_) {
                    for (auto& [d, b] : runner_->peaks()) peaks_[d] = std::max(peaks_[d], b);
                    runner_.reset();
                }
                plan_ = p;
                log::info("placement plan for the {} module:\n{}", placement::pmodule_name(module_), placement::format_plan({plan_}));
                runner_ = make_runner();
                runner_->split_non_block_params(make_inputs, select);  // as the costs' runner did
                runner_->load(plan_);
                if (phase_) runner_->begin_phase();
            }
            shape_ = shape;
        }
        return runner_->run(make_inputs, select);
    }

    /// The plan in use (no segments before the first run()).
    const placement::ModulePlan& current_plan() const { return plan_; }
    /// Measured peaks per device since construction (runners freed when shapes changed
    /// included); empty before the first run().
    std::map<std::string, uint64_t> peaks() const {
        auto p = peaks_;
        if (runner_)
            for (auto& [d, b] : runner_->peaks()) p[d] = std::max(p[d], b);
        return p;
    }
    /// A phase lasts from construction (or begin_phase()) to end_phase(): Host weights are staged
    /// and Disk weights read once for every run() inside it.
    void begin_phase() {
        phase_ = true;
        if (runner_) runner_->begin_phase();
    }
    void end_phase() {
        phase_ = false;
        if (runner_) runner_->end_phase();
    }
    /// --split-mode row: the module's tensor-parallel rules (placement/row_split.h), applied to
    /// every runner made after this call (the next plan). Without rules a row split falls back to
    /// layer split with a warning.
    void set_row_split(std::shared_ptr<const placement::RowSplitRules> rules) { row_rules_ = std::move(rules); }
    /// Segments whose upload overlapped the previous compute (devices with events).
    int prefetched_uploads() const { return runner_ ? runner_->prefetched_uploads() : 0; }

    /// True when a and b have the same segments (device, block range, residency, per-eval) and
    /// runtime devices: a runner loaded for one can run the other.
    static bool same_layout(const placement::ModulePlan& a, const placement::ModulePlan& b) {
        if (a.segments.size() != b.segments.size() || a.devices.size() != b.devices.size()) return false;
        for (size_t i = 0; i < a.segments.size(); ++i) {
            const placement::Segment &x = a.segments[i], &y = b.segments[i];
            if (x.device != y.device || x.begin != y.begin || x.end != y.end || x.residency != y.residency || x.per_eval != y.per_eval)
                return false;
        }
        for (size_t i = 0; i < a.devices.size(); ++i)
            if (a.devices[i].device != b.devices[i].device) return false;
        return true;
    }
    /// p's compute and state bytes raised to q's where larger (same layout).
    static void widen(placement::ModulePlan& p, const placement::ModulePlan& q) {
        for (size_t i = 0; i < p.segments.size(); ++i) {
            p.segments[i].compute_bytes = std::max(p.segments[i].compute_bytes, q.segments[i].compute_bytes);
            p.segments[i].state_bytes = std::max(p.segments[i].state_bytes, q.segments[i].state_bytes);
        }
        for (size_t i = 0; i < p.devices.size(); ++i) {
            p.devices[i].compute = std::max(p.devices[i].compute, q.devices[i].compute);
            p.devices[i].state = std::max(p.devices[i].state, q.devices[i].state);
        }
    }

private:
    std::unique_ptr<Runner> make_runner() {
        auto r = std::make_unique<Runner>(root_, seq_, src_, lo_, threads_, flash_);
        if (row_rules_) r->set_row_split(row_rules_);
        return r;
    }

    nn::Block& root_;
    const Seq& seq_;
    const nn::TensorSource& src_;
    nn::LoadOptions lo_;
    placement::PModule module_;
    placement::PlacementSpec spec_;
    int threads_;
    bool flash_;
    std::unique_ptr<Runner> runner_;
    placement::ModulePlan plan_;
    std::vector<int64_t> shape_;
    std::map<std::vector<int64_t>, placement::ModulePlan> plans_;  // plans made so far, by shape
    bool phase_ = true;  // a phase lasts while the module is loaded
    std::shared_ptr<const placement::RowSplitRules> row_rules_;
    std::map<std::string, uint64_t> peaks_;
};

}  // namespace easel::runtime
