#include "trainyard/optim/fused_adamw.h"

#include "fused_adam_step.h"

namespace trainyard::optim {

torch::Tensor FusedAdamW::step(LossClosure closure) {
  return detail::fused_adam_step<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
      param_groups_, state_, detail::WeightDecay::kDecoupled, "FusedAdamW", closure,
      [this] { torch::optim::AdamW::step(nullptr); });  // the closure has run already
}

}  // namespace trainyard::optim
