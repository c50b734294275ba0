// FusedAdam: torch::optim::Adam with the update of each parameter done in one pass over memory.
// LibTorch's Adam runs about eight tensor operations per parameter, each a full read and write of
// a tensor as large as the model; on a CPU that is memory-bound work. FusedAdam reads the
// parameter, its gradient and both moments once and writes them once, with Adam's formula (equal
// to float rounding), options and per-parameter state (AdamParamState), so checkpoints move
// freely between the two.
#pragma once

#include <torch/optim/adam.h>

namespace trainyard::optim {

class FusedAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;

  // One Adam step. Dense float32 or bfloat16 CPU parameters (gradient and moments of the same
  // dtype; bf16 computed in float, rounded once) take the fused path, each split over the
  // intra-op threads (at::set_num_threads); for any other parameter (another dtype or device, a
  // sparse gradient) the whole step falls back to Adam::step.
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace trainyard::optim
