// The CPUs this process may use: its affinity mask (sched_getaffinity) capped by the CFS quota of
// its cgroups (v2 cpu.max, v1 cpu.cfs_quota_us), which std::thread::hardware_concurrency() does
// not see. Also reads the cgroups' memory limit and /proc/meminfo. LibTorch-free, so any layer may
// count CPUs through it. See Note [Counting CPUs in a container] (src/cpu_count.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace trainyard {

inline constexpr const char* kProcRoot = "/proc";
inline constexpr const char* kCgroupRoot = "/sys/fs/cgroup";

// The limits cgroups put on this process: the tightest of its cgroup and the cgroup's ancestors,
// in cgroup v2 (<cgroup_root>, or <cgroup_root>/unified on a hybrid host) and in the v1 cpu and
// memory hierarchies (<cgroup_root>/cpu,cpuacct and <cgroup_root>/memory). nullopt where no
// limit is set or no cgroup tree is found.
struct CgroupLimits {
  std::optional<double> cpu_quota;  // cores: quota / period (cpu.max, cpu.cfs_quota_us), e.g. 1.5
  std::optional<std::int64_t> memory_max_bytes;
};
// Reads <proc_root>/self/cgroup and the hierarchies under cgroup_root. Blocking (a few small
// files); thread-safe.
CgroupLimits read_cgroup_limits(const std::string& proc_root, const std::string& cgroup_root);

// The number of CPUs this process may run on (sched_getaffinity), at least 1.
int affinity_cpu_count();

struct CpuCountOptions {
  // Where to read from; tests point these at fake trees.
  std::string proc_root = kProcRoot;      // reads <proc_root>/self/cgroup
  std::string cgroup_root = kCgroupRoot;  // where the cgroup hierarchies are mounted
  // The CPUs in the affinity mask; nullopt: affinity_cpu_count(). Tests set it.
  std::optional<int> affinity_cpus;
};

// The CPUs this process may use: those in its affinity mask, capped by the cgroup CPU quota
// rounded down, at least 1: a worker's detected "cpu" (cluster::detect_resources), and what the
// Trainer's and the tokenizer's automatic thread counts divide. Blocking (a few small files);
// thread-safe.
int usable_cpu_count(const CpuCountOptions& options = {});

// The same from limits already read: `affinity_cpus` capped by limits.cpu_quota rounded down,
// at least 1.
int usable_cpu_count(int affinity_cpus, const CgroupLimits& limits);

// /proc/meminfo's MemTotal and MemAvailable in bytes (before Linux 3.14, which lacks
// MemAvailable: MemFree + Buffers + Cached). nullopt when <proc_root>/meminfo cannot be read or
// has no MemTotal. Blocking (one small file); thread-safe.
struct MemInfo {
  std::int64_t total_bytes = 0;
  std::int64_t available_bytes = 0;
};
std::optional<MemInfo> read_meminfo(const std::string& proc_root = kProcRoot);

// The memory a process may still take, bytes: MemAvailable capped by the cgroup memory limit
// (read_cgroup_limits). nullopt when neither is known. What a reader of a model checks its
// planned size against before allocating. Blocking (a few small files); thread-safe.
std::optional<std::int64_t> available_memory_bytes(const CpuCountOptions& options = {});

}  // namespace trainyard
