// FusedAdamW must follow torch::optim::AdamW step for step, with every option, on every size, on
// one intra-op thread and on two, and share its checkpoints both ways.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "trainyard/optim/fused_adamw.h"
#include "trainyard/optim/state_key.h"

namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using trainyard::optim::FusedAdamW;

// Tolerance: each element may differ from AdamW's by kRelTol x the largest magnitude in its tensor.
// The formula and association order are AdamW's, but LibTorch's vector kernels contract some
// multiply-adds (one rounding instead of two), so the two round differently in the last bit now
// and then; over these tests' 10 steps the largest difference seen was 1.6e-7 (a moment) and
// 9e-8 (a parameter), about one float ulp (1.2e-7 relative).
constexpr double kRelTol = 1e-6;

void expect_close(const torch::Tensor& fused,
                  const torch::Tensor& reference,
                  const std::string& what) {
  const double scale = std::max(reference.abs().max().item<double>(), 1e-30);
  const double err = (fused - reference).abs().max().item<double>() / scale;
  EXPECT_LE(err, kRelTol) << what << ": max |fused - AdamW| / max |AdamW| = " << err;
}

trainyard::optim::OptimizerStateKey key(const torch::Tensor& p) {
  return trainyard::optim::optimizer_state_key(p);
}

// Sets at::get_num_threads() for one test and restores it.
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int n) : saved_(at::get_num_threads()) { at::set_num_threads(n); }
  ~IntraOpThreads() { at::set_num_threads(saved_); }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  int saved_;
};

// Two identical sets of parameters: one for AdamW, one for FusedAdamW.
struct Twins {
  std::vector<torch::Tensor> reference, fused;
  explicit Twins(const std::vector<torch::Tensor>& initial) {
    for (const auto& t : initial) {
      reference.push_back(t.clone().set_requires_grad(true));
      fused.push_back(t.clone().set_requires_grad(true));
    }
  }
};

// `steps` random gradients, [step][i], for the first `with_grad` of `params`; the rest get none.
// The optimizers only read gradients, so both twins can be given the same tensors.
std::vector<std::vector<torch::Tensor>> random_gradients(const std::vector<torch::Tensor>& params,
                                                         size_t with_grad,
                                                         int steps) {
  std::vector<std::vector<torch::Tensor>> gradients(steps);
  for (auto& step : gradients)
    for (size_t i = 0; i < with_grad; ++i) step.push_back(torch::randn_like(params[i]));
  return gradients;
}

// One step of `optimizer` per entry of `gradients`, from `first` on, on `threads` intra-op
// threads. Only the fused optimizer is run on two: AdamW's nine kernels per parameter would each
// open a parallel region, slow on a busy two-core machine, and its element-wise results do not
// depend on the thread count anyway.
void run_steps(torch::optim::Optimizer& optimizer,
               const std::vector<torch::Tensor>& params,
               const std::vector<std::vector<torch::Tensor>>& gradients,
               int threads = 1,
               size_t first = 0) {
  IntraOpThreads guard(threads);
  for (size_t step = first; step < gradients.size(); ++step) {
    for (size_t i = 0; i < gradients[step].size(); ++i)
      params[i].mutable_grad() = gradients[step][i];
    optimizer.step();
  }
}

void expect_states_close(torch::optim::Optimizer& fused,
                         const torch::Tensor& fused_param,
                         torch::optim::Optimizer& reference,
                         const torch::Tensor& reference_param,
                         const std::string& what) {
  auto& f = static_cast<AdamWParamState&>(*fused.state().at(key(fused_param)));
  auto& r = static_cast<AdamWParamState&>(*reference.state().at(key(reference_param)));
  EXPECT_EQ(f.step(), r.step()) << what;
  expect_close(f.exp_avg(), r.exp_avg(), what + " exp_avg");
  expect_close(f.exp_avg_sq(), r.exp_avg_sq(), what + " exp_avg_sq");
  EXPECT_EQ(f.max_exp_avg_sq().defined(), r.max_exp_avg_sq().defined()) << what;
  if (r.max_exp_avg_sq().defined())
    expect_close(f.max_exp_avg_sq(), r.max_exp_avg_sq(), what + " max_exp_avg_sq");
}

struct AdamWCase {
  const char* name;
  AdamWOptions options;
  int threads;
};

class FusedAdamWMatches : public ::testing::TestWithParam<AdamWCase> {};

TEST_P(FusedAdamWMatches, LibTorchAdamW) {
  const auto& c = GetParam();
  torch::manual_seed(3);
  // Above the parallel grain (so split in two with 2 threads, at an odd element), small and odd,
  // and one parameter that never gets a gradient (last).
  Twins params({torch::randn({140001}), torch::randn({13, 7}), torch::randn({5})});
  const auto gradients = random_gradients(params.reference, 2, /*steps=*/10);
  torch::optim::AdamW reference(params.reference, c.options);
  FusedAdamW fused(params.fused, c.options);
  run_steps(reference, params.reference, gradients);
  run_steps(fused, params.fused, gradients, c.threads);
  for (size_t i = 0; i < 2; ++i) {
    const auto what = "parameter " + std::to_string(i);
    expect_close(params.fused[i], params.reference[i], what);
    expect_states_close(fused, params.fused[i], reference, params.reference[i], what);
  }
  EXPECT_TRUE(torch::equal(params.fused[2], params.reference[2])) << "no gradient, no update";
}

INSTANTIATE_TEST_SUITE_P(
    Options,
    FusedAdamWMatches,
    ::testing::Values(
        AdamWCase{"defaults", AdamWOptions(), 1},
        AdamWCase{"fsdp_recipe_two_threads", AdamWOptions(2e-5).eps(1e-8), 2},
        AdamWCase{"no_weight_decay", AdamWOptions(3e-3).weight_decay(0), 1},
        AdamWCase{"strong_decay_two_threads", AdamWOptions(1e-2).weight_decay(0.3), 2},
        AdamWCase{"betas_eps", AdamWOptions(5e-3).betas({0.8, 0.95}).eps(1e-4), 1},
        AdamWCase{"beta1_zero", AdamWOptions(1e-3).betas({0.0, 0.5}).weight_decay(0.05), 1},
        AdamWCase{"amsgrad", AdamWOptions(1e-2).amsgrad(true), 1},
        AdamWCase{"amsgrad_two_threads", AdamWOptions(1e-3).amsgrad(true).weight_decay(0), 2}),
    [](const ::testing::TestParamInfo<AdamWCase>& info) { return std::string(info.param.name); });

// Sizes around the vector widths (4, 8, 16 floats) and the parallel grain (65536): the vectorised
// loop's remainder, and with 2 threads a split that leaves each thread an odd count.
class FusedAdamWSizes : public ::testing::TestWithParam<std::tuple<int64_t, int>> {};

TEST_P(FusedAdamWSizes, LibTorchAdamW) {
  const auto [numel, threads] = GetParam();
  torch::manual_seed(numel);
  Twins params({torch::randn({numel})});
  const auto gradients = random_gradients(params.reference, 1, /*steps=*/3);
  const auto options = AdamWOptions(1e-2).weight_decay(0.1);
  torch::optim::AdamW reference(params.reference, options);
  FusedAdamW fused(params.fused, options);
  run_steps(reference, params.reference, gradients);
  run_steps(fused, params.fused, gradients, threads);
  expect_close(params.fused[0], params.reference[0], "numel " + std::to_string(numel));
  expect_states_close(fused, params.fused[0], reference, params.reference[0], "state");
}

INSTANTIATE_TEST_SUITE_P(
    OddSizes,
    FusedAdamWSizes,
    ::testing::Combine(::testing::Values<int64_t>(1, 3, 7, 15, 17, 33, 1001, 65537, 131075),
                       ::testing::Values(1, 2)));

// Saves `from`'s state with torch::optim's serialize and loads it into `to`.
void copy_state(torch::optim::Optimizer& from, torch::optim::Optimizer& to) {
  torch::serialize::OutputArchive out;
  from.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  to.load(in);
}

// AdamW runs 3 steps, FusedAdamW loads its state and runs 3 more; then the other way round. Both
// end where 6 uninterrupted steps of AdamW end.
TEST(FusedAdamW, StateMovesBothWaysBetweenAdamWAndFusedAdamW) {
  torch::manual_seed(5);
  const auto options = AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true);
  for (const bool adamw_first : {true, false}) {
    SCOPED_TRACE(adamw_first ? "AdamW -> FusedAdamW" : "FusedAdamW -> AdamW");
    Twins params({torch::randn({1000}), torch::randn({3, 5})});
    const auto gradients = random_gradients(params.reference, 2, /*steps=*/6);
    torch::optim::AdamW reference(params.reference, options);
    run_steps(reference, params.reference, gradients);

    std::unique_ptr<torch::optim::Optimizer> first, second;
    if (adamw_first) {
      first = std::make_unique<torch::optim::AdamW>(params.fused, options);
      second = std::make_unique<FusedAdamW>(params.fused, options);
    } else {
      first = std::make_unique<FusedAdamW>(params.fused, options);
      second = std::make_unique<torch::optim::AdamW>(params.fused, options);
    }
    const std::vector<std::vector<torch::Tensor>> first_half(gradients.begin(),
                                                             gradients.begin() + 3);
    run_steps(*first, params.fused, first_half);
    copy_state(*first, *second);
    run_steps(*second, params.fused, gradients, /*threads=*/1, /*first=*/3);
    for (size_t i = 0; i < 2; ++i) {
      const auto what = "parameter " + std::to_string(i);
      expect_close(params.fused[i], params.reference[i], what);
      expect_states_close(*second, params.fused[i], reference, params.reference[i], what);
    }
  }
}

TEST(FusedAdamW, FallsBackToAdamWForOtherDtypes) {
  torch::manual_seed(7);
  // One double parameter sends the whole step, the float one included, to AdamW::step.
  Twins params({torch::randn({8}, torch::kFloat64), torch::randn({9})});
  const auto gradients = random_gradients(params.reference, 2, /*steps=*/3);
  const auto options = AdamWOptions(1e-2).weight_decay(0.1);
  torch::optim::AdamW reference(params.reference, options);
  FusedAdamW fused(params.fused, options);
  run_steps(reference, params.reference, gradients);
  int closure_calls = 0;
  for (const auto& step : gradients) {
    for (size_t i = 0; i < step.size(); ++i) params.fused[i].mutable_grad() = step[i];
    const auto loss = fused.step([&] {
      ++closure_calls;
      return torch::ones({});
    });
    EXPECT_EQ(loss.item<float>(), 1.0f) << "the closure's loss is returned";
  }
  EXPECT_EQ(closure_calls, 3) << "the closure runs once per step, not again in AdamW::step";
  for (size_t i = 0; i < 2; ++i)
    EXPECT_TRUE(torch::equal(params.fused[i], params.reference[i])) << "the same code: bit equal";
}

// bf16 parameters (pure bf16: Note [Pure bf16]) keep bf16 moments and are updated as AdamW would
// update their values widened to float, rounded to bf16 once: each step, from the fused state,
// the reference runs AdamW in float and rounds. They may differ by one bf16 ulp (2^-7 of the
// value at most) where a contracted multiply-add lands on the other side of a rounding boundary,
// and by float rounding where the update cancels.
TEST(FusedAdamW, Bf16ParametersAreTheFloatUpdateRoundedOnce) {
  torch::manual_seed(11);
  auto p = torch::randn({1000}).to(torch::kBFloat16).set_requires_grad(true);
  const auto options = AdamWOptions(1e-2).weight_decay(0.1).eps(1e-8);
  FusedAdamW fused({p}, options);
  for (int step = 1; step <= 4; ++step) {
    const auto g = torch::randn({1000}).to(torch::kBFloat16);
    // The reference: this step of AdamW in float from the fused optimizer's bf16 state.
    auto q = p.detach().to(torch::kFloat32).set_requires_grad(true);
    torch::optim::AdamW reference({q}, options);
    if (step > 1) {
      auto& f = static_cast<AdamWParamState&>(*fused.state().at(key(p)));
      auto state = std::make_unique<AdamWParamState>();
      state->step(f.step());
      state->exp_avg(f.exp_avg().to(torch::kFloat32));
      state->exp_avg_sq(f.exp_avg_sq().to(torch::kFloat32));
      reference.state()[key(q)] = std::move(state);
    }
    q.mutable_grad() = g.to(torch::kFloat32);
    reference.step();
    p.mutable_grad() = g;
    fused.step();

    auto& f = static_cast<AdamWParamState&>(*fused.state().at(key(p)));
    auto& r = static_cast<AdamWParamState&>(*reference.state().at(key(q)));
    ASSERT_EQ(p.scalar_type(), torch::kBFloat16);
    ASSERT_EQ(f.exp_avg().scalar_type(), torch::kBFloat16) << "the moments stay bf16";
    ASSERT_EQ(f.exp_avg_sq().scalar_type(), torch::kBFloat16);
    EXPECT_EQ(f.step(), step);
    const std::pair<torch::Tensor, torch::Tensor> pairs[] = {
        {p.detach(), q.detach()}, {f.exp_avg(), r.exp_avg()}, {f.exp_avg_sq(), r.exp_avg_sq()}};
    for (const auto& [mine, want] : pairs) {
      const auto rounded = want.to(torch::kBFloat16).to(torch::kFloat32);
      const auto diff = (mine.to(torch::kFloat32) - rounded).abs();
      // One bf16 ulp of the value, or float rounding of the tensor's scale where the update
      // cancels (a moment of 1e-8 left from terms of 0.1 carries their float rounding).
      const double scale = want.abs().max().item<double>();
      const auto bad = diff > rounded.abs() * std::ldexp(1.0, -7) + scale * 1e-6;
      EXPECT_FALSE(bad.any().item<bool>())
          << "step " << step << ": fused " << mine.to(torch::kFloat32).masked_select(bad)
          << " AdamW in float " << want.masked_select(bad);
      EXPECT_GT(
          torch::eq(mine.to(torch::kFloat32), rounded).to(torch::kFloat32).mean().item<float>(),
          0.95f)
          << "step " << step << ": nearly every element rounds alike";
    }
  }
}

TEST(FusedAdamW, SkipsAParameterWithoutGradient) {
  Twins params({torch::randn({100}), torch::randn({100})});
  FusedAdamW fused(params.fused, AdamWOptions(1e-2).weight_decay(0.1));
  run_steps(fused, params.fused, random_gradients(params.fused, 1, /*steps=*/2));  // the first only
  EXPECT_TRUE(torch::equal(params.fused[1], params.reference[1]))
      << "not even weight decay touches it";
  EXPECT_EQ(fused.state().count(key(params.fused[1])), 0u) << "no state for it";
  EXPECT_EQ(static_cast<AdamWParamState&>(*fused.state().at(key(params.fused[0]))).step(), 2);
}

}  // namespace
