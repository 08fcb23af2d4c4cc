// --auto-fit (placement/autofit.h): the user's explicit entries survive planning, a device list
// longer than a module's blocks is named as such, and the plan's flags name each device once in
// --max-vram. Synthetic devices and module sizes, as tests/unit/autofit_test.cpp; each test
// failed before its fix (issue 9: "Explicit --backend / --params-backend entries are kept and
// the planner fills in the rest").
#include "core/error.h"
#include "core/strings.h"
#include "placement/autofit.h"
#include "placement/spec.h"
#include "autofit_test_support.h"

#include <gtest/gtest.h>

#include <string>

using namespace easel;
using namespace easel::placement;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;

using test_support::fit_choice;
using test_support::fit_module;

/// A device (test_support::fit_device) whose largest single buffer is `max_alloc` bytes (0: unlimited).
FitDevice dev(const std::string& name, const std::string& type, uint64_t budget, uint64_t max_alloc = 0) {
    FitDevice d = test_support::fit_device(name, type, budget);
    d.max_alloc = max_alloc;
    return d;
}

/// Occurrences of `needle` in `s`.
int count(const std::string& s, const std::string& needle) {
    int n = 0;
    for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
    return n;
}

}  // namespace

// CPU only, te pinned to disk (--params-backend te=disk): the CPU tier must read te's weights
// from the file (params "disk"), as the user said. Before: the CPU tier planned params "" (in
// RAM) and the flags line lost the entry.
TEST(AutoFitFlags, DiskParamsKeptOnTheCpuTier) {
    FitRequest req;
    req.devices = {dev("CPU", "cpu", 16 * GiB)};
    req.modules = {fit_module(PModule::Te, 4, 100 * MiB, 10 * MiB, 20 * MiB, MiB), fit_module(PModule::Diffusion, 6, 200 * MiB, 10 * MiB, 50 * MiB, MiB)};
    req.pinned_params[(size_t)PModule::Te] = std::string(kDisk);
    FitResult r = auto_fit(req);
    EXPECT_EQ(fit_choice(r, PModule::Te).tier, Tier::Cpu);
    EXPECT_EQ(fit_choice(r, PModule::Te).plan.params_location, kDisk);
    EXPECT_EQ(r.flags.params_backend, "te=disk");
    // the flags parse back to the same placement
    PlacementSpec spec = parse_placement(r.flags, {{"CPU", "cpu", false}});
    EXPECT_EQ(spec[PModule::Te].params, kDisk);
    EXPECT_EQ(spec[PModule::Diffusion].params, "");
}

// diffusion pinned to two devices with its weights in host RAM (--backend "diffusion=RPC0&RPC1"
// --params-backend diffusion=cpu): a layer split whose ranges are staged from RAM. Before: the
// layer-split tier skipped modules with pinned host weights, every other tier skipped the
// device list, and the job failed with "nothing fits diffusion: no device can run it".
TEST(AutoFitFlags, HostParamsKeptWithAPinnedDeviceList) {
    FitRequest req;
    req.devices = {dev("CPU", "cpu", 16 * GiB), dev("RPC0", "gpu", 2 * GiB), dev("RPC1", "gpu", 2 * GiB)};
    req.modules = {fit_module(PModule::Diffusion, 8, 200 * MiB, 10 * MiB, 50 * MiB, MiB)};
    req.pinned_devices[(size_t)PModule::Diffusion] = {"RPC0", "RPC1"};
    req.pinned_params[(size_t)PModule::Diffusion] = std::string("CPU");
    FitResult r = auto_fit(req);
    const FitChoice& d = fit_choice(r, PModule::Diffusion);
    EXPECT_EQ(d.tier, Tier::LayerSplit);
    ASSERT_EQ(d.plan.devices.size(), 2u);
    EXPECT_EQ(d.plan.devices[0].device, "RPC0");
    EXPECT_EQ(d.plan.devices[1].device, "RPC1");
    EXPECT_EQ(d.plan.params_location, "CPU");
    EXPECT_EQ(d.plan.host_bytes, 8 * 200 * MiB + 2 * 10 * MiB);  // every block, the rest with the first and the last range
    EXPECT_EQ(r.flags.backend, "diffusion=RPC0&RPC1");
    EXPECT_EQ(r.flags.params_backend, "diffusion=CPU");
}

// --backend "vae=RPC0&RPC1" (a VAE decoder list the runtime accepts when named): kept as a
// layer split. Before: tier 4 took only diffusion and te, and the VAE failed with "no device".
TEST(AutoFitFlags, PinnedVaeListIsALayerSplit) {
    FitRequest req;
    req.devices = {dev("CPU", "cpu", 16 * GiB), dev("RPC0", "gpu", 2 * GiB), dev("RPC1", "gpu", 2 * GiB)};
    req.modules = {fit_module(PModule::Diffusion, 8, 100 * MiB, 10 * MiB, 50 * MiB, MiB), fit_module(PModule::Vae, 18, 5 * MiB, 2 * MiB, 300 * MiB, 4 * MiB)};
    req.pinned_devices[(size_t)PModule::Vae] = {"RPC0", "RPC1"};
    FitResult r = auto_fit(req);
    const FitChoice& v = fit_choice(r, PModule::Vae);
    EXPECT_EQ(v.tier, Tier::LayerSplit);
    ASSERT_EQ(v.plan.devices.size(), 2u);
    EXPECT_NE(r.flags.backend.find("vae=RPC0&RPC1"), std::string::npos) << r.flags.backend;
    // an unpinned VAE is never split by the planner (its need is its compute buffer)
    FitRequest free = req;
    free.pinned_devices[(size_t)PModule::Vae].clear();
    FitResult r2 = auto_fit(free);
    EXPECT_EQ(fit_choice(r2, PModule::Vae).plan.devices.size(), 1u);
}

// Entries for modules the planner is not given (a family that does not cost its VAE or te in
// this build, a ControlNet) are kept. Before: the plan's flags replaced the user's flags and
// named only the planned modules, so "--backend vae=RPC1 --params-backend controlnet=disk" was
// dropped.
TEST(AutoFitFlags, EntriesOfModulesNotPlannedAreKept) {
    FitRequest req;
    req.devices = {dev("CPU", "cpu", 16 * GiB), dev("RPC0", "gpu", 4 * GiB), dev("RPC1", "gpu", 4 * GiB)};
    req.modules = {fit_module(PModule::Diffusion, 8, 100 * MiB, 10 * MiB, 50 * MiB, MiB)};
    req.pinned_devices[(size_t)PModule::Vae] = {"RPC1"};
    req.pinned_params[(size_t)PModule::ControlNet] = std::string(kDisk);
    FitResult r = auto_fit(req);
    EXPECT_EQ(r.flags.backend, "diffusion=RPC0,vae=RPC1");
    EXPECT_EQ(r.flags.params_backend, "controlnet=disk");
}

// A pinned list longer than the module's blocks (te of 2 blocks on three devices): the error
// names the blocks and the list, as an input error. Before: "nothing fits te: no device can
// run it; try a quantised --type or other devices" (an out-of-memory message).
TEST(AutoFitFlags, TooManyPinnedDevicesNamesTheBlocks) {
    FitRequest req;
    req.devices = {dev("CPU", "cpu", 16 * GiB), dev("RPC0", "gpu", 4 * GiB), dev("RPC1", "gpu", 4 * GiB), dev("RPC2", "gpu", 4 * GiB)};
    req.modules = {fit_module(PModule::Te, 2, 10 * MiB, MiB, 20 * MiB, MiB), fit_module(PModule::Diffusion, 8, 100 * MiB, 10 * MiB, 50 * MiB, MiB)};
    req.pinned_devices[(size_t)PModule::Te] = {"RPC0", "RPC1", "RPC2"};
    try {
        auto_fit(req);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << e.what();
        const std::string msg = e.what();
        EXPECT_NE(msg.find("has 2 block(s) to split"), std::string::npos) << msg;
        EXPECT_NE(msg.find("RPC0&RPC1&RPC2"), std::string::npos) << msg;
        EXPECT_EQ(msg.find("nothing fits"), std::string::npos) << msg;
    }
    // unpinned, three devices for a 2-block module: sets larger than the blocks are not tried, the
    // job plans (te whole on one device)
    req.pinned_devices[(size_t)PModule::Te].clear();
    FitResult r = auto_fit(req);
    EXPECT_EQ(fit_choice(r, PModule::Te).plan.devices.size(), 1u);
}

// A device the planner caps (a 2 GiB max allocation lowers Vulkan0's budget, written as a
// --max-vram cap) that the user's --max-vram also names ("vulkan0=8", by prefix and in lower
// case): the flags name it once, with the planner's cap; the user's other entries stay.
// Before: "vulkan0=8,CPU=30,Vulkan0=5.xx" (the device twice).
TEST(AutoFitFlags, MaxVramNamesEachDeviceOnce) {
    FitRequest req;
    req.devices = {dev("CPU", "cpu", 30 * GiB), dev("Vulkan0", "gpu", 8 * GiB, 2 * GiB)};
    req.modules = {fit_module(PModule::Te, 24, 416 * MiB, 64 * MiB, 100 * MiB, 8 * MiB), fit_module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 200 * MiB, 16 * MiB)};
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

// parse_placement keeps what --params-backend named before clearing an entry that names the
// module's own runtime device: on a CPU-only machine "diffusion=cpu" is "" in `params` (the
// default device is the CPU) but params_given says CPU, which --auto-fit keeps when it runs
// the module on an RPC device (weights in host RAM). Before, auto-fit saw "" and kept the
// weights on the RPC device.
TEST(AutoFitFlags, ParamsGivenSurvivesTheRuntimeDeviceNormalisation) {
    const std::vector<DeviceName> names{{"CPU", "cpu", false}, {"RPC0[127.0.0.1:1]", "gpu", true}};
    PlacementFlags f;
    f.params_backend = "diffusion=cpu,te=disk";
    PlacementSpec spec = parse_placement(f, names);
    EXPECT_EQ(spec[PModule::Diffusion].params, "");  // the same as not giving it, for the runtime
    ASSERT_TRUE(spec.params_given[(size_t)PModule::Diffusion].has_value());
    EXPECT_EQ(*spec.params_given[(size_t)PModule::Diffusion], "CPU");
    EXPECT_EQ(*spec.params_given[(size_t)PModule::Te], kDisk);
    EXPECT_FALSE(spec.params_given[(size_t)PModule::Vae].has_value());
    f.params_backend.clear();
    f.offload_to_cpu = true;  // = "*=cpu" first
    spec = parse_placement(f, names);
    for (int i = 0; i < kModuleCount; ++i) EXPECT_EQ(spec.params_given[(size_t)i].value_or("?"), "CPU") << i;
}
