// Artifacts (safetensors files with easel metadata), checkpoints, fingerprints and the cache.
#include "io/weight_index.h"
#include "pipeline/artifact.h"
#include "pipeline/cache.h"
#include "pipeline/fingerprint.h"
#include "pipeline/stages.h"
#include "core/build_id.h"
#include "core/error.h"
#include "easel_version.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace easel;
using namespace easel::pipeline;

namespace {

fs::path tmpdir(const std::string& name) {
    fs::path d = fs::path(testing::TempDir()) / ("easel_artifact_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

std::vector<uint8_t> slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void spit(const fs::path& p, const std::vector<uint8_t>& b) {
    std::ofstream f(p, std::ios::binary);
    f.write((const char*)b.data(), (std::streamsize)b.size());
}

Artifact sample() {
    Artifact a;
    a.kind = ArtifactKind::Conditioning;
    a.meta["params"] = R"({"prompt":"a cat"})";
    a.meta["model"] = "SD1.x";
    a.add_f32("positive.context", {2, 3}, std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f, 1e-7f, -0.0f});
    a.add_i32("positive.token_ids", {2}, std::vector<int32_t>{49406, 49407});
    a.add_u8("positive.mask", {2}, std::vector<uint8_t>{1, 0});
    a.add_i64("steps", {1}, std::vector<int64_t>{1234567890123});
    return a;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

// The file is standard safetensors: header length, JSON header with __metadata__ of strings and
// tensors with dtype/shape/data_offsets; easel's own safetensors reader (io::WeightIndex) reads
// it back with the same values.
TEST(Artifact, IsStandardSafetensorsReadableByWeightIndex) {
    auto d = tmpdir("std");
    write_artifact(d / "a.safetensors", sample());
    auto b = slurp(d / "a.safetensors");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= (uint64_t)b[(size_t)i] << (8 * i);
    ASSERT_LE(8 + n, b.size());
    EXPECT_EQ((8 + n) % 8, 0u);
    auto h = nlohmann::json::parse(b.begin() + 8, b.begin() + 8 + (long)n);
    EXPECT_EQ(h["__metadata__"]["format"], "easel-artifact");
    EXPECT_EQ(h["__metadata__"]["kind"], "conditioning");
    EXPECT_EQ(h["__metadata__"]["format_version"], "1");
    EXPECT_EQ(h["positive.context"]["dtype"], "F32");
    EXPECT_EQ(h["positive.context"]["shape"], nlohmann::json::array({2, 3}));

    auto wi = io::WeightIndex::open(d / "a.safetensors");
    auto* t = wi.find("positive.context");
    ASSERT_NE(t, nullptr);
    auto v = wi.read_f32(*t);
    EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f, 1e-7f, -0.0f}));
    EXPECT_EQ(wi.read_i64(*wi.find("positive.token_ids")), (std::vector<int64_t>{49406, 49407}));
    EXPECT_EQ(wi.read_i64(*wi.find("steps")), (std::vector<int64_t>{1234567890123}));
    EXPECT_EQ(wi.metadata().at("model").s, "SD1.x");

    Artifact r = read_artifact(d / "a.safetensors", ArtifactKind::Conditioning);
    EXPECT_EQ(r.f32("positive.context"), (std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f, 1e-7f, -0.0f}));
    EXPECT_EQ(r.u8("positive.mask"), (std::vector<uint8_t>{1, 0}));
    EXPECT_EQ(r.at("params"), R"({"prompt":"a cat"})");
    EXPECT_EQ(artifact_data_hash(r), artifact_data_hash(sample()));
    fs::remove_all(d);
}

// Every truncation, any flipped data byte and an edited metadata value are refused.
TEST(Artifact, TruncatedOrEditedIsRefused) {
    auto d = tmpdir("corrupt");
    write_artifact(d / "a.safetensors", sample());
    const auto good = slurp(d / "a.safetensors");
    for (size_t len = 0; len < good.size(); ++len) {
        std::vector<uint8_t> b(good.begin(), good.begin() + (long)len);
        std::string e = error_of([&] { parse_artifact(b, ArtifactKind::Conditioning, "t"); });
        EXPECT_FALSE(e.empty()) << "truncated to " << len << " bytes was accepted";
    }
    // flip one byte of tensor data (the last byte of the file)
    auto b = good;
    b.back() ^= 0x40;
    EXPECT_NE(error_of([&] { parse_artifact(b, ArtifactKind::Conditioning, "t"); }).find("content hash mismatch"), std::string::npos);
    // edit the prompt in the header, same length
    std::string s(good.begin(), good.end());
    auto pos = s.find("a cat");
    ASSERT_NE(pos, std::string::npos);
    s.replace(pos, 5, "a dog");
    std::vector<uint8_t> e(s.begin(), s.end());
    EXPECT_NE(error_of([&] { parse_artifact(e, ArtifactKind::Conditioning, "t"); }).find("content hash mismatch"), std::string::npos);
    // the wrong kind
    EXPECT_NE(error_of([&] { parse_artifact(good, ArtifactKind::Latent, "t"); }).find("is a conditioning file, expected a latent file"),
              std::string::npos);
    fs::remove_all(d);
}

// A write into a missing folder fails with Error(Io) and leaves nothing; a rewrite replaces the
// file whole and leaves no temporary file.
TEST(Artifact, AtomicWrite) {
    auto d = tmpdir("atomic");
    EXPECT_NE(error_of([&] { write_artifact(d / "no" / "a.safetensors", sample()); }).find("does not exist"), std::string::npos);
    write_artifact(d / "a.safetensors", sample());
    Artifact b = sample();
    b.meta["params"] = R"({"prompt":"another"})";
    write_artifact(d / "a.safetensors", b);
    EXPECT_EQ(read_artifact(d / "a.safetensors", ArtifactKind::Conditioning).at("params"), R"({"prompt":"another"})");
    int files = 0;
    for (auto& e : fs::directory_iterator(d)) {
        (void)e;
        ++files;
    }
    EXPECT_EQ(files, 1);
    fs::remove_all(d);
}

// Checkpoints: the state round-trips bit for bit; a job that differs is refused naming each
// difference.
TEST(Checkpoint, RoundTripAndMismatchNamed) {
    auto d = tmpdir("ckpt");
    sampling::SamplerState st;
    st.kind = sampling::SamplerKind::DpmPP2M;
    st.shape = {1, 1, 1, 3};
    st.x = {0.1f, -0.2f, 0.3f};
    st.step = 1;
    st.sigmas = {14.6f, 7.0f, 0.0f};
    st.timesteps = {999.0f, 500.0f};
    st.old_denoised = {1.0f, 2.0f, 3.0f};
    st.rng = sampling::Rng(sampling::RngKind::Cpu, 7).save();
    sampling::Schedule sch;
    sch.sigmas = st.sigmas;
    sch.timesteps = st.timesteps;
    DenoiseJob job;
    job.method = sampling::SamplerKind::DpmPP2M;
    job.seed = 7;
    job.width = job.height = 64;
    job.steps = 2;
    auto j = job_params(job, "SD1.x", "xxh3-128:aa", "xxh3-128:cc", "");
    write_checkpoint(checkpoint_path(d, 0, 1), st, j);
    EXPECT_EQ(find_checkpoint(d, 0)->filename(), "image1-step0001.safetensors");
    auto back = load_checkpoint(checkpoint_path(d, 0, 1), j, sch);
    EXPECT_EQ(back.x, st.x);
    EXPECT_EQ(back.old_denoised, st.old_denoised);
    EXPECT_EQ(back.rng, st.rng);
    EXPECT_EQ(back.step, 1);

    DenoiseJob other = job;
    other.seed = 8;
    other.method = sampling::SamplerKind::Euler;
    other.width = 128;
    auto j2 = job_params(other, "SD1.x", "xxh3-128:bb", "xxh3-128:cc", "");
    sampling::Schedule sch2 = sch;
    sch2.sigmas[0] = 14.5f;
    std::string e = error_of([&] { load_checkpoint(checkpoint_path(d, 0, 1), j2, sch2); });
    for (const char* want : {"seed: checkpoint 7, now 8", "sampler: checkpoint dpm++2m, now euler", "width: checkpoint 64, now 128",
                             "model_fingerprint: checkpoint xxh3-128:aa, now xxh3-128:bb", "sigmas"})
        EXPECT_NE(e.find(want), std::string::npos) << want << " not in: " << e;
    fs::remove_all(d);
}

// Fast fingerprints see size, mtime and sampled content; full ones every byte but not mtime.
TEST(Fingerprint, FastAndFull) {
    auto d = tmpdir("fp");
    std::vector<uint8_t> big(6u << 20);
    for (size_t i = 0; i < big.size(); ++i) big[i] = (uint8_t)(i * 2654435761u >> 13);
    spit(d / "m.bin", big);
    const auto fast = model_fingerprint({(d / "m.bin").string()}), full = model_fingerprint({(d / "m.bin").string()}, true);
    EXPECT_EQ(fast.rfind("xxh3-128:", 0), 0u);
    EXPECT_EQ(fast, model_fingerprint({(d / "m.bin").string()}));
    // same bytes, another mtime: fast differs, full equal
    struct timespec ts[2] = {{1000, 0}, {1000, 0}};
    utimensat(AT_FDCWD, (d / "m.bin").c_str(), ts, 0);
    EXPECT_NE(fast, model_fingerprint({(d / "m.bin").string()}));
    EXPECT_EQ(full, model_fingerprint({(d / "m.bin").string()}, true));
    // a byte in the header region changes both
    const auto fast2 = model_fingerprint({(d / "m.bin").string()});
    big[100] ^= 1;
    spit(d / "m.bin", big);
    utimensat(AT_FDCWD, (d / "m.bin").c_str(), ts, 0);
    EXPECT_NE(fast2, model_fingerprint({(d / "m.bin").string()}));
    EXPECT_NE(full, model_fingerprint({(d / "m.bin").string()}, true));
    // stat identity: no open needed, unchanged by content edits that keep size and mtime
    const auto id = file_identity({(d / "m.bin").string()});
    big[200] ^= 1;
    spit(d / "m.bin", big);
    utimensat(AT_FDCWD, (d / "m.bin").c_str(), ts, 0);
    EXPECT_EQ(id, file_identity({(d / "m.bin").string()}));
    fs::remove_all(d);
}

// The cache evicts the least recently used entry (by access time) when over its cap, and a
// corrupt entry is a miss that gets deleted.
TEST(Cache, LruEvictionAndCorruptEntry) {
    auto d = tmpdir("cache");
    Artifact a = sample();
    const uint64_t one = serialize_artifact(a).size();
    ArtifactCache c(d, 2 * one + one / 2);  // room for two entries
    c.put("k1", a);
    c.put("k2", a);
    // k1 used after k2: k2 is the least recently used
    struct timespec old[2] = {{1000, 0}, {UTIME_OMIT, UTIME_OMIT}};
    utimensat(AT_FDCWD, c.path(ArtifactKind::Conditioning, "k1").c_str(), old, 0);
    utimensat(AT_FDCWD, c.path(ArtifactKind::Conditioning, "k2").c_str(), old, 0);
    ASSERT_TRUE(c.get(ArtifactKind::Conditioning, "k1").has_value());
    c.put("k3", a);
    EXPECT_TRUE(fs::exists(c.path(ArtifactKind::Conditioning, "k1")));
    EXPECT_FALSE(fs::exists(c.path(ArtifactKind::Conditioning, "k2")));
    EXPECT_TRUE(fs::exists(c.path(ArtifactKind::Conditioning, "k3")));
    EXPECT_LE(c.total_bytes(), 2 * one + one / 2);
    // corrupt k3: a miss, and deleted
    auto b = slurp(c.path(ArtifactKind::Conditioning, "k3"));
    b.resize(b.size() - 3);
    spit(c.path(ArtifactKind::Conditioning, "k3"), b);
    EXPECT_FALSE(c.get(ArtifactKind::Conditioning, "k3").has_value());
    EXPECT_FALSE(fs::exists(c.path(ArtifactKind::Conditioning, "k3")));
    EXPECT_NE(cache_key({"a", "b"}), cache_key({"ab", ""}));
    fs::remove_all(d);
}

// hash_parts is xxh3-128 over (u64 length, bytes) of each part; a cache key is that over the
// build identity and then the parts, so an entry of another build is never found.
TEST(ArtifactCache, KeysHashTheBuildIdentityFirst) {
    std::string bytes;
    for (std::string p : {"ab", "", "c"}) {
        const uint64_t n = p.size();
        bytes.append((const char*)&n, sizeof n);
        bytes += p;
    }
    const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
    EXPECT_EQ(hash_parts({"ab", "", "c"}), fmt::format("{:016x}{:016x}", h.high64, h.low64));
    EXPECT_EQ(cache_key({"ab", "", "c"}), hash_parts({easel::build_identity(), "ab", "", "c"}));
    EXPECT_NE(cache_key({"ab", "", "c"}), hash_parts({"ab", "", "c"}));
    // the identity: version, ggml commit and the test binary's GNU build-id, as readelf reads it
    // from the file (an independent reader of the same note)
    const std::string& id = easel::build_identity();
    EXPECT_EQ(id.rfind(std::string("easel ") + EASEL_VERSION + " ggml " + EASEL_GGML_COMMIT + " build ", 0), 0u) << id;
    std::string notes;
    // (/proc/self/exe inside popen would name the shell or readelf itself: this process by its pid)
    const std::string cmd = "readelf -n /proc/" + std::to_string(::getpid()) + "/exe 2>/dev/null";
    if (FILE* f = popen(cmd.c_str(), "r")) {
        char buf[4096];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, f)) > 0) notes.append(buf, k);
        pclose(f);
    }
    const size_t at = notes.find("Build ID: ");
    ASSERT_NE(at, std::string::npos) << "readelf -n found no GNU build-id note in the test binary:\n" << notes;
    const std::string want = notes.substr(at + 10, notes.find('\n', at) - at - 10);
    EXPECT_EQ(id.substr(id.rfind(' ') + 1), want) << id;
}
