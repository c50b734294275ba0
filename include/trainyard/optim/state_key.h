// The key under which torch::optim::Optimizer::state() files a parameter's state: the address of
// its TensorImpl, written as a string in LibTorch 1.13 and kept as the pointer itself in 2.x (one
// of the differences between the lines, Note [Two LibTorch lines] in src/comm/torch_compat.cpp).
// Everything that reads or writes optimizer state by parameter goes through optimizer_state_key.
#pragma once

#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace trainyard::optim {

using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

namespace state_key_impl {
template <typename Key>
Key state_key_of(void* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;  // what 1.13's c10::guts::to_string writes for a pointer
    text << impl;
    return text.str();
  } else {
    return static_cast<Key>(impl);
  }
}
}  // namespace state_key_impl

inline OptimizerStateKey optimizer_state_key(const at::Tensor& param) {
  return state_key_impl::state_key_of<OptimizerStateKey>(param.unsafeGetTensorImpl());
}

}  // namespace trainyard::optim
