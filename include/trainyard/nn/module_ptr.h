// The module a parallel wrapper (DistributedDataParallel, FullyShardedDataParallel) holds, from
// what the user hands it: a LibTorch module holder (ResNet18, any TORCH_MODULE type) or a
// shared_ptr to a module.
#pragma once

#include <memory>

namespace torch::nn {
class Module;
}

namespace trainyard::nn {

template <typename M>
std::shared_ptr<torch::nn::Module> module_ptr(const M& m) {
  if constexpr (requires { m.ptr(); }) {
    return m.ptr();
  } else {
    return m;
  }
}

}  // namespace trainyard::nn
