// The step that FusedAdam and FusedAdamW share, written once for the option and state types of
// both (AdamOptions / AdamParamState, AdamWOptions / AdamWParamState: the same fields under other
// names): the fallback test, the per-parameter state, the coefficients and the fused update
// (adam_update.h). Private to src/optim.
#pragma once

#include <c10/util/string_utils.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "adam_update.h"
#include "trainyard/optim/state_key.h"

namespace trainyard::optim::detail {

// Dense contiguous float32 or bfloat16 on the CPU, and so is the gradient, of the same dtype:
// what adam_update can take.
inline bool fusable(const torch::Tensor& p) {
  const auto& g = p.grad();
  const auto dtype = p.scalar_type();
  return p.device().is_cpu() && (dtype == torch::kFloat32 || dtype == torch::kBFloat16) &&
         p.is_contiguous() && g.layout() == torch::kStrided && g.scalar_type() == dtype &&
         g.is_contiguous();
}

// A moment loaded from a checkpoint must fit its parameter: adam_update writes it through a
// pointer of the parameter's type.
inline bool fits(const torch::Tensor& moment, const torch::Tensor& p) {
  return moment.defined() && moment.sizes() == p.sizes() &&
         moment.scalar_type() == p.scalar_type() && moment.is_contiguous() &&
         moment.device().is_cpu();
}

// The buffers of `p` and its moments as T (the dtype fusable() checked).
template <typename T, typename ParamState>
AdamBuffers<T> adam_buffers(const torch::Tensor& p, ParamState& state, bool amsgrad) {
  return {.param = p.data_ptr<T>(),
          .grad = p.grad().data_ptr<T>(),
          .exp_avg = state.exp_avg().template data_ptr<T>(),
          .exp_avg_sq = state.exp_avg_sq().template data_ptr<T>(),
          .max_exp_avg_sq = amsgrad ? state.max_exp_avg_sq().template data_ptr<T>() : nullptr,
          .numel = p.numel()};
}

// One step of `name` (FusedAdam or FusedAdamW) over `groups`, whose options are Options, with the
// per-parameter state ParamState in `states` (the optimizer's state_). Runs the closure first,
// then, if every parameter with a gradient is fusable, the fused update of each; otherwise calls
// `fallback` (the base class's step, without the closure) for the whole step. Returns the
// closure's loss.
template <typename Options, typename ParamState, typename StateMap>
torch::Tensor fused_adam_step(std::vector<torch::optim::OptimizerParamGroup>& groups,
                              StateMap& states,
                              WeightDecay weight_decay_kind,
                              const char* name,
                              const torch::optim::Optimizer::LossClosure& closure,
                              const std::function<void()>& fallback) {
  torch::Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (const auto& group : groups)
    for (const auto& p : group.params())
      if (p.grad().defined() && !fusable(p)) {
        fallback();
        return loss;
      }

  torch::NoGradGuard no_grad;
  for (auto& group : groups) {
    const auto& options = static_cast<const Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto key = optimizer_state_key(p);
      auto it = states.find(key);
      if (it == states.end()) {
        auto fresh = std::make_unique<ParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (options.amsgrad())
          fresh->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = states.emplace(key, std::move(fresh)).first;
      }
      auto& state = static_cast<ParamState&>(*it->second);
      TORCH_CHECK(fits(state.exp_avg(), p) && fits(state.exp_avg_sq(), p) &&
                      (!options.amsgrad() || fits(state.max_exp_avg_sq(), p)),
                  name, ": the optimizer state of a parameter of shape ", p.sizes(),
                  " does not match it (a checkpoint of another model?)");
      state.step(state.step() + 1);
      const double beta1 = std::get<0>(options.betas());
      const double beta2 = std::get<1>(options.betas());
      const double bias_correction1 = 1 - std::pow(beta1, state.step());
      const double bias_correction2 = 1 - std::pow(beta2, state.step());
      const bool decays = options.weight_decay() != 0;
      const AdamCoefficients c{
          .weight_decay_kind = decays ? weight_decay_kind : WeightDecay::kNone,
          .amsgrad = options.amsgrad(),
          .beta1 = static_cast<float>(beta1),
          .beta2 = static_cast<float>(beta2),
          .one_minus_beta1 = static_cast<float>(1 - beta1),
          .one_minus_beta2 = static_cast<float>(1 - beta2),
          .sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2)),
          .step_size = static_cast<float>(options.lr() / bias_correction1),
          .eps = static_cast<float>(options.eps()),
          .weight_decay = static_cast<float>(options.weight_decay()),
          .decay = static_cast<float>(1 - options.lr() * options.weight_decay())};
      if (p.scalar_type() == torch::kBFloat16)
        adam_update(adam_buffers<c10::BFloat16>(p, state, options.amsgrad()), c);
      else
        adam_update(adam_buffers<float>(p, state, options.amsgrad()), c);
    }
  }
  return loss;
}

}  // namespace trainyard::optim::detail
