// What the image-classifier recipes (fashion-mnist, image-folder) share: a model under DDP with
// ShardedAdam (ZeRO-1), checkpointed by rank 0 as model.pt, optimizer.pt and rng.pt, and one
// epoch of steps with the step timer's phases, the progress bar, the debug summary of where a
// step's time went and the seeds' per-epoch line. Private to src/train.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "trainyard/data/batch_loader.h"
#include "trainyard/train/trainer.h"

namespace at {
class Tensor;
}

namespace torch::nn {
class Module;
}

namespace trainyard::ddp {
class DdpReducer;
}

namespace trainyard::optim {
class ShardedAdam;
}

namespace trainyard::train {

// Rank 0 writes model.pt, optimizer.pt (the moments gathered from their owners) and rng.pt;
// restoring loads all three on every rank. `run_uri` names the run in messages about a damaged
// checkpoint. `model` and `optimizer` outlive the returned object.
std::unique_ptr<CheckpointIO> classifier_checkpoint_io(torch::nn::Module& model,
                                                       optim::ShardedAdam& optimizer,
                                                       const std::string& run_uri,
                                                       Trainer& trainer);

// The model's parameters (elements), as recipes record it in config.json's "parameters" for
// `trainyard bench scaling` (the gradient bytes its all-reduce model needs).
std::int64_t parameter_count(const torch::nn::Module& model);

// The flags both recipes take alike, as the user gave them.
struct ClassifierFlags {
  int epochs = 0;
  std::int64_t batch_size = 0;  // per rank
  double lr = 0;
  double bucket_cap_mb = 0;  // DDP's bucket size in MiB
};
// Throws InvalidArgumentError naming the flag out of range.
void validate_classifier_flags(const ClassifierFlags& flags);

struct ClassifierEpochOptions {
  std::int64_t batch_size = 0;  // per rank, as printed in the epoch line
  double lr = 0;                // reported with each step's loss
  bool progress = true;         // a progress bar on rank 0 when its output is a terminal
};

struct ClassifierEpoch {
  std::int64_t steps = 0;    // this epoch's steps on this rank, a resumed epoch's earlier ones too
  std::int64_t samples = 0;  // images this call trained on
  double seconds = 0;        // wall time of the call
};

// A model under DDP, as the epoch sees it: the module (for train()), DDP's forward and its
// reducer (for the step's exposed communication). The references outlive the epoch.
struct DdpModel {
  torch::nn::Module& module;
  std::function<at::Tensor(const at::Tensor&)> forward;
  ddp::DdpReducer& reducer;
};

// Trains one epoch: `next_batch` yields the epoch's batches (from position `first` on, as
// trainer.progress() says) until it returns nullopt; `batches` is how many the whole epoch has.
// Each step is cross-entropy on model.forward's logits, backward, optimizer step;
// trainer.step_done() reports the loss and lr. Prints the seeds' line
// `[Epoch 0 | CPU0: Process rank 0 | Batchsize: 128 | Steps: 235 | Total epoch time: 17.66]`.
ClassifierEpoch train_classifier_epoch(
    Trainer& trainer,
    const DdpModel& model,
    optim::ShardedAdam& optimizer,
    int epoch,
    std::int64_t batches,
    const std::function<std::optional<data::Batch>()>& next_batch,
    const ClassifierEpochOptions& options);

}  // namespace trainyard::train
