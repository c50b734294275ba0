// Every metric name and label trainyard exports, written once for the code that records them,
// the head and agents that serve them, the dashboard's queries and the Grafana dashboard
// (docs/grafana/trainyard.json). Base units, a trainyard_ prefix, _total for counters, _ratio for
// 0..1 (Prometheus' naming conventions). DCGM counterparts are listed in docs/METRICS.md.
#pragma once

#include <string_view>

namespace trainyard::metrics::name {

// --- labels (not "job" or "instance": Prometheus sets those on every target it scrapes) ---
inline constexpr std::string_view kJobLabel = "job_id";     // job id (cluster) or run id (run)
inline constexpr std::string_view kNodeLabel = "node";      // node id
inline constexpr std::string_view kRankLabel = "rank";      // global rank
inline constexpr std::string_view kOpLabel = "op";          // all_reduce, all_gather, ...
inline constexpr std::string_view kPhaseLabel = "phase";    // data, forward, backward, ...
inline constexpr std::string_view kCpuLabel = "cpu";        // core index
inline constexpr std::string_view kDeviceLabel = "device";  // network interface or block device
inline constexpr std::string_view kGpuLabel = "gpu";        // NVML index
inline constexpr std::string_view kStateLabel = "state";    // node state
inline constexpr std::string_view kStatusLabel = "status";  // job status
inline constexpr std::string_view kKeyLabel = "key";        // a report() key (bounded by recipe)

// Values of the op label.
inline constexpr std::string_view kOpAllReduce = "all_reduce";
inline constexpr std::string_view kOpAllGather = "all_gather";
inline constexpr std::string_view kOpReduceScatter = "reduce_scatter";
inline constexpr std::string_view kOpBroadcast = "broadcast";
inline constexpr std::string_view kOpBarrier = "barrier";

// Values of the phase label: a step is data + forward + backward + communication + optimizer +
// other; communication is the time the step's thread waited on collectives (exposed), taken out
// of the phase it happened in.
inline constexpr std::string_view kPhaseData = "data";
inline constexpr std::string_view kPhaseForward = "forward";
inline constexpr std::string_view kPhaseBackward = "backward";
inline constexpr std::string_view kPhaseCommunication = "communication";
inline constexpr std::string_view kPhaseOptimizer = "optimizer";
inline constexpr std::string_view kPhaseOther = "other";

// --- training, per rank (labels job_id, node, rank added by the agent and the head)
// ------------------
inline constexpr std::string_view kTrainReport = "trainyard_train_report";  // gauge {key}: report()
inline constexpr std::string_view kTrainLoss = "trainyard_train_loss";      // gauge
inline constexpr std::string_view kTrainLearningRate = "trainyard_train_learning_rate";  // gauge
inline constexpr std::string_view kTrainEpoch = "trainyard_train_epoch";                 // gauge
inline constexpr std::string_view kTrainStep = "trainyard_train_step";  // gauge: global step
inline constexpr std::string_view kTrainStepsTotal = "trainyard_train_steps_total";
inline constexpr std::string_view kTrainSamplesTotal = "trainyard_train_samples_total";
inline constexpr std::string_view kTrainTokensTotal = "trainyard_train_tokens_total";
inline constexpr std::string_view kTrainSamplesPerSecond = "trainyard_train_samples_per_second";
inline constexpr std::string_view kTrainTokensPerSecond = "trainyard_train_tokens_per_second";
// counter {phase}: seconds of steps spent in each phase
inline constexpr std::string_view kTrainStepPhaseSeconds =
    "trainyard_train_step_phase_seconds_total";
inline constexpr std::string_view kTrainStepSeconds =
    "trainyard_train_step_seconds";  // gauge: last
inline constexpr std::string_view kCollectiveCalls = "trainyard_collective_calls_total";  // {op}
inline constexpr std::string_view kCollectiveBytes = "trainyard_collective_bytes_total";  // {op}
// counter {op}: from issue until this rank saw it complete (a wait returning or a poll), so an
// overlapped collective that is waited for late counts until that wait
inline constexpr std::string_view kCollectiveSeconds = "trainyard_collective_seconds_total";
// counter {op}: the time a thread blocked waiting for it (exposed communication)
inline constexpr std::string_view kCollectiveWaitSeconds =
    "trainyard_collective_wait_seconds_total";
inline constexpr std::string_view kCheckpointSaves = "trainyard_checkpoint_saves_total";
inline constexpr std::string_view kCheckpointSaveSeconds =
    "trainyard_checkpoint_save_seconds_total";
inline constexpr std::string_view kCheckpointSaveBytes = "trainyard_checkpoint_save_bytes_total";
inline constexpr std::string_view kCheckpointLoads = "trainyard_checkpoint_loads_total";
inline constexpr std::string_view kCheckpointLoadSeconds =
    "trainyard_checkpoint_load_seconds_total";
inline constexpr std::string_view kCheckpointLoadBytes = "trainyard_checkpoint_load_bytes_total";
// gauge: TORCHELASTIC_RESTART_COUNT. Not a counter: each restart is a new process that would
// start it again at N, which Prometheus' increase() reads as a reset and a jump.
inline constexpr std::string_view kRestarts = "trainyard_restarts";

// --- per rank process, measured by the agent from /proc ------------------------------------------
inline constexpr std::string_view kRankResidentMemory = "trainyard_rank_resident_memory_bytes";
inline constexpr std::string_view kRankCpuSeconds = "trainyard_rank_cpu_seconds_total";
// gauge: CPU cores the process kept busy between two samples (1.5 = one and a half cores). Not a
// _ratio: a rank with four busy threads reads 4.
inline constexpr std::string_view kRankCpuCores = "trainyard_rank_cpu_cores";

// --- node (worker or standalone agent) -----------------------------------------------------------
inline constexpr std::string_view kNodeCpus =
    "trainyard_node_cpus";  // gauge: CPUs /proc/stat lists
inline constexpr std::string_view kNodeCpuUtilization = "trainyard_node_cpu_utilization_ratio";
inline constexpr std::string_view kNodeCoreUtilization =
    "trainyard_node_cpu_core_utilization_ratio";
inline constexpr std::string_view kNodeMemoryUsed = "trainyard_node_memory_used_bytes";
inline constexpr std::string_view kNodeMemoryTotal = "trainyard_node_memory_total_bytes";
inline constexpr std::string_view kNodeNetworkReceive =
    "trainyard_node_network_receive_bytes_total";
inline constexpr std::string_view kNodeNetworkTransmit =
    "trainyard_node_network_transmit_bytes_total";
inline constexpr std::string_view kNodeDiskRead = "trainyard_node_disk_read_bytes_total";
inline constexpr std::string_view kNodeDiskWritten = "trainyard_node_disk_written_bytes_total";

// --- GPUs through NVML ({gpu}); DCGM counterparts in docs/METRICS.md
// -------------------------------
inline constexpr std::string_view kGpuUtilization = "trainyard_gpu_utilization_ratio";
inline constexpr std::string_view kGpuMemoryCopyUtilization =
    "trainyard_gpu_memory_copy_utilization_ratio";
inline constexpr std::string_view kGpuMemoryUsed = "trainyard_gpu_memory_used_bytes";
inline constexpr std::string_view kGpuMemoryTotal = "trainyard_gpu_memory_total_bytes";
inline constexpr std::string_view kGpuTemperature = "trainyard_gpu_temperature_celsius";
inline constexpr std::string_view kGpuPower = "trainyard_gpu_power_watts";
inline constexpr std::string_view kGpuSmClock = "trainyard_gpu_sm_clock_hertz";
inline constexpr std::string_view kGpuXidErrors = "trainyard_gpu_xid_errors_total";

// --- cluster, from the head
// ------------------------------------------------------------------------
inline constexpr std::string_view kClusterNodes = "trainyard_cluster_nodes";  // gauge {state}
inline constexpr std::string_view kClusterJobs = "trainyard_cluster_jobs";    // gauge {status}
inline constexpr std::string_view kNodeHeartbeatAge =
    "trainyard_node_heartbeat_age_seconds";                       // {node}
inline constexpr std::string_view kNodeUp = "trainyard_node_up";  // gauge {node}: 1 alive, else 0

}  // namespace trainyard::metrics::name
