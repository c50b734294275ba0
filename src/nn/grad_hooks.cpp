#include "trainyard/nn/grad_hooks.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "trainyard/error.h"

namespace trainyard::nn {
namespace {

// Runs on the autograd thread right after a parameter's gradient has been accumulated.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(const GradientHooks::Callback* callback, std::size_t index)
      : callback_(callback), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    (*callback_)(index_);
    return outputs;
  }

 private:
  const GradientHooks::Callback* callback_;  // owned by GradientHooks, which removes this hook
  std::size_t index_;
};

}  // namespace

GradientHooks::GradientHooks(const std::vector<torch::Tensor>& params, Callback on_ready)
    : callback_(std::make_unique<Callback>(std::move(on_ready))) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    TY_ASSERT(acc != nullptr, "parameter ", i,
              " has no gradient accumulator (not a leaf that "
              "requires grad)");
    keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>(callback_.get(), i)));
    accumulators_.push_back(std::move(acc));
  }
}

GradientHooks::~GradientHooks() {
  for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(keys_[i]);
}

void queue_end_of_backward(std::function<void()> fn) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

}  // namespace trainyard::nn
