// The torchrun environment contract: the variables a launcher sets for each rank
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...; their names are
// in comm/env_contract.h), parsed and validated once, with errors that name the variable and what
// to do.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "trainyard/comm/env_contract.h"

namespace trainyard {

// Seconds: InitOptions::timeout, the bound on every collective (init_options_from_env()).
inline constexpr const char* kCollectiveTimeoutEnv = "TRAINYARD_COLLECTIVE_TIMEOUT";
// Seconds: InitOptions::join_timeout, the bound on reaching MASTER_ADDR:MASTER_PORT.
inline constexpr const char* kJoinTimeoutEnv = "TRAINYARD_JOIN_TIMEOUT";
// How init() keeps freed memory for reuse: caching (default), glibc-reuse or glibc (Note
// [Reusing freed memory] in src/comm/process_group.cpp).
inline constexpr const char* kCpuAllocatorEnv = "TRAINYARD_CPU_ALLOCATOR";
// InitOptions::device: cpu (default) or cuda.
inline constexpr const char* kDeviceEnv = "TRAINYARD_DEVICE";
// InitOptions::backend: auto (default), gloo or nccl.
inline constexpr const char* kBackendEnv = "TRAINYARD_BACKEND";

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

// Answers the value of an environment variable, or nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (getenv).
EnvLookup process_env();

// True when the contract is present (RANK and WORLD_SIZE are set): this process is one rank of a
// launched job rather than a bare start.
bool dist_env_present(const EnvLookup& env = process_env());

// Parses the contract. Throws InvalidArgumentError naming the first missing or bad variable.
// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are required; LOCAL_WORLD_SIZE defaults to
// WORLD_SIZE, LOCAL_RANK to RANK % LOCAL_WORLD_SIZE, GROUP_RANK to 0.
DistEnv parse_dist_env(const EnvLookup& env = process_env());

}  // namespace trainyard
