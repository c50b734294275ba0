// GPT-NeoX trained with FullyShardedDataParallel (or DDP, to compare), as the ranks of a job:
//   build/trainyard run --nproc-per-node 2 -- build/examples/train_gpt_fsdp --preset pythia-14m
//       --strategy full_shard --precision bf16-mixed --data /usr/share/games/fortunes/fortunes
// Tokens are the file's bytes (or seeded random tokens without --data). Step s trains on the
// global windows [s * W * B, (s + 1) * W * B), rank r on its B of them, so with the same seed
// and total batch every strategy and world size sees the same data and, in fp32, the same losses.
// With --storage it saves a sharded checkpoint every --checkpoint-every steps and at the end, and
// resumes from the newest one on start, at whatever world size and strategy it now runs.
#include <ATen/autocast_mode.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>

#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/ddp/distributed_data_parallel.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/fsdp/state_dict.h"
#include "trainyard/memory/caching_allocator.h"
#include "trainyard/models/causal_lm.h"
#include "trainyard/nn/autocast.h"
#include "trainyard/optim/fused_adamw.h"
#include "trainyard/strategy.h"
#include "trainyard/train/causal_lm.h"

namespace fsdp = trainyard::fsdp;
namespace models = trainyard::models;

namespace {

// Resident memory now and the heap's bytes in use, for --memory-trace.
void trace_memory(int rank, const char* phase, std::int64_t step) {
  std::ifstream status("/proc/self/status");
  std::string line, rss = "?";
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) rss = line.substr(6);
  const struct mallinfo2 heap = mallinfo2();
  const auto cached = trainyard::memory::cache_stats();
  std::printf(
      "rank %d step %lld %-9s RSS %s, heap in use %.0f MiB of %.0f MiB, cached blocks in use %.0f "
      "MiB of %.0f MiB (%zu mapped, %zu unmapped so far)\n",
      rank, static_cast<long long>(step), phase, rss.c_str(),
      (heap.uordblks + heap.hblkhd) / 1048576.0, (heap.arena + heap.hblkhd) / 1048576.0,
      cached.in_use_bytes / 1048576.0, cached.mapped_bytes / 1048576.0, cached.maps, cached.unmaps);
  std::fflush(stdout);
}

// --profile: LibTorch's own profiler (Kineto, CPU activities; the one torch.profiler drives),
// recording one step on the calling thread and writing its Chrome trace, so that
// bench/profile_step.py reads the C++ and the Python peers' steps alike.
class StepProfile {
 public:
  StepProfile() {
    namespace impl = torch::profiler::impl;
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    const std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  }
  void save(const std::string& path) {
    torch::autograd::profiler::disableProfiler()->save(path);
    done_ = true;
  }
  ~StepProfile() {
    if (!done_) torch::autograd::profiler::disableProfiler();
  }

 private:
  bool done_ = false;
};

}  // namespace

int main(int argc, char** argv) try {
  // 1. Flags.
  CLI::App app{"GPT-NeoX with FSDP"};
  std::string preset = "pythia-14m", precision = "fp32", data_path;
  auto strategy = trainyard::Strategy::kFullShard;
  std::string storage, device_name, profile_path;
  bool checkpointing = false, memory_trace = false;
  std::int64_t seq_len = 256, batch = 4, steps = 10, checkpoint_every = 0, warmup = 0;
  std::uint64_t seed = 0;
  double lr = 1e-4;
  app.add_option("--preset", preset, "model preset")
      ->check(CLI::IsMember(models::CausalLmConfig::preset_names()));
  app.add_option_function<std::string>(
      "--strategy",
      [&](const std::string& name) {
        strategy = trainyard::parse_strategy(name, trainyard::kTrainingStrategies);
      },
      trainyard::strategy_names(trainyard::kTrainingStrategies));
  app.add_option("--precision", precision)->check(CLI::IsMember({"fp32", "bf16-mixed"}));
  app.add_flag("--activation-checkpointing", checkpointing);
  app.add_flag("--memory-trace", memory_trace, "print RSS and heap use at every phase of a step");
  app.add_option("--seq-len", seq_len)->check(CLI::Range(2, 1 << 16));
  app.add_option("--batch-size", batch, "sequences per rank")->check(CLI::Range(1, 1 << 16));
  app.add_option("--steps", steps)->check(CLI::Range(1, 1 << 30));
  app.add_option("--seed", seed);
  app.add_option("--warmup-steps", warmup,
                 "steps left out of tokens/s (on a GPU the first loads kernels and handles)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--device", device_name, "cpu or cuda (default: $TRAINYARD_DEVICE, else cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--lr", lr);
  app.add_option("--data", data_path, "train on this file's bytes")->check(CLI::ExistingFile);
  app.add_option("--storage", storage, "run folder for checkpoints (path, file://, s3://)");
  app.add_option("--checkpoint-every", checkpoint_every, "steps; 0: only at the end")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--profile", profile_path,
                 "rank 0 records step 1 with LibTorch's profiler and writes its Chrome trace here");
  CLI11_PARSE(app, argc, argv);
  TY_CHECK(profile_path.empty() || steps >= 2,
           "--profile records step 1: it needs --steps >= 2, got --steps ", steps, ".");
  TY_CHECK(storage.empty() || strategy != trainyard::Strategy::kDdp,
           "--storage needs an FSDP --strategy.");

  // 2. Join the job and build the model (the same initial values on every rank: seeded per name).
  auto init_options = trainyard::init_options_from_env();
  if (!device_name.empty()) init_options.device = device_name;
  auto dist = trainyard::init(init_options);
  const auto device = dist->device();
  torch::set_num_threads(1);
  const auto config = models::CausalLmConfig::preset(preset);
  // Under FSDP the model is deferred: FSDP materialises it one unit at a time, on the rank's
  // device (FsdpOptions.device). DDP's is built on the device.
  const bool fsdp = strategy != trainyard::Strategy::kDdp;
  auto model = models::make_causal_lm(
      config, {.device = fsdp ? torch::kCPU : device, .seed = seed, .deferred = fsdp});
  const bool bf16 = precision == "bf16-mixed";

  // 3. Wrap it: one FSDP unit per transformer layer and per embedding (or DDP over the model).
  std::unique_ptr<fsdp::FullyShardedDataParallel<models::CausalLm>> sharded;
  std::unique_ptr<trainyard::ddp::DistributedDataParallel<models::CausalLm>> replicated;
  std::vector<torch::Tensor> params;
  if (strategy == trainyard::Strategy::kDdp) {
    TY_CHECK(!checkpointing, "--strategy ddp runs without activation checkpointing.");
    replicated = std::make_unique<trainyard::ddp::DistributedDataParallel<models::CausalLm>>(
        model, dist->process_group());
    params = model->parameters();
  } else {
    fsdp::FsdpOptions options{
        .sharding = strategy,
        .wrap = trainyard::train::causal_lm_wrap_policy(model),
        .backward_prefetch = fsdp::BackwardPrefetch::kBackwardPre,
        .forward_prefetch = true,
        .limit_all_gathers = true,
        .activation_checkpointing = checkpointing,
        .param_init = [model](const std::string& name,
                              torch::Tensor& t) { model->init_parameter(name, t); },
        .device = device};
    if (bf16)
      options.mixed_precision = {.param_dtype = torch::kBFloat16, .reduce_dtype = torch::kFloat32};
    sharded =
        std::make_unique<fsdp::FullyShardedDataParallel<models::CausalLm>>(model, dist, options);
    params = sharded->parameters();
  }
  trainyard::optim::FusedAdamW optimizer(params, torch::optim::AdamWOptions(lr).eps(1e-8));

  // 4. Tokens: the file's bytes, or seeded random ones.
  torch::Tensor tokens;
  if (!data_path.empty()) {
    std::ifstream in(data_path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    TY_CHECK(static_cast<std::int64_t>(bytes.size()) > seq_len, "--data ", data_path, " has ",
             bytes.size(), " bytes; it needs more than --seq-len (", seq_len, ").");
    tokens =
        torch::from_blob(bytes.data(), {static_cast<std::int64_t>(bytes.size())}, torch::kUInt8)
            .to(torch::kInt64);
  } else {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
    tokens = torch::randint(0, config.vocab_size(), {1 << 20}, gen,
                            torch::TensorOptions().dtype(torch::kInt64));
  }
  const std::int64_t windows = (tokens.numel() - 1) / seq_len;

  // 5. Resume from the newest checkpoint that every rank can load (resharded if need be).
  std::unique_ptr<trainyard::checkpoint::Checkpointer> ckpt;
  std::int64_t first = 0;
  if (!storage.empty()) {
    ckpt = std::make_unique<trainyard::checkpoint::Checkpointer>(storage);
    if (auto loaded = fsdp::load_latest_checkpoint(*sharded, &optimizer, *ckpt))
      first = loaded->step;
  }
  auto save = [&](std::int64_t step) {
    auto name = fsdp::save_checkpoint(*sharded, &optimizer, *ckpt, *dist->store(), step);
    if (dist->rank() == 0)
      std::printf("saved %s at step %lld\n", name.c_str(), static_cast<long long>(step));
  };

  // 6. Train: print the mean loss over all ranks' tokens each step. DDP's bf16-mixed is autocast.
  trainyard::nn::set_autocast(device, bf16 && replicated != nullptr);
  auto start = std::chrono::steady_clock::now();
  double exposed_ms = 0;  // FSDP: time compute waited for communication
  const std::int64_t timed_from = std::min(steps - 1, first + warmup);
  for (std::int64_t step = first; step < steps; ++step) {
    if (step == timed_from) {  // the steps before have finished: each ends reading the loss
      start = std::chrono::steady_clock::now();
      exposed_ms = 0;
    }
    std::vector<torch::Tensor> rows;
    for (std::int64_t i = 0; i < batch; ++i) {
      std::int64_t w = ((step * dist->world_size() + dist->rank()) * batch + i) % windows;
      rows.push_back(tokens.narrow(0, w * seq_len, seq_len));
    }
    auto ids = torch::stack(rows).to(device);  // (batch, seq_len)
    auto trace = [&](const char* phase) {
      if (memory_trace) trace_memory(dist->rank(), phase, step);
    };
    trace("start");
    std::optional<StepProfile> profile;
    if (!profile_path.empty() && step == 1 && dist->rank() == 0) profile.emplace();
    optimizer.zero_grad();
    auto logits = sharded ? sharded->forward(ids) : replicated->forward(ids);
    trace("forward");
    auto loss = models::causal_lm_loss(logits, ids);
    at::autocast::clear_cache();
    trace("loss");
    loss.backward();
    trace("backward");
    if (sharded) exposed_ms += sharded->last_stats().exposed_comm_ms;
    optimizer.step();
    trace("optimizer");
    if (profile) profile->save(profile_path);
    std::vector<torch::Tensor> mean{loss.detach().clone() / dist->world_size()};
    trainyard::wait_work(dist->process_group()->allreduce(mean));
    const double mean_loss = mean[0].item<double>();  // on a GPU, waits for the step on every rank
    if (dist->rank() == 0)
      std::printf("step %lld loss %.6f\n", static_cast<long long>(step), mean_loss);
    if (ckpt && (step + 1 == steps || (checkpoint_every && (step + 1) % checkpoint_every == 0)))
      save(step + 1);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // 7. Throughput and memory.
  std::int64_t state = 0;
  for (auto& p : params) state += p.numel() * 4 * 4;  // fp32 parameter, gradient, two moments
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::string pool;  // Note [Caching CPU allocator]: FSDP's buffers, and LibTorch's when installed
  if (const auto cached = trainyard::memory::cache_stats(); cached.peak_mapped_bytes > 0)
    pool = ", cached blocks " + std::to_string(cached.peak_mapped_bytes / 1048576) + " MiB";
  std::printf(
      "rank %d: %.1f tokens/s, peak RSS %.1f MiB, model state %.1f MiB%s, exposed comm %.1f%% "
      "(%s, %s%s)\n",
      dist->rank(), (steps - timed_from) * batch * seq_len * dist->world_size() / seconds,
      usage.ru_maxrss / 1024.0, state / 1048576.0, pool.c_str(), exposed_ms / 10 / seconds,
      std::string(trainyard::to_string(strategy)).c_str(), precision.c_str(),
      checkpointing ? ", activation checkpointing" : "");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_gpt_fsdp: %s\n", e.what());
  return 1;
}
