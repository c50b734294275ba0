// What a worker node offers the cluster: CPUs, memory and GPUs, detected from the machine (the
// process's affinity mask, cgroup v2 limits, /proc/meminfo, NVML loaded at run time) or declared
// by overrides, and a sampler of the machine's CPU and memory use for the heartbeats.
// The JSON form is the `resources` object of POST /api/cluster/nodes (CLUSTER_DESIGN.md).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/cpu_count.h"

namespace trainyard::cluster {

// One GPU as NVML reports it.
struct GpuInfo {
  int index = 0;
  std::string name;
  std::int64_t memory_bytes = 0;

  bool operator==(const GpuInfo&) const = default;
};

// A node's resources. cpu and gpu are floats as in Ray (a share of a machine may be declared).
struct NodeResources {
  double cpu = 0;
  double gpu = 0;
  std::int64_t memory_bytes = 0;
  std::vector<GpuInfo> gpus;  // the detected devices; empty without NVML or after num_gpus = 0

  bool operator==(const NodeResources&) const = default;
};

// {"cpu": 4.0, "gpu": 1.0, "memory_bytes": N, "gpus": [{"index", "name", "memory_bytes"}]}.
// from_json requires cpu, gpu and memory_bytes (InvalidArgumentError naming the field); gpus may
// be absent (the snapshot's per-node resources leave it out).
void to_json(nlohmann::json& j, const GpuInfo& gpu);
void from_json(const nlohmann::json& j, GpuInfo& gpu);
void to_json(nlohmann::json& j, const NodeResources& resources);
void from_json(const nlohmann::json& j, NodeResources& resources);

struct DetectOptions {
  static constexpr const char* kProcRoot = trainyard::kProcRoot;
  static constexpr const char* kCgroupRoot = trainyard::kCgroupRoot;
  static constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

  // Overrides, like Ray's --num-cpus / --num-gpus / --memory: several workers on one machine
  // each declare a share. Each must be finite and >= 0. num_gpus below the detected count keeps
  // the first ceil(num_gpus) devices in `gpus`.
  std::optional<double> num_cpus;
  std::optional<double> num_gpus;
  std::optional<std::int64_t> memory_bytes;

  // The GPUs this worker may offer, spelled as CUDA_VISIBLE_DEVICES is ("0,2"; "" for none).
  // nullopt: this process's CUDA_VISIBLE_DEVICES, or every GPU when it is unset (as Ray does).
  std::optional<std::string> visible_devices;

  // Where to read from; tests point these at fake trees.
  std::string proc_root = kProcRoot;      // reads <proc_root>/meminfo and <proc_root>/self/cgroup
  std::string cgroup_root = kCgroupRoot;  // where the cgroup hierarchies are mounted
  std::string nvml_library = kNvmlLibrary;
};

// Detects this machine's resources. See Note [Counting CPUs in a container].
//  cpu:    usable_cpu_count(): CPUs in the affinity mask, capped by the cgroup CPU quota rounded
//          down, >= 1.
//  memory: MemTotal, capped by the cgroup memory limit.
//  gpus:   through NVML when the library loads and initialises; none otherwise (logged at
//          debug level, never an error).
// Overrides replace the detected values. Throws InvalidArgumentError for a bad override.
// Blocking (reads a few files, may initialise NVML: tens of milliseconds); thread-safe.
NodeResources detect_resources(const DetectOptions& options = {});

// Counting CPUs and reading cgroup limits live in the LibTorch-free core (trainyard/cpu_count.h);
// these names stay available here.
using trainyard::affinity_cpu_count;
using trainyard::CgroupLimits;
using trainyard::read_cgroup_limits;

// This machine's host name (gethostname), "localhost" if it has none.
std::string local_hostname();

// GPUs through NVML at `library` (dlopen); empty when it cannot be loaded or initialised.
std::vector<GpuInfo> detect_nvml_gpus(const std::string& library = DetectOptions::kNvmlLibrary);

inline constexpr const char* kCudaVisibleDevicesEnv = "CUDA_VISIBLE_DEVICES";

// The GPUs a CUDA_VISIBLE_DEVICES value leaves visible, in its order, as CUDA reads it: indices
// up to the first one that names no GPU; "" leaves none. UUID entries ("GPU-...", "MIG-...")
// are not matched: then every GPU stays (logged as a warning).
std::vector<GpuInfo> select_visible_gpus(const std::vector<GpuInfo>& gpus,
                                         std::string_view visible_devices);

// One reading of the machine's use.
struct UsageSample {
  double cpu_fraction = 0;              // 0..1, the share of the machine's CPU time that was busy
  double cpu_used = 0;                  // cores busy: cpu_fraction x the CPUs /proc/stat lists
  std::int64_t memory_used_bytes = 0;   // MemTotal - MemAvailable
  std::int64_t memory_total_bytes = 0;  // MemTotal
};

struct UsageSamplerOptions {
  std::string proc_root = DetectOptions::kProcRoot;  // reads <proc_root>/stat and /meminfo
};

// The machine's CPU use over the interval between two calls of sample(), from /proc/stat's
// counters, and its memory use now. Cheap (reads two small files): call it every few seconds.
// The first sample() measures from construction. Thread-safe.
class UsageSampler {
 public:
  explicit UsageSampler(UsageSamplerOptions options = {});

  // Throws Error if /proc/stat or /proc/meminfo cannot be read or parsed.
  UsageSample sample();

 private:
  struct CpuTimes {
    std::uint64_t busy = 0;
    std::uint64_t total = 0;
    int cpus = 0;
  };
  CpuTimes read_cpu_times() const;

  const UsageSamplerOptions options_;
  std::mutex mutex_;
  CpuTimes previous_;         // guarded by mutex_
  double last_fraction_ = 0;  // guarded by mutex_; returned again when no tick has passed
};

}  // namespace trainyard::cluster
