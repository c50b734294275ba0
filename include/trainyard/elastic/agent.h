// The elastic agent as an object: runs one job's ranks on this node (the launch loop: rounds,
// failure handling, restarts, the rendezvous) on a thread of its own, reports what happens through
// LaunchOptions::on_event and on_output, and stops on request. It owns no process-global state
// (no signal handlers, no fds beyond its own), so one process can run several at once.
#pragma once

#include <csignal>
#include <memory>

#include "trainyard/elastic/launcher.h"

namespace trainyard::elastic {

// One launch, start to finish:
//
//   Agent agent(LaunchOptions{.command = {...}, .forward_output = false, .on_event = ...});
//   agent.start();
//   ...                        // from any thread: agent.stop();
//   LaunchResult r = agent.wait();
//
// See launch() (launcher.h) for what a run does. Not copyable or movable (its thread refers to
// it). Thread-safety: stop() and running() from any thread; start() and wait() from the owner.
class Agent {
 public:
  // Validates the options (InvalidArgumentError naming the field) and keeps a copy; starts
  // nothing.
  explicit Agent(LaunchOptions options);
  // stop(SIGTERM) when still running, then waits for the loop to end (bounded by term_timeout
  // plus the kill wait, and by the rendezvous' timeouts while it waits on one). Never throws.
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Starts the launch loop on a new thread. Returns at once. Throws Error when called twice or
  // when the thread cannot be created.
  void start();

  // Asks the run to stop, as a signal to the launcher did: the ranks get SIGTERM (and SIGCONT),
  // then SIGKILL after term_timeout; a wait for the rendezvous or a restart backoff ends; no
  // restart follows; the result has received_signal = signal (and exit code 128 + signal). A
  // second stop() while the ranks are stopping sends SIGKILL at once. Before start(), the run
  // stops as soon as it starts. Returns at once; thread-safe and async-signal-safe (one write()
  // to the agent's own pipe), so a signal handler may call it. signal must be in [1, 255].
  void stop(int signal = SIGTERM) noexcept;

  // Blocks until the loop has ended and returns its result; rethrows the exception it threw
  // instead (a rank that could not be started, a rendezvous that could not be joined). Throws
  // Error when start() was never called. May be called again: the same result or exception.
  LaunchResult wait();

  // True from start() until the loop has ended (the kFinished event has been delivered).
  bool running() const;

  const LaunchOptions& options() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainyard::elastic
