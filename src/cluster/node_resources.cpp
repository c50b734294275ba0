#include "trainyard/cluster/node_resources.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cluster/json_fields.h"
#include "metrics/nvml.h"
#include "trainyard/cluster/api.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/text_file.h"

namespace trainyard::cluster {

namespace fs = std::filesystem;

// --- JSON --------------------------------------------------------------------------------------

namespace {
namespace f = api::field;
namespace jf = json_fields;
}  // namespace

void to_json(nlohmann::json& j, const GpuInfo& gpu) {
  j = nlohmann::json{
      {f::kIndex, gpu.index}, {f::kName, gpu.name}, {f::kMemoryBytes, gpu.memory_bytes}};
}

void from_json(const nlohmann::json& j, GpuInfo& gpu) {
  gpu.index = jf::required<int>(j, {"GPU"}, f::kIndex);
  gpu.name = jf::required<std::string>(j, {"GPU"}, f::kName);
  gpu.memory_bytes = jf::required<std::int64_t>(j, {"GPU"}, f::kMemoryBytes);
}

void to_json(nlohmann::json& j, const NodeResources& resources) {
  j = nlohmann::json{{f::kCpu, resources.cpu},
                     {f::kGpu, resources.gpu},
                     {f::kMemoryBytes, resources.memory_bytes},
                     {f::kGpus, resources.gpus}};
}

void from_json(const nlohmann::json& j, NodeResources& resources) {
  const jf::Context c{"node's resources"};
  resources.cpu = jf::required<double>(j, c, f::kCpu);
  resources.gpu = jf::required<double>(j, c, f::kGpu);
  resources.memory_bytes = jf::required<std::int64_t>(j, c, f::kMemoryBytes);
  TY_CHECK(std::isfinite(resources.cpu) && resources.cpu >= 0 && std::isfinite(resources.gpu) &&
               resources.gpu >= 0 && resources.memory_bytes >= 0,
           "The node's resources must be finite and not negative; got ", resources.cpu, " CPU, ",
           resources.gpu, " GPU and ", resources.memory_bytes, " bytes of memory.");
  resources.gpus = jf::optional_list<GpuInfo>(j, c, f::kGpus, 1024);
}

// --- reading /proc and /sys --------------------------------------------------------------------

namespace {

// The value of a "Key:   123 kB" line of /proc/meminfo, in bytes.
std::optional<std::int64_t> meminfo_bytes(const std::string& meminfo, std::string_view key) {
  std::istringstream lines(meminfo);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0 ||
        line[key.size()] != ':')
      continue;
    std::istringstream fields(line.substr(key.size() + 1));
    std::int64_t value = 0;
    std::string unit;
    if (!(fields >> value)) return std::nullopt;
    fields >> unit;
    return unit == "kB" ? value * 1024 : value;
  }
  return std::nullopt;
}

std::string read_meminfo(const std::string& proc_root) {
  const fs::path path = fs::path(proc_root) / "meminfo";
  auto text = read_text_file(path);
  TY_CHECK_T(Error, text.has_value(), "Could not read ", path.string(),
             " for the machine's memory; is /proc mounted?");
  return *text;
}

void check_override(const std::optional<double>& value, const char* field, const char* flag) {
  if (!value) return;
  TY_CHECK(std::isfinite(*value) && *value >= 0, "DetectOptions::", field,
           " must be a finite number >= 0, not ", *value, "; HINT: pass ", flag,
           " a number of whole or fractional units, e.g. ", flag, "=2.");
}

}  // namespace

std::string local_hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// --- NVML --------------------------------------------------------------------------------------

std::vector<GpuInfo> detect_nvml_gpus(const std::string& library) {
  auto log = logger("resources");
  const metrics::nvml::Library::Opened opened = metrics::nvml::Library::open(library);
  if (!opened.library) {
    if (opened.not_found)
      log->debug("no GPUs: {}", opened.why);
    else
      log->warn("no GPUs: {}", opened.why);
    return {};
  }
  const metrics::nvml::Library& nvml = *opened.library;
  std::vector<GpuInfo> gpus;
  unsigned count = 0;
  if (const metrics::nvml::Return rc = nvml.get_count(&count); rc != metrics::nvml::kSuccess) {
    log->warn("no GPUs: nvmlDeviceGetCount_v2 failed with NVML error {}", rc);
    count = 0;
  }
  for (unsigned i = 0; i < count; ++i) {
    const metrics::nvml::Device device = nvml.device(i);
    if (device == nullptr) {
      log->warn("GPU {} skipped: nvmlDeviceGetHandleByIndex_v2 failed", i);
      continue;
    }
    GpuInfo gpu{.index = static_cast<int>(i)};
    char name[metrics::nvml::kDeviceNameBufferSize] = {};
    if (nvml.get_name && nvml.get_name(device, name, sizeof(name)) == metrics::nvml::kSuccess)
      gpu.name = name;
    metrics::nvml::Memory memory{};
    if (nvml.get_memory && nvml.get_memory(device, &memory) == metrics::nvml::kSuccess)
      gpu.memory_bytes = static_cast<std::int64_t>(memory.total);
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

std::vector<GpuInfo> select_visible_gpus(const std::vector<GpuInfo>& gpus,
                                         std::string_view visible_devices) {
  std::vector<GpuInfo> visible;
  const std::string text = trim_whitespace(visible_devices);
  if (text.empty()) return visible;
  std::istringstream entries(text);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    entry = trim_whitespace(entry);
    if (entry.empty()) break;  // "0,,1": CUDA stops at the gap
    if (!std::all_of(entry.begin(), entry.end(),
                     [](unsigned char c) { return std::isdigit(c) || c == '-'; })) {
      logger("resources")
          ->warn("{}='{}' names GPUs by UUID, which trainyard does not match; offering all {} GPUs",
                 kCudaVisibleDevicesEnv, text, gpus.size());
      return gpus;
    }
    int index = -1;
    try {
      index = std::stoi(entry);
    } catch (const std::exception&) {
      break;
    }
    const auto it = std::find_if(gpus.begin(), gpus.end(),
                                 [&](const GpuInfo& gpu) { return gpu.index == index; });
    if (it == gpus.end()) break;  // CUDA ignores the rest of the list after an invalid index
    if (std::none_of(visible.begin(), visible.end(),
                     [&](const GpuInfo& gpu) { return gpu.index == index; }))
      visible.push_back(*it);
  }
  return visible;
}

// --- detect_resources --------------------------------------------------------------------------

NodeResources detect_resources(const DetectOptions& options) {
  check_override(options.num_cpus, "num_cpus", "--num-cpus");
  check_override(options.num_gpus, "num_gpus", "--num-gpus");
  if (options.memory_bytes)
    TY_CHECK(*options.memory_bytes >= 0, "DetectOptions::memory_bytes must be >= 0, not ",
             *options.memory_bytes, "; HINT: pass --memory a number of bytes, e.g. 8589934592.");

  NodeResources resources;
  const CgroupLimits limits = read_cgroup_limits(options.proc_root, options.cgroup_root);
  // See Note [Counting CPUs in a container] (src/cpu_count.cpp).
  resources.cpu =
      options.num_cpus ? *options.num_cpus : usable_cpu_count(affinity_cpu_count(), limits);

  if (options.memory_bytes) {
    resources.memory_bytes = *options.memory_bytes;
  } else {
    const std::string meminfo = read_meminfo(options.proc_root);
    const auto total = meminfo_bytes(meminfo, "MemTotal");
    TY_CHECK_T(Error, total.has_value(), "No MemTotal line in ", options.proc_root,
               "/meminfo; HINT: pass DetectOptions::memory_bytes (--memory) explicitly.");
    resources.memory_bytes = *total;
    if (limits.memory_max_bytes)
      resources.memory_bytes = std::min(resources.memory_bytes, *limits.memory_max_bytes);
  }

  // A declared num_gpus of 0 skips NVML altogether (no driver initialisation on a CPU worker).
  if (!options.num_gpus || *options.num_gpus > 0) {
    resources.gpus = detect_nvml_gpus(options.nvml_library);
    std::optional<std::string> visible = options.visible_devices;
    if (!visible)
      if (const char* env = std::getenv(kCudaVisibleDevicesEnv)) visible = env;
    if (visible) resources.gpus = select_visible_gpus(resources.gpus, *visible);
  }
  if (options.num_gpus) {
    resources.gpu = *options.num_gpus;
    const auto keep = static_cast<std::size_t>(std::ceil(*options.num_gpus));
    if (resources.gpus.size() > keep) resources.gpus.resize(keep);
  } else {
    resources.gpu = static_cast<double>(resources.gpus.size());
  }
  return resources;
}

// --- UsageSampler ------------------------------------------------------------------------------

UsageSampler::UsageSampler(UsageSamplerOptions options) : options_(std::move(options)) {
  previous_ = read_cpu_times();
}

UsageSampler::CpuTimes UsageSampler::read_cpu_times() const {
  const fs::path path = fs::path(options_.proc_root) / "stat";
  const auto text = read_text_file(path);
  TY_CHECK_T(Error, text.has_value(), "Could not read ", path.string(),
             " for the machine's CPU use; is /proc mounted?");
  CpuTimes times;
  bool found = false;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("cpu", 0) != 0) continue;
    if (line.size() > 3 && std::isdigit(static_cast<unsigned char>(line[3]))) {
      ++times.cpus;
      continue;
    }
    // "cpu  user nice system idle iowait irq softirq steal guest guest_nice", in ticks. guest
    // time is already inside user and nice; idle and iowait are the idle part.
    std::istringstream fields(line.substr(3));
    std::uint64_t value[8] = {};
    int n = 0;
    while (n < 8 && fields >> value[n]) ++n;
    TY_CHECK_T(Error, n >= 4, "Could not parse the 'cpu' line of ", path.string(), ": '", line,
               "'.");
    for (int i = 0; i < n; ++i) times.total += value[i];
    times.busy = times.total - value[3] - (n > 4 ? value[4] : 0);
    found = true;
  }
  TY_CHECK_T(Error, found, "No 'cpu' line in ", path.string(), ".");
  times.cpus = std::max(times.cpus, 1);
  return times;
}

UsageSample UsageSampler::sample() {
  const CpuTimes now = read_cpu_times();
  const std::string meminfo = read_meminfo(options_.proc_root);
  const auto total = meminfo_bytes(meminfo, "MemTotal");
  auto available = meminfo_bytes(meminfo, "MemAvailable");
  if (!available) available = meminfo_bytes(meminfo, "MemFree");  // kernels before 3.14
  TY_CHECK_T(Error, total && available, "No MemTotal or MemAvailable line in ", options_.proc_root,
             "/meminfo.");

  UsageSample sample;
  sample.memory_total_bytes = *total;
  sample.memory_used_bytes = std::max<std::int64_t>(0, *total - *available);
  std::lock_guard<std::mutex> lock(mutex_);
  if (now.total > previous_.total) {
    const double busy =
        static_cast<double>(now.busy >= previous_.busy ? now.busy - previous_.busy : 0);
    last_fraction_ = std::clamp(busy / static_cast<double>(now.total - previous_.total), 0.0, 1.0);
    previous_ = now;
  }
  sample.cpu_fraction = last_fraction_;
  sample.cpu_used = last_fraction_ * now.cpus;
  return sample;
}

}  // namespace trainyard::cluster
