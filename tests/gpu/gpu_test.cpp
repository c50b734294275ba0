// DDP and FSDP on a GPU (issue 14): W ranks must end where one process on the combined batch
// ends, with every tensor on CUDA. At W=1 over NCCL (one GPU per rank) in this process, and at
// W=2 over Gloo with CUDA tensors (both ranks share the one GPU of the device machine; NCCL
// cannot) as two processes under `trainyard run`: ranks as threads of one process cannot train on
// one GPU, since LibTorch runs every CUDA backward of a process on one thread per device, where
// one rank's hook waiting for a collective blocks the other rank's. Every test skips, saying why,
// where the build has no CUDA or no GPU is visible: they run on a GPU machine
// (bench/gpu/device_check.sh), never in CI.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "../multiproc/multiproc_util.h"
#include "../unit/thread_ranks.h"
#include "../unit/tiny_gpt_neox.h"
#include "trainyard/comm/collectives.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/ddp/distributed_data_parallel.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/models/gpt_neox.h"

namespace {

using trainyard::fsdp::FsdpOptions;
using trainyard::fsdp::FullyShardedDataParallel;
using trainyard::fsdp::ShardingStrategy;
using trainyard::models::GptNeoX;
using trainyard::models::GptNeoXInit;
using trainyard::models::GptNeoXLayerImpl;
using Params = std::map<std::string, torch::Tensor>;

constexpr int kSteps = 5;
constexpr std::int64_t kBatch = 2;  // sequences per rank
constexpr std::int64_t kSeq = 8;
constexpr std::uint64_t kSeed = 7;
constexpr double kLr = 0.05;
// fp32 on the GPU (cuBLAS without TF32, LibTorch's default): the ranks' smaller batches take
// other kernels and summation orders than one process's batch, so five SGD steps differ by more
// ulps than on the CPU (1e-5 there); 1e-4 relative to each tensor's norm still catches any
// missing or doubled gradient, which moves a tensor by 1e-2 or more.
constexpr double kTolerance = 1e-4;

bool have_gpu(std::string* why) {
  if (!torch::cuda::is_available()) {
    *why = "no CUDA: this build's LibTorch has none or no GPU is visible";
    return false;
  }
  return true;
}

#define REQUIRE_GPU()                         \
  do {                                        \
    std::string why;                          \
    if (!have_gpu(&why)) GTEST_SKIP() << why; \
  } while (0)

torch::Device gpu() {
  return torch::Device(torch::kCUDA, 0);
}

torch::Tensor batch_for_step(int step, int world) {
  return trainyard::testing::tiny_gpt_neox_batch(step, world * kBatch, kSeq).to(gpu());
}

torch::optim::SGD make_optimizer(std::vector<torch::Tensor> params) {
  return torch::optim::SGD(std::move(params),
                           torch::optim::SGDOptions(kLr).momentum(0.9).weight_decay(0.01));
}

GptNeoX make_model() {
  return GptNeoX(trainyard::testing::tiny_gpt_neox_config(),
                 GptNeoXInit{.device = gpu(), .seed = kSeed});
}

Params snapshot(torch::nn::Module& m) {
  Params out;
  for (auto& item : m.named_parameters()) out[item.key()] = item.value().detach().to(torch::kCPU);
  return out;
}

// One process on the combined batch, on the GPU.
Params train_reference(int world) {
  auto model = make_model();
  auto opt = make_optimizer(model->parameters());
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    auto ids = batch_for_step(step, world);
    trainyard::models::causal_lm_loss(model->forward(ids), ids).backward();
    opt.step();
  }
  return snapshot(*model);
}

void expect_same(const Params& expected, const Params& actual, const std::string& label) {
  ASSERT_EQ(expected.size(), actual.size()) << label;
  for (const auto& [name, e] : expected) {
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << label << ": no parameter " << name;
    ASSERT_TRUE(it->second.device().is_cpu()) << label << ": " << name;
    const double rel = (e - it->second).norm().item<double>() / (e.norm().item<double>() + 1e-12);
    EXPECT_LT(rel, kTolerance) << label << ": " << name;
  }
}

// Runs fn(rank, group) for W ranks: W=1 over NCCL, W>1 as threads over Gloo, all on cuda:0.
void run_ranks(
    int world,
    bool nccl,
    const std::function<
        void(int, c10::intrusive_ptr<c10d::ProcessGroup>, c10::intrusive_ptr<c10d::Store>)>& fn) {
  if (nccl) {
    ASSERT_EQ(world, 1) << "one GPU: NCCL runs one rank per device";
    auto store = c10::make_intrusive<c10d::HashStore>();
    auto pg = trainyard::make_nccl_group(
        store, 0, 1, gpu(), trainyard::InitOptions{.timeout = std::chrono::seconds(60)});
    EXPECT_EQ(pg->getBackendName(), "nccl");
    fn(0, pg, store);
    return;
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  trainyard::testing::run_thread_ranks(world, [&](int rank, auto pg) { fn(rank, pg, store); });
}

Params train_ddp(int world, bool nccl) {
  Params result;
  run_ranks(world, nccl, [&](int rank, auto pg, auto) {
    auto model = make_model();
    trainyard::ddp::DistributedDataParallel ddp(model, pg);
    auto opt = make_optimizer(model->parameters());
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      auto ids = batch_for_step(step, world).narrow(0, rank * kBatch, kBatch);
      trainyard::models::causal_lm_loss(ddp.forward(ids), ids).backward();
      opt.step();
    }
    for (auto& p : model->parameters()) EXPECT_TRUE(p.device().is_cuda());
    if (rank == 0) result = snapshot(*model);
  });
  return result;
}

Params train_fsdp(int world, bool nccl, ShardingStrategy strategy, bool bf16 = false) {
  Params result;
  run_ranks(world, nccl, [&](int rank, auto pg, auto store) {
    auto model = make_model();
    FsdpOptions options{.sharding = strategy,
                        .wrap = trainyard::fsdp::wrap_modules_of_type<GptNeoXLayerImpl>()};
    if (bf16)
      options.mixed_precision = {.param_dtype = torch::kBFloat16, .reduce_dtype = torch::kFloat32};
    auto groups = trainyard::fsdp::make_fsdp_groups(strategy, pg, store, world);
    FullyShardedDataParallel fsdp(model, groups, options);
    for (auto& p : fsdp.parameters()) EXPECT_TRUE(p.device().is_cuda()) << "a shard left the GPU";
    auto opt = make_optimizer(fsdp.parameters());
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      auto ids = batch_for_step(step, world).narrow(0, rank * kBatch, kBatch);
      trainyard::models::causal_lm_loss(fsdp.forward(ids), ids).backward();
      opt.step();
    }
    auto full = fsdp.full_parameters();
    if (rank == 0)
      for (auto& [name, t] : full) result[name] = t.to(torch::kCPU);
  });
  return result;
}

// FSDP takes a deferred model (CPU shapes without memory) to the GPU named by FsdpOptions.device,
// materialising it unit by unit there: what causal-lm and train_gpt_fsdp do on GPUs.
TEST(GpuFsdp, DeferredModelIsMaterialisedOnFsdpOptionsDevice) {
  REQUIRE_GPU();
  const auto expected = train_reference(1);
  Params result;
  run_ranks(1, /*nccl=*/true, [&](int, auto pg, auto store) {
    GptNeoX model(trainyard::testing::tiny_gpt_neox_config(),
                  GptNeoXInit{.seed = kSeed, .deferred = true});
    FsdpOptions options{.sharding = ShardingStrategy::kFullShard,
                        .wrap = trainyard::fsdp::wrap_modules_of_type<GptNeoXLayerImpl>(),
                        .param_init = [model](const std::string& name,
                                              torch::Tensor& t) { model->init_parameter(name, t); },
                        .device = gpu()};
    auto groups = trainyard::fsdp::make_fsdp_groups(ShardingStrategy::kFullShard, pg, store, 1);
    FullyShardedDataParallel fsdp(model, groups, options);
    for (auto& p : fsdp.parameters()) EXPECT_TRUE(p.device().is_cuda());
    auto opt = make_optimizer(fsdp.parameters());
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      auto ids = batch_for_step(step, 1);
      trainyard::models::causal_lm_loss(fsdp.forward(ids), ids).backward();
      opt.step();
    }
    for (auto& [name, t] : fsdp.full_parameters()) result[name] = t.to(torch::kCPU);
  });
  expect_same(expected, result, "FSDP from a deferred model onto cuda:0");
}

TEST(GpuDdp, MatchesOneProcessAtW1OverNccl) {
  REQUIRE_GPU();
  expect_same(train_reference(1), train_ddp(1, /*nccl=*/true), "DDP W=1 NCCL");
}

TEST(GpuFsdp, FullShardMatchesOneProcessAtW1OverNccl) {
  REQUIRE_GPU();
  expect_same(train_reference(1), train_fsdp(1, true, ShardingStrategy::kFullShard),
              "FSDP FULL_SHARD W=1 NCCL");
}

// The "step N loss X" losses train_gpt_fsdp prints, run as `ranks` processes on the GPU with the
// same total batch (4 sequences) whatever the count: with 2 ranks on one GPU init() takes Gloo.
std::vector<double> gpt_losses(int ranks, const std::string& strategy) {
  auto r = trainyard::mptest::run_program({TRAINYARD_CLI_PATH,
                                           "run",
                                           "--nproc-per-node",
                                           std::to_string(ranks),
                                           "--",
                                           TRAIN_GPT_FSDP_PATH,
                                           "--device",
                                           "cuda",
                                           "--preset",
                                           "tiny",
                                           "--strategy",
                                           strategy,
                                           "--precision",
                                           "fp32",
                                           "--seq-len",
                                           "32",
                                           "--batch-size",
                                           std::to_string(4 / ranks),
                                           "--steps",
                                           "5",
                                           "--lr",
                                           "0.001"},
                                          {}, std::chrono::seconds(150));
  EXPECT_TRUE(r.status.success() && !r.timed_out)
      << strategy << " on " << ranks << " rank(s) failed:\n"
      << r.out << r.err;
  std::vector<double> losses;
  const std::regex line(R"(step (\d+) loss ([-+0-9.eE]+))");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), line), end; it != end; ++it)
    losses.push_back(std::stod((*it)[2]));
  EXPECT_EQ(losses.size(), 5u) << r.out << r.err;
  return losses;
}

TEST(GpuTraining, TwoRanksSharingTheGpuOverGlooMatchOneRankOverNccl) {
  REQUIRE_GPU();
  for (const char* strategy : {"ddp", "full_shard", "shard_grad_op"}) {
    const auto one = gpt_losses(1, strategy);
    const auto two = gpt_losses(2, strategy);
    ASSERT_EQ(one.size(), two.size()) << strategy;
    // fp32; AdamW, whose normalisation lets summation-order noise move a step slightly.
    for (std::size_t i = 0; i < one.size(); ++i)
      EXPECT_NEAR(two[i], one[i], 1e-3 * std::abs(one[i])) << strategy << ", step " << i;
  }
}

TEST(GpuFsdp, Bf16MixedPrecisionFollowsFp32OnTheGpu) {
  REQUIRE_GPU();
  // bf16 parameters for compute, fp32 shards and reduction: within bf16's rounding of fp32.
  const auto fp32 = train_reference(1);
  const auto bf16 = train_fsdp(1, true, ShardingStrategy::kFullShard, /*bf16=*/true);
  ASSERT_EQ(fp32.size(), bf16.size());
  for (const auto& [name, e] : fp32) {
    const double rel =
        (e - bf16.at(name)).norm().item<double>() / (e.norm().item<double>() + 1e-12);
    EXPECT_LT(rel, 2e-2) << name;
  }
}

TEST(GpuCollectives, FlatCollectivesOnCudaTensors) {
  REQUIRE_GPU();
  for (const bool nccl : {true, false}) {
    const int world = nccl ? 1 : 2;
    run_ranks(world, nccl, [&](int rank, auto pg, auto) {
      const std::int64_t n = 1000;
      auto input = torch::arange(n, torch::TensorOptions().dtype(torch::kFloat32).device(gpu())) +
                   1000.0 * rank;
      auto gathered = torch::full({world * n}, -1.0f, input.options());
      trainyard::wait_work(trainyard::comm::all_gather_flat(pg, gathered, input));
      for (int r = 0; r < world; ++r)
        EXPECT_TRUE(torch::equal(gathered.narrow(0, r * n, n).cpu(),
                                 (torch::arange(n, torch::kFloat32) + 1000.0 * r)))
            << (nccl ? "NCCL" : "Gloo") << " all_gather_flat, slot " << r;
      auto full = torch::ones({world * n}, input.options()) * (rank + 1);
      auto out = torch::full({n}, -1.0f, input.options());
      trainyard::wait_work(trainyard::comm::reduce_scatter_flat(pg, out, full));
      const float expected = static_cast<float>(world * (world + 1) / 2);
      EXPECT_TRUE(out.device().is_cuda());
      EXPECT_TRUE(torch::allclose(out.cpu(), torch::full({n}, expected)))
          << (nccl ? "NCCL" : "Gloo") << " reduce_scatter_flat";
    });
  }
}

TEST(GpuInit, NcclNeedsAGpuPerRank) {
  REQUIRE_GPU();
  trainyard::InitOptions o{.device = "cuda", .backend = "nccl"};
  const int gpus = static_cast<int>(torch::cuda::device_count());
  try {
    trainyard::use_nccl(o, gpu(), gpus + 1);
    FAIL() << "no error for more ranks than GPUs";
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL needs a GPU per rank"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(trainyard::use_nccl(trainyard::InitOptions{.device = "cuda"}, gpu(), gpus + 1))
      << "auto falls back to Gloo when ranks must share GPUs";
}

// Runs everywhere (CI included): where there is no GPU, asking for one is an error naming the fix.
TEST(GpuInit, CudaWithoutAGpuIsAClearError) {
  std::string why;
  if (have_gpu(&why)) GTEST_SKIP() << "this machine has a GPU";
  try {
    trainyard::resolve_device(trainyard::InitOptions{.device = "cuda"}, 0);
    FAIL() << "no error for --device cuda without a GPU";
  } catch (const trainyard::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sees no GPU"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--device cpu"), std::string::npos) << e.what();
  }
  EXPECT_THROW(trainyard::resolve_device(trainyard::InitOptions{.device = "tpu"}, 0),
               trainyard::InvalidArgumentError);
  EXPECT_EQ(trainyard::resolve_device(trainyard::InitOptions{}, 3), torch::Device(torch::kCPU));
}

}  // namespace
