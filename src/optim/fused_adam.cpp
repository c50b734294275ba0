#include "trainyard/optim/fused_adam.h"

#include <ATen/Parallel.h>
#include <c10/util/string_utils.h>
#include <torch/torch.h>

#include <cmath>

namespace trainyard::optim {
namespace {

bool fusable(const torch::Tensor& p) {
  const auto& g = p.grad();
  return p.device().is_cpu() && p.scalar_type() == torch::kFloat32 && p.is_contiguous() &&
         g.layout() == torch::kStrided && g.scalar_type() == torch::kFloat32 && g.is_contiguous();
}

struct Coefficients {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float sqrt_bias_correction2;  // sqrt(1 - beta2^t)
  float step_size;              // lr / (1 - beta1^t)
  float eps, weight_decay;
  bool amsgrad;
};

// The element-wise update, with LibTorch's Adam formula and association order:
//   g += wd * p;  m = m * b1 + (1 - b1) * g;  v = v * b2 + ((1 - b2) * g) * g
//   p = p + (-step_size * m) / (sqrt(v) / sqrt(bc2) + eps)     (v -> max(v_max, v) with amsgrad)
// LibTorch's vectorised kernels may contract some of these into fused multiply-adds, so the two
// agree to float rounding, not bit for bit.
void update(float* p,
            const float* grad,
            float* m,
            float* v,
            float* v_max,
            int64_t begin,
            int64_t end,
            const Coefficients& c) {
  for (int64_t i = begin; i < end; ++i) {
    float g = grad[i];
    if (c.weight_decay != 0.0f) g = g + c.weight_decay * p[i];
    const float mi = m[i] * c.beta1 + c.one_minus_beta1 * g;
    const float vi = v[i] * c.beta2 + (c.one_minus_beta2 * g) * g;
    m[i] = mi;
    v[i] = vi;
    float second = vi;
    if (c.amsgrad) {
      // torch.maximum propagates NaN; std::max would drop it.
      second = (std::isnan(vi) || vi > v_max[i]) ? vi : v_max[i];
      v_max[i] = second;
    }
    const float denom = std::sqrt(second) / c.sqrt_bias_correction2 + c.eps;
    p[i] = p[i] + (-c.step_size * mi) / denom;
  }
}

}  // namespace

torch::Tensor FusedAdam::step(LossClosure closure) {
  torch::Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (const auto& group : param_groups_)
    for (const auto& p : group.params())
      if (p.grad().defined() && !fusable(p)) {
        torch::optim::Adam::step(nullptr);  // the closure has run already
        return loss;
      }

  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const torch::optim::AdamOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto key = c10::guts::to_string(p.unsafeGetTensorImpl());
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto fresh = std::make_unique<torch::optim::AdamParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (options.amsgrad())
          fresh->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(key, std::move(fresh)).first;
      }
      auto& state = static_cast<torch::optim::AdamParamState&>(*it->second);
      // State loaded from a checkpoint must fit the parameter: it is written through pointers.
      auto fits = [&p](const torch::Tensor& t) {
        return t.defined() && t.sizes() == p.sizes() && t.scalar_type() == torch::kFloat32 &&
               t.is_contiguous() && t.device().is_cpu();
      };
      TORCH_CHECK(fits(state.exp_avg()) && fits(state.exp_avg_sq()) &&
                      (!options.amsgrad() || fits(state.max_exp_avg_sq())),
                  "FusedAdam: the optimizer state of a parameter of shape ", p.sizes(),
                  " does not match it (a checkpoint of another model?)");
      state.step(state.step() + 1);
      const double beta1 = std::get<0>(options.betas());
      const double beta2 = std::get<1>(options.betas());
      const double bias_correction1 = 1 - std::pow(beta1, state.step());
      const double bias_correction2 = 1 - std::pow(beta2, state.step());
      const Coefficients c{
          .beta1 = static_cast<float>(beta1),
          .beta2 = static_cast<float>(beta2),
          .one_minus_beta1 = static_cast<float>(1 - beta1),
          .one_minus_beta2 = static_cast<float>(1 - beta2),
          .sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2)),
          .step_size = static_cast<float>(options.lr() / bias_correction1),
          .eps = static_cast<float>(options.eps()),
          .weight_decay = static_cast<float>(options.weight_decay()),
          .amsgrad = options.amsgrad()};
      float* param = p.data_ptr<float>();
      const float* grad = p.grad().data_ptr<float>();
      float* m = state.exp_avg().data_ptr<float>();
      float* v = state.exp_avg_sq().data_ptr<float>();
      float* v_max = options.amsgrad() ? state.max_exp_avg_sq().data_ptr<float>() : nullptr;
      constexpr int64_t kGrain = 1 << 15;  // elements per task: small tensors stay serial
      at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
        update(param, grad, m, v, v_max, begin, end, c);
      });
    }
  }
  return loss;
}

}  // namespace trainyard::optim
