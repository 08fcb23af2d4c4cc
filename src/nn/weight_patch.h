// Changes to a module's weights as they load (a LoRA set, src/lora/apply.h): the seam between the
// generic load / graph code (nn) and what patches weights. nn knows only this interface; it never
// includes lora.
//
// A family registers the patches of its modules (register_patches), each patched parameter under
// the location of the stored tensor its TensorSource binds it to (the file, the byte offset and
// size of the data: the same whatever WeightIndex object opened the file, whatever the placement).
// Two forms, decided per parameter (WeightPatches::how):
//  * merged at load: nn::read_param - the one path by which every module's weights are read, in
//    every placement - reads the parameter as F32 (PyTorch order, the canonical orientation),
//    calls merge(), and converts the sum to the parameter's type (F16/BF16 rounded as ggml's
//    converters, quantised types re-quantised);
//  * at run time: ParamBuffer::load / load_subset create the update's tensors in a buffer of the
//    weight's buffer type (so they live on the weight's device and are freed with its buffer)
//    and bind a RuntimeUpdate to the nn::Param; nn::weight_matmul adds its term to the matmul.
#pragma once

#include "io/weight_index.h"
#include "nn/block.h"

#include <ggml-backend.h>
#include <ggml.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace easel::nn {

/// A term added beside one weight's matmul at run time (a LoRA's s B (A x)).
class RuntimeUpdate {
public:
    virtual ~RuntimeUpdate() = default;
    /// Returns y plus the update's contribution for the weight's output rows [row_begin,
    /// row_begin + rows). `weight_first`: y = ggml_mul_mat(w, x) with x {K, M...} and y
    /// {rows, M...} (Linear, 1x1 conv, projections); otherwise y = ggml_mul_mat(x, w) with x {K, M}
    /// and y {M, rows} (Conv2d's im2col columns, K = kw*kh*in in the kernel's order).
    virtual ggml_tensor* apply(ggml_context* ctx, ggml_tensor* x, ggml_tensor* y, int64_t row_begin, int64_t rows,
                               bool weight_first) const = 0;
};

/// One tensor a RuntimeUpdate needs beside its weight: ggml ne (innermost first) and F32 values.
struct UpdateTensor {
    std::array<int64_t, 4> ne{1, 1, 1, 1};
    std::vector<float> data;
};

/// The patches of one module's weights, keyed by the parameters' canonical names (the names
/// in the module's Block tree, which its TensorSource binds).
class WeightPatches {
public:
    virtual ~WeightPatches() = default;

    /// How parameter `name`, kept in `type` after loading, is patched.
    enum class How { None, Merge, Runtime };
    /// `row_split`: the parameter is split over devices on ggml's meta device (which takes no
    /// run-time terms: such a parameter is merged). Only matmul weights (roles Weight and
    /// ConvWeight, which meet their input in weight_matmul) are patched at run time.
    virtual How how(const std::string& name, ParamRole role, ggml_type type, bool row_split) const = 0;
    /// Adds the merged update to `values`, the parameter's F32 values (PyTorch order, its
    /// declared shape). Throws Error(InvalidInput) when the update does not fit.
    virtual void merge(const std::string& name, std::span<float> values) const = 0;
    /// The tensors of the run-time update of `name` (How::Runtime).
    virtual std::vector<UpdateTensor> runtime_tensors(const std::string& name) const = 0;
    /// The update over those tensors once created and filled (same order as runtime_tensors).
    virtual std::unique_ptr<RuntimeUpdate> runtime(const std::string& name, std::span<ggml_tensor* const> tensors) const = 0;
};

/// Where a stored tensor's data lie: the file (its path made absolute and normal), the byte
/// offset and size (a row slice of a fused tensor has its own), whether in the side buffer.
struct StoredKey {
    std::string file;
    uint64_t offset = 0, nbytes = 0;
    bool side = false;
    bool operator<(const StoredKey& o) const;
};
/// The key of `info`, a tensor of `index` (or a TensorSource's derived view of one).
StoredKey stored_key(const io::WeightIndex& index, const io::TensorInfo& info);

/// One registered parameter: its stored location, its patches and its canonical name there.
struct PatchEntry {
    StoredKey key;
    std::shared_ptr<const WeightPatches> patches;
    std::string name;
};

/// Keeps a set of registered patches in force; unregisters them when destroyed.
class PatchRegistration {
public:
    explicit PatchRegistration(uint64_t id) : id_(id) {}
    ~PatchRegistration();
    PatchRegistration(const PatchRegistration&) = delete;
    PatchRegistration& operator=(const PatchRegistration&) = delete;

private:
    uint64_t id_;
};

/// Registers `entries` for every later load of the stored tensors they name (read_param,
/// ParamBuffer::load / load_subset), until the returned handle is destroyed. Throws
/// Error(InvalidInput) when a location is registered already by another live registration (two
/// models with different LoRAs on one file at the same time).
std::unique_ptr<PatchRegistration> register_patches(std::vector<PatchEntry> entries);

/// The patches registered for stored tensor `info` of `index`, with the parameter's canonical
/// name; nullopt when none.
struct FoundPatch {
    std::shared_ptr<const WeightPatches> patches;
    std::string name;
};
std::optional<FoundPatch> find_patch(const io::WeightIndex& index, const io::TensorInfo& info);

/// While alive, read_param on this thread treats parameters as row split (merged, never run-time):
/// placement::RowSplitDevice reads its meta buffer's parameters under one.
class RowSplitReadScope {
public:
    RowSplitReadScope();
    ~RowSplitReadScope();
    RowSplitReadScope(const RowSplitReadScope&) = delete;
    RowSplitReadScope& operator=(const RowSplitReadScope&) = delete;
};

/// The run-time update bound to parameter `p` by the ParamBuffer that loaded it, or nullptr.
const RuntimeUpdate* runtime_update(const Param& p);

namespace detail {
/// ParamBuffer's bookkeeping of run-time updates (param_buffer.cpp): binds `u` to `p`, owned by
/// the ParamBuffer whose backend buffer is `owner`; forgets one parameter; forgets every update
/// of `owner` (its buffer is freed).
void bind_runtime(const Param* p, std::shared_ptr<const RuntimeUpdate> u, ggml_backend_buffer_t owner,
                  std::shared_ptr<void> keep);
void unbind_runtime(const Param* p);
void forget_runtime(ggml_backend_buffer_t owner);
bool row_split_reading();
}  // namespace detail

}  // namespace easel::nn
