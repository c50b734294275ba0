// `trainyard bench scaling` over real ranks: the FashionMNIST recipe at 1 and 2 local ranks, then
// the table on stdout, scaling.json with both world sizes, and the charts (bench_scaling_checks.h).
// The same across nodes (network namespaces): tests/e2e/bench_scaling_nodes_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "bench_scaling_checks.h"
#include "multiproc_util.h"

#ifndef TRAINYARD_CLI_PATH
#error "TRAINYARD_CLI_PATH must name the trainyard binary (a compile definition)"
#endif

namespace trainyard::mptest {
namespace {

using namespace std::chrono_literals;

TEST(BenchScaling, RunsEachWorldSizeAndDrawsTheCharts) {
  TempDir dir;
  const std::string out = (dir.path() / "scaling").string();
  auto r = run_program({kCli,        "bench",   "scaling",      "--world-sizes", "1,2",
                        "--busbw",   "1.0",     "--predict",    "4,16",          "--out",
                        out,         "--",      "train",        "fashion-mnist", "--epochs",
                        "1",         "--limit", "256",          "--batch-size",  "32",
                        "--threads", "1",       "--no-progress"},
                       {}, 150s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_TRUE(r.status.success()) << r.status.to_string() << "\n" << r.out << r.err;
  EXPECT_NE(r.out.find("W = local ranks"), std::string::npos) << r.out;
  expect_scaling_outputs(r.out, out, {1, 2}, {4, 16});
}

TEST(BenchScaling, RefusesWorldSizesWithoutOneRank) {
  TempDir dir;
  auto r = run_program({kCli, "bench", "scaling", "--world-sizes", "2,4", "--out", dir.str(), "--",
                        "train", "fashion-mnist"});
  EXPECT_EQ(r.status.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("--world-sizes must include 1"), std::string::npos) << r.err;
}

TEST(BenchScaling, NodesViaNeedsTheRendezvousEndpoint) {
  TempDir dir;
  auto r = run_program({kCli, "bench", "scaling", "--nodes-via", "ip netns exec ns{node}", "--out",
                        dir.str(), "--", "train", "fashion-mnist"});
  EXPECT_EQ(r.status.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("--nodes-via needs --rdzv-endpoint HOST:PORT"), std::string::npos) << r.err;
}

TEST(BenchScaling, NodesViaNamesAnUnknownPlaceholder) {
  TempDir dir;
  auto r =
      run_program({kCli, "bench", "scaling", "--nodes-via", "ssh host{rank}", "--rdzv-endpoint",
                   "198.18.0.1:29400", "--out", dir.str(), "--", "train", "fashion-mnist"});
  EXPECT_EQ(r.status.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("has the placeholder {rank}; it knows {node} (0..N-1) and {nodes} (N)"),
            std::string::npos)
      << r.err;
}

TEST(BenchScaling, RendezvousEndpointWithoutNodesVia) {
  TempDir dir;
  auto r = run_program({kCli, "bench", "scaling", "--rdzv-endpoint", "198.18.0.1:29400", "--out",
                        dir.str(), "--", "train", "fashion-mnist"});
  EXPECT_EQ(r.status.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("--rdzv-endpoint is for runs across nodes"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace trainyard::mptest
