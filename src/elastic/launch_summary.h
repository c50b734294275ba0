// What the agent prints about a run (internal to the launcher): torchrun's rendezvous result for
// each round and its failure report with the root cause, and the time formats they share with
// the rank monitor.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "trainyard/elastic/launcher.h"

namespace trainyard::elastic {

// Where this node's ranks stand in one round: given by the flags (static) or by the rendezvous.
struct RoundSpec {
  int restart_count = 0;
  int group_rank = 0;
  int group_world_size = 1;
  int rank_offset = 0;  // global rank of local rank 0
  int world_size = 1;
  std::string master_addr;
  std::uint16_t master_port = 0;
};

// What torchrun prints when a round's workers are assigned their ranks.
std::string format_round(const LaunchOptions& o, const RoundSpec& round);

// Local time as torchrun's summary shows it: "2026-01-31_12:00:01".
std::string format_time(std::chrono::system_clock::time_point t);

// "1.5 s".
std::string format_seconds(std::chrono::milliseconds d);

// torchrun's ChildFailedError report: the other failures, then the root cause (the first failure,
// an early exit that caused it (Note [Early exit]), or the signal at signal_time that stopped
// the launcher); then, below torchrun's shape, the root cause's own last lines.
std::string format_summary(const LaunchOptions& o,
                           const LaunchResult& result,
                           std::chrono::system_clock::time_point signal_time);

}  // namespace trainyard::elastic
