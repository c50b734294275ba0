// The CLI's signal handling: SIGINT, SIGTERM, SIGHUP and SIGQUIT to the trainyard process become
// Agent::stop() calls (the library installs no handlers), and SIGPIPE is ignored. Process-global
// state, so it lives here, owned by main()'s commands, one at a time.
#pragma once

#include <functional>
#include <memory>

#include "trainyard/elastic/launcher.h"

namespace trainyard::cli {

// While it exists, catches SIGINT, SIGTERM, SIGHUP and SIGQUIT and calls on_signal(signal) for
// each one on a thread of its own (the handler only writes the number into a pipe; see Note
// [Stopping an agent] in src/elastic/stop_channel.h), and ignores SIGPIPE. The destructor restores
// the previous dispositions and joins the thread. Throws Error when one already exists in this
// process or the pipe or thread cannot be made.
class StopSignals {
 public:
  explicit StopSignals(std::function<void(int signal)> on_signal);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// elastic::launch() with this process's stop signals stopping the run: the first SIGINT/SIGTERM
// stops the ranks (SIGTERM, then SIGKILL after term_timeout) and the result has received_signal
// set; a second one kills them at once. Blocks. For `trainyard run` and a bare `trainyard train`.
elastic::LaunchResult launch_until_signalled(const elastic::LaunchOptions& options);

}  // namespace trainyard::cli
