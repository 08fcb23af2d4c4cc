// The server's engine (server::Service over a pipeline::Generator) on the bundled demo model,
// without HTTP: a job gives the same PNG bytes as `easel generate` with the same settings; a job
// stopped after a few steps (as on SIGTERM) is queued again, resumes from its checkpoint in a
// new Service on the same state folder and ends with the same bytes; queued jobs cancel; an
// interrupt ends sampling early with an image; a request the model cannot take is refused.
// Small sizes and few steps: these check plumbing, not image quality.
#include "core/error.h"
#include "pipeline/generate.h"
#include "pipeline/stages.h"
#include "server/job_store.h"
#include "server/service.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace {

namespace fs = std::filesystem;
using namespace easel;
using namespace std::chrono_literals;

const fs::path kModel = fs::path(EASEL_SOURCE_DIR) / "models" / "demo" / "easel-demo-shapes.safetensors";

pipeline::GenerateParams base_params(const fs::path& tmp) {
    pipeline::GenerateParams p;
    p.model = kModel.string();
    p.width = p.height = 64;
    p.steps = 2;
    p.cfg_scale = 5;
    p.sampling_method = "euler";
    p.threads = 2;
    p.cache_dir = (tmp / "cache").string();
    return p;
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

/// `easel generate` with the server's defaults and the job's fields: the reference bytes.
std::vector<uint8_t> generate_png(pipeline::GenerateParams p, const fs::path& out) {
    p.output = out.string();
    auto rep = pipeline::generate(p);
    return read_bytes(rep.outputs.at(0));
}

fs::path fresh_dir(const std::string& name) {
    fs::path d = fs::path(testing::TempDir()) / fmt::format("easel_server_{}_{}", name, getpid());
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

server::ServiceOptions options(const fs::path& state) {
    server::ServiceOptions o;
    o.state_dir = state;
    o.max_queue = 4;
    return o;
}

TEST(ServerService, JobEqualsGenerateBytes) {
    const fs::path tmp = fresh_dir("bytes");
    pipeline::GenerateParams base = base_params(tmp);
    pipeline::Generator gen(base, {.keep_loaded = true});
    gen.open(64, 64);
    server::Service svc(gen, options(tmp / "state"));
    server::JobRequest r;
    r.prompt = "a large red circle in the centre, blue background";
    r.seed = 3;
    r.steps = 3;
    const std::string id = svc.submit(r);
    auto rec = svc.wait(id, 120s);
    ASSERT_TRUE(rec);
    ASSERT_EQ(rec->state, server::kDone) << rec->error;
    ASSERT_EQ(rec->result["images"].size(), 1u);
    const auto got = svc.image_bytes(*rec, 0);
    pipeline::GenerateParams g = base;
    g.prompt = r.prompt;
    g.seed = 3;
    g.steps = 3;
    const auto want = generate_png(g, tmp / "ref.png");
    EXPECT_EQ(got, want) << "a server job must give easel generate's PNG bytes";
    EXPECT_NE(rec->result["infotexts"][0].get<std::string>().find("Steps: 3"), std::string::npos);
    // a second job on the loaded model, other size and seed (per-request overrides)
    r.width = 32;
    r.height = 48;
    r.seed = 4;
    rec = svc.wait(svc.submit(r), 120s);
    ASSERT_EQ(rec->state, server::kDone) << rec->error;
    EXPECT_EQ(rec->result["width"], 32);
    EXPECT_EQ(rec->result["height"], 48);
}

TEST(ServerService, StoppedJobResumesWithSameBytes) {
    const fs::path tmp = fresh_dir("resume");
    pipeline::GenerateParams base = base_params(tmp);
    server::JobRequest r;
    r.prompt = "a small green square on the left, white background";
    r.seed = 11;
    r.steps = 8;
    std::string id;
    {
        pipeline::Generator gen(base, {.keep_loaded = true});
        gen.open(64, 64);
        server::Service svc(gen, options(tmp / "state"));
        id = svc.submit(r);
        for (int i = 0; i < 600 && svc.live().step < 3; ++i) std::this_thread::sleep_for(10ms);
        ASSERT_GE(svc.live().step, 3) << "the job did not reach step 3";
        svc.stop();  // as SIGTERM: ends after the current step, checkpoint kept
        auto rec = svc.get(id);
        ASSERT_EQ(rec->state, server::kQueued) << "a job stopped with the server is queued again";
        EXPECT_TRUE(pipeline::find_checkpoint(tmp / "state" / "jobs" / id / "ckpt", 0).has_value());
    }
    pipeline::Generator gen(base, {.keep_loaded = true});
    gen.open(64, 64);
    server::Service svc(gen, options(tmp / "state"));
    auto rec = svc.wait(id, 120s);
    ASSERT_TRUE(rec);
    ASSERT_EQ(rec->state, server::kDone) << rec->error;
    pipeline::GenerateParams g = base;
    g.prompt = r.prompt;
    g.seed = 11;
    g.steps = 8;
    EXPECT_EQ(svc.image_bytes(*rec, 0), generate_png(g, tmp / "ref.png")) << "the resumed job must end with the uninterrupted bytes";
    EXPECT_FALSE(fs::exists(tmp / "state" / "jobs" / id / "ckpt")) << "checkpoints are removed once the job is done";
}

TEST(ServerService, QueueBoundCancelAndInterrupt) {
    const fs::path tmp = fresh_dir("queue");
    pipeline::GenerateParams base = base_params(tmp);
    pipeline::Generator gen(base, {.keep_loaded = true});
    gen.open(64, 64);
    server::ServiceOptions o = options(tmp / "state");
    o.max_queue = 2;
    server::Service svc(gen, o);
    server::JobRequest slow;
    slow.prompt = "a cyan star";
    slow.steps = 40;
    slow.seed = 1;
    const std::string running = svc.submit(slow);
    for (int i = 0; i < 600 && svc.live().id != running; ++i) std::this_thread::sleep_for(10ms);
    const std::string q1 = svc.submit(slow), q2 = svc.submit(slow);
    try {
        svc.submit(slow);
        ADD_FAILURE() << "a full queue must refuse";
    } catch (const server::ApiError& e) {
        EXPECT_EQ(e.status(), 503);
    }
    EXPECT_EQ(svc.queue_position(q1), 0);
    EXPECT_EQ(svc.queue_position(q2), 1);
    EXPECT_TRUE(svc.cancel(q1));
    EXPECT_EQ(svc.get(q1)->state, server::kCancelled);
    EXPECT_FALSE(svc.cancel(q1));  // ended already
    // interrupt: the running job stops sampling and is decoded
    for (int i = 0; i < 600 && svc.live().step < 2; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(svc.interrupt());
    auto rec = svc.wait(running, 120s);
    ASSERT_EQ(rec->state, server::kDone) << rec->error;
    EXPECT_TRUE(rec->result["interrupted"].get<bool>());
    EXPECT_EQ(rec->result["images"].size(), 1u);
    // cancel the running one
    for (int i = 0; i < 600 && svc.live().id != q2; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(svc.cancel(q2));
    rec = svc.wait(q2, 120s);
    EXPECT_EQ(rec->state, server::kCancelled);
}

TEST(ServerService, RefusesWhatTheModelCannotTake) {
    const fs::path tmp = fresh_dir("refuse");
    pipeline::Generator gen(base_params(tmp), {.keep_loaded = true});
    gen.open(64, 64);
    server::Service svc(gen, options(tmp / "state"));
    server::JobRequest r;
    r.prompt = "x <lora:style:1>";
    try {
        svc.submit(r);
        ADD_FAILURE() << "a LoRA without --lora-model-dir must be refused";
    } catch (const server::ApiError& e) {
        EXPECT_EQ(e.field(), "lora");
    }
    r.prompt = "x";
    r.model_checkpoint = "other.safetensors";
    try {
        svc.submit(r);
        ADD_FAILURE() << "another checkpoint must be refused";
    } catch (const server::ApiError& e) {
        EXPECT_EQ(e.field(), "override_settings.sd_model_checkpoint");
    }
    r.model_checkpoint = "easel-demo-shapes.safetensors";
    r.steps = 1;
    auto rec = svc.wait(svc.submit(r), 120s);
    EXPECT_EQ(rec->state, server::kDone) << rec->error;
}

TEST(ServerJobStore, RunningJobsAreQueuedAgainOnOpen) {
    const fs::path dir = fresh_dir("store");
    {
        server::JobStore s(dir);
        server::JobRecord a;
        a.id = "job-a";
        a.request.prompt = "p";
        s.insert(a);
        server::JobRecord b;
        b.id = "job-b";
        s.insert(b);
        EXPECT_GT(b.seq, a.seq);
        a.state = server::kRunning;
        a.attempts = 1;
        s.update(a);
        EXPECT_THROW(s.insert(a), Error);  // the id exists
    }
    server::JobStore s(dir);
    EXPECT_EQ(s.requeued_at_open(), 1);
    auto a = s.get("job-a");
    ASSERT_TRUE(a);
    EXPECT_EQ(a->state, server::kQueued);
    EXPECT_EQ(a->attempts, 1);
    EXPECT_EQ(a->request.prompt, "p");
    auto q = s.list(server::kQueued);
    ASSERT_EQ(q.size(), 2u);
    EXPECT_EQ(q[0].id, "job-a");  // submission order
    s.remove("job-a");
    EXPECT_FALSE(s.get("job-a"));
}

}  // namespace
