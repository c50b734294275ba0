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
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "../multiproc/multiproc_util.h"
#include "../unit/thread_ranks.h"
#include "../unit/tiny_gpt_neox.h"
#include "require_gpu.h"
#include "trainyard/cluster/node_resources.h"
#include "trainyard/comm/collectives.h"
#include "trainyard/comm/device_work_beacon.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/ddp/distributed_data_parallel.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/metrics/names.h"
#include "trainyard/metrics/node_sampler.h"
#include "trainyard/models/gpt_neox.h"

namespace {

using trainyard::Strategy;
using trainyard::fsdp::FsdpOptions;
using trainyard::fsdp::FullyShardedDataParallel;
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

using trainyard::testing::have_gpu;

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

GptNeoX make_model(double hidden_dropout = 0) {
  auto config = trainyard::testing::tiny_gpt_neox_config();
  config.hidden_dropout = hidden_dropout;
  return GptNeoX(config, GptNeoXInit{.device = gpu(), .seed = kSeed});
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

// How train_fsdp trains, besides the defaults.
struct FsdpRun {
  bool bf16 = false;          // bf16 parameters for compute, fp32 reduction
  bool recompute = false;     // FsdpOptions.activation_checkpointing
  double hidden_dropout = 0;  // > 0: the generators are seeded before the first step
};

Params train_fsdp(int world, bool nccl, Strategy strategy, FsdpRun run = {}) {
  Params result;
  run_ranks(world, nccl, [&](int rank, auto pg, auto store) {
    auto model = make_model(run.hidden_dropout);
    FsdpOptions options{.sharding = strategy,
                        .wrap = trainyard::fsdp::wrap_modules_of_type<GptNeoXLayerImpl>()};
    if (run.bf16)
      options.mixed_precision = {.param_dtype = torch::kBFloat16, .reduce_dtype = torch::kFloat32};
    options.activation_checkpointing = run.recompute;
    auto groups = trainyard::fsdp::make_fsdp_groups(strategy, pg, store, world);
    FullyShardedDataParallel fsdp(model, groups, options);
    for (auto& p : fsdp.parameters()) EXPECT_TRUE(p.device().is_cuda()) << "a shard left the GPU";
    auto opt = make_optimizer(fsdp.parameters());
    // The CUDA generator's too: the same dropout masks in every run.
    if (run.hidden_dropout > 0) torch::manual_seed(kSeed);
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
    FsdpOptions options{.sharding = Strategy::kFullShard,
                        .wrap = trainyard::fsdp::wrap_modules_of_type<GptNeoXLayerImpl>(),
                        .param_init = [model](const std::string& name,
                                              torch::Tensor& t) { model->init_parameter(name, t); },
                        .device = gpu()};
    auto groups = trainyard::fsdp::make_fsdp_groups(Strategy::kFullShard, pg, store, 1);
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

// Note [Activation checkpointing] (src/nn/checkpoint.cpp): a recomputed unit draws the same
// dropout masks on the GPU as its first forward did, since the CUDA generator's state is restored
// around the recompute; so recomputing changes nothing, dropout or not.
TEST(GpuFsdp, ActivationCheckpointingWithDropoutMatchesKeepingActivations) {
  REQUIRE_GPU();
  auto train = [](bool recompute, double dropout) {
    return train_fsdp(1, /*nccl=*/true, Strategy::kFullShard,
                      {.recompute = recompute, .hidden_dropout = dropout});
  };
  const auto kept = train(false, 0.1);
  expect_same(kept, train(true, 0.1), "FSDP with dropout 0.1, activations recomputed");
  // Not vacuous: dropout moved the weights away from training without it.
  const auto without = train(false, 0.0);
  double largest = 0;
  for (const auto& [name, t] : kept)
    largest = std::max(
        largest, (t - without.at(name)).norm().item<double>() / (t.norm().item<double>() + 1e-12));
  EXPECT_GT(largest, 1e-3) << "dropout had no effect";
}

TEST(GpuDdp, MatchesOneProcessAtW1OverNccl) {
  REQUIRE_GPU();
  expect_same(train_reference(1), train_ddp(1, /*nccl=*/true), "DDP W=1 NCCL");
}

TEST(GpuFsdp, FullShardMatchesOneProcessAtW1OverNccl) {
  REQUIRE_GPU();
  expect_same(train_reference(1), train_fsdp(1, true, Strategy::kFullShard),
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
  const auto bf16 = train_fsdp(1, true, Strategy::kFullShard, {.bf16 = true});
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

// Issue 14's "communication overlaps compute": NCCL work issued ahead of compute (as FSDP's
// prefetch issues the next unit's all-gather) runs on NCCL's own stream beside the compute queued
// after it on the caller's stream, and waiting for it (wait_work) is a stream wait placed after
// that compute. At W=1 an all-gather is a device copy, memory-bound beside compute-bound matmuls,
// so both together take well under the sum of each alone. Prints the three times.
TEST(GpuOverlap, NcclCollectivesRunBesideComputeQueuedAfterThem) {
  REQUIRE_GPU();
  run_ranks(1, /*nccl=*/true, [&](int, auto pg, auto) {
    using Clock = std::chrono::steady_clock;
    const std::int64_t n = std::int64_t{128} << 20;  // 512 MiB of fp32 per all-gather
    auto input = torch::randn({n}, gpu());
    auto output = torch::empty({n}, input.options());
    auto a = torch::randn({4096, 4096}, gpu()) / 64.0;
    auto x = torch::randn({4096, 4096}, gpu());
    constexpr int kGathers = 100, kMatmuls = 30;
    auto issue_comm = [&] {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (int i = 0; i < kGathers; ++i)
        works.push_back(trainyard::comm::all_gather_flat(pg, output, input));
      return works;
    };
    auto compute = [&] {
      for (int i = 0; i < kMatmuls; ++i) x = torch::mm(a, x);
    };
    auto timed = [&](auto&& body) {
      double best = 1e9;
      for (int repeat = 0; repeat < 3; ++repeat) {
        torch::cuda::synchronize();
        const auto start = Clock::now();
        body();
        torch::cuda::synchronize();
        best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
      }
      return best;
    };
    const double comm_s = timed([&] {
      for (auto& w : issue_comm()) trainyard::wait_work(w);
    });
    const double compute_s = timed(compute);
    const double both_s = timed([&] {
      auto works = issue_comm();
      compute();
      for (auto& w : works) trainyard::wait_work(w);
    });
    std::cout << "all-gathers " << comm_s * 1e3 << " ms, matmuls " << compute_s * 1e3
              << " ms, both " << both_s * 1e3 << " ms: " << (comm_s + compute_s - both_s) * 1e3
              << " ms overlapped (of at most " << std::min(comm_s, compute_s) * 1e3 << ")\n";
    ASSERT_GT(std::min(comm_s, compute_s), 0.005) << "too little work to time";
    EXPECT_LT(both_s, 0.9 * (comm_s + compute_s)) << "the collectives did not overlap compute";
  });
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

// Note [Binding NCCL to the rank's GPU]: the group knows its device before any collective, and a
// barrier as the first call runs on it.
TEST(GpuInit, NcclGroupIsBoundToTheRanksGpu) {
  REQUIRE_GPU();
  run_ranks(1, /*nccl=*/true, [&](int, auto pg, auto) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    ASSERT_TRUE(pg->getBoundDeviceId().has_value());
    EXPECT_EQ(*pg->getBoundDeviceId(), gpu());
#endif
    trainyard::wait_work(trainyard::comm::barrier(pg));
  });
}

// Note [Beating while device work runs]: wait_work returns from NCCL work at once and the host
// blocks later, reading a result; the process's beacon beats all the while, and forgets the work
// once it completed.
TEST(GpuHeartbeat, NcclWorkKeepsTheRankBeatingWhileTheHostWaitsForIt) {
  REQUIRE_GPU();
  run_ranks(1, /*nccl=*/true, [&](int, auto pg, auto) {
    using namespace std::chrono;
    constexpr auto kPeriod = milliseconds(50);
    std::atomic<int> beats{0};
    trainyard::DeviceWorkBeacon beacon(
        seconds(60), [&] { ++beats; }, kPeriod);
    // Seconds of fp32 GPU work queued ahead of the collective (150 matmuls of 1.1 TFLOP).
    const std::int64_t n = 8192;
    auto a = torch::randn({n, n}, gpu()) / std::sqrt(static_cast<double>(n));
    auto x = torch::randn({n, n}, gpu());
    torch::cuda::synchronize();
    for (int i = 0; i < 150; ++i) x = torch::mm(a, x);
    std::vector<torch::Tensor> total{x.sum().reshape({1})};
    trainyard::wait_work(trainyard::comm::all_reduce(pg, total));
    EXPECT_EQ(beacon.watched(), 1u)
        << "wait_work did not hand the beacon an event for the NCCL work";
    const auto start = steady_clock::now();
    const int before = beats.load();
    (void)total[0].item<float>();  // the host blocks here until the collective has run
    const double blocked = duration<double>(steady_clock::now() - start).count();
    const int during = beats.load() - before;
    ASSERT_GT(blocked, 0.3) << "the GPU finished too soon for the test to mean anything";
    EXPECT_GE(during, static_cast<int>(blocked / duration<double>(kPeriod).count() / 2))
        << "blocked " << blocked << " s";
    // The beacon's thread forgets it at its next look, within a period or so.
    const auto deadline = steady_clock::now() + seconds(5);
    while (beacon.watched() != 0 && steady_clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(1));
    EXPECT_EQ(beacon.watched(), 0u) << "a completed work is forgotten";
  });
}

// Issue 14's GPU metrics against the real NVML of the machine (the unit tests use a fake one):
// the GPUs CUDA sees are registered with name and memory, and a node sample has every GPU family
// with values in their physical ranges.
TEST(GpuMetrics, NvmlDetectsTheGpusAndSamplesThem) {
  REQUIRE_GPU();
  const auto gpus = trainyard::cluster::detect_nvml_gpus();
  ASSERT_EQ(static_cast<std::int64_t>(gpus.size()), torch::cuda::device_count())
      << "NVML and CUDA disagree on the GPUs (CUDA_VISIBLE_DEVICES set?)";
  for (const auto& g : gpus) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_GT(g.memory_bytes, std::int64_t{1} << 30) << g.name;
  }
  trainyard::metrics::NodeSampler sampler;
  ASSERT_TRUE(sampler.has_gpus());
  const auto x = torch::randn({4096, 4096}, gpu());  // something for the sample to see
  (void)torch::mm(x, x).sum().item<float>();
  const auto snapshot = sampler.sample();
  namespace names = trainyard::metrics::name;
  auto values = [&](std::string_view name) {
    std::vector<double> out;
    for (const auto& f : snapshot)
      if (f.name == name)
        for (const auto& s : f.samples) out.push_back(s.value);
    return out;
  };
  const auto in_range = [&](std::string_view name, double lo, double hi) {
    const auto v = values(name);
    EXPECT_EQ(v.size(), gpus.size()) << name;
    for (double x : v) EXPECT_TRUE(x >= lo && x <= hi) << name << " = " << x;
  };
  in_range(names::kGpuUtilization, 0, 1);
  in_range(names::kGpuMemoryUsed, 1 << 20, 1e13);  // this process holds some
  in_range(names::kGpuMemoryTotal, 1 << 30, 1e13);
  in_range(names::kGpuTemperature, 1, 120);
  in_range(names::kGpuPower, 1, 2000);
  in_range(names::kGpuSmClock, 1e7, 5e9);
  // XID events need NVML's event set, which a container may refuse: counted only when granted.
  const auto xids = values(names::kGpuXidErrors);
  if (xids.empty()) std::cout << "note: no XID counter: NVML gave no event set here\n";
  for (double x : xids) EXPECT_GE(x, 0) << names::kGpuXidErrors;
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
