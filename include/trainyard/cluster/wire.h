// The cluster's messages on the wire: one struct per message of the worker protocol and of Ray's
// Jobs API as trainyard speaks it, each with its JSON conversion written once and used by the
// head, the worker and the clients (field names in api.h). from_json validates types, ranges and
// sizes and throws InvalidArgumentError naming the field (MessageTooLargeError past a size
// limit); parse_message() bounds the nesting depth before anything is built. See Note [Message
// limits] in wire.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/cluster/node_resources.h"
#include "trainyard/error.h"

namespace trainyard::cluster::wire {

// --- limits (Note [Message limits]) ------------------------------------------------------------
inline constexpr int kMaxDepth = 32;                           // nesting of arrays and objects
inline constexpr std::size_t kMaxIdBytes = 128;                // job, submission and node ids
inline constexpr std::size_t kMaxNameBytes = 256;              // host names, addresses, env names
inline constexpr std::size_t kMaxEntrypointBytes = 128 << 10;  // Linux's MAX_ARG_STRLEN
inline constexpr std::size_t kMaxEnvVars = 256;
inline constexpr std::size_t kMaxEnvBytes = 256 << 10;      // names and values together
inline constexpr std::size_t kMaxMetadataBytes = 16 << 10;  // keys and values together
inline constexpr std::size_t kMaxMessageBytes = 4 << 10;    // a report's or a job's message
inline constexpr std::size_t kMaxLastLines = 100;
inline constexpr std::size_t kMaxJobsPerReport = 1'000;  // jobs one node reports at once
inline constexpr std::size_t kMaxLogLinesPerBatch = 10'000;
inline constexpr double kMaxResourceAmount = 1e6;  // entrypoint_num_cpus/gpus, per rank

// A field past its size limit: the head answers 413 with this message.
class MessageTooLargeError : public InvalidArgumentError {
 public:
  using InvalidArgumentError::InvalidArgumentError;
};

// Parses a message's JSON text, refusing nesting deeper than kMaxDepth before building it (a
// deeply nested document would exhaust a server thread's stack). InvalidArgumentError naming
// `what` ("the request body") when it is not JSON or nests too deep; an empty text is {}.
nlohmann::json parse_message(std::string_view text, std::string_view what);

// --- the worker protocol -----------------------------------------------------------------------

// A node's word on one job (the head keeps each node's latest).
enum class ReportState { kRunning, kSucceeded, kFailed, kStopped };
std::string_view to_string(ReportState state);
inline bool is_terminal(ReportState s) {
  return s != ReportState::kRunning;
}

// Why a node's part of a job failed because its worker restarted (a lost node, not a failure of
// the job's program), and why a job's ranks could not start.
inline constexpr std::string_view kNodeRestarted = "NODE_RESTARTED";
inline constexpr std::string_view kCommandError = "JOB_ENTRYPOINT_COMMAND_ERROR";
inline constexpr std::string_view kCommandStartError = "JOB_ENTRYPOINT_COMMAND_START_ERROR";

// Which submission of a job id a message is about: the head's submission order, never reused
// (a deleted job's id may be submitted again). 0 from a peer that does not send it.
using Instance = std::int64_t;

struct JobReport {
  std::string job_id;
  Instance instance = 0;
  ReportState state = ReportState::kRunning;
  int restart_count = 0;
  std::vector<int> ranks;               // global ranks on the node in the current round
  std::optional<int> world_size;        // of the current round
  std::optional<int> exit_code;         // when ended
  std::optional<int> failed_rank;       // when failed
  std::string error_type;               // when failed ("" otherwise)
  std::string message;                  // when ended
  std::vector<std::string> last_lines;  // the failed rank's last lines
  // A final report: how many lines the node's ranks printed, every one spooled (Note [A job ends
  // before its logs] in head_state.cpp). Absent from an older worker.
  std::optional<std::int64_t> line_count;

  bool operator==(const JobReport&) const = default;
};

// POST /api/cluster/nodes
struct Registration {
  std::string node_id;
  std::string hostname;
  std::string address;  // "" for the request's peer address
  NodeResources resources;
  std::vector<JobReport> jobs;
};

struct RegistrationAnswer {
  std::int64_t heartbeat_interval_ms = 0;
};

// What a node uses now (UsageSampler's sample).
struct Usage {
  double cpu_used = 0;      // cores busy
  double cpu_fraction = 0;  // of the node's CPUs
  std::int64_t memory_used_bytes = 0;
};

// POST /api/cluster/nodes/{node}/heartbeat
struct Heartbeat {
  Usage usage;
  std::vector<JobReport> jobs;
  // A metrics::Snapshot's JSON (Note [Metrics in heartbeats]); null without. Read by the head's
  // own lenient parser, so that bad metrics never fail a heartbeat.
  nlohmann::json metrics;
};

// A job placed on a node: what its agent runs.
// How a job's ranks are launched on each of its nodes: trainyard's extension of Ray's job, carried
// from the submission through the head's record to every node's assignment, where the worker
// makes it the agent's elastic::LaunchOptions. Its flags are `trainyard run`'s (`submit` declares
// them through the same add_restart_flags); a duration left out is the agent's default.
struct JobLaunch {
  std::string nodes = "1";  // "N" or "MIN:MAX"
  int nproc_per_node = 1;
  int max_restarts = 0;
  std::optional<std::chrono::milliseconds> restart_backoff;
  std::optional<std::chrono::milliseconds> restart_backoff_max;
  std::optional<std::chrono::milliseconds> hang_timeout;  // 0: the watchdog off
};

struct Assignment {
  std::string job_id;
  Instance instance = 0;
  std::string entrypoint;
  std::map<std::string, std::string> env;
  JobLaunch launch;
  int min_nodes = 1;  // launch.nodes, parsed
  int max_nodes = 1;
};

struct HeartbeatAnswer {
  bool registered = false;  // false: the head does not know this node; register again
  std::vector<Assignment> assignments;
  std::vector<std::string> stop;  // ids of jobs to stop
};

// POST /api/cluster/nodes/{node}/leave; reason "exited" or "drained".
struct LeaveRequest {
  std::string reason;
};

struct LogEntry {
  int rank = 0;
  std::string text;
};

// POST /api/cluster/jobs/{id}/logs: lines first_seq, first_seq + 1, ... of (job, node).
struct LogBatch {
  std::string node_id;
  Instance instance = 0;  // of the job the lines belong to
  std::int64_t first_seq = 0;
  std::vector<LogEntry> lines;
};

struct LogBatchAnswer {
  std::int64_t next_seq = 0;  // the next sequence number the head wants from the node
};

// --- the Jobs API ------------------------------------------------------------------------------

// POST /api/jobs/: Ray's JobSubmitRequest and trainyard's extension.
struct JobSubmission {
  std::string entrypoint;
  std::optional<std::string> submission_id;     // Ray's client may send it as job_id
  std::map<std::string, std::string> env_vars;  // runtime_env.env_vars
  std::map<std::string, std::string> metadata;
  std::optional<double> entrypoint_num_cpus;
  std::optional<double> entrypoint_num_gpus;
  std::map<std::string, double> entrypoint_resources;
  JobLaunch launch;  // trainyard's extension
};

struct SubmitAnswer {
  std::string job_id;
  std::string submission_id;
};

// Where a job's resources went: a pending job's demand, for `status`.
struct JobDemand {
  double cpu = 0;
  double gpu = 0;
};

// GET /api/jobs/{id} and each entry of GET /api/jobs/: Ray's JobDetails and trainyard's extension.
struct JobDetails {
  std::string job_id;
  std::string submission_id;
  std::string status;  // api::kPending, ...
  std::string entrypoint;
  std::string message;
  std::optional<std::string> error_type;
  std::int64_t start_time = 0;  // Unix milliseconds
  std::optional<std::int64_t> end_time;
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> env_vars;  // runtime_env.env_vars
  std::optional<std::string> driver_node_id;
  std::optional<int> driver_exit_code;
  std::optional<double> entrypoint_num_cpus;
  std::optional<double> entrypoint_num_gpus;
  std::map<std::string, double> entrypoint_resources;
  // trainyard's extension
  JobLaunch launch;
  std::vector<std::string> assigned_nodes;
  std::optional<int> failed_rank;
  std::optional<std::string> failed_node;
  std::vector<std::string> last_lines;
  std::optional<JobDemand> demand;  // for the whole gang, while pending and unplaced
  // Whether the head holds every line its nodes reported printing: false while an ended job's
  // logs are still being shipped (Note [A job ends before its logs] in head_state.cpp).
  bool logs_complete = true;
};

// GET /api/jobs/{id}/logs[?after=N]: the text, and with ?after the N to ask for next.
struct LogPage {
  std::string logs;
  std::optional<std::int64_t> next;
};

struct StopAnswer {
  bool stopped = false;
};

// --- JSON conversions --------------------------------------------------------------------------
void to_json(nlohmann::json& j, const JobReport& v);
void from_json(const nlohmann::json& j, JobReport& v);
void to_json(nlohmann::json& j, const Registration& v);
void from_json(const nlohmann::json& j, Registration& v);
void to_json(nlohmann::json& j, const RegistrationAnswer& v);
void from_json(const nlohmann::json& j, RegistrationAnswer& v);
void to_json(nlohmann::json& j, const Usage& v);
void from_json(const nlohmann::json& j, Usage& v);
void to_json(nlohmann::json& j, const Heartbeat& v);
void from_json(const nlohmann::json& j, Heartbeat& v);
void to_json(nlohmann::json& j, const Assignment& v);
void from_json(const nlohmann::json& j, Assignment& v);
void to_json(nlohmann::json& j, const HeartbeatAnswer& v);
void from_json(const nlohmann::json& j, HeartbeatAnswer& v);
void to_json(nlohmann::json& j, const LeaveRequest& v);
void from_json(const nlohmann::json& j, LeaveRequest& v);
void to_json(nlohmann::json& j, const LogEntry& v);
void from_json(const nlohmann::json& j, LogEntry& v);
void to_json(nlohmann::json& j, const LogBatch& v);
void from_json(const nlohmann::json& j, LogBatch& v);
void to_json(nlohmann::json& j, const LogBatchAnswer& v);
void from_json(const nlohmann::json& j, LogBatchAnswer& v);
void to_json(nlohmann::json& j, const JobSubmission& v);
void from_json(const nlohmann::json& j, JobSubmission& v);
void to_json(nlohmann::json& j, const SubmitAnswer& v);
void from_json(const nlohmann::json& j, SubmitAnswer& v);
void to_json(nlohmann::json& j, const JobDetails& v);
void from_json(const nlohmann::json& j, JobDetails& v);
void to_json(nlohmann::json& j, const LogPage& v);
void from_json(const nlohmann::json& j, LogPage& v);
void to_json(nlohmann::json& j, const StopAnswer& v);
void from_json(const nlohmann::json& j, StopAnswer& v);

}  // namespace trainyard::cluster::wire
