// The elastic agent through the trainyard binary, several agents ("nodes") on loopback: dynamic
// rendezvous over c10d and etcd, a plain PyTorch DDP script surviving a restart across nodes, and
// clear errors when the rendezvous cannot form.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../text.h"
#include "etcd_server.h"
#include "multiproc_util.h"
#include "trainyard/elastic/subprocess.h"

#ifndef TRAINYARD_CLI_PATH
#error "TRAINYARD_CLI_PATH must name the trainyard binary (a compile definition)"
#endif

namespace trainyard::elastic {
namespace {

using namespace std::chrono_literals;
using mptest::RunOutput;

using mptest::kCli;
// Short rounds and quick death detection, so that the tests take seconds.
constexpr const char* kFastConf = "last_call_timeout=0.5,keep_alive_interval=0.3,join_timeout=30";

using trainyard::test::contains;

int free_port() {
  int port = 0;
  mptest::bind_loopback(false, &port);
  return port;
}

// Collects every agent at once (see mptest::collect_all).
std::vector<RunOutput> collect_agents(std::vector<Subprocess>& agents,
                                      std::chrono::milliseconds timeout) {
  std::vector<Subprocess*> children;
  for (auto& a : agents) children.push_back(&a);
  return mptest::collect_all(std::move(children), timeout);
}

// Starts one agent per entry of `argvs` at once and collects them all.
std::vector<RunOutput> run_agents(const std::vector<std::vector<std::string>>& argvs,
                                  std::vector<std::pair<std::string, std::string>> env = {},
                                  std::chrono::milliseconds timeout = 45s) {
  std::vector<Subprocess> agents;
  for (const auto& argv : argvs) agents.emplace_back(SubprocessOptions{.argv = argv, .env = env});
  return collect_agents(agents, timeout);
}

std::vector<std::string> agent(const std::string& backend,
                               const std::string& endpoint,
                               const std::string& nnodes,
                               std::vector<std::string> program,
                               std::vector<std::string> extra = {},
                               const std::string& conf = kFastConf) {
  std::vector<std::string> argv = {kCli,
                                   "run",
                                   "--nnodes",
                                   nnodes,
                                   "--nproc-per-node",
                                   "1",
                                   "--rdzv-backend",
                                   backend,
                                   "--rdzv-endpoint",
                                   endpoint,
                                   "--rdzv-id",
                                   "agent-test",
                                   "--rdzv-conf",
                                   conf};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back("--");
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

// Reads the non-blocking pipe `fd` into `seen` until `seen` holds `part`; false when `timeout`
// passes first.
bool read_until(int fd,
                const std::string& part,
                std::chrono::milliseconds timeout,
                std::string& seen) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!contains(seen, part)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
    seen += pending_output(fd);
  }
  return true;
}

const std::vector<std::string> kPrintEnv = {
    "/bin/sh", "-c", R"(echo "R=$RANK W=$WORLD_SIZE G=$GROUP_RANK/$GROUP_WORLD_SIZE")"};

// Both agents of a 2-node kPrintEnv run succeeded, and their ranks are 0 and 1 of 2.
void expect_two_distinct_ranks(const std::vector<RunOutput>& out) {
  std::string all;
  for (const auto& o : out) {
    ASSERT_FALSE(o.timed_out) << o.err;
    EXPECT_EQ(o.status.exit_code, 0) << o.err;
    all += o.out;
  }
  EXPECT_TRUE(contains(all, "R=0 W=2 G=0/2")) << all;
  EXPECT_TRUE(contains(all, "R=1 W=2 G=1/2")) << all;
}

TEST(ElasticAgent, TwoNodesMeetOverC10dAndGetDistinctRanks) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto out = run_agents(
      {agent("c10d", endpoint, "2", kPrintEnv), agent("c10d", endpoint, "2", kPrintEnv)});
  expect_two_distinct_ranks(out);
  EXPECT_TRUE(contains(out[0].err + out[1].err, "Serving the rendezvous store on " + endpoint));
}

TEST(ElasticAgent, PythonDdpScriptSurvivesARestartAcrossTwoNodes) {
  auto probe = mptest::run_program({TRAINYARD_PYTHON, "-c", "import torch.distributed"});
  if (!probe.status.success())
    TY_MISSING_PREREQUISITE(TRAINYARD_PYTHON
                            " cannot import torch.distributed (scripts/setup.sh installs torch)");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  const std::vector<std::string> script = {
      TRAINYARD_PYTHON, std::string(TRAINYARD_TEST_HELPERS_DIR) + "/python_ddp.py"};
  auto out = run_agents({agent("c10d", endpoint, "2", script, {"--max-restarts", "1"}),
                         agent("c10d", endpoint, "2", script, {"--max-restarts", "1"})},
                        {{"TY_FAIL_RANK_ON_FIRST_ATTEMPT", "1"}}, 50s);
  std::string all_out, all_err;
  for (const auto& o : out) {
    ASSERT_FALSE(o.timed_out) << o.err;
    EXPECT_EQ(o.status.exit_code, 0) << o.out << o.err;
    all_out += o.out;
    all_err += o.err;
  }
  EXPECT_TRUE(contains(all_out, "rank 1 fails on purpose in the first attempt")) << all_out;
  EXPECT_TRUE(contains(all_out, "rank 0/2 all_reduce sum=3 ddp_matches_full_batch=True"))
      << all_out;
  EXPECT_TRUE(contains(all_out, "rank 1/2 all_reduce sum=3 ddp_matches_full_batch=True"))
      << all_out;
  EXPECT_TRUE(contains(all_err, "Worker group FAILED. 1/1 attempts left")) << all_err;
  EXPECT_TRUE(contains(all_err, "restart_count=1")) << all_err;
}

TEST(ElasticAgent, TwoNodesMeetThroughEtcd) {
  if (access(kEtcd, X_OK) != 0)
    TY_MISSING_PREREQUISITE(kEtcd << " is missing; run scripts/setup.sh");
  EtcdServer etcd;
  auto out = run_agents({agent("etcd", etcd.endpoint(), "2", kPrintEnv),
                         agent("etcd", etcd.endpoint(), "2", kPrintEnv)});
  expect_two_distinct_ranks(out);
  EXPECT_TRUE(contains(out[0].err, "rendezvous etcd at http://" + etcd.endpoint())) << out[0].err;
}

TEST(ElasticAgent, UnreachableEtcdIsAClearErrorWithinTheJoinTimeout) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());  // nothing listens
  auto r =
      mptest::run_program(agent("etcd", endpoint, "2", kPrintEnv, {}, "join_timeout=2"), {}, 30s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.status.exit_code, 0);
  EXPECT_LT(r.elapsed, 25s) << "the join timeout is 2 s; the rest is margin for a loaded machine";
  EXPECT_TRUE(contains(r.err, "etcd at http://" + endpoint)) << r.err;
  EXPECT_TRUE(contains(r.err, "HINT")) << r.err;
}

TEST(ElasticAgent, TooFewNodesTimeOutNamingTheCount) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto r = mptest::run_program(
      agent("c10d", endpoint, "2:3", kPrintEnv, {}, "join_timeout=1.5,last_call_timeout=0.5"), {},
      30s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.status.exit_code, 0);
  EXPECT_LT(r.elapsed, 25s) << "the join timeout is 2 s; the rest is margin for a loaded machine";
  EXPECT_TRUE(contains(r.err, "completed within 1.5 s")) << r.err;
  EXPECT_TRUE(contains(r.err, "1 node(s) joined, 2 needed")) << r.err;
}

TEST(ElasticAgent, ALateNodeJoinsAtTheNextRound) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  // Two nodes (of up to 3) run a program that lasts until a third joins and ends the round.
  const std::vector<std::string> wait_for_three = {
      "/bin/sh", "-c", R"(echo "R=$RANK W=$WORLD_SIZE"; [ "$WORLD_SIZE" = 3 ] || exec sleep 30)"};
  std::vector<Subprocess> agents;
  for (int i = 0; i < 2; ++i)
    agents.emplace_back(SubprocessOptions{.argv = agent("c10d", endpoint, "2:3", wait_for_three)});
  // The third starts once the first round (2 nodes, after the last call) runs on both.
  std::string all_out, all_err;
  for (auto& a : agents) {
    ASSERT_TRUE(read_until(a.stdout_fd(), "W=2", 20s, all_out)) << all_out;
  }
  agents.emplace_back(SubprocessOptions{.argv = agent("c10d", endpoint, "2:3", wait_for_three)});
  const auto outcomes = collect_agents(agents, 40s);
  for (const auto& o : outcomes) {
    all_out += o.out;
    all_err += o.err;
  }
  for (const auto& o : outcomes) {
    ASSERT_FALSE(o.timed_out) << all_err;
    EXPECT_EQ(o.status.exit_code, 0) << all_err;
  }
  EXPECT_TRUE(contains(all_out, "W=2")) << all_out;
  EXPECT_TRUE(contains(all_out, "R=2 W=3")) << all_out;
  EXPECT_TRUE(contains(all_err, "Membership changed (another node ended the round)")) << all_err;
  EXPECT_TRUE(contains(all_err, "group_world_size=3")) << all_err;
}

TEST(ElasticAgent, AnAgentStoppedBySigtermLeavesAndTheOthersGoOnWithoutIt) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  // Ranks finish once they are in a round of two nodes.
  const std::vector<std::string> until_two = {
      "/bin/sh", "-c", R"(echo "W=$WORLD_SIZE"; [ "$WORLD_SIZE" = 2 ] || exec sleep 30)"};
  std::vector<Subprocess> agents;
  for (int i = 0; i < 3; ++i) {
    agents.emplace_back(SubprocessOptions{.argv = agent("c10d", endpoint, "2:3", until_two)});
    if (i > 0) continue;
    // The first serves the store (the c10d backend needs it to stay); the one stopped is not it.
    std::string first;
    ASSERT_TRUE(read_until(agents[0].stderr_fd(), "Serving the rendezvous store", 20s, first))
        << first;
  }
  // All three form a round of 3 (max_nodes closes it at once); wait for it, then stop one.
  std::string seen;
  ASSERT_TRUE(read_until(agents[2].stdout_fd(), "W=3", 20s, seen)) << seen;
  agents[2].send_signal(SIGTERM);
  auto stopped = mptest::collect(agents[2], 20s);
  EXPECT_EQ(stopped.status.exit_code, 128 + SIGTERM) << stopped.err;
  EXPECT_TRUE(contains(stopped.err, "left run 'agent-test'")) << stopped.err;
  const auto outcomes = mptest::collect_all({&agents[0], &agents[1]}, 30s);
  std::string rest;
  for (const auto& o : outcomes) rest += o.out + o.err;
  for (const auto& o : outcomes) {
    ASSERT_FALSE(o.timed_out) << rest;
    EXPECT_EQ(o.status.exit_code, 0) << rest;
  }
  EXPECT_TRUE(contains(rest, "W=2")) << rest;
  EXPECT_TRUE(contains(rest, "Membership changed")) << rest;
}

TEST(ElasticAgent, AnAgentWhoseRanksFinishedDoesNotWaitForANodeThatDied) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  // The first agent's rank (FINISH=1) is done at once; the second's trains on.
  const std::vector<std::string> train = {"/bin/sh", "-c",
                                          R"(echo "R=$RANK."; [ "$FINISH" = 1 ] || exec sleep 60)"};
  std::vector<Subprocess> agents;
  agents.emplace_back(
      SubprocessOptions{.argv = agent("c10d", endpoint, "2", train), .env = {{"FINISH", "1"}}});
  std::string first;
  ASSERT_TRUE(read_until(agents[0].stderr_fd(), "Serving the rendezvous store", 20s, first))
      << first;
  agents.emplace_back(SubprocessOptions{.argv = agent("c10d", endpoint, "2", train)});
  std::string seen;
  // Until the whole number is read ("R=1."), which says whose rank to kill with the agent.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!contains(seen, "R=0.") && !contains(seen, "R=1.") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    seen += pending_output(agents[1].stdout_fd());
  }
  ASSERT_TRUE(contains(seen, "R=0.") || contains(seen, "R=1.")) << seen;
  ASSERT_TRUE(read_until(agents[0].stderr_fd(), "exited successfully", 20s, first)) << first;
  // The second node dies with its rank (a host lost) while the first waits at the exit barrier.
  const int rank = contains(seen, "R=0.") ? 0 : 1;
  const int rank_pid = mptest::find_rank("agent-test", rank);
  agents[1].send_signal(SIGKILL);
  if (rank_pid > 0) kill(rank_pid, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  auto o = mptest::collect(agents[0], 30s);
  const auto took = std::chrono::steady_clock::now() - killed;
  ASSERT_FALSE(o.timed_out) << first << o.err;
  EXPECT_EQ(o.status.exit_code, 0) << first << o.err;
  EXPECT_LT(took, 15s);  // dead after 0.9 s (kFastConf); the default barrier waits 300 s
  EXPECT_TRUE(contains(o.err, "stopped sending heartbeats before finishing")) << o.err;
}

TEST(ElasticAgent, ShortEtcdOutageLeavesTheRanksRunning) {
  if (access(kEtcd, X_OK) != 0)
    TY_MISSING_PREREQUISITE(kEtcd << " is missing; run scripts/setup.sh");
  EtcdServer etcd;
  const std::vector<std::string> train = {
      "/bin/sh", "-c",
      R"(echo "start R=$RANK I=$TRAINYARD_JOB_INSTANCE"; sleep 8; echo "end R=$RANK")"};
  // Heartbeats every 2 s (dead after 6 s): what this test asserts (no one taken for dead after
  // the outage) must not hinge on a fraction of a second on a loaded machine.
  const std::string conf =
      "last_call_timeout=0.5,keep_alive_interval=2,join_timeout=30,backend_timeout=20";
  std::vector<Subprocess> agents;
  for (int i = 0; i < 2; ++i) {
    agents.emplace_back(SubprocessOptions{
        .argv = agent("etcd", etcd.endpoint(), "2", train, {"--max-restarts", "1"}, conf)});
  }
  std::string seen;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!contains(seen, "start R=") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
    seen += pending_output(agents[0].stdout_fd());
  }
  ASSERT_TRUE(contains(seen, "start R=")) << seen;
  etcd.stop();
  std::this_thread::sleep_for(4s);
  etcd.start();
  // Both are collected before anything is asserted: when one hangs, the other's log says why.
  const auto outcomes = collect_agents(agents, 40s);
  std::string all = seen;
  for (const auto& o : outcomes) all += o.out + o.err;
  for (const auto& o : outcomes) {
    ASSERT_FALSE(o.timed_out) << all;
    EXPECT_EQ(o.status.exit_code, 0) << all;
  }
  EXPECT_TRUE(contains(all, "has been unreachable for")) << all;
  EXPECT_TRUE(contains(all, "answers again after")) << all;
  EXPECT_FALSE(contains(all, "restart_count=1")) << all;
  EXPECT_FALSE(contains(all, "Membership changed")) << all;
  EXPECT_TRUE(contains(all, "end R=0") && contains(all, "end R=1")) << all;
}

TEST(ElasticAgent, EtcdGoneLongerThanBackendTimeoutEndsTheRoundStatingTheTime) {
  if (access(kEtcd, X_OK) != 0)
    TY_MISSING_PREREQUISITE(kEtcd << " is missing; run scripts/setup.sh");
  EtcdServer etcd;
  const std::vector<std::string> train = {"/bin/sh", "-c", "echo started; exec sleep 60"};
  Subprocess a(SubprocessOptions{.argv = agent("etcd", etcd.endpoint(), "1", train, {},
                                               std::string(kFastConf) + ",backend_timeout=2")});
  std::string seen;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!contains(seen, "started") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
    seen += pending_output(a.stdout_fd());
  }
  ASSERT_TRUE(contains(seen, "started")) << seen;
  etcd.stop();
  const auto stopped = std::chrono::steady_clock::now();
  auto o = mptest::collect(a, 30s);
  const auto took = std::chrono::steady_clock::now() - stopped;
  ASSERT_FALSE(o.timed_out) << o.err;
  EXPECT_NE(o.status.exit_code, 0) << o.err;
  EXPECT_GT(took, 1.5s);
  EXPECT_LT(took, 20s);
  EXPECT_TRUE(contains(o.err, "has been unreachable for 2.")) << o.err;
  EXPECT_TRUE(contains(o.err, "backend_timeout is 2 s")) << o.err;
}

TEST(ElasticAgent, TheSameRunIdRunsTwiceInARowOverEtcd) {
  if (access(kEtcd, X_OK) != 0)
    TY_MISSING_PREREQUISITE(kEtcd << " is missing; run scripts/setup.sh");
  EtcdServer etcd;
  const std::vector<std::string> print = {
      "/bin/sh", "-c",
      R"(echo "R=$RANK W=$WORLD_SIZE G=$GROUP_RANK/$GROUP_WORLD_SIZE I=$TRAINYARD_JOB_INSTANCE")"};
  for (int run = 0; run < 2; ++run) {
    auto out = run_agents(
        {agent("etcd", etcd.endpoint(), "2", print), agent("etcd", etcd.endpoint(), "2", print)});
    expect_two_distinct_ranks(out);
    EXPECT_FALSE(contains(out[0].out, "I= ") || contains(out[0].out + "\n", "I=\n")) << out[0].out;
  }
}

}  // namespace
}  // namespace trainyard::elastic
