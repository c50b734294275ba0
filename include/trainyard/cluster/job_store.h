// The head's durable state in SQLite (<state_dir>/head.db, WAL): nodes, jobs, an append-only job
// event log, per-rank log lines (idempotent by (job, node, seq)) and rendezvous states with
// compare-and-set. A head restarted on the same state_dir finds everything here.
// See Note [Store durability] in job_store.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/cluster/node_resources.h"
#include "trainyard/cluster/wire.h"

namespace trainyard::cluster {

struct NodeRecord {
  std::string node_id;
  std::string hostname;
  std::string address;
  NodeResources resources;
  std::string state;             // api::kNodeAlive, kNodeSuspect, kNodeDead, kNodeExited, ...
  std::string reason;            // why it is dead/exited ("heartbeat timeout", "drained", ...)
  double registered_at = 0;      // Unix seconds
  double last_heartbeat_at = 0;  // Unix seconds
  double state_since = 0;        // Unix seconds: when `state` was entered
  wire::Usage usage;
};

// One job: Ray's JobDetails fields plus trainyard's extension and the head's bookkeeping.
struct JobRecord {
  std::string job_id;
  std::string submission_id;
  std::string status;  // api::kPending, ...
  std::string entrypoint;
  std::string message;
  std::string error_type;
  int64_t start_time_ms = 0;  // submission time, Unix milliseconds
  std::optional<int64_t> end_time_ms;
  std::optional<int> driver_exit_code;
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> env_vars;  // runtime_env.env_vars
  std::optional<double> entrypoint_num_cpus;
  std::optional<double> entrypoint_num_gpus;
  std::map<std::string, double> entrypoint_resources;
  // trainyard extension
  wire::JobLaunch launch;  // as submitted
  int min_nodes = 1;       // launch.nodes, parsed
  int max_nodes = 1;
  std::vector<std::string> assigned_nodes;
  std::optional<int> failed_rank;
  std::optional<std::string> failed_node;
  std::vector<std::string> last_lines;
  // bookkeeping
  std::map<std::string, wire::JobReport> reports;  // node id -> its latest report
  bool stop_requested = false;
  int64_t order = 0;  // submission order, set by insert_job
};

struct JobEvent {
  double time = 0;  // Unix seconds
  std::string job_id;
  std::string kind;  // "submitted", "assigned", "status", "node_lost", ...
  std::string detail;
};

struct LogLine {
  int64_t order = 0;  // per-job insertion order (1, 2, ...): what a tail resumes from
  std::string node_id;
  int rank = 0;
  int64_t seq = 0;  // the worker's sequence number for (job, node)
  std::string text;
};

struct RdzvState {
  std::string state;
  std::string token;  // the version: changes on every write
  bool written = false;
};

// A write the store could not make because its disk (or quota) is full: nothing was changed, and
// the same write works again once there is space (Note [A full disk] in job_store.cpp).
class StoreFullError : public Error {
 public:
  using Error::Error;
};

// Thread-safe: one connection behind a mutex. Every method throws Error naming the database file
// when SQLite fails (StoreFullError when its disk is full).
class JobStore {
 public:
  static constexpr int kSchemaVersion = 2;  // 2: jobs' launch durations
  static constexpr const char* kFileName = "head.db";

  // Opens (creating) <state_dir>/head.db. CorruptDataError naming the file when it is not a
  // database or is damaged; Error when its schema version is newer than this build's.
  explicit JobStore(const std::filesystem::path& state_dir);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  const std::filesystem::path& path() const;

  // Why the last write failed when it was for want of space and no write has succeeded since
  // (the head is then unhealthy); nullopt otherwise. Thread-safe.
  std::optional<std::string> write_problem() const;

  // Nodes
  void put_node(const NodeRecord& node);  // insert or replace
  std::optional<NodeRecord> get_node(const std::string& node_id);
  std::vector<NodeRecord> list_nodes();  // by registration time

  // Jobs. insert_job returns false (and stores nothing) when the id exists; sets job.order.
  bool insert_job(JobRecord& job);
  void update_job(const JobRecord& job);
  std::optional<JobRecord> get_job(const std::string& job_id);
  std::vector<JobRecord> list_jobs();  // in submission order
  // Deletes the job, its events and its log lines; false when there was none.
  bool delete_job(const std::string& job_id);

  void append_event(const std::string& job_id, const std::string& kind, const std::string& detail);
  std::vector<JobEvent> list_events(const std::string& job_id);

  // Stores lines[i] as seq first_seq + i of (job, node); a (job, node, seq) stored before is left
  // as it is. Returns the next sequence number the node should send (one past the highest stored).
  struct RankText {
    int rank = 0;
    std::string text;
  };
  int64_t append_logs(const std::string& job_id,
                      const std::string& node_id,
                      int64_t first_seq,
                      const std::vector<RankText>& lines);
  // The number after the last line of the job's node stored (0 for none): one index lookup.
  int64_t stored_lines(const std::string& job_id, const std::string& node_id);
  // Lines of a job with order > after_order, in insertion order, at most `limit`.
  std::vector<LogLine> read_logs(const std::string& job_id,
                                 int64_t after_order = 0,
                                 int64_t limit = INT64_MAX);

  // Rendezvous state of run_id (compare-and-set, one transaction): see RendezvousBackend.
  std::optional<RdzvState> get_rdzv(const std::string& run_id);
  // Writes `state` if the stored token is `token` (nullopt: only if none is stored). Returns the
  // state stored afterwards, its token and whether `state` was written.
  RdzvState set_rdzv(const std::string& run_id,
                     const std::string& state,
                     const std::optional<std::string>& token);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::cluster
