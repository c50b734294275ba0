// The launcher's hang watchdog (Note [Hang watchdog]) and the failure summary's root cause: a
// rank that beats and then stops is named, stopped and restarted; a rank that never beats is left
// alone; a rank that leaves early with status 0 is blamed for the failure that follows
// (Note [Early exit]); the summary ends with the root cause's own last lines. Ranks are the
// heartbeat_helper program and shell scripts.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "../text.h"
#include "launch_capture.h"
#include "multiproc_util.h"
#include "trainyard/elastic/launcher.h"
#include "trainyard/elastic/subprocess.h"

#ifndef TRAINYARD_HEARTBEAT_HELPER
#error "TRAINYARD_HEARTBEAT_HELPER must name the heartbeat_helper binary (a compile definition)"
#endif

namespace trainyard::elastic {
namespace {

using namespace std::chrono_literals;

constexpr const char* kHelper = TRAINYARD_HEARTBEAT_HELPER;
using mptest::kCli;

using trainyard::test::contains;

std::vector<std::string> helper(std::vector<std::string> scripts) {
  scripts.insert(scripts.begin(), kHelper);
  return scripts;
}

TEST(LauncherWatchdog, HungRankIsNamedStoppedAndTheRootCause) {
  auto c = launch_captured(
      LaunchOptions{.command = helper({"beat=-1", "beat=300;err=rank 1 about to hang;stop"}),
                    .nproc_per_node = 2,
                    // Long: the stop must not wait it out (SIGCONT after SIGTERM).
                    .term_timeout = 20s,
                    .hang_timeout = 1s});
  // 0.3 s of beats, 1 s of silence, one poll; generous for a loaded machine.
  EXPECT_LT(c.elapsed, 6s) << c.err;
  EXPECT_GE(c.elapsed, 1200ms) << c.err;
  EXPECT_FALSE(c.result.succeeded);
  ASSERT_EQ(c.result.first_failure, 1) << c.err;
  EXPECT_EQ(c.result.early_exit, -1);
  const RankExit& hung = c.result.exits[1];
  EXPECT_GE(hung.hang_silence, 1s);
  EXPECT_EQ(hung.signal, SIGTERM);
  EXPECT_FALSE(mptest::process_alive(hung.pid));
  EXPECT_EQ(c.result.exits[0].hang_silence, 0ms) << "the beating rank is not hung";
  EXPECT_TRUE(std::regex_search(
      c.err, std::regex("Rank 1 \\(local rank 1, pid " + std::to_string(hung.pid) +
                        "\\) made no progress for \\d+\\.\\d s \\(last heartbeat at [^;]+; hang "
                        "timeout 1\\.0 s\\); stopping the worker group")))
      << c.err;
  const auto root_at = c.err.find("Root Cause (first observed failure):\n");
  ASSERT_NE(root_at, std::string::npos) << c.err;
  const std::string root = c.err.substr(root_at);
  EXPECT_TRUE(contains(root, "  rank      : 1 (local_rank: 1)\n")) << root;
  EXPECT_TRUE(
      std::regex_search(root, std::regex("  traceback : hung: no progress for \\d+\\.\\d s; "
                                         "stopped by the launcher \\(Signal 15")))
      << root;
  EXPECT_TRUE(contains(root, "Last lines of rank 1 (local rank 1, pid " + std::to_string(hung.pid) +
                                 "):\n[rank1]: rank 1 about to hang\n"))
      << root;
}

TEST(LauncherWatchdog, RankThatNeverBeatsIsNotWatched) {
  auto c = launch_captured(LaunchOptions{.command = helper({"sleep=1500"}), .hang_timeout = 300ms});
  EXPECT_TRUE(c.result.succeeded) << c.err;
  EXPECT_FALSE(contains(c.err, "made no progress")) << c.err;
}

TEST(LauncherWatchdog, ZeroTurnsTheWatchdogOff) {
  auto c = launch_captured(
      LaunchOptions{.command = helper({"beat=100;sleep=1200"}), .hang_timeout = 0ms});
  EXPECT_TRUE(c.result.succeeded) << c.err;
}

TEST(LauncherWatchdog, CliRestartsTheGroupAfterAHang) {
  // Rank 1 hangs in the first round only (scripts: round 0 ranks 0, 1; round 1 ranks 0, 1).
  auto r = mptest::run_program(
      {kCli, "run", "--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "1", "--",
       kHelper, "beat=-1", "beat=200;stop", "beat=300", "beat=300"},
      {}, 30s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.status.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "Rank 1 (local rank 1, pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "made no progress for ")) << r.err;
  EXPECT_TRUE(contains(r.err, "[default] Worker group FAILED. 1/1 attempts left")) << r.err;
  EXPECT_TRUE(contains(r.err, "restart_count=1")) << r.err;
  EXPECT_LT(r.elapsed, 15s) << r.err;
}

TEST(LauncherWatchdog, CliRejectsABadHangTimeout) {
  auto r = mptest::run_program({kCli, "run", "--hang-timeout", "-1", "--", "/bin/true"});
  EXPECT_NE(r.status.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "must be a number of seconds in [0, 1000000], got '-1'")) << r.err;
}

TEST(LauncherSummary, EarlyExitWithStatusZeroIsTheRootCause) {
  auto c = launch_captured(LaunchOptions{
      .command = {"/bin/sh", "-c",
                  R"(if [ "$RANK" = 1 ]; then echo "leaving after epoch 0" >&2; exit 0; fi;
                     sleep 0.5; echo "Connection closed by peer" >&2; exit 1)"},
      .nproc_per_node = 3});
  EXPECT_FALSE(c.result.succeeded);
  EXPECT_EQ(c.result.exit_code(), 1);
  ASSERT_EQ(c.result.early_exit, 1) << c.err;
  ASSERT_GE(c.result.first_failure, 0);
  EXPECT_NE(c.result.first_failure, 1);
  const int failed = c.result.exits[c.result.first_failure].rank;
  const int early_pid = c.result.exits[1].pid;
  EXPECT_TRUE(contains(c.err, "Rank 1 (pid " + std::to_string(early_pid) +
                                  ") had exited early with status 0 while the others were still "
                                  "running; rank " +
                                  std::to_string(failed) + "'s failure followed from it."))
      << c.err;
  EXPECT_FALSE(contains(c.err, "<NO_OTHER_FAILURES>")) << c.err;
  const auto root_at = c.err.find("Root Cause (first observed failure):\n");
  ASSERT_NE(root_at, std::string::npos) << c.err;
  const std::string root = c.err.substr(root_at);
  EXPECT_TRUE(contains(root, "  rank      : 1 (local_rank: 1)\n")) << root;
  EXPECT_TRUE(contains(root, "  exitcode  : 0 (pid: " + std::to_string(early_pid) + ")\n")) << root;
  EXPECT_TRUE(std::regex_search(
      root,
      std::regex("  traceback : exited early with status 0 while the others were still "
                 "running; rank " +
                 std::to_string(failed) + "'s failure \\d+\\.\\d s later followed from it\n")))
      << root;
  // The summary ends with the early rank's last lines, after the failed rank's.
  EXPECT_TRUE(
      std::regex_search(root, std::regex("\\[rank\\d\\]: Connection closed by peer\n"
                                         "Last lines of rank 1 \\(local rank 1, pid \\d+\\):\n"
                                         "\\[rank1\\]: leaving after epoch 0\n=+\n$")))
      << root;
}

TEST(LauncherSummary, RanksFinishingAtDifferentTimesAreNotAFailure) {
  auto c = launch_captured(
      LaunchOptions{.command = {"/bin/sh", "-c", R"([ "$RANK" = 0 ] || sleep 0.3; exit 0)"},
                    .nproc_per_node = 2});
  EXPECT_TRUE(c.result.succeeded) << c.err;
  EXPECT_EQ(c.result.early_exit, -1);
  EXPECT_FALSE(contains(c.err, "exited early")) << c.err;
}

TEST(LauncherSummary, EndsWithTheRootCausesLastErrorLines) {
  auto c = launch_captured(LaunchOptions{.command = {"/bin/sh", "-c",
                                                     R"(if [ "$RANK" = 1 ]; then
                       i=0; while [ $i -lt 15 ]; do echo "noise $i" >&2; i=$((i+1)); done
                       echo "stdout is not the place" 
                       echo "Cannot create the directory '/results/run': Permission denied. HINT: check --storage." >&2
                       exit 3
                     fi; exec sleep 30)"},
                                         .nproc_per_node = 2,
                                         .term_timeout = 5s});
  ASSERT_EQ(c.result.first_failure, 1) << c.err;
  const RankExit& root = c.result.exits[1];
  ASSERT_EQ(root.last_lines.size(), RankExit::kLastLines);
  EXPECT_EQ(root.last_lines.front(), "noise 6");
  std::string expected =
      "Last lines of rank 1 (local rank 1, pid " + std::to_string(root.pid) + "):\n";
  for (int i = 6; i < 15; ++i) expected += "[rank1]: noise " + std::to_string(i) + "\n";
  expected +=
      "[rank1]: Cannot create the directory '/results/run': Permission denied. HINT: check "
      "--storage.\n" +
      std::string(60, '=') + "\n";
  ASSERT_GE(c.err.size(), expected.size());
  EXPECT_EQ(c.err.substr(c.err.size() - expected.size()), expected) << c.err;
  EXPECT_TRUE(contains(c.err, "traceback : To enable traceback see: ")) << "torchrun's shape";
}

}  // namespace
}  // namespace trainyard::elastic
