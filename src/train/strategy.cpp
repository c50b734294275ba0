#include "trainyard/train/strategy.h"

#include "trainyard/error.h"

namespace trainyard::train {

namespace {
constexpr std::string_view kDdpName = "ddp";
}  // namespace

Strategy Strategy::parse(std::string_view name, std::string_view flag) {
  if (name == kDdpName) return ddp();
  for (const auto known : fsdp::sharding_strategy_names())
    if (name == known) return {.sharding = fsdp::parse_sharding_strategy(name)};
  throw InvalidArgumentError(
      detail::concat(flag, " must be one of ", names(), ", got '", name, "'."));
}

std::string Strategy::names() {
  std::string out;
  for (const auto name : fsdp::sharding_strategy_names())
    out += detail::concat(out.empty() ? "" : ", ", name);
  return detail::concat(out, " or ", kDdpName);
}

std::string_view to_string(const Strategy& strategy) {
  return strategy.sharding ? fsdp::to_string(*strategy.sharding) : kDdpName;
}

}  // namespace trainyard::train
