// The seeds' cluster on three hosts: a head and two workers, each in its own network namespace,
// the workers finding the head by a DNS name (as ECS tasks find theirs through Cloud Map) and
// started before it, then the FashionMNIST recipe submitted on two nodes. Skipped where network
// namespaces cannot be created, failed there under CI.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "../multiproc/cluster_fixture.h"
#include "../multiproc/multiproc_util.h"
#include "../text.h"
#include "netns_hosts.h"

namespace trainyard::mptest {
namespace {

using namespace std::chrono_literals;

using trainyard::test::contains;

TEST(ClusterE2E, HeadAndTwoWorkersInNamespacesTrainFashionMnistOnTwoNodes) {
  Hosts hosts(3);
  if (!hosts.ok())
    TY_MISSING_PREREQUISITE("cannot create network namespaces here: " << hosts.error());
  const std::string name = "head.trainyard.test";
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(hosts.set_hosts(i, hosts.addr(0) + " " + name + "\n"));
  TempDir dir;
  ClusterFixture cluster(TRAINYARD_CLI_PATH, dir.path());
  const std::string head = name + ":" + std::to_string(cluster.port());
  // The workers come first and wait for the head's name to answer.
  cluster.start_worker("w1", {"--num-cpus", "2"}, hosts.in(1, {}), head);
  cluster.start_worker("w2", {"--num-cpus", "2"}, hosts.in(2, {}), head);
  std::this_thread::sleep_for(2s);
  // A head on a real interface needs the token; it runs no ranks of its own here.
  cluster.start_head({"--bind", hosts.addr(0), "--num-cpus", "0"}, hosts.in(0, {}));
  const auto in_head_ns = [&](std::vector<std::string> args, std::chrono::seconds timeout) {
    std::vector<std::string> argv = hosts.in(0, {TRAINYARD_CLI_PATH});
    argv.insert(argv.end(), args.begin(), args.end());
    return run_program(
        argv, {{"TRAINYARD_ADDRESS", "http://" + head}, {"TRAINYARD_TOKEN", cluster.token()}},
        timeout);
  };
  ASSERT_TRUE(ClusterFixture::eventually(
      [&] {
        const auto r = in_head_ns({"status", "--json"}, 10s);
        const auto s = nlohmann::json::parse(r.out, nullptr, false);
        if (!s.is_object()) return false;
        int alive = 0;
        for (const auto& n : s["nodes"]) alive += n.value("state", "") == "alive";
        return alive == 2;
      },
      40s))
      << cluster.log_of("head") << cluster.log_of("w1") << cluster.log_of("w2");
  const auto status = in_head_ns({"status", "-v"}, 10s);
  EXPECT_TRUE(contains(status.out, hosts.addr(1))) << status.out;
  EXPECT_TRUE(contains(status.out, hosts.addr(2))) << status.out;
  EXPECT_TRUE(contains(status.out, " 0.0/4.0 CPU")) << status.out;

  const auto r = in_head_ns({"submit",
                             "--nodes",
                             "2",
                             "--nproc-per-node",
                             "1",
                             "--submission-id",
                             "fmnist",
                             "--",
                             TRAINYARD_CLI_PATH,
                             "train",
                             "fashion-mnist",
                             "--epochs",
                             "1",
                             "--limit",
                             "512",
                             "--batch-size",
                             "32",
                             "--threads",
                             "1",
                             "--storage",
                             dir.str(),
                             "--name",
                             "cluster-run",
                             "--no-progress"},
                            110s);
  ASSERT_EQ(r.status.exit_code, 0)
      << r.out << r.err << cluster.log_of("head") << cluster.log_of("w1") << cluster.log_of("w2");
  EXPECT_TRUE(contains(r.out, "Job 'fmnist' succeeded")) << r.out;
  // Every rank's epoch line, prefixed with the node that ran it and the rank.
  for (const std::string w : {"w1", "w2"}) {
    const std::string prefix = std::string("[").append(cluster.node_id(w).substr(0, 8)).append(":");
    EXPECT_TRUE(contains(r.out, prefix)) << r.out;
  }
  EXPECT_TRUE(contains(r.out, "Process rank 0")) << r.out;
  EXPECT_TRUE(contains(r.out, "Process rank 1")) << r.out;
  const auto result =
      nlohmann::json::parse(read_file(dir.path() / "cluster-run" / "result.json"), nullptr, false);
  ASSERT_TRUE(result.is_object()) << r.out;
  EXPECT_EQ(result["world_size"].get<int>(), 2) << result.dump();
}

}  // namespace
}  // namespace trainyard::mptest
