#include "trainyard/train/fashion_mnist.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdio>

#include "train/classifier_training.h"
#include "train/ddp_classifier.h"
#include "trainyard/blas_core.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/data/batch_loader.h"
#include "trainyard/data/distributed_sampler.h"
#include "trainyard/data/fashion_mnist.h"
#include "trainyard/ddp/distributed_data_parallel.h"
#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"
#include "trainyard/models/resnet.h"
#include "trainyard/optim/sharded_adam.h"
#include "trainyard/train/trainer.h"

namespace trainyard::train {

namespace {

nlohmann::ordered_json config_json(const FashionMnistOptions& o, int world_size, int threads) {
  return {{"recipe", "fashion-mnist"},
          {"model", "resnet18 (1-channel 7x7 conv1, 10 classes)"},
          {"world_size", world_size},
          {"epochs", o.epochs},
          {"batch_size", o.batch_size},
          {"lr", o.lr},
          {"optimizer", "Adam (ShardedAdam: ZeRO-1 across the ranks)"},
          {"blas_core", blas_core_name()},
          {"limit", o.limit},
          {"test_limit", o.test_limit},
          {"threads_per_rank", threads},
          {"seed", o.seed},
          {"data_dir", o.data_dir},
          {"bucket_cap_mb", o.bucket_cap_mb},
          {"storage", o.run.storage},
          {"name", o.run.name},
          {"checkpoint_every", o.run.checkpoint_every},
          {"num_to_keep", o.run.num_to_keep},
          {"collective_timeout_s", static_cast<double>(o.run.collective_timeout.count()) / 1000}};
}

}  // namespace

void FashionMnistOptions::validate() const {
  run.validate();
  scaling.validate();
  validate_classifier_flags(
      {.epochs = epochs, .batch_size = batch_size, .lr = lr, .bucket_cap_mb = bucket_cap_mb});
  TY_CHECK(limit == -1 || limit >= 1, "--limit must be >= 1 (or omitted for all images), got ",
           limit, ".");
  TY_CHECK(test_limit == -1 || test_limit >= 1,
           "--test-limit must be >= 1 (or omitted for all test images), got ", test_limit, ".");
}

Result run_fashion_mnist_rank(const FashionMnistOptions& options) {
  options.validate();
  Trainer trainer("fashion-mnist", options.run, options.scaling);
  const int rank = trainer.rank();
  const int world = trainer.world_size();
  auto log = logger("train");

  const std::string data_dir = options.data_dir.empty() ? data::kFashionMnistDir : options.data_dir;
  auto train_set = data::load_fashion_mnist(data_dir, data::Split::kTrain, options.limit);
  auto test_set = data::load_fashion_mnist(data_dir, data::Split::kTest, options.test_limit);
  auto resolved = options;
  resolved.data_dir = data_dir;

  torch::manual_seed(options.seed);
  DdpClassifier classifier(models::resnet18(/*in_channels=*/1, /*num_classes=*/10),
                           config_json(resolved, world, trainer.threads()),
                           {.lr = options.lr, .bucket_cap_mb = options.bucket_cap_mb}, trainer);
  auto& model = classifier.model();
  const auto device = trainer.device();

  data::DistributedSampler sampler({.dataset_size = train_set.size(),
                                    .num_replicas = world,
                                    .rank = rank,
                                    .shuffle = true,
                                    .seed = options.seed});
  auto make_batch = [&train_set, device](const std::vector<std::int64_t>& idx) {
    auto [x, y] = data::fashion_mnist_batch(train_set, idx);
    return data::Batch{x.to(device), y.to(device)};
  };

  double train_time = 0;
  std::int64_t samples_seen = 0;  // this rank, this attempt
  for (int epoch = trainer.progress().epoch; epoch < options.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const std::int64_t first_position =
        trainer.progress().epoch == epoch ? trainer.progress().epoch_position : std::int64_t{0};
    data::BatchLoader loader(sampler.indices(first_position), make_batch,
                             {.batch_size = options.batch_size});
    const ClassifierEpoch done = train_classifier_epoch(
        trainer, classifier.ddp_model(), classifier.optimizer(), epoch, loader.num_batches(),
        [&] { return loader.next(); },
        {.batch_size = options.batch_size, .lr = options.lr, .progress = options.progress});
    train_time += done.seconds;
    samples_seen += done.samples;
  }
  const std::string last_checkpoint = trainer.finish_training();

  // Evaluation: rank r takes test images r, r+W, ...; sums are all-reduced, so every image
  // counts exactly once. Every rank evaluates rank 0's BatchNorm statistics, the ones the
  // checkpoint holds.
  classifier.sync_buffers();
  model->eval();
  double loss_sum = 0;
  double correct = 0;
  double count = 0;
  {
    torch::NoGradGuard no_grad;
    std::vector<std::int64_t> mine;
    for (std::int64_t i = rank; i < test_set.size(); i += world) mine.push_back(i);
    for (std::size_t b = 0; b < mine.size(); b += 512) {
      std::vector<std::int64_t> idx(mine.begin() + b,
                                    mine.begin() + std::min(mine.size(), b + 512));
      auto [cpu_x, cpu_y] = data::fashion_mnist_batch(test_set, idx);
      const auto x = cpu_x.to(device);
      const auto y = cpu_y.to(device);
      auto logits = model->forward(x);
      loss_sum += torch::cross_entropy_loss(logits, y, {}, torch::Reduction::Sum).item<double>();
      correct += logits.argmax(1).eq(y).sum().item<double>();
      count += static_cast<double>(idx.size());
      heartbeat();
    }
  }
  // (4,): loss sum, correct, count, samples trained; summed over ranks.
  auto totals =
      torch::tensor({loss_sum, correct, count, static_cast<double>(samples_seen)}, torch::kFloat64);
  trainer.all_reduce(totals);
  // The slowest rank's training time decides throughput.
  auto slowest = torch::tensor({train_time}, torch::kFloat64);
  trainer.all_reduce(slowest, /*max=*/true);

  const double accuracy = totals[1].item<double>() / totals[2].item<double>();
  const double loss = totals[0].item<double>() / totals[2].item<double>();
  const double train_time_s = slowest.item<double>();
  const double samples_per_s = train_time_s > 0 ? totals[3].item<double>() / train_time_s : 0;
  Result result{.checkpoint_dir_name = last_checkpoint,  // rank 0's; the others read result.json
                .metrics = {{"restart_count", double(trainer.restart_count()), 0},
                            {"accuracy", accuracy, 4},
                            {"loss", loss, 5},
                            {"global_step", double(trainer.progress().global_step), 0, false},
                            {"train_time_s", train_time_s, 3, false},
                            {"train_samples_per_s", samples_per_s, 1, false},
                            {"world_size", double(world), 0, false}}};
  if (rank == 0)
    log->info("test accuracy {:.4f}, loss {:.5f}; {:.1f} training samples/s; results in {}",
              accuracy, loss, samples_per_s, options.run.uri());
  trainer.write_result(result);
  return result;
}

}  // namespace trainyard::train
