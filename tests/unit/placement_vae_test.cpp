// The AutoencoderKL decoder under a placement plan (models/vae/placed_decoder.h), through the SD and
// Z-Image families with FamilyOptions::placement, over CPU + two `easel rpc-server`s on
// 127.0.0.1: layer split (--backend "vae=A&B"), weights in RAM (--params-backend vae=cpu), from
// disk (vae=disk), --max-vram caps that cut the decoder into segments (weights on the device, or
// in RAM uploaded per evaluation), and tiled decode (each tile one run of the sequence) give
// bitwise the image of the same family without placement (the same ggml ops on the same CPU;
// the state crosses devices as raw bytes), with every device's measured peak within 10% of the
// plan's prediction and within its cap. Also: the VAE's placement costs (what --auto-fit plans
// from) against the bytes in the file, and the tile measurement against the whole-latent one.
#include "core/error.h"
#include "io/weight_index.h"
#include "models/family.h"
#include "placement/autofit.h"
#include "placement/devices.h"
#include "placement/plan.h"
#include "placement/spec.h"
#include "placement_test_support.h"
#include "rpc_servers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>

using namespace easel;
using placement::PModule;

namespace {

const std::filesystem::path kRef = std::filesystem::path(EASEL_TEST_DATA) / "reference";
const std::string kSdTiny = (kRef / "sd_tiny" / "sd_tiny.safetensors").string();
const std::string kZImageTiny = (kRef / "zimage_tiny" / "diffusers").string();

easel::test_support::RpcServers& rpc() {
    static easel::test_support::RpcServers r(2);
    return r;
}

std::shared_ptr<const placement::PlacementSpec> spec_of(const std::string& backend, const std::string& params = "",
                                                        const std::string& max_vram = "") {
    placement::PlacementFlags f;
    // modules the spec leaves out run on the CPU, as in the unplaced family compared with
    f.backend = "default=CPU," + backend;
    f.params_backend = params;
    f.max_vram = max_vram;
    return std::make_shared<placement::PlacementSpec>(placement::parse_placement(f, placement::device_names()));
}

std::unique_ptr<models::Family> open(const std::string& model, std::shared_ptr<const placement::PlacementSpec> spec = nullptr,
                                     int vae_tile = 0) {
    models::ModelFiles files;
    files.model = model;
    models::FamilyOptions fo;
    fo.threads = 1;
    fo.placement = std::move(spec);
    fo.vae_tile = vae_tile;
    return models::open_family(files, fo);
}

/// A diffusion-space latent [1, C, h, w] of smooth made-up values.
vae::HostTensor latent(int64_t c, int64_t h, int64_t w) {
    vae::HostTensor z(1, c, h, w);
    for (size_t i = 0; i < z.data.size(); ++i) z.data[i] = 0.8f * std::sin(0.37f * (float)i) + 0.1f * std::cos(0.05f * (float)i);
    return z;
}

vae::TilingOptions tiles(int cells, int f) {
    vae::TilingOptions t;
    t.enabled = cells > 0;
    t.tile_size = std::max(cells, 1) * f;
    t.overlap = 0.25f;
    return t;
}

/// The plan of the VAE among a family's plans (after a decode).
const placement::ModulePlan* vae_plan(const std::vector<placement::ModulePlan>& plans) {
    for (auto& p : plans)
        if (p.module == PModule::Vae) return &p;
    return nullptr;
}

/// Every device's measured peak within 10% of the plan's prediction and within its budget.
void expect_peaks_near_prediction(const models::Family& fam, const std::string& what) {
    auto plans = fam.placement_plans();
    ASSERT_NE(vae_plan(plans), nullptr) << what;
    test_support::expect_peaks_within_10_percent(plans, fam.placement_peaks(), what);
}

std::string gib(uint64_t bytes) { return std::to_string((double)bytes / (1024.0 * 1024.0 * 1024.0)); }

}  // namespace

// SD's costs: te, diffusion, then the VAE decoder: 18 blocks (mid resnet, attention, resnet; 4
// levels x 3 resnets; 3 upsamplers) whose bytes with the prologue/epilogue's are the file's
// decoder tensors in F32 (819191 values, summed from the header with Python); the tile
// measurement of a tile covering the latent equals the whole-latent measurement (the same
// graph), a smaller tile needs less.
TEST(PlacementVae, SdCostsAreTheDecoderBytesAndTilesMeasureTheirGraph) {
    auto fam = open(kSdTiny);
    auto costs = fam->placement_costs(16, 16);
    ASSERT_EQ(costs.size(), 3u);
    const placement::ModuleCosts& v = costs[2];
    EXPECT_EQ(v.module, PModule::Vae);
    ASSERT_EQ(v.block_bytes.size(), 18u);
    EXPECT_EQ(std::accumulate(v.block_bytes.begin(), v.block_bytes.end(), v.prologue_bytes), 819191u * 4);
    // block 0 = mid_block.resnets.0 at 64 channels: 2 GroupNorms (2 x 2 x 64) + 2 3x3 convs (64*64*9 + 64)
    EXPECT_EQ(v.block_bytes[0], (uint64_t)(2 * 2 * 64 + 2 * (64 * 64 * 9 + 64)) * 4);
    EXPECT_EQ(v.latent_h, 16);
    EXPECT_EQ(v.latent_w, 16);
    ASSERT_TRUE(v.measure_tile);
    const uint64_t whole = v.measure(0, 18, true, true, "CPU");
    EXPECT_EQ(v.measure_tile(16, "CPU"), whole);
    EXPECT_EQ(v.measure_tile(64, "CPU"), whole);  // clipped to the latent
    const uint64_t t8 = v.measure_tile(8, "CPU");
    EXPECT_LT(t8, whole);
    // a family told the decode is tiled costs one tile's graph
    auto tiled_fam = open(kSdTiny, nullptr, 8);  // (costs may not outlive their family: it owns the weight index)
    auto tiled = tiled_fam->placement_costs(16, 16);
    ASSERT_EQ(tiled.size(), 3u);
    EXPECT_EQ(tiled[2].measure(0, 18, true, true, "CPU"), t8);
    // the unplaced family loads exactly these bytes
    fam->load(models::Module::VaeDecoder);
    EXPECT_EQ(fam->param_bytes(models::Module::VaeDecoder), 819191u * 4);
}

// SD's VAE decoder over CPU + RPC devices, weights on the devices, in RAM, from disk, under
// --max-vram caps, and tiled: the decoded image is bitwise the unplaced family's.
TEST(PlacementVae, SdDecoderPlacedIsBitwiseTheCpuDecode) {
    auto& r = rpc();
    const std::string a = r.devices[0], b = r.devices[1];
    const vae::HostTensor z = latent(4, 16, 16);
    auto plain = open(kSdTiny);
    const vae::HostTensor want = plain->decode(z, {});
    const vae::HostTensor want_tiled = plain->decode(z, tiles(8, 8)), want_tiled4 = plain->decode(z, tiles(4, 8));
    ASSERT_NE(want.data, want_tiled.data);  // the tiling changes the image (blended seams)

    // the uncapped need of the decode on one device, weights on it and in RAM
    auto need_of = [&](const std::string& backend, const std::string& params, int tile) {
        auto probe = open(kSdTiny, spec_of(backend, params), tile);
        const auto plans = probe->plan_placement(16, 16);
        const placement::ModulePlan* p = vae_plan(plans);
        EXPECT_NE(p, nullptr);
        return p ? p->devices.at(0).total() : 0;
    };
    // a 4x4-cell tile's decode, weights in RAM: the need without a cap (the whole decode does not
    // shrink when cut: its largest block's graph is as large as the whole graph's, so the caps
    // that force segments are set on tiles, where the weights are a large part of the need)
    const uint64_t need_tile4 = need_of("vae=" + a, "vae=cpu", 4);
    struct Case {
        std::string name, backend, params, max_vram;
        int tile;
        size_t min_segments;  // the plan must cut the decoder at least this often
    };
    const std::vector<Case> cases = {
        {"layer split vae=A&B", "vae=" + a + "&" + b, "", "", 0, 2},
        {"layer split over the CPU and an RPC device", "vae=CPU&" + b, "", "", 0, 2},
        {"weights in RAM (staged)", "vae=" + a, "vae=cpu", "", 0, 1},
        {"weights from disk", "vae=" + b, "vae=disk", "", 0, 1},
        {"tiled 4x4, weights in RAM, capped: --max-vram segments", "vae=" + a, "vae=cpu", a + "=" + gib(need_tile4 * 9 / 10), 4, 2},
        {"tiled 8x8, layer split", "vae=" + a + "&" + b, "", "", 8, 2},
        {"tiled 8x8, weights in RAM", "vae=" + b, "vae=cpu", "", 8, 1},
    };
    for (const Case& c : cases) {
        auto fam = open(kSdTiny, spec_of(c.backend, c.params, c.max_vram), c.tile);
        const vae::HostTensor got = fam->decode(z, tiles(c.tile, 8));
        EXPECT_EQ(got.data, c.tile == 8 ? want_tiled.data : c.tile == 4 ? want_tiled4.data : want.data) << c.name;
        fam->unload(models::Module::VaeDecoder);  // the plan and peaks are kept for the report
        auto plans = fam->placement_plans();
        const placement::ModulePlan* p = vae_plan(plans);
        ASSERT_NE(p, nullptr) << c.name;
        EXPECT_GE(p->segments.size(), c.min_segments) << c.name;
        expect_peaks_near_prediction(*fam, c.name);
        if (!c.max_vram.empty()) { EXPECT_LE(fam->placement_peaks().at(a), need_tile4 * 9 / 10) << c.name; }
    }
}

// Z-Image's 16-channel (FLUX.1) VAE split over both RPC devices, and weights in RAM on one, with
// the family's latent scaling and shift: bitwise the unplaced decode.
TEST(PlacementVae, ZImageDecoderPlacedIsBitwiseTheCpuDecode) {
    auto& r = rpc();
    const vae::HostTensor z = latent(16, 8, 8);
    const vae::HostTensor want = open(kZImageTiny)->decode(z, {});
    for (auto [backend, params] : {std::pair<std::string, std::string>{"vae=" + r.devices[1] + "&" + r.devices[0], ""},
                                   {"vae=" + r.devices[0], "vae=cpu"}}) {
        auto fam = open(kZImageTiny, spec_of(backend, params));
        EXPECT_EQ(fam->placement_costs(8, 8).back().module, PModule::Vae);
        EXPECT_EQ(fam->decode(z, {}).data, want.data) << backend << " " << params;
        expect_peaks_near_prediction(*fam, backend + " " + params);
    }
}

// --auto-fit on the SD family's real costs: a device whose budget holds one 16x16-cell tile's
// decode but not the whole 32x32 decode (even cut into segments) gets the VAE tiled up front
// (tiles of 16 cells, the largest of auto-fit's sizes below the latent that fits), on that
// device; the family then plans that tile within the budget and decodes it there within 10% of
// the prediction, bitwise the unplaced tiled decode.
TEST(PlacementVae, AutoFitTilesTheDecodeThatDoesNotFitWhole) {
    auto& r = rpc();
    const std::string a = r.devices[0];
    auto costs_fam = open(kSdTiny);
    auto costs = costs_fam->placement_costs(32, 32);
    const placement::ModuleCosts& v = costs[2];
    ASSERT_EQ(v.module, PModule::Vae);
    const uint64_t params = std::accumulate(v.block_bytes.begin(), v.block_bytes.end(), v.prologue_bytes);
    const uint64_t tile16 = params + v.measure_tile(16, a);
    placement::FitRequest req;
    placement::FitDevice d;
    d.name = a;
    d.type = "gpu";
    d.budget = tile16 + tile16 / 20;  // a tile of 16 cells fits with 5% to spare
    req.devices.push_back(d);
    placement::FitDevice cpu;
    cpu.name = "CPU";
    cpu.type = "cpu";
    cpu.budget = 64ull << 30;
    req.devices.push_back(cpu);
    placement::FitModule m;
    m.module = PModule::Vae;
    m.costs = v;
    m.measure_tile = v.measure_tile;
    m.latent_w = m.latent_h = 32;
    req.modules.push_back(m);
    const placement::FitResult fit = placement::auto_fit(req);
    ASSERT_EQ(fit.choices.size(), 1u);
    EXPECT_EQ(fit.vae_tile, 16) << fit.flags_line;
    EXPECT_EQ(fit.choices[0].plan.devices.at(0).device, a);
    EXPECT_NE(fit.flags_line.find("--vae-tiling --vae-tile-size 16x16"), std::string::npos) << fit.flags_line;

    const std::string cap = a + "=" + gib(d.budget);
    auto fam = open(kSdTiny, spec_of("vae=" + a, "", cap), fit.vae_tile);
    const auto planned = fam->plan_placement(32, 32);  // the tile's plan fits the budget (else this throws)
    ASSERT_NE(vae_plan(planned), nullptr);
    EXPECT_LE(vae_plan(planned)->devices.at(0).total(), d.budget);
    const vae::HostTensor z = latent(4, 32, 32);
    EXPECT_EQ(fam->decode(z, tiles(16, 8)).data, open(kSdTiny)->decode(z, tiles(16, 8)).data);
    expect_peaks_near_prediction(*fam, "auto-fit tile");
    EXPECT_LE(fam->placement_peaks().at(a), d.budget);
    // the whole decode on that device does not fit
    auto whole = open(kSdTiny, spec_of("vae=" + a, "", cap));
    EXPECT_THROW(whole->plan_placement(32, 32), Error);
}
