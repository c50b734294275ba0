// No silent hangs, through the real CLI: the recipe's --collective-timeout reaches config.json; a
// rank whose MASTER_ADDR drops packets fails within the join timeout naming the address; a recipe
// rank stopped with SIGSTOP is named by the agent's hang watchdog, and the group restarts and
// resumes from its checkpoint. See Note [Hang watchdog] in src/elastic/rank_monitor.cpp.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../multiproc/multiproc_util.h"
#include "../text.h"

namespace {
using trainyard::mptest::collect;
using trainyard::mptest::read_file;
using trainyard::mptest::run_program;
using trainyard::mptest::TempDir;
using namespace std::chrono_literals;

using trainyard::test::contains;

TEST(Watchdog, CollectiveTimeoutFlagReachesConfigJson) {
  TempDir dir;
  auto r = run_program({TRAINYARD_CLI_PATH, "train", "fashion-mnist", "--workers", "1", "--epochs",
                        "1", "--limit", "256", "--collective-timeout", "42.5", "--storage",
                        dir.str(), "--name", "timeout", "--no-progress"},
                       {}, 110s);
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_TRUE(r.status.success()) << r.err;
  const auto config = nlohmann::json::parse(read_file(dir.path() / "timeout" / "config.json"));
  EXPECT_EQ(config.at("collective_timeout_s").get<double>(), 42.5) << config.dump();
}

// A namespace whose route to 198.18.0.0/15 (reserved for benchmarking) is a veth pair with both
// ends inside it; 198.18.0.2 has a static neighbour entry but no host behind it, so packets sent
// there vanish, as to a host behind a firewall that drops them.
class DroppingNamespace {
 public:
  DroppingNamespace() : name_("tywd" + std::to_string(getpid() % 100000)) {
    ok_ = ip({"netns", "add", name_}) && ip({"-n", name_, "link", "set", "lo", "up"}) &&
          ip({"-n", name_, "link", "add", "drop0", "type", "veth", "peer", "name", "drop1"}) &&
          ip({"-n", name_, "addr", "add", "198.18.0.1/15", "dev", "drop0"}) &&
          ip({"-n", name_, "link", "set", "drop0", "up"}) &&
          ip({"-n", name_, "link", "set", "drop1", "up"}) &&
          ip({"-n", name_, "neigh", "add", "198.18.0.2", "lladdr", "02:00:c6:12:00:02", "dev",
              "drop0", "nud", "permanent"});
  }
  ~DroppingNamespace() { ip({"netns", "del", name_}); }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::vector<std::string> in(std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"ip", "netns", "exec", name_});
    return argv;
  }

 private:
  bool ip(std::vector<std::string> args) {
    args.insert(args.begin(), "ip");
    auto r = run_program(args, {}, 10s);
    if (!r.status.success() && error_.empty()) error_ = r.err;
    return r.status.success();
  }
  std::string name_;
  std::string error_;
  bool ok_ = false;
};

TEST(Watchdog, UnreachableMasterFailsWithinTheJoinTimeoutNamingTheAddress) {
  DroppingNamespace ns;
  if (!ns.ok()) {
    TY_MISSING_PREREQUISITE(
        "cannot set up a network namespace (needs root, CAP_SYS_ADMIN and veth): " << ns.error());
  }
  TempDir dir;
  // Rank 1 of 2, as a static multi-node launch would start it; rank 0 is never started.
  auto r = run_program(ns.in({TRAINYARD_CLI_PATH, "train", "fashion-mnist", "--epochs", "1",
                              "--limit", "256", "--storage", dir.str(), "--no-progress"}),
                       {{"RANK", "1"},
                        {"WORLD_SIZE", "2"},
                        {"LOCAL_RANK", "0"},
                        {"LOCAL_WORLD_SIZE", "1"},
                        {"MASTER_ADDR", "198.18.0.2"},
                        {"MASTER_PORT", "29511"},
                        {"TRAINYARD_JOIN_TIMEOUT", "3"}},
                       60s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_FALSE(r.status.success());
  EXPECT_LT(r.elapsed, 20s) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "Cannot reach the rendezvous store at 198.18.0.2:29511 "
                       "(MASTER_ADDR:MASTER_PORT) from rank 1/2 within 3."))
      << r.err;
  EXPECT_TRUE(contains(r.err, "packets dropped?")) << r.err;
  EXPECT_TRUE(contains(r.err, "HINT: ")) << r.err;
  EXPECT_FALSE(contains(r.err, "?UNKNOWN?")) << r.err;
}

TEST(Watchdog, StoppedRecipeRankIsNamedAndTheGroupResumesFromItsCheckpoint) {
  TempDir dir;
  trainyard::elastic::Subprocess job(
      trainyard::elastic::SubprocessOptions{.argv = {TRAINYARD_CLI_PATH,
                                                     "run",
                                                     "--nproc-per-node",
                                                     "2",
                                                     "--max-restarts",
                                                     "1",
                                                     "--hang-timeout",
                                                     "5",
                                                     "--rdzv-id",
                                                     "hung",
                                                     "--",
                                                     TRAINYARD_CLI_PATH,
                                                     "train",
                                                     "fashion-mnist",
                                                     "--epochs",
                                                     "1",
                                                     "--limit",
                                                     "4096",
                                                     "--seed",
                                                     "3",
                                                     "--storage",
                                                     dir.str(),
                                                     "--name",
                                                     "hung",
                                                     "--checkpoint-every",
                                                     "2",
                                                     "--no-progress"}});
  // 4096 images / 2 ranks / 128 = 16 steps; the first checkpoint is at step 2, which leaves 14
  // steps in which to stop rank 1.
  ASSERT_TRUE(trainyard::mptest::wait_for_files(
      {dir.path() / "hung" / "checkpoint_000000" / "MANIFEST.json"}, 90s));
  const int victim = trainyard::mptest::find_rank("hung", 1);
  ASSERT_GT(victim, 0) << "rank 1 of the run is not running";
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  auto r = collect(job, 150s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_TRUE(r.status.success()) << r.out << r.err;
  EXPECT_TRUE(contains(
      r.err, "Rank 1 (local rank 1, pid " + std::to_string(victim) + ") made no progress for "))
      << r.err;
  EXPECT_TRUE(contains(r.err, "Worker group FAILED. 1/1 attempts left")) << r.err;
  EXPECT_TRUE(contains(r.out, "Resuming from checkpoint_")) << r.out;
  EXPECT_FALSE(trainyard::mptest::process_alive(victim));
  const auto result = nlohmann::json::parse(read_file(dir.path() / "hung" / "result.json"));
  EXPECT_EQ(result["restart_count"].get<int>(), 1);
  EXPECT_EQ(result["global_step"].get<int>(), 16);
}

}  // namespace
