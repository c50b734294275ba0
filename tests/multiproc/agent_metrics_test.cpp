// AgentMetrics with real ranks: the agent's ranks publish their metrics into its folder and it
// reads them back labelled {job, rank}, follows their pids from the agent's events for the node
// sampler, and clears what an earlier round left. Links trainyard_core alone.
#include "trainyard/elastic/agent_metrics.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../temp_dir.h"
#include "trainyard/elastic/agent.h"
#include "trainyard/metrics/names.h"
#include "trainyard/metrics/node_sampler.h"
#include "trainyard/metrics/rank_files.h"

namespace trainyard::elastic {
namespace {

using namespace std::chrono_literals;
namespace name = metrics::name;

TEST(AgentMetrics, RanksMetricsAndProcessesAreLabelledByJobAndRank) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("agent-metrics-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  // A file an earlier, larger round left: the new round must not report rank 5.
  std::ofstream(metrics::rank_file_path(dir, 5)) << "[]";

  AgentMetrics am("job-7", dir);
  LaunchOptions o{
      .command = {TRAINYARD_METRICS_HELPER, "3000"}, .nproc_per_node = 2, .forward_output = false};
  o.extra_env.push_back(am.env());
  o.on_event = [&am](const AgentEvent& e) { am.on_event(e); };
  Agent agent(o);
  agent.start();

  // Both ranks' published values arrive, exactly, with the job and rank labels.
  metrics::Snapshot ranks;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until) {
    ranks = am.rank_snapshot();
    if (!std::isnan(metrics::find_value(ranks, name::kTrainLoss, {{"rank", "0"}})) &&
        !std::isnan(metrics::find_value(ranks, name::kTrainLoss, {{"rank", "1"}}))) {
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_DOUBLE_EQ(
      metrics::find_value(ranks, name::kTrainLoss, {{"job_id", "job-7"}, {"rank", "0"}}), 0.25);
  EXPECT_DOUBLE_EQ(
      metrics::find_value(ranks, name::kTrainLoss, {{"job_id", "job-7"}, {"rank", "1"}}), 1.25);
  EXPECT_DOUBLE_EQ(metrics::find_value(ranks, name::kTrainStepsTotal, {{"rank", "1"}}), 20);
  EXPECT_TRUE(std::isnan(metrics::find_value(ranks, name::kTrainLoss, {{"rank", "5"}})))
      << "the earlier round's rank 5 lingers";

  // The ranks' processes, for the node sampler: resident memory per rank.
  const auto processes = am.processes();
  ASSERT_EQ(processes.size(), 2u);
  metrics::NodeSampler sampler(metrics::NodeSamplerOptions{.nvml_library = ""});
  const metrics::Snapshot node = sampler.sample(processes);
  for (const char* rank : {"0", "1"}) {
    EXPECT_GT(
        metrics::find_value(node, name::kRankResidentMemory, {{"job_id", "job-7"}, {"rank", rank}}),
        0)
        << "rank " << rank;
  }

  EXPECT_EQ(agent.wait().exit_code(), 0);
  EXPECT_TRUE(am.processes().empty());
  trainyard::test::remove_all(dir);
}

TEST(AgentMetrics, WithoutAFolderItMakesAPrivateOneAndRemovesIt) {
  std::string dir;
  {
    AgentMetrics am("run-1");
    dir = am.dir();
    EXPECT_TRUE(std::filesystem::is_directory(dir));
    EXPECT_EQ(am.env().second, dir);
    EXPECT_TRUE(am.rank_snapshot().empty());
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace
}  // namespace trainyard::elastic
