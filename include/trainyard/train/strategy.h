// How a recipe spreads its model over the ranks: one of FSDP's sharding strategies, or
// DistributedDataParallel. Parsed once from --strategy; printed with to_string.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "trainyard/fsdp/sharding_strategy.h"

namespace trainyard::train {

struct Strategy {
  // FSDP's strategy; nullopt: DistributedDataParallel over the whole model.
  std::optional<fsdp::ShardingStrategy> sharding = fsdp::ShardingStrategy::kFullShard;

  bool is_ddp() const { return !sharding.has_value(); }
  static Strategy ddp() { return {.sharding = std::nullopt}; }
  // FSDP's names (fsdp::sharding_strategy_names()) or "ddp"; anything else throws
  // InvalidArgumentError naming `flag` and listing them.
  static Strategy parse(std::string_view name, std::string_view flag = "--strategy");
  // "full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_grad_op or ddp", for help.
  static std::string names();

  bool operator==(const Strategy&) const = default;
};

std::string_view to_string(const Strategy& strategy);

}  // namespace trainyard::train
