// Helpers of the --auto-fit tests (autofit_flags_test.cpp, autofit_row_split_test.cpp,
// autofit_speed_test.cpp): the synthetic modules and devices a FitRequest
// (placement/autofit.h) is built from, and the plan's choice for one module.
#pragma once

#include "placement/autofit.h"
#include "placement/spec.h"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace easel::test_support {

/// A synthetic module for a FitRequest: `n` blocks of `block` bytes, `pro` bytes outside them
/// (prologue/epilogue weights), a compute buffer of `comp` bytes for any block range (ggml's
/// allocator reuses memory across blocks, so a range's buffer is about one block's) and, when
/// `state` is not 0, `state` bytes handed between blocks. evals and flops_per_eval keep
/// FitModule's defaults (1, 0); row-split rules are left out.
inline placement::FitModule fit_module(placement::PModule m, int n, uint64_t block, uint64_t pro, uint64_t comp, uint64_t state = 0) {
    placement::FitModule f;
    f.module = m;
    f.costs.module = m;
    f.costs.label = placement::pmodule_name(m);
    f.costs.block_bytes.assign((size_t)n, block);
    f.costs.prologue_bytes = pro;
    f.costs.measure = [comp](int, int, bool, bool, const std::string&) { return comp; };
    if (state) f.costs.state_bytes = [state](int) { return state; };
    return f;
}

/// A device of a FitRequest: `name` as the placement flags write it (CPU, CUDA0, RPC1), `type`
/// ("cpu" or "gpu"), `budget` bytes; the other fields (max_alloc, flops, h2d_bytes_per_s) at
/// FitDevice's defaults (0: not limited / not measured).
inline placement::FitDevice fit_device(const std::string& name, const std::string& type, uint64_t budget) {
    placement::FitDevice d;
    d.name = name;
    d.type = type;
    d.budget = budget;
    return d;
}

/// The choice of module `m` in an auto_fit result; throws std::runtime_error when the result
/// has none (the test then fails naming it).
inline const placement::FitChoice& fit_choice(const placement::FitResult& r, placement::PModule m) {
    for (auto& c : r.choices)
        if (c.module == m) return c;
    throw std::runtime_error("no choice for module " + std::string(placement::pmodule_name(m)));
}

}  // namespace easel::test_support
