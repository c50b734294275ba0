// The process groups FSDP runs over: the shard group and the replicas (make_fsdp_groups).
#include "trainyard/fsdp/fully_sharded_data_parallel.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <string>

#include "trainyard/comm/process_group.h"
#include "trainyard/comm/shm_process_group.h"
#include "trainyard/error.h"

namespace trainyard::fsdp {

FsdpGroups make_fsdp_groups(Strategy strategy,
                            const c10::intrusive_ptr<c10d::ProcessGroup>& world,
                            const c10::intrusive_ptr<c10d::Store>& store,
                            int local_world_size,
                            const std::string& master_addr) {
  TY_CHECK(world, "make_fsdp_groups needs a process group, got null.");
  const int w = world->getSize();
  const int rank = world->getRank();
  switch (strategy) {
    case Strategy::kFullShard:
    case Strategy::kShardGradOp:
      return FsdpGroups{.shard = world, .replicate = {}, .world_size = w};
    case Strategy::kNoShard:
      return FsdpGroups{.shard = {},
                        .replicate = w > 1 ? world : c10::intrusive_ptr<c10d::ProcessGroup>(),
                        .world_size = w};
    case Strategy::kHybridShard:
    case Strategy::kHybridShardGradOp:
      break;
    case Strategy::kDdp:
    case Strategy::kZero1:
      throw InvalidArgumentError(detail::concat(
          "FSDP's sharding strategy is ", to_string(strategy), ", which is not one of FSDP's (",
          strategy_names(kFsdpStrategies),
          "). HINT: wrap the model in DistributedDataParallel for ", to_string(strategy),
          strategy == Strategy::kZero1 ? " and shard Adam's state with ShardedAdam." : "."));
  }
  TY_CHECK(local_world_size >= 1 && w % local_world_size == 0,
           "HYBRID sharding needs the world size (", w,
           ") to be a multiple of the ranks per node (LOCAL_WORLD_SIZE = ", local_world_size,
           "). HINT: start the same number of ranks on every node (--nproc-per-node).");
  TY_CHECK(store, "make_fsdp_groups: HYBRID sharding needs the job's store to form groups.");
  const int node = rank / local_world_size;
  const int local = rank % local_world_size;
  const int nodes = w / local_world_size;
  FsdpGroups groups{.world_size = w};
  if (local_world_size > 1) {
    auto node_store =
        c10::make_intrusive<c10d::PrefixStore>("fsdp/node/" + std::to_string(node), store);
    auto gloo = make_gloo_group(node_store, local, local_world_size, {}, master_addr);
    groups.shard = make_local_group(node_store, local, local_world_size, gloo);
  }
  if (nodes > 1) {
    auto replica_store =
        c10::make_intrusive<c10d::PrefixStore>("fsdp/replica/" + std::to_string(local), store);
    groups.replicate = make_gloo_group(replica_store, node, nodes, {}, master_addr);
  }
  return groups;
}

FsdpGroups groups_from(const std::shared_ptr<Distributed>& dist, Strategy strategy) {
  TY_CHECK(dist != nullptr, "FullyShardedDataParallel needs a Distributed (trainyard::init()).");
  return make_fsdp_groups(strategy, dist->process_group(), dist->store(),
                          dist->env().local_world_size, dist->env().master_addr);
}

}  // namespace trainyard::fsdp
