// The process environment: the name of every environment variable trainyard reads or sets,
// written once here (torchrun's rank contract, the launcher's PET_* flags, trainyard's own
// TRAINYARD_* settings), and EnvLookup, the way code reads them so tests can supply their own.
// Bottom-level: every layer may include it, so no layer includes another only for a name.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace trainyard {

// Answers the value of an environment variable, or nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (getenv).
EnvLookup process_env();

// --- torchrun's contract: what a launcher sets for each rank -----------------------------------
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

// --- trainyard's additions to the rank contract --------------------------------------------------
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
// The cluster job a rank belongs to, set by the worker that runs it (cluster/worker.h).
inline constexpr const char* kJobIdEnv = "TRAINYARD_JOB_ID";

// --- a rank's settings (comm/dist_env.h: init_options_from_env) ---------------------------------
// Seconds: InitOptions::timeout, the bound on every collective.
inline constexpr const char* kCollectiveTimeoutEnv = "TRAINYARD_COLLECTIVE_TIMEOUT";
// Seconds: InitOptions::join_timeout, the bound on reaching MASTER_ADDR:MASTER_PORT.
inline constexpr const char* kJoinTimeoutEnv = "TRAINYARD_JOIN_TIMEOUT";
// How init() keeps freed memory for reuse: caching (default), glibc-reuse or glibc (Note
// [Reusing freed memory] in src/comm/process_group.cpp).
inline constexpr const char* kCpuAllocatorEnv = "TRAINYARD_CPU_ALLOCATOR";
// InitOptions::device: cpu (default) or cuda.
inline constexpr const char* kDeviceEnv = "TRAINYARD_DEVICE";
// InitOptions::backend: auto (default), gloo or nccl.
inline constexpr const char* kBackendEnv = "TRAINYARD_BACKEND";
// "0" keeps the ranks of one host off the shared-memory process group (comm/process_group.h).
inline constexpr const char* kShmEnv = "TRAINYARD_SHM";

// --- the launcher's flags, as torchrun reads them from PET_* (trainyard run) --------------------
inline constexpr const char* kPetNprocPerNodeEnv = "PET_NPROC_PER_NODE";
inline constexpr const char* kPetNnodesEnv = "PET_NNODES";
inline constexpr const char* kPetNodeRankEnv = "PET_NODE_RANK";
inline constexpr const char* kPetMasterAddrEnv = "PET_MASTER_ADDR";
inline constexpr const char* kPetMasterPortEnv = "PET_MASTER_PORT";
inline constexpr const char* kPetRdzvIdEnv = "PET_RDZV_ID";
inline constexpr const char* kPetRdzvBackendEnv = "PET_RDZV_BACKEND";
inline constexpr const char* kPetRdzvEndpointEnv = "PET_RDZV_ENDPOINT";
inline constexpr const char* kPetRdzvConfEnv = "PET_RDZV_CONF";
inline constexpr const char* kPetLocalAddrEnv = "PET_LOCAL_ADDR";
inline constexpr const char* kPetStandaloneEnv = "PET_STANDALONE";
inline constexpr const char* kPetMaxRestartsEnv = "PET_MAX_RESTARTS";
inline constexpr const char* kPetMonitorIntervalEnv = "PET_MONITOR_INTERVAL";
inline constexpr const char* kPetLogDirEnv = "PET_LOG_DIR";
inline constexpr const char* kPetHangTimeoutEnv = "PET_HANG_TIMEOUT";
inline constexpr const char* kPetMetricsPortEnv = "PET_METRICS_PORT";
// trainyard's launcher settings without a torchrun flag.
inline constexpr const char* kRestartBackoffEnv = "TRAINYARD_RESTART_BACKOFF";         // seconds
inline constexpr const char* kRestartBackoffMaxEnv = "TRAINYARD_RESTART_BACKOFF_MAX";  // seconds
// Seconds: the hang timeout of `trainyard run` and of a recipe run bare when neither
// --hang-timeout nor PET_HANG_TIMEOUT gives one (tools/launch_flags.h).
inline constexpr const char* kHangTimeoutEnv = "TRAINYARD_HANG_TIMEOUT";
// "1" in the ranks a bare `trainyard train RECIPE` launched: the parent prints the result table.
inline constexpr const char* kRecipeParentEnv = "TRAINYARD_RECIPE_PARENT";

// --- the launch contracts of the engines trainyard run starts under (elastic/launch_contract.h) --
inline constexpr const char* kKubernetesServiceHostEnv = "KUBERNETES_SERVICE_HOST";  // in a pod
inline constexpr const char* kSlurmJobIdEnv = "SLURM_JOB_ID";
inline constexpr const char* kSlurmNnodesEnv = "SLURM_NNODES";
inline constexpr const char* kSlurmNodeIdEnv = "SLURM_NODEID";
inline constexpr const char* kSlurmJobNodelistEnv = "SLURM_JOB_NODELIST";  // node[01-03,7]
inline constexpr const char* kSkypilotNodeIpsEnv = "SKYPILOT_NODE_IPS";    // one per line
inline constexpr const char* kSkypilotNodeRankEnv = "SKYPILOT_NODE_RANK";
inline constexpr const char* kSkypilotNumNodesEnv = "SKYPILOT_NUM_NODES";
inline constexpr const char* kSkypilotNumGpusPerNodeEnv = "SKYPILOT_NUM_GPUS_PER_NODE";
inline constexpr const char* kSkypilotTaskIdEnv = "SKYPILOT_TASK_ID";
inline constexpr const char* kDstackMasterNodeIpEnv = "DSTACK_MASTER_NODE_IP";
inline constexpr const char* kDstackNodesIpsEnv = "DSTACK_NODES_IPS";  // one per line
inline constexpr const char* kDstackNodeRankEnv = "DSTACK_NODE_RANK";
inline constexpr const char* kDstackNodesNumEnv = "DSTACK_NODES_NUM";
inline constexpr const char* kDstackGpusPerNodeEnv = "DSTACK_GPUS_PER_NODE";
inline constexpr const char* kDstackRunNameEnv = "DSTACK_RUN_NAME";
// Volcano's pytorch plugin: MASTER_ADDR, MASTER_PORT, and WORLD_SIZE and RANK counted in pods
// (nodes), not ranks; VC_TASK_INDEX is the pod's index in its task.
inline constexpr const char* kVolcanoTaskIndexEnv = "VC_TASK_INDEX";

// --- everything else trainyard reads
// ---------------------------------------------------------------
inline constexpr const char* kLogLevelEnv = "TRAINYARD_LOG_LEVEL";  // log.h
// "1": the CLI parses and checks its command line (every flag known, every value valid) and exits
// 0 without running anything; the docs' tests run every command the README shows through it.
inline constexpr const char* kParseOnlyEnv = "TRAINYARD_PARSE_ONLY";
// Seconds an S3 request is retried through outages (storage/s3_storage.h).
inline constexpr const char* kS3RetryDeadlineEnv = "TRAINYARD_S3_RETRY_DEADLINE";
inline constexpr const char* kAddressEnv = "TRAINYARD_ADDRESS";  // the head (cluster/head_client.h)
inline constexpr const char* kTokenEnv = "TRAINYARD_TOKEN";      // the head's token (cluster/api.h)
// OpenBLAS kernel choice across a re-exec (blas_core.h): the core set, and "0" to keep
// OpenBLAS's own detection.
inline constexpr const char* kBlasCoreSetEnv = "TRAINYARD_BLAS_CORE_SET";
inline constexpr const char* kBlasCoreFixEnv = "TRAINYARD_BLAS_CORE_FIX";
// The fashion-mnist recipe's --test-limit (tools/recipes.cpp; tests/CMakeLists.txt sets it for
// the suite's recipe runs).
inline constexpr const char* kTestLimitEnv = "TRAINYARD_TEST_LIMIT";

}  // namespace trainyard
