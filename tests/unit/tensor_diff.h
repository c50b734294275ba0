// How far apart two tensors are, for the tests' tolerances.
#pragma once

#include <torch/torch.h>

namespace trainyard::test {

// max|a - b| / max|b|, computed in double (max|b| clamped at 1e-12, so a zero `b` gives the
// absolute difference scaled up).
inline double max_rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const auto a64 = a.detach().to(torch::kFloat64), b64 = b.detach().to(torch::kFloat64);
  return ((a64 - b64).abs().max() / b64.abs().max().clamp_min(1e-12)).item<double>();
}

}  // namespace trainyard::test
