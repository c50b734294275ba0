// The seeds' FashionMNIST job as a recipe: torchvision ResNet18 with a 1-channel 7x7 conv1,
// FashionMNIST normalised with mean 0.5 / std 0.5, Adam, DistributedDataParallel across the
// ranks of the job, a test-set evaluation, and rank 0's checkpoints and result.json.
//
// Fault tolerance (the Trainer's protocol, train/trainer.h): rank 0 saves a checkpoint (model,
// optimizer, RNG, and the Progress) every checkpoint_every steps and at the end, under
// <storage>/<name>/. Every start resumes from the newest complete checkpoint of that run. With the
// same world size, a resumed run computes exactly what an uninterrupted one does.
#pragma once

#include <cstdint>
#include <string>

#include "trainyard/train/result.h"
#include "trainyard/train/run_config.h"

namespace trainyard::train {

struct FashionMnistOptions {
  RunConfig run{.name = "fashion-mnist"};
  ScalingConfig scaling;
  int epochs = 10;
  std::int64_t batch_size = 128;  // per rank
  double lr = 1e-3;
  std::int64_t limit = -1;       // use the first `limit` training images; -1: all 60,000
  std::int64_t test_limit = -1;  // evaluate on the first `test_limit` test images; -1: all 10,000
  std::uint64_t seed = 0;
  double bucket_cap_mb = 25;  // DdpOptions::bucket_size_bytes in MiB
  std::string data_dir;       // empty: Debian's /usr/share/datasets/fashion-mnist
  bool progress = true;       // a progress bar on rank 0 when the output is a terminal

  // Throws InvalidArgumentError naming the first bad field (the configs' too).
  void validate() const;
};

// Runs one rank of the job on the Trainer; the environment contract (RANK, WORLD_SIZE, ...) must
// be present. Rank 0 writes <storage>/<name>/checkpoint_NNNNNN/{model.pt,...}, result.json and
// config.json. The result holds the test set's loss and accuracy and the training throughput.
Result run_fashion_mnist_rank(const FashionMnistOptions& options);

}  // namespace trainyard::train
