// LoRA and textual-inversion parity with diffusers + peft (issue 21) on the tiny pipelines, against
// tests/data/reference/lora (tools/reference/make_lora_refs.py, SOURCE.md there):
//
//  * LoraParityE2E.*: `easel generate` with the family's first e2e case (lora_refs.json
//    "easel_args") and its LoRA - the diffusers/PEFT file (lora_alpha in its adapter metadata) and
//    the family's other layout (kohya with fused qkv / linear1 and .alpha tensors; ComfyUI for FLUX.2
//    Klein) - at weights 1.0 and 0.6, merged at load (--lora-apply-mode immediately) and added in the
//    graph (at_runtime), must give the image diffusers gave with load_lora_weights + set_adapters,
//    within 2/255 per channel (the tolerance of every family's e2e test against diffusers). Each
//    reference differs from the image without the LoRA and from the other weight's, so a LoRA left
//    out, applied to the wrong layers or with the wrong scale fails.
//  * LoraParityTags.*: the same LoRA named by a <lora:NAME:W> tag of the prompt with
//    --lora-model-dir, in the default apply mode (auto).
//  * TextualInversionParity.*: --embd-dir with an A1111 embedding named "tinyemb" in the prompt
//    gives diffusers' load_textual_inversion image, and its conditioning equals encode_prompt's.
#include "e2e_helpers.h"
#include "io/weight_index.h"
#include "models/family.h"
#include "models/sd/stable_diffusion.h"
#include "pipeline/image_io.h"
#include "text/embeddings.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace easel;
using namespace easel::test;

namespace {

const fs::path kRef = fs::path(EASEL_TEST_DATA) / "reference";
const fs::path kDir = kRef / "lora";

const nlohmann::json& refs() {
    static const nlohmann::json j = [] {
        std::ifstream f(kDir / "lora_refs.json");
        return nlohmann::json::parse(f);
    }();
    return j;
}

/// The folder the family's easel_args are relative to (its -m names "sd_tiny.safetensors" or "diffusers").
fs::path family_dir(const std::string& fam) { return kRef / (fam == "sd" ? "sd_tiny" : fam + "_tiny"); }

/// The committed e2e image of the family's first case (the image without any LoRA).
fs::path base_png(const std::string& fam) {
    const std::string c = refs()["families"][fam]["case"].get<std::string>();
    return family_dir(fam) / (std::string("case_") + c + ".png");
}

std::string quote(const std::string& s) {
    std::string r = "'";
    for (char c : s) {
        if (c == '\'') r += "'\\''";
        else r += c;
    }
    return r + "'";
}

/// The case's easel arguments with its prompt replaced by `prompt` (the arguments hold it as -p "PROMPT").
std::string with_prompt(const std::string& args, const std::string& old_prompt, const std::string& prompt) {
    const std::string from = std::string("-p \"") + old_prompt + "\"";
    const size_t at = args.find(from);
    if (at == std::string::npos) throw std::runtime_error(std::string("easel_args have no ") + from + ": " + args);
    return args.substr(0, at) + "-p " + quote(prompt) + args.substr(at + from.size());
}

/// Runs `easel <args> <extra>` in the family's folder; returns the PNG's pixels (empty on failure).
std::vector<uint8_t> run_easel(const std::string& fam, const std::string& args, const std::string& extra, const std::string& tag) {
    const fs::path out = fs::path(testing::TempDir()) / (std::string("easel_lora_") + tag + "_" + std::to_string(getpid()) + ".png");
    fs::remove(out);
    const std::string cmd = std::string("cd ") + quote(family_dir(fam).string()) + " && " + std::string(EASEL_BINARY) + " " + args +
                            " -t 1 --no-cache " + extra + " -o " + quote(out.string()) + " > /dev/null 2>&1";
    const int rc = std::system(cmd.c_str());
    EXPECT_EQ(rc, 0) << cmd;
    if (rc != 0 || !fs::exists(out)) return {};
    auto img = pipeline::load_image(out, 3);
    fs::remove(out);
    return img.pixels;
}

std::vector<uint8_t> png(const fs::path& p) { return pipeline::load_image(p, 3).pixels; }

std::string weight_text(double w) { return w == 1.0 ? "1.0" : "0.6"; }

/// The LoRA reference of `fam` at weight `w` differs visibly from the image without the LoRA and
/// from the reference at the other weight: a test passing within 2/255 then shows the LoRA applied
/// with its weight.
void expect_reference_discriminates(const std::string& fam, double w) {
    const auto ref = png(kDir / (fam + "_w" + weight_text(w) + ".png"));
    const auto other = png(kDir / (fam + "_w" + weight_text(w == 1.0 ? 0.6 : 1.0) + ".png"));
    EXPECT_GT(max_pixel_diff(ref, png(base_png(fam))), 6) << fam << ": the LoRA reference barely differs from the image without it";
    EXPECT_GT(max_pixel_diff(ref, other), 6) << fam << ": the references at weights 1.0 and 0.6 barely differ";
}

struct LoraCase {
    std::string fam;   ///< sd, zimage, flux1, klein
    std::string form;  ///< diffusers, kohya (the file <fam>_lora_<form>.safetensors)
    double weight;     ///< 1.0, 0.6
    std::string mode;  ///< immediately, at_runtime
};

std::vector<LoraCase> lora_cases() {
    std::vector<LoraCase> r;
    // SD only for now: the zimage / flux1 / klein references of the first GPU run were made with
    // tokenizers without vocabularies (tests/data/reference/lora/SOURCE.md) and are not committed;
    // add the families back when make_lora_refs.py has been run again
    for (const char* fam : {"sd"})
        for (const char* form : {"diffusers", "kohya"})
            for (double w : {1.0, 0.6})
                for (const char* mode : {"immediately", "at_runtime"}) r.push_back({fam, form, w, mode});
    return r;
}

std::string case_name(const LoraCase& c) {
    std::string n = c.fam + "_" + c.form + "_w" + weight_text(c.weight) + "_" + c.mode;
    for (auto& ch : n)
        if (!isalnum((unsigned char)ch)) ch = '_';
    return n;
}

/// gtest prints a parameter by its name.
[[maybe_unused]] void PrintTo(const LoraCase& c, std::ostream* os) { *os << case_name(c); }

}  // namespace

class LoraParityE2E : public ::testing::TestWithParam<LoraCase> {};

TEST_P(LoraParityE2E, MatchesDiffusersWithin2Of255) {
    const LoraCase& c = GetParam();
    const auto& f = refs()["families"][c.fam];
    const fs::path lora = kDir / (c.fam + "_lora_" + c.form + ".safetensors");
    const auto got = run_easel(c.fam, f["easel_args"].get<std::string>(),
                               std::string("--lora ") + quote(lora.string() + ":" + weight_text(c.weight)) + " --lora-apply-mode " + c.mode, case_name(c));
    ASSERT_FALSE(got.empty());
    const auto want = png(kDir / (c.fam + "_w" + weight_text(c.weight) + ".png"));
    const int d = max_pixel_diff(got, want);
    std::printf("[lora parity] %s: max pixel diff %d/255 (vs the image without the LoRA %d/255)\n", case_name(c).c_str(), d,
                max_pixel_diff(got, png(base_png(c.fam))));
    EXPECT_LE(d, 2);
    expect_reference_discriminates(c.fam, c.weight);
}

INSTANTIATE_TEST_SUITE_P(Cases, LoraParityE2E, ::testing::ValuesIn(lora_cases()), [](const auto& info) { return case_name(info.param); });

class LoraParityTags : public ::testing::TestWithParam<LoraCase> {};

// "<prompt> <lora:NAME:W>" with --lora-model-dir: the tag is taken out of the text the encoder sees
// (with the space before it) and the LoRA applied with weight W to the text encoder and the diffusion
// model; default apply mode.
TEST_P(LoraParityTags, PromptTagMatchesDiffusersWithin2Of255) {
    const LoraCase& c = GetParam();
    const auto& f = refs()["families"][c.fam];
    const std::string prompt = f["prompt"].get<std::string>();
    const std::string tagged = prompt + " <lora:" + c.fam + "_lora_" + c.form + ":" + weight_text(c.weight) + ">";
    const auto got = run_easel(c.fam, with_prompt(f["easel_args"].get<std::string>(), prompt, tagged),
                               std::string("--lora-model-dir ") + quote(kDir.string()), std::string("tag_") + case_name(c));
    ASSERT_FALSE(got.empty());
    const int d = max_pixel_diff(got, png(kDir / (c.fam + "_w" + weight_text(c.weight) + ".png")));
    std::printf("[lora parity] tag %s: max pixel diff %d/255\n", tagged.c_str(), d);
    EXPECT_LE(d, 2);
}

INSTANTIATE_TEST_SUITE_P(Cases, LoraParityTags,
                         ::testing::Values(LoraCase{"sd", "kohya", 0.6, "auto"}, LoraCase{"sd", "diffusers", 1.0, "auto"}),
                         [](const auto& info) { return case_name(info.param); });

namespace {

/// A folder holding the embedding as "<token>.safetensors" (the name a prompt writes is the file stem).
fs::path embedding_dir() {
    const auto& ti = refs()["textual_inversion"];
    const fs::path d = fs::path(testing::TempDir()) / (std::string("easel_ti_") + std::to_string(getpid()));
    fs::create_directories(d);
    fs::copy_file(kDir / ti["embedding"].get<std::string>(), d / (ti["token"].get<std::string>() + ".safetensors"),
                  fs::copy_options::overwrite_existing);
    return d;
}

}  // namespace

// The image of "a photo of tinyemb cat" with the 2-vector embedding (diffusers: load_textual_inversion
// with token "tinyemb", which the prompt becomes "tinyemb tinyemb_1").
TEST(TextualInversionParity, ImageMatchesDiffusersWithin2Of255) {
    const auto& ti = refs()["textual_inversion"];
    const fs::path dir = embedding_dir();
    std::string args = ti["easel_args"].get<std::string>();
    const std::string flag = "--embd-dir DIR";
    ASSERT_NE(args.find(flag), std::string::npos) << args;
    args.replace(args.find(flag), flag.size(), std::string("--embd-dir ") + quote(dir.string()));
    const auto got = run_easel("sd", args, "", "ti");
    ASSERT_FALSE(got.empty());
    const auto want = png(kDir / ti["png"].get<std::string>());
    const int d = max_pixel_diff(got, want);
    std::printf("[ti parity] %s: max pixel diff %d/255 (reference vs the case without the embedding %d/255)\n",
                ti["prompt"].get<std::string>().c_str(), d, max_pixel_diff(want, png(base_png("sd"))));
    EXPECT_LE(d, 2);
    fs::remove_all(dir);
}

// The conditioning: encode_prompt's prompt_embeds [77, 64] (F32 weights for a tight check). Without
// the embedding the same prompt gives a conditioning far from it, so the check shows the vectors used.
TEST(TextualInversionParity, ConditioningMatchesDiffusers) {
    const auto& ti = refs()["textual_inversion"];
    const fs::path dir = embedding_dir();
    models::ModelFiles files;
    files.model = (kRef / "sd_tiny" / "sd_tiny.safetensors").string();
    models::FamilyOptions fo;
    fo.weight_type = "f32";
    auto fam = models::open_family(files, fo);
    auto* sd = dynamic_cast<models::sd::StableDiffusion*>(fam.get());
    ASSERT_NE(sd, nullptr);
    const std::string prompt = ti["prompt"].get<std::string>();
    const auto plain = fam->encode_prompt(prompt, 0);
    sd->set_embeddings({text::read_embedding(dir / (ti["token"].get<std::string>() + ".safetensors"))});
    const auto got = fam->encode_prompt(prompt, 0);
    const auto ref = io::WeightIndex::open(kDir / ti["tensors"].get<std::string>());
    const auto want = read_f32(ref, "cond");
    ASSERT_EQ(got.context.size(), want.size());
    const double e = max_abs_diff(got.context, want);
    std::printf("[ti parity] cond max abs diff %.3g (without the embedding %.3g; values up to %.3g)\n", e, max_abs_diff(plain.context, want),
                max_abs(want));
    EXPECT_LT(e, 1e-4);
    EXPECT_GT(max_abs_diff(plain.context, want), 0.1);
    fs::remove_all(dir);
}
