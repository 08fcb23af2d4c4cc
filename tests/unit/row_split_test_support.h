// Helpers of the --split-mode row tests (row_split_test.cpp: Z-Image DiT and SD UNet;
// te_row_split_test.cpp: Qwen3 and T5; autofit_row_split_test.cpp's max_abs_diff): a module
// planned, loaded and run under a placement, and the largest element-wise difference of two outputs.
#pragma once

#include "placement/plan.h"
#include "placement/spec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace easel::test_support {

/// max |a[i] - b[i]| over two outputs of the same size (a size mismatch is a test failure and
/// gives INFINITY).
inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    if (a.size() != b.size()) return INFINITY;
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

/// One run of a module under a placement: its first output (flattened, ggml order), the plan it
/// ran under and the measured peak bytes per device (SequenceRunner::peaks).
struct RunResult {
    std::vector<float> out;
    placement::ModulePlan plan;
    std::map<std::string, uint64_t> peaks;
};

/// Plans module `m` on `devices` with split `mode` (placement::plan_module, costs measured by the
/// runner `r` (a runtime::SequenceRunner) at the inputs `mk` makes, outputs chosen by `sel`),
/// loads it and runs it twice in one phase: the second run on the same buffers must give the same
/// bits (a test failure naming `label` otherwise). Returns the first run's output, the plan and
/// the peaks.
template <class Runner, class Mk, class Sel>
RunResult run_planned(Runner& r, placement::PModule m, const std::vector<std::string>& devices, placement::SplitMode mode, Mk mk, Sel sel,
                      const char* label) {
    placement::ModulePlacement place;
    place.devices = devices;
    place.split = mode;
    RunResult res;
    res.plan = placement::plan_module(m, place, false, r.costs(mk, sel, label), {});
    r.load(res.plan);
    r.begin_phase();
    auto o1 = r.run(mk, sel);
    auto o2 = r.run(mk, sel);
    r.end_phase();
    EXPECT_EQ(o1.at(0).data, o2.at(0).data) << label;
    res.out = o1.at(0).data;
    res.peaks = r.peaks();
    return res;
}

}  // namespace easel::test_support
