// elastic::Agent, the launcher as an object: start/stop/wait from other threads, several agents in
// one process at once, the event stream and the output sink. Ranks are real processes (/bin/sh);
// this binary links trainyard_core alone, as the cluster worker does.
#include "trainyard/elastic/agent.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../text.h"
#include "multiproc_util.h"
#include "trainyard/error.h"

namespace trainyard::elastic {
namespace {

using namespace std::chrono_literals;

using trainyard::test::contains;

// What one agent reported, copied out of its callbacks (which run on the agent's thread).
class Recorder {
 public:
  struct Line {
    int rank;
    int local_rank;
    int restart_count;
    OutputStream stream;
    std::string text;
  };

  // Options with this recorder's callbacks and no forwarding to this process's stdout/stderr.
  LaunchOptions attach(LaunchOptions o) {
    o.forward_output = false;
    o.on_event = [this](const AgentEvent& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      events_.push_back(e);
      changed_.notify_all();
    };
    o.on_output = [this](const OutputLine& l) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back({l.rank, l.local_rank, l.restart_count, l.stream, std::string(l.text)});
    };
    return o;
  }

  // Waits at most timeout for an event of this kind; returns a copy of the first one.
  std::optional<AgentEvent> wait_for(AgentEventKind kind, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock(mutex_);
    std::optional<AgentEvent> found;
    changed_.wait_for(lock, timeout, [&] {
      for (const auto& e : events_) {
        if (e.kind == kind) {
          found = e;
          return true;
        }
      }
      return false;
    });
    return found;
  }

  // Waits at most timeout for at least n lines.
  bool wait_for_lines(std::size_t n, std::chrono::milliseconds timeout = 10s) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (lines().size() < n) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(10ms);
    }
    return true;
  }

  std::vector<AgentEvent> events() {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_;
  }
  std::vector<Line> lines() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }
  std::vector<std::string> kinds() {
    std::vector<std::string> out;
    for (const auto& e : events()) out.emplace_back(to_string(e.kind));
    return out;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<AgentEvent> events_;
  std::vector<Line> lines_;
};

TEST(Agent, StopFromAnotherThreadStopsTheRanksAndReportsTheSignal) {
  Recorder rec;
  Agent agent(
      rec.attach({.command = {"/bin/sh", "-c", "echo up; exec sleep 30"}, .nproc_per_node = 2}));
  EXPECT_FALSE(agent.running());
  testing::internal::CaptureStdout();
  agent.start();
  EXPECT_TRUE(agent.running());
  const auto started = rec.wait_for(AgentEventKind::kRanksStarted);
  ASSERT_TRUE(started.has_value());
  ASSERT_EQ(started->pids.size(), 2u);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread([&agent] { agent.stop(SIGINT); }).join();
  const LaunchResult r = agent.wait();
  const auto took = std::chrono::steady_clock::now() - t0;
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_FALSE(agent.running());
  EXPECT_LT(took, 8s) << "stop() must end ranks that would sleep 30 s";
  EXPECT_FALSE(r.succeeded);
  EXPECT_EQ(r.received_signal, SIGINT);
  EXPECT_EQ(r.exit_code(), 128 + SIGINT);
  ASSERT_EQ(r.exits.size(), 2u);
  for (const RankExit& e : r.exits) {
    EXPECT_EQ(e.signal, SIGTERM) << "rank " << e.rank;
    EXPECT_TRUE(e.stopped_by_launcher);
    EXPECT_FALSE(mptest::process_alive(e.pid)) << "rank " << e.rank << " was not reaped";
  }
  EXPECT_EQ(r.exits[0].pid, started->pids[0]);
  EXPECT_TRUE(contains(r.summary, "Signal 2 (SIGINT) received by the launcher")) << r.summary;
  EXPECT_EQ(out, "") << "forward_output = false writes nothing to stdout";
  const auto finished = rec.wait_for(AgentEventKind::kFinished, 0ms);
  ASSERT_TRUE(finished.has_value());
  EXPECT_EQ(finished->result.received_signal, SIGINT);
  EXPECT_EQ(rec.kinds().back(), "finished");
  // wait() again: the same result.
  EXPECT_EQ(agent.wait().received_signal, SIGINT);
}

TEST(Agent, SecondStopKillsRanksThatIgnoreSigterm) {
  Recorder rec;
  Agent agent(
      rec.attach({.command = {"/bin/sh", "-c", "trap '' TERM; sleep 30"}, .term_timeout = 20s}));
  agent.start();
  ASSERT_TRUE(rec.wait_for(AgentEventKind::kRanksStarted).has_value());
  std::this_thread::sleep_for(200ms);  // the trap is set
  const auto t0 = std::chrono::steady_clock::now();
  agent.stop();
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(agent.running()) << "the rank ignores SIGTERM; term_timeout is 20 s";
  agent.stop();
  const LaunchResult r = agent.wait();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 8s);
  ASSERT_EQ(r.exits.size(), 1u);
  EXPECT_EQ(r.exits[0].signal, SIGKILL);
  EXPECT_EQ(r.received_signal, SIGTERM);
}

TEST(Agent, TwoAgentsRunAtOnceAndStoppingOneLeavesTheOther) {
  Recorder slow_rec, quick_rec;
  Agent slow(slow_rec.attach(
      {.command = {"/bin/sh", "-c", "echo slow-$RANK; exec sleep 30"}, .nproc_per_node = 2}));
  // Finishes on its own once a file appears, so that both surely run at once.
  mptest::TempDir dir;
  const std::string go = (dir.path() / "go").string();
  Agent quick(quick_rec.attach(
      {.command =
           {"/bin/sh", "-c",
            "echo quick-$RANK; while [ ! -e \"$GO\" ]; do sleep 0.05; done; echo done-$RANK"},
       .nproc_per_node = 2,
       .extra_env = {{"GO", go}}}));
  slow.start();
  quick.start();
  ASSERT_TRUE(slow_rec.wait_for(AgentEventKind::kRanksStarted).has_value());
  ASSERT_TRUE(quick_rec.wait_for(AgentEventKind::kRanksStarted).has_value());
  // Both print before either goes on: both agents' ranks run at once.
  ASSERT_TRUE(slow_rec.wait_for_lines(2));
  ASSERT_TRUE(quick_rec.wait_for_lines(2));
  EXPECT_TRUE(slow.running());
  EXPECT_TRUE(quick.running());

  slow.stop();
  const LaunchResult stopped = slow.wait();
  EXPECT_EQ(stopped.received_signal, SIGTERM);
  EXPECT_TRUE(quick.running()) << "stopping one agent must not touch the other";
  { std::ofstream(go) << "go"; }
  const LaunchResult done = quick.wait();
  EXPECT_TRUE(done.succeeded) << done.summary;
  EXPECT_EQ(done.received_signal, 0);

  // Each agent saw its own ranks' lines only.
  std::multiset<std::string> slow_lines, quick_lines;
  for (const auto& l : slow_rec.lines()) slow_lines.insert(l.text);
  for (const auto& l : quick_rec.lines()) quick_lines.insert(l.text);
  EXPECT_EQ(slow_lines, (std::multiset<std::string>{"slow-0", "slow-1"}));
  EXPECT_EQ(quick_lines, (std::multiset<std::string>{"quick-0", "quick-1", "done-0", "done-1"}));
}

TEST(Agent, OnOutputSeesEveryLineWithItsRankAndStream) {
  Recorder rec;
  const std::string script =
      "i=0; while [ $i -lt 40 ]; do echo \"out $RANK $i\"; i=$((i+1)); done; "
      "echo \"err $RANK\" >&2; printf 'cr %s\\r' $RANK; printf 'tail %s' $RANK";
  Agent agent(rec.attach({.command = {"/bin/sh", "-c", script}, .nproc_per_node = 3}));
  testing::internal::CaptureStdout();
  agent.start();
  const LaunchResult r = agent.wait();
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  ASSERT_TRUE(r.succeeded) << r.summary;
  EXPECT_EQ(r.summary, "");

  std::map<int, std::vector<std::string>> out, err;
  for (const auto& l : rec.lines()) {
    EXPECT_EQ(l.local_rank, l.rank) << "one node: local rank = rank";
    EXPECT_EQ(l.restart_count, 0);
    (l.stream == OutputStream::kStdout ? out : err)[l.rank].push_back(l.text);
  }
  ASSERT_EQ(out.size(), 3u);
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    std::vector<std::string> expected;
    for (int i = 0; i < 40; ++i)
      expected.push_back("out " + std::to_string(rank) + " " + std::to_string(i));
    // A line ended by '\r' alone, then a last line without an ending (at the rank's exit).
    expected.push_back("cr " + std::to_string(rank));
    expected.push_back("tail " + std::to_string(rank));
    EXPECT_EQ(out[rank], expected);
    EXPECT_EQ(err[rank], std::vector<std::string>{"err " + std::to_string(rank)});
  }
}

TEST(Agent, EventsOfAFailingRankAndTheRestart) {
  Recorder rec;
  // Round 0: rank 1 fails with 3 and rank 0 is stopped; round 1: both succeed.
  const std::string script =
      R"(if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then [ "$RANK" = 1 ] && exit 3; exec sleep 30; fi; exit 0)";
  Agent agent(rec.attach({.command = {"/bin/sh", "-c", script},
                          .nproc_per_node = 2,
                          .max_restarts = 1,
                          .restart_backoff = 10ms}));
  agent.start();
  const LaunchResult r = agent.wait();
  ASSERT_TRUE(r.succeeded) << r.summary;
  EXPECT_EQ(r.restart_count, 1);

  const auto events = rec.events();
  const std::vector<std::string> expected_kinds = {
      "round_started", "ranks_started", "rank_exited", "rank_exited", "restarting",
      "round_started", "ranks_started", "rank_exited", "rank_exited", "finished"};
  ASSERT_EQ(rec.kinds(), expected_kinds);
  EXPECT_EQ(events[0].restart_count, 0);
  EXPECT_EQ(events[0].world_size, 2);
  EXPECT_EQ(events[0].local_world_size, 2);
  EXPECT_EQ(events[0].group_rank, 0);
  EXPECT_EQ(events[0].group_world_size, 1);
  EXPECT_EQ(events[0].rank_offset, 0);
  EXPECT_EQ(events[0].master_addr, "127.0.0.1");
  EXPECT_NE(events[0].master_port, 0);
  ASSERT_EQ(events[1].pids.size(), 2u);
  // The failure first, then the rank stopped because of it.
  EXPECT_EQ(events[2].rank_exit.rank, 1);
  EXPECT_EQ(events[2].rank_exit.exit_code, 3);
  EXPECT_EQ(events[2].rank_exit.pid, events[1].pids[1]);
  EXPECT_EQ(events[3].rank_exit.rank, 0);
  EXPECT_EQ(events[3].rank_exit.signal, SIGTERM);
  EXPECT_TRUE(events[3].rank_exit.stopped_by_launcher);
  const AgentEvent& restarting = events[4];
  EXPECT_EQ(restarting.restart_count, 1);
  EXPECT_TRUE(restarting.counted);
  EXPECT_EQ(restarting.backoff, 10ms);
  EXPECT_EQ(restarting.reason, "rank 1 (local rank 1) failed with exit code 3");
  EXPECT_EQ(events[5].restart_count, 1);
  EXPECT_NE(events[6].pids, events[1].pids);
  for (int i : {7, 8}) {
    EXPECT_EQ(events[i].restart_count, 1);
    EXPECT_FALSE(events[i].rank_exit.failed());
  }
  EXPECT_TRUE(events[9].result.succeeded);
  EXPECT_EQ(events[9].restart_count, 1);
  EXPECT_EQ(events[9].error, "");
  for (std::size_t i = 1; i < events.size(); ++i) EXPECT_LE(events[i - 1].time, events[i].time);
}

TEST(Agent, StopBeforeStartStartsNoRanks) {
  Recorder rec;
  Agent agent(rec.attach({.command = {"/bin/sh", "-c", "exec sleep 30"}}));
  agent.stop(SIGHUP);
  agent.start();
  const LaunchResult r = agent.wait();
  EXPECT_EQ(r.received_signal, SIGHUP);
  EXPECT_TRUE(r.exits.empty());
  EXPECT_EQ(rec.kinds(), std::vector<std::string>{"finished"});
}

TEST(Agent, AProgramThatCannotStartIsRethrownByWaitAndReportedAsFinished) {
  Recorder rec;
  Agent agent(rec.attach({.command = {"ty-no-such-program"}, .nproc_per_node = 2}));
  EXPECT_THROW(agent.wait(), Error) << "wait() before start()";
  agent.start();
  EXPECT_THROW(agent.start(), Error) << "an Agent runs once";
  try {
    agent.wait();
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "Could not start 'ty-no-such-program'")) << e.what();
  }
  const auto finished = rec.wait_for(AgentEventKind::kFinished, 0ms);
  ASSERT_TRUE(finished.has_value());
  EXPECT_TRUE(contains(finished->error, "Could not start")) << finished->error;
  EXPECT_THROW(agent.wait(), Error) << "wait() again rethrows again";
}

TEST(Agent, BadOptionsAreRejectedByTheConstructor) {
  try {
    Agent agent(LaunchOptions{.command = {"/bin/true"}, .nproc_per_node = 0});
    FAIL() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), "LaunchOptions.nproc_per_node must be between 1 and"))
        << e.what();
  }
}

TEST(Agent, DestructorStopsAndReapsARunningAgent) {
  Recorder rec;
  std::vector<int> pids;
  const auto t0 = std::chrono::steady_clock::now();
  {
    Agent agent(rec.attach({.command = {"/bin/sh", "-c", "exec sleep 30"}, .nproc_per_node = 2}));
    agent.start();
    const auto started = rec.wait_for(AgentEventKind::kRanksStarted);
    ASSERT_TRUE(started.has_value());
    pids = started->pids;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 8s);
  for (int pid : pids) EXPECT_FALSE(mptest::process_alive(pid)) << pid;
  const auto finished = rec.wait_for(AgentEventKind::kFinished, 0ms);
  ASSERT_TRUE(finished.has_value());
  EXPECT_EQ(finished->result.received_signal, SIGTERM);
}

}  // namespace
}  // namespace trainyard::elastic
