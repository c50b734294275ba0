// Wrap policies: which submodules become FSDP units (wrap_policy.h).
#include "trainyard/fsdp/wrap_policy.h"

#include <algorithm>
#include <unordered_set>

#include "trainyard/error.h"

namespace trainyard::fsdp {

WrapPolicy wrap_by_parameter_count(std::int64_t min_numel) {
  TY_CHECK(min_numel > 0, "wrap_by_parameter_count: min_numel must be > 0, got ", min_numel, ".");
  return {.wraps = [min_numel](const std::string&, const torch::nn::Module&, std::int64_t n) {
    return n >= min_numel;
  }};
}

WrapPolicy wrap_modules_named(std::vector<std::string> names) {
  std::unordered_set<std::string> set(names.begin(), names.end());
  return {.wraps = [set](const std::string& name, const torch::nn::Module&,
                         std::int64_t) { return set.count(name) > 0; },
          .required_names = std::move(names)};
}

WrapPolicy wrap_any_of(std::vector<WrapPolicy> policies) {
  WrapPolicy out;
  for (const auto& p : policies)
    out.required_names.insert(out.required_names.end(), p.required_names.begin(),
                              p.required_names.end());
  out.wraps = [policies = std::move(policies)](
                  const std::string& name, const torch::nn::Module& module, std::int64_t numel) {
    return std::any_of(policies.begin(), policies.end(), [&](const WrapPolicy& p) {
      return p.wraps && p.wraps(name, module, numel);
    });
  };
  return out;
}

}  // namespace trainyard::fsdp
