// FSDP's sharding strategies (PyTorch's ShardingStrategy) and their names, apart from the engine
// so that flags, plans and configs can name a strategy without LibTorch's headers.
#pragma once

#include <string_view>
#include <vector>

namespace trainyard::fsdp {

enum class ShardingStrategy {
  kFullShard,    // params, grads, optimizer state sharded; params gathered for forward and backward
  kShardGradOp,  // as above, but params stay gathered from a unit's forward to its backward
  kNoShard,      // DDP: everything replicated, gradients all-reduced
  kHybridShard,  // FULL_SHARD inside a node, replicated across nodes
  kHybridShardGradOp,  // SHARD_GRAD_OP inside a node, replicated across nodes
};

// "full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_grad_op" (PyTorch's
// names, lower case), and back; parsing an unknown name throws InvalidArgumentError listing them.
std::string_view to_string(ShardingStrategy strategy);
ShardingStrategy parse_sharding_strategy(std::string_view name);
// Every strategy's name, in the order above.
std::vector<std::string_view> sharding_strategy_names();

}  // namespace trainyard::fsdp
