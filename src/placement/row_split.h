// Row split (--split-mode row): tensor parallelism inside each block on ggml's meta device
// (ggml-backend.h: ggml_backend_meta_device(devs, n, get_split_state, ud)).
//
// How ggml's meta device works (third_party/ggml/ggml/src/ggml-backend-meta.cpp):
//  * a parameter ("static") tensor allocated in a meta buffer asks the split-state callback for
//    its axis: a slice along ggml axis 0..3 per device (optionally in segments, for fused
//    tensors), MIRRORED (a full copy on every device) or PARTIAL;
//  * every compute tensor gets its state from its sources (ggml's rules per op): a matmul of a
//    weight split along ggml axis 1 (its output rows) with a mirrored activation gives an
//    output split along axis 0; a matmul of a weight split along axis 0 (its input columns)
//    with an activation split the same way gives a PARTIAL sum;
//  * graph_compute cuts the graph after each PARTIAL node and all-reduces it: NCCL on CUDA where
//    the backend offers "ggml_backend_comm_allreduce_tensor", otherwise ggml's fallback (copies
//    between the backends + ADD graphs, a butterfly over log2(n) steps): that fallback is what
//    runs over RPC devices and CPU devices.
//
// The rules (Megatron-style): in a transformer block the Q/K/V projections and the first
// feed-forward Linear(s) split their OUTPUT features ("column" role; bias split the same way);
// the attention output projection and the second feed-forward Linear split their INPUT features
// ("row" role: partial sums, all-reduced; bias mirrored, added after the reduction). Head
// projections are split on whole heads. Everything else (norms, modulation, convolutions,
// embeddings) is mirrored. The rules are per layer type and role inside a block of a known
// module (RowSplitPattern), applied to the module's Block tree.
//
// Limits of ggml's meta device that decide what can run (quoted from ggml-backend-meta.cpp):
//  * ops without sources (GGML_OP_ARANGE in timestep embeddings) have no split state:
//    handle_generic() ends in GGML_ASSERT(ret.axis != GGML_BACKEND_SPLIT_AXIS_UNKNOWN) — so the
//    prologue and epilogue of a module run on the first device as ordinary graphs and only the
//    blocks run on the meta device (the state crosses as host bytes, as in layer split);
//  * soft_max with a mask on split heads: handle_generic() needs equal states on all sources
//    (a mirrored mask vs split scores aborts) — the modules split here use no mask;
//  * views into a fused projection at offsets along the split axis (FLUX single blocks'
//    linear1 -> q, k, v, mlp) are not expressible: handle_view() keeps the source's state;
//  * a matmul of a split weight with GQA heads (Hq != Hkv) in the non-flash path asserts
//    equal states (split_states_equal) — modules with GQA are not split.
#pragma once

#include "nn/block.h"
#include "placement/plan.h"

#include <ggml-backend.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace easel::placement {

/// The tensor-parallel role of one parameter.
enum class RowRole {
    Mirror,  ///< a full copy on every device
    Column,  ///< Linear weight [out, in] split along out (ggml axis 1); its bias along ggml axis 0
    Row,     ///< Linear weight [out, in] split along in (ggml axis 0): partial sums; bias mirrored
};
/// "mirror", "column", "row".
const char* row_role_name(RowRole r);

/// The rule of one parameter.
struct RowSplitRule {
    RowRole role = RowRole::Mirror;
    int64_t granule = 1;  ///< slices are multiples of this many features (head size for head projections)
    int segments = 1;     ///< the split dimension holds this many equal parts split one by one (fused GEGLU [value | gate]: 2)
    /// The parts are told to ggml's meta device as one part repeated `segments` times (split
    /// state nr) instead of as `segments` parts: the same slices, but a view of one whole part
    /// (a row range of the weight, e.g. one D-wide chunk of a fused projection) keeps a split
    /// state the meta device can follow. For weights the graph reads part by part.
    bool repeat = false;
};

/// One per-layer rule: a Linear whose path inside a block ends in `linear` (".weight" / ".bias"
/// of it), e.g. "attn1.to_q" or "feed_forward.w2".
struct RowSplitPattern {
    std::string linear;
    RowRole role = RowRole::Column;
    int64_t granule = 1;
    int segments = 1;
    bool repeat = false;  ///< as RowSplitRule::repeat
};

/// The rules of one module: parameter (full canonical name) -> rule; parameters not listed are
/// mirrored. `why_not` is non-empty when the module cannot be row split (then it runs as layer
/// split with a warning).
struct RowSplitRules {
    std::string module;  ///< e.g. "Z-Image DiT"
    std::unordered_map<std::string, RowSplitRule> by_param;
    std::string why_not;
    /// The most devices the split can spread over: the fewest whole units (granule x segments)
    /// of any split parameter (e.g. the key/value heads of a Qwen3 layer), since every device
    /// needs at least one unit of each; 0 = no split parameter. The planner falls back to layer
    /// split over more devices.
    int64_t max_devices = 0;
    std::string max_devices_param;  ///< the parameter that sets max_devices
    const RowSplitRule& rule(const std::string& name) const;
};

/// Applies `patterns` to the parameters of blocks `blocks` (each a Block subtree of `root`,
/// e.g. Sequence::block_params(i)): a Linear whose path relative to its block ends in a
/// pattern's `linear` gets the pattern's rule for its weight (and its bias: Column -> same
/// split, Row -> mirrored). Every parameter is checked against its declared shape: the split
/// dimension must divide into granule x segments units (RowSplitRules::max_devices = the fewest
/// units). A pattern may also name a 2-D table that is not a Linear but is split the same way,
/// e.g. T5's relative_attention_bias [buckets, heads] as Row (its heads, ggml axis 0).
std::shared_ptr<RowSplitRules> make_row_split_rules(std::string module, const nn::Block& root, const std::vector<const nn::Block*>& blocks,
                                                    const std::vector<RowSplitPattern>& patterns);

/// Features per device of a split dimension of `n` features: whole units of `granule`, spread
/// as evenly as possible (the first devices get one more unit when they do not divide).
/// Throws Error(Internal) when n is not a multiple of granule.
std::vector<int64_t> split_features(int64_t n, int64_t granule, size_t n_devices);

/// The meta split state of a parameter tensor `t` (ggml ne order) under `rule` over n devices.
/// `block` is the weight type's block size (axis-0 slices of quantised types must be whole
/// blocks). Returns false (and leaves `out` unset) when the slices cannot be made whole units.
bool split_state_of(const ggml_tensor* t, const RowSplitRule& rule, size_t n_devices, ggml_backend_meta_split_state& out);

/// Bytes each device holds of a parameter of type `type` and PyTorch shape `shape` under `rule`
/// (ggml_row_size of its slice; a mirrored parameter costs its full size on every device).
std::vector<uint64_t> slice_bytes(ggml_type type, const std::vector<int64_t>& shape, const RowSplitRule& rule, size_t n_devices);

/// A meta device over `devices` (ggml names) whose split-state callback answers from a table
/// tensor -> state that the loader fills (RowSplitDevice::load). One object per loaded module.
class RowSplitDevice {
public:
    /// Throws Error(InvalidInput) for an unknown device name or fewer than 2 devices,
    /// Error(Unsupported) for more than GGML_BACKEND_META_MAX_DEVICES.
    RowSplitDevice(std::vector<std::string> devices, std::shared_ptr<const RowSplitRules> rules);
    ~RowSplitDevice();
    RowSplitDevice(const RowSplitDevice&) = delete;
    RowSplitDevice& operator=(const RowSplitDevice&) = delete;

    ggml_backend_dev_t device() const { return meta_; }
    const std::vector<std::string>& devices() const { return names_; }
    const RowSplitRules& rules() const { return *rules_; }

    /// Loads `params` (full name -> Param of `root`) from `src` into one meta buffer: split
    /// parameters as slices on each device, the others mirrored. Sets Param::tensor. Throws as
    /// nn::ParamBuffer::load (ModelMismatch, OutOfMemory) and Error(Internal) when a rule cannot
    /// be applied to the loaded type (quantised slices of partial blocks).
    void load(nn::Block& root, const nn::TensorSource& src, const nn::LoadOptions& opt, const std::vector<std::string>& params);

    /// Bytes of the parameter buffer (the largest device's share, alignment included), 0 before load.
    uint64_t param_buffer_bytes() const;
    /// Bytes of ggml's all-reduce staging buffers on each device for graph `gf`: one tensor of
    /// the largest partial sum (a matmul with a row-role weight) per reduction step
    /// (ceil(log2(devices)), ggml_backend_meta_graph_compute's fallback; NCCL needs none).
    uint64_t allreduce_bytes(const ggml_cgraph* gf) const;
    /// Predicted parameter bytes per device from the rules (before alignment).
    const std::vector<uint64_t>& predicted_param_bytes() const { return predicted_; }

private:
    static ggml_backend_meta_split_state callback(const ggml_tensor* t, void* ud);

    std::vector<std::string> names_;
    std::vector<ggml_backend_dev_t> devs_;
    std::shared_ptr<const RowSplitRules> rules_;
    ggml_backend_dev_t meta_ = nullptr;
    std::unordered_map<const ggml_tensor*, ggml_backend_meta_split_state> states_;
    ggml_context* ctx_ = nullptr;
    ggml_backend_buffer_t buf_ = nullptr;
    std::vector<uint64_t> predicted_;
};

/// Plans `module` as a row split over place.devices (>= 2): the prologue and the epilogue on
/// the first device, blocks [0, n) as one graph on the meta device (segment device name
/// "A&B&..."). Per device: its slices + mirrored block parameters + the compute buffer of the
/// blocks' graph (every device allocates the whole graph's buffer) + the all-reduce staging
/// buffer (ceil(log2 n) tensors of the largest partial sum: ModuleCosts::row_split_partial_bytes,
/// else the state between blocks); the first device adds the prologue/epilogue parameters (one copy, shared by the two
/// graphs: SegmentExecutor::load) and their compute.
/// Parameters must be on the devices (Residency::Device). Throws Error(OutOfMemory) like
/// plan_module when a device's total exceeds its budget.
ModulePlan plan_row_split(PModule module, const ModulePlacement& place, const ModuleCosts& costs,
                          const std::map<std::string, uint64_t>& budgets);

/// True when `device` names a row-split meta device ("A&B&...").
bool is_row_split_device(const std::string& device);
/// The simple devices of a row-split device name.
std::vector<std::string> row_split_members(const std::string& device);

}  // namespace easel::placement
