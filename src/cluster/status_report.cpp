#include "trainyard/cluster/status_report.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cluster/json_fields.h"
#include "trainyard/cluster/api.h"
#include "trainyard/error.h"

namespace trainyard::cluster {

using nlohmann::json;

// --- node states -------------------------------------------------------------------------------

namespace {
constexpr std::array<std::pair<NodeState, std::string_view>, 6> kNodeStateNames{{
    {NodeState::kAlive, "alive"},
    {NodeState::kSuspect, "suspect"},
    {NodeState::kPending, "pending"},
    {NodeState::kDead, "dead"},
    {NodeState::kExited, "exited"},
    {NodeState::kDrained, "drained"},
}};
}  // namespace

std::string_view to_string(NodeState state) {
  for (const auto& [value, name] : kNodeStateNames)
    if (value == state) return name;
  TY_ASSERT(false, "unknown NodeState ", static_cast<int>(state));
  return "unknown";
}

NodeState parse_node_state(std::string_view text) {
  for (const auto& [value, name] : kNodeStateNames)
    if (name == text) return value;
  throw InvalidArgumentError(detail::concat(
      "Unknown node state '", text,
      "' in the cluster snapshot; expected alive, suspect, pending, dead, exited or drained."));
}

// --- JSON --------------------------------------------------------------------------------------

namespace {

namespace f = api::field;
namespace jf = json_fields;

// Every message here is part of the cluster snapshot.
jf::Context in_snapshot(std::string_view object) {
  return {object, " in the cluster snapshot"};
}

}  // namespace

void to_json(json& j, const NodeRanks& ranks) {
  j = json{{f::kJobId, ranks.job_id}, {f::kRanks, ranks.ranks}};
}

void from_json(const json& j, NodeRanks& ranks) {
  const auto c = in_snapshot("node's ranks entry");
  ranks.job_id = jf::required<std::string>(j, c, f::kJobId);
  ranks.ranks = jf::required<std::vector<int>>(j, c, f::kRanks);
}

void to_json(json& j, const SnapshotNode& node) {
  j = json{{f::kNodeId, node.node_id},
           {f::kHostname, node.hostname},
           {f::kAddress, node.address},
           {f::kState, to_string(node.state)},
           {f::kReason, node.reason},
           {f::kResources, node.resources},
           {f::kUsage,
            {{f::kCpuUsed, node.usage.cpu_used},
             {f::kMemoryUsedBytes, node.usage.memory_used_bytes},
             {f::kGpuUsed, node.usage.gpu_used}}},
           {f::kHeartbeatAgeS, node.heartbeat_age_s},
           {f::kRanks, node.ranks}};
}

void from_json(const json& j, SnapshotNode& node) {
  const auto c = in_snapshot("node");
  node.node_id = jf::required<std::string>(j, c, f::kNodeId);
  node.hostname = jf::required<std::string>(j, c, f::kHostname);
  node.address = jf::required<std::string>(j, c, f::kAddress);
  node.state = parse_node_state(jf::required<std::string>(j, c, f::kState));
  node.reason = jf::optional_or<std::string>(j, c, f::kReason, "");
  node.resources = jf::field(j, c, f::kResources).get<NodeResources>();
  node.usage = {};
  if (const auto it = j.find(f::kUsage); it != j.end() && !it->is_null()) {
    const auto u = in_snapshot("node's usage");
    node.usage.cpu_used = jf::optional_or<double>(*it, u, f::kCpuUsed, 0);
    node.usage.memory_used_bytes = jf::optional_or<std::int64_t>(*it, u, f::kMemoryUsedBytes, 0);
    node.usage.gpu_used = jf::optional_or<double>(*it, u, f::kGpuUsed, 0);
  }
  node.heartbeat_age_s = jf::optional_or<double>(j, c, f::kHeartbeatAgeS, 0);
  node.ranks = jf::optional_list<NodeRanks>(j, c, f::kRanks);
}

void to_json(json& j, const NodeFailure& failure) {
  j = json{{f::kNodeId, failure.node_id},
           {f::kHostname, failure.hostname},
           {f::kTime, failure.time},
           {f::kReason, failure.reason}};
}

void from_json(const json& j, NodeFailure& failure) {
  const auto c = in_snapshot("failure");
  failure.node_id = jf::required<std::string>(j, c, f::kNodeId);
  failure.hostname = jf::optional_or<std::string>(j, c, f::kHostname, "");
  failure.time = jf::optional_or<std::string>(j, c, f::kTime, "");
  failure.reason = jf::optional_or<std::string>(j, c, f::kReason, "");
}

void to_json(json& j, const ResourceDemand& demand) {
  j = json{{f::kJobId, demand.job_id},
           {f::kCpu, demand.cpu},
           {f::kGpu, demand.gpu},
           {f::kNodes, demand.nodes}};
}

void from_json(const json& j, ResourceDemand& demand) {
  const auto c = in_snapshot("demand");
  demand.job_id = jf::required<std::string>(j, c, f::kJobId);
  demand.cpu = jf::optional_or<double>(j, c, f::kCpu, 0);
  demand.gpu = jf::optional_or<double>(j, c, f::kGpu, 0);
  demand.nodes = jf::required<int>(j, c, f::kNodes);
}

void to_json(json& j, const ClusterSnapshot& snapshot) {
  j = json{{f::kTime, snapshot.time},
           {f::kHead,
            {{f::kHealthy, snapshot.head_problem.empty()}, {f::kProblem, snapshot.head_problem}}},
           {f::kNodes, snapshot.nodes},
           {f::kFailures, snapshot.failures},
           {f::kDemands, snapshot.demands},
           {f::kJobs, snapshot.jobs}};
}

void from_json(const json& j, ClusterSnapshot& snapshot) {
  const auto c = in_snapshot("snapshot");
  snapshot.time = jf::required<std::string>(j, c, f::kTime);
  const json head = jf::optional_or<json>(j, c, f::kHead, json::object());
  snapshot.head_problem = jf::optional_or<std::string>(head, in_snapshot("head"), f::kProblem, "");
  snapshot.nodes = jf::optional_list<SnapshotNode>(j, c, f::kNodes);
  snapshot.failures = jf::optional_list<NodeFailure>(j, c, f::kFailures);
  snapshot.demands = jf::optional_list<ResourceDemand>(j, c, f::kDemands);
  snapshot.jobs = jf::optional_or<std::map<std::string, int>>(j, c, f::kJobs, {});
}

namespace {
json parse_json(std::string_view json_text) {
  try {
    return json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw InvalidArgumentError(detail::concat("The cluster snapshot is not JSON (", e.what(),
                                              "); the first bytes were '", json_text.substr(0, 80),
                                              "'. HINT: is --address the head's HTTP address?"));
  }
}
}  // namespace

ClusterSnapshot parse_cluster_snapshot(std::string_view json_text) {
  return parse_json(json_text).get<ClusterSnapshot>();
}

std::string format_status_json(std::string_view json_text) {
  return parse_json(json_text).dump(2) + "\n";
}

// --- numbers, bytes and times ------------------------------------------------------------------

std::string format_memory(std::int64_t bytes) {
  struct Unit {
    const char* suffix;
    double size;
  };
  static constexpr Unit kUnits[] = {
      {"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0}};
  for (const Unit& unit : kUnits) {
    if (static_cast<double>(bytes) >= unit.size) {
      char text[64];
      std::snprintf(text, sizeof(text), "%.2f%s", static_cast<double>(bytes) / unit.size,
                    unit.suffix);
      return text;
    }
  }
  return std::to_string(bytes) + "B";
}

std::string format_quantity(double value) {
  if (!std::isfinite(value)) return value != value ? "nan" : (value > 0 ? "inf" : "-inf");
  double rounded = std::round(value * 100) / 100;
  if (rounded == 0) rounded = 0;  // no "-0.0"
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text), rounded);
  std::string out(text, result.ptr);
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

std::string format_timestamp(std::string_view iso) {
  const auto digits = [&](std::size_t from, std::size_t count) {
    if (iso.size() < from + count) return false;
    for (std::size_t i = from; i < from + count; ++i)
      if (!std::isdigit(static_cast<unsigned char>(iso[i]))) return false;
    return true;
  };
  if (!(digits(0, 4) && iso[4] == '-' && digits(5, 2) && iso[7] == '-' && digits(8, 2) &&
        (iso[10] == 'T' || iso[10] == ' ') && digits(11, 2) && iso[13] == ':' && digits(14, 2) &&
        iso[16] == ':' && digits(17, 2)))
    return std::string(iso);
  std::size_t at = 19;
  std::string fraction;
  if (at < iso.size() && iso[at] == '.') {
    ++at;
    while (at < iso.size() && std::isdigit(static_cast<unsigned char>(iso[at])))
      fraction += iso[at++];
    if (fraction.empty()) return std::string(iso);
  }
  const std::string_view zone = iso.substr(at);
  if (!(zone.empty() || zone == "Z" || zone == "+00:00")) return std::string(iso);
  fraction.resize(6, '0');  // microseconds, as Python's datetime keeps them
  std::string out = std::string(iso.substr(0, 10)) + " " + std::string(iso.substr(11, 8));
  if (fraction != "000000") out += "." + fraction;  // str(datetime) omits a zero fraction
  return out;
}

// --- the report --------------------------------------------------------------------------------

// Note [The ray status layout]
// `ray status` (Ray 2.x, python/ray/autoscaler/_private/util.py format_info_string) prints:
//   a header "======== Autoscaler status: <str(datetime)> ========" and separators of dashes
//   as long as the header; "Node status" with Active / Idle (" <count> <node type>", or
//   " (no active nodes)" / " (no idle nodes)"), Pending (" <ip>: <node type>, <status>") and
//   Recent failures; a blank line; "Resources" with " <used>/<total> <resource>" lines (floats
//   as Python prints them, memory through format_memory) and the demands, each bundle as a
//   Python dict. Ray groups nodes by node type; trainyard nodes have no types, so each node is
//   its own line "1 node_<id>", the name Ray gives a node of a read-only provider. Our additions
//   keep the shapes: a suspect node's "(suspect: ...)" suffix, a pending node's status
//   "waiting to re-register", a failure's "node_<id> (<host>): <reason> at <time>" and a demand
//   "{'CPU': 2.0} * 3 (job <id>, waits for 3 nodes)" (Ray's placement-group form "{...} * N").
//   -v appends a section per node, like Ray's per-node breakdown.

namespace {

constexpr int kMaxFailuresShown = 20;  // Ray's AUTOSCALER_MAX_FAILURES_DISPLAYED

std::string node_name(const std::string& node_id) {
  return "node_" + node_id;
}

std::string seconds_1(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1fs", seconds);
  return text;
}

std::string suspect_suffix(const SnapshotNode& node) {
  if (node.state != NodeState::kSuspect) return "";
  return " (suspect: no heartbeat for " + seconds_1(node.heartbeat_age_s) + ")";
}

std::string bundle_dict(double cpu, double gpu) {
  std::string out = "{";
  if (cpu > 0) out += "'CPU': " + format_quantity(cpu);
  if (gpu > 0) out += std::string(cpu > 0 ? ", " : "") + "'GPU': " + format_quantity(gpu);
  return out + "}";
}

// "0-3, 6, 8-9"
std::string rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

void print_lines(std::ostringstream& out,
                 const std::vector<std::string>& lines,
                 const char* when_empty) {
  if (lines.empty()) out << when_empty << "\n";
  for (const auto& line : lines) out << line << "\n";
}

void print_usage(std::ostringstream& out,
                 const char* indent,
                 double cpu_used,
                 double cpu_total,
                 double gpu_used,
                 double gpu_total,
                 std::int64_t memory_used,
                 std::int64_t memory_total) {
  out << indent << format_quantity(cpu_used) << "/" << format_quantity(cpu_total) << " CPU\n";
  out << indent << format_quantity(gpu_used) << "/" << format_quantity(gpu_total) << " GPU\n";
  out << indent << format_memory(memory_used) << "/" << format_memory(memory_total) << " memory\n";
}

void print_node_section(std::ostringstream& out, const SnapshotNode& node) {
  out << "\nNode: " << node_name(node.node_id) << " (" << node.hostname << ")\n";
  out << " Address: " << node.address << "\n";
  out << " State: " << to_string(node.state);
  if (!node.reason.empty()) out << " (" << node.reason << ")";
  out << "\n";
  out << " Last heartbeat: " << seconds_1(node.heartbeat_age_s) << " ago\n";
  out << " Usage:\n";
  print_usage(out, "  ", node.usage.cpu_used, node.resources.cpu, node.usage.gpu_used,
              node.resources.gpu, node.usage.memory_used_bytes, node.resources.memory_bytes);
  if (!node.resources.gpus.empty()) {
    out << " GPUs:\n";
    for (const auto& gpu : node.resources.gpus)
      out << "  " << gpu.index << ": " << gpu.name << ", " << format_memory(gpu.memory_bytes)
          << "\n";
  }
  out << " Ranks:\n";
  if (node.ranks.empty()) out << "  (none)\n";
  for (const auto& job : node.ranks)
    out << "  job " << job.job_id << ": " << rank_ranges(job.ranks) << "\n";
}

}  // namespace

std::string format_status(const ClusterSnapshot& snapshot, const StatusReportOptions& options) {
  // See Note [The ray status layout].
  const std::string header =
      "======== Autoscaler status: " + format_timestamp(snapshot.time) + " ========";
  const std::string separator(header.size(), '-');

  std::vector<std::string> active, idle, pending;
  double cpu_used = 0, cpu_total = 0, gpu_used = 0, gpu_total = 0;
  std::int64_t memory_used = 0, memory_total = 0;
  for (const auto& node : snapshot.nodes) {
    if (is_live(node.state)) {
      const bool runs_ranks = std::any_of(node.ranks.begin(), node.ranks.end(),
                                          [](const NodeRanks& job) { return !job.ranks.empty(); });
      (runs_ranks ? active : idle)
          .push_back(" 1 " + node_name(node.node_id) + suspect_suffix(node));
      cpu_used += node.usage.cpu_used;
      cpu_total += node.resources.cpu;
      gpu_used += node.usage.gpu_used;
      gpu_total += node.resources.gpu;
      memory_used += node.usage.memory_used_bytes;
      memory_total += node.resources.memory_bytes;
    } else if (node.state == NodeState::kPending) {
      pending.push_back(" " + node.address + ": " + node_name(node.node_id) +
                        ", waiting to re-register");
    }
  }

  // The most recent failures first, at most kMaxFailuresShown of them.
  std::vector<const NodeFailure*> failures;
  for (const auto& failure : snapshot.failures) failures.push_back(&failure);
  std::stable_sort(failures.begin(), failures.end(),
                   [](const NodeFailure* a, const NodeFailure* b) { return a->time > b->time; });
  if (failures.size() > kMaxFailuresShown) failures.resize(kMaxFailuresShown);
  std::vector<std::string> failure_lines;
  for (const NodeFailure* failure : failures) {
    std::string line = std::string(" ") + node_name(failure->node_id);
    if (!failure->hostname.empty()) line += " (" + failure->hostname + ")";
    line += ": " + (failure->reason.empty() ? std::string("failed") : failure->reason);
    if (!failure->time.empty()) line += " at " + format_timestamp(failure->time).substr(0, 19);
    failure_lines.push_back(std::move(line));
  }

  std::vector<std::string> demand_lines;
  for (const auto& demand : snapshot.demands) {
    demand_lines.push_back(std::string(" ") + bundle_dict(demand.cpu, demand.gpu) + " * " +
                           std::to_string(demand.nodes) + " (job " + demand.job_id +
                           ", waits for " + std::to_string(demand.nodes) +
                           (demand.nodes == 1 ? " node)" : " nodes)"));
  }

  std::ostringstream out;
  out << header << "\n";
  if (!snapshot.head_problem.empty()) out << "Head: UNHEALTHY: " << snapshot.head_problem << "\n";
  out << "Node status\n" << separator << "\n";
  out << "Active:\n";
  print_lines(out, active, " (no active nodes)");
  out << "Idle:\n";
  print_lines(out, idle, " (no idle nodes)");
  out << "Pending:\n";
  print_lines(out, pending, " (no pending nodes)");
  out << "Recent failures:\n";
  print_lines(out, failure_lines, " (no failures)");
  out << "\n";
  out << "Resources\n" << separator << "\n";
  out << "Total Usage:\n";
  print_usage(out, " ", cpu_used, cpu_total, gpu_used, gpu_total, memory_used, memory_total);
  out << "\n";
  out << "Total Demands:\n";
  print_lines(out, demand_lines, " (no resource demands)");
  if (options.verbose)
    for (const auto& node : snapshot.nodes) print_node_section(out, node);
  return out.str();
}

}  // namespace trainyard::cluster
