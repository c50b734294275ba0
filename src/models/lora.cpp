#include "trainyard/models/lora.h"

#include <algorithm>
#include <cmath>

#include "trainyard/error.h"

namespace trainyard::models {

namespace {
constexpr std::string_view kAllLinear = "all-linear";
}  // namespace

void LoraOptions::validate() const {
  TY_CHECK(r >= 1, "--lora-r must be >= 1, got ", r, ".");
  TY_CHECK(alpha > 0 && std::isfinite(alpha), "--lora-alpha must be > 0, got ", alpha, ".");
  TY_CHECK(dropout >= 0 && dropout < 1, "--lora-dropout must be in [0, 1), got ", dropout, ".");
  TY_CHECK(!targets.empty(),
           "--lora-targets names no layer. HINT: e.g. q_proj,v_proj or "
           "all-linear.");
}

std::vector<LayerLinear> lora_targets(const CausalLmConfig& config, const LoraOptions& options) {
  const auto all = config.layer_linears();
  const bool every = std::find(options.targets.begin(), options.targets.end(), kAllLinear) !=
                     options.targets.end();
  auto last_part = [](const std::string& name) { return name.substr(name.rfind('.') + 1); };
  for (const auto& target : options.targets) {
    if (target == kAllLinear) continue;
    const bool known = std::any_of(
        all.begin(), all.end(), [&](const LayerLinear& l) { return last_part(l.name) == target; });
    if (known) continue;
    std::string names;
    for (const auto& l : all) names += detail::concat(names.empty() ? "" : ", ", last_part(l.name));
    throw InvalidArgumentError(detail::concat(
        "--lora-targets names \"", target, "\", but ", config.architecture(),
        "'s layers have the linear layers ", names, " (or all-linear for every one)."));
  }
  std::vector<LayerLinear> out;
  for (const auto& l : all)
    if (every || std::find(options.targets.begin(), options.targets.end(), last_part(l.name)) !=
                     options.targets.end())
      out.push_back(l);
  return out;
}

std::int64_t lora_parameter_count(const CausalLmConfig& config, const LoraOptions& options) {
  std::int64_t per_layer = 0;
  for (const auto& l : lora_targets(config, options)) per_layer += options.r * (l.in + l.out);
  return per_layer * config.num_hidden_layers();
}

}  // namespace trainyard::models
