// The set-up both image-classifier recipes (fashion-mnist, image-folder) share once they have
// built their model: the model on the trainer's device, config.json written with its
// "parameters", DDP over it, ShardedAdam (ZeRO-1), rank 0's checkpoint files, the weights guarded
// and the newest checkpoint restored. Private to src/train and included by the recipes' units
// alone: it needs LibTorch's headers.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <utility>

#include "train/classifier_training.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/ddp/distributed_data_parallel.h"
#include "trainyard/optim/sharded_adam.h"
#include "trainyard/train/trainer.h"

namespace trainyard::train {

struct DdpClassifierOptions {
  double lr = 0;             // Adam's
  double bucket_cap_mb = 0;  // DdpOptions::bucket_size_bytes in MiB
};

// M is a module holder (models::ResNet18, models::ImageModel). Constructing one resumes the run:
// trainer.progress() says where it stands afterwards.
template <typename M>
class DdpClassifier {
 public:
  DdpClassifier(M model,
                nlohmann::ordered_json config,
                const DdpClassifierOptions& options,
                Trainer& trainer)
      : model_(placed(std::move(model), std::move(config), trainer)),
        ddp_(model_,
             trainer.dist().process_group(),
             ddp::DdpOptions{.bucket_size_bytes =
                                 static_cast<std::size_t>(options.bucket_cap_mb * (1 << 20))}),
        // Each rank updates its share of the parameters; see Note [Optimizer sharding].
        optimizer_(model_->parameters(),
                   torch::optim::AdamOptions(options.lr),
                   trainer.dist().process_group()),
        // Rank 0 writes the files; the optimizer's moments are gathered to it from their owners.
        io_(classifier_checkpoint_io(*model_, optimizer_, trainer.run().uri(), trainer)) {
    trainer.guard_weights(model_->parameters());
    trainer.resume(*io_);
  }

  DdpClassifier(const DdpClassifier&) = delete;
  DdpClassifier& operator=(const DdpClassifier&) = delete;

  M& model() { return model_; }
  optim::ShardedAdam& optimizer() { return optimizer_; }
  // The model under DDP as train_classifier_epoch takes it; valid while this object lives.
  DdpModel ddp_model() {
    return DdpModel{.module = *model_,
                    .forward = [this](const at::Tensor& x) { return ddp_.forward(x); },
                    .reducer = ddp_.reducer()};
  }
  // Collective: every rank takes rank 0's BatchNorm statistics, the ones the checkpoint holds,
  // before it evaluates.
  void sync_buffers() { ddp_.reducer().sync_buffers(); }

 private:
  static M placed(M model, nlohmann::ordered_json config, Trainer& trainer) {
    model->to(trainer.device());
    config["parameters"] = parameter_count(*model);
    trainer.write_config(config.dump());
    return model;
  }

  M model_;
  ddp::DistributedDataParallel<M> ddp_;
  optim::ShardedAdam optimizer_;
  std::unique_ptr<CheckpointIO> io_;  // refers to model_ and optimizer_
};

}  // namespace trainyard::train
