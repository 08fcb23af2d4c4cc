// --auto-fit (placement/autofit.h): the user's explicit entries survive planning, a device list
// longer than a module's blocks is named as such, and the plan's flags name each device once in
// --max-vram. Synthetic devices and module sizes, as tests/unit/autofit_test.cpp; each test
// failed before its fix (issue 9: "Explicit --backend / --params-backend entries are kept and
// the planner fills in the rest").
#include "core/error.h"
#include "core/strings.h"
#include "placement/autofit.h"
#include "placement/spec.h"

#include <gtest/gtest.h>

#include <string>

using namespace easel;
using namespace easel::placement;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;

/// `n` blocks of `block` bytes, `pro` outside them, a `comp`-byte compute buffer for any range,
/// `state` bytes between blocks.
FitModule module(PModule m, int n, uint64_t block, uint64_t pro, uint64_t comp, uint64_t state = 0) {
    FitModule f;
    f.module = m;
    f.costs.module = m;
    f.costs.label = pmodule_name(m);
    f.costs.block_bytes.assign((size_t)n, block);
    f.costs.prologue_bytes = pro;
    f.costs.measure = [comp](int, int, bool, bool, const std::string&) { return comp; };
    if (state) f.costs.state_bytes = [state](int) { return state; };
    return f;
}

FitDevice dev(const std::string& name, const std::string& type, uint64_t budget, uint64_t max_alloc = 0) {
    FitDevice d;
    d.name = name;
    d.type = type;
    d.budget = budget;
    d.max_alloc = max_alloc;
    return d;
}

const FitChoice& choice(const FitResult& r, PModule m) {
    for (auto& c : r.choices)
        if (c.module == m) return c;
    throw std::runtime_error("no choice for module");
}

/// Occurrences of `needle` in `s`.
int count(const std::string& s, const std::string& needle) {
    int n = 0;
    for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
    return n;
}

}  // namespace

// A device the planner caps (a 2 GiB max allocation lowers Vulkan0's budget, written as a
// --max-vram cap) that the user's --max-vram also names ("vulkan0=8", by prefix and in lower
// case): the flags name it once, with the planner's cap; the user's other entries stay.
// Before: "vulkan0=8,CPU=30,Vulkan0=5.xx" (the device twice).
TEST(AutoFitFlags, MaxVramNamesEachDeviceOnce) {
    FitRequest req;
    req.devices = {dev("CPU", "cpu", 30 * GiB), dev("Vulkan0", "gpu", 8 * GiB, 2 * GiB)};
    req.modules = {module(PModule::Te, 24, 416 * MiB, 64 * MiB, 100 * MiB, 8 * MiB), module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 200 * MiB, 16 * MiB)};
    req.max_vram = "vulkan0=8,CPU=30";
    FitResult r = auto_fit(req);
    EXPECT_EQ(count(ascii_lower(r.flags.max_vram), "vulkan0"), 1) << r.flags.max_vram;
    EXPECT_EQ(r.flags.max_vram.find("vulkan0=8"), std::string::npos) << r.flags.max_vram;
    EXPECT_NE(r.flags.max_vram.find("CPU=30"), std::string::npos) << r.flags.max_vram;
    EXPECT_EQ(count(r.flags_line, "--max-vram"), 1);
    PlacementSpec spec = parse_placement(r.flags, {{"CPU", "cpu", false}, {"Vulkan0", "gpu", false}});
    ASSERT_TRUE(spec.max_vram_gib.count("Vulkan0"));
    EXPECT_LT(spec.max_vram_gib.at("Vulkan0"), 8.0);
    EXPECT_DOUBLE_EQ(spec.max_vram_gib.at("CPU"), 30.0);
}