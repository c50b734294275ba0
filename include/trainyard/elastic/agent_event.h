// What an elastic::Agent reports while it runs, for a caller that observes it instead of reading
// its stderr (the cluster worker): AgentEvent (rounds, ranks started and exited, restarts, the
// end) and OutputLine (each line a rank prints). See LaunchOptions::on_event and on_output.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/elastic/launch_result.h"

namespace trainyard::elastic {

enum class AgentEventKind {
  kRoundStarted,  // a round's place is known (static flags or the rendezvous); ranks start next
  kRanksStarted,  // every local rank of the round runs; pids
  kRankExited,    // one local rank exited (or was given up on after SIGKILL); rank_exit
  kRestarting,    // the ranks start again in a new round; reason, backoff, counted
  kFinished,      // the run ended; result (and error when the agent's loop threw). Always last.
};

// "round_started", "ranks_started", "rank_exited", "restarting", "finished".
const char* to_string(AgentEventKind kind);

// One event. Which fields are set depends on kind, as noted; restart_count is always the
// current round's (TORCHELASTIC_RESTART_COUNT).
struct AgentEvent {
  AgentEventKind kind = AgentEventKind::kRoundStarted;
  std::chrono::system_clock::time_point time{};
  int restart_count = 0;
  // kRoundStarted: where this node's ranks stand in the round.
  int world_size = 0;
  int local_world_size = 0;  // nproc_per_node
  int group_rank = 0;        // this node's rank among the round's nodes
  int group_world_size = 0;  // nodes in the round
  int rank_offset = 0;       // global rank of local rank 0
  std::string master_addr{};
  std::uint16_t master_port = 0;
  // kRanksStarted: the ranks' pids, by local rank.
  std::vector<int> pids{};
  // kRankExited: how the rank ended.
  RankExit rank_exit{};
  // kRestarting: why ("a rank failed", "another node ended the round", ...), how long the agent
  // waits first (0 for a membership change), and whether it uses up one of max_restarts.
  std::string reason{};
  std::chrono::milliseconds backoff{0};
  bool counted = false;
  // kFinished: the outcome, as Agent::wait() returns it; error is the message of an exception
  // the loop threw (then result is empty and wait() rethrows), else empty.
  LaunchResult result{};
  std::string error{};
};

enum class OutputStream { kStdout, kStderr };

// One line a rank printed. A line ends at '\n', '\r' or "\r\n" (a progress bar redrawn with '\r'
// gives one line per redraw); a line longer than LineForwarder's 1 MiB limit comes in pieces, and
// a last line without an ending comes when the rank exits.
struct OutputLine {
  int rank = 0;  // global rank
  int local_rank = 0;
  int restart_count = 0;  // the round's
  OutputStream stream = OutputStream::kStdout;
  std::string_view text;  // without its line ending; valid during the call only
};

// Called on the agent's thread, in order. See LaunchOptions::on_event.
using AgentEventCallback = std::function<void(const AgentEvent&)>;
using OutputLineCallback = std::function<void(const OutputLine&)>;

}  // namespace trainyard::elastic
