#include "trainyard/models/causal_lm.h"

namespace trainyard::models {

CausalLm make_causal_lm(const CausalLmConfig& config, CausalLmInit init) {
  // Every architecture of CausalLmConfig::Variant declares make_model beside its config: one
  // without fails to compile here.
  return std::visit([&](const auto& c) { return make_model(c, std::move(init)); },
                    config.variant());
}

}  // namespace trainyard::models
