// A node's metrics from /proc and NVML; see node_sampler.h.
#include "trainyard/metrics/node_sampler.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "metrics/nvml.h"
#include "trainyard/cpu_count.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/metrics/names.h"
#include "trainyard/text_file.h"

namespace trainyard::metrics {

namespace {

// At most this many network interfaces and block devices each (the first ones the kernel lists),
// so that a host with thousands of veth interfaces cannot flood Prometheus.
constexpr std::size_t kMaxDevices = 64;
// XID events read per GPU event set in one sample, at most (they are rare; this bounds a storm).
constexpr int kMaxXidEventsPerSample = 1024;
constexpr double kBytesPerSector = 512;  // /proc/diskstats counts 512-byte sectors on any disk
constexpr double kHertzPerMegahertz = 1e6;
constexpr double kWattsPerMilliwatt = 1e-3;
constexpr double kRatioPerPercent = 0.01;

std::vector<std::string> split_words(std::string_view line) {
  std::vector<std::string> words;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    std::size_t j = i;
    while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
    if (j > i) words.emplace_back(line.substr(i, j - i));
    i = j;
  }
  return words;
}

std::optional<double> to_number(const std::string& word) {
  if (word.empty()) return std::nullopt;
  try {
    std::size_t used = 0;
    const double v = std::stod(word, &used);
    if (used != word.size() || !std::isfinite(v)) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Appends a sample to the family `name` (created at the end of `out` when new).
void add_sample(Snapshot& out,
                std::string_view name,
                MetricType type,
                std::string_view help,
                Labels labels,
                double value) {
  Family* family = nullptr;
  for (Family& f : out)
    if (f.name == name) family = &f;
  if (family == nullptr)
    family = &out.emplace_back(Family{std::string(name), type, std::string(help), {}});
  family->samples.push_back(Sample{std::move(labels), value});
}

void add_gauge(Snapshot& out, std::string_view name, std::string_view help, Labels l, double v) {
  add_sample(out, name, MetricType::kGauge, help, std::move(l), v);
}
void add_counter(Snapshot& out, std::string_view name, std::string_view help, Labels l, double v) {
  add_sample(out, name, MetricType::kCounter, help, std::move(l), v);
}

// --- /proc/stat --------------------------------------------------------------------------------

// Jiffies (USER_HZ ticks) a CPU spent busy and in all, from a "cpu" or "cpuN" line.
struct CpuTicks {
  double busy = 0;
  double total = 0;
};

struct ProcStat {
  CpuTicks all;
  std::vector<std::pair<std::string, CpuTicks>> cores;  // ("3", ticks), in the file's order
};

// Note [CPU ticks]
// A "cpu" line lists user nice system idle iowait irq softirq steal guest guest_nice. guest and
// guest_nice are already inside user and nice, so the total is the sum of the first eight; idle
// and iowait are not busy (as top and node_exporter count them). Older kernels list fewer
// columns; the missing ones count as 0.
std::optional<CpuTicks> parse_cpu_line(const std::vector<std::string>& words) {
  CpuTicks ticks;
  for (std::size_t i = 1; i < words.size() && i <= 8; ++i) {
    const auto v = to_number(words[i]);
    if (!v) return std::nullopt;
    ticks.total += *v;
    if (i != 4 && i != 5) ticks.busy += *v;  // 4: idle, 5: iowait
  }
  if (words.size() < 5) return std::nullopt;  // user nice system idle at least
  return ticks;
}

ProcStat read_proc_stat(const std::string& proc_root) {
  const std::string path = proc_root + "/stat";
  const auto text = read_text_file(path);
  if (!text)
    throw Error(detail::concat("Cannot read ", path,
                               " for the node's CPU utilisation; is NodeSamplerOptions.proc_root (",
                               proc_root, ") a mounted procfs?"));
  ProcStat stat;
  bool have_total = false;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.compare(0, 3, "cpu") != 0) continue;
    const auto words = split_words(line);
    if (words.empty()) continue;
    const auto ticks = parse_cpu_line(words);
    if (!ticks) continue;
    if (words[0] == "cpu") {
      stat.all = *ticks;
      have_total = true;
    } else {
      const std::string index = words[0].substr(3);
      if (!index.empty() &&
          std::all_of(index.begin(), index.end(), [](unsigned char c) { return std::isdigit(c); }))
        stat.cores.emplace_back(index, *ticks);
    }
  }
  if (!have_total)
    throw Error(detail::concat(path, " has no \"cpu\" line; is NodeSamplerOptions.proc_root (",
                               proc_root, ") a mounted procfs?"));
  return stat;
}

// busy/total over the interval; 0 when no tick passed.
double utilisation(const CpuTicks& now, const CpuTicks& before) {
  const double total = now.total - before.total;
  const double busy = now.busy - before.busy;
  if (total <= 0) return 0;
  return std::clamp(busy / total, 0.0, 1.0);
}

// --- /proc/meminfo -----------------------------------------------------------------------------

struct NodeMemory {
  double total_bytes = 0;
  double used_bytes = 0;
};

// MemTotal and MemTotal - MemAvailable, through the one /proc/meminfo reader (cpu_count.h).
NodeMemory read_node_memory(const std::string& proc_root) {
  const auto info = trainyard::read_meminfo(proc_root);
  if (!info)
    throw Error(detail::concat("Cannot read ", proc_root,
                               "/meminfo (or it has no MemTotal line) for the node's memory; is "
                               "NodeSamplerOptions.proc_root (",
                               proc_root, ") a mounted procfs?"));
  return {.total_bytes = static_cast<double>(info->total_bytes),
          .used_bytes = static_cast<double>(
              std::max<std::int64_t>(0, info->total_bytes - info->available_bytes))};
}

// --- /proc/net/dev -----------------------------------------------------------------------------

struct DeviceBytes {
  std::string device;
  double in = 0;   // received or read
  double out = 0;  // transmitted or written
};

// Every interface, loopback included: on a one-machine cluster the ranks' traffic is all on lo.
// A missing file gives nothing (network namespaces without procfs' net/).
std::vector<DeviceBytes> read_net_dev(const std::string& proc_root) {
  std::vector<DeviceBytes> out;
  const auto text = read_text_file(proc_root + "/net/dev");
  if (!text) return out;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line) && out.size() < kMaxDevices) {
    // "  eth0: 1234 5 0 0 0 0 0 0 5678 9 ..." (the counters can touch the colon)
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;  // the two header lines
    const auto name = split_words(std::string_view(line).substr(0, colon));
    const auto fields = split_words(std::string_view(line).substr(colon + 1));
    if (name.size() != 1 || fields.size() < 9) continue;
    const auto rx = to_number(fields[0]);
    const auto tx = to_number(fields[8]);
    if (!rx || !tx) continue;
    out.push_back({name[0], *rx, *tx});
  }
  return out;
}

// --- /proc/diskstats ---------------------------------------------------------------------------

// Note [Whole disks]
// /proc/diskstats lists disks, their partitions and virtual devices. Summing every line would
// count a write to sda1 twice (sda and sda1) and an LVM volume's write three times (dm-0, sda1,
// sda). We keep the disks a write finally reaches: a line is left out when
//  - it is a partition: its name is a listed device's name followed by digits, with or without a
//    'p' between ("sda1" of "sda", "nvme0n1p2" of "nvme0n1", "mmcblk0p1" of "mmcblk0"), or
//  - it is a virtual device layered on other disks or on memory: loop*, ram*, zram*, fd*, dm-*,
//    md* (their I/O shows on the disks beneath, or is not disk I/O at all).
// A disk with no I/O yet is kept (its counters are 0): a node's device list does not change
// from one sample to the next as disks wake up.
bool is_virtual_block_device(const std::string& name) {
  for (const char* prefix : {"loop", "ram", "zram", "fd", "dm-", "md"})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

bool is_partition_of(const std::string& name, const std::string& disk) {
  if (name.size() <= disk.size() || name.compare(0, disk.size(), disk) != 0) return false;
  std::string_view rest = std::string_view(name).substr(disk.size());
  // A disk whose name ends in a digit puts a 'p' before the partition's number (nvme0n1p2), so
  // "nvme0n10" is a disk of its own, not a partition of "nvme0n1"; "sda1" has no 'p'.
  if (std::isdigit(static_cast<unsigned char>(disk.back()))) {
    if (rest.front() != 'p') return false;
    rest.remove_prefix(1);
  }
  return !rest.empty() &&
         std::all_of(rest.begin(), rest.end(), [](unsigned char c) { return std::isdigit(c); });
}

std::vector<DeviceBytes> read_diskstats(const std::string& proc_root) {
  std::vector<DeviceBytes> all;
  const auto text = read_text_file(proc_root + "/diskstats");
  if (!text) return all;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    // major minor name reads merged sectors_read ms writes merged sectors_written ...
    const auto fields = split_words(line);
    if (fields.size() < 10) continue;
    const auto read = to_number(fields[5]);
    const auto written = to_number(fields[9]);
    if (!read || !written) continue;
    all.push_back({fields[2], *read * kBytesPerSector, *written * kBytesPerSector});
  }
  std::set<std::string> names;
  for (const auto& d : all) names.insert(d.device);
  std::vector<DeviceBytes> disks;
  for (auto& d : all) {
    if (disks.size() >= kMaxDevices) break;
    if (is_virtual_block_device(d.device)) continue;
    const bool partition = std::any_of(names.begin(), names.end(), [&](const std::string& disk) {
      return is_partition_of(d.device, disk);
    });
    if (!partition) disks.push_back(std::move(d));
  }
  return disks;
}

// --- /proc/<pid>/stat, /proc/uptime ------------------------------------------------------------

struct ProcessStat {
  double cpu_ticks = 0;    // utime + stime
  double start_ticks = 0;  // starttime: ticks after boot
  double resident_pages = 0;
};

// Fields after the command name, which is in parentheses and may itself hold spaces and ')':
// the name ends at the last ')'. nullopt when the process is gone (or a zombie: it has exited
// and only waits to be reaped).
std::optional<ProcessStat> read_process_stat(const std::string& proc_root, int pid) {
  const auto text = read_text_file(detail::concat(proc_root, "/", pid, "/stat"));
  if (!text) return std::nullopt;
  const auto close = text->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  // words[0] is field 3 (state); field N is words[N - 3].
  const auto words = split_words(std::string_view(*text).substr(close + 1));
  if (words.size() < 22) return std::nullopt;
  if (words[0] == "Z" || words[0] == "X") return std::nullopt;
  const auto utime = to_number(words[14 - 3]);
  const auto stime = to_number(words[15 - 3]);
  const auto start = to_number(words[22 - 3]);
  const auto rss = to_number(words[24 - 3]);
  if (!utime || !stime || !start || !rss) return std::nullopt;
  return ProcessStat{*utime + *stime, *start, *rss};
}

// Seconds since boot (the first number of /proc/uptime), or nullopt.
std::optional<double> read_uptime(const std::string& proc_root) {
  const auto text = read_text_file(proc_root + "/uptime");
  if (!text) return std::nullopt;
  const auto words = split_words(*text);
  if (words.empty()) return std::nullopt;
  return to_number(words[0]);
}

std::string describe_nvml_error(nvml::Return rc) {
  return detail::concat("NVML error ", rc);
}

}  // namespace

// --- NodeSampler -------------------------------------------------------------------------------

struct NodeSampler::Impl {
  struct Gpu {
    unsigned index = 0;
    nvml::Device device = nullptr;
    bool xid_registered = false;
    double xid_errors = 0;
  };
  struct ProcessReading {
    double cpu_ticks = 0;
    double uptime_s = 0;  // NaN when /proc/uptime was not readable
    std::chrono::steady_clock::time_point at;
  };

  NodeSamplerOptions options;
  const double ticks_per_second = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page_bytes = static_cast<double>(sysconf(_SC_PAGESIZE));

  std::mutex mutex;  // one sample() at a time; guards everything below
  std::optional<ProcStat> last_stat;
  std::map<int, ProcessReading> last_process;  // by pid

  std::unique_ptr<nvml::Library> nvml;  // null without NVML
  std::vector<Gpu> gpus;
  nvml::EventSet xid_events = nullptr;  // owned (nvmlEventSetFree); null without XID events

  explicit Impl(NodeSamplerOptions o) : options(std::move(o)) {
    try {
      last_stat = read_proc_stat(options.proc_root);
    } catch (const Error&) {
      // sample() reports it; without a baseline the first ratio is the average since boot.
    }
    if (!options.nvml_library.empty()) open_nvml();
  }

  ~Impl() {
    if (xid_events && nvml && nvml->event_set_free) nvml->event_set_free(xid_events);
  }

  void open_nvml() {
    auto log = logger("metrics");
    nvml::Library::Opened opened = nvml::Library::open(options.nvml_library);
    if (!opened.library) {
      log->debug("no GPU metrics: {}", opened.why);
      return;
    }
    nvml = std::move(opened.library);
    const unsigned count = nvml->device_count();
    for (unsigned i = 0; i < count; ++i)
      if (nvml::Device device = nvml->device(i)) gpus.push_back(Gpu{.index = i, .device = device});
    // XID events: one set for every GPU, polled without waiting in each sample().
    if (nvml->event_set_create && nvml->register_events && nvml->event_set_wait &&
        nvml->event_set_free && !gpus.empty()) {
      if (const nvml::Return rc = nvml->event_set_create(&xid_events); rc != nvml::kSuccess) {
        log->debug("no GPU XID counts: nvmlEventSetCreate failed with {}", describe_nvml_error(rc));
        xid_events = nullptr;
      } else {
        for (Gpu& gpu : gpus) {
          const nvml::Return rc =
              nvml->register_events(gpu.device, nvml::kEventXidCritical, xid_events);
          gpu.xid_registered = rc == nvml::kSuccess;
          if (!gpu.xid_registered)
            log->debug("no XID count for GPU {}: nvmlDeviceRegisterEvents failed with {}",
                       gpu.index, describe_nvml_error(rc));
        }
      }
    }
    log->debug("GPU metrics through {} for {} GPU(s)", options.nvml_library, gpus.size());
  }

  void sample_cpu_and_memory(Snapshot& out) {
    ProcStat stat = read_proc_stat(options.proc_root);
    const NodeMemory memory = read_node_memory(options.proc_root);
    const ProcStat before = last_stat.value_or(ProcStat{});
    add_gauge(out, name::kNodeCpuUtilization,
              "Share of the node's CPU time spent busy (not idle or waiting for I/O) between two "
              "samples, all CPUs together (0..1).",
              {}, utilisation(stat.all, before.all));
    for (const auto& [index, ticks] : stat.cores) {
      CpuTicks core_before;
      for (const auto& [i, t] : before.cores)
        if (i == index) core_before = t;
      add_gauge(out, name::kNodeCoreUtilization,
                "Share of one CPU's time spent busy between two samples (0..1).",
                {{std::string(name::kCpuLabel), index}}, utilisation(ticks, core_before));
    }
    add_gauge(out, name::kNodeCpus, "CPUs the node's kernel lists in /proc/stat.", {},
              static_cast<double>(stat.cores.size()));
    add_gauge(out, name::kNodeMemoryUsed,
              "Memory in use on the node: MemTotal - MemAvailable of /proc/meminfo, bytes.", {},
              memory.used_bytes);
    add_gauge(out, name::kNodeMemoryTotal, "The node's memory (MemTotal), bytes.", {},
              memory.total_bytes);
    last_stat = std::move(stat);
  }

  void sample_network_and_disks(Snapshot& out) const {
    for (const DeviceBytes& d : read_net_dev(options.proc_root)) {
      const Labels labels = {{std::string(name::kDeviceLabel), d.device}};
      add_counter(out, name::kNodeNetworkReceive,
                  "Bytes a network interface received (loopback included).", labels, d.in);
      add_counter(out, name::kNodeNetworkTransmit,
                  "Bytes a network interface transmitted (loopback included).", labels, d.out);
    }
    for (const DeviceBytes& d : read_diskstats(options.proc_root)) {
      const Labels labels = {{std::string(name::kDeviceLabel), d.device}};
      add_counter(out, name::kNodeDiskRead, "Bytes read from a whole disk.", labels, d.in);
      add_counter(out, name::kNodeDiskWritten, "Bytes written to a whole disk.", labels, d.out);
    }
  }

  // Note [Process CPU utilisation]
  // A process's ratio is its CPU seconds over the wall seconds between two samples (1.0: one
  // core busy all the time; a process with four busy threads reads 4). Wall seconds come from
  // /proc/uptime, the kernel's own clock at 10 ms resolution, so a fake proc tree gives exact
  // ratios; without it, from the steady clock. A pid seen for the first time has no earlier
  // reading: its ratio is its average since it started (its start time is in its stat), which
  // for a process started since the previous sample is the same thing.
  void sample_processes(const std::vector<WatchedProcess>& processes, Snapshot& out) {
    const auto now = std::chrono::steady_clock::now();
    const std::optional<double> uptime = read_uptime(options.proc_root);
    std::map<int, ProcessReading> readings;
    for (const WatchedProcess& p : processes) {
      if (p.pid <= 0) continue;
      const std::optional<ProcessStat> stat = read_process_stat(options.proc_root, p.pid);
      if (!stat) continue;  // exited: left out
      ProcessReading reading{stat->cpu_ticks, uptime.value_or(std::nan("")), now};
      std::optional<double> ratio;
      if (const auto it = last_process.find(p.pid); it != last_process.end()) {
        const ProcessReading& before = it->second;
        const double seconds = std::isfinite(reading.uptime_s) && std::isfinite(before.uptime_s)
                                   ? reading.uptime_s - before.uptime_s
                                   : std::chrono::duration<double>(reading.at - before.at).count();
        if (seconds > 0 && reading.cpu_ticks >= before.cpu_ticks)
          ratio = (reading.cpu_ticks - before.cpu_ticks) / ticks_per_second / seconds;
      } else if (uptime) {
        const double seconds = *uptime - stat->start_ticks / ticks_per_second;
        if (seconds > 0) ratio = stat->cpu_ticks / ticks_per_second / seconds;
      }
      readings[p.pid] = reading;
      add_counter(out, name::kRankCpuSeconds,
                  "CPU seconds (user + system) a rank process used since it started.", p.labels,
                  stat->cpu_ticks / ticks_per_second);
      if (ratio)
        add_gauge(out, name::kRankCpuCores,
                  "A rank process's CPU seconds per second between two samples (1 = one core "
                  "busy).",
                  p.labels, *ratio);
      add_gauge(out, name::kRankResidentMemory, "A rank process's resident memory, bytes.",
                p.labels, stat->resident_pages * page_bytes);
    }
    last_process = std::move(readings);  // forgets pids no longer watched or gone
  }

  void count_xid_events() {
    if (!xid_events) return;
    for (int i = 0; i < kMaxXidEventsPerSample; ++i) {
      nvml::EventData event{};
      if (nvml->event_set_wait(xid_events, &event, 0) != nvml::kSuccess) break;  // none waiting
      if ((event.event_type & nvml::kEventXidCritical) == 0) continue;
      for (Gpu& gpu : gpus)
        if (gpu.device == event.device) gpu.xid_errors += 1;
    }
  }

  void sample_gpus(Snapshot& out) {
    if (!nvml) return;
    count_xid_events();
    for (const Gpu& gpu : gpus) {
      const Labels labels = {{std::string(name::kGpuLabel), std::to_string(gpu.index)}};
      nvml::Utilization utilization{};
      if (nvml->get_utilization &&
          nvml->get_utilization(gpu.device, &utilization) == nvml::kSuccess) {
        add_gauge(out, name::kGpuUtilization,
                  "Share of the driver's last sample period in which a kernel ran on the GPU "
                  "(0..1).",
                  labels, utilization.gpu * kRatioPerPercent);
        add_gauge(out, name::kGpuMemoryCopyUtilization,
                  "Share of the driver's last sample period in which device memory was read or "
                  "written (0..1).",
                  labels, utilization.memory * kRatioPerPercent);
      }
      nvml::Memory memory{};
      if (nvml->get_memory && nvml->get_memory(gpu.device, &memory) == nvml::kSuccess) {
        add_gauge(out, name::kGpuMemoryUsed, "GPU memory in use, bytes.", labels,
                  static_cast<double>(memory.used));
        add_gauge(out, name::kGpuMemoryTotal, "GPU memory, bytes.", labels,
                  static_cast<double>(memory.total));
      }
      unsigned value = 0;
      if (nvml->get_temperature &&
          nvml->get_temperature(gpu.device, nvml::kTemperatureGpu, &value) == nvml::kSuccess)
        add_gauge(out, name::kGpuTemperature, "GPU die temperature, degrees Celsius.", labels,
                  value);
      if (nvml->get_power && nvml->get_power(gpu.device, &value) == nvml::kSuccess)
        add_gauge(out, name::kGpuPower, "GPU power draw, watts.", labels,
                  value * kWattsPerMilliwatt);
      if (nvml->get_clock && nvml->get_clock(gpu.device, nvml::kClockSm, &value) == nvml::kSuccess)
        add_gauge(out, name::kGpuSmClock, "GPU streaming multiprocessor clock, hertz.", labels,
                  value * kHertzPerMegahertz);
      if (gpu.xid_registered)
        add_counter(out, name::kGpuXidErrors,
                    "Critical XID errors the driver reported for the GPU since this sampler "
                    "started.",
                    labels, gpu.xid_errors);
    }
  }
};

NodeSampler::NodeSampler(NodeSamplerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

NodeSampler::~NodeSampler() = default;

Snapshot NodeSampler::sample(const std::vector<WatchedProcess>& processes) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Snapshot out;
  impl_->sample_cpu_and_memory(out);
  impl_->sample_network_and_disks(out);
  impl_->sample_processes(processes, out);
  impl_->sample_gpus(out);
  return out;
}

bool NodeSampler::has_gpus() const {
  return impl_->nvml != nullptr && !impl_->gpus.empty();
}

}  // namespace trainyard::metrics
