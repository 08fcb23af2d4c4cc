// The SD family's zero-terminal-SNR and v-prediction markers: the tiny SD1.x fixture
// (tests/data/reference/sd_tiny) with ComfyUI's / Forge's 0-d `v_pred` and `ztsnr` tensors
// appended is opened as v-prediction on diffusers' zero-SNR table (sigma_max 4095.9998, checked
// against schedulers_zsnr.json), `easel info`'s detection says so, --prediction still overrides,
// and the markers do not upset the loader: the UNet's prediction equals the unmarked file's
// bitwise. A diffusers folder's scheduler_config.json rescale_betas_zero_snr / timestep_spacing
// are honoured the same way.
#include "io/detect.h"
#include "io/weight_index.h"
#include "models/family.h"
#include "sampling/schedule.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace fs = std::filesystem;
using namespace easel;

namespace {

const fs::path kRef = fs::path(EASEL_TEST_DATA) / "reference";

// Copies a safetensors file and appends 0-d F32 tensors named `names` (value 1.0).
fs::path with_markers(const fs::path& src, const std::vector<std::string>& names, const std::string& tag) {
    std::ifstream in(src, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t hlen = 0;
    std::memcpy(&hlen, bytes.data(), 8);
    auto header = nlohmann::json::parse(bytes.substr(8, hlen));
    std::string data = bytes.substr(8 + hlen);
    for (auto& n : names) {
        const float one = 1.0f;
        header[n] = {{"dtype", "F32"}, {"shape", nlohmann::json::array()}, {"data_offsets", {data.size(), data.size() + 4}}};
        data.append(reinterpret_cast<const char*>(&one), 4);
    }
    const std::string h = header.dump();
    const uint64_t n = h.size();
    const fs::path out = fs::path(testing::TempDir()) / ("sd_zsnr_" + tag + "_" + std::to_string(getpid()) + ".safetensors");
    std::ofstream o(out, std::ios::binary);
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << h << data;
    return out;
}

std::unique_ptr<models::Family> open(const fs::path& model, const std::string& prediction = "") {
    models::ModelFiles files;
    files.model = model.string();
    models::FamilyOptions fo;
    fo.threads = 1;
    fo.prediction = prediction;
    return models::open_family(files, fo);
}

std::vector<double> zsnr_table() {
    std::ifstream f(kRef / "schedulers_zsnr.json");
    auto t = nlohmann::json::parse(f)["spacings"]["linspace"]["train_sigmas"].get<std::vector<double>>();
    return {t.rbegin() + 1, t.rend()};  // ascending, without diffusers' final 0
}

}  // namespace

TEST(SdZsnr, MarkerTensorsSelectVPredictionAndZeroTerminalSnr) {
    const fs::path plain = kRef / "sd_tiny" / "sd_tiny.safetensors";
    const fs::path marked = with_markers(plain, {"v_pred", "ztsnr"}, "both");
    auto fam = open(marked);
    const auto& ms = fam->model_sampling();
    EXPECT_EQ(ms.prediction(), sampling::Prediction::V);
    EXPECT_TRUE(ms.zero_terminal_snr());
    const auto want = zsnr_table();
    ASSERT_EQ(ms.sigmas().size(), want.size());
    double rel = 0;
    for (size_t i = 0; i < want.size(); ++i) rel = std::max(rel, std::abs(ms.sigmas()[i] - want[i]) / want[i]);
    EXPECT_LE(rel, 1e-6);
    EXPECT_EQ(ms.sigma_max(), 4095.999755859375f);
    const std::string d = fam->describe();
    EXPECT_NE(d.find("v (v_pred tensor) prediction"), std::string::npos) << d;
    EXPECT_NE(d.find("zero terminal SNR (ztsnr tensor)"), std::string::npos) << d;

    // easel info's detection: the variant names both, the markers are their own component.
    auto det = io::detect(io::WeightIndex::open(marked.string()));
    EXPECT_EQ(det.family, "SD1.x");
    EXPECT_NE(det.variant.find("v-prediction"), std::string::npos) << det.variant;
    EXPECT_NE(det.variant.find("zero terminal SNR"), std::string::npos) << det.variant;
    bool marker_comp = false;
    for (auto& c : det.components) marker_comp |= c.role == "markers" && c.detail.find("ztsnr") != std::string::npos;
    EXPECT_TRUE(marker_comp);

    // --prediction overrides the marker; the schedule stays zero-SNR.
    auto eps = open(marked, "eps");
    EXPECT_EQ(eps->model_sampling().prediction(), sampling::Prediction::Eps);
    EXPECT_TRUE(eps->model_sampling().zero_terminal_snr());

    // ztsnr alone: zero SNR, the prediction from elsewhere (SD1.x: eps); v_pred alone: v on SD's table.
    const fs::path zf = with_markers(plain, {"ztsnr"}, "z"), vf = with_markers(plain, {"v_pred"}, "v");
    auto z = open(zf);
    EXPECT_TRUE(z->model_sampling().zero_terminal_snr());
    EXPECT_EQ(z->model_sampling().prediction(), sampling::Prediction::Eps);
    auto v = open(vf);
    EXPECT_FALSE(v->model_sampling().zero_terminal_snr());
    EXPECT_EQ(v->model_sampling().prediction(), sampling::Prediction::V);
    EXPECT_NEAR(v->model_sampling().sigma_max(), 14.6146, 1e-3);
    // Unmarked: as before.
    auto p = open(plain);
    EXPECT_FALSE(p->model_sampling().zero_terminal_snr());
    EXPECT_EQ(p->model_sampling().prediction(), sampling::Prediction::Eps);

    // The loader ignores the 0-d markers: the UNet's output equals the plain file's bitwise, and
    // the text encoder loads from the marked file too.
    const int64_t h = 8, w = 8;
    std::vector<float> x((size_t)(4 * h * w));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * (float)i);
    auto cm = fam->encode_prompt("a red circle", 1);
    auto cp = p->encode_prompt("a red circle", 1);
    ASSERT_EQ(cm.context, cp.context);
    std::vector<float> om(x.size()), op(x.size());
    fam->diffusion(x, {}, h, w, 999.0, cm, om);
    p->diffusion(x, {}, h, w, 999.0, cp, op);
    EXPECT_EQ(om, op);
    for (const auto& f : {marked, zf, vf}) fs::remove(f);
}

TEST(SdZsnr, DiffusersSchedulerConfigZeroSnrAndSpacing) {
    // A copy of the tiny SD diffusers folder whose scheduler config asks for zero terminal SNR,
    // v-prediction and trailing spacing.
    const fs::path dir = fs::path(testing::TempDir()) / ("sd_zsnr_folder_" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::copy(kRef / "sd_tiny" / "diffusers", dir, fs::copy_options::recursive);
    const fs::path sc = dir / "scheduler" / "scheduler_config.json";
    nlohmann::json j;
    {
        std::ifstream f(sc);
        j = nlohmann::json::parse(f);
    }
    j["rescale_betas_zero_snr"] = true;
    j["prediction_type"] = "v_prediction";
    j["timestep_spacing"] = "trailing";
    fs::remove(sc);
    std::ofstream(sc) << j.dump(1);
    auto fam = open(dir);
    EXPECT_TRUE(fam->model_sampling().zero_terminal_snr());
    EXPECT_EQ(fam->model_sampling().prediction(), sampling::Prediction::V);
    EXPECT_EQ(fam->schedule_options().spacing, sampling::Spacing::Trailing);
    EXPECT_NE(fam->describe().find("zero terminal SNR (scheduler_config.json)"), std::string::npos) << fam->describe();
    // The 4-step trailing schedule the pipeline builds equals diffusers'.
    auto s = sampling::make_schedule(fam->model_sampling(), sampling::SchedulerKind::Discrete, 4, fam->schedule_options());
    std::ifstream f(kRef / "schedulers_zsnr.json");
    auto e = nlohmann::json::parse(f)["spacings"]["trailing"]["steps4"];
    auto ts = e["timesteps"].get<std::vector<double>>();
    auto sg = e["sigmas"].get<std::vector<double>>();
    ASSERT_EQ(s.timesteps.size(), ts.size());
    for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(s.timesteps[i], (float)ts[i]);
    for (size_t i = 0; i < sg.size(); ++i) EXPECT_NEAR(s.sigmas[i], sg[i], 1e-6 * sg[i] + 1e-7);
    // The unmodified folder: linspace, no zero SNR.
    auto plain = open(kRef / "sd_tiny" / "diffusers");
    EXPECT_FALSE(plain->model_sampling().zero_terminal_snr());
    EXPECT_EQ(plain->schedule_options().spacing, sampling::Spacing::Linspace);
    fs::remove_all(dir);
}
