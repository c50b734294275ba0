// Checkpoint write and read throughput, for each storage URI given, with the recipe's real
// checkpoint: ResNet-18 (1-channel conv1, 10 classes) and its Adam state after one step, about
// 135 MB in model.pt + optimizer.pt. Per URI and repeat it times
//   serialize  module/optimizer -> bytes (what a save costs before any I/O)
//   save       Checkpointer::save: atomic writes, SHA-256 manifest, retention
//   load       Checkpointer::load_latest: reads and verifies every file
//   deserialize bytes -> module/optimizer
// and prints medians and MB/s. The training stall of a save is serialize + save: rank 0 saves
// synchronously between two steps.
//   build/bench/checkpoint_bench [--repeats 5] URI...
//   (bench/checkpoint.sh runs it for a temporary directory and a local S3 server.)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/checkpoint/torch_state.h"
#include "trainyard/error.h"
#include "trainyard/models/resnet.h"
#include "trainyard/optim/fused_adam.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  int repeats = 5;
  std::vector<std::string> uris;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--repeats") {
      TY_CHECK(i + 1 < argc, "--repeats needs a value");
      repeats = std::atoi(argv[++i]);
    } else {
      uris.push_back(arg);
    }
  }
  TY_CHECK(repeats >= 1 && !uris.empty(),
           "usage: checkpoint_bench [--repeats N] URI... (a directory, file:///dir, s3://b/p)");
  torch::set_num_threads(1);

  // The recipe's model and optimizer, with Adam state from one real step.
  auto model = trainyard::models::resnet18(1, 10);
  trainyard::optim::FusedAdam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto loss = torch::cross_entropy_loss(model->forward(torch::randn({8, 1, 28, 28})),
                                        torch::randint(0, 10, {8}));
  loss.backward();
  optimizer.step();

  std::printf("%-40s %6s %10s %10s %10s %10s %10s %10s\n", "storage", "MB", "serial s",
              "save s", "save MB/s", "load s", "load MB/s", "stall s");
  for (const auto& uri : uris) {
    trainyard::checkpoint::Checkpointer checkpointer(uri, {.num_to_keep = 2});
    std::vector<double> serialize, save, load, deserialize;
    double megabytes = 0;
    for (int r = 0; r < repeats; ++r) {
      auto t = Clock::now();
      trainyard::checkpoint::Checkpoint c{.step = r};
      c.files["model.pt"] = trainyard::checkpoint::module_to_bytes(*model);
      c.files["optimizer.pt"] = trainyard::checkpoint::optimizer_to_bytes(optimizer);
      serialize.push_back(seconds_since(t));
      megabytes = (c.files["model.pt"].size() + c.files["optimizer.pt"].size()) / 1e6;

      t = Clock::now();
      checkpointer.save(c);
      save.push_back(seconds_since(t));

      t = Clock::now();
      auto loaded = checkpointer.load_latest();
      load.push_back(seconds_since(t));
      TY_CHECK_T(trainyard::Error, loaded && loaded->checkpoint.step == r,
                 "the checkpoint just saved did not load back from ", uri);

      t = Clock::now();
      trainyard::checkpoint::load_module(*model, loaded->checkpoint.files["model.pt"], "model.pt");
      trainyard::checkpoint::load_optimizer(optimizer, loaded->checkpoint.files["optimizer.pt"],
                                            "optimizer.pt");
      deserialize.push_back(seconds_since(t));
    }
    const double s = median(serialize), w = median(save), l = median(load);
    std::printf("%-40s %6.1f %10.3f %10.3f %10.1f %10.3f %10.1f %10.3f\n", uri.c_str(),
                megabytes, s, w, megabytes / w, l, megabytes / l, s + w);
    std::printf("%-40s deserialize %.3f s (median of %d)\n", "", median(deserialize), repeats);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", e.what());
  return 1;
}
