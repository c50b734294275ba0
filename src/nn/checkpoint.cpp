#include "trainyard/nn/checkpoint.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

namespace trainyard::nn {

// Note [Activation checkpointing]
// The forward runs under NoGradGuard, so the only thing kept for backward is the input (and the
// generator state). A hand-made autograd node stands in for the block: its one edge leads to the
// input's gradient function, and it is the output's grad_fn. When backward reaches it, the node
// recomputes the block with grad mode on from a detached copy of the input, then runs a nested
// backward from the recomputed output with the incoming gradient. That nested pass accumulates
// the block's parameter gradients into their .grad through their own accumulators (so hooks on
// them, FSDP's and DDP's, fire as usual) and leaves the input's gradient on the copy, which the
// node returns to the outer pass. Wrappers that free parameters after forward (FSDP) gather them
// again in a hook on the output, which runs before this node.

namespace {

class CheckpointBackward : public torch::autograd::Node {
 public:
  CheckpointBackward(UnitForward forward, const torch::Tensor& input, at::Tensor rng_state)
      : forward_(std::move(forward)),
        input_(input.detach()),
        input_requires_grad_(input.requires_grad()),
        rng_state_(std::move(rng_state)) {}

  std::string name() const override { return "trainyard::nn::CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    auto generator = at::detail::getDefaultCPUGenerator();
    at::Tensor outer_state;
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      outer_state = generator.get_state();
      generator.set_state(rng_state_);
    }
    auto input = input_.detach().requires_grad_(input_requires_grad_);
    torch::Tensor output;
    {
      at::AutoGradMode enable(true);
      output = forward_(input);
    }
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(outer_state);
    }
    if (output.requires_grad() && grads[0].defined())
      torch::autograd::backward({output}, {grads[0]});
    torch::autograd::variable_list result{input.requires_grad() ? input.grad() : torch::Tensor()};
    forward_ = nullptr;  // release what the forward holds; the node runs once
    input_.reset();
    return result;
  }

 private:
  UnitForward forward_;
  torch::Tensor input_;  // detached
  bool input_requires_grad_;
  at::Tensor rng_state_;
};

}  // namespace

torch::Tensor checkpoint(const UnitForward& forward, const torch::Tensor& input) {
  if (!at::GradMode::is_enabled()) return forward(input);
  auto generator = at::detail::getDefaultCPUGenerator();
  at::Tensor rng_state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    rng_state = generator.get_state();
  }
  torch::Tensor output;
  {
    torch::NoGradGuard no_grad;
    output = forward(input);
  }
  auto node = std::shared_ptr<CheckpointBackward>(
      new CheckpointBackward(forward, input, std::move(rng_state)), torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  // The output was computed without a graph, so it is a fresh tensor nobody else refers to.
  torch::autograd::create_gradient_edge(output, node);
  return output;
}

}  // namespace trainyard::nn
