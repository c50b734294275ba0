#include "trainyard/optim/fused_adam.h"

#include "fused_adam_step.h"

namespace trainyard::optim {

torch::Tensor FusedAdam::step(LossClosure closure) {
  return detail::fused_adam_step<torch::optim::AdamOptions, torch::optim::AdamParamState>(
      param_groups_, state_, detail::WeightDecay::kL2, "FusedAdam", closure,
      [this] { torch::optim::Adam::step(nullptr); });  // the closure has run already
}

}  // namespace trainyard::optim
