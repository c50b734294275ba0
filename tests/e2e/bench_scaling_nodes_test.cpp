// `trainyard bench scaling --nodes-via` across hosts: two network namespaces on a bridge, the
// FashionMNIST recipe at 1 and 2 nodes of one rank each (an agent per namespace, started through
// `ip netns exec`, c10d rendezvous served by node 0's agent), then the same table, scaling.json
// and charts as for local ranks (../multiproc/bench_scaling_checks.h), and one log per node.
// Skipped where network namespaces cannot be created (not root), failed there under CI.
// Addresses come from 198.18.0.0/15, the range reserved for benchmarking.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "../multiproc/bench_scaling_checks.h"
#include "../multiproc/multiproc_util.h"
#include "netns_hosts.h"

namespace trainyard::mptest {
namespace {

using namespace std::chrono_literals;

// "ty<pid>n" of namespaces ty<pid>n0, ty<pid>n1, ...: the template's {node} completes it.
std::string node_prefix(const Hosts& hosts) {
  std::string prefix = hosts.name(0);
  prefix.pop_back();
  return prefix;
}

// `trainyard bench scaling` at 1 and 2 nodes of one rank, each started through `ip netns exec`
// with node 0 serving the rendezvous, with `flags` (--timeout, --out, ...), of fashion-mnist on
// `limit` images.
std::vector<std::string> scaling_across_nodes(const Hosts& hosts,
                                              const std::vector<std::string>& flags,
                                              int limit) {
  std::vector<std::string> args = {TRAINYARD_CLI_PATH,
                                   "bench",
                                   "scaling",
                                   "--world-sizes",
                                   "1,2",
                                   "--nodes-via",
                                   "ip netns exec " + node_prefix(hosts) + "{node}",
                                   "--rdzv-endpoint",
                                   hosts.addr(0) + ":29400"};
  args.insert(args.end(), flags.begin(), flags.end());
  const std::vector<std::string> recipe = {"--",
                                           "train",
                                           "fashion-mnist",
                                           "--epochs",
                                           "1",
                                           "--limit",
                                           std::to_string(limit),
                                           "--batch-size",
                                           "32",
                                           "--threads",
                                           "1",
                                           "--no-progress"};
  args.insert(args.end(), recipe.begin(), recipe.end());
  return args;
}

TEST(BenchScalingNodes, RunsEachWorldSizeAsNodesAndDrawsTheCharts) {
  Hosts hosts(2);
  if (!hosts.ok())
    TY_MISSING_PREREQUISITE("cannot create network namespaces here: " << hosts.error());
  TempDir dir;
  const std::filesystem::path out = dir.path() / "scaling";
  ASSERT_EQ(node_prefix(hosts) + "1", hosts.name(1));
  auto r = run_program(
      scaling_across_nodes(
          hosts, {"--busbw", "1.0", "--predict", "4,16", "--timeout", "45", "--out", out.string()},
          128),
      {}, 55s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_TRUE(r.status.success()) << r.status.to_string() << "\n" << r.out << r.err;
  EXPECT_NE(r.out.find("W = nodes of 1 rank each (--nodes-via)"), std::string::npos) << r.out;
  expect_scaling_outputs(r.out, out, {1, 2}, {4, 16});

  // Each run as that many agents, one per namespace, which met at node 0's rendezvous.
  const auto json = nlohmann::json::parse(read_file(out / "scaling.json"));
  EXPECT_EQ(json.at("launch").at("workers"), "nodes of 1 rank each") << json.dump(2);
  EXPECT_EQ(json.at("launch").at("rdzv_endpoint"), hosts.addr(0) + ":29400");
  const std::string w1 = read_file(out / "runs" / "w1.node0.log");
  EXPECT_NE(w1.find("group_world_size=1"), std::string::npos) << w1;
  EXPECT_FALSE(std::filesystem::exists(out / "runs" / "w1.node1.log"));
  for (const char* name : {"w2.node0.log", "w2.node1.log"}) {
    const std::string log = read_file(out / "runs" / name);
    EXPECT_NE(log.find("group_world_size=2"), std::string::npos) << name << ":\n" << log;
  }
  EXPECT_NE(read_file(out / "runs" / "w2.node0.log").find("(198.18.213.1)"), std::string::npos);
  EXPECT_NE(read_file(out / "runs" / "w2.node1.log").find("(198.18.213.2)"), std::string::npos);
  // The chart's axis says what W counts.
  EXPECT_NE(read_file(out / "scaling.svg").find("nodes of 1 rank"), std::string::npos);
}

TEST(BenchScalingNodes, AFailedNodeStopsTheOthersAndNamesItsLog) {
  Hosts hosts(1);
  if (!hosts.ok())
    TY_MISSING_PREREQUISITE("cannot create network namespaces here: " << hosts.error());
  TempDir dir;
  const std::filesystem::path out = dir.path() / "scaling";
  // At 2 nodes node 1's launcher fails (no such namespace); node 0's agent, waiting at the
  // rendezvous for it, is stopped at once rather than after the join timeout or --timeout.
  const auto start = std::chrono::steady_clock::now();
  auto r = run_program(scaling_across_nodes(hosts, {"--timeout", "40", "--out", out.string()}, 64),
                       {}, 55s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.status.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("ended with exit code"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("w2.node1.log"), std::string::npos) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 40s) << r.err;
}

}  // namespace
}  // namespace trainyard::mptest
