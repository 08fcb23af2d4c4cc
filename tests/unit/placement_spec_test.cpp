// Placement flag parsing: sd-cli examples (stable-diffusion.cpp docs/backend.md and
// docs/placement.md) parsed to the expected assignments; malformed specs rejected.
#include "core/error.h"
#include "placement/spec.h"

#include <gtest/gtest.h>

// the cases name only the flags they set (designated initialisers)
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

using namespace easel;
using namespace easel::placement;

namespace {

const std::vector<DeviceName> kDevs = {
    {"CPU", "cpu", false},
    {"CUDA0", "gpu", false},
    {"CUDA1", "gpu", false},
    {"Vulkan0", "gpu", false},
    {"RPC0[127.0.0.1:50052]", "gpu", true},
    {"RPC1[127.0.0.1:50053]", "gpu", true},
};
const std::vector<DeviceName> kCpuOnly = {{"CPU", "cpu", false}};

// "diffusion te vae controlnet upscaler" devices and params, compactly: "dev|params" per module
std::string summary(const PlacementSpec& s) {
    std::string out;
    for (auto& m : s.modules) {
        std::string d;
        for (auto& x : m.devices) d += (d.empty() ? "" : "&") + x;
        out += (out.empty() ? "" : " ") + d + (m.params.empty() ? "" : "|" + m.params);
    }
    return out;
}

struct Case {
    PlacementFlags flags;
    std::string expected;  // summary()
};

}  // namespace

TEST(PlacementSpec, SdCliExamplesParseToTheExpectedAssignments) {
    const std::string R0 = "RPC0[127.0.0.1:50052]", R1 = "RPC1[127.0.0.1:50053]";
    std::vector<Case> cases = {
        // no flags: every module on the default device (first local GPU, never RPC)
        {{}, "CUDA0 CUDA0 CUDA0 CUDA0 CUDA0"},
        {{.backend = "cpu"}, "CPU CPU CPU CPU CPU"},
        {{.backend = "te=cpu,vae=cuda0,diffusion=vulkan0"}, "Vulkan0 CPU CUDA0 CUDA0 CUDA0"},
        {{.backend = "cuda0", .params_backend = "te=cpu,vae=cpu"}, "CUDA0 CUDA0|CPU CUDA0|CPU CUDA0 CUDA0"},
        {{.backend = "cuda0", .params_backend = "disk"}, "CUDA0|disk CUDA0|disk CUDA0|disk CUDA0|disk CUDA0|disk"},
        {{.backend = "all=cuda0,te=cpu"}, "CUDA0 CPU CUDA0 CUDA0 CUDA0"},
        // module entries win over a default regardless of order
        {{.backend = "te=cpu,*=cuda1"}, "CUDA1 CPU CUDA1 CUDA1 CUDA1"},
        {{.backend = "diffusion=cuda0&cuda1"}, "CUDA0&CUDA1 CUDA0 CUDA0 CUDA0 CUDA0"},
        {{.backend = "diffusion=RPC0&RPC1"}, "" + R0 + "&" + R1 + " CUDA0 CUDA0 CUDA0 CUDA0"},
        // the VAE decoder is a block sequence too: a named list splits it, a default list does not
        {{.backend = "vae=RPC0&RPC1"}, "CUDA0 CUDA0 " + R0 + "&" + R1 + " CUDA0 CUDA0"},
        // a default device list gives single-device modules its first device
        {{.backend = "cuda1&cuda0"}, "CUDA1&CUDA0 CUDA1&CUDA0 CUDA1 CUDA1 CUDA1"},
        {{.backend = "diffusion=cuda0,te=cpu,vae=cpu", .params_backend = "diffusion=cuda0,te=cpu,vae=cpu"}, "CUDA0 CPU CPU CUDA0 CUDA0"},
        // aliases, case, '-'/'_' in module names, unique prefixes of device names
        {{.backend = "CLIP=Cpu,First_Stage=vulk,UNet=cuda1"}, "CUDA1 CPU Vulkan0 CUDA0 CUDA0"},
        {{.backend = "gpu"}, "CUDA0 CUDA0 CUDA0 CUDA0 CUDA0"},
        {{.backend = "auto,te=default"}, "CUDA0 CUDA0 CUDA0 CUDA0 CUDA0"},
        // the last entry of a key wins
        {{.backend = "te=cuda1,te=cpu"}, "CUDA0 CPU CUDA0 CUDA0 CUDA0"},
        // legacy flags prepend entries, explicit entries override them
        {{.clip_on_cpu = true, .vae_on_cpu = true}, "CUDA0 CPU CPU CUDA0 CUDA0"},
        {{.backend = "te=cuda1", .clip_on_cpu = true}, "CUDA0 CUDA1 CUDA0 CUDA0 CUDA0"},
        {{.offload_to_cpu = true}, "CUDA0|CPU CUDA0|CPU CUDA0|CPU CUDA0|CPU CUDA0|CPU"},
        {{.params_backend = "te=disk", .offload_to_cpu = true}, "CUDA0|CPU CUDA0|disk CUDA0|CPU CUDA0|CPU CUDA0|CPU"},
        // params on the runtime device itself = resident (no staging)
        {{.backend = "cuda0", .params_backend = "cuda0"}, "CUDA0 CUDA0 CUDA0 CUDA0 CUDA0"},
        {{.backend = "diffusion=cuda0", .params_backend = "diffusion=cuda1"}, "CUDA0|CUDA1 CUDA0 CUDA0 CUDA0 CUDA0"},
        {{.params_backend = "diffusion=auto"}, "CUDA0 CUDA0 CUDA0 CUDA0 CUDA0"},
    };
    for (auto& c : cases) {
        SCOPED_TRACE("--backend '" + c.flags.backend + "' --params-backend '" + c.flags.params_backend + "'");
        auto s = parse_placement(c.flags, kDevs);
        EXPECT_EQ(summary(s), c.expected);
    }
    // CPU-only machine: the default device is the CPU
    EXPECT_EQ(summary(parse_placement({}, kCpuOnly)), "CPU CPU CPU CPU CPU");
}

TEST(PlacementSpec, SplitModeVramHeadroomAndStreaming) {
    auto s = parse_placement({.backend = "diffusion=cuda0&cuda1,te=cuda0&cuda1", .split_mode = "diffusion=row,te=layer"}, kDevs);
    EXPECT_EQ(s[PModule::Diffusion].split, SplitMode::Row);
    EXPECT_EQ(s[PModule::Te].split, SplitMode::Layer);
    EXPECT_TRUE(s.warnings.empty());  // row split is decided per module by the planner (placement/row_split.h)
    s = parse_placement({.split_mode = "ROW"}, kDevs);
    EXPECT_EQ(s[PModule::Vae].split, SplitMode::Row);
    EXPECT_TRUE(s.warnings.empty());  // single-device modules: nothing to split

    s = parse_placement({.backend = "diffusion=cuda0,vae=vulkan0", .max_vram = "cuda0=6,vulkan0=2.5"}, kDevs);
    EXPECT_EQ(s.max_vram_gib.at("CUDA0"), 6.0);
    EXPECT_EQ(s.max_vram_gib.at("Vulkan0"), 2.5);
    EXPECT_FALSE(s.max_vram_all_gib);
    s = parse_placement({.max_vram = "-0.5"}, kDevs);
    EXPECT_EQ(*s.max_vram_all_gib, -0.5);
    s = parse_placement({.max_vram = "15"}, kDevs);
    EXPECT_EQ(*s.max_vram_all_gib, 15.0);
    s = parse_placement({.max_vram = "RPC0=0.25"}, kDevs);
    EXPECT_EQ(s.max_vram_gib.at("RPC0[127.0.0.1:50052]"), 0.25);

    s = parse_placement({.headroom = "512"}, kDevs);
    EXPECT_EQ(*s.headroom_all_mib, 512.0);
    s = parse_placement({.headroom = "cuda1=300,cpu=0"}, kDevs);
    EXPECT_EQ(s.headroom_mib.at("CUDA1"), 300.0);
    EXPECT_EQ(s.headroom_mib.at("CPU"), 0.0);

    s = parse_placement({.backend = "cuda0", .params_backend = "diffusion=cpu", .stream_layers = true}, kDevs);
    EXPECT_TRUE(s.stream_layers);
    EXPECT_EQ(s[PModule::Diffusion].params, "CPU");
    s = parse_placement({.backend = "cuda0", .stream_layers = true}, kDevs);
    EXPECT_FALSE(s.stream_layers);  // params on the device: ignored with a warning
    ASSERT_EQ(s.warnings.size(), 1u);
    EXPECT_NE(s.warnings[0].find("--stream-layers"), std::string::npos);
}

TEST(PlacementSpec, MalformedSpecsAreRejectedWithOneLineErrors) {
    struct Bad {
        PlacementFlags flags;
        std::string needle;  // part of the message
    };
    std::vector<Bad> bad = {
        {{.backend = "cuda7"}, "unknown device 'cuda7'"},
        {{.backend = "cuda"}, "ambiguous (CUDA0, CUDA1)"},
        {{.backend = "rpc"}, "ambiguous"},
        {{.backend = "disk"}, "parameter location"},
        {{.backend = "te=disk"}, "--params-backend te=disk"},
        {{.backend = "controlnet=cuda0&cuda1"}, "only diffusion, te and vae"},
        {{.backend = "upscaler=cuda0&cuda1"}, "only diffusion, te and vae"},
        {{.backend = "diffusion=cuda0&cuda0"}, "appears twice"},
        {{.backend = "diffusion=cuda0&"}, "empty device name"},
        {{.backend = "photomaker=cpu"}, "does not exist in easel"},
        {{.backend = "foo=cpu"}, "unknown module 'foo'"},
        {{.backend = "te=cpu,,vae=cpu"}, "empty entry"},
        {{.backend = "=cpu"}, "no name before '='"},
        {{.backend = "te=cpu=vae"}, "two '='"},
        {{.params_backend = "diffusion=cuda0&cuda1"}, "device list"},
        {{.params_backend = "te=nvme"}, "--params-backend: unknown device 'nvme'"},
        {{.split_mode = "column"}, "not layer or row"},
        {{.split_mode = "unet=diagonal"}, "not layer or row"},
        {{.max_vram = "lots"}, "not a number"},
        {{.max_vram = "cuda0=6GB"}, "not a number"},
        {{.max_vram = "cuda9=6"}, "--max-vram: unknown device"},
        {{.headroom = "-5"}, "negative"},
        {{.headroom = "cuda0="}, "has no number"},
    };
    for (auto& b : bad) {
        try {
            parse_placement(b.flags, kDevs);
            ADD_FAILURE() << "accepted: backend '" << b.flags.backend << "' params '" << b.flags.params_backend << "' split '"
                          << b.flags.split_mode << "' vram '" << b.flags.max_vram << "' headroom '" << b.flags.headroom << "'";
        } catch (const Error& e) {
            std::string m = e.what();
            EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
            EXPECT_NE(m.find(b.needle), std::string::npos) << m;
            EXPECT_EQ(m.find('\n'), std::string::npos) << m;
        }
    }
    EXPECT_THROW(parse_placement({.backend = "gpu"}, kCpuOnly), Error);
}

TEST(PlacementSpec, ModuleNamesAndDescribe) {
    EXPECT_EQ(parse_pmodule("t5xxl"), PModule::Te);
    EXPECT_EQ(parse_pmodule("Text-Encoders"), PModule::Te);
    EXPECT_EQ(parse_pmodule("tae"), PModule::Vae);
    EXPECT_EQ(parse_pmodule("esrgan"), PModule::Upscaler);
    EXPECT_EQ(parse_pmodule("control"), PModule::ControlNet);
    EXPECT_EQ(parse_pmodule("dit"), PModule::Diffusion);
    auto s = parse_placement({.backend = "diffusion=cuda0&cuda1,te=cpu", .params_backend = "vae=disk"}, kDevs);
    EXPECT_EQ(describe(s), "diffusion: CUDA0&CUDA1 (layer); te: CPU; vae: CUDA0, params disk; controlnet: CUDA0; upscaler: CUDA0");
}
