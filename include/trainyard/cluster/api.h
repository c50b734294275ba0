// The cluster's HTTP interface, written once for the head (server) and its clients (the worker,
// the CLI): Ray's Jobs API paths, the worker protocol's paths, the auth headers and the JSON
// field names both sides read.
#pragma once

#include <string>
#include <string_view>

namespace trainyard::cluster::api {

// --- Ray Jobs API (Ray's field names) ------------------------------------------------------------
inline constexpr std::string_view kVersionPath = "/api/version";
inline constexpr std::string_view kJobsPath = "/api/jobs/";                 // POST submit, GET list
inline constexpr std::string_view kJobPattern = "/api/jobs/{id}";           // GET, DELETE
inline constexpr std::string_view kJobLogsPattern = "/api/jobs/{id}/logs";  // GET
inline constexpr std::string_view kJobLogsTailPattern = "/api/jobs/{id}/logs/tail";  // WebSocket
inline constexpr std::string_view kJobStopPattern = "/api/jobs/{id}/stop";           // POST
// Ray's client uploads runtime_env working_dir and py_modules here (GET: is it there?, PUT) before
// submitting; trainyard refuses them, naming what it does not take.
inline constexpr std::string_view kPackagePattern = "/api/packages/{protocol}/{name}";  // GET, PUT

// --- worker protocol and cluster state
// ------------------------------------------------------------
inline constexpr std::string_view kNodesPath = "/api/cluster/nodes";  // POST register
inline constexpr std::string_view kNodeHeartbeatPattern = "/api/cluster/nodes/{node}/heartbeat";
inline constexpr std::string_view kNodeLeavePattern = "/api/cluster/nodes/{node}/leave";
inline constexpr std::string_view kWorkerLogsPattern = "/api/cluster/jobs/{id}/logs";  // POST
inline constexpr std::string_view kStatusPath = "/api/cluster/status";
inline constexpr std::string_view kRdzvPattern = "/api/cluster/rdzv/{run_id}";  // GET, POST

// --- observability (docs/METRICS.md) -----------------------------------------------------------
inline constexpr std::string_view kMetricsPath = "/metrics";  // Prometheus text format
// Recent history for the dashboard, from the head's ring buffers: GET [?job=ID]
inline constexpr std::string_view kMetricsHistoryPath = "/api/cluster/metrics/history";
inline constexpr std::string_view kDashboardPath = "/dashboard";  // the page (no data in it)

// Concrete paths for clients (ids are used as they are: job and node ids are URL-safe).
inline std::string job_path(const std::string& id) {
  return "/api/jobs/" + id;
}
inline std::string job_logs_path(const std::string& id) {
  return job_path(id) + "/logs";
}
inline std::string job_logs_tail_path(const std::string& id) {
  return job_path(id) + "/logs/tail";
}
inline std::string job_stop_path(const std::string& id) {
  return job_path(id) + "/stop";
}
inline std::string node_heartbeat_path(const std::string& node) {
  return "/api/cluster/nodes/" + node + "/heartbeat";
}
inline std::string node_leave_path(const std::string& node) {
  return "/api/cluster/nodes/" + node + "/leave";
}
inline std::string worker_logs_path(const std::string& job) {
  return "/api/cluster/jobs/" + job + "/logs";
}
inline std::string rdzv_path(const std::string& run_id) {
  return "/api/cluster/rdzv/" + run_id;
}

// --- authentication ----------------------------------------------------------------------------
inline constexpr std::string_view kAuthorizationHeader = "Authorization";
inline constexpr std::string_view kRayAuthorizationHeader = "X-Ray-Authorization";
inline constexpr std::string_view kBearerPrefix = "Bearer ";
// The token for clients that have no --token-file: kTokenEnv (env.h).

// --- job statuses (Ray's) and JobReport states (the worker's) ------------------------------------
inline constexpr std::string_view kPending = "PENDING";
inline constexpr std::string_view kRunning = "RUNNING";
inline constexpr std::string_view kStopped = "STOPPED";
inline constexpr std::string_view kSucceeded = "SUCCEEDED";
inline constexpr std::string_view kFailed = "FAILED";
inline bool is_terminal_status(std::string_view s) {
  return s == kStopped || s == kSucceeded || s == kFailed;
}
inline constexpr std::string_view kReportRunning = "running";
inline constexpr std::string_view kReportSucceeded = "succeeded";
inline constexpr std::string_view kReportFailed = "failed";
inline constexpr std::string_view kReportStopped = "stopped";

// Node states in the status snapshot.
inline constexpr std::string_view kNodeAlive = "alive";
inline constexpr std::string_view kNodeSuspect = "suspect";
inline constexpr std::string_view kNodePending = "pending";  // known before a head restart
inline constexpr std::string_view kNodeDead = "dead";
inline constexpr std::string_view kNodeExited = "exited";
inline constexpr std::string_view kNodeDrained = "drained";

// --- JSON field names ----------------------------------------------------------------------------
namespace field {
// submit request and JobDetails
inline constexpr const char* kEntrypoint = "entrypoint";
inline constexpr const char* kSubmissionId = "submission_id";
inline constexpr const char* kJobId = "job_id";
inline constexpr const char* kInstance = "instance";  // wire::Instance
inline constexpr const char* kRuntimeEnv = "runtime_env";
inline constexpr const char* kEnvVars = "env_vars";
// runtime_env: the Ray commit Ray's client adds beside pip or conda (asks nothing of the head)
inline constexpr const char* kRayCommit = "_ray_commit";
inline constexpr const char* kMetadata = "metadata";
inline constexpr const char* kEntrypointNumCpus = "entrypoint_num_cpus";
inline constexpr const char* kEntrypointNumGpus = "entrypoint_num_gpus";
inline constexpr const char* kEntrypointResources = "entrypoint_resources";
inline constexpr const char* kTrainyard = "trainyard";
inline constexpr const char* kNodes = "nodes";  // "N" or "MIN:MAX"
inline constexpr const char* kNprocPerNode = "nproc_per_node";
inline constexpr const char* kMaxRestarts = "max_restarts";
inline constexpr const char* kRestartBackoff = "restart_backoff_s";  // seconds
inline constexpr const char* kRestartBackoffMax = "restart_backoff_max_s";
inline constexpr const char* kHangTimeout = "hang_timeout_s";  // 0: the watchdog off
inline constexpr const char* kAssignedNodes = "assigned_nodes";
inline constexpr const char* kFailedRank = "failed_rank";
inline constexpr const char* kFailedNode = "failed_node";
inline constexpr const char* kLastLines = "last_lines";
inline constexpr const char* kLineCount = "line_count";
inline constexpr const char* kLogsComplete = "logs_complete";
inline constexpr const char* kDemand = "demand";
inline constexpr const char* kDemandCpu = "CPU";  // in a job's demand, as Ray names resources
inline constexpr const char* kDemandGpu = "GPU";
inline constexpr const char* kEntrypointMemory = "entrypoint_memory";  // accepted, not used
inline constexpr const char* kType = "type";
inline constexpr const char* kDriverInfo = "driver_info";
inline constexpr const char* kDriverAgentHttpAddress = "driver_agent_http_address";
inline constexpr const char* kDriverNodeId = "driver_node_id";
inline constexpr const char* kNext = "next";  // GET /logs?after=N: the N to ask for next
inline constexpr const char* kStatus = "status";
inline constexpr const char* kMessage = "message";
inline constexpr const char* kErrorType = "error_type";
inline constexpr const char* kStartTime = "start_time";
inline constexpr const char* kEndTime = "end_time";
inline constexpr const char* kDriverExitCode = "driver_exit_code";
inline constexpr const char* kLogs = "logs";
inline constexpr const char* kStopped = "stopped";
inline constexpr const char* kDeleted = "deleted";
inline constexpr const char* kError = "error";
// worker protocol
inline constexpr const char* kNodeId = "node_id";
inline constexpr const char* kHostname = "hostname";
inline constexpr const char* kAddress = "address";
inline constexpr const char* kResources = "resources";
inline constexpr const char* kCpu = "cpu";
inline constexpr const char* kGpu = "gpu";
inline constexpr const char* kMemoryBytes = "memory_bytes";
inline constexpr const char* kGpus = "gpus";
inline constexpr const char* kIndex = "index";  // a GPU's
inline constexpr const char* kName = "name";    // a GPU's
inline constexpr const char* kUsage = "usage";
inline constexpr const char* kCpuUsed = "cpu_used";
inline constexpr const char* kCpuFraction = "cpu_fraction";
inline constexpr const char* kGpuUsed = "gpu_used";
inline constexpr const char* kMemoryUsedBytes = "memory_used_bytes";
inline constexpr const char* kJobs = "jobs";
inline constexpr const char* kHeartbeatIntervalMs = "heartbeat_interval_ms";
inline constexpr const char* kRegistered = "registered";
inline constexpr const char* kAssignments = "assignments";
inline constexpr const char* kStop = "stop";
inline constexpr const char* kReason = "reason";
inline constexpr const char* kFirstSeq = "first_seq";
inline constexpr const char* kLines = "lines";
inline constexpr const char* kRank = "rank";
inline constexpr const char* kText = "text";
inline constexpr const char* kNextSeq = "next_seq";
inline constexpr const char* kMetrics = "metrics";  // heartbeat: a metrics::Snapshot's JSON
// JobReport
inline constexpr const char* kState = "state";
inline constexpr const char* kRestartCount = "restart_count";
inline constexpr const char* kWorldSize = "world_size";
inline constexpr const char* kExitCode = "exit_code";
// Assignment
inline constexpr const char* kEnv = "env";
inline constexpr const char* kMinNodes = "min_nodes";
inline constexpr const char* kMaxNodes = "max_nodes";
// rendezvous
inline constexpr const char* kToken = "token";
inline constexpr const char* kWritten = "written";
// status snapshot
inline constexpr const char* kTime = "time";
inline constexpr const char* kHead = "head";
inline constexpr const char* kHealthy = "healthy";
inline constexpr const char* kProblem = "problem";
inline constexpr const char* kHeartbeatAgeS = "heartbeat_age_s";
inline constexpr const char* kRanks = "ranks";
inline constexpr const char* kFailures = "failures";
inline constexpr const char* kDemands = "demands";
}  // namespace field

}  // namespace trainyard::cluster::api
