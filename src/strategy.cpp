#include "trainyard/strategy.h"

#include <algorithm>

#include "trainyard/error.h"

namespace trainyard {

namespace {

struct Names {
  Strategy strategy;
  std::string_view flag, display;
};
constexpr Names kNames[] = {
    {Strategy::kDdp, "ddp", "DDP"},
    {Strategy::kZero1, "zero1", "ZeRO-1"},
    {Strategy::kNoShard, "no_shard", "NO_SHARD"},
    {Strategy::kShardGradOp, "shard_grad_op", "SHARD_GRAD_OP"},
    {Strategy::kFullShard, "full_shard", "FULL_SHARD"},
    {Strategy::kHybridShard, "hybrid_shard", "HYBRID_SHARD"},
    {Strategy::kHybridShardGradOp, "hybrid_shard_grad_op", "HYBRID_SHARD_GRAD_OP"},
};

const Names& names_of(Strategy strategy) {
  const auto* names = std::find_if(std::begin(kNames), std::end(kNames),
                                   [&](const Names& n) { return n.strategy == strategy; });
  TY_ASSERT(names != std::end(kNames), "no names for Strategy ", static_cast<int>(strategy));
  return *names;
}

}  // namespace

std::string_view to_string(Strategy strategy) {
  return names_of(strategy).flag;
}

std::string_view display_name(Strategy strategy) {
  return names_of(strategy).display;
}

bool is_fsdp(Strategy strategy) {
  return std::find(std::begin(kFsdpStrategies), std::end(kFsdpStrategies), strategy) !=
         std::end(kFsdpStrategies);
}

Strategy parse_strategy(std::string_view name,
                        std::span<const Strategy> accepted,
                        std::string_view flag) {
  for (const auto s : accepted)
    if (to_string(s) == name) return s;
  throw InvalidArgumentError(
      detail::concat(flag, " must be one of ", strategy_names(accepted), ", got '", name, "'."));
}

std::string strategy_names(std::span<const Strategy> accepted) {
  std::string out;
  for (std::size_t i = 0; i < accepted.size(); ++i)
    out += detail::concat(i == 0                     ? ""
                          : i + 1 == accepted.size() ? " or "
                                                     : ", ",
                          to_string(accepted[i]));
  return out;
}

}  // namespace trainyard
