// `trainyard status [-v] [--json]`: the head's cluster snapshot (GET /api/cluster/status) as a
// struct with its JSON form, and its rendering in the layout of Ray 2.x's `ray status`
// (Node status: Active / Idle / Pending / Recent failures; Resources: Total Usage / Total
// Demands; with -v a per-node breakdown). See Note [The ray status layout] in the source.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/cluster/node_resources.h"

namespace trainyard::cluster {

// A node's place in its life (the head's node lifecycle):
//  alive    registered, heartbeating;           suspect  registered, heartbeats late;
//  pending  known from before a head restart, not yet re-registered;
//  dead     heartbeats stopped (a failure);     exited / drained  left in an orderly way.
enum class NodeState { kAlive, kSuspect, kPending, kDead, kExited, kDrained };

// "alive", "suspect", ... and back; parse_node_state throws InvalidArgumentError naming the
// accepted values.
std::string_view to_string(NodeState state);
NodeState parse_node_state(std::string_view text);

// A live node counts in the cluster's totals and can run ranks.
inline bool is_live(NodeState state) {
  return state == NodeState::kAlive || state == NodeState::kSuspect;
}

struct NodeUsage {
  double cpu_used = 0;  // cores busy (UsageSample::cpu_used)
  std::int64_t memory_used_bytes = 0;
  double gpu_used = 0;  // GPUs held by ranks; optional in the JSON ("gpu_used"), 0 when absent
};

// The ranks of one job that run on a node.
struct NodeRanks {
  std::string job_id;
  std::vector<int> ranks;
};

struct SnapshotNode {
  std::string node_id;
  std::string hostname;
  std::string address;
  NodeState state = NodeState::kAlive;
  std::string reason;  // why the node is in its state ("" for alive)
  NodeResources resources;
  NodeUsage usage;
  double heartbeat_age_s = 0;  // seconds since the node's last heartbeat
  std::vector<NodeRanks> ranks;
};

struct NodeFailure {
  std::string node_id;
  std::string hostname;
  std::string time;  // ISO 8601 UTC
  std::string reason;
};

// A job waiting for nodes: a gang of `nodes` bundles of {cpu, gpu} each.
struct ResourceDemand {
  std::string job_id;
  double cpu = 0;  // per node
  double gpu = 0;  // per node
  int nodes = 0;
};

// GET /api/cluster/status:
//   {"time": ISO8601 UTC, "nodes": [{node_id, hostname, address, state, reason,
//     resources{cpu, gpu, memory_bytes[, gpus]}, usage{cpu_used, memory_used_bytes[, gpu_used]},
//     heartbeat_age_s, ranks:[{job_id, ranks:[int]}]}],
//    "failures": [{node_id, hostname, time, reason}], "demands": [{job_id, cpu, gpu, nodes}],
//    "jobs": {"PENDING": n, "RUNNING": n, ...}}
struct ClusterSnapshot {
  std::string time;
  // Why the head is unhealthy (it cannot write its store: a full disk); "" when it is healthy.
  // JSON: "head": {"healthy": bool, "problem": str}.
  std::string head_problem;
  std::vector<SnapshotNode> nodes;
  std::vector<NodeFailure> failures;
  std::vector<ResourceDemand> demands;
  std::map<std::string, int> jobs;  // job count by status
};

// from_json throws InvalidArgumentError naming the missing or mistyped field. Optional on input:
// a node's reason, heartbeat_age_s, usage, ranks and usage.gpu_used; the snapshot's failures,
// demands and jobs.
void to_json(nlohmann::json& j, const NodeRanks& ranks);
void from_json(const nlohmann::json& j, NodeRanks& ranks);
void to_json(nlohmann::json& j, const SnapshotNode& node);
void from_json(const nlohmann::json& j, SnapshotNode& node);
void to_json(nlohmann::json& j, const NodeFailure& failure);
void from_json(const nlohmann::json& j, NodeFailure& failure);
void to_json(nlohmann::json& j, const ResourceDemand& demand);
void from_json(const nlohmann::json& j, ResourceDemand& demand);
void to_json(nlohmann::json& j, const ClusterSnapshot& snapshot);
void from_json(const nlohmann::json& j, ClusterSnapshot& snapshot);

// Parses the body of GET /api/cluster/status. Throws InvalidArgumentError when it is not JSON or
// lacks a field.
ClusterSnapshot parse_cluster_snapshot(std::string_view json_text);

struct StatusReportOptions {
  bool verbose = false;  // -v: a section per node after Resources
};

// The `trainyard status` text, ending in a newline. Totals count live (alive and suspect) nodes.
std::string format_status(const ClusterSnapshot& snapshot, const StatusReportOptions& options = {});

// `trainyard status --json`: the snapshot's JSON text as received, pretty-printed (2 spaces),
// ending in a newline. Throws InvalidArgumentError when it is not JSON.
std::string format_status_json(std::string_view json_text);

// Bytes as Ray's format_memory shows them: whole bytes below 1 KiB ("0B", "1023B"), otherwise
// two decimals of the largest binary unit not above the value ("1.00KiB", "512.00MiB",
// "38.00GiB", "1.50TiB").
std::string format_memory(std::int64_t bytes);

// A quantity as Python prints a float (Ray's "0.0/6.0 CPU"): shortest round-trip digits with at
// least one decimal ("6.0", "1.5", "0.25"), after rounding to 2 decimals (sampled CPU use).
std::string format_quantity(double value);

// "2026-11-24T12:00:01.123Z" -> "2026-11-24 12:00:01.123000", as Python prints a datetime (Ray's
// header). Text that is not ISO 8601 comes back unchanged.
std::string format_timestamp(std::string_view iso8601);

}  // namespace trainyard::cluster
