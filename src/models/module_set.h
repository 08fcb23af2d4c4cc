// ModuleSet: the one home of a family's module lifecycle (load, unload, placement bookkeeping).
//
// A family (models::Family) is made of modules (te, diffusion, vae decoder, vae encoder; an
// upscaler or a second text encoder later). What every module needs besides its own network is
// the same for every family: it loads whole on one device, or under a placement plan when
// placement flags are given; it is freed when its stage is done, and its plans and measured
// peaks are kept for the closing memory line; its parameter bytes, the largest compute buffer
// measured for it, and its planner inputs (placement::ModuleCosts) are reported. A family
// registers one ModuleSlot per module with hooks that say only what is its own (how to build
// and load the module whole, how to build it placed, what it costs, which files it reads), and
// ModuleSet implements the rest once. models::FamilyBase (family_base.h) routes the Family
// interface to it.
//
// Adding a cross-cutting feature to every module (a LoRA merged at load, a new residency) is a
// change here or in the load path the hooks call (nn::ParamBuffer / nn::load_param), not in the
// families; adding a module kind to a family is one more add() call.
#pragma once

#include "core/error.h"
#include "io/diffusers.h"
#include "models/family.h"
#include "placement/plan.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace easel::models {

/// Where one module's weights come from: a file or folder and the flag that named it.
struct ModuleSource {
    std::string path;  ///< file or folder (a pipeline folder's component folder); empty = not given
    std::string flag;  ///< "-m", "--diffusion-model", "--vae", "--clip_l" ...; empty when not given
    std::string arg;   ///< the flag's argument as given (for -m DIR: DIR, not the component folder)
    bool empty() const { return path.empty(); }
    /// "--vae ae.safetensors", "-m DIR": the flag and its argument, as messages name a source;
    /// "" when no flag gave it.
    std::string named() const { return flag.empty() ? std::string() : flag + " " + arg; }
};

/// One source a family reads, for resolve_sources(): the diffusers component folder that holds it
/// in a pipeline folder (-m DIR), and the file flag that names it alone.
struct SourceRule {
    const char* component = "";                 ///< "unet", "transformer", "vae", "text_encoder", "text_encoder_2"
    std::string ModelFiles::*file = nullptr;    ///< the ModelFiles field of its own flag (&ModelFiles::vae); null: none
    const char* flag = "";                      ///< that flag ("--vae")
};

/// The sources of a family's modules, as resolve_sources() finds them.
struct ResolvedSources {
    std::vector<ModuleSource> sources;                 ///< one per rule, in the rules' order
    std::vector<io::PipelineComponent> components;     ///< the -m folder's components (empty for a file)
    std::string pipeline_class;                        ///< model_index.json's _class_name (folders)
    bool folder = false;                               ///< -m is a diffusers pipeline folder
    std::string model;                                 ///< -m as given (empty when not given)
    std::vector<std::string> rule_components;          ///< each rule's component name (for require())
    std::string model_desc;  ///< "diffusers folder X", the -m file, else the --diffusion-model file (for describe())
    /// A -m folder's scheduler/scheduler_config.json (nullopt when absent or not a folder).
    std::optional<nlohmann::json> scheduler_config;
    /// A -m folder's tokenizer/tokenizer.json when it is a regular file, else "".
    std::string tokenizer_json;

    /// The -m folder's component `name`, or nullptr (absent, or -m is not a folder).
    const io::PipelineComponent* component(const std::string& name) const;

    /// Refuses a pipeline folder without the component of rule `i` (the diffusion model's) when no
    /// flag gave it either: Error(ModelMismatch) "-m DIR: this diffusers pipeline (CLASS) has no
    /// COMPONENT folder; WHO have one", `who` e.g. "SD1.x/SD2.x pipelines".
    void require(size_t i, const std::string& who) const;
};

/// The sources precedence every family uses (sd-cli's): -m (a diffusers pipeline folder: each
/// rule's component folder; a single file: every rule's source is that file; the flag "-m"),
/// then each rule's own flag. Of a folder it reads model_index.json and the scheduler's
/// scheduler_config.json; no weight file is opened. Throws Error(Io) / Error(InvalidInput) for an
/// unreadable or malformed model_index.json, Error(InvalidInput) for a malformed scheduler config.
ResolvedSources resolve_sources(const ModelFiles& files, std::span<const SourceRule> rules);

/// A module whose kind has no placed form (ModuleSlot's default Placed type).
struct Unplaced {
    std::vector<placement::ModulePlan> plans() const { return {}; }
    std::map<std::string, uint64_t> peaks() const { return {}; }
};

/// Max-merges peak bytes per device: a[d] = max(a[d], b[d]).
void merge_peaks(std::map<std::string, uint64_t>& a, const std::map<std::string, uint64_t>& b);

/// What a module slot is and does, whatever the family (see ModuleSlot<Whole, Placed>).
class ModuleSlotBase {
public:
    /// Which files the module reads (fingerprints, cache keys: Family::module_files).
    using FilesFn = std::function<std::vector<std::string>()>;
    /// Planner inputs of the module for one evaluation on a latent of h x w cells at the job's
    /// shapes, without loading anything (what Family::placement_costs lists; a module of several
    /// networks, FLUX.1's T5 + CLIP-L, gives one entry each; none when its file is absent).
    using CostsFn = std::function<std::vector<placement::ModuleCosts>(int64_t h, int64_t w)>;

    explicit ModuleSlotBase(Module m) : module_(m) {}
    virtual ~ModuleSlotBase() = default;
    ModuleSlotBase(const ModuleSlotBase&) = delete;
    ModuleSlotBase& operator=(const ModuleSlotBase&) = delete;

    Module module() const { return module_; }
    /// True while the module is loaded (whole, or placed: a placed module loads its weights on
    /// its first run, when the plan's shapes are known).
    virtual bool loaded() const = 0;
    /// True while the module is loaded under a placement plan.
    virtual bool placed_now() const = 0;
    /// Loads the module when it is not loaded: placed when `placement` (FamilyOptions::placement
    /// given) and the slot has a placed form that applies, else whole. Throws what the hooks throw.
    virtual void load(bool placement) = 0;
    /// Frees the module (no-op when not loaded); the plans and peaks of a placed module that ran
    /// are kept (plans()/peaks() report them after).
    virtual void unload() = 0;
    /// Parameter bytes of the loaded module (whole: its buffers; placed: what the plan loaded,
    /// 0 for kinds that do not report it); 0 when not loaded.
    virtual size_t param_bytes() const = 0;

    /// The largest compute buffer measured for the module so far, in bytes.
    size_t compute_bytes() const { return compute_; }
    /// Raises compute_bytes() to `bytes` (a run's measured compute buffer).
    void note_compute(size_t bytes) { compute_ = std::max(compute_, bytes); }
    /// The counter itself, for code that raises it (vae::ExecOptions::compute_bytes).
    size_t* compute_counter() { return &compute_; }

    /// The plans of the placed module in use, else those kept from its last placed run (empty
    /// when it never ran placed).
    std::vector<placement::ModulePlan> plans() const;
    /// Measured peak bytes per device: those kept from earlier loads max-merged with the
    /// placed module's own.
    std::map<std::string, uint64_t> peaks() const;
    /// Records a run made outside a placed object under the placement flags (TAESD runs whole
    /// on the vae entry's first device): its plan replaces the kept plans, its peak on `device`
    /// is max-merged into the kept peaks.
    void keep_run(placement::ModulePlan plan, const std::string& device, uint64_t peak);

    /// The files the module reads ({} without a files hook).
    std::vector<std::string> files() const { return files_ ? files_() : std::vector<std::string>{}; }
    /// The module's planner inputs ({} without a costs hook: not placeable, or costed elsewhere).
    std::vector<placement::ModuleCosts> costs(int64_t h, int64_t w) const { return costs_ ? costs_(h, w) : std::vector<placement::ModuleCosts>{}; }

protected:
    /// The placed module's current plans (those with segments) and peaks; empty when not placed.
    virtual std::vector<placement::ModulePlan> current_plans() const = 0;
    virtual std::map<std::string, uint64_t> current_peaks() const = 0;
    /// Copies the placed module's plans and peaks to the kept ones when it ran (unload()).
    void keep_current();

    FilesFn files_;
    CostsFn costs_;

private:
    Module module_;
    size_t compute_ = 0;
    std::vector<placement::ModulePlan> kept_plans_;
    std::map<std::string, uint64_t> kept_peaks_;
};

/// A module slot holding the family's own types: `Whole`, the module loaded on one device (a
/// struct of the family owning its network, parameters and runner; it must have
/// `size_t param_bytes() const`), and `Placed`, the module under a placement plan (a
/// runtime::PlacedSequence, a PlacedVaeDecoder ... or a family struct of several; it must have
/// `peaks()`, and either `plans()` or `current_plan()`; `param_bytes()` when it reports one).
template <class Whole, class Placed = Unplaced>
class ModuleSlot final : public ModuleSlotBase {
public:
    /// What the family says about the module. Only load_whole is required.
    struct Hooks {
        /// Builds and loads the module whole on its device (reads headers, checks them, loads weights).
        std::function<std::unique_ptr<Whole>()> load_whole;
        /// Builds the module under FamilyOptions::placement (headers only: the weights load on the
        /// first run). Empty: the module always runs whole.
        std::function<std::unique_ptr<Placed>()> load_placed;
        /// When set and true, the module runs whole even under placement flags (TAESD decoders).
        std::function<bool()> whole_under_placement;
        FilesFn files;
        CostsFn costs;
    };

    ModuleSlot(Module m, Hooks h) : ModuleSlotBase(m), hooks_(std::move(h)) {
        files_ = std::move(hooks_.files);
        costs_ = std::move(hooks_.costs);
        if (!hooks_.load_whole) fail(ErrorKind::Internal, "module slot {}: no load_whole hook", module_name(m));
    }

    /// The module loaded whole, or nullptr.
    Whole* whole() const { return whole_.get(); }
    /// The module loaded under a placement plan, or nullptr.
    Placed* placed() const { return placed_.get(); }

    bool loaded() const override { return whole_ || placed_; }
    bool placed_now() const override { return placed_ != nullptr; }
    void load(bool placement) override {
        if (loaded()) return;
        const bool whole_anyway = hooks_.whole_under_placement && hooks_.whole_under_placement();
        if (placement && hooks_.load_placed && !whole_anyway) placed_ = hooks_.load_placed();
        else whole_ = hooks_.load_whole();
    }
    void unload() override {
        whole_.reset();
        keep_current();
        placed_.reset();
    }
    size_t param_bytes() const override {
        if (whole_) return whole_->param_bytes();
        if constexpr (requires(const Placed& p) { p.param_bytes(); }) {
            if (placed_) return placed_->param_bytes();
        }
        return 0;
    }

protected:
    std::vector<placement::ModulePlan> current_plans() const override {
        if (!placed_) return {};
        if constexpr (requires(const Placed& p) { p.plans(); }) {
            return placed_->plans();
        } else {
            const placement::ModulePlan& c = placed_->current_plan();
            if (c.segments.empty()) return {};
            return {c};
        }
    }
    std::map<std::string, uint64_t> current_peaks() const override { return placed_ ? placed_->peaks() : std::map<std::string, uint64_t>{}; }

private:
    Hooks hooks_;
    std::unique_ptr<Whole> whole_;
    std::unique_ptr<Placed> placed_;
};

/// A family's module slots, in the order the pipeline runs them (te, diffusion, vae decoder,
/// vae encoder): the order of placement_costs(), placement_plans() and the memory lines.
class ModuleSet {
public:
    /// Registers module m. Throws Error(Internal) when m is registered already.
    template <class Whole, class Placed = Unplaced>
    ModuleSlot<Whole, Placed>& add(Module m, typename ModuleSlot<Whole, Placed>::Hooks hooks) {
        if (find(m)) fail(ErrorKind::Internal, "module {} registered twice", module_name(m));
        auto s = std::make_unique<ModuleSlot<Whole, Placed>>(m, std::move(hooks));
        auto& r = *s;
        slots_.push_back(std::move(s));
        return r;
    }

    /// The slot of module m, or nullptr when the family has none.
    ModuleSlotBase* find(Module m) const;
    /// The slot of module m. Throws Error(Unsupported) "FAMILY has no MODULE module" when absent.
    ModuleSlotBase& at(Module m, const std::string& family) const;

    /// Loads module m (placed when `placement`, see ModuleSlotBase::load) and logs its size.
    void load(Module m, bool placement, const std::string& family);
    /// Frees module m (no-op when absent or not loaded).
    void unload(Module m);
    bool loaded(Module m) const;
    size_t param_bytes(Module m) const;
    size_t compute_bytes(Module m) const;
    /// The files of module m ({} when absent).
    std::vector<std::string> files(Module m) const;

    /// Every slot's costs for a latent of h x w cells, in slot order; the te slot left out when
    /// `skip_te` (Family::set_costs_skip_te).
    std::vector<placement::ModuleCosts> costs(int64_t h, int64_t w, bool skip_te) const;
    /// Every slot's plans (in use or kept), in slot order.
    std::vector<placement::ModulePlan> plans() const;
    /// Every slot's peaks, max-merged per device.
    std::map<std::string, uint64_t> peaks() const;

private:
    std::vector<std::unique_ptr<ModuleSlotBase>> slots_;
};

}  // namespace easel::models
