// The seeds' FashionMNIST job as a recipe: torchvision ResNet18 with a 1-channel 7x7 conv1,
// FashionMNIST normalised with mean 0.5 / std 0.5, Adam, DistributedDataParallel across the
// ranks of the job, a test-set evaluation, and rank 0's checkpoints and result.json.
//
// Fault tolerance: rank 0 saves a checkpoint (model, optimizer, RNG, epoch and sample position,
// step counter) every checkpoint_every steps and at the end, under <storage>/<name>/. Every start
// resumes from the newest complete checkpoint of that run: after an agent restart, or when the
// same command runs again with more epochs. With the same world size, a resumed run computes
// exactly what an uninterrupted one does.
#pragma once

#include <cstdint>
#include <string>

namespace trainyard::train {

struct FashionMnistOptions {
  int workers = 2;  // ranks started when the recipe launches itself
  int epochs = 10;
  std::int64_t batch_size = 128;  // per rank
  double lr = 1e-3;
  std::string storage = "results";    // a directory, file:///dir or s3://bucket/prefix
  std::int64_t checkpoint_every = 0;  // steps between checkpoints; 0: only the final one
  int num_to_keep = 2;                // newest complete checkpoints kept; 0: all
  int max_restarts = 0;               // when the recipe launches itself: agent restarts
  std::string name = "fashion-mnist";
  std::int64_t limit = -1;  // use the first `limit` training images; -1: all 60,000
  int threads = 0;          // intra-op threads per rank; 0: cores / ranks on this node
  std::uint64_t seed = 0;
  double bucket_cap_mb = 25;  // DdpOptions::bucket_size_bytes in MiB
  std::string data_dir;       // empty: Debian's /usr/share/datasets/fashion-mnist
  bool progress = true;       // a progress bar on rank 0 when the output is a terminal
  // Bound on every collective and store wait (InitOptions::timeout), in seconds.
  double collective_timeout_s = 300;
  // When the recipe launches itself: the launcher's hang watchdog (LaunchOptions::hang_timeout),
  // in seconds; 0 turns it off. See Note [Hang watchdog].
  double hang_timeout_s = 30;

  // Throws InvalidArgumentError naming the first bad field.
  void validate() const;
};

struct FashionMnistResult {
  double loss = 0;      // mean cross-entropy on the test set
  double accuracy = 0;  // on the test set
  double time_total_s = 0;
  double train_time_s = 0;         // training epochs only, without evaluation
  double train_samples_per_s = 0;  // all ranks together
  int world_size = 1;
  std::string checkpoint_dir_name;
  std::string run_uri;  // <storage>/<name>
  int restart_count = 0;
  std::int64_t global_step = 0;  // optimizer steps since the run began, across restarts
};

// Runs one rank of the job; the environment contract (RANK, WORLD_SIZE, ...) must be present.
// Rank 0 writes <storage>/<name>/checkpoint_NNNNNN/{model.pt,...}, result.json and config.json.
FashionMnistResult run_fashion_mnist_rank(const FashionMnistOptions& options);

// Prints the "Training result" table of the run's result.json, in the shape Ray Train prints it.
void print_training_result(const std::string& run_uri);

}  // namespace trainyard::train
