// DistributedDataParallel<M>: wraps any LibTorch module (a holder such as `ResNet18` or a
// shared_ptr to a module) for data-parallel training. forward() forwards to the module after
// synchronising buffers; backward() leaves gradients averaged across ranks.
//
//   auto ddp = trainyard::ddp::DistributedDataParallel(model, dist->process_group());
//   auto loss = torch::nll_loss(ddp.forward(x), y);
//   loss.backward();              // gradients are all-reduced while backward runs
//   optimizer.step();
#pragma once

#include <memory>
#include <utility>

#include "trainyard/ddp/reducer.h"
#include "trainyard/nn/module_ptr.h"

namespace trainyard::ddp {

template <typename M>
class DistributedDataParallel {
 public:
  DistributedDataParallel(M module,
                          c10::intrusive_ptr<c10d::ProcessGroup> process_group,
                          DdpOptions options = {})
      : module_(std::move(module)),
        reducer_(std::make_unique<DdpReducer>(
            nn::module_ptr(module_), std::move(process_group), options)) {}

  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    reducer_->prepare_forward();
    return module_->forward(std::forward<Args>(args)...);
  }

  // Gradient accumulation: backward passes inside this scope do not communicate; the first
  // backward after it all-reduces the accumulated gradients.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DdpReducer& reducer)
        : reducer_(reducer), previous_(reducer.require_sync()) {
      reducer_.set_require_sync(false);
    }
    ~NoSyncGuard() { reducer_.set_require_sync(previous_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DdpReducer& reducer_;  // owned by the DistributedDataParallel, which outlives the guard
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }

  M& module() { return module_; }
  DdpReducer& reducer() { return *reducer_; }

 private:
  M module_;
  std::unique_ptr<DdpReducer> reducer_;
};

}  // namespace trainyard::ddp
