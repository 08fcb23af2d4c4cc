// Stages as separate processes, on the tiny SD pipeline (tests/data/reference/sd_tiny):
//  * `easel denoise` killed with SIGKILL after step k, resumed with --resume: the final latent
//    equals an uninterrupted run bit for bit (euler, euler_a, dpm++2m, heun, dpm++2s_a, dpm2);
//  * encode-prompt -> denoise -> decode (and the --stage aliases) give the same PNG file as
//    `easel generate`, for txt2img and img2img (encode-image);
//  * truncated / edited / mismatched artifacts are refused with a clear message, and the output
//    file is left as it was;
//  * a repeated prompt is served from the cache without opening the text encoder file.
#include "pipeline/artifact.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace easel::pipeline;

extern char** environ;

namespace {

const fs::path kSd = fs::path(EASEL_TEST_DATA) / "reference" / "sd_tiny";

fs::path tmpdir(const std::string& name) {
    fs::path d = fs::path(testing::TempDir()) / ("easel_stages_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

std::string slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// Starts `easel args...` with stdout/stderr into log and `env` ("NAME=value") added to the
/// environment; returns the pid.
pid_t spawn(const std::vector<std::string>& args, const fs::path& log, std::vector<std::string> env = {}) {
    std::vector<std::string> all{EASEL_BINARY};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e) envp.push_back(*e);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, EASEL_BINARY, &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    return rc == 0 ? pid : -1;
}

/// Starts `easel args...` that stops itself right after writing the checkpoint of step k
/// (EASEL_TEST_STOP_AFTER_STEP, pipeline/stages.cpp), waits until it has stopped, and kills it
/// with SIGKILL: killed at exactly that checkpoint however slow or loaded the machine is.
/// Fails the test (returns false) when the process ended instead of stopping.
bool run_until_checkpoint_then_kill(const std::vector<std::string>& args, int k, const fs::path& log) {
    pid_t pid = spawn(args, log, {"EASEL_TEST_STOP_AFTER_STEP=" + std::to_string(k)});
    EXPECT_GT(pid, 0);
    if (pid <= 0) return false;
    int st = 0;
    EXPECT_EQ(waitpid(pid, &st, WUNTRACED), pid);
    if (!WIFSTOPPED(st)) {
        ADD_FAILURE() << "the run ended (status " << st << ") instead of stopping after step " << k << ": " << slurp(log);
        return false;
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    return true;
}

/// Checkpoint file name of image 1 after step k.
std::string ckpt_name(int k) {
    std::string n = std::to_string(k);
    return "image1-step" + std::string(4 - n.size(), '0') + n + ".safetensors";
}

/// Runs `easel args...`; returns the exit status (-1 on a signal) and the output in *out.
int run(const std::vector<std::string>& args, std::string* out = nullptr) {
    fs::path log = fs::path(testing::TempDir()) / ("easel_stages_log_" + std::to_string(getpid()) + ".txt");
    pid_t pid = spawn(args, log);
    if (pid < 0) return -2;
    int st = 0;
    waitpid(pid, &st, 0);
    if (out) *out = slurp(log);
    fs::remove(log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::vector<std::string> model_args() { return {"-m", (kSd / "sd_tiny.safetensors").string(), "-t", "1", "--rng", "cpu"}; }

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

/// `easel <command> -m sd_tiny ...`
std::vector<std::string> cmd(const std::string& name) { return cat({name}, model_args()); }

/// The latent tensor's bytes of a latent artifact.
std::vector<uint8_t> latent_bytes(const fs::path& p) {
    Artifact a = read_artifact(p, ArtifactKind::Latent);
    return a.find("latent")->bytes;
}

struct ResumeCase {
    std::string sampler;
    std::string scheduler;
};

class KillResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(KillResume, SigkillAfterStepKThenResumeIsBitIdentical) {
    const auto& c = GetParam();
    auto d = tmpdir("resume_" + std::to_string(std::hash<std::string>{}(c.sampler)));
    const fs::path cond = d / "cond.safetensors";
    std::string out;
    ASSERT_EQ(run(cat(cmd("encode-prompt"), {"-p", "a photo of a cat", "-n", "blurry", "--save-embeddings", cond.string()}), &out), 0) << out;
    // (the kill waits for the checkpoint of step k, so the run needs no length to race against)
    const int steps = 12, k = 5, earlier = 2;
    auto job = cat(cmd("denoise"), {"--load-embeddings", cond.string(), "-W", "64", "-H", "64", "--steps", std::to_string(steps),
                                  "-s", "11", "--sampling-method", c.sampler, "--scheduler", c.scheduler});
    // uninterrupted reference
    ASSERT_EQ(run(cat(job, {"--save-latent", (d / "ref.safetensors").string()}), &out), 0) << out;
    // killed right after the checkpoint of step k
    const fs::path ck = d / "ckpt";
    ASSERT_TRUE(run_until_checkpoint_then_kill(cat(job, {"--save-latent", (d / "resumed.safetensors").string(), "--checkpoint-dir", ck.string()}),
                                               k, d / "killed.log"));
    ASSERT_FALSE(fs::exists(d / "resumed.safetensors")) << "the killed run finished before the kill";
    // the latest checkpoint is the one of step k
    int last = -1;
    for (auto& e : fs::directory_iterator(ck)) {
        auto n = e.path().filename().string();
        if (n.rfind("image1-step", 0) == 0) last = std::max(last, std::stoi(n.substr(11, 4)));
    }
    ASSERT_EQ(last, k);
    // resume from the latest checkpoint
    ASSERT_EQ(run(cat(job, {"--save-latent", (d / "resumed.safetensors").string(), "--checkpoint-dir", ck.string(), "--resume"}), &out), 0) << out;
    EXPECT_NE(out.find("resuming from"), std::string::npos) << out;
    EXPECT_EQ(latent_bytes(d / "resumed.safetensors"), latent_bytes(d / "ref.safetensors")) << c.sampler << ": resumed after step " << last;
    // and from an earlier checkpoint
    ASSERT_EQ(run(cat(job, {"--save-latent", (d / "resumed_k.safetensors").string(), "--checkpoint-dir", ck.string(), "--resume-step",
                            std::to_string(earlier)}), &out), 0) << out;
    EXPECT_EQ(latent_bytes(d / "resumed_k.safetensors"), latent_bytes(d / "ref.safetensors")) << c.sampler << ": resumed after step " << earlier;
    fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(Samplers, KillResume,
                         ::testing::Values(ResumeCase{"euler", "discrete"}, ResumeCase{"euler_a", "discrete"},
                                           ResumeCase{"dpm++2m", "karras"}, ResumeCase{"heun", "discrete"},
                                           ResumeCase{"dpm++2s_a", "discrete"}, ResumeCase{"dpm2", "karras"},
                                           // issue 26: a case per kind of state (history buffers, the
                                           // SDE's RNG, the Brownian tree's seed, two-buffer er_sde, CFG++)
                                           ResumeCase{"uni_pc", "karras"}, ResumeCase{"lms", "discrete"},
                                           ResumeCase{"ipndm_v", "exponential"}, ResumeCase{"deis", "discrete"},
                                           ResumeCase{"dpm++2m_sde", "karras"}, ResumeCase{"dpm++2m_sde_bt", "karras"},
                                           ResumeCase{"dpm++_sde", "ays"}, ResumeCase{"er_sde", "beta"},
                                           ResumeCase{"euler_a_cfg_pp", "kl_optimal"}, ResumeCase{"res_multistep", "gits"}),
                         [](const auto& info) {
                             std::string n = info.param.sampler + "_" + info.param.scheduler;
                             for (auto& ch : n)
                                 if (!isalnum((unsigned char)ch)) ch = '_';
                             return n;
                         });

// encode-prompt, denoise, decode as separate processes write the same PNG file (pixels and
// metadata) as one `easel generate`; the --stage aliases do the same.
TEST(Stages, SeparateProcessesEqualGenerate) {
    auto d = tmpdir("sep");
    std::string out;
    const auto sampling = std::vector<std::string>{"-p", "a small red circle on the left, blue background", "-n", "", "-W", "64", "-H", "64",
                                                   "--steps", "6", "-s", "3", "--sampling-method", "euler_a"};
    ASSERT_EQ(run(cat(cat(cmd("generate"), {"--no-cache", "-o", (d / "gen.png").string()}), sampling), &out), 0) << out;
    ASSERT_EQ(run(cat(cat(cmd("encode-prompt"), {"--save-embeddings", (d / "c.safetensors").string()}), sampling), &out), 0) << out;
    EXPECT_NE(out.find("stage encode-prompt"), std::string::npos) << out;
    ASSERT_EQ(run(cat(cat(cmd("denoise"), {"--load-embeddings", (d / "c.safetensors").string(), "--save-latent",
                                         (d / "z.safetensors").string()}), sampling), &out), 0) << out;
    EXPECT_NE(out.find("stage denoise"), std::string::npos) << out;
    ASSERT_EQ(run(cat(cmd("decode"), {"--load-latent", (d / "z.safetensors").string(), "-o", (d / "st.png").string()}), &out), 0) << out;
    EXPECT_NE(out.find("stage decode"), std::string::npos) << out;
    EXPECT_EQ(slurp(d / "st.png"), slurp(d / "gen.png"));
    // aliases on the bare command (sd-cli style)
    ASSERT_EQ(run(cat(cat(model_args(), {"--stage", "te-encode", "--save-embeddings", (d / "c2.safetensors").string()}), sampling), &out), 0) << out;
    ASSERT_EQ(run(cat(cat(model_args(), {"--stage", "diffuse", "--load-embeddings", (d / "c2.safetensors").string(), "--save-latent",
                                         (d / "z2.safetensors").string()}), sampling), &out), 0) << out;
    ASSERT_EQ(run(cat(model_args(), {"--stage", "vae-decode", "--load-latent", (d / "z2.safetensors").string(), "-o", (d / "st2.png").string()}), &out), 0) << out;
    EXPECT_EQ(slurp(d / "st2.png"), slurp(d / "gen.png"));
    // generate's own --save-latent equals denoise's latent
    ASSERT_EQ(run(cat(cat(cmd("generate"), {"--no-cache", "-o", (d / "gen2.png").string(), "--save-latent",
                                         (d / "zg.safetensors").string(), "--save-embeddings", (d / "cg.safetensors").string()}), sampling), &out), 0) << out;
    EXPECT_EQ(latent_bytes(d / "zg.safetensors"), latent_bytes(d / "z.safetensors"));
    EXPECT_EQ(artifact_data_hash(read_artifact(d / "cg.safetensors", ArtifactKind::Conditioning)),
              artifact_data_hash(read_artifact(d / "c.safetensors", ArtifactKind::Conditioning)));
    fs::remove_all(d);
}

// img2img through encode-image -> denoise --load-latent -> decode equals generate -i.
TEST(Stages, Img2ImgSeparateProcessesEqualGenerate) {
    auto d = tmpdir("i2i");
    std::string out;
    const std::string img = (kSd / "case_init_image.png").string();
    const auto sampling = std::vector<std::string>{"-p", "a photo of a cat", "--steps", "8", "-s", "5", "--strength", "0.6", "--sampling-method", "euler"};
    ASSERT_EQ(run(cat(cat(cmd("generate"), {"--no-cache", "-i", img, "-o", (d / "gen.png").string()}), sampling), &out), 0) << out;
    ASSERT_EQ(run(cat(cat(cmd("encode-prompt"), {"--save-embeddings", (d / "c.safetensors").string()}), sampling), &out), 0) << out;
    ASSERT_EQ(run(cat(cmd("encode-image"), {"-i", img, "--save-latent", (d / "init.safetensors").string()}), &out), 0) << out;
    ASSERT_EQ(run(cat(cat(cmd("denoise"), {"--load-embeddings", (d / "c.safetensors").string(), "--load-latent",
                                         (d / "init.safetensors").string(), "--save-latent", (d / "z.safetensors").string()}), sampling), &out), 0) << out;
    ASSERT_EQ(run(cat(cmd("decode"), {"--load-latent", (d / "z.safetensors").string(), "-o", (d / "st.png").string()}), &out), 0) << out;
    EXPECT_EQ(slurp(d / "st.png"), slurp(d / "gen.png"));
    fs::remove_all(d);
}

// Refusals: one "error: ..." line, exit 1, the output file untouched.
TEST(Stages, BadArtifactsAreRefusedAndNothingIsOverwritten) {
    auto d = tmpdir("bad");
    std::string out;
    const fs::path cond = d / "c.safetensors", ck = d / "ck", outz = d / "out.safetensors";
    ASSERT_EQ(run(cat(cmd("encode-prompt"), {"-p", "a cat", "--save-embeddings", cond.string()}), &out), 0) << out;
    auto job = cat(cmd("denoise"), {"--load-embeddings", cond.string(), "-W", "64", "-H", "64", "--steps", "4", "-s", "1",
                                  "--sampling-method", "euler", "--checkpoint-dir", ck.string(), "--save-latent", outz.string()});
    ASSERT_EQ(run(job, &out), 0) << out;
    // a sentinel output file that must survive every refused run
    { std::ofstream(outz, std::ios::binary) << "keep me"; }
    auto refused = [&](const std::vector<std::string>& args, const std::string& want, const char* what) {
        std::string o;
        int rc = run(args, &o);
        EXPECT_EQ(rc, 1) << what << ": " << o;
        EXPECT_NE(o.find("error: "), std::string::npos) << what << ": " << o;
        EXPECT_NE(o.find(want), std::string::npos) << what << ": wanted '" << want << "' in: " << o;
        EXPECT_EQ(slurp(outz), "keep me") << what << ": output overwritten";
    };
    // truncated conditioning
    const std::string good = slurp(cond);
    const fs::path trunc = d / "trunc.safetensors";
    { std::ofstream(trunc, std::ios::binary) << good.substr(0, good.size() - 100); }
    auto job_with = [&](const fs::path& c) {
        auto j = job;
        for (size_t i = 0; i + 1 < j.size(); ++i)
            if (j[i] == "--load-embeddings") j[i + 1] = c.string();
        return j;
    };
    refused(job_with(trunc), "truncated", "truncated conditioning");
    // edited metadata (the prompt changed, same length)
    std::string edited = good;
    auto pos = edited.find("a cat");
    ASSERT_NE(pos, std::string::npos);
    edited.replace(pos, 5, "a dog");
    const fs::path ed = d / "edited.safetensors";
    { std::ofstream(ed, std::ios::binary) << edited; }
    refused(job_with(ed), "content hash mismatch", "edited conditioning");
    // a latent given as conditioning
    refused(job_with(ck / "image1-step0004.safetensors"), "expected a conditioning file", "wrong kind");
    // resume with another size and seed: both named
    auto j2 = job;
    for (size_t i = 0; i + 1 < j2.size(); ++i) {
        if (j2[i] == "-W") j2[i + 1] = "128";
        if (j2[i] == "-s") j2[i + 1] = "2";
    }
    j2.push_back("--resume");
    refused(j2, "width: checkpoint 64, now 128", "resume with another size");
    refused(j2, "seed: checkpoint 1, now 2", "resume with another seed");
    // resume with another model (the diffusers form of the same weights has other files)
    auto j3 = job;
    j3[2] = (kSd / "diffusers").string();
    j3.push_back("--resume-step");
    j3.push_back("2");
    refused(j3, "model_fingerprint: checkpoint", "resume with another model");
    // another sampler
    auto j4 = job;
    for (size_t i = 0; i + 1 < j4.size(); ++i)
        if (j4[i] == "--sampling-method") j4[i + 1] = "euler_a";
    j4.push_back("--resume");
    refused(j4, "sampler: checkpoint euler, now euler_a", "resume with another sampler");
    // a conditioning from a text encoder of another width (the demo model's CLIP, wider than sd_tiny's 64;
    // sd_tiny's UNet attends to 64)
    const fs::path demo_cond = d / "demo_cond.safetensors";
    const fs::path demo = fs::path(EASEL_SOURCE_DIR) / "models" / "demo" / "easel-demo-shapes.safetensors";
    ASSERT_EQ(run({"encode-prompt", "-m", demo.string(), "-t", "1", "-p", "a cat", "--save-embeddings", demo_cond.string()}, &out), 0) << out;
    refused(job_with(demo_cond), "does not match the UNet's cross-attention width 64", "conditioning of another width");
    fs::remove_all(d);
}

// A crash (or a full disk) can leave the latest checkpoint truncated or corrupt: --resume skips it,
// says which file and why, and continues from the one before it; the PNG is the same file as an
// uninterrupted run's. A readable checkpoint of another job is still refused.
TEST(Stages, ResumeSkipsATruncatedOrCorruptLatestCheckpoint) {
    auto d = tmpdir("ckpt_bad");
    std::string out;
    const int k = 4;
    auto args = cat(cmd("generate"), {"--no-cache", "-p", "a photo of a cat", "-W", "64", "-H", "64", "--steps", "8", "-s", "5",
                                      "--sampling-method", "dpm++2m"});
    ASSERT_EQ(run(cat(args, {"-o", (d / "ref.png").string()}), &out), 0) << out;
    for (const char* damage : {"truncated", "corrupt"}) {
        const fs::path ck = d / (std::string("ck_") + damage);
        ASSERT_TRUE(run_until_checkpoint_then_kill(cat(args, {"-o", (d / "res.png").string(), "--checkpoint-dir", ck.string()}), k,
                                                   d / "killed.log"));
        ASSERT_FALSE(fs::exists(d / "res.png"));
        const fs::path latest = ck / ckpt_name(k);
        auto bytes = slurp(latest);
        ASSERT_GT(bytes.size(), 1000u);
        if (std::string(damage) == "truncated") bytes.resize(bytes.size() / 2);  // as a crash mid-write leaves it
        else bytes[bytes.size() - 17] ^= 0x40;                                   // one flipped bit in the latent
        std::ofstream(latest, std::ios::binary | std::ios::trunc) << bytes;
        ASSERT_EQ(run(cat(args, {"-o", (d / "res.png").string(), "--checkpoint-dir", ck.string(), "--resume"}), &out), 0) << out;
        // one warning naming the skipped file and the reason, then the resume from step k - 1
        EXPECT_NE(out.find("--resume: skipping " + ckpt_name(k) + " (unreadable: "), std::string::npos) << damage << ": " << out;
        EXPECT_NE(out.find(std::string(damage) == "truncated" ? "truncated" : "content hash mismatch"), std::string::npos) << out;
        EXPECT_NE(out.find("resuming from " + (ck / ckpt_name(k - 1)).string()), std::string::npos) << damage << ": " << out;
        EXPECT_EQ(slurp(d / "res.png"), slurp(d / "ref.png")) << damage;
        fs::remove(d / "res.png");
    }
    // every checkpoint unreadable: one error naming them, nothing written
    const fs::path ck = d / "ck_all";
    ASSERT_TRUE(run_until_checkpoint_then_kill(cat(args, {"-o", (d / "res.png").string(), "--checkpoint-dir", ck.string()}), 2,
                                               d / "killed.log"));
    for (int s = 1; s <= 2; ++s) std::ofstream(ck / ckpt_name(s), std::ios::binary | std::ios::trunc) << "x";
    EXPECT_EQ(run(cat(args, {"-o", (d / "res.png").string(), "--checkpoint-dir", ck.string(), "--resume"}), &out), 1) << out;
    EXPECT_NE(out.find("error: --resume: no readable checkpoint of image 1 in " + ck.string() + " (all 2 are truncated or corrupt: " +
                       ckpt_name(2) + ", " + ckpt_name(1) + ")"),
              std::string::npos)
        << out;
    EXPECT_FALSE(fs::exists(d / "res.png"));
    fs::remove_all(d);
}

// Inpainting (ordinary model: the latent blend after every step) through generate: resumed
// from the checkpoint after step 3 the PNG is the same file as an uninterrupted run's; another
// mask is named as an init_hash mismatch.
TEST(Stages, InpaintingResumeIsBitIdentical) {
    auto d = tmpdir("inpaint");
    std::string out;
    auto args = cat(cmd("generate"), {"--no-cache", "-p", "a photo of a cat", "-i", (kSd / "case_init_image.png").string(), "--mask",
                                      (kSd / "case_mask.png").string(), "--steps", "8", "-s", "3", "--sampling-method", "euler_a"});
    ASSERT_EQ(run(cat(args, {"-o", (d / "ref.png").string()}), &out), 0) << out;
    ASSERT_EQ(run(cat(args, {"-o", (d / "ck.png").string(), "--checkpoint-dir", (d / "ck").string()}), &out), 0) << out;
    ASSERT_EQ(run(cat(args, {"-o", (d / "res.png").string(), "--checkpoint-dir", (d / "ck").string(), "--resume-step", "3"}), &out), 0) << out;
    EXPECT_NE(out.find("resuming from"), std::string::npos) << out;
    EXPECT_EQ(slurp(d / "res.png"), slurp(d / "ref.png"));
    EXPECT_EQ(slurp(d / "ck.png"), slurp(d / "ref.png"));
    auto other = args;
    for (size_t i = 0; i + 1 < other.size(); ++i)
        if (other[i] == "--mask") other[i + 1] = (kSd / "case_init_image.png").string();
    EXPECT_EQ(run(cat(other, {"-o", (d / "bad.png").string(), "--checkpoint-dir", (d / "ck").string(), "--resume"}), &out), 1) << out;
    EXPECT_NE(out.find("init_hash: checkpoint"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(d / "bad.png"));
    fs::remove_all(d);
}

// The second run with the same prompt takes the conditioning from the cache and never opens
// the text encoder file: it is replaced by zeros of the same size and time stamp (which would
// fail to load: checked with --no-cache), and the run still succeeds with the same image.
TEST(Stages, CacheHitNeverOpensTheTextEncoder) {
    auto d = tmpdir("cache");
    fs::copy(kSd / "diffusers", d / "model", fs::copy_options::recursive);
    const fs::path te = d / "model" / "text_encoder" / "model.safetensors";
    ASSERT_TRUE(fs::exists(te));
    auto args = std::vector<std::string>{"generate", "-t", "1", "--rng", "cpu", "-m", (d / "model").string(), "-p", "a photo of a cat", "-W",
                                         "64", "-H", "64", "--steps", "3", "--cache-dir", (d / "cache").string()};
    std::string out;
    ASSERT_EQ(run(cat(args, {"-o", (d / "a.png").string()}), &out), 0) << out;
    EXPECT_EQ(out.find("cache hit"), std::string::npos) << out;
    // replace the text encoder's weights by zeros: same size, same mtime
    struct stat st {};
    ASSERT_EQ(stat(te.c_str(), &st), 0);
    fs::rename(te, d / "te_moved.safetensors");
    {
        std::ofstream z(te, std::ios::binary);
        std::string zeros((size_t)st.st_size, '\0');
        z << zeros;
    }
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    ASSERT_EQ(utimensat(AT_FDCWD, te.c_str(), ts, 0), 0);
    if (geteuid() != 0) chmod(te.c_str(), 0);  // also unreadable where permissions apply
    ASSERT_EQ(run(cat(args, {"-o", (d / "b.png").string()}), &out), 0) << out;
    EXPECT_NE(out.find("cache hit: prompt conditioning"), std::string::npos) << out;
    EXPECT_NE(out.find("the text encoder was not opened"), std::string::npos) << out;
    EXPECT_EQ(slurp(d / "a.png"), slurp(d / "b.png"));
    // without the cache the same run must read the (now broken) text encoder and fail
    EXPECT_EQ(run(cat(args, {"--no-cache", "-o", (d / "c.png").string()}), &out), 1) << out;
    EXPECT_FALSE(fs::exists(d / "c.png"));
    fs::remove_all(d);
}

}  // namespace
