// Unit hooks: a seam around a submodule's forward that wrappers use to act just before and after
// it runs (FSDP gathers a unit's parameters, frees them, and checkpoints its activations there).
// LibTorch's C++ modules have no forward hooks, so a model calls each wrappable submodule through
// call_unit(); with no hook installed that is one hash lookup and a direct call.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>

namespace trainyard::nn {

// The forward of one unit as the model runs it: hidden states in, hidden states out. A hook may
// call it again during backward (activation checkpointing recomputes the unit), so it must not
// capture the caller's locals by reference: capture the module holder by value.
using UnitForward = std::function<torch::Tensor(const torch::Tensor&)>;

class UnitHook {
 public:
  virtual ~UnitHook() = default;
  // Runs `forward(input)` for `unit`, with whatever the wrapper does around it. Must call
  // `forward` (at most once per call, or again in backward for activation checkpointing).
  virtual torch::Tensor run(torch::nn::Module& unit,
                            const torch::Tensor& input,
                            const UnitForward& forward) = 0;
};

// Installs `hook` around `unit`'s calls through call_unit; nullptr removes it. The registry holds
// the hook until removed; the wrapper that installed it removes it in its destructor.
// Thread-safe.
void set_unit_hook(const torch::nn::Module& unit, std::shared_ptr<UnitHook> hook);

// The hook installed around `unit`, or nullptr. Thread-safe.
std::shared_ptr<UnitHook> unit_hook(const torch::nn::Module& unit);

// Runs `forward(input)` through `unit`'s hook when one is installed, else directly.
torch::Tensor call_unit(torch::nn::Module& unit,
                        const torch::Tensor& input,
                        const UnitForward& forward);

}  // namespace trainyard::nn
