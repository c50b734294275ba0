// FusedAdam must follow torch::optim::Adam step for step, with every option.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "trainyard/optim/fused_adam.h"
#include "trainyard/optim/state_key.h"

namespace {

struct AdamCase {
  double weight_decay;
  bool amsgrad;
};
class FusedAdamMatches : public ::testing::TestWithParam<AdamCase> {};

TEST_P(FusedAdamMatches, LibTorchAdam) {
  const auto c = GetParam();
  torch::manual_seed(3);
  // Sizes on both sides of the parallel grain, and a parameter that never gets a gradient.
  std::vector<torch::Tensor> a = {torch::randn({70000}), torch::randn({13, 7}), torch::randn({5})};
  std::vector<torch::Tensor> b;
  for (auto& t : a) {
    t.set_requires_grad(true);
    b.push_back(t.detach().clone().set_requires_grad(true));
  }
  auto options = torch::optim::AdamOptions(3e-3).weight_decay(c.weight_decay).amsgrad(c.amsgrad);
  torch::optim::Adam reference(a, options);
  trainyard::optim::FusedAdam fused(b, options);
  for (int step = 0; step < 20; ++step) {
    auto target = torch::randn({70000});
    for (auto* params : {&a, &b}) {
      auto& ps = *params;
      auto loss = (ps[0] - target).pow(2).mean() + ps[1].sin().sum();
      loss.backward();
    }
    reference.step();
    fused.step();
    reference.zero_grad();
    fused.zero_grad();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    auto diff = (a[i] - b[i]).abs().max().item<float>();
    // Same formula and association order; LibTorch's vector kernels may fuse multiply-adds.
    EXPECT_LT(diff, 1e-6) << "tensor " << i;
  }
  EXPECT_TRUE(torch::equal(a[2], b[2])) << "no gradient, no update";
  // The state is Adam's own: the fused optimizer's step counts and moments are there.
  auto& state = static_cast<torch::optim::AdamParamState&>(
      *fused.state().at(trainyard::optim::optimizer_state_key(b[0])));
  EXPECT_EQ(state.step(), 20);
}

INSTANTIATE_TEST_SUITE_P(Options,
                         FusedAdamMatches,
                         ::testing::Values(AdamCase{0.0, false},
                                           AdamCase{0.01, false},
                                           AdamCase{0.0, true}));

TEST(FusedAdam, FallsBackForOtherDtypes) {
  auto p = torch::randn({8}, torch::kFloat64).set_requires_grad(true);
  auto q = p.detach().clone().set_requires_grad(true);
  torch::optim::Adam reference({p}, torch::optim::AdamOptions(1e-2));
  trainyard::optim::FusedAdam fused({q}, torch::optim::AdamOptions(1e-2));
  p.sum().backward();
  q.sum().backward();
  reference.step();
  fused.step();
  EXPECT_TRUE(torch::allclose(p, q));
}

}  // namespace
