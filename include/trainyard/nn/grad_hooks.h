// GradientHooks: a callback right after each parameter's gradient has been accumulated in a
// backward pass, from a post-hook on the parameter's gradient accumulator; and a callback at the
// end of the backward pass. The autograd machinery DDP's reducer and FSDP share.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace trainyard::nn {

class GradientHooks {
 public:
  // Called on the autograd thread with the parameter's index in `params`, after its .grad holds
  // this pass's gradient (summed into what was there).
  using Callback = std::function<void(std::size_t index)>;

  // `params` are leaf tensors that require grad. The destructor removes the hooks.
  GradientHooks(const std::vector<torch::Tensor>& params, Callback on_ready);
  ~GradientHooks();
  GradientHooks(const GradientHooks&) = delete;
  GradientHooks& operator=(const GradientHooks&) = delete;

 private:
  // The accumulators are owned by the autograd graph only weakly: keep them (and so the hooks)
  // alive here.
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> keys_;
  std::unique_ptr<Callback> callback_;  // stable address for the hooks
};

// Runs `fn` on the autograd engine when the backward pass running now ends, before backward()
// returns. Call it only from inside a backward pass (a hook), once per pass.
void queue_end_of_backward(std::function<void()> fn);

}  // namespace trainyard::nn
