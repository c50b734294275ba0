// The key under which torch::optim::Optimizer::state() files a parameter's state: the address of
// its TensorImpl. Everything that reads or writes optimizer state by parameter goes through
// optimizer_state_key.
#pragma once

#include <torch/optim/optimizer.h>

#include <type_traits>

namespace trainyard::optim {

using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

inline OptimizerStateKey optimizer_state_key(const at::Tensor& param) {
  return static_cast<OptimizerStateKey>(param.unsafeGetTensorImpl());
}

}  // namespace trainyard::optim
