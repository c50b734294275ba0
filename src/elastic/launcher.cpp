// launch(), the blocking form of elastic::Agent, and the small pieces of the launcher's public
// types: LaunchResult::exit_code(), the event kinds' names, self_executable().
#include "trainyard/elastic/launcher.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "trainyard/elastic/agent.h"
#include "trainyard/error.h"

namespace trainyard::elastic {

LaunchResult launch(const LaunchOptions& options) {
  Agent agent(options);
  agent.start();
  return agent.wait();
}

int LaunchResult::exit_code() const {
  if (succeeded) return 0;
  if (first_failure >= 0 && first_failure < static_cast<int>(exits.size())) {
    const RankExit& root = exits[first_failure];
    if (root.signal != 0) return 128 + root.signal;
    // A hung rank that exited 0 on the launcher's SIGTERM still failed.
    return root.exit_code != 0 ? root.exit_code : 1;
  }
  if (received_signal != 0) return 128 + received_signal;
  return 1;
}

const char* to_string(AgentEventKind kind) {
  switch (kind) {
    case AgentEventKind::kRoundStarted:
      return "round_started";
    case AgentEventKind::kRanksStarted:
      return "ranks_started";
    case AgentEventKind::kRankExited:
      return "rank_exited";
    case AgentEventKind::kRestarting:
      return "restarting";
    case AgentEventKind::kFinished:
      return "finished";
  }
  return "unknown";
}

std::string self_executable() {
  std::vector<char> buf(256);
  while (true) {
    ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size());
    if (n < 0) {
      throw Error(detail::concat("Could not read /proc/self/exe: ", std::strerror(errno),
                                 ". HINT: is /proc mounted?"));
    }
    if (static_cast<std::size_t>(n) < buf.size()) return std::string(buf.data(), n);
    buf.resize(buf.size() * 2);
  }
}

}  // namespace trainyard::elastic
