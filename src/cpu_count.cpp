#include "trainyard/cpu_count.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string_view>
#include <vector>

#include "trainyard/text_file.h"

namespace trainyard {

namespace fs = std::filesystem;

namespace {

// cpu.max: "max 100000" (no limit) or "<quota> <period>" in microseconds.
std::optional<double> parse_cpu_max(const std::string& text) {
  std::istringstream fields(text);
  std::string quota;
  std::int64_t period = 0;
  if (!(fields >> quota >> period) || quota == "max" || period <= 0) return std::nullopt;
  try {
    const std::int64_t quota_us = std::stoll(quota);
    if (quota_us <= 0) return std::nullopt;
    return static_cast<double>(quota_us) / static_cast<double>(period);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// memory.max: "max" (no limit) or bytes.
std::optional<std::int64_t> parse_memory_max(const std::string& text) {
  const std::string value = trim_whitespace(text);
  if (value.empty() || value == "max") return std::nullopt;
  try {
    std::size_t used = 0;
    const std::int64_t bytes = std::stoll(value, &used);
    if (used != value.size() || bytes < 0) return std::nullopt;
    return bytes;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

template <typename T>
void keep_smaller(std::optional<T>& current, const std::optional<T>& candidate) {
  if (candidate && (!current || *candidate < *current)) current = candidate;
}

}  // namespace

// Note [Counting CPUs in a container]
// A container on ECS or Kubernetes sees the host's CPUs in /proc/cpuinfo and in
// std::thread::hardware_concurrency(); what it may use is narrower, in two independent ways:
//  - the affinity mask (cpuset, `docker run --cpuset-cpus`, `taskset`): sched_getaffinity;
//  - the CFS quota (`--cpus=1.5`, a Kubernetes CPU limit): cgroup v2 cpu.max, "150000 100000",
//    or on a cgroup v1 host (ECS on Amazon Linux 2) cpu.cfs_quota_us / cpu.cfs_period_us.
// The quota applies to this process's cgroup and to each ancestor; the tightest one counts. We
// take the smaller of the two, round a fractional quota down (a rank wants a whole core; Ray does
// the same with its container CPU count) and never report fewer than one CPU. Where the cgroup
// path from /proc/self/cgroup does not exist under the mount (a cgroup namespace makes the
// container's own cgroup the mount's root), the mount's root is the process's cgroup. Memory
// works the same way through memory.max (v2) or memory.limit_in_bytes (v1). usable_cpu_count()
// is that CPU count; a worker offers it as its node's "cpu" (cluster::detect_resources), the
// Trainer splits it among the node's ranks when --threads is 0, and the tokenizer's encode_batch
// uses that many threads when asked for 0.
//
// Where the hierarchies are mounted: cgroup v2 alone at <root> (it has cgroup.controllers), or,
// on a hybrid host, at <root>/unified beside the v1 controllers at <root>/<controller list>
// ("cpu,cpuacct", often also linked as "cpu") and <root>/memory.

namespace {

// Calls visit(dir) for the process's cgroup directory under `mount` and each ancestor up to
// `mount` itself.
template <typename Visit>
void walk_cgroup(fs::path mount, const std::string& relative, Visit visit) {
  mount = mount.lexically_normal();
  if (!mount.has_filename() && mount.has_parent_path() && mount != mount.root_path())
    mount = mount.parent_path();  // "/sys/fs/cgroup/" -> "/sys/fs/cgroup"
  std::error_code ec;
  if (!fs::is_directory(mount, ec)) return;
  const fs::path relative_dir = fs::path(relative).relative_path();
  fs::path dir = relative_dir.empty() ? mount : (mount / relative_dir).lexically_normal();
  const std::string inside = dir.lexically_relative(mount).string();
  if (inside.empty() || inside.rfind("..", 0) == 0 || !fs::is_directory(dir, ec)) dir = mount;
  for (;;) {
    visit(dir);
    if (dir == mount || !dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
    if (dir.string().size() < mount.string().size()) break;  // left the mount
  }
}

// cgroup v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages, 9223372036854771712).
constexpr std::int64_t kCgroupV1Unlimited = std::int64_t{1} << 60;

}  // namespace

CgroupLimits read_cgroup_limits(const std::string& proc_root, const std::string& cgroup_root) {
  CgroupLimits limits;
  const auto self = read_text_file(fs::path(proc_root) / "self" / "cgroup");
  if (!self) return limits;
  const fs::path root(cgroup_root);
  std::error_code ec;
  // /proc/self/cgroup lines: "<hierarchy>:<controllers>:<path>"; cgroup v2's is "0::<path>".
  std::istringstream lines(*self);
  std::string line;
  while (std::getline(lines, line)) {
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string id = line.substr(0, first);
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string relative = trim_whitespace(line.substr(second + 1));
    if (id == "0" && controllers.empty()) {
      const fs::path mount =
          !fs::exists(root / "cgroup.controllers", ec) && fs::is_directory(root / "unified", ec)
              ? root / "unified"
              : root;
      walk_cgroup(mount, relative, [&](const fs::path& dir) {
        if (const auto cpu_max = read_text_file(dir / "cpu.max"))
          keep_smaller(limits.cpu_quota, parse_cpu_max(*cpu_max));
        if (const auto memory_max = read_text_file(dir / "memory.max"))
          keep_smaller(limits.memory_max_bytes, parse_memory_max(*memory_max));
      });
      continue;
    }
    std::vector<std::string> names;
    std::istringstream list(controllers);
    for (std::string name; std::getline(list, name, ',');) names.push_back(name);
    const auto has = [&](const char* name) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    if (has("memory")) {
      walk_cgroup(root / "memory", relative, [&](const fs::path& dir) {
        if (const auto text = read_text_file(dir / "memory.limit_in_bytes")) {
          const auto bytes = parse_memory_max(*text);
          if (bytes && *bytes < kCgroupV1Unlimited) keep_smaller(limits.memory_max_bytes, bytes);
        }
      });
    }
    if (has("cpu")) {
      const fs::path mount =
          fs::is_directory(root / controllers, ec) ? root / controllers : root / "cpu";
      walk_cgroup(mount, relative, [&](const fs::path& dir) {
        const auto quota = read_text_file(dir / "cpu.cfs_quota_us");
        const auto period = read_text_file(dir / "cpu.cfs_period_us");
        if (quota && period)  // quota -1: no limit
          keep_smaller(limits.cpu_quota,
                       parse_cpu_max(trim_whitespace(*quota) + " " + trim_whitespace(*period)));
      });
    }
  }
  return limits;
}

int affinity_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? static_cast<int>(online) : 1;
  }
  return std::max(1, CPU_COUNT(&set));
}

int usable_cpu_count(const CpuCountOptions& options) {
  return usable_cpu_count(options.affinity_cpus ? *options.affinity_cpus : affinity_cpu_count(),
                          read_cgroup_limits(options.proc_root, options.cgroup_root));
}

int usable_cpu_count(int affinity_cpus, const CgroupLimits& limits) {
  // See Note [Counting CPUs in a container].
  int cpus = std::max(1, affinity_cpus);
  if (limits.cpu_quota)
    cpus = std::min(cpus, std::max(1, static_cast<int>(std::floor(*limits.cpu_quota))));
  return cpus;
}

std::optional<MemInfo> read_meminfo(const std::string& proc_root) {
  const auto text = read_text_file(proc_root + "/meminfo");
  if (!text) return std::nullopt;
  std::optional<std::int64_t> total, available;
  std::int64_t estimate = 0;  // MemFree + Buffers + Cached, for kernels without MemAvailable
  std::istringstream lines(*text);
  std::string key;
  std::int64_t kib = 0;
  std::string rest;
  while (lines >> key >> kib) {  // "MemTotal:", "16333624", then "kB" up to the line's end
    std::getline(lines, rest);
    if (key == "MemTotal:") total = kib * 1024;
    if (key == "MemAvailable:") available = kib * 1024;
    if (key == "MemFree:" || key == "Buffers:" || key == "Cached:") estimate += kib * 1024;
  }
  if (!total) return std::nullopt;
  return MemInfo{.total_bytes = *total, .available_bytes = available.value_or(estimate)};
}

std::optional<std::int64_t> available_memory_bytes(const CpuCountOptions& options) {
  std::optional<std::int64_t> out;
  if (const auto info = read_meminfo(options.proc_root)) out = info->available_bytes;
  keep_smaller(out, read_cgroup_limits(options.proc_root, options.cgroup_root).memory_max_bytes);
  return out;
}

}  // namespace trainyard
