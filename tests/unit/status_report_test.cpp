// StatusReport: the cluster snapshot's JSON form and `trainyard status` in ray status's layout.
#include "trainyard/cluster/status_report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "trainyard/error.h"

namespace trainyard::cluster {
namespace {

using nlohmann::json;

constexpr std::int64_t kGiBytes = std::int64_t{1} << 30;
constexpr std::int64_t kMiB = std::int64_t{1} << 20;

std::string error_text(const std::function<void()>& run) {
  try {
    run();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "(no InvalidArgumentError)";
}

TEST(StatusReport, FormatMemoryAsRayDoes) {
  EXPECT_EQ(format_memory(0), "0B");
  EXPECT_EQ(format_memory(1), "1B");
  EXPECT_EQ(format_memory(1023), "1023B");
  EXPECT_EQ(format_memory(1024), "1.00KiB");
  EXPECT_EQ(format_memory(1536), "1.50KiB");
  EXPECT_EQ(format_memory(kMiB - 1), "1024.00KiB");  // as Python's "{:.2f}" rounds it
  EXPECT_EQ(format_memory(512 * kMiB), "512.00MiB");
  EXPECT_EQ(format_memory(kGiBytes + kGiBytes / 2), "1.50GiB");
  EXPECT_EQ(format_memory(38 * kGiBytes), "38.00GiB");
  EXPECT_EQ(format_memory(1024 * kGiBytes + 512 * kGiBytes), "1.50TiB");
  EXPECT_EQ(format_memory(1024 * 1024 * kGiBytes), "1024.00TiB");  // no unit above TiB
}

TEST(StatusReport, QuantitiesPrintAsPythonFloats) {
  EXPECT_EQ(format_quantity(0), "0.0");
  EXPECT_EQ(format_quantity(-0.0), "0.0");
  EXPECT_EQ(format_quantity(6), "6.0");
  EXPECT_EQ(format_quantity(1.5), "1.5");
  EXPECT_EQ(format_quantity(0.1 + 0.2), "0.3");
  EXPECT_EQ(format_quantity(1.23456), "1.23");
  EXPECT_EQ(format_quantity(128), "128.0");
}

TEST(StatusReport, TimestampsPrintAsPythonDatetimes) {
  EXPECT_EQ(format_timestamp("2026-11-24T12:00:01.123456Z"), "2026-11-24 12:00:01.123456");
  EXPECT_EQ(format_timestamp("2026-11-24T12:00:01.123Z"), "2026-11-24 12:00:01.123000");
  EXPECT_EQ(format_timestamp("2026-11-24T12:00:01.1234567+00:00"), "2026-11-24 12:00:01.123456");
  EXPECT_EQ(format_timestamp("2026-11-24T12:00:01Z"), "2026-11-24 12:00:01");
  EXPECT_EQ(format_timestamp("2026-11-24T12:00:01.000Z"), "2026-11-24 12:00:01");
  // Anything else is shown as it came.
  EXPECT_EQ(format_timestamp("2026-11-24T12:00:01+02:00"), "2026-11-24T12:00:01+02:00");
  EXPECT_EQ(format_timestamp("yesterday"), "yesterday");
  EXPECT_EQ(format_timestamp(""), "");
}

TEST(StatusReport, EmptyCluster) {
  const auto snapshot = parse_cluster_snapshot(
      R"({"time": "2026-11-24T12:00:01.123456Z", "nodes": [], "failures": [], "demands": [],
          "jobs": {}})");
  EXPECT_EQ(format_status(snapshot),
            "======== Autoscaler status: 2026-11-24 12:00:01.123456 ========\n"
            "Node status\n"
            "---------------------------------------------------------------\n"
            "Active:\n"
            " (no active nodes)\n"
            "Idle:\n"
            " (no idle nodes)\n"
            "Pending:\n"
            " (no pending nodes)\n"
            "Recent failures:\n"
            " (no failures)\n"
            "\n"
            "Resources\n"
            "---------------------------------------------------------------\n"
            "Total Usage:\n"
            " 0.0/0.0 CPU\n"
            " 0.0/0.0 GPU\n"
            " 0B/0B memory\n"
            "\n"
            "Total Demands:\n"
            " (no resource demands)\n");
}

// Two active nodes (one of them suspect), one idle, one pending, one dead; two failures, two
// demands. The dead node counts nowhere but in the failures.
constexpr const char* kBusyCluster = R"({
  "time": "2026-11-24T12:00:01.123456Z",
  "nodes": [
    {"node_id": "aaa", "hostname": "gpu-1", "address": "10.0.0.1:7000", "state": "alive",
     "reason": "", "heartbeat_age_s": 0.4,
     "resources": {"cpu": 4, "gpu": 1, "memory_bytes": 17179869184,
                   "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3",
                             "memory_bytes": 85520809984}]},
     "usage": {"cpu_used": 3.5, "memory_used_bytes": 4294967296, "gpu_used": 1},
     "ranks": [{"job_id": "raysubmit_1", "ranks": [0, 1, 2, 3, 6]}]},
    {"node_id": "bbb", "hostname": "gpu-2", "address": "10.0.0.2:7000", "state": "suspect",
     "reason": "no heartbeat for 7.1s", "heartbeat_age_s": 7.06,
     "resources": {"cpu": 4.0, "gpu": 1.0, "memory_bytes": 17179869184},
     "usage": {"cpu_used": 2.25, "memory_used_bytes": 2147483648, "gpu_used": 1},
     "ranks": [{"job_id": "raysubmit_1", "ranks": [4, 5]}]},
    {"node_id": "ccc", "hostname": "cpu-1", "address": "10.0.0.3:7000", "state": "alive",
     "reason": "", "heartbeat_age_s": 1.0,
     "resources": {"cpu": 2, "gpu": 0, "memory_bytes": 8589934592},
     "usage": {"cpu_used": 0.1, "memory_used_bytes": 536870912},
     "ranks": []},
    {"node_id": "ddd", "hostname": "cpu-2", "address": "10.0.0.4:7000", "state": "pending",
     "reason": "known before the head restarted", "heartbeat_age_s": 30,
     "resources": {"cpu": 2, "gpu": 0, "memory_bytes": 8589934592},
     "usage": {"cpu_used": 0, "memory_used_bytes": 0}, "ranks": []},
    {"node_id": "eee", "hostname": "cpu-3", "address": "10.0.0.5:7000", "state": "dead",
     "reason": "no heartbeat for 30.0s", "heartbeat_age_s": 31.2,
     "resources": {"cpu": 8, "gpu": 0, "memory_bytes": 34359738368},
     "usage": {"cpu_used": 7, "memory_used_bytes": 1073741824}, "ranks": []}
  ],
  "failures": [
    {"node_id": "eee", "hostname": "cpu-3", "time": "2026-11-24T11:58:30.5Z",
     "reason": "no heartbeat for 30.0s"},
    {"node_id": "fff", "hostname": "cpu-4", "time": "2026-11-24T11:59:10Z",
     "reason": "worker process exited with code 137"}
  ],
  "demands": [
    {"job_id": "raysubmit_2", "cpu": 2, "gpu": 0, "nodes": 3},
    {"job_id": "raysubmit_3", "cpu": 8, "gpu": 1, "nodes": 1}
  ],
  "jobs": {"PENDING": 2, "RUNNING": 1, "SUCCEEDED": 4}
})";

constexpr const char* kBusyClusterText =
    "======== Autoscaler status: 2026-11-24 12:00:01.123456 ========\n"
    "Node status\n"
    "---------------------------------------------------------------\n"
    "Active:\n"
    " 1 node_aaa\n"
    " 1 node_bbb (suspect: no heartbeat for 7.1s)\n"
    "Idle:\n"
    " 1 node_ccc\n"
    "Pending:\n"
    " 10.0.0.4:7000: node_ddd, waiting to re-register\n"
    "Recent failures:\n"
    " node_fff (cpu-4): worker process exited with code 137 at 2026-11-24 11:59:10\n"
    " node_eee (cpu-3): no heartbeat for 30.0s at 2026-11-24 11:58:30\n"
    "\n"
    "Resources\n"
    "---------------------------------------------------------------\n"
    "Total Usage:\n"
    " 5.85/10.0 CPU\n"
    " 2.0/2.0 GPU\n"
    " 6.50GiB/40.00GiB memory\n"
    "\n"
    "Total Demands:\n"
    " {'CPU': 2.0} * 3 (job raysubmit_2, waits for 3 nodes)\n"
    " {'CPU': 8.0, 'GPU': 1.0} * 1 (job raysubmit_3, waits for 1 node)\n";

TEST(StatusReport, AnUnhealthyHeadSaysWhyUnderTheHeader) {
  const auto snapshot = parse_cluster_snapshot(
      R"({"time": "2026-11-24T12:00:01Z", "head": {"healthy": false,
          "problem": "The head's database /s/head.db cannot be written: its disk is full."},
          "nodes": []})");
  const std::string text = format_status(snapshot);
  EXPECT_EQ(
      text.substr(0, text.find("Node status")),
      "======== Autoscaler status: 2026-11-24 12:00:01 ========\n"
      "Head: UNHEALTHY: The head's database /s/head.db cannot be written: its disk is full.\n");
  // A healthy head (or an older head that does not say) adds no line.
  EXPECT_EQ(format_status(parse_cluster_snapshot(R"({"time": "t", "nodes": []})")).find("Head:"),
            std::string::npos);
}

TEST(StatusReport, ActiveIdlePendingFailuresAndDemands) {
  EXPECT_EQ(format_status(parse_cluster_snapshot(kBusyCluster)), kBusyClusterText);
}

TEST(StatusReport, VerboseAddsASectionPerNode) {
  const std::string text = format_status(parse_cluster_snapshot(kBusyCluster), {.verbose = true});
  const std::string expected_nodes =
      "\n"
      "Node: node_aaa (gpu-1)\n"
      " Address: 10.0.0.1:7000\n"
      " State: alive\n"
      " Last heartbeat: 0.4s ago\n"
      " Usage:\n"
      "  3.5/4.0 CPU\n"
      "  1.0/1.0 GPU\n"
      "  4.00GiB/16.00GiB memory\n"
      " GPUs:\n"
      "  0: NVIDIA H100 80GB HBM3, 79.65GiB\n"
      " Ranks:\n"
      "  job raysubmit_1: 0-3, 6\n"
      "\n"
      "Node: node_bbb (gpu-2)\n"
      " Address: 10.0.0.2:7000\n"
      " State: suspect (no heartbeat for 7.1s)\n"
      " Last heartbeat: 7.1s ago\n"
      " Usage:\n"
      "  2.25/4.0 CPU\n"
      "  1.0/1.0 GPU\n"
      "  2.00GiB/16.00GiB memory\n"
      " Ranks:\n"
      "  job raysubmit_1: 4-5\n"
      "\n"
      "Node: node_ccc (cpu-1)\n"
      " Address: 10.0.0.3:7000\n"
      " State: alive\n"
      " Last heartbeat: 1.0s ago\n"
      " Usage:\n"
      "  0.1/2.0 CPU\n"
      "  0.0/0.0 GPU\n"
      "  512.00MiB/8.00GiB memory\n"
      " Ranks:\n"
      "  (none)\n"
      "\n"
      "Node: node_ddd (cpu-2)\n"
      " Address: 10.0.0.4:7000\n"
      " State: pending (known before the head restarted)\n"
      " Last heartbeat: 30.0s ago\n"
      " Usage:\n"
      "  0.0/2.0 CPU\n"
      "  0.0/0.0 GPU\n"
      "  0B/8.00GiB memory\n"
      " Ranks:\n"
      "  (none)\n"
      "\n"
      "Node: node_eee (cpu-3)\n"
      " Address: 10.0.0.5:7000\n"
      " State: dead (no heartbeat for 30.0s)\n"
      " Last heartbeat: 31.2s ago\n"
      " Usage:\n"
      "  7.0/8.0 CPU\n"
      "  0.0/0.0 GPU\n"
      "  1.00GiB/32.00GiB memory\n"
      " Ranks:\n"
      "  (none)\n";
  EXPECT_EQ(text, std::string(kBusyClusterText) + expected_nodes);
}

TEST(StatusReport, OnlyTheTwentyMostRecentFailuresAreShown) {
  json snapshot = {{"time", "2026-11-24T12:00:00Z"}, {"failures", json::array()}};
  for (int i = 0; i < 25; ++i) {
    char time[32];
    std::snprintf(time, sizeof(time), "2026-11-24T11:%02d:00Z", i);
    snapshot["failures"].push_back({{"node_id", std::string("n") + std::to_string(i)},
                                    {"hostname", "h"},
                                    {"time", time},
                                    {"reason", "r"}});
  }
  const std::string text = format_status(parse_cluster_snapshot(snapshot.dump()));
  EXPECT_NE(text.find(" node_n24 (h): r at 2026-11-24 11:24:00\n node_n23 "), std::string::npos)
      << text;
  EXPECT_NE(text.find(" node_n5 (h)"), std::string::npos) << text;
  EXPECT_EQ(text.find(" node_n4 (h)"), std::string::npos) << text;
}

TEST(StatusReport, SnapshotRoundTripsThroughJson) {
  const ClusterSnapshot snapshot = parse_cluster_snapshot(kBusyCluster);
  ASSERT_EQ(snapshot.nodes.size(), 5u);
  EXPECT_EQ(snapshot.nodes[1].state, NodeState::kSuspect);
  EXPECT_EQ(snapshot.nodes[0].resources.gpus.at(0).name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(snapshot.nodes[0].ranks.at(0).ranks, (std::vector<int>{0, 1, 2, 3, 6}));
  EXPECT_EQ(snapshot.jobs.at("SUCCEEDED"), 4);
  EXPECT_EQ(snapshot.demands.at(1).gpu, 1.0);

  const json written = snapshot;
  EXPECT_EQ(written["nodes"][1]["state"], "suspect");
  const ClusterSnapshot again = written.get<ClusterSnapshot>();
  EXPECT_EQ(json(again), written);
  EXPECT_EQ(format_status(again, {.verbose = true}), format_status(snapshot, {.verbose = true}));
}

TEST(StatusReport, OptionalFieldsMayBeAbsent) {
  const auto snapshot = parse_cluster_snapshot(R"({"time": "2026-11-24T12:00:00Z", "nodes": [
      {"node_id": "a", "hostname": "h", "address": "x:1", "state": "alive",
       "resources": {"cpu": 1, "gpu": 0, "memory_bytes": 1024}}]})");
  ASSERT_EQ(snapshot.nodes.size(), 1u);
  EXPECT_TRUE(snapshot.nodes[0].ranks.empty());
  EXPECT_EQ(snapshot.nodes[0].usage.memory_used_bytes, 0);
  EXPECT_TRUE(snapshot.failures.empty());
  EXPECT_NE(format_status(snapshot).find("Idle:\n 1 node_a\n"), std::string::npos);
}

TEST(StatusReport, MalformedSnapshotsAreRejectedWithTheField) {
  EXPECT_NE(error_text([] {
              parse_cluster_snapshot("<html>502 Bad Gateway</html>");
            }).find("The cluster snapshot is not JSON"),
            std::string::npos);
  EXPECT_NE(error_text([] { parse_cluster_snapshot(R"({"nodes": []})"); }).find("'time'"),
            std::string::npos);
  const std::string bad_state = error_text([] {
    parse_cluster_snapshot(R"({"time": "t", "nodes": [{"node_id": "a", "hostname": "h",
        "address": "x", "state": "zombie", "resources": {"cpu": 1, "gpu": 0, "memory_bytes": 1}}]})");
  });
  EXPECT_NE(bad_state.find("Unknown node state 'zombie'"), std::string::npos) << bad_state;
  EXPECT_NE(bad_state.find("alive, suspect, pending, dead, exited or drained"), std::string::npos);
  const std::string no_cpu = error_text([] {
    parse_cluster_snapshot(R"({"time": "t", "nodes": [{"node_id": "a", "hostname": "h",
        "address": "x", "state": "alive", "resources": {"gpu": 0, "memory_bytes": 1}}]})");
  });
  EXPECT_NE(no_cpu.find("no 'cpu' field"), std::string::npos) << no_cpu;
  const std::string wrong_type = error_text([] {
    parse_cluster_snapshot(R"({"time": "t", "demands": [{"job_id": "j", "nodes": "three"}]})");
  });
  EXPECT_NE(wrong_type.find("'nodes' field in the cluster snapshot has the wrong type: \"three\""),
            std::string::npos)
      << wrong_type;
}

TEST(StatusReport, JsonOutputIsTheSnapshotPretty) {
  EXPECT_EQ(format_status_json(R"({"time":"t","nodes":[],"extra":{"kept":true}})"),
            "{\n"
            "  \"extra\": {\n"
            "    \"kept\": true\n"
            "  },\n"
            "  \"nodes\": [],\n"
            "  \"time\": \"t\"\n"
            "}\n");
  EXPECT_THROW(format_status_json("not json"), InvalidArgumentError);
}

TEST(StatusReport, NodeStatesRoundTrip) {
  for (const char* name : {"alive", "suspect", "pending", "dead", "exited", "drained"})
    EXPECT_EQ(to_string(parse_node_state(name)), name);
  EXPECT_TRUE(is_live(NodeState::kSuspect));
  EXPECT_FALSE(is_live(NodeState::kPending));
  EXPECT_FALSE(is_live(NodeState::kDrained));
}

}  // namespace
}  // namespace trainyard::cluster
