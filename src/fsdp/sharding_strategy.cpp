#include "trainyard/fsdp/sharding_strategy.h"

#include <string>
#include <utility>

#include "trainyard/error.h"

namespace trainyard::fsdp {

namespace {
constexpr std::pair<std::string_view, ShardingStrategy> kStrategyNames[] = {
    {"full_shard", ShardingStrategy::kFullShard},
    {"shard_grad_op", ShardingStrategy::kShardGradOp},
    {"no_shard", ShardingStrategy::kNoShard},
    {"hybrid_shard", ShardingStrategy::kHybridShard},
    {"hybrid_shard_grad_op", ShardingStrategy::kHybridShardGradOp},
};
}  // namespace

std::string_view to_string(ShardingStrategy strategy) {
  for (const auto& [name, s] : kStrategyNames)
    if (s == strategy) return name;
  return "unknown";
}

std::vector<std::string_view> sharding_strategy_names() {
  std::vector<std::string_view> names;
  for (const auto& [name, s] : kStrategyNames) names.push_back(name);
  return names;
}

ShardingStrategy parse_sharding_strategy(std::string_view name) {
  std::string known;
  for (const auto& [n, s] : kStrategyNames) {
    if (n == name) return s;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  throw InvalidArgumentError(
      detail::concat("Unknown sharding strategy '", name, "'; expected one of ", known, "."));
}

}  // namespace trainyard::fsdp
