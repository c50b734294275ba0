// The agent's stop pipe (internal to the launcher): Agent::stop() writes into it, the agent's loop
// polls it. See Note [Stopping an agent].
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "trainyard/elastic/subprocess.h"
#include "trainyard/error.h"

namespace trainyard::elastic {

// Note [Stopping an agent]: Agent::stop() writes the signal number into the agent's own pipe; the
// monitor polls its read end with the ranks' pipes (and the rendezvous and backoff waits read it),
// so a stop wakes the loop at once without races and without process-global state. Several
// agents in one process each have their own pipe; main() turns the process's signals into
// stop() calls (tools/stop_signals.h).
class StopChannel {
 public:
  StopChannel() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw Error(
          detail::concat("Could not create the agent's stop pipe: ", std::strerror(errno),
                         ". HINT: the process may have run out of file descriptors (ulimit -n)."));
    }
    read_.reset(fds[0]);
    write_.reset(fds[1]);
  }

  int fd() const { return read_.get(); }

  // Async-signal-safe. A full pipe already holds a wake-up, so a failed write loses nothing.
  void request(int sig) noexcept {
    const auto byte = static_cast<unsigned char>(sig);
    [[maybe_unused]] ssize_t n = ::write(write_.get(), &byte, 1);
  }

  // The next stop requested, or 0. Never blocks.
  int take() {
    unsigned char byte = 0;
    ssize_t n;
    do {
      n = ::read(read_.get(), &byte, 1);
    } while (n < 0 && errno == EINTR);
    return n == 1 ? byte : 0;
  }

 private:
  UniqueFd read_;
  UniqueFd write_;
};

}  // namespace trainyard::elastic
