// The local launcher: starts N ranks of a program on this node with the torchrun environment
// contract, forwards their output with a rank prefix, and when one rank fails stops the others
// and reports the root cause. The elastic agent (rendezvous, restarts) grows from this.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace trainyard::elastic {

class Rendezvous;

// A rank that has sent a heartbeat and then sends none for this long is reported as hung and its
// group is stopped (and restarted while restarts are left). See Note [Hang watchdog].
inline constexpr std::chrono::seconds kDefaultHangTimeout{30};
// Seconds: the hang timeout for launchers started by trainyard's commands (PET_HANG_TIMEOUT and
// the flag take precedence for `trainyard run`).
inline constexpr const char* kHangTimeoutEnv = "TRAINYARD_HANG_TIMEOUT";

struct LaunchOptions {
  std::vector<std::string> command{};  // program and its arguments; command[0] is looked up in PATH
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  std::uint16_t master_port = 0;  // 0: pick a free port on this host
  std::string run_id = "none";    // TORCHELASTIC_RUN_ID
  int max_restarts = 0;           // restart all ranks up to this many times after a failure
  std::string log_dir{};          // when set, each rank's stdout/stderr also go to files here
  std::string role = "default";
  // After the first failure, how long the other ranks get between SIGTERM and SIGKILL.
  std::chrono::milliseconds term_timeout = std::chrono::seconds(10);
  bool prefix_output = true;  // "[rank0]: " before every line a rank prints
  std::vector<std::pair<std::string, std::string>> extra_env{};  // set in every rank's environment
  // Elastic membership: when set, each round's nodes, ranks and master come from this
  // rendezvous, and nnodes, node_rank, master_addr and master_port are ignored.
  std::shared_ptr<Rendezvous> rendezvous{};
  // Elastic: after its ranks succeed, how long an agent waits for the other nodes to finish.
  std::chrono::milliseconds exit_barrier_timeout = std::chrono::seconds(300);
  // Elastic (torchrun's --monitor-interval): how often the agent asks the rendezvous whether the
  // round still stands while its ranks run; at least once per rendezvous keep_alive_interval,
  // since those checks carry this node's heartbeat. Rank exits are seen at once regardless.
  std::chrono::milliseconds monitor_interval = std::chrono::milliseconds(500);
  // Before restart k (0 for the first) the agent waits min(restart_backoff_max,
  // restart_backoff * 2^k), so that a short outage (storage, network) does not use up every
  // restart in seconds; 0 restarts at once. A signal during the wait stops the run.
  std::chrono::milliseconds restart_backoff = std::chrono::seconds(1);
  std::chrono::milliseconds restart_backoff_max = std::chrono::seconds(30);
  // Hang watchdog: a rank that called trainyard::heartbeat() and then made no progress for this
  // long is stopped as a failure (it is the root cause); 0 turns the watchdog off. Ranks that
  // never beat (any program not built on trainyard) are never judged. See Note [Hang watchdog].
  std::chrono::milliseconds hang_timeout = kDefaultHangTimeout;
};

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
  int received_signal = 0;  // a signal (SIGINT, SIGTERM, ...) that made the launcher stop
  // The launcher's exit code: 0 when every rank succeeded, else first_failure's exit code
  // (128 + signal for a signal, as a shell reports it; torchrun itself exits 1), or
  // 128 + received_signal when the launcher was interrupted before any rank failed.
  int exit_code() const;
};

// Runs the ranks to completion. Blocks. When a rank fails, the others are stopped and, while
// fewer than max_restarts restarts have happened, all ranks start again as a new round
// (TORCHELASTIC_RESTART_COUNT counts them; each round prints torchrun's rendezvous result), after
// the restart backoff. Every rank gets TRAINYARD_JOB_INSTANCE (kJobInstanceEnv). Elastic: a
// rendezvous backend outage shorter than its backend_timeout leaves the ranks running; a longer
// one stops them, and the agent rejoins as a restart while restarts remain. Throws
// InvalidArgumentError on bad options and Error when a rank cannot be started; rank failures are
// reported in the result (and on stderr as a summary). While it runs, SIGINT, SIGTERM, SIGHUP and
// SIGQUIT stop the ranks (SIGTERM, then SIGKILL after term_timeout) and SIGPIPE is ignored; the
// previous handlers are restored before it returns. One launch() per process at a time.
LaunchResult launch(const LaunchOptions& options);

// The path of the running executable (/proc/self/exe), for programs that relaunch themselves.
std::string self_executable();

}  // namespace trainyard::elastic
