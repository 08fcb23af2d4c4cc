// Block tree: modules whose parameter names mirror checkpoint keys.
//
// A Block declares parameters (name, PyTorch-order shape, role) and named children. The full
// name of a parameter is the dot-joined path from the root: a CLIP layer's query weight is
// "encoder.layers.3.self_attn.q_proj.weight". Loading is then a lookup by name through a
// TensorSource (prefix + key map of the family). Config is inferred from weights before the
// tree is built, so declared shapes are exact and binding checks them.
//
// Tensor layout convention of forward code: ggml order, innermost first. A PyTorch image
// [N, C, H, W] is ne = {W, H, C, N}; a token sequence [N, L, D] is ne = {D, L, N}.
#pragma once

#include "io/weight_index.h"

#include <ggml-backend.h>
#include <ggml.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace easel::nn {

/// What a parameter is; decides the type it is kept in on load.
enum class ParamRole {
    Weight,      ///< matmul weight: kept in the stored type (F16/BF16/quantised) or --type
    ConvWeight,  ///< convolution kernel: F32 or F16 (quantised kernels are dequantised to F16)
    Embedding,   ///< lookup table (ggml_get_rows): stored type, quantised allowed
    Norm,        ///< norm scale/shift: always F32
    Bias,        ///< bias: always F32
};

/// A declared parameter. `tensor` is set by ParamBuffer::load() and stays valid while the
/// ParamBuffer lives.
struct Param {
    std::vector<int64_t> shape;  ///< PyTorch order, outermost first
    ParamRole role = ParamRole::Weight;
    bool optional = false;       ///< absent in the file is not an error (tensor stays nullptr)
    ggml_tensor* tensor = nullptr;
};

/// Base of every module. Non-copyable; children are owned.
class Block {
public:
    Block() = default;
    virtual ~Block() = default;
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;

    /// Declares a parameter named `name` (local, no dots) and returns it; the reference is stable.
    Param& param(const std::string& name, std::vector<int64_t> shape, ParamRole role = ParamRole::Weight,
                 bool optional = false);

    /// Adds an owned child under `name` (may contain dots, e.g. "layers.3") and returns it.
    template <class T, class... A>
    T& add(const std::string& name, A&&... args) {
        auto p = std::make_unique<T>(std::forward<A>(args)...);
        T& ref = *p;
        children_.emplace_back(name, std::move(p));
        return ref;
    }

    /// Calls fn(full_name, param) for every parameter of this subtree, in declaration order.
    void visit_params(const std::string& prefix, const std::function<void(const std::string&, Param&)>& fn);
    void visit_params(const std::string& prefix, const std::function<void(const std::string&, const Param&)>& fn) const;

    /// Number of parameters (declared, present or optional) in this subtree.
    size_t param_count() const;

    /// Calls fn(block) for this block and every descendant, parents first, in declaration order.
    void visit_blocks(const std::function<void(Block&)>& fn);

private:
    std::vector<std::pair<std::string, std::unique_ptr<Param>>> params_;  // declaration order
    std::vector<std::pair<std::string, std::unique_ptr<Block>>> children_;
};

/// How a module's canonical names map to tensors in the files: an optional prefix that stored
/// names carry ("model.diffusion_model.", "text_model."...) and a rename table for layouts that
/// differ (canonical -> stored). Names outside the prefix are not this module's.
class TensorSource {
public:
    explicit TensorSource(const io::WeightIndex& index, std::string prefix = "");

    /// canonical -> stored name override (the stored name is full, prefix not added).
    void rename(const std::string& canonical, const std::string& stored);
    /// A whole-table mapping function applied when no explicit rename exists:
    /// canonical -> stored (without the prefix); return empty to use the canonical name.
    void set_mapper(std::function<std::string(const std::string&)> canonical_to_stored);

    const io::TensorInfo* find(const std::string& canonical) const;
    /// Stored names that belong to this module (start with the prefix).
    std::vector<std::string> stored_names() const;
    const io::WeightIndex& index() const { return *index_; }
    const std::string& prefix() const { return prefix_; }
    /// The stored name a canonical name resolves to.
    std::string stored_name(const std::string& canonical) const;

    /// A parameter whose data are a transform of one stored tensor (loader hook for layouts
    /// that fuse or transpose tensors, e.g. OpenCLIP's fused in_proj_weight [3*D, D]).
    struct Derived {
        std::string stored;       ///< full stored name
        int64_t row_begin = 0;    ///< first row (outermost dim, PyTorch order) taken
        int64_t row_end = -1;     ///< one past the last row; -1 = all rows
        bool transpose = false;   ///< 2-D transpose: stored [a, b] becomes [b, a]
    };
    /// Binds `canonical` to rows [row_begin, row_end) of the outermost dimension of the full
    /// stored name `stored` (no copy: the rows are contiguous in the file). The parameter's
    /// shape is the stored shape with dim 0 = row_end - row_begin. Row bounds are validated
    /// by check_binding (reported as mis-shaped).
    void slice_rows(const std::string& canonical, const std::string& stored, int64_t row_begin, int64_t row_end);
    /// Binds `canonical` to the 2-D transpose of the full stored name `stored` (converted on
    /// the host at load time; e.g. OpenCLIP text_projection [width, proj] -> Linear [proj, width]).
    void transpose(const std::string& canonical, const std::string& stored);
    /// The derivation of `canonical`, or nullptr when it binds one stored tensor as is.
    const Derived* derived(const std::string& canonical) const;

private:
    const io::WeightIndex* index_;
    std::string prefix_;
    std::unordered_map<std::string, std::string> renames_;
    std::function<std::string(const std::string&)> mapper_;
    std::unordered_map<std::string, Derived> derived_;
    std::unordered_map<std::string, io::TensorInfo> derived_info_;  // what find() returns for derived params
};

/// Options of ParamBuffer::load().
struct LoadOptions {
    /// Override the type of Weight-role parameters (sd-cli --type); GGML_TYPE_COUNT keeps the stored type.
    ggml_type weight_type = GGML_TYPE_COUNT;
    /// Names of stored tensors to ignore when reporting unexpected keys (e.g. buffers like position_ids).
    std::vector<std::string> ignore_unexpected_suffixes;
    /// Report stored tensors under the prefix that no parameter uses.
    bool check_unexpected = true;
};

/// Owns the ggml context and backend buffer holding the parameters of one Block subtree.
class ParamBuffer {
public:
    ParamBuffer() = default;
    ~ParamBuffer();
    ParamBuffer(ParamBuffer&&) noexcept;
    ParamBuffer& operator=(ParamBuffer&&) noexcept;

    /// Binds every parameter of `root` to `src`, creates tensors of the chosen types, allocates
    /// them in one buffer of `buft` and copies the data (converting dtype where needed).
    /// Throws Error(ModelMismatch) listing missing, unexpected and mis-shaped keys in one message
    /// (the first few named, counts given); Error(OutOfMemory) if the buffer cannot be allocated.
    static ParamBuffer load(Block& root, const TensorSource& src, ggml_backend_buffer_type_t buft,
                            const LoadOptions& opt = {});

    /// Selects the parameters load_subset() loads: (full name, parameter) -> true to load.
    using ParamFilter = std::function<bool(const std::string&, const Param&)>;
    /// As load(), but only the parameters `keep` selects are created, loaded and bound (the
    /// others keep their tensor pointer). Binding is still checked for the whole tree. For the
    /// placement runtime (one buffer per block range / device / residency).
    static ParamBuffer load_subset(Block& root, const TensorSource& src, ggml_backend_buffer_type_t buft,
                                   const LoadOptions& opt, const ParamFilter& keep);

    /// Creates the tensors of every parameter of `root` in one buffer of `buft` without data
    /// (F32 for every role unless `type_of` says otherwise), for code that fills parameters
    /// itself (tests, generated weights). Optional parameters are created too.
    /// Throws Error(OutOfMemory) if the buffer cannot be allocated.
    static ParamBuffer allocate(Block& root, ggml_backend_buffer_type_t buft,
                                const std::function<ggml_type(const std::string&, const Param&)>& type_of = {});

    /// Bytes of the backend buffer.
    size_t size() const;
    /// The backend buffer (nullptr when empty).
    ggml_backend_buffer_t buffer() const { return buf_; }

private:
    ggml_context* ctx_ = nullptr;
    ggml_backend_buffer_t buf_ = nullptr;
};

/// Reads the stored values of parameter `name` of a tree (declared as `p`, bound by `src` to the
/// stored tensor `info`) into `dst`, a tensor of the type choose_param_type chose, in a backend
/// buffer or in its context's host memory: the source's derivation applied (transpose, row
/// slice), the dtype converted or quantised. The one path by which every module's weights are
/// read from a file, whatever the module and the placement (ParamBuffer::load / load_subset for
/// whole modules and every segment residency, placement::RowSplitDevice for the meta device's
/// buffers): a weight patch merged at load (a LoRA's scale B A added to W) is applied here.
/// Throws as io::WeightIndex::load_into / read_f32, Error(Unsupported) for a quantised type
/// that needs an importance matrix.
void read_param(const TensorSource& src, const std::string& name, const Param& p, const io::TensorInfo& info, ggml_tensor* dst);

/// Checks a Block tree against a source without loading: returns an empty string when
/// everything matches, else the one-line description ParamBuffer::load() would throw.
std::string check_binding(Block& root, const TensorSource& src, const LoadOptions& opt = {});

/// The type a parameter of `role` is kept in, given its stored type and the options.
/// Norm/Bias: F32. ConvWeight: F32 if the stored (or --type) type is F32, else F16.
/// Weight/Embedding: the stored type (F64 -> F32, F8 -> F16), or opt.weight_type; a quantised
/// type whose block size does not divide the row length falls back to a float type.
ggml_type choose_param_type(ParamRole role, const io::TensorInfo& stored, const LoadOptions& opt);

/// Bytes the parameters of `root` will occupy once loaded from `src` with `opt` (sum of
/// ggml_row_size of the chosen types; buffer alignment padding excluded). Parameters absent
/// from the source count 0. For planning: the placement code calls it per block before loading.
uint64_t param_bytes(const Block& root, const TensorSource& src, const LoadOptions& opt = {});

}  // namespace easel::nn
