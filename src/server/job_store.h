// The server's jobs on disk, so that none is lost: one SQLite database (jobs.sqlite3) in the
// state folder holds every job's state and request; each job's files live in jobs/<id>/ beside
// it: the uploaded init image and mask, the sampler checkpoints (ckpt/, the pipeline's
// checkpoint artifacts, written after every step) and the result PNGs.
//
// Writes are durable before they return (WAL journal, synchronous FULL). A job found `running`
// when the store opens was cut off (SIGKILL, power loss) and goes back to `queued`, so the worker
// resumes it from its last checkpoint. Thread-safe (one connection behind a mutex).
#pragma once

#include "server/job_request.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

struct sqlite3;

namespace easel::server {

/// Job states as the jobs API names them.
inline constexpr const char* kQueued = "queued";
inline constexpr const char* kRunning = "running";
inline constexpr const char* kDone = "done";
inline constexpr const char* kFailed = "failed";
inline constexpr const char* kCancelled = "cancelled";

/// One stored job.
struct JobRecord {
    std::string id;
    int64_t seq = 0;            ///< submission order (the queue runs in it)
    std::string state = kQueued;
    JobRequest request;         ///< without image bytes (the files in dir())
    double created = 0, started = 0, finished = 0;  ///< Unix seconds; 0 = not yet
    std::string error;          ///< failed / cancelled: why
    int attempts = 0;           ///< times the worker started it (a job that stops the server repeatedly is failed)
    /// done: {"images": [file names in the job folder], "infotexts": [...], "seeds": [...],
    /// "width", "height", "interrupted"}
    nlohmann::json result = nlohmann::json::object();
};

class JobStore {
public:
    /// Opens (creating) dir/jobs.sqlite3 and dir/jobs/. Jobs left `running` become `queued`.
    /// Throws Error(Io) when the folder or database cannot be created or read.
    explicit JobStore(const std::filesystem::path& dir);
    ~JobStore();
    JobStore(const JobStore&) = delete;
    JobStore& operator=(const JobStore&) = delete;

    /// Adds a queued job (its files must already be in job_dir(id)); sets rec.seq. Throws
    /// Error(InvalidInput) when the id exists, Error(Io) when the write fails.
    void insert(JobRecord& rec);
    /// Replaces state, started, finished, error and result of job rec.id.
    void update(const JobRecord& rec);
    std::optional<JobRecord> get(const std::string& id) const;
    /// Jobs in submission order, those in `state` only when not empty; at most `limit`, the
    /// newest when `newest_first`.
    std::vector<JobRecord> list(const std::string& state = "", int limit = 1000, bool newest_first = false) const;
    /// Removes a job and its folder.
    void remove(const std::string& id);
    /// How many jobs are in `state`.
    int64_t count(const std::string& state) const;
    /// How many jobs were found `running` (cut off) and queued again when the store opened.
    int requeued_at_open() const { return requeued_; }

    /// dir/jobs/<id>: the job's files.
    std::filesystem::path job_dir(const std::string& id) const;
    const std::filesystem::path& dir() const { return dir_; }

private:
    std::filesystem::path dir_;
    sqlite3* db_ = nullptr;
    mutable std::mutex mu_;
    int requeued_ = 0;

    void exec(const char* sql) const;
};

}  // namespace easel::server
