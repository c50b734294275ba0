// How a job spreads its model over the ranks: one type from the command line (--strategy, `plan
// --format csv`) through the engines (DistributedDataParallel, ShardedAdam, FSDP) to the
// checkpoint (fsdp.json's "strategy") and the memory planner. LibTorch-free.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace trainyard {

enum class Strategy {
  kDdp,    // everything replicated; gradients all-reduced (DistributedDataParallel)
  kZero1,  // DDP with Adam's state sharded (ShardedAdam): ZeRO stage 1
  // FSDP's sharding strategies (PyTorch's ShardingStrategy):
  kNoShard,            // DDP's replication through FSDP's engine
  kShardGradOp,        // gradients and optimizer state sharded; parameters gathered for a unit's
                       // forward and kept to its backward
  kFullShard,          // parameters, gradients and optimizer state sharded
  kHybridShard,        // FULL_SHARD inside a node, replicated across nodes
  kHybridShardGradOp,  // SHARD_GRAD_OP inside a node, replicated across nodes
};

// The flag's names, which fsdp.json holds too: "ddp", "zero1", "no_shard", "shard_grad_op",
// "full_shard", "hybrid_shard", "hybrid_shard_grad_op".
std::string_view to_string(Strategy strategy);
// For tables and people: "DDP", "ZeRO-1", "NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD", ...
std::string_view display_name(Strategy strategy);
// Whether FSDP's engine runs it.
bool is_fsdp(Strategy strategy);

// What each consumer runs, in the order its help lists them.
inline constexpr Strategy kFsdpStrategies[] = {Strategy::kFullShard, Strategy::kShardGradOp,
                                               Strategy::kNoShard, Strategy::kHybridShard,
                                               Strategy::kHybridShardGradOp};
// The causal-LM recipe and train_gpt_fsdp: FSDP's, or DistributedDataParallel.
inline constexpr Strategy kTrainingStrategies[] = {
    Strategy::kFullShard,   Strategy::kShardGradOp,       Strategy::kNoShard,
    Strategy::kHybridShard, Strategy::kHybridShardGradOp, Strategy::kDdp};

// `name` as one of `accepted`; anything else throws InvalidArgumentError naming `flag` (the flag,
// or the file and key) and listing the accepted ones.
Strategy parse_strategy(std::string_view name,
                        std::span<const Strategy> accepted,
                        std::string_view flag = "--strategy");
// "full_shard, shard_grad_op, ... or ddp", for help.
std::string strategy_names(std::span<const Strategy> accepted);

}  // namespace trainyard
