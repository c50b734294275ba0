#include "trainyard/cluster/job_store.h"

#include <sqlite3.h>

#include <chrono>
#include <cmath>
#include <mutex>

#include "trainyard/cluster/api.h"
#include "trainyard/cluster/state_dir.h"
#include "trainyard/error.h"

// Note [Store durability]
// The database runs in WAL mode, and every transaction commits with synchronous=FULL: a state
// transition (a node's state, a job's status, an assignment, a rendezvous write) or a batch of log
// lines that the head has answered survives a power cut. Log lines need it as much as states do:
// the worker forgets a batch once the head has stored it (Note [Worker and head]), so no one could
// send it again. Batches are up to 2,000 lines or 4 MiB, one fsync each.

namespace trainyard::cluster {
namespace {

using nlohmann::json;

// The system clock in Unix seconds, the events' timestamps.
double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

json parse_or(const unsigned char* text, json fallback) {
  if (text == nullptr) return fallback;
  json j = json::parse(reinterpret_cast<const char*>(text), nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? fallback : j;
}

}  // namespace

// Note [A full disk]
// A head whose disk filled up failed every write with "database or disk is full", answered 500s,
// left a job RUNNING and logged the error twice a tick. SQLITE_FULL is now a StoreFullError: the
// transaction is rolled back by SQLite, the head answers 507 naming the disk, `status` shows the
// head unhealthy with the reason, the log says it once per interval, and the first write that
// succeeds again clears the condition. Reads keep working throughout.
struct JobStore::Impl {
  std::filesystem::path path;
  sqlite3* db = nullptr;
  std::mutex mu;
  mutable std::mutex problem_mu;
  std::optional<std::string> full;  // guarded by problem_mu; see Note [A full disk]

  void wrote() {
    std::lock_guard<std::mutex> lock(problem_mu);
    full.reset();
  }

  [[noreturn]] void fail(int rc, const std::string& what) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    int primary = rc & 0xff;
    if (primary == SQLITE_FULL) {
      std::string why = "The head's database " + path.string() +
                        " cannot be written: its disk is full (SQLite: " + msg +
                        "). HINT: free space on " + path.parent_path().string() +
                        "; the head goes on by itself once it can write.";
      {
        std::lock_guard<std::mutex> lock(problem_mu);
        full = why;
      }
      throw StoreFullError(why);
    }
    if (primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT) {
      throw CorruptDataError("The head's database " + path.string() +
                             " is damaged or not a "
                             "SQLite database (" +
                             msg + ") while trying to " + what +
                             ". Hint: move it aside to start with an empty state.");
    }
    throw Error("The head's database " + path.string() + " failed to " + what + ": " + msg + ".");
  }

  void exec(const char* sql, const std::string& what) {
    char* err = nullptr;
    int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
    if (err) sqlite3_free(err);
    if (rc != SQLITE_OK) fail(rc, what);
  }

  // A prepared statement, finalized on scope exit.
  class Stmt {
   public:
    Stmt(Impl& impl, const char* sql) : impl_(impl) {
      int rc = sqlite3_prepare_v2(impl.db, sql, -1, &stmt_, nullptr);
      if (rc != SQLITE_OK) impl.fail(rc, std::string("prepare '") + sql + "'");
    }
    ~Stmt() { sqlite3_finalize(stmt_); }
    Stmt(const Stmt&) = delete;
    Stmt& operator=(const Stmt&) = delete;

    Stmt& bind(int i, const std::string& v) {
      sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
      return *this;
    }
    Stmt& bind_blob(int i, const std::string& v) {
      sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
      return *this;
    }
    Stmt& bind(int i, int64_t v) {
      sqlite3_bind_int64(stmt_, i, v);
      return *this;
    }
    Stmt& bind(int i, double v) {
      sqlite3_bind_double(stmt_, i, v);
      return *this;
    }
    Stmt& bind_null(int i) {
      sqlite3_bind_null(stmt_, i);
      return *this;
    }
    template <typename T>
    Stmt& bind_opt(int i, const std::optional<T>& v) {
      if (v) return bind(i, *v);
      return bind_null(i);
    }
    // True while there is a row.
    bool step() {
      int rc = sqlite3_step(stmt_);
      if (rc == SQLITE_ROW) return true;
      if (rc == SQLITE_DONE) {
        if (!sqlite3_stmt_readonly(stmt_)) impl_.wrote();
        return false;
      }
      impl_.fail(rc, std::string("run '") + sqlite3_sql(stmt_) + "'");
    }
    void reset() {
      sqlite3_reset(stmt_);
      sqlite3_clear_bindings(stmt_);
    }
    bool is_null(int c) { return sqlite3_column_type(stmt_, c) == SQLITE_NULL; }
    int64_t i64(int c) { return sqlite3_column_int64(stmt_, c); }
    double f64(int c) { return sqlite3_column_double(stmt_, c); }
    std::string text(int c) {
      const void* p = sqlite3_column_blob(stmt_, c);
      int n = sqlite3_column_bytes(stmt_, c);
      return p ? std::string(static_cast<const char*>(p), static_cast<size_t>(n)) : std::string();
    }
    json js(int c, json fallback) { return parse_or(sqlite3_column_text(stmt_, c), fallback); }

   private:
    Impl& impl_;
    sqlite3_stmt* stmt_ = nullptr;
  };

  // BEGIN IMMEDIATE ... COMMIT, rolled back when the scope is left by an exception.
  class Transaction {
   public:
    explicit Transaction(Impl& impl) : impl_(impl) { impl_.exec("BEGIN IMMEDIATE", "begin"); }
    ~Transaction() {
      if (!done_) sqlite3_exec(impl_.db, "ROLLBACK", nullptr, nullptr, nullptr);
    }
    void commit() {
      impl_.exec("COMMIT", "commit");
      done_ = true;
    }

   private:
    Impl& impl_;
    bool done_ = false;
  };

  JobRecord job_from(Stmt& s) {
    JobRecord j;
    j.order = s.i64(0);
    j.job_id = s.text(1);
    j.submission_id = s.text(2);
    j.status = s.text(3);
    j.entrypoint = s.text(4);
    j.message = s.text(5);
    j.error_type = s.text(6);
    j.start_time_ms = s.i64(7);
    if (!s.is_null(8)) j.end_time_ms = s.i64(8);
    if (!s.is_null(9)) j.driver_exit_code = static_cast<int>(s.i64(9));
    j.metadata = s.js(10, json::object()).get<std::map<std::string, std::string>>();
    // runtime_env is stored as the submission held it: {"env_vars": {...}}.
    j.env_vars = s.js(11, json::object())
                     .value(api::field::kEnvVars, json::object())
                     .get<std::map<std::string, std::string>>();
    if (!s.is_null(12)) j.entrypoint_num_cpus = s.f64(12);
    if (!s.is_null(13)) j.entrypoint_num_gpus = s.f64(13);
    j.entrypoint_resources = s.js(14, json::object()).get<std::map<std::string, double>>();
    j.launch.nodes = s.text(15);
    j.min_nodes = static_cast<int>(s.i64(16));
    j.max_nodes = static_cast<int>(s.i64(17));
    j.launch.nproc_per_node = static_cast<int>(s.i64(18));
    j.launch.max_restarts = static_cast<int>(s.i64(19));
    j.assigned_nodes = s.js(20, json::array()).get<std::vector<std::string>>();
    if (!s.is_null(21)) j.failed_rank = static_cast<int>(s.i64(21));
    if (!s.is_null(22)) j.failed_node = s.text(22);
    j.last_lines = s.js(23, json::array()).get<std::vector<std::string>>();
    j.reports = s.js(24, json::object()).get<std::map<std::string, wire::JobReport>>();
    j.stop_requested = s.i64(25) != 0;
    j.launch.restart_backoff = seconds(s, 26);
    j.launch.restart_backoff_max = seconds(s, 27);
    j.launch.hang_timeout = seconds(s, 28);
    return j;
  }

  // A duration column in seconds; NULL: the agent's default.
  static std::optional<std::chrono::milliseconds> seconds(Stmt& s, int c) {
    if (s.is_null(c)) return std::nullopt;
    return std::chrono::milliseconds(std::llround(s.f64(c) * 1000));
  }
  static void bind_seconds(Stmt& s, int i, const std::optional<std::chrono::milliseconds>& d) {
    if (d) {
      s.bind(i, static_cast<double>(d->count()) / 1000);
    } else {
      s.bind_null(i);
    }
  }

  // Brings a database of schema version `from` to kSchemaVersion, in one transaction.
  //  1 -> 2: a job's launch durations (wire::JobLaunch), NULL (the agent's default) for old jobs.
  void migrate(int from) {
    exec("BEGIN IMMEDIATE", "begin a migration");
    try {
      if (from < 2)
        exec(
            "ALTER TABLE jobs ADD COLUMN restart_backoff_s REAL; "
            "ALTER TABLE jobs ADD COLUMN restart_backoff_max_s REAL; "
            "ALTER TABLE jobs ADD COLUMN hang_timeout_s REAL",
            "add the jobs' launch durations");
      exec(detail::concat("INSERT INTO schema_version (version) VALUES (", JobStore::kSchemaVersion,
                          ")")
               .c_str(),
           "record its schema version");
      exec("COMMIT", "commit a migration");
    } catch (...) {
      sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
  }

  void bind_job(Stmt& s, const JobRecord& j) {
    s.bind(1, j.job_id).bind(2, j.submission_id).bind(3, j.status).bind(4, j.entrypoint);
    s.bind(5, j.message).bind(6, j.error_type).bind(7, j.start_time_ms).bind_opt(8, j.end_time_ms);
    if (j.driver_exit_code) {
      s.bind(9, static_cast<int64_t>(*j.driver_exit_code));
    } else {
      s.bind_null(9);
    }
    s.bind(10, json(j.metadata).dump());
    s.bind(11, json{{api::field::kEnvVars, j.env_vars}}.dump());
    s.bind_opt(12, j.entrypoint_num_cpus).bind_opt(13, j.entrypoint_num_gpus);
    s.bind(14, json(j.entrypoint_resources).dump()).bind(15, j.launch.nodes);
    s.bind(16, static_cast<int64_t>(j.min_nodes)).bind(17, static_cast<int64_t>(j.max_nodes));
    s.bind(18, static_cast<int64_t>(j.launch.nproc_per_node));
    s.bind(19, static_cast<int64_t>(j.launch.max_restarts));
    s.bind(20, json(j.assigned_nodes).dump());
    if (j.failed_rank) {
      s.bind(21, static_cast<int64_t>(*j.failed_rank));
    } else {
      s.bind_null(21);
    }
    s.bind_opt(22, j.failed_node)
        .bind(23, json(j.last_lines).dump())
        .bind(24, json(j.reports).dump());
    s.bind(25, static_cast<int64_t>(j.stop_requested ? 1 : 0));
    bind_seconds(s, 26, j.launch.restart_backoff);
    bind_seconds(s, 27, j.launch.restart_backoff_max);
    bind_seconds(s, 28, j.launch.hang_timeout);
  }
};

namespace {
constexpr const char* kJobColumns =
    "job_order, job_id, submission_id, status, entrypoint, message, error_type, start_time, "
    "end_time, driver_exit_code, metadata, runtime_env, entrypoint_num_cpus, entrypoint_num_gpus, "
    "entrypoint_resources, nodes, min_nodes, max_nodes, nproc_per_node, max_restarts, "
    "assigned_nodes, failed_rank, failed_node, last_lines, reports, stop_requested, "
    "restart_backoff_s, restart_backoff_max_s, hang_timeout_s";

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
  node_id TEXT PRIMARY KEY, hostname TEXT, address TEXT, resources TEXT, state TEXT, reason TEXT,
  registered_at REAL, last_heartbeat_at REAL, state_since REAL, usage TEXT);
CREATE TABLE IF NOT EXISTS jobs (
  job_order INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL UNIQUE, submission_id TEXT,
  status TEXT, entrypoint TEXT, message TEXT, error_type TEXT, start_time INTEGER,
  end_time INTEGER, driver_exit_code INTEGER, metadata TEXT, runtime_env TEXT,
  entrypoint_num_cpus REAL, entrypoint_num_gpus REAL, entrypoint_resources TEXT, nodes TEXT,
  min_nodes INTEGER, max_nodes INTEGER, nproc_per_node INTEGER, max_restarts INTEGER,
  assigned_nodes TEXT, failed_rank INTEGER, failed_node TEXT, last_lines TEXT, reports TEXT,
  stop_requested INTEGER, restart_backoff_s REAL, restart_backoff_max_s REAL,
  hang_timeout_s REAL);
CREATE TABLE IF NOT EXISTS job_events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, job_id TEXT, kind TEXT, detail TEXT);
CREATE INDEX IF NOT EXISTS job_events_job ON job_events (job_id, id);
CREATE TABLE IF NOT EXISTS log_lines (
  job_id TEXT NOT NULL, node_id TEXT NOT NULL, seq INTEGER NOT NULL, rank INTEGER, text TEXT,
  line_order INTEGER NOT NULL, PRIMARY KEY (job_id, node_id, seq));
CREATE INDEX IF NOT EXISTS log_lines_order ON log_lines (job_id, line_order);
CREATE TABLE IF NOT EXISTS rdzv (run_id TEXT PRIMARY KEY, state BLOB, version INTEGER NOT NULL);
)sql";
}  // namespace

JobStore::JobStore(const std::filesystem::path& state_dir) : impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) {
    throw Error("Cannot create the head's state directory " + state_dir.string() + ": " +
                ec.message() + ".");
  }
  impl_->path = state_dir / kFileName;
  // Submitted env vars (secrets among them) live here: only the head's user may read it. SQLite
  // gives the -wal and -shm files the database's mode; older ones are tightened too.
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::filesystem::path file = impl_->path.string() + suffix;
    if (*suffix == '\0' || std::filesystem::exists(file)) make_private_file(file);
  }
  int rc =
      sqlite3_open_v2(impl_->path.c_str(), &impl_->db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = impl_->db ? sqlite3_errmsg(impl_->db) : sqlite3_errstr(rc);
    sqlite3_close(impl_->db);
    impl_->db = nullptr;
    throw Error("Cannot open the head's database " + impl_->path.string() + ": " + msg + ".");
  }
  try {
    sqlite3_busy_timeout(impl_->db, 5000);
    impl_->exec("PRAGMA journal_mode=WAL", "switch to WAL mode");
    impl_->exec("PRAGMA synchronous=FULL", "set synchronous=FULL");
    impl_->exec(kSchema, "create its tables");
    Impl::Stmt s(*impl_, "SELECT MAX(version) FROM schema_version");
    bool has = s.step() && !s.is_null(0);
    if (!has) {
      Impl::Stmt ins(*impl_, "INSERT INTO schema_version (version) VALUES (?)");
      ins.bind(1, static_cast<int64_t>(kSchemaVersion)).step();
    } else if (s.i64(0) > kSchemaVersion) {
      throw Error("The head's database " + impl_->path.string() + " has schema version " +
                  std::to_string(s.i64(0)) + ", newer than this build's " +
                  std::to_string(kSchemaVersion) +
                  ". Hint: run the trainyard version that wrote it, or use another --state-dir.");
    } else if (s.i64(0) < kSchemaVersion) {
      impl_->migrate(static_cast<int>(s.i64(0)));
    }
  } catch (...) {
    sqlite3_close(impl_->db);
    impl_->db = nullptr;
    throw;
  }
}

JobStore::~JobStore() {
  if (impl_ && impl_->db) sqlite3_close(impl_->db);
}

const std::filesystem::path& JobStore::path() const {
  return impl_->path;
}

std::optional<std::string> JobStore::write_problem() const {
  std::lock_guard<std::mutex> lock(impl_->problem_mu);
  return impl_->full;
}

void JobStore::put_node(const NodeRecord& n) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Stmt s(*impl_,
               "INSERT OR REPLACE INTO nodes (node_id, hostname, address, resources, state, "
               "reason, registered_at, last_heartbeat_at, state_since, usage) VALUES "
               "(?,?,?,?,?,?,?,?,?,?)");
  s.bind(1, n.node_id).bind(2, n.hostname).bind(3, n.address).bind(4, json(n.resources).dump());
  s.bind(5, n.state).bind(6, n.reason).bind(7, n.registered_at).bind(8, n.last_heartbeat_at);
  s.bind(9, n.state_since).bind(10, json(n.usage).dump());
  s.step();
}

std::optional<NodeRecord> JobStore::get_node(const std::string& node_id) {
  for (NodeRecord& n : list_nodes()) {
    if (n.node_id == node_id) return std::move(n);
  }
  return std::nullopt;
}

std::vector<NodeRecord> JobStore::list_nodes() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Stmt s(*impl_,
               "SELECT node_id, hostname, address, resources, state, reason, registered_at, "
               "last_heartbeat_at, state_since, usage FROM nodes ORDER BY registered_at, node_id");
  std::vector<NodeRecord> out;
  while (s.step()) {
    NodeRecord n;
    n.node_id = s.text(0);
    n.hostname = s.text(1);
    n.address = s.text(2);
    n.resources = s.js(3, json::object()).get<NodeResources>();
    n.state = s.text(4);
    n.reason = s.text(5);
    n.registered_at = s.f64(6);
    n.last_heartbeat_at = s.f64(7);
    n.state_since = s.f64(8);
    n.usage = s.js(9, json::object()).get<wire::Usage>();
    out.push_back(std::move(n));
  }
  return out;
}

bool JobStore::insert_job(JobRecord& job) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Transaction tx(*impl_);
  {
    Impl::Stmt check(*impl_, "SELECT 1 FROM jobs WHERE job_id = ?");
    check.bind(1, job.job_id);
    if (check.step()) return false;
  }
  Impl::Stmt s(*impl_,
               "INSERT INTO jobs (job_id, submission_id, status, entrypoint, message, error_type, "
               "start_time, end_time, driver_exit_code, metadata, runtime_env, "
               "entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_resources, nodes, min_nodes, "
               "max_nodes, nproc_per_node, max_restarts, assigned_nodes, failed_rank, "
               "failed_node, last_lines, reports, stop_requested, restart_backoff_s, "
               "restart_backoff_max_s, hang_timeout_s) VALUES "
               "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  impl_->bind_job(s, job);
  s.step();
  job.order = sqlite3_last_insert_rowid(impl_->db);
  tx.commit();
  return true;
}

void JobStore::update_job(const JobRecord& job) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Stmt s(*impl_,
               "UPDATE jobs SET job_id = ?1, submission_id = ?2, status = ?3, entrypoint = ?4, "
               "message = ?5, error_type = ?6, start_time = ?7, end_time = ?8, "
               "driver_exit_code = ?9, metadata = ?10, runtime_env = ?11, "
               "entrypoint_num_cpus = ?12, entrypoint_num_gpus = ?13, "
               "entrypoint_resources = ?14, nodes = ?15, min_nodes = ?16, max_nodes = ?17, "
               "nproc_per_node = ?18, max_restarts = ?19, assigned_nodes = ?20, "
               "failed_rank = ?21, failed_node = ?22, last_lines = ?23, reports = ?24, "
               "stop_requested = ?25, restart_backoff_s = ?26, restart_backoff_max_s = ?27, "
               "hang_timeout_s = ?28 WHERE job_id = ?1");
  impl_->bind_job(s, job);
  s.step();
}

std::optional<JobRecord> JobStore::get_job(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string sql = std::string("SELECT ") + kJobColumns + " FROM jobs WHERE job_id = ?";
  Impl::Stmt s(*impl_, sql.c_str());
  s.bind(1, job_id);
  if (!s.step()) return std::nullopt;
  return impl_->job_from(s);
}

std::vector<JobRecord> JobStore::list_jobs() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string sql = std::string("SELECT ") + kJobColumns + " FROM jobs ORDER BY job_order";
  Impl::Stmt s(*impl_, sql.c_str());
  std::vector<JobRecord> out;
  while (s.step()) out.push_back(impl_->job_from(s));
  return out;
}

bool JobStore::delete_job(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Transaction tx(*impl_);
  bool existed = false;
  {
    Impl::Stmt s(*impl_, "DELETE FROM jobs WHERE job_id = ?");
    s.bind(1, job_id).step();
    existed = sqlite3_changes(impl_->db) > 0;
  }
  for (const char* sql :
       {"DELETE FROM job_events WHERE job_id = ?", "DELETE FROM log_lines WHERE job_id = ?",
        // The rendezvous of a job is keyed by its id: a new job reusing the id starts afresh.
        "DELETE FROM rdzv WHERE run_id = ?"}) {
    Impl::Stmt s(*impl_, sql);
    s.bind(1, job_id).step();
  }
  tx.commit();
  return existed;
}

void JobStore::append_event(const std::string& job_id,
                            const std::string& kind,
                            const std::string& detail) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Stmt s(*impl_, "INSERT INTO job_events (time, job_id, kind, detail) VALUES (?,?,?,?)");
  s.bind(1, unix_seconds()).bind(2, job_id).bind(3, kind).bind(4, detail).step();
}

std::vector<JobEvent> JobStore::list_events(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Stmt s(*impl_,
               "SELECT time, job_id, kind, detail FROM job_events WHERE job_id = ? ORDER BY id");
  s.bind(1, job_id);
  std::vector<JobEvent> out;
  while (s.step()) out.push_back(JobEvent{s.f64(0), s.text(1), s.text(2), s.text(3)});
  return out;
}

namespace {
// The number after a node's last stored line of a job: the primary key's last entry.
constexpr const char* kNextSeqQuery =
    "SELECT COALESCE(MAX(seq) + 1, 0) FROM log_lines WHERE job_id = ? AND node_id = ?";
}  // namespace

int64_t JobStore::append_logs(const std::string& job_id,
                              const std::string& node_id,
                              int64_t first_seq,
                              const std::vector<RankText>& lines) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  // Committed with synchronous=FULL, as everything: see Note [Store durability].
  Impl::Transaction tx(*impl_);
  int64_t order = 0;
  {
    Impl::Stmt s(*impl_, "SELECT COALESCE(MAX(line_order), 0) FROM log_lines WHERE job_id = ?");
    s.bind(1, job_id);
    if (s.step()) order = s.i64(0);
  }
  {
    Impl::Stmt ins(*impl_,
                   "INSERT OR IGNORE INTO log_lines (job_id, node_id, seq, rank, text, "
                   "line_order) VALUES (?,?,?,?,?,?)");
    for (size_t i = 0; i < lines.size(); ++i) {
      ins.bind(1, job_id).bind(2, node_id).bind(3, first_seq + static_cast<int64_t>(i));
      ins.bind(4, static_cast<int64_t>(lines[i].rank)).bind(5, lines[i].text);
      ins.bind(6, order + 1);
      ins.step();
      if (sqlite3_changes(impl_->db) > 0) ++order;
      ins.reset();
    }
  }
  int64_t next = 0;
  {
    Impl::Stmt s(*impl_, kNextSeqQuery);
    s.bind(1, job_id).bind(2, node_id);
    if (s.step()) next = s.i64(0);
  }
  tx.commit();
  return next;
}

int64_t JobStore::stored_lines(const std::string& job_id, const std::string& node_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Stmt s(*impl_, kNextSeqQuery);
  s.bind(1, job_id).bind(2, node_id);
  return s.step() ? s.i64(0) : 0;
}

std::vector<LogLine> JobStore::read_logs(const std::string& job_id,
                                         int64_t after_order,
                                         int64_t limit) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Stmt s(*impl_,
               "SELECT line_order, node_id, rank, seq, text FROM log_lines WHERE job_id = ? AND "
               "line_order > ? ORDER BY line_order LIMIT ?");
  s.bind(1, job_id).bind(2, after_order).bind(3, limit);
  std::vector<LogLine> out;
  while (s.step()) {
    out.push_back(LogLine{s.i64(0), s.text(1), static_cast<int>(s.i64(2)), s.i64(3), s.text(4)});
  }
  return out;
}

std::optional<RdzvState> JobStore::get_rdzv(const std::string& run_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Stmt s(*impl_, "SELECT state, version FROM rdzv WHERE run_id = ?");
  s.bind(1, run_id);
  if (!s.step()) return std::nullopt;
  return RdzvState{s.text(0), std::to_string(s.i64(1)), false};
}

RdzvState JobStore::set_rdzv(const std::string& run_id,
                             const std::string& state,
                             const std::optional<std::string>& token) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Transaction tx(*impl_);
  std::optional<RdzvState> current;
  int64_t version = 0;
  {
    Impl::Stmt s(*impl_, "SELECT state, version FROM rdzv WHERE run_id = ?");
    s.bind(1, run_id);
    if (s.step()) {
      version = s.i64(1);
      current = RdzvState{s.text(0), std::to_string(version), false};
    }
  }
  bool match = token ? (current && current->token == *token) : !current.has_value();
  if (!match) {
    tx.commit();
    // A token given for a state that does not exist: nothing is stored, so nothing is returned.
    return current ? *current : RdzvState{};
  }
  Impl::Stmt w(*impl_, "INSERT OR REPLACE INTO rdzv (run_id, state, version) VALUES (?,?,?)");
  w.bind(1, run_id).bind_blob(2, state).bind(3, version + 1).step();
  tx.commit();
  return RdzvState{state, std::to_string(version + 1), true};
}

}  // namespace trainyard::cluster
