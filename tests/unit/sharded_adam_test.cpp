// ShardedAdam: W ranks that each update their share of the parameters end with exactly the
// parameters of one unsharded FusedAdam, through real backward passes (the parameters' move into
// flat buffers keeps autograd working); its checkpoints move between world sizes and to and from
// an unsharded optimizer. Ranks are threads (thread_ranks.h), over Gloo or shared memory.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>

#include "thread_ranks.h"
#include "trainyard/checkpoint/torch_state.h"
#include "trainyard/error.h"
#include "trainyard/optim/fused_adam.h"
#include "trainyard/optim/sharded_adam.h"

namespace {

using trainyard::optim::FusedAdam;
using trainyard::optim::ShardedAdam;

torch::nn::Sequential make_model() {
  // Rank threads draw from the one global generator: one at a time, so every rank's model is the
  // same, as DDP's broadcast would make it.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(11);
  // Parameters of very different sizes (5,000 down to 3 elements), so shares are uneven.
  return torch::nn::Sequential(torch::nn::Linear(50, 100), torch::nn::Tanh(),
                               torch::nn::Linear(100, 3));
}

// The same batch on every rank, so every rank's gradients are what DDP would average to.
torch::Tensor loss_at(torch::nn::Sequential& model, int step) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  auto x = at::randn({16, 50}, gen);
  auto y = at::randn({16, 3}, gen);
  return (model->forward(x) - y).pow(2).mean();
}

// Steps [first, last) of the training loop every run here shares.
template <typename Optimizer>
void train(torch::nn::Sequential& model, Optimizer& adam, int first, int last) {
  for (int step = first; step < last; ++step) {
    adam.zero_grad();
    loss_at(model, step).backward();
    adam.step();
  }
}

void expect_parameters(torch::nn::Sequential& model,
                       const std::vector<torch::Tensor>& expected,
                       const std::string& who) {
  auto params = model->parameters();
  for (std::size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::equal(params[i], expected[i])) << who << ", parameter " << i;
}

// `steps` steps of one unsharded FusedAdam from the model's initial state; the parameters.
std::vector<torch::Tensor> reference_run(const torch::optim::AdamOptions& options, int steps) {
  auto model = make_model();
  FusedAdam adam(model->parameters(), options);
  train(model, adam, 0, steps);
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

struct ShardedCase {
  int world;
  bool shm;
  bool amsgrad;
};
class ShardedAdamMatches : public ::testing::TestWithParam<ShardedCase> {};

TEST_P(ShardedAdamMatches, OneUnshardedAdamBitForBit) {
  const auto c = GetParam();
  const auto options = torch::optim::AdamOptions(1e-2).weight_decay(0.01).amsgrad(c.amsgrad);
  const auto expected = reference_run(options, 6);
  trainyard::testing::run_thread_ranks(c.world,
                                       [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
                                         auto model = make_model();
                                         ShardedAdam adam(model->parameters(), options, pg);
                                         train(model, adam, 0, 6);
                                         expect_parameters(model, expected,
                                                           "rank " + std::to_string(rank));
                                       },
                                       {.shm = c.shm});
}

INSTANTIATE_TEST_SUITE_P(WorldSizes,
                         ShardedAdamMatches,
                         ::testing::Values(ShardedCase{1, false, false},
                                           ShardedCase{2, false, false},
                                           ShardedCase{2, true, false},
                                           ShardedCase{3, true, false},
                                           ShardedCase{3, false, true},
                                           ShardedCase{2, true, true}));

TEST(ShardedAdam, SharesTheElementsAndOwnsEachParameterOnce) {
  std::vector<std::int64_t> owned(3);
  std::vector<std::vector<int>> owners(3);
  trainyard::testing::run_thread_ranks(3, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    auto model = make_model();
    ShardedAdam adam(model->parameters(), torch::optim::AdamOptions(1e-3), pg);
    owned[rank] = adam.owned_numel();
    for (std::size_t i = 0; i < model->parameters().size(); ++i)
      owners[rank].push_back(adam.owner(i));
  });
  EXPECT_EQ(owners[0], owners[1]);
  EXPECT_EQ(owners[0], owners[2]);
  // 5,000 + 100 + 300 + 3 elements: the big weight alone on one rank, the rest on the others.
  EXPECT_EQ(owned[0] + owned[1] + owned[2], 5403);
  EXPECT_EQ(*std::max_element(owned.begin(), owned.end()), 5000);
}

// A checkpoint taken by 2 sharded ranks after 3 steps, resumed by 3 sharded ranks and by one
// unsharded FusedAdam for 3 more: all equal to 6 uninterrupted steps.
TEST(ShardedAdam, CheckpointsMoveBetweenWorldSizesAndUnshardedAdam) {
  const auto options = torch::optim::AdamOptions(1e-2).amsgrad(true);
  const auto expected = reference_run(options, 6);
  std::string optimizer_bytes;
  std::string model_bytes;
  trainyard::testing::run_thread_ranks(2,
                                       [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
                                         auto model = make_model();
                                         ShardedAdam adam(model->parameters(), options, pg);
                                         train(model, adam, 0, 3);
                                         auto bytes = adam.state_to_bytes(/*root=*/1);
                                         EXPECT_EQ(bytes.empty(), rank != 1);
                                         if (rank == 1) {
                                           optimizer_bytes = bytes;
                                           model_bytes =
                                               trainyard::checkpoint::module_to_bytes(*model);
                                         }
                                       },
                                       {.shm = true});
  ASSERT_FALSE(optimizer_bytes.empty());

  trainyard::testing::run_thread_ranks(
      3,
      [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
        auto model = make_model();
        ShardedAdam adam(model->parameters(), options, pg);
        // Loaded after the move into flat buffers: Module::load gives the parameters new
        // storage, which the next step moves back.
        trainyard::checkpoint::load_module(*model, model_bytes, "model");
        adam.load_state_bytes(optimizer_bytes, "optimizer");
        train(model, adam, 3, 6);
        expect_parameters(model, expected, "resumed rank " + std::to_string(rank));
      },
      {.shm = true});

  // The same bytes are an ordinary Adam checkpoint.
  auto model = make_model();
  trainyard::checkpoint::load_module(*model, model_bytes, "model");
  FusedAdam adam(model->parameters(), options);
  trainyard::checkpoint::load_optimizer(adam, optimizer_bytes, "optimizer");
  train(model, adam, 3, 6);
  expect_parameters(model, expected, "unsharded");
}

TEST(ShardedAdam, ACorruptStateIsACheckpointError) {
  trainyard::testing::run_thread_ranks(1, [](int, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    auto model = make_model();
    ShardedAdam adam(model->parameters(), torch::optim::AdamOptions(1e-3), pg);
    EXPECT_THROW(adam.load_state_bytes("not an archive", "optimizer.pt"),
                 trainyard::CheckpointCorruptError);
  });
}

}  // namespace
