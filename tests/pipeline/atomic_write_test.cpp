// The platform layer (src/core/platform.h) and the atomic writes of artifacts, checkpoints and
// PNGs (issue 19: "a crash or a full disk at any moment leaves the previous state readable").
//
// FullDisk mounts a small tmpfs (root only: the test machine and CI run as root; a failed mount
// FAILS the test), writes a file, fills the disk, and writes the same path again: the write must
// fail with one line naming the full disk, the previous file must read back unchanged, and no
// temporary file may remain. Crash kills writers with SIGKILL at random moments (a child process
// writing checkpoints in a loop, and `easel generate --checkpoint-dir` itself): every checkpoint
// present must be a complete, valid one. (A process crash keeps the page cache; that the fsyncs
// also survive a power cut is the kernel's promise for fsync of file and folder, not testable here.)
#include "core/error.h"
#include "core/platform.h"
#include "pipeline/artifact.h"
#include "pipeline/image_io.h"
#include "pipeline/stages.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

namespace fs = std::filesystem;
using namespace easel;
using namespace easel::pipeline;

namespace {

fs::path tmpdir(const std::string& name) {
    fs::path d = fs::path(testing::TempDir()) / ("easel_atomic_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

std::vector<uint8_t> slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

/// Names in `d` that are temporary files of write_file_atomic (".<name>.tmp-...").
std::vector<std::string> temp_files(const fs::path& d) {
    std::vector<std::string> r;
    for (auto& e : fs::directory_iterator(d)) {
        const std::string n = e.path().filename().string();
        if (n.find(".tmp-") != std::string::npos) r.push_back(n);
    }
    return r;
}

Artifact artifact_of(size_t floats, float v) {
    Artifact a;
    a.kind = ArtifactKind::Latent;
    a.meta["params"] = R"({"what":"atomic write test"})";
    a.add_f32("latent", {(int64_t)floats}, std::vector<float>(floats, v));
    return a;
}

sampling::SamplerState state_of(size_t n, float v) {
    sampling::SamplerState st;
    st.kind = sampling::SamplerKind::Euler;
    st.shape = {1, 1, 1, (int64_t)n};
    st.x.assign(n, v);
    st.step = 1;
    st.sigmas = {14.6f, 7.0f, 0.0f};
    st.timesteps = {999.0f, 500.0f};
    st.rng = sampling::Rng(sampling::RngKind::Cpu, 7).save();
    return st;
}

sampling::Schedule schedule_of(const sampling::SamplerState& st) {
    sampling::Schedule s;
    s.sigmas = st.sigmas;
    s.timesteps = st.timesteps;
    return s;
}

nlohmann::json job_of() {
    DenoiseJob job;
    job.method = sampling::SamplerKind::Euler;
    job.seed = 7;
    job.width = job.height = 64;
    job.steps = 2;
    return job_params(job, "SD1.x", "xxh3-128:aa", "xxh3-128:cc", "");
}

Image image_of(int w, int h, uint32_t seed) {
    Image im;
    im.width = w;
    im.height = h;
    im.channels = 3;
    im.pixels.resize((size_t)w * h * 3);
    std::mt19937 g(seed);
    for (auto& p : im.pixels) p = (uint8_t)g();  // noise: PNG cannot compress it
    return im;
}

int run(const std::string& cmd) {
    int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The platform layer

// UTF-8 text <-> path, with the folder names of the users in issue 25 ("Рабочий стол" with a
// space, "FLUX.2"): a file written and mapped through those paths holds what was written.
TEST(Platform, NonAsciiPathsRoundTrip) {
    const std::string name = "Рабочий стол/FLUX.2 файлы/модель.bin";
    EXPECT_EQ(platform::path_utf8(platform::u8path(name)), name);
    auto d = tmpdir("utf8");
    const fs::path p = d / platform::u8path(name);
    fs::create_directories(p.parent_path());
    const std::vector<uint8_t> bytes = {1, 2, 3, 250};
    platform::write_file_atomic(p, bytes);
    auto m = platform::FileMapping::open(p);
    ASSERT_EQ(m.size(), 4u);
    EXPECT_EQ(std::vector<uint8_t>(m.data(), m.data() + 4), bytes);
    // on POSIX the native name is the UTF-8 bytes themselves
    EXPECT_EQ(p.filename().string(), "модель.bin");
    fs::remove_all(d);
}

TEST(Platform, FileMappingRefusesFoldersAndMissingFiles) {
    auto d = tmpdir("map");
    EXPECT_NE(error_of([&] { platform::FileMapping::open(d); }).find("is a folder"), std::string::npos);
    EXPECT_NE(error_of([&] { platform::FileMapping::open(d / "missing"); }).find("cannot open"), std::string::npos);
    std::ofstream(d / "empty").close();
    auto m = platform::FileMapping::open(d / "empty");
    EXPECT_EQ(m.size(), 0u);
    EXPECT_EQ(m.data(), nullptr);
    fs::remove_all(d);
}

// The lock excludes another process while held and is free again once released.
TEST(Platform, FileLockIsExclusiveAcrossProcesses) {
    auto d = tmpdir("lock");
    const fs::path lf = d / "lock";
    auto child_can_lock = [&] {
        pid_t pid = fork();
        if (pid == 0) _exit(platform::FileLock::try_lock(lf) ? 0 : 1);
        int st = 0;
        waitpid(pid, &st, 0);
        return WIFEXITED(st) && WEXITSTATUS(st) == 0;
    };
    {
        auto l = platform::FileLock::try_lock(lf);
        ASSERT_TRUE(l && l->held());
        EXPECT_FALSE(child_can_lock());
    }
    EXPECT_TRUE(child_can_lock());
    fs::remove_all(d);
}

// Two easel processes never write checkpoints into one folder: the second is refused in one line.
TEST(Platform, CheckpointFolderIsLocked) {
    auto d = tmpdir("ckpt_lock");
    auto held = platform::FileLock::try_lock(d / ".easel.lock");
    ASSERT_TRUE(held);
    const std::string model = std::string(EASEL_SOURCE_DIR) + "/models/demo/easel-demo-shapes.safetensors";
    const fs::path err = d / "stderr.txt";
    EXPECT_EQ(run(std::string(EASEL_BINARY) + " generate -m '" + model + "' -p x -W 64 -H 64 --steps 1 -t 1 --no-cache --checkpoint-dir '" +
                  d.string() + "' -o '" + (d / "o.png").string() + "' > /dev/null 2> '" + err.string() + "'"),
              1);
    std::ifstream f(err);
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(all.find("another easel process is writing checkpoints there"), std::string::npos) << all;
    EXPECT_FALSE(fs::exists(d / "o.png"));
    fs::remove_all(d);
}

TEST(Platform, FileInfoAndProcess) {
    auto d = tmpdir("info");
    const std::vector<uint8_t> bytes(1000, 7);
    platform::write_file_atomic(d / "f", bytes);
    auto i = platform::file_info(d / "f");
    ASSERT_TRUE(i);
    EXPECT_EQ(i->size, 1000u);
    EXPECT_FALSE(i->is_directory);
    EXPECT_TRUE(platform::file_info(d)->is_directory);
    EXPECT_FALSE(platform::file_info(d / "missing"));
    EXPECT_TRUE(platform::touch_access_time(d / "f"));
    EXPECT_EQ(platform::process_id(), (int64_t)getpid());
    EXPECT_TRUE(fs::equivalent(platform::executable_path(), fs::read_symlink("/proc/self/exe")));
    EXPECT_GT(platform::physical_memory_bytes(), 0u);
    EXPECT_GT(platform::available_memory_bytes(), 0u);
    EXPECT_GT(platform::peak_rss_bytes(), 0u);
    fs::remove_all(d);
}

// ---------------------------------------------------------------------------------------------
// A full disk

class FullDisk : public ::testing::Test {
protected:
    fs::path mnt_;
    void SetUp() override {
        mnt_ = tmpdir("tmpfs");
        // 1 MiB: room for each first write (the largest is a 256 KiB artifact), then filled up
        const std::string cmd = "mount -t tmpfs -o size=1m,mode=0755 easel-test '" + mnt_.string() + "' 2>&1";
        ASSERT_EQ(run(cmd), 0) << "cannot mount a tmpfs (" << cmd
                               << "): this test needs root (the test machine and CI run as root) and fails without it";
    }
    void TearDown() override {
        run("umount '" + mnt_.string() + "'");
        fs::remove_all(mnt_);
    }
    /// Fills the tmpfs, then frees `room` bytes (so that a write starts, then runs out).
    void fill(uint64_t room) {
        const fs::path f = mnt_ / "filler";
        std::FILE* fp = std::fopen(f.c_str(), "wb");
        ASSERT_TRUE(fp);
        std::vector<char> chunk(4096, 'x');
        uint64_t n = 0;
        while (std::fwrite(chunk.data(), 1, chunk.size(), fp) == chunk.size()) n += chunk.size();
        std::fclose(fp);
        n = fs::file_size(f);
        ASSERT_GT(n, 0u);
        fs::resize_file(f, n > room ? n - room : 0);
        // what is left must be less than the writes below need
        ASSERT_LT(fs::space(mnt_).available, 64u * 1024);
    }
    /// The message is one line naming the full disk and the file.
    static void expect_one_line(const std::string& e, const fs::path& p) {
        EXPECT_NE(e.find("no space left on the device"), std::string::npos) << e;
        EXPECT_NE(e.find(p.string()), std::string::npos) << e;
        EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    }
};

TEST_F(FullDisk, ArtifactKeepsThePreviousFile) {
    const fs::path p = mnt_ / "latent.safetensors";
    write_artifact(p, artifact_of(64 * 1024, 1.0f));  // 256 KiB
    const auto before = slurp(p);
    for (uint64_t room : {0u, 16u * 1024}) {  // no room at all; room for the first pages only
        fill(room);
        const std::string e = error_of([&] { write_artifact(p, artifact_of(64 * 1024, 2.0f)); });
        expect_one_line(e, p);
        EXPECT_EQ(slurp(p), before);
        EXPECT_EQ(read_artifact(p, ArtifactKind::Latent).f32("latent")[0], 1.0f);
        EXPECT_TRUE(temp_files(mnt_).empty());
        fs::remove(mnt_ / "filler");
    }
}

TEST_F(FullDisk, CheckpointKeepsThePreviousFile) {
    const fs::path d = mnt_ / "ckpt";
    fs::create_directories(d);
    const fs::path p = checkpoint_path(d, 0, 1);
    const auto st = state_of(16 * 1024, 0.5f);
    write_checkpoint(p, st, job_of());
    fill(8 * 1024);
    const std::string e = error_of([&] { write_checkpoint(p, state_of(16 * 1024, 0.75f), job_of()); });
    expect_one_line(e, p);
    EXPECT_EQ(load_checkpoint(p, job_of(), schedule_of(st)).x, st.x);
    EXPECT_TRUE(temp_files(d).empty());
}

TEST_F(FullDisk, PngKeepsThePreviousFile) {
    const fs::path p = mnt_ / "out.png";
    const Image a = image_of(128, 128, 1);  // ~48 KiB of noise
    save_png(p, a);
    fill(4 * 1024);
    const std::string e = error_of([&] { save_png(p, image_of(128, 128, 2)); });
    expect_one_line(e, p);
    EXPECT_EQ(load_image(p, 3).pixels, a.pixels);
    EXPECT_TRUE(temp_files(mnt_).empty());
}

// The command line: a generate whose PNG does not fit ends with one `error:` line, exit 1, and
// the previous image unchanged.
TEST_F(FullDisk, GenerateSaysSoInOneLine) {
    const std::string model = std::string(EASEL_SOURCE_DIR) + "/models/demo/easel-demo-shapes.safetensors";
    const fs::path out = mnt_ / "out.png", err = tmpdir("cli") / "stderr.txt";
    auto gen = [&](int seed) {
        return run(std::string(EASEL_BINARY) + " generate -m '" + model + "' -p 'a large red circle in the centre, blue background' -W 64 -H 64 --steps 1 -t 1 --no-cache -s " +
                   std::to_string(seed) + " -o '" + out.string() + "' > /dev/null 2> '" + err.string() + "'");
    };
    ASSERT_EQ(gen(1), 0);
    const auto before = slurp(out);
    fill(0);
    EXPECT_EQ(gen(2), 1);
    std::ifstream f(err);
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(all.empty());
    // the progress and timing lines may precede it; the error is one line, the last
    std::vector<std::string> errors;
    std::string last;
    for (size_t a = 0, b; a < all.size(); a = b + 1) {
        b = all.find('\n', a);
        if (b == std::string::npos) b = all.size();
        last = all.substr(a, b - a);
        if (last.rfind("error:", 0) == 0) errors.push_back(last);
    }
    ASSERT_EQ(errors.size(), 1u) << all;
    EXPECT_EQ(errors[0], last) << all;
    EXPECT_EQ(last.rfind("error: cannot write " + out.string(), 0), 0u) << all;
    EXPECT_NE(last.find("no space left on the device"), std::string::npos) << all;
    EXPECT_EQ(slurp(out), before);
    EXPECT_TRUE(temp_files(mnt_).empty());
    fs::remove_all(err.parent_path());
}

// ---------------------------------------------------------------------------------------------
// A crash at any moment

// A child writes checkpoints over three names in a loop and is killed (SIGKILL) after a random
// 0-40 ms, 30 times: every checkpoint present reads back complete, with one of the states written.
TEST(Crash, KilledWriterLeavesOnlyValidCheckpoints) {
    auto d = tmpdir("crash");
    std::mt19937 g(1234);
    int present = 0;
    for (int round = 0; round < 30; ++round) {
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            for (int k = 0;; ++k) write_checkpoint(checkpoint_path(d, 0, k % 3), state_of(64 * 1024, (float)k), job_of());
        }
        std::this_thread::sleep_for(std::chrono::microseconds(g() % 40000));
        kill(pid, SIGKILL);
        int st = 0;
        waitpid(pid, &st, 0);
        ASSERT_TRUE(WIFSIGNALED(st));
        for (int k = 0; k < 3; ++k) {
            const fs::path p = checkpoint_path(d, 0, k);
            if (!fs::exists(p)) continue;
            ++present;
            sampling::SamplerState back;
            ASSERT_NO_THROW(back = load_checkpoint(p, job_of(), schedule_of(state_of(1, 0)))) << p << " after round " << round;
            ASSERT_EQ(back.x.size(), 64u * 1024);
            EXPECT_EQ((int)back.x[0] % 3, k);  // written by iteration k, k+3, ...
            EXPECT_EQ(back.x.front(), back.x.back());
        }
    }
    EXPECT_GT(present, 0);
    fs::remove_all(d);
}

// `easel generate --checkpoint-dir` killed with SIGKILL three times, each 0-100 ms after its
// n-th checkpoint appeared (the test waits for the files, not for the clock): every checkpoint
// file present is a complete, valid checkpoint artifact.
TEST(Crash, KilledGenerateLeavesOnlyValidCheckpoints) {
    const std::string model = std::string(EASEL_SOURCE_DIR) + "/models/demo/easel-demo-shapes.safetensors";
    auto d = tmpdir("crash_cli");
    std::mt19937 g(99);
    int checked = 0;
    for (int round = 1; round <= 3; ++round) {
        const fs::path dir = d / std::to_string(round);
        fs::create_directories(dir);
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            const std::string out = (dir / "out.png").string(), ck = dir.string();
            if (!std::freopen("/dev/null", "w", stderr) || !std::freopen("/dev/null", "w", stdout)) _exit(126);
            execl(EASEL_BINARY, EASEL_BINARY, "generate", "-m", model.c_str(), "-p", "a small green star on the left, white background", "-W",
                  "64", "-H", "64", "--steps", "500", "-t", "1", "--no-cache", "--checkpoint-dir", ck.c_str(), "-o", out.c_str(), (char*)nullptr);
            _exit(127);
        }
        auto checkpoints = [&] {
            int n = 0;
            for (auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".safetensors";
            return n;
        };
        const auto t0 = std::chrono::steady_clock::now();
        int st = 0;
        bool ended = false;
        while (checkpoints() < round * 3 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(300)) {
            if (waitpid(pid, &st, WNOHANG) == pid) {
                ended = true;
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        ASSERT_FALSE(ended) << "easel ended before it was killed (status " << st << ")";
        std::this_thread::sleep_for(std::chrono::microseconds(g() % 100000));
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        ASSERT_TRUE(WIFSIGNALED(st)) << "easel ended before it was killed (exit " << WEXITSTATUS(st) << ")";
        for (auto& e : fs::directory_iterator(dir)) {
            const std::string n = e.path().filename().string();
            if (n.find(".tmp-") != std::string::npos) continue;  // a killed write's temporary file: never read by easel
            if (n == ".easel.lock") continue;  // the checkpoint folder's lock (core/platform.h), not an artifact
            ASSERT_NO_THROW(read_artifact(e.path(), ArtifactKind::Checkpoint)) << e.path();
            ++checked;
        }
    }
    EXPECT_GE(checked, 3 + 6 + 9);
    fs::remove_all(d);
}
