// What a launch reports when it ends: how each local rank exited (RankExit) and the outcome of
// the whole run (LaunchResult), with torchrun's failure summary. Written by elastic::Agent and
// returned by Agent::wait() and launch().
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace trainyard::elastic {

// How one rank ended.
struct RankExit {
  int rank = 0;
  int local_rank = 0;
  int pid = 0;
  int exit_code = 0;                             // valid when signal == 0
  int signal = 0;                                // the signal that ended it, or 0
  std::chrono::system_clock::time_point time{};  // when the launcher saw it exit
  bool stopped_by_launcher = false;              // not yet reaped when the launcher sent SIGTERM
  // > 0: the hang watchdog stopped this rank after it made no progress for this long.
  std::chrono::milliseconds hang_silence{0};
  // The rank's last lines on stderr (on stdout when it wrote nothing to stderr), oldest first,
  // without line endings; at most kLastLines.
  std::vector<std::string> last_lines{};
  static constexpr std::size_t kLastLines = 10;
  bool failed() const { return signal != 0 || exit_code != 0; }
};

struct LaunchResult {
  bool succeeded = false;
  int restart_count = 0;          // restarts before the last round (TORCHELASTIC_RESTART_COUNT)
  std::vector<RankExit> exits{};  // one per local rank, of the last round
  int first_failure = -1;         // index into exits of the first failed (or hung) rank, or -1
  // Index into exits of a rank that exited with status 0 while the others were still running,
  // when first_failure followed it: then that early exit is the root cause. -1 otherwise.
  int early_exit = -1;
  // A signal (SIGINT, SIGTERM, ...) that made the launcher stop: given to Agent::stop(), which
  // main() calls for the signals the process receives.
  int received_signal = 0;
  // torchrun's failure report ("... FAILED", the other failures, the root cause and its last
  // lines), as printed on stderr when output is forwarded. Empty when the run succeeded, and when
  // no rank failed and no ranks were running to stop: the rendezvous closed or could not be
  // reached, or a stop came while the agent waited for the rendezvous.
  std::string summary{};
  // The launcher's exit code: 0 when every rank succeeded, else first_failure's exit code
  // (128 + signal for a signal, as a shell reports it; torchrun itself exits 1), or
  // 128 + received_signal when the launcher was interrupted before any rank failed.
  int exit_code() const;
};

}  // namespace trainyard::elastic
