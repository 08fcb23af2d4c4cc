// --auto-fit's measured device speeds (placement/autofit.h): the matmul micro-benchmark and the
// host-to-device bandwidth cached on disk per device (DeviceSpeedCache: written once, reused, an
// invalid file refused with a message naming it), and the cost model's choice following the
// measured FLOP/s and bandwidth on synthetic inventories (the expected plan and the arithmetic
// written down with each test; autofit.h "Cost model").
#include "core/error.h"
#include "placement/autofit.h"
#include "placement/devices.h"
#include "placement/spec.h"
#include "autofit_test_support.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include <unistd.h>

using namespace easel;
using namespace easel::placement;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;

/// A fresh folder under the system's temporary folder, removed with the object.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        path = std::filesystem::temp_directory_path() / ("easel-autofit-speed-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    static int& counter() {
        static int n = 0;
        return n;
    }
};

std::string read(const std::filesystem::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

using test_support::fit_choice;

/// test_support::fit_module with `evals` evaluations of `flops_per_eval` FLOPs each.
FitModule module(PModule m, int n, uint64_t block, uint64_t pro, uint64_t comp, uint64_t state, double evals, double flops_per_eval) {
    FitModule f = test_support::fit_module(m, n, block, pro, comp, state);
    f.evals = evals;
    f.flops_per_eval = flops_per_eval;
    return f;
}

/// test_support::fit_device measured at `flops` FLOP/s and `bw` host-to-device bytes/s (0: the type's default).
FitDevice dev(const std::string& name, const std::string& type, uint64_t budget, double flops = 0, double bw = 0) {
    FitDevice d = test_support::fit_device(name, type, budget);
    d.flops = flops;
    d.h2d_bytes_per_s = bw;
    return d;
}

}  // namespace

// ---------------------------------------------------------------- the cache

// Written once: the first get() measures and writes the file (its fields as given); a second
// cache object for the same device answers from the file without measuring; another device
// (or another CPU thread count) is another file.
TEST(AutoFitSpeed, CacheIsWrittenOnceAndReused) {
    TempDir tmp;
    int calls = 0;
    auto measure = [&] {
        ++calls;
        return DeviceSpeed{3.5e12, 1.25e10};
    };
    DeviceSpeedCache a(tmp.path, "CUDA0", "NVIDIA Test 24 GB");
    const DeviceSpeed s1 = a.get(measure);
    EXPECT_EQ(calls, 1);
    EXPECT_FALSE(a.hit());
    EXPECT_TRUE(a.problem().empty());
    ASSERT_TRUE(std::filesystem::exists(a.file())) << a.file();
    EXPECT_EQ(a.file().parent_path(), tmp.path / "autofit");  // next to the compute-buffer cache
    const std::string text = read(a.file());
    EXPECT_NE(text.find("\"device\": \"CUDA0\""), std::string::npos) << text;
    EXPECT_NE(text.find("\"format\": \"easel-autofit-device-v1\""), std::string::npos) << text;

    DeviceSpeedCache b(tmp.path, "CUDA0", "NVIDIA Test 24 GB");
    const DeviceSpeed s2 = b.get(measure);
    EXPECT_EQ(calls, 1) << "a cached device must not be measured again";
    EXPECT_TRUE(b.hit());
    EXPECT_EQ(s2.flops, s1.flops);
    EXPECT_EQ(s2.h2d_bytes_per_s, s1.h2d_bytes_per_s);
    EXPECT_EQ(read(b.file()), text);  // (not rewritten)

    DeviceSpeedCache c(tmp.path, "CUDA1", "NVIDIA Test 24 GB");
    EXPECT_NE(c.file(), a.file());
    DeviceSpeedCache d(tmp.path, "CPU", "host", 4), e(tmp.path, "CPU", "host", 2);
    EXPECT_NE(d.file(), e.file());
    c.get(measure);
    EXPECT_EQ(calls, 2);

    // --no-cache (no folder): measured every time, nothing written
    DeviceSpeedCache none({}, "CUDA0", "NVIDIA Test 24 GB");
    none.get(measure);
    none.get(measure);
    EXPECT_EQ(calls, 4);
    EXPECT_TRUE(none.file().empty());
}

// An invalid file is refused with a message naming the file and what is wrong, measured again
// and replaced by a valid entry (which the next object then reuses).
TEST(AutoFitSpeed, InvalidCacheFileIsRefusedWithAClearMessage) {
    TempDir tmp;
    const DeviceSpeed good{2.0e11, 0};
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"{not json", "parse error"},
        {"[1, 2]", "not a JSON object"},
        {R"({"format": "other", "device": "CPU", "flops": 1e11, "h2d_bytes_per_s": 0})", "\"format\" is not \"easel-autofit-device-v1\""},
        {R"({"format": "easel-autofit-device-v1", "device": "CUDA0", "flops": 1e11, "h2d_bytes_per_s": 0})", "\"device\" is not \"CPU\""},
        {R"({"format": "easel-autofit-device-v1", "device": "CPU", "h2d_bytes_per_s": 0})", "\"flops\" missing or not a number"},
        {R"({"format": "easel-autofit-device-v1", "device": "CPU", "flops": -5, "h2d_bytes_per_s": 0})", "\"flops\" -5 is not a positive number"},
        {R"({"format": "easel-autofit-device-v1", "device": "CPU", "flops": 1e11, "h2d_bytes_per_s": "fast"})",
         "\"h2d_bytes_per_s\" missing or not a number"},
    };
    for (auto& [content, why] : bad) {
        DeviceSpeedCache c(tmp.path, "CPU", "host", 2);
        std::filesystem::create_directories(c.file().parent_path());
        {
            std::ofstream o(c.file());
            o << content;
        }
        int calls = 0;
        const DeviceSpeed s = c.get([&] {
            ++calls;
            return good;
        });
        EXPECT_EQ(calls, 1) << content;
        EXPECT_FALSE(c.hit()) << content;
        EXPECT_EQ(s.flops, good.flops) << content;
        EXPECT_NE(c.problem().find(c.file().string()), std::string::npos) << c.problem();
        EXPECT_NE(c.problem().find(why), std::string::npos) << "content " << content << ": " << c.problem();
        EXPECT_NE(c.problem().find("measuring CPU again"), std::string::npos) << c.problem();
        // replaced: the next one answers from it
        DeviceSpeedCache again(tmp.path, "CPU", "host", 2);
        const DeviceSpeed s2 = again.get([&] {
            ++calls;
            return DeviceSpeed{};
        });
        EXPECT_TRUE(again.hit()) << content;
        EXPECT_EQ(calls, 1) << content;
        EXPECT_EQ(s2.flops, good.flops) << content;
    }
}

// The micro-benchmark on this machine's CPU: a 1024 x 1024 x N matmul can not run faster than
// the CPU's peak (2 threads x 2 FMA units x 16 F32 lanes x 2 FLOPs x 5 GHz = 640 GFLOP/s is
// above any CI core) nor slower than 0.1 GFLOP/s (a 2-core machine of the last decade does
// 10-100 with ggml's kernels when idle; 1.6 measured at a load average of 20); the figure is then
// cached and reused like any other.
TEST(AutoFitSpeed, CpuMatmulBenchmarkIsPlausibleAndCached) {
    ggml_backend_dev_t cpu = nullptr;
    for (auto& d : list_devices())
        if (d.type == "cpu") cpu = d.dev;
    ASSERT_NE(cpu, nullptr);
    TempDir tmp;
    DeviceSpeedCache c(tmp.path, "CPU", "host", 2);
    const DeviceSpeed s = c.get([&] { return measure_device_speed(cpu, 2); });
    std::printf("[auto-fit speed] CPU, 2 threads: %.2f GFLOP/s (F16 x F32 matmul, K = M = 1024)\n", s.flops / 1e9);
    EXPECT_GT(s.flops, 1e8);
    EXPECT_LT(s.flops, 6.4e11);
    EXPECT_EQ(s.h2d_bytes_per_s, 0);  // the CPU has no upload
    DeviceSpeedCache again(tmp.path, "CPU", "host", 2);
    EXPECT_EQ(again.get([] { return DeviceSpeed{}; }).flops, s.flops);
    EXPECT_TRUE(again.hit());
}

// ---------------------------------------------------------------- the cost model follows the measurements

// Two 24 GiB cards and a job that fits either whole (tier 1): te 1 GiB, DiT 7 GiB, 40
// evaluations of 1e14 FLOPs (diffusion) on each card's measured FLOP/s. Predicted DiT seconds:
// load 7232 MiB / 1 GB/s (disk) = 7.58 s on both, plus 40 x 1e14 / FLOP/s: on a 1e13 card 400 s,
// on a 5e13 card 80 s. So the DiT goes to the card measured faster, whichever it is in ggml's
// order; with no measurement (0: the same default for both) the first card (ggml's order) wins.
TEST(AutoFitSpeed, MeasuredFlopsPickTheCard) {
    auto plan = [](double f0, double f1) {
        FitRequest req;
        req.devices = {dev("CPU", "cpu", 64 * GiB), dev("CUDA0", "gpu", 24 * GiB, f0), dev("CUDA1", "gpu", 24 * GiB, f1)};
        req.modules = {module(PModule::Te, 8, 128 * MiB, 0, 64 * MiB, MiB, 2, 1e12),
                       module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 200 * MiB, 16 * MiB, 40, 1e14)};
        return auto_fit(req);
    };
    FitResult a = plan(1e13, 5e13);
    EXPECT_EQ(a.tier, Tier::Resident);
    EXPECT_EQ(fit_choice(a, PModule::Diffusion).plan.devices[0].device, "CUDA1");
    EXPECT_NEAR(fit_choice(a, PModule::Diffusion).seconds, (28.0 * 256 + 64) * MiB / 1e9 + 40 * 1e14 / 5e13, 1e-6);
    FitResult b = plan(5e13, 1e13);
    EXPECT_EQ(fit_choice(b, PModule::Diffusion).plan.devices[0].device, "CUDA0");
    EXPECT_NEAR(fit_choice(b, PModule::Diffusion).seconds, (28.0 * 256 + 64) * MiB / 1e9 + 40 * 1e14 / 5e13, 1e-6);
    FitResult c = plan(0, 0);
    EXPECT_EQ(fit_choice(c, PModule::Diffusion).plan.devices[0].device, "CUDA0");
}

// Two 6 GiB cards, 32 GiB RAM, a 7.06 GiB DiT (28 x 256 MiB + 64 MiB) that fits neither card:
// tier 3, streamed from RAM, the same plan on either card (autofit_test.cpp
// SixPlusSixStreamsTheDitFromRam: 20 blocks resident = 5184 MiB staged once, 8 blocks + the
// epilogue = 2112 MiB uploaded per evaluation). Measured: CUDA0 2e13 FLOP/s on a 25 GB/s link,
// CUDA1 4e13 FLOP/s on a 3 GB/s link (a x1 riser). Per the cost model, with F FLOPs per
// evaluation and 40 evaluations:
//   CUDA0: 5184 MiB / 25e9 + 40 x (2112 MiB / 25e9 + F / 2e13)
//   CUDA1: 5184 MiB / 3e9  + 40 x (2112 MiB / 3e9  + F / 4e13)
// F = 1e12 (a small image): CUDA0 0.217 + 40 x (0.0886 + 0.05) = 5.76 s, CUDA1 1.81 + 40 x
// (0.738 + 0.025) = 32.3 s -> CUDA0: the upload link decides, though CUDA1 computes faster
// (and comes first in the speed order).
// F = 1e14 (a large image): CUDA0 0.217 + 40 x (0.0886 + 5) = 203.8 s, CUDA1 1.81 + 40 x
// (0.738 + 2.5) = 131.3 s -> CUDA1: compute decides.
TEST(AutoFitSpeed, MeasuredBandwidthAgainstFlopsDecideTheStreamingCard) {
    auto plan = [](double F) {
        FitRequest req;
        req.devices = {dev("CPU", "cpu", 32 * GiB), dev("CUDA0", "gpu", 6 * GiB, 2e13, 25e9), dev("CUDA1", "gpu", 6 * GiB, 4e13, 3e9)};
        req.modules = {module(PModule::Diffusion, 28, 256 * MiB, 64 * MiB, 200 * MiB, 16 * MiB, 40, F)};
        return auto_fit(req);
    };
    const double resident = 5184.0 * MiB, streamed = 2112.0 * MiB;
    for (double F : {1e12, 1e14}) {
        FitResult r = plan(F);
        const FitChoice& d = fit_choice(r, PModule::Diffusion);
        ASSERT_EQ(d.tier, Tier::HostStreamed) << F;
        uint64_t per_eval = 0, staged = 0;
        for (auto& s : d.plan.segments) (s.per_eval ? per_eval : staged) += s.param_bytes;
        EXPECT_EQ(per_eval, (uint64_t)streamed) << F;
        EXPECT_EQ(staged, (uint64_t)resident) << F;
        const double t0 = resident / 25e9 + 40 * (streamed / 25e9 + F / 2e13), t1 = resident / 3e9 + 40 * (streamed / 3e9 + F / 4e13);
        const std::string want = F < 1e13 ? "CUDA0" : "CUDA1";
        EXPECT_EQ(d.plan.devices[0].device, want) << "F = " << F << ": CUDA0 " << t0 << " s, CUDA1 " << t1 << " s";
        EXPECT_NEAR(d.seconds, std::min(t0, t1), 1e-6 * std::min(t0, t1)) << F;
        std::printf("[auto-fit speed] F = %.0e FLOPs/eval: CUDA0 %.2f s, CUDA1 %.2f s -> %s\n", F, t0, t1, d.plan.devices[0].device.c_str());
    }
}
