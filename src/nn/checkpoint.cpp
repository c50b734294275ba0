#include "trainyard/nn/checkpoint.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

namespace trainyard::nn {

// Note [Activation checkpointing]
// The forward runs under NoGradGuard, so the only thing kept for backward is the input (and the
// state of the generators it may draw from: the CPU's, and the input's device's when that is a
// GPU, so that dropout recomputes the same mask there). A hand-made autograd node stands in for the
// block: its one edge leads to the input's gradient function, and it is the output's grad_fn. When
// backward reaches it, the node recomputes the block with grad mode on from a detached copy of the
// input, then runs a nested backward from the recomputed output with the incoming gradient. That
// nested pass accumulates the block's parameter gradients into their .grad through their own
// accumulators (so hooks on them, FSDP's and DDP's, fire as usual) and leaves the input's gradient
// on the copy, which the node returns to the outer pass. Wrappers that free parameters after
// forward (FSDP) gather them again in a hook on the output, which runs before this node.

namespace {

// The default generators a forward on `input` may draw from.
std::vector<at::Generator> generators_for(const torch::Tensor& input) {
  std::vector<at::Generator> out{at::detail::getDefaultCPUGenerator()};
  if (!input.is_cpu() && !input.is_meta())
    out.push_back(at::globalContext().defaultGenerator(input.device()));
  return out;
}

std::vector<at::Tensor> get_states(std::vector<at::Generator>& generators) {
  std::vector<at::Tensor> states;
  for (auto& g : generators) {
    std::lock_guard<std::mutex> lock(g.mutex());
    states.push_back(g.get_state());
  }
  return states;
}

void set_states(std::vector<at::Generator>& generators, const std::vector<at::Tensor>& states) {
  for (std::size_t i = 0; i < generators.size(); ++i) {
    std::lock_guard<std::mutex> lock(generators[i].mutex());
    generators[i].set_state(states[i]);
  }
}

class CheckpointBackward : public torch::autograd::Node {
 public:
  CheckpointBackward(UnitForward forward,
                     const torch::Tensor& input,
                     std::vector<at::Generator> generators,
                     std::vector<at::Tensor> rng_states)
      : forward_(std::move(forward)),
        input_(input.detach()),
        input_requires_grad_(input.requires_grad()),
        generators_(std::move(generators)),
        rng_states_(std::move(rng_states)) {}

  std::string name() const override { return "trainyard::nn::CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const auto outer_states = get_states(generators_);
    set_states(generators_, rng_states_);
    auto input = input_.detach().requires_grad_(input_requires_grad_);
    torch::Tensor output;
    {
      at::AutoGradMode enable(true);
      output = forward_(input);
    }
    set_states(generators_, outer_states);
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
  std::vector<at::Generator> generators_;
  std::vector<at::Tensor> rng_states_;  // one per generator, as forward began
};

}  // namespace

torch::Tensor checkpoint(const UnitForward& forward, const torch::Tensor& input) {
  if (!at::GradMode::is_enabled()) return forward(input);
  auto generators = generators_for(input);
  auto rng_states = get_states(generators);
  torch::Tensor output;
  {
    torch::NoGradGuard no_grad;
    output = forward(input);
  }
  auto node = c10::make_intrusive<CheckpointBackward>(forward, input, std::move(generators),
                                                      std::move(rng_states));
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  // The output was computed without a graph, so it is a fresh tensor nobody else refers to.
  torch::autograd::create_gradient_edge(output, node);
  return output;
}

}  // namespace trainyard::nn
