// Where `trainyard run` learns its place in a multi-node job when its flags do not say: the launch
// contracts of the engines that start it (torchrun's PET_* variables, Kubeflow Trainer v2, Slurm,
// SkyPilot, dstack, Volcano), read from one table (src/elastic/launch_contract.cpp), each setting
// with the variable it came from. LibTorch-free.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/env.h"

namespace trainyard::elastic {

// A setting and where it came from: a variable ("SLURM_NNODES"), or a description of how it was
// derived ("the first host of SLURM_JOB_NODELIST").
template <typename T>
struct Sourced {
  T value{};
  std::string source;
};

struct LaunchContract {
  std::string engine;         // "kubeflow", "slurm", "skypilot", "dstack", "volcano", "torchrun"
  std::string engine_source;  // the variable that names it, e.g. "SLURM_JOB_ID"
  std::optional<Sourced<std::string>> nnodes;  // N (MIN:MAX from PET_NNODES: elastic)
  std::optional<Sourced<int>> node_rank;
  // As the engine gives it: a whole number, or torchrun's auto / cpu / gpu (PET_NPROC_PER_NODE).
  std::optional<Sourced<std::string>> nproc_per_node;
  std::optional<Sourced<std::string>> master_addr;  // node 0's host
  std::optional<Sourced<int>> master_port;
  std::optional<Sourced<std::string>> run_id;
  // torchrun's PET_RDZV_BACKEND and PET_RDZV_ENDPOINT (the engines' rendezvous is static).
  std::optional<Sourced<std::string>> rdzv_backend;
  std::optional<Sourced<std::string>> rdzv_endpoint;
};

// The contract of the engine whose variables `env` holds; engine "" when none. Several engines'
// variables at once must agree on every setting they both give (a job under Slurm started by
// hand with PET_* set, say). Throws InvalidArgumentError naming the variables when they disagree,
// when a value is malformed, when a node rank is not below the node count, or when a host list's
// length is not the node count.
LaunchContract detect_launch_contract(const EnvLookup& env = process_env());

// Slurm's compressed host list, as SLURM_JOB_NODELIST spells it, expanded in order:
// "node[01-03,7],gpu5" -> node01 node02 node03 node7 gpu5; several bracket groups in one name
// multiply ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2); a range keeps the zero padding of its start.
// Throws InvalidArgumentError naming `what` on a malformed list, and on one that names more than
// `max_hosts` hosts (the job's SLURM_NNODES where set) before expanding further: the product of
// bracket groups can be astronomically large.
inline constexpr std::size_t kMaxSlurmHosts = 1 << 20;
std::vector<std::string> expand_slurm_hostlist(std::string_view list,
                                               std::string_view what = kSlurmJobNodelistEnv,
                                               std::size_t max_hosts = kMaxSlurmHosts);

}  // namespace trainyard::elastic
