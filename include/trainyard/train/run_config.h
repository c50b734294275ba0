// What a training run is (RunConfig: where it is kept and how often it is saved) and what it runs
// on (ScalingConfig: how many ranks and threads, and where), as Ray Train names them. (How the
// launcher treats the ranks of a recipe run bare is elastic::LaunchOptions, filled by the CLI.) Every recipe takes both; the recipe's own fields (epochs, lr, ...) stay its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace trainyard::train {

struct RunConfig {
  std::string storage = "results";    // a directory, file:///dir or s3://bucket/prefix
  std::string name;                   // the run's folder under storage; a recipe sets its default
  std::int64_t checkpoint_every = 0;  // steps between checkpoints; 0: only the final one
  int num_to_keep = 2;                // newest complete checkpoints kept; 0: all
  // Bound on every collective and store wait of a rank (InitOptions::timeout).
  std::chrono::milliseconds collective_timeout = std::chrono::seconds(300);

  // <storage>/<name>: the run's folder.
  std::string uri() const;
  // Throws InvalidArgumentError naming the flag (--storage, --name, ...) and the fix.
  void validate() const;
};

struct ScalingConfig {
  int workers = 2;       // ranks started when the recipe launches itself
  int threads = 0;       // intra-op threads per rank; 0: usable_cpu_count() / local ranks
  // Where each rank trains: "cpu", or "cuda" (the GPU numbered LOCAL_RANK; collectives on NCCL
  // where every rank has a GPU of its own): InitOptions::device. Ray's ScalingConfig(use_gpu).
  std::string device = "cpu";

  // Throws InvalidArgumentError naming the flag and the fix.
  void validate() const;
};

}  // namespace trainyard::train
