// FullyShardedDataParallel equivalence: W ranks (threads over an in-memory store, real Gloo
// groups) each with batch B, under every sharding strategy, must end where one process with
// batch W*B ends, on the small GPT-NeoX of tiny_gpt_neox.h.
#include <gtest/gtest.h>

#include <torch/torch.h>
#include <mutex>

#include <functional>
#include <map>

#include "thread_ranks.h"
#include "tiny_gpt_neox.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/models/gpt_neox.h"
#include "trainyard/nn/unit_hook.h"
#include "trainyard/optim/state_key.h"

namespace {

using trainyard::Strategy;
using trainyard::fsdp::BackwardPrefetch;
using trainyard::fsdp::FsdpOptions;
using trainyard::fsdp::FullyShardedDataParallel;
using trainyard::models::GptNeoX;
using trainyard::models::GptNeoXConfig;
using trainyard::models::GptNeoXLayerImpl;

constexpr int kSteps = 5;
constexpr std::int64_t kBatch = 2;  // sequences per rank
constexpr std::int64_t kSeq = 8;
constexpr std::uint64_t kSeed = 7;
constexpr double kLr = 0.05;
// fp32 sums taken in a different order (shard by shard, rank by rank) differ by a few ulps;
// five SGD steps keep that far below this bound relative to each tensor's norm. (Adam would not:
// the key part of query_key_value.bias has an exactly zero true gradient, so its gradient is
// rounding noise, which Adam's normalisation turns into full-size steps of either sign.)
constexpr double kTolerance = 1e-5;

GptNeoXConfig tiny_config() {
  return trainyard::testing::tiny_gpt_neox_config();
}

// (world * kBatch, kSeq): rank r trains on rows [r * kBatch, (r + 1) * kBatch) of step `step`.
torch::Tensor batch_for_step(int step, int world) {
  return trainyard::testing::tiny_gpt_neox_batch(step, world * kBatch, kSeq);
}

struct RunOptions {
  int steps = kSteps;
  int micro_batches = 1;  // > 1: gradient accumulation (no_sync for all but the last)
  double clip = 0;        // > 0: clip by global norm
  std::string frozen;     // a parameter to freeze, by name
  bool shm = false;       // ranks' groups through shared memory (ShmProcessGroup)
  std::vector<double>* losses = nullptr;  // rank 0's loss of every step
  // Called on every rank after the last step.
  std::function<void(trainyard::fsdp::FullyShardedDataParallelBase&, torch::optim::Optimizer&)>
      inspect;
};

using Params = std::map<std::string, torch::Tensor>;

torch::optim::SGD make_optimizer(std::vector<torch::Tensor> params) {
  return torch::optim::SGD(std::move(params),
                           torch::optim::SGDOptions(kLr).momentum(0.9).weight_decay(0.01));
}

// One process on the combined batch.
Params train_reference(int world, const RunOptions& run, std::vector<double>* norms = nullptr) {
  GptNeoX model(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed});
  if (!run.frozen.empty()) model->named_parameters()[run.frozen].set_requires_grad(false);
  std::vector<torch::Tensor> trainable;
  for (auto& p : model->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  auto opt = make_optimizer(trainable);
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    auto ids = batch_for_step(step, world);
    trainyard::models::causal_lm_loss(model->forward(ids), ids).backward();
    if (run.clip > 0) {
      auto norm = torch::nn::utils::clip_grad_norm_(trainable, run.clip);
      if (norms) norms->push_back(norm);
    }
    opt.step();
  }
  Params out;
  for (auto& item : model->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

// W ranks with FSDP; returns rank 0's full parameters.
Params train_fsdp(int world,
                  FsdpOptions options,
                  const RunOptions& run,
                  int local_world_size = 0,
                  std::vector<double>* norms = nullptr,
                  trainyard::fsdp::FsdpStats* stats = nullptr) {
  Params result;
  auto store = c10::make_intrusive<c10d::HashStore>();
  trainyard::testing::run_thread_ranks(
      world,
      [&](int rank, auto pg) {
        GptNeoX model(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed});
        if (!run.frozen.empty()) model->named_parameters()[run.frozen].set_requires_grad(false);
        auto groups = trainyard::fsdp::make_fsdp_groups(
            options.sharding, pg, store, local_world_size ? local_world_size : world);
        FullyShardedDataParallel fsdp(model, groups, options);
        auto opt = make_optimizer(fsdp.parameters());
        for (int step = 0; step < run.steps; ++step) {
          opt.zero_grad();
          auto mine = batch_for_step(step, world).narrow(0, rank * kBatch, kBatch);
          const std::int64_t rows = kBatch / run.micro_batches;
          for (int m = 0; m < run.micro_batches; ++m) {
            auto ids = mine.narrow(0, m * rows, rows);
            auto backward = [&] {
              auto loss = trainyard::models::causal_lm_loss(fsdp.forward(ids), ids);
              if (run.losses && rank == 0) run.losses->push_back(loss.template item<double>());
              (loss / run.micro_batches).backward();
            };
            if (m + 1 < run.micro_batches) {
              auto guard = fsdp.no_sync();
              backward();
            } else {
              backward();
            }
          }
          if (run.clip > 0) {
            double norm = fsdp.clip_grad_norm_(run.clip);
            if (norms && rank == 0) norms->push_back(norm);
          }
          opt.step();
          if (stats && rank == 0 && step == run.steps - 1) *stats = fsdp.last_stats();
        }
        if (run.inspect) run.inspect(fsdp, opt);
        auto full = fsdp.full_parameters();
        if (rank == 0)
          for (auto& [name, t] : full) result[name] = t;
      },
      trainyard::testing::ThreadRankOptions{.shm = run.shm});
  return result;
}

void expect_same(const Params& expected, const Params& actual, const std::string& label) {
  ASSERT_EQ(expected.size(), actual.size()) << label;
  for (const auto& [name, e] : expected) {
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << label << ": FSDP has no parameter " << name;
    ASSERT_EQ(e.sizes(), it->second.sizes()) << label << ": " << name;
    double rel = (e - it->second).norm().item<double>() / (e.norm().item<double>() + 1e-12);
    EXPECT_LT(rel, kTolerance) << label << ": " << name;
  }
}

FsdpOptions layer_units(Strategy strategy) {
  return FsdpOptions{.sharding = strategy,
                     .wrap = trainyard::fsdp::wrap_modules_of_type<GptNeoXLayerImpl>()};
}

std::string strategy_name(Strategy s) {
  return std::string(trainyard::to_string(s));
}

class FsdpEquivalence : public ::testing::TestWithParam<std::tuple<Strategy, int>> {};

TEST_P(FsdpEquivalence, MatchesOneProcessOnTheCombinedBatch) {
  auto [strategy, world] = GetParam();
  auto expected = train_reference(world, {});
  auto actual = train_fsdp(world, layer_units(strategy), {});
  expect_same(expected, actual,
              std::string(strategy_name(strategy)) + " W=" + std::to_string(world));
}

INSTANTIATE_TEST_SUITE_P(StrategiesAndWorldSizes,
                         FsdpEquivalence,
                         ::testing::Combine(::testing::Values(Strategy::kFullShard,
                                                              Strategy::kShardGradOp,
                                                              Strategy::kNoShard),
                                            ::testing::Values(1, 2, 3)));

TEST(Fsdp, SharedMemoryGroupsMatchOneProcess) {
  auto expected = train_reference(3, {});
  for (auto strategy : {Strategy::kFullShard, Strategy::kShardGradOp})
    expect_same(expected, train_fsdp(3, layer_units(strategy), {.shm = true}),
                std::string("shm ") + strategy_name(strategy));
}

// bf16 compute (oneDNN matmuls) with fp32 shards and fp32-accumulated reductions: the loss
// follows the fp32 run's within 2% (bf16 keeps 8 bits of mantissa, 0.4% per rounding) over 20
// steps.
TEST(Fsdp, Bf16MixedPrecisionFollowsFp32) {
  std::vector<double> fp32, bf16;
  auto options = layer_units(Strategy::kFullShard);
  train_fsdp(2, options, {.steps = 20, .losses = &fp32});
  options.mixed_precision = {.param_dtype = torch::kBFloat16, .reduce_dtype = torch::kFloat32};
  train_fsdp(2, options, {.steps = 20, .losses = &bf16});
  ASSERT_EQ(fp32.size(), 20u);
  ASSERT_EQ(bf16.size(), 20u);
  for (std::size_t i = 0; i < fp32.size(); ++i)
    EXPECT_NEAR(bf16[i], fp32[i], 0.02 * fp32[i]) << "step " << i;
  EXPECT_NE(bf16, fp32);  // bf16 really computed
}

// Pure bf16 (Note [Pure bf16]): the shards, their gradients and the optimizer's momentum are
// bf16, so a rank holds 4 bytes per shard element between steps instead of 8, and the loss still
// follows the fp32 run's within 3% over 20 steps (SGD's steps here are ~1% of a weight, well
// above bf16's rounding of 0.2%).
TEST(Fsdp, PureBf16HoldsBf16ShardsAndFollowsFp32) {
  std::vector<double> fp32, pure;
  auto options = layer_units(Strategy::kFullShard);
  train_fsdp(2, options, {.steps = 20, .losses = &fp32});
  options.mixed_precision = {.param_dtype = torch::kBFloat16,
                             .reduce_dtype = torch::kBFloat16,
                             .shard_dtype = torch::kBFloat16};
  std::mutex mutex;
  std::int64_t elements = 0, state_bytes = 0;
  auto inspect = [&](trainyard::fsdp::FullyShardedDataParallelBase& fsdp,
                     torch::optim::Optimizer& opt) {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& p : fsdp.parameters()) {
      EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
      EXPECT_EQ(p.grad().scalar_type(), torch::kBFloat16);
      auto& state = static_cast<torch::optim::SGDParamState&>(
          *opt.state().at(trainyard::optim::optimizer_state_key(p)));
      EXPECT_EQ(state.momentum_buffer().scalar_type(), torch::kBFloat16);
      elements += p.numel();
    }
    state_bytes += fsdp.sharded_state_bytes();
  };
  train_fsdp(2, options, {.steps = 20, .losses = &pure, .inspect = inspect});
  EXPECT_EQ(state_bytes, 4 * elements) << "2 bytes of weight and 2 of gradient per element";
  ASSERT_EQ(fp32.size(), 20u);
  ASSERT_EQ(pure.size(), 20u);
  for (std::size_t i = 0; i < fp32.size(); ++i)
    EXPECT_NEAR(pure[i], fp32[i], 0.03 * fp32[i]) << "step " << i;
  EXPECT_NE(pure, fp32);  // bf16 really computed
}

// Between steps a rank holds its fp32 shards and their gradients: 8 bytes per element / W, plus
// padding. While running, at most the root and two units are gathered (limit_all_gathers), and
// at most three flat gradients await their reduction (Note [Settling reductions]), not all four.
TEST(Fsdp, MemoryStaysWithinTheShardedBounds) {
  const int world = 3;
  GptNeoX model(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed});
  std::int64_t total = 0, largest_layer = 0;
  for (auto& p : model->parameters()) total += p.numel();
  for (auto& layer : *model->gpt_neox->layers) {
    std::int64_t n = 0;
    for (auto& p : layer->parameters()) n += p.numel();
    largest_layer = std::max(largest_layer, n);
  }
  const std::int64_t root = total - largest_layer * tiny_config().num_hidden_layers;
  trainyard::testing::run_thread_ranks(world, [&](int rank, auto pg) {
    GptNeoX m(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed});
    auto options = layer_units(Strategy::kFullShard);
    options.forward_prefetch = true;
    FullyShardedDataParallel fsdp(m, trainyard::fsdp::FsdpGroups{.shard = pg, .world_size = world},
                                  options);
    auto opt = make_optimizer(fsdp.parameters());
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      auto ids = batch_for_step(step, world).narrow(0, rank * kBatch, kBatch);
      trainyard::models::causal_lm_loss(fsdp.forward(ids), ids).backward();
      opt.step();
    }
    const double ideal = 8.0 * total / world;
    EXPECT_LT(std::abs(fsdp.sharded_state_bytes() - ideal), 0.01 * ideal + 8 * 8 * world);
    const std::int64_t units = 4 * ((largest_layer + world - 1) / world * world);
    const std::int64_t root_bytes = 4 * ((root + world - 1) / world * world);
    EXPECT_LE(fsdp.last_stats().peak_gathered_bytes, root_bytes + 2 * units);
    EXPECT_GT(fsdp.last_stats().peak_gathered_bytes, root_bytes + units);  // a prefetch overlapped
    // Holding every unit's (root_bytes + 3 * units) would exceed this.
    EXPECT_LE(fsdp.last_stats().peak_reduction_bytes, 3 * std::max(root_bytes, units));
    EXPECT_GE(fsdp.last_stats().peak_reduction_bytes, std::max(root_bytes, units));
  });
}

TEST(Fsdp, HybridShardOnTwoNodesOfTwoMatchesOneProcess) {
  auto expected = train_reference(4, {});
  for (auto strategy : {Strategy::kHybridShard, Strategy::kHybridShardGradOp}) {
    auto actual = train_fsdp(4, layer_units(strategy), {}, /*local_world_size=*/2);
    expect_same(expected, actual, strategy_name(strategy));
  }
}

TEST(Fsdp, ActivationCheckpointingAndPrefetchChangeNothing) {
  auto expected = train_reference(2, {});
  auto options = layer_units(Strategy::kFullShard);
  options.activation_checkpointing = true;
  options.forward_prefetch = true;
  for (auto prefetch :
       {BackwardPrefetch::kBackwardPre, BackwardPrefetch::kBackwardPost, BackwardPrefetch::kNone}) {
    options.backward_prefetch = prefetch;
    trainyard::fsdp::FsdpStats stats;
    auto actual = train_fsdp(2, options, {}, 0, nullptr, &stats);
    expect_same(expected, actual, "checkpointing, prefetch " + std::to_string(int(prefetch)));
    if (prefetch != BackwardPrefetch::kNone) {
      EXPECT_GT(stats.prefetches, 0);
    }
  }
}

TEST(Fsdp, GradientAccumulationWithNoSyncMatches) {
  auto expected = train_reference(2, {});
  auto actual = train_fsdp(2, layer_units(Strategy::kFullShard), {.micro_batches = 2});
  expect_same(expected, actual, "no_sync");
}

TEST(Fsdp, AFrozenParameterSharesAUnitAndStaysUnchanged) {
  const std::string frozen = "gpt_neox.layers.1.attention.dense.weight";
  auto expected = train_reference(2, {.frozen = frozen});
  auto actual = train_fsdp(2, layer_units(Strategy::kFullShard), {.frozen = frozen});
  expect_same(expected, actual, "frozen");
  GptNeoX initial(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed});
  EXPECT_TRUE(torch::equal(actual[frozen], initial->named_parameters()[frozen]));
}

TEST(Fsdp, ClippingEqualsSingleProcessClipping) {
  std::vector<double> expected_norms, norms;
  auto expected = train_reference(3, {.clip = 0.05}, &expected_norms);
  auto actual = train_fsdp(3, layer_units(Strategy::kFullShard), {.clip = 0.05}, 0, &norms);
  expect_same(expected, actual, "clipped");
  ASSERT_EQ(expected_norms.size(), norms.size());
  for (std::size_t i = 0; i < norms.size(); ++i) {
    EXPECT_NEAR(norms[i], expected_norms[i], 1e-5 * expected_norms[i]);
    EXPECT_GT(expected_norms[i], 0.05);  // the clip really acted
  }
}

// Elements this rank sends per iteration: (W-1)/W of every buffer per all-gather and per
// reduce-scatter. Units are gathered for forward and (FULL_SHARD) again for backward; the root
// stays gathered from forward to the end of backward, so it is gathered once.
TEST(Fsdp, CommunicationVolumeFollowsTheFormula) {
  const int world = 2;
  for (auto strategy : {Strategy::kFullShard, Strategy::kShardGradOp}) {
    trainyard::fsdp::FsdpStats stats;
    std::int64_t root_padded = 0, units_padded = 0;
    int units = 0;
    {
      GptNeoX model(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed});
      auto pad = [&](std::int64_t n) { return (n + world - 1) / world * world; };
      for (auto& layer : *model->gpt_neox->layers) {
        std::int64_t n = 0;
        for (auto& p : layer->parameters()) n += p.numel();
        units_padded += pad(n);
        ++units;
      }
      std::int64_t all = 0;
      for (auto& p : model->parameters()) all += p.numel();
      std::int64_t in_units = 0;
      for (auto& layer : *model->gpt_neox->layers)
        for (auto& p : layer->parameters()) in_units += p.numel();
      root_padded = pad(all - in_units);
    }
    train_fsdp(world, layer_units(strategy), {}, 0, nullptr, &stats);
    const int unit_gathers = strategy == Strategy::kFullShard ? 2 : 1;
    EXPECT_EQ(stats.all_gathers, 1 + units * unit_gathers) << strategy_name(strategy);
    EXPECT_EQ(stats.reduce_scatters, 1 + units) << strategy_name(strategy);
    const std::int64_t expected =
        (root_padded * 2 + units_padded * (unit_gathers + 1)) * (world - 1) / world;
    EXPECT_EQ(stats.comm_elements, expected) << strategy_name(strategy);
  }
}

TEST(Fsdp, AWrapPolicyNamingAMissingModuleIsAnError) {
  GptNeoX model(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed});
  trainyard::testing::run_thread_ranks(1, [&](int, auto pg) {
    try {
      FullyShardedDataParallel fsdp(
          model, trainyard::fsdp::FsdpGroups{.shard = pg, .world_size = 1},
          FsdpOptions{.wrap = trainyard::fsdp::wrap_modules_named({"gpt_neox.layers.9"})});
      FAIL() << "expected an error";
    } catch (const trainyard::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("'gpt_neox.layers.9'"), std::string::npos) << e.what();
    }
  });
}

// FsdpOptions.device is checked before anything is allocated, so both errors show without a GPU:
// a device without an index, and a parameter with values that is not on the device named.
TEST(Fsdp, ADeviceWithoutIndexOrAParameterElsewhereIsAnError) {
  GptNeoX model(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed});
  trainyard::testing::run_thread_ranks(1, [&](int, auto pg) {
    const std::pair<torch::Device, std::string> cases[] = {
        {torch::Device(torch::kCUDA), "FsdpOptions.device must name a device index"},
        {torch::Device(torch::kCUDA, 0), "is on cpu, but FsdpOptions.device is cuda:0"}};
    for (const auto& [device, message] : cases) {
      try {
        FullyShardedDataParallel fsdp(model,
                                      trainyard::fsdp::FsdpGroups{.shard = pg, .world_size = 1},
                                      FsdpOptions{.device = device});
        FAIL() << "expected an error for " << device;
      } catch (const trainyard::InvalidArgumentError& e) {
        EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      }
    }
  });
}

// The embeddings as units of their own (wrap_any_of), with activation checkpointing (which skips
// the token-id-fed embedding) and prefetch: still the one-process result.
TEST(Fsdp, EmbeddingsAsUnitsMatchOneProcess) {
  auto expected = train_reference(3, {});
  for (bool recompute : {false, true}) {
    FsdpOptions options{
        .wrap = trainyard::fsdp::wrap_any_of(
            {trainyard::fsdp::wrap_modules_of_type<GptNeoXLayerImpl>(),
             trainyard::fsdp::wrap_modules_named({"gpt_neox.embed_in", "embed_out"})}),
        .forward_prefetch = true,
        .activation_checkpointing = recompute};
    trainyard::fsdp::FsdpStats stats;
    auto actual = train_fsdp(3, options, {}, 0, nullptr, &stats);
    expect_same(expected, actual, recompute ? "embeddings as units, recomputed" : "embeddings");
    EXPECT_EQ(stats.reduce_scatters, 6) << "root, embed_in, 3 layers, embed_out";
  }
}

// A deferred model holds no parameter memory; FSDP initialises it one unit at a time from the
// per-name initialiser, so every world size gets exactly the eagerly built values.
TEST(Fsdp, DeferredModelIsMaterialisedUnitByUnitWithTheEagerValues) {
  Params eager;
  {
    GptNeoX model(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed});
    for (auto& item : model->named_parameters()) eager[item.key()] = item.value().detach().clone();
  }
  for (int world : {1, 2, 3}) {
    Params actual;
    auto store = c10::make_intrusive<c10d::HashStore>();
    trainyard::testing::run_thread_ranks(world, [&](int rank, auto pg) {
      GptNeoX model(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed, .deferred = true});
      auto held = [&] {
        std::int64_t bytes = 0;
        for (auto& p : model->parameters()) bytes += p.storage().nbytes();
        return bytes;
      };
      EXPECT_EQ(held(), 0) << "a deferred model allocates nothing";
      if (rank == 0) {
        try {
          model->forward(batch_for_step(0, 1));
          ADD_FAILURE() << "a deferred model ran without FSDP";
        } catch (const trainyard::InvalidArgumentError& e) {
          EXPECT_NE(std::string(e.what()).find("runs only under FullyShardedDataParallel"),
                    std::string::npos)
              << e.what();
        }
      }
      auto options = layer_units(Strategy::kFullShard);
      options.param_init = [model](const std::string& name, torch::Tensor& t) {
        model->init_parameter(name, t);
      };
      FullyShardedDataParallel fsdp(
          model, trainyard::fsdp::make_fsdp_groups(options.sharding, pg, store, world), options);
      if (world > 1) {
        EXPECT_EQ(held(), 0) << "between steps only the shards hold values";
      }
      auto full = fsdp.full_parameters();
      if (rank == 0)
        for (auto& [name, t] : full) actual[name] = t;
    });
    ASSERT_EQ(actual.size(), eager.size());
    for (const auto& [name, t] : eager)
      EXPECT_TRUE(torch::equal(t, actual.at(name))) << "W=" << world << ": " << name;
  }
}

// With a slice initialiser each rank is asked only for the elements of its own shards (disjoint
// across the ranks, together every element once), and the model equals the eager one.
TEST(Fsdp, DeferredModelIsReadSliceBySliceIntoEachRanksShards) {
  Params eager;
  std::int64_t total = 0;
  {
    GptNeoX model(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed});
    for (auto& item : model->named_parameters()) {
      eager[item.key()] = item.value().detach().clone();
      total += item.value().numel();
    }
  }
  for (int world : {1, 2, 3}) {
    Params actual;
    std::vector<std::int64_t> asked(static_cast<std::size_t>(world), 0);
    std::mutex mu;
    std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>> slices;
    auto store = c10::make_intrusive<c10d::HashStore>();
    trainyard::testing::run_thread_ranks(world, [&](int rank, auto pg) {
      GptNeoX model(tiny_config(), trainyard::models::GptNeoXInit{.seed = kSeed, .deferred = true});
      auto options = layer_units(Strategy::kFullShard);
      options.param_slice_init = [&, rank](const std::string& name, std::int64_t begin,
                                           std::int64_t count, float* dst) {
        auto flat = eager.at(name).reshape({-1}).narrow(0, begin, count);
        std::copy_n(flat.data_ptr<float>(), count, dst);
        std::lock_guard<std::mutex> lock(mu);
        asked[static_cast<std::size_t>(rank)] += count;
        slices[name].emplace_back(begin, begin + count);
      };
      FullyShardedDataParallel fsdp(
          model, trainyard::fsdp::make_fsdp_groups(options.sharding, pg, store, world), options);
      auto full = fsdp.full_parameters();
      if (rank == 0)
        for (auto& [name, t] : full) actual[name] = t;
    });
    ASSERT_EQ(actual.size(), eager.size());
    for (const auto& [name, t] : eager)
      EXPECT_TRUE(torch::equal(t, actual.at(name))) << "W=" << world << ": " << name;
    std::int64_t sum = 0;
    for (auto a : asked) {
      EXPECT_LE(a, total / world + 64 * 8) << "W=" << world << ": a rank reads about its share";
      sum += a;
    }
    EXPECT_EQ(sum, total) << "W=" << world << ": every element is read once";
    for (auto& [name, ranges] : slices) {
      std::sort(ranges.begin(), ranges.end());
      std::int64_t next = 0;
      for (auto [b, e] : ranges) {
        EXPECT_EQ(b, next) << name << ": slices are disjoint and cover the parameter";
        next = e;
      }
      EXPECT_EQ(next, eager.at(name).numel()) << name;
    }
  }
}

}  // namespace

// Two linear units in a chain, whose backward can be made to fail between them.
struct FailingChain : torch::nn::Module {
  FailingChain() {
    a = register_module("a", torch::nn::Linear(4, 4));
    b = register_module("b", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = trainyard::nn::call_unit(
        *a, x, [a = a](const torch::Tensor& t) mutable { return a->forward(t); });
    h.register_hook([this](const torch::Tensor& g) {
      if (fail) throw std::runtime_error("injected failure between the units' backward");
      return g;
    });
    return trainyard::nn::call_unit(
        *b, h, [b = b](const torch::Tensor& t) mutable { return b->forward(t); });
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
  bool fail = false;
};

// Unit b's gradient reaches its shard before the failure (Note [Settling reductions]); the next
// forward abandons the backward and must leave no shard with that partial gradient.
TEST(Fsdp, AFailedBackwardLeavesNoPartialGradient) {
  trainyard::testing::run_thread_ranks(1, [&](int, auto pg) {
    auto chain = std::make_shared<FailingChain>();
    FullyShardedDataParallel fsdp(
        chain, trainyard::fsdp::FsdpGroups{.shard = pg, .world_size = 1},
        FsdpOptions{.wrap = trainyard::fsdp::wrap_modules_named({"a", "b"})});
    auto x = torch::ones({2, 4});
    chain->fail = true;
    EXPECT_THROW(fsdp.forward(x).sum().backward(), std::exception);
    bool partial = false;
    for (auto& p : fsdp.parameters()) partial = partial || p.grad().defined();
    EXPECT_TRUE(partial);  // b's arrived before the failure
    chain->fail = false;
    auto loss = fsdp.forward(x).sum();  // abandons the failed backward
    for (auto& p : fsdp.parameters()) EXPECT_FALSE(p.grad().defined());
    loss.backward();
    for (auto& p : fsdp.parameters()) EXPECT_TRUE(p.grad().defined());
  });
}
