// The ranks of one round on this node (internal to the launcher): starting one with the torchrun
// environment (start_rank) and watching them all until each has exited (monitor_ranks: output,
// reaping, the hang watchdog, stopping on the first failure or a stop request).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "elastic/launch_summary.h"
#include "elastic/line_forwarder.h"
#include "elastic/stop_channel.h"
#include "trainyard/elastic/launcher.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/heartbeat.h"

namespace trainyard::elastic {

struct Rank {
  int rank = 0;
  int local_rank = 0;
  Subprocess process;
  LineForwarder out;
  LineForwarder err;
  std::optional<RankExit> exit;
  bool stopped_by_launcher = false;
  std::optional<HeartbeatFile> heartbeat;     // when the hang watchdog is on
  std::chrono::milliseconds hang_silence{0};  // > 0: stopped by the watchdog
};

// A private folder of scratch files, removed with it: in /dev/shm when it is there (the files
// are written often; no disk behind them), else $TMPDIR. One round's heartbeat files (Note [Hang
// watchdog]), an agent's ranks' metrics files (AgentMetrics).
class ScratchDir {
 public:
  // "<base>/trainyard-<name>-XXXXXX". Throws Error naming the folder, with `hint` for the fix.
  ScratchDir(const std::string& name, const std::string& hint);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  // "<path>/rank_<local_rank>".
  std::string file(int local_rank) const;

 private:
  std::string path_;
};

// Starts local rank `local_rank` of the round with its environment (LaunchOptions::extra_env
// last), its output forwarded to out/err (prefixed) and to LaunchOptions::on_output, and copied
// to files under log_dir when set. heartbeat_dir nullptr: the watchdog is off. out and err must
// outlive the rank. Throws Error when it cannot start.
Rank start_rank(const LaunchOptions& o,
                const RoundSpec& round,
                int local_rank,
                const ScratchDir* heartbeat_dir,
                OutputSink* out,
                OutputSink* err);

// Hooks for the elastic agent: `on_failure` runs once, at the first failure, before the other
// ranks are stopped; `on_signal` likewise at the first stop request; `should_stop` is asked every
// poll (50 ms) while the ranks run and stops them (without it counting as a failure) when it
// answers true; `on_exit` runs for every rank as it is recorded as exited.
struct MonitorHooks {
  std::function<void()> on_failure;
  std::function<void()> on_signal;
  std::function<bool()> should_stop;
  std::function<void(const RankExit&)> on_exit;
};

struct MonitorOutcome {
  int first_failure = -1;   // local rank of the first failed (or hung) rank, or -1
  int early_exit = -1;      // see Note [Early exit]
  int received_signal = 0;  // the first stop request, or 0
  std::chrono::system_clock::time_point signal_time{};
  bool stopped_by_hook = false;  // should_stop answered true
};

// Watches the ranks until every one has exited (each rank's `exit` is set then): forwards their
// output, reaps them, watches their heartbeats, and on the first failure or hang (or a stop
// request on `stops`) stops the rest: SIGTERM (and SIGCONT), then SIGKILL after term_timeout
// (at once on a second stop request), then gives up on a rank after a further 5 s. Every wait is
// bounded by those deadlines. hang_timeout 0: no watchdog.
MonitorOutcome monitor_ranks(std::vector<Rank>& ranks,
                             StopChannel& stops,
                             std::chrono::milliseconds term_timeout,
                             std::chrono::milliseconds hang_timeout,
                             MonitorHooks hooks);

}  // namespace trainyard::elastic
