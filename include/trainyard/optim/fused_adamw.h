// FusedAdamW: torch::optim::AdamW with the update of each parameter done in one pass over memory,
// FusedAdam's counterpart with decoupled weight decay (p shrinks by lr * weight_decay before the
// Adam update). It reads the parameter, its gradient and both moments once and writes them once,
// with AdamW's formula (equal to float rounding), options and per-parameter state
// (AdamWParamState), so checkpoints move freely between the two. Made for FSDP's few large flat
// shards: `FusedAdamW opt(fsdp.parameters(), torch::optim::AdamWOptions(2e-5).eps(1e-8));`
#pragma once

#include <torch/optim/adamw.h>

namespace trainyard::optim {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  // One AdamW step. Dense float32 or bfloat16 CPU parameters (gradient and moments of the same
  // dtype; bf16 computed in float, rounded once) take the fused path, each split over the
  // intra-op threads (at::set_num_threads); for any other parameter (another dtype or device, a
  // sparse gradient) the whole step falls back to AdamW::step. Parameters without a gradient are
  // skipped, as AdamW skips them.
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace trainyard::optim
