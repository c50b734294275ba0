// A node's metrics for Prometheus and the dashboard: CPU utilisation (total and per core),
// memory, network and disk bytes from /proc, the CPU and resident memory of the processes it is
// told to watch (an agent's ranks), and GPUs through NVML loaded at run time when present.
// Names in metrics/names.h; the DCGM counterparts of the GPU ones in docs/METRICS.md.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trainyard/metrics/snapshot.h"

namespace trainyard::metrics {

struct NodeSamplerOptions {
  static constexpr const char* kProcRoot = "/proc";
  static constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

  std::string proc_root = kProcRoot;  // reads stat, meminfo, net/dev, diskstats, <pid>/stat
  // NVML's library; "" leaves GPUs out. A library that does not load or initialise leaves them
  // out too (logged once at debug level, never an error).
  std::string nvml_library = kNvmlLibrary;
};

// A process whose CPU and resident memory are sampled, with the labels its samples get
// ({{"job_id", ...}, {"rank", "3"}}).
struct WatchedProcess {
  int pid = 0;
  Labels labels;
};

// Rates (CPU utilisation) are measured over the interval between two calls of sample(); the
// first call measures from construction. Counters (network, disk, CPU seconds) are the kernel's
// running totals. A watched pid that has exited is left out. Blocking (reads small files; an
// NVML query is a few milliseconds per GPU); thread-safe.
class NodeSampler {
 public:
  explicit NodeSampler(NodeSamplerOptions options = {});
  ~NodeSampler();
  NodeSampler(const NodeSampler&) = delete;
  NodeSampler& operator=(const NodeSampler&) = delete;

  // The node's families (unlabelled but for cpu/device/gpu) and the watched processes' ones.
  // Throws Error when /proc/stat or /proc/meminfo cannot be read.
  Snapshot sample(const std::vector<WatchedProcess>& processes = {});

  // Whether NVML loaded and initialised (then GPU families are in every sample).
  bool has_gpus() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::metrics
