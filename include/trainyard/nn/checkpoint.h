// Activation checkpointing for LibTorch C++, which has no torch.utils.checkpoint: run a block's
// forward without keeping its activations, and recompute it during backward.
#pragma once

#include <torch/types.h>

#include "trainyard/nn/unit_hook.h"

namespace trainyard::nn {

// Returns forward(input), computed without recording the autograd graph; when its gradient is
// needed, forward is run again with the graph (the CPU random generator, and the input's GPU's
// when it is on one, restored to their state at the first run, so dropout drops the same
// elements) and backpropagated through, accumulating
// into the parameters' .grad as an ordinary backward would. `forward` is kept until then (see
// UnitForward). With grad mode off it is just forward(input).
torch::Tensor checkpoint(const UnitForward& forward, const torch::Tensor& input);

}  // namespace trainyard::nn
