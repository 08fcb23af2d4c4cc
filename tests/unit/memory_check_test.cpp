// pipeline/memory_check.h: the whole-module needs of a job from the planner's costs, and the
// one-line refusals when a need exceeds host RAM or a device's memory (tryout report F6/F20).
// Numbers are hand-computed from the fake costs below.
#include "core/error.h"
#include "pipeline/memory_check.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using namespace easel;
using placement::PModule;

constexpr uint64_t GiB = 1ull << 30;
constexpr uint64_t MiB = 1ull << 20;

pipeline::MemoryJob job_4096() {
    pipeline::MemoryJob j;
    j.width = j.height = 4096;
    return j;
}

std::string refusal(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
        return e.what();
    }
    return "";
}

TEST(MemoryCheck, RefusalNamesNumbersAndFixes) {
    const auto j = job_4096();
    // 128.25 GiB of compute on the CPU, 23.5 GiB of RAM
    EXPECT_EQ(pipeline::memory_refusal(PModule::Diffusion, "CPU", 0, 128 * GiB + GiB / 4, 23 * GiB + GiB / 2, j),
              "diffusion needs 128.2 GiB on CPU at 4096x4096 (parameters 0.0 GiB + compute 128.2 GiB) but host RAM is 23.5 GiB: "
              "use a smaller -W/-H or --diffusion-fa (flash attention)");
    // flash attention already on: only the size is left
    auto fa = j;
    fa.diffusion_fa = true;
    EXPECT_EQ(pipeline::memory_refusal(PModule::Diffusion, "CUDA0", 2 * GiB, 100 * GiB, 80 * GiB, fa),
              "diffusion needs 102.0 GiB on CUDA0 at 4096x4096 (parameters 2.0 GiB + compute 100.0 GiB) but CUDA0 has 80.0 GiB: "
              "use a smaller -W/-H");
    // the VAE: tiling (or smaller tiles when tiled) and --fa, which is what its attention follows
    EXPECT_EQ(pipeline::memory_refusal(PModule::Vae, "CPU", 0, 256 * GiB, 16 * GiB, j),
              "vae needs 256.0 GiB on CPU at 4096x4096 (parameters 0.0 GiB + compute 256.0 GiB) but host RAM is 16.0 GiB: "
              "use a smaller -W/-H, --vae-tiling or --fa (flash attention)");
    auto tiled = j;
    tiled.vae_tiling = true;
    tiled.flash_attn = true;
    EXPECT_EQ(pipeline::memory_refusal(PModule::Vae, "CPU", 0, 32 * GiB, 16 * GiB, tiled),
              "vae needs 32.0 GiB on CPU at 4096x4096 (parameters 0.0 GiB + compute 32.0 GiB) but host RAM is 16.0 GiB: "
              "use a smaller -W/-H or a smaller --vae-tile-size");
    // the text encoder does not depend on the image size
    EXPECT_EQ(pipeline::memory_refusal(PModule::Te, "CPU", 20 * GiB, GiB, 16 * GiB, j),
              "te needs 21.0 GiB on CPU at 4096x4096 (parameters 20.0 GiB + compute 1.0 GiB) but host RAM is 16.0 GiB: "
              "use a quantised --type (e.g. q8_0)");
}

TEST(MemoryCheck, WholeModuleNeedsSumBlocksAndMeasureTheWholeGraph) {
    placement::ModuleCosts te, unet;
    te.module = PModule::Te;
    te.block_bytes = {10 * MiB, 20 * MiB};
    te.prologue_bytes = 5 * MiB;
    std::string seen;
    te.measure = [&](int b, int e, bool pro, bool epi, const std::string& dev) -> uint64_t {
        seen = dev;
        return (uint64_t)(e - b) * 100 * MiB + (pro ? MiB : 0) + (epi ? 2 * MiB : 0);
    };
    unet.module = PModule::Diffusion;
    unet.block_bytes = {1 * MiB, 1 * MiB, 1 * MiB};
    unet.measure = [](int b, int e, bool, bool, const std::string&) -> uint64_t { return (uint64_t)(e - b) * 7 * MiB; };
    placement::ModuleCosts te2 = te;  // a second cost of the same module (FLUX.1: T5 and CLIP-L) adds to it
    te2.block_bytes = {MiB};
    te2.prologue_bytes = 0;
    const auto needs = pipeline::whole_module_needs({te, unet, te2}, [](PModule) { return std::string("CPU"); });
    ASSERT_EQ(needs.size(), 2u);
    EXPECT_EQ(needs[0].module, PModule::Te);
    EXPECT_EQ(needs[0].device, "CPU");
    EXPECT_EQ(seen, "CPU");
    EXPECT_EQ(needs[0].params, 35 * MiB + MiB);                        // 10 + 20 + 5, then + 1
    EXPECT_EQ(needs[0].compute, (203 * MiB) + (103 * MiB));           // 2 blocks + pro + epi; 1 block + pro + epi
    EXPECT_EQ(needs[1].params, 3 * MiB);
    EXPECT_EQ(needs[1].compute, 21 * MiB);                            // blocks [0, 3) in one graph
}

TEST(MemoryCheck, NeedsFitNamesTheFirstModuleInRunOrderThenTheOthers) {
    const auto j = job_4096();
    std::vector<pipeline::MemoryNeed> needs{{PModule::Te, "CPU", GiB, 0},
                                            {PModule::Diffusion, "CPU", 0, 40 * GiB},
                                            {PModule::Vae, "CPU", 0, 50 * GiB}};
    const auto cap16 = [](const std::string&) -> uint64_t { return 16 * GiB; };
    EXPECT_EQ(refusal([&] { pipeline::check_needs_fit(needs, j, cap16); }),
              "diffusion needs 40.0 GiB on CPU at 4096x4096 (parameters 0.0 GiB + compute 40.0 GiB) but host RAM is 16.0 GiB: "
              "use a smaller -W/-H or --diffusion-fa (flash attention); vae needs 50.0 GiB too: use a smaller -W/-H, --vae-tiling or "
              "--fa (flash attention)");
    // everything fits: no error; an unknown capacity (0) is not checked
    EXPECT_NO_THROW(pipeline::check_needs_fit(needs, j, [](const std::string&) -> uint64_t { return 64 * GiB; }));
    EXPECT_NO_THROW(pipeline::check_needs_fit(needs, j, [](const std::string&) -> uint64_t { return 0; }));
    // exactly at the capacity fits
    EXPECT_NO_THROW(pipeline::check_needs_fit(needs, j, [](const std::string&) -> uint64_t { return 50 * GiB; }));
}

TEST(MemoryCheck, PlansFitHostCountsTheCpuAndHostRamPerStage) {
    const auto j = job_4096();
    placement::ModulePlan te, dit, vae;
    te.module = PModule::Te;
    te.devices = {{.device = "CPU", .params = 2 * GiB, .compute = GiB}};
    dit.module = PModule::Diffusion;
    // weights in host RAM (8 GiB), computed on CUDA0 (not host RAM) and the CPU's 3 GiB of compute
    dit.host_bytes = 8 * GiB;
    dit.devices = {{.device = "CUDA0", .params = 30 * GiB, .compute = 10 * GiB}, {.device = "CPU", .params = 0, .compute = 3 * GiB}};
    vae.module = PModule::Vae;
    vae.devices = {{.device = "CPU", .params = GiB / 2, .compute = 9 * GiB}};
    const std::vector<placement::ModulePlan> plans{te, dit, vae};
    EXPECT_NO_THROW(pipeline::check_plans_fit_host(plans, j, 11 * GiB));  // peaks 3, 11, 9.5
    EXPECT_NO_THROW(pipeline::check_plans_fit_host(plans, j, 0));         // unknown RAM
    EXPECT_EQ(refusal([&] { pipeline::check_plans_fit_host(plans, j, 10 * GiB); }),
              "diffusion needs 11.0 GiB on CPU at 4096x4096 (parameters 8.0 GiB + compute 3.0 GiB) but host RAM is 10.0 GiB: "
              "use a smaller -W/-H or --diffusion-fa (flash attention)");
    // two plans of one stage add (FLUX.1's T5 and CLIP-L: both te)
    placement::ModulePlan clip = te;
    clip.devices[0].params = 5 * GiB;
    EXPECT_NE(refusal([&] { pipeline::check_plans_fit_host({te, clip}, j, 7 * GiB); }).find("te needs 9.0 GiB on CPU"), std::string::npos);
}

}  // namespace
