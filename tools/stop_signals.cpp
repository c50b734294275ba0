#include "tools/stop_signals.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "trainyard/elastic/agent.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/error.h"

namespace trainyard::cli {
namespace {

constexpr std::array<int, 4> kStopSignals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// The write end of the live StopSignals' pipe, -1 when there is none.
std::atomic<int> g_signal_pipe{-1};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) {
  const int saved_errno = errno;
  const int fd = g_signal_pipe.load();
  const auto byte = static_cast<unsigned char>(sig);
  if (fd >= 0) {
    [[maybe_unused]] ssize_t n = ::write(fd, &byte, 1);  // a full pipe already holds a wake-up
  }
  errno = saved_errno;
}

}  // namespace

struct StopSignals::State {
  elastic::UniqueFd read;
  elastic::UniqueFd write;
  std::array<struct sigaction, kStopSignals.size()> previous{};
  struct sigaction previous_pipe {};
  std::thread thread;
};

StopSignals::StopSignals(std::function<void(int signal)> on_signal)
    : state_(std::make_unique<State>()) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    throw Error(detail::concat("Could not create the signal pipe: ", std::strerror(errno), "."));
  }
  state_->read.reset(fds[0]);
  state_->write.reset(fds[1]);
  int expected = -1;
  if (!g_signal_pipe.compare_exchange_strong(expected, state_->write.get())) {
    throw Error("A StopSignals already exists in this process; make one at a time.");
  }
  // Byte 0 (written by the destructor) ends the thread; any other is a signal number.
  state_->thread = std::thread([fd = state_->read.get(), on_signal = std::move(on_signal)] {
    while (true) {
      unsigned char byte = 0;
      const ssize_t n = ::read(fd, &byte, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1 || byte == 0) return;
      on_signal(byte);
    }
  });
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < kStopSignals.size(); ++i) {
    sigaction(kStopSignals[i], &action, &state_->previous[i]);
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, &state_->previous_pipe);
}

StopSignals::~StopSignals() {
  for (std::size_t i = 0; i < kStopSignals.size(); ++i) {
    sigaction(kStopSignals[i], &state_->previous[i], nullptr);
  }
  sigaction(SIGPIPE, &state_->previous_pipe, nullptr);
  g_signal_pipe.store(-1);
  const unsigned char end = 0;
  ssize_t n;
  do {
    n = ::write(state_->write.get(), &end, 1);
  } while (n < 0 && errno == EINTR);
  if (state_->thread.joinable()) state_->thread.join();
}

elastic::LaunchResult launch_until_signalled(const elastic::LaunchOptions& options) {
  elastic::Agent agent(options);
  // Declared after the agent: gone (no more stop() calls) before the agent is.
  StopSignals signals([&agent](int sig) { agent.stop(sig); });
  agent.start();
  return agent.wait();
}

}  // namespace trainyard::cli
