// The names of the environment variables a launcher sets for each rank: torchrun's contract
// (RANK, WORLD_SIZE, MASTER_ADDR, ...) and trainyard's own additions. Written once here; the
// launcher (the writer, src/elastic/) and the ranks (the readers: DistEnv, heartbeat, lease, ...)
// both use these constants, so a name cannot drift between them.
#pragma once

namespace trainyard {

// --- torchrun's contract ------------------------------------------------------------------------
inline constexpr const char* kRankEnv = "RANK";                        // global rank
inline constexpr const char* kLocalRankEnv = "LOCAL_RANK";             // rank on this node
inline constexpr const char* kWorldSizeEnv = "WORLD_SIZE";             // ranks in the job
inline constexpr const char* kLocalWorldSizeEnv = "LOCAL_WORLD_SIZE";  // ranks on this node
inline constexpr const char* kGroupRankEnv = "GROUP_RANK";             // this node's rank
inline constexpr const char* kGroupWorldSizeEnv = "GROUP_WORLD_SIZE";  // nodes in the job
inline constexpr const char* kRoleRankEnv = "ROLE_RANK";               // rank within the role
inline constexpr const char* kRoleNameEnv = "ROLE_NAME";               // --role
inline constexpr const char* kRoleWorldSizeEnv = "ROLE_WORLD_SIZE";    // ranks of the role
inline constexpr const char* kMasterAddrEnv = "MASTER_ADDR";           // the store's host
inline constexpr const char* kMasterPortEnv = "MASTER_PORT";           // the store's port
inline constexpr const char* kRestartCountEnv = "TORCHELASTIC_RESTART_COUNT";  // restarts so far
inline constexpr const char* kMaxRestartsEnv = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char* kRunIdEnv = "TORCHELASTIC_RUN_ID";
// "True" when the agent hosts the TCPStore at MASTER_ADDR:MASTER_PORT (trainyard's never does).
inline constexpr const char* kUseAgentStoreEnv = "TORCHELASTIC_USE_AGENT_STORE";

// --- trainyard's additions ----------------------------------------------------------------------
// An id of this job, the same on every node and across restarts, different for a new job that
// reuses the run id (elastic: the rendezvous state's instance, Note [Job instances] in
// elastic/rendezvous.h; static: random per launch).
inline constexpr const char* kJobInstanceEnv = "TRAINYARD_JOB_INSTANCE";
// The path of this rank's heartbeat file (heartbeat.h; empty when the hang watchdog is off).
inline constexpr const char* kHeartbeatFileEnv = "TRAINYARD_HEARTBEAT_FILE";
// "1" when the launcher forwards the ranks' output to a terminal (progress bars stay on).
inline constexpr const char* kTtyEnv = "TRAINYARD_TTY";
// The address the ranks' Gloo sockets bind to (set across nodes unless GLOO_SOCKET_IFNAME is).
inline constexpr const char* kBindAddrEnv = "TRAINYARD_BIND_ADDR";
// The folder a rank writes its metrics to, as rank_<RANK>.json (metrics/rank_files.h); unset
// when nobody reads them.
inline constexpr const char* kMetricsDirEnv = "TRAINYARD_METRICS_DIR";
// "0" turns a rank's metric recording off (the step timer and the collective counters record
// nothing; metrics/recording.h), for measuring what recording costs (bench/metrics_overhead.sh).
// Unset or anything else: on.
inline constexpr const char* kMetricsEnv = "TRAINYARD_METRICS";

}  // namespace trainyard
