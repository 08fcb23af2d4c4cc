// The server's engine, below HTTP: one worker thread runs the stored jobs in submission order on
// one open model (pipeline::Generator), with a bounded queue, per-step checkpoints, live progress
// and previews, cancel / interrupt, and a clean stop.
//
//   submit():    a parsed JobRequest -> checked against the loaded model and the LoRA folder,
//                its seed drawn, its images written into the job's folder (init.png, mask.png:
//                resized to the job's size, mask inverted / blurred / taken from alpha as the
//                request said), a queued row in the store; ApiError(503) when the queue is full.
//   the worker:  queued -> running -> done | failed | cancelled; the job's checkpoints go to
//                jobs/<id>/ckpt, and a job cut off (stop(), SIGKILL) resumes from the last one and
//                ends with the same PNG bytes; its result PNGs are jobs/<id>/image-<n>.png.
//   stop():      the running job ends after its current step (its checkpoint written) and is
//                queued again; the worker exits; the model is freed by the Generator's owner.
#pragma once

#include "pipeline/generate.h"
#include "server/job_request.h"
#include "server/job_store.h"
#include "server/preview.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace easel::server {

struct ServiceOptions {
    std::filesystem::path state_dir;  ///< --state-dir
    int max_queue = 64;               ///< --max-queue: queued jobs (the running one not counted)
    Limits limits;
    PreviewMethod preview = PreviewMethod::Auto;  ///< --preview
    int preview_interval = 1;         ///< --preview-interval: steps between previews
    std::filesystem::path lora_dir;   ///< --lora-model-dir ("" = no LoRA picker)
};

/// The running job as progress reports it.
struct LiveState {
    std::string id;            ///< "" when idle
    int image = 0, images = 0;  ///< batch index being denoised, batch size
    int step = 0, steps = 0;   ///< of the current image
    double started = 0;        ///< Unix seconds the job started running
    double eta = 0;            ///< seconds left (estimate)
    double progress = 0;       ///< 0..1 over the whole job
    bool interrupted = false;  ///< an interrupt is pending / was applied
    std::vector<uint8_t> preview_png;  ///< latest preview (empty: none yet)
    int preview_step = 0;
};

/// A LoRA file found in --lora-model-dir.
struct LoraFile {
    std::string name;  ///< file stem ("detail-tweaker")
    std::string path;  ///< relative to the folder ("style/detail-tweaker.safetensors")
};

class Service {
public:
    /// Takes the open model. Opens the store in opt.state_dir (jobs cut off earlier are queued
    /// again) and starts the worker. Throws Error(Io) for an unusable state folder.
    Service(pipeline::Generator& gen, ServiceOptions opt);
    ~Service();  ///< stop()
    Service(const Service&) = delete;
    Service& operator=(const Service&) = delete;

    /// Accepts a job: returns its id. Throws ApiError: 400 for a request the model cannot run
    /// (a LoRA not in the folder, another sd_model_checkpoint, an id in use), 503 when the
    /// queue holds max_queue jobs, 503 while stopping.
    std::string submit(JobRequest req);
    std::optional<JobRecord> get(const std::string& id) const;
    /// Cancels a queued job (it never runs) or the running one (it ends after its current step):
    /// true; false when the job has already ended. Throws ApiError(404) for an unknown id.
    bool cancel(const std::string& id);
    /// A1111 interrupt: the running job stops sampling now and decodes what it has (its
    /// state becomes done with fewer steps or images). false when idle.
    bool interrupt();
    /// Waits until job id has ended (done, failed, cancelled) or `timeout` passes; the record.
    std::optional<JobRecord> wait(const std::string& id, std::chrono::milliseconds timeout) const;
    /// A counter that grows on every change of any job or of the live state; waits until it
    /// passes `seen` or `timeout` passes, and returns it.
    uint64_t wait_change(uint64_t seen, std::chrono::milliseconds timeout) const;
    uint64_t version() const;

    LiveState live() const;
    /// 0-based position of a queued job in the queue (the running job not counted); -1 when
    /// not queued.
    int queue_position(const std::string& id) const;
    /// Queued and running jobs (running first), then up to `recent` ended jobs, newest first.
    std::vector<JobRecord> jobs(int recent) const;
    /// Bytes of result image i of a done job; empty when there is none.
    std::vector<uint8_t> image_bytes(const JobRecord& rec, size_t i) const;

    /// The LoRA files in --lora-model-dir (rescanned on every call; symlinks leaving the folder
    /// and hidden files are skipped).
    std::vector<LoraFile> loras() const;
    /// The upscaler model files jobs may name (hr_upscaler, hires.upscaler) by file stem:
    /// --upscale-model, then NAME.{pth,pt,safetensors,ckpt,bin} at the top of
    /// --hires-upscalers-dir (sorted; the --upscale-model file not twice), each with its scale
    /// from the headers; a file that is not an upscaler is left out with a warning. Rescanned on
    /// every call.
    std::vector<std::pair<std::filesystem::path, int>> upscaler_models() const;
    /// The loaded model: file name (sd_model_checkpoint / title) and stem (model_name).
    std::string model_title() const;
    std::string model_name() const;
    /// The server's job defaults (its generate flags after the family's defaults).
    const pipeline::GenerateParams& defaults() const { return gen_.base(); }
    int max_queue() const { return opt_.max_queue; }
    const Limits& limits() const { return opt_.limits; }
    /// A1111 options the server applies (/sdapi/v1/options): CLIP_stop_at_last_layers (the
    /// default clip skip), show_progress_every_n_steps (preview interval).
    void set_default_clip_skip(int v);
    void set_preview_interval(int v);
    int preview_interval() const { return preview_interval_.load(); }
    int default_clip_skip() const { return default_clip_skip_.load(); }
    bool stopping() const { return stopping_.load(); }

    /// Ends the running job after its current step (checkpoint kept; queued again), stops the
    /// worker and waits for it. Idempotent.
    void stop();
    /// The start of stop() without the wait (safe from a signal-handling thread).
    void request_stop();

private:
    pipeline::Generator& gen_;
    ServiceOptions opt_;
    JobStore store_;
    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    std::deque<std::string> queue_;
    LiveState live_;
    uint64_t version_ = 0;
    std::atomic<bool> stopping_{false}, abort_running_{false}, interrupt_running_{false};
    std::atomic<int> preview_interval_{1}, default_clip_skip_{0};
    std::thread worker_;

    void run_worker();
    void run_job(JobRecord rec);
    void bump();  ///< version_++ and notify (mu_ held)
    pipeline::GenerateParams job_params(const JobRecord& rec) const;
    void write_images(JobRequest& req, const std::filesystem::path& dir) const;
};

}  // namespace easel::server
