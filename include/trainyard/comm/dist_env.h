// The torchrun environment contract: the variables a launcher sets for each rank
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...; their names are
// in env.h), parsed and validated once, with errors that name the variable and what
// to do.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "trainyard/env.h"

namespace trainyard {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int group_rank = 0;  // the node's rank among nodes (torchrun GROUP_RANK)
  std::string master_addr = "127.0.0.1";
  std::uint16_t master_port = 29500;
  int restart_count = 0;         // TORCHELASTIC_RESTART_COUNT
  std::string run_id;            // TORCHELASTIC_RUN_ID
  bool use_agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE: the agent hosts the TCPStore
};

// True when the contract is present (RANK and WORLD_SIZE are set): this process is one rank of a
// launched job rather than a bare start.
bool dist_env_present(const EnvLookup& env = process_env());

// Parses the contract. Throws InvalidArgumentError naming the first missing or bad variable.
// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are required; LOCAL_WORLD_SIZE defaults to
// WORLD_SIZE, LOCAL_RANK to RANK % LOCAL_WORLD_SIZE, GROUP_RANK to 0.
DistEnv parse_dist_env(const EnvLookup& env = process_env());

}  // namespace trainyard
