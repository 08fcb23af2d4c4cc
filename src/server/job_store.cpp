#include "server/job_store.h"

#include "core/error.h"
#include "core/log.h"

#include <sqlite3.h>

namespace easel::server {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// A prepared statement, finalized on scope exit.
class Stmt {
public:
    Stmt(sqlite3* db, const char* sql) : db_(db) {
        if (sqlite3_prepare_v2(db, sql, -1, &st_, nullptr) != SQLITE_OK)
            fail(ErrorKind::Io, "job store: cannot prepare a statement: {}", sqlite3_errmsg(db));
    }
    ~Stmt() { sqlite3_finalize(st_); }
    Stmt& text(int i, const std::string& v) {
        sqlite3_bind_text(st_, i, v.data(), (int)v.size(), SQLITE_TRANSIENT);
        return *this;
    }
    Stmt& real(int i, double v) {
        sqlite3_bind_double(st_, i, v);
        return *this;
    }
    Stmt& integer(int i, int64_t v) {
        sqlite3_bind_int64(st_, i, v);
        return *this;
    }
    /// SQLITE_ROW or SQLITE_DONE; Error(Io) otherwise.
    int step() {
        const int rc = sqlite3_step(st_);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE) fail(ErrorKind::Io, "job store: {}", sqlite3_errmsg(db_));
        return rc;
    }
    std::string col_text(int i) const {
        const auto* p = sqlite3_column_text(st_, i);
        return p ? std::string((const char*)p, (size_t)sqlite3_column_bytes(st_, i)) : std::string();
    }
    double col_real(int i) const { return sqlite3_column_double(st_, i); }
    int64_t col_int(int i) const { return sqlite3_column_int64(st_, i); }

private:
    sqlite3* db_;
    sqlite3_stmt* st_ = nullptr;
};

constexpr const char* kColumns = "id, seq, state, request, created, started, finished, error, result, attempts";

JobRecord read_row(const Stmt& s) {
    JobRecord r;
    r.id = s.col_text(0);
    r.seq = s.col_int(1);
    r.state = s.col_text(2);
    json req = json::parse(s.col_text(3), nullptr, false);
    if (!req.is_discarded()) r.request = JobRequest::from_json(req);
    r.created = s.col_real(4);
    r.started = s.col_real(5);
    r.finished = s.col_real(6);
    r.error = s.col_text(7);
    json res = json::parse(s.col_text(8), nullptr, false);
    r.result = res.is_discarded() ? json::object() : res;
    r.attempts = (int)s.col_int(9);
    return r;
}

}  // namespace

JobStore::JobStore(const fs::path& dir) : dir_(dir) {
    std::error_code ec;
    fs::create_directories(dir_ / "jobs", ec);
    if (!fs::is_directory(dir_ / "jobs", ec))
        fail(ErrorKind::Io, "--state-dir {}: cannot create the folder {}; pass a writable folder", dir_.string(), (dir_ / "jobs").string());
    const fs::path db = dir_ / "jobs.sqlite3";
    if (sqlite3_open_v2(db.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
        std::string m = db_ ? sqlite3_errmsg(db_) : "out of memory";
        sqlite3_close(db_);
        db_ = nullptr;
        fail(ErrorKind::Io, "--state-dir {}: cannot open the job database {}: {}", dir_.string(), db.string(), m);
    }
    sqlite3_busy_timeout(db_, 5000);
    try {
        exec("PRAGMA journal_mode=WAL");
        exec("PRAGMA synchronous=FULL");
        exec("CREATE TABLE IF NOT EXISTS jobs ("
             "seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, state TEXT NOT NULL, request TEXT NOT NULL,"
             "created REAL NOT NULL, started REAL NOT NULL DEFAULT 0, finished REAL NOT NULL DEFAULT 0,"
             "error TEXT NOT NULL DEFAULT '', result TEXT NOT NULL DEFAULT '{}', attempts INTEGER NOT NULL DEFAULT 0)");
        exec("CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, seq)");
        Stmt s(db_, "UPDATE jobs SET state = 'queued' WHERE state = 'running'");
        s.step();
        requeued_ = sqlite3_changes(db_);
    } catch (...) {
        sqlite3_close(db_);
        db_ = nullptr;
        throw;
    }
}

JobStore::~JobStore() {
    if (db_) sqlite3_close(db_);
}

void JobStore::exec(const char* sql) const {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
        std::string m = err ? err : "unknown error";
        sqlite3_free(err);
        fail(ErrorKind::Io, "job store ({}): {}", (dir_ / "jobs.sqlite3").string(), m);
    }
}

fs::path JobStore::job_dir(const std::string& id) const { return dir_ / "jobs" / id; }

void JobStore::insert(JobRecord& rec) {
    std::lock_guard lk(mu_);
    {
        Stmt q(db_, "SELECT 1 FROM jobs WHERE id = ?1");
        q.text(1, rec.id);
        if (q.step() == SQLITE_ROW) fail(ErrorKind::InvalidInput, "a job with id {} exists already", rec.id);
    }
    Stmt s(db_, "INSERT INTO jobs (id, state, request, created, started, finished, error, result) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
    s.text(1, rec.id).text(2, rec.state).text(3, rec.request.to_json().dump()).real(4, rec.created).real(5, rec.started).real(6, rec.finished);
    s.text(7, rec.error).text(8, rec.result.dump());
    s.step();
    rec.seq = sqlite3_last_insert_rowid(db_);
}

void JobStore::update(const JobRecord& rec) {
    std::lock_guard lk(mu_);
    Stmt s(db_, "UPDATE jobs SET state = ?2, started = ?3, finished = ?4, error = ?5, result = ?6, attempts = ?7 WHERE id = ?1");
    s.text(1, rec.id).text(2, rec.state).real(3, rec.started).real(4, rec.finished).text(5, rec.error).text(6, rec.result.dump());
    s.integer(7, rec.attempts);
    s.step();
}

std::optional<JobRecord> JobStore::get(const std::string& id) const {
    std::lock_guard lk(mu_);
    Stmt s(db_, fmt::format("SELECT {} FROM jobs WHERE id = ?1", kColumns).c_str());
    s.text(1, id);
    if (s.step() != SQLITE_ROW) return std::nullopt;
    return read_row(s);
}

std::vector<JobRecord> JobStore::list(const std::string& state, int limit, bool newest_first) const {
    std::lock_guard lk(mu_);
    const std::string sql = fmt::format("SELECT {} FROM jobs {} ORDER BY seq {} LIMIT ?2", kColumns, state.empty() ? "" : "WHERE state = ?1",
                                        newest_first ? "DESC" : "ASC");
    Stmt s(db_, sql.c_str());
    if (!state.empty()) s.text(1, state);
    s.integer(2, limit);
    std::vector<JobRecord> out;
    while (s.step() == SQLITE_ROW) out.push_back(read_row(s));
    return out;
}

int64_t JobStore::count(const std::string& state) const {
    std::lock_guard lk(mu_);
    Stmt s(db_, "SELECT COUNT(*) FROM jobs WHERE state = ?1");
    s.text(1, state);
    s.step();
    return s.col_int(0);
}

void JobStore::remove(const std::string& id) {
    {
        std::lock_guard lk(mu_);
        Stmt s(db_, "DELETE FROM jobs WHERE id = ?1");
        s.text(1, id);
        s.step();
    }
    std::error_code ec;
    fs::remove_all(job_dir(id), ec);
}

}  // namespace easel::server
