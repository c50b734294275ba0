// The local launcher's options and its blocking entry point: LaunchOptions says what to run on
// this node (N ranks of a program with the torchrun environment contract, env.h),
// how to restart it and where its output and events go; launch() runs it to the end. The work
// itself is elastic::Agent (agent.h), which a daemon runs several of at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/elastic/agent_event.h"
#include "trainyard/elastic/launch_result.h"

namespace trainyard::elastic {

class Rendezvous;

// A rank that has sent a heartbeat and then sends none for this long is reported as hung and its
// group is stopped (and restarted while restarts are left). See Note [Hang watchdog].
inline constexpr std::chrono::seconds kDefaultHangTimeout{30};
// The largest values the launch flags take, and a cluster job's trainyard.* fields with them.
inline constexpr int kMaxRestartsLimit = 1 << 20;
inline constexpr std::chrono::seconds kMaxRestartBackoff{86400};
inline constexpr std::chrono::seconds kMaxHangTimeout{1'000'000};

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
  // After the first failure (or Agent::stop()), how long the ranks get between SIGTERM and
  // SIGKILL.
  std::chrono::milliseconds term_timeout = std::chrono::seconds(10);
  // Forward the ranks' output to this process's stdout and stderr (each rank's stream to the
  // same one), and print the round banners and the failure summary on stderr, as torchrun does.
  // A daemon running several agents turns it off and takes on_output and on_event instead.
  bool forward_output = true;
  bool prefix_output = true;  // forwarding: "[rank0]: " before every line a rank prints
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
  // Observers, called on the agent's thread (in order, one call at a time), whether or not
  // output is forwarded. They must return soon (the ranks' pipes are read between calls) and
  // must not call the agent's wait(); stop() is fine. An exception from one ends the run: the
  // ranks are stopped and Agent::wait() rethrows it.
  AgentEventCallback on_event{};   // see AgentEvent
  OutputLineCallback on_output{};  // every line every rank prints; see OutputLine
};

// Runs the ranks to completion on an Agent (agent.h) and returns its result. Blocks. When a rank
// fails, the others are stopped and, while fewer than max_restarts restarts have happened, all
// ranks start again as a new round (TORCHELASTIC_RESTART_COUNT counts them; each round prints
// torchrun's rendezvous result), after the restart backoff. Every rank gets TRAINYARD_JOB_INSTANCE
// (kJobInstanceEnv). Elastic: a rendezvous backend outage shorter than its backend_timeout leaves
// the ranks running; a longer one stops them, and the agent rejoins as a restart while restarts
// remain. Throws InvalidArgumentError on bad options and Error when a rank cannot be started; rank
// failures are reported in the result (and, when forwarding output, on stderr as a summary). It
// installs no signal handlers: a program that wants SIGINT/SIGTERM to stop the ranks runs an Agent
// and calls Agent::stop() from its own handling (tools/stop_signals.h does this for the CLI).
// Thread-safe: several launches may run at once in one process.
LaunchResult launch(const LaunchOptions& options);

// The path of the running executable (/proc/self/exe), for programs that relaunch themselves.
std::string self_executable();

}  // namespace trainyard::elastic
