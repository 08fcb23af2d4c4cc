// Changes to a module's weights that travel with its load options (nn::LoadOptions::patches):
// the seam between the generic load / graph code (nn) and what patches weights (a LoRA set,
// src/lora/apply.h). nn knows only this interface; it never includes lora.
//
// Two forms, decided per parameter (WeightPatches::how):
//  * merged at load: nn::read_param reads the parameter as F32 (PyTorch order, the canonical
//    orientation), calls merge(), and converts the sum to the parameter's type (F16/BF16 rounded,
//    quantised types re-quantised);
//  * at run time: ParamBuffer::load / load_subset create the update's tensors in the same buffer
//    as the weight (so they live, and are freed, moved or streamed with their block) and bind a
//    RuntimeUpdate to Param::runtime; nn::weight_matmul adds RuntimeUpdate::apply's term to the
//    weight's matmul.
#pragma once

#include "nn/block.h"

#include <ggml.h>

#include <array>
#include <cstdint>
#include <memory>
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

/// One tensor a RuntimeUpdate needs in the weight's buffer: ggml ne (innermost first) and F32 values.
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
    /// The tensors of the run-time update of `name` (How::Runtime), to be created in the
    /// weight's buffer.
    virtual std::vector<UpdateTensor> runtime_tensors(const std::string& name) const = 0;
    /// The update over those tensors once created and filled (same order as runtime_tensors).
    virtual std::unique_ptr<RuntimeUpdate> runtime(const std::string& name, std::span<ggml_tensor* const> tensors) const = 0;
    /// Bytes of the run-time tensors of `name` (planning; 0 when it is not patched at run time).
    virtual uint64_t runtime_bytes(const std::string& name, ParamRole role, ggml_type type, bool row_split) const = 0;
};

}  // namespace easel::nn
