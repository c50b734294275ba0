#include "train/classifier_training.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <utility>

#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/checkpoint/torch_state.h"
#include "trainyard/ddp/reducer.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/metrics/step_timer.h"
#include "trainyard/optim/sharded_adam.h"
#include "trainyard/storage/storage.h"

namespace trainyard::train {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

std::unique_ptr<CheckpointIO> classifier_checkpoint_io(torch::nn::Module& model,
                                                       optim::ShardedAdam& optimizer,
                                                       const std::string& run_uri,
                                                       Trainer& trainer) {
  const int rank = trainer.rank();
  return root_checkpoint_io(
      {.collect =
           [&model, &optimizer, rank] {
             // Every rank takes part in gathering the moments; rank 0 alone writes.
             auto optimizer_state = optimizer.state_to_bytes(/*root=*/0);
             std::map<std::string, std::string> files;
             if (rank != 0) return files;
             files["model.pt"] = checkpoint::module_to_bytes(model);
             files["optimizer.pt"] = std::move(optimizer_state);
             files["rng.pt"] = checkpoint::cpu_rng_state_to_bytes();
             return files;
           },
       .restore =
           [&model, &optimizer, run_uri](const checkpoint::LoadedCheckpoint& loaded) {
             const auto where = storage::join_uri(run_uri, loaded.name);
             auto file = [&](const std::string& f) -> const std::string& {
               auto it = loaded.checkpoint.files.find(f);
               TY_CHECK_T(CheckpointCorruptError, it != loaded.checkpoint.files.end(), where,
                          " has no ", f, ".");
               return it->second;
             };
             checkpoint::load_module(model, file("model.pt"), where + "/model.pt");
             checkpoint::load_cpu_rng_state(file("rng.pt"), where + "/rng.pt");
             optimizer.load_state_bytes(file("optimizer.pt"), where + "/optimizer.pt");
           }},
      trainer.dist());
}

void validate_classifier_flags(const ClassifierFlags& f) {
  TY_CHECK(f.epochs >= 1, "--epochs must be >= 1, got ", f.epochs, ".");
  TY_CHECK(f.batch_size >= 1, "--batch-size must be >= 1, got ", f.batch_size, ".");
  TY_CHECK(f.lr > 0, "--lr must be > 0, got ", f.lr, ".");
  TY_CHECK(f.bucket_cap_mb >= 1.0 / 1024 && f.bucket_cap_mb <= 64 * 1024,
           "--bucket-cap-mb must be between 1 KiB (0.0009765625) and 65536 MiB, got ",
           f.bucket_cap_mb, ".");
}

std::int64_t parameter_count(const torch::nn::Module& model) {
  std::int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

ClassifierEpoch train_classifier_epoch(
    Trainer& trainer,
    const DdpModel& model,
    optim::ShardedAdam& optimizer,
    int epoch,
    std::int64_t batches,
    const std::function<std::optional<data::Batch>()>& next_batch,
    const ClassifierEpochOptions& options) {
  const auto epoch_start = Clock::now();
  const int rank = trainer.rank();
  model.module.train();
  trainer.begin_epoch(epoch, batches);
  const bool bar_enabled = options.progress && rank == 0 && interactive_output();
  ProgressBar bar(bar_enabled, epoch, batches);
  ClassifierEpoch out;
  // Seconds per phase over the epoch, for the debug summary.
  double t_data = 0, t_forward = 0, t_backward = 0, t_optimizer = 0, t_comm = 0;
  auto lap = Clock::now();
  auto take = [&lap](double& into) {
    auto now = Clock::now();
    into += std::chrono::duration<double>(now - lap).count();
    lap = now;
  };
  // The trainer's step timer records the same phases as metrics (metrics/step_timer.h); each
  // step begins in Phase::kData, so the data wait is the time spent in next_batch().
  using metrics::Phase;
  while (auto batch = next_batch()) {
    take(t_data);
    trainer.phase(Phase::kForward);
    optimizer.zero_grad();
    auto loss = torch::cross_entropy_loss(model.forward(batch->inputs), batch->targets);
    take(t_forward);
    trainer.phase(Phase::kBackward);
    loss.backward();
    take(t_backward);
    t_comm += model.reducer.last_step_stats().exposed_comm_ms / 1e3;
    trainer.phase(Phase::kOptimizer);
    optimizer.step();
    take(t_optimizer);
    trainer.phase(Phase::kOther);
    out.samples += batch->inputs.size(0);
    const std::int64_t step = trainer.epoch_steps() + 1;
    const bool show = bar_enabled && (step % 5 == 0 || step == batches);
    // Read every step (on a GPU, a sync): step_done() stops the run at a NaN or Inf loss
    // before anything of the step is saved (Note [Non-finite training] in trainer.cpp).
    const double loss_value = loss.item<double>();
    trainer.step_done(options.batch_size, {{"loss", loss_value}, {"lr", options.lr}});
    if (show) bar.update(step, loss_value);
    lap = Clock::now();
  }
  out.steps = trainer.epoch_steps();
  trainer.end_epoch();
  const auto steps = static_cast<double>(out.steps);
  if (out.steps > 0)
    logger("train")->debug(
        "epoch {}: per step {:.1f} ms data wait, {:.1f} ms forward, {:.1f} ms backward "
        "(of which {:.1f} ms waiting for all-reduces), {:.1f} ms optimizer",
        epoch, 1e3 * t_data / steps, 1e3 * t_forward / steps, 1e3 * t_backward / steps,
        1e3 * t_comm / steps, 1e3 * t_optimizer / steps);
  out.seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
  const std::string restarts = trainer.restart_count() > 0
                                   ? detail::concat(" | Restarts: ", trainer.restart_count())
                                   : std::string();
  std::printf(
      "[Epoch %d | CPU%d: Process rank %d | Batchsize: %lld | Steps: %lld | Total epoch "
      "time: %.4f%s]\n",
      epoch, trainer.local_rank(), rank, static_cast<long long>(options.batch_size),
      static_cast<long long>(out.steps), out.seconds, restarts.c_str());
  std::fflush(stdout);
  return out;
}

}  // namespace trainyard::train
