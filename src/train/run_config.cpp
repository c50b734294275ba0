#include "trainyard/train/run_config.h"

#include "trainyard/error.h"
#include "trainyard/storage/storage.h"

namespace trainyard::train {

std::string RunConfig::uri() const {
  return storage::join_uri(storage, name);
}

void RunConfig::validate() const {
  TY_CHECK(!storage.empty(), "--storage must name a directory, file:///dir or s3://bucket/prefix.");
  TY_CHECK(!name.empty() && name.find('/') == std::string::npos,
           "--name must be a non-empty folder name without '/', got '", name, "'.");
  TY_CHECK(checkpoint_every >= 0, "--checkpoint-every must be >= 0 (0: only at the end), got ",
           checkpoint_every, ".");
  TY_CHECK(num_to_keep >= 0, "--num-to-keep must be >= 0 (0: keep all), got ", num_to_keep, ".");
  TY_CHECK(collective_timeout.count() > 0,
           "--collective-timeout must be more than 0 seconds, got ",
           static_cast<double>(collective_timeout.count()) / 1000, ".");
}

void ScalingConfig::validate() const {
  TY_CHECK(workers >= 1, "--workers must be >= 1, got ", workers, ".");
  TY_CHECK(threads >= 0, "--threads must be >= 0 (0: usable CPUs / ranks), got ", threads, ".");
  TY_CHECK(device == "cpu" || device == "cuda", "--device must be cpu or cuda, got '", device,
           "'.");
}

}  // namespace trainyard::train
