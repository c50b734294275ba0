// A rank that publishes known metrics the way a trainyard rank does (process_registry() through a
// FilePublisher into $TRAINYARD_METRICS_DIR), for the agent's metrics tests: loss 0.25 + RANK,
// steps_total 10 x (RANK + 1); then it sleeps argv[1] milliseconds and exits 0.
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "trainyard/env.h"
#include "trainyard/metrics/names.h"
#include "trainyard/metrics/rank_files.h"
#include "trainyard/metrics/registry.h"

int main(int argc, char** argv) {
  namespace m = trainyard::metrics;
  const char* rank_text = std::getenv(trainyard::kRankEnv);
  const char* dir = std::getenv(trainyard::kMetricsDirEnv);
  if (rank_text == nullptr || dir == nullptr) return 2;
  const int rank = std::atoi(rank_text);
  m::process_registry().gauge(m::name::kTrainLoss, "Loss.").set(0.25 + rank);
  m::process_registry().counter(m::name::kTrainStepsTotal, "Steps.").add(10.0 * (rank + 1));
  m::FilePublisher publisher(
      m::process_registry(),
      {.dir = dir, .rank = rank, .interval = std::chrono::milliseconds(100)});
  publisher.publish_now();
  std::this_thread::sleep_for(std::chrono::milliseconds(argc > 1 ? std::atoi(argv[1]) : 1000));
  return 0;
}
