// Fault tolerance of the FashionMNIST recipe through the real CLI: a rank killed with SIGKILL in
// the middle of an epoch makes the agent restart the group, which resumes from the newest
// checkpoint and ends exactly where an uninterrupted run ends.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "../multiproc/multiproc_util.h"

namespace {
using trainyard::mptest::collect;
using trainyard::mptest::read_file;
using trainyard::mptest::run_program;
using trainyard::mptest::TempDir;
using namespace std::chrono_literals;

std::vector<std::string> recipe(const TempDir& dir, const std::string& name) {
  return {TRAINYARD_CLI_PATH,
          "train",
          "fashion-mnist",
          "--workers",
          "2",
          "--epochs",
          "1",
          "--limit",
          "2048",
          "--seed",
          "3",
          "--storage",
          dir.str(),
          "--name",
          name,
          "--checkpoint-every",
          "2",
          "--num-to-keep",
          "2",
          "--max-restarts",
          "1",
          "--no-progress"};
}

using trainyard::mptest::result_of;

TEST(ElasticRecipe, KilledRankRestartsFromTheCheckpointAndEndsLikeAnUninterruptedRun) {
  TempDir dir;
  auto clean = run_program(recipe(dir, "clean"), {}, 100s);
  ASSERT_FALSE(clean.timed_out) << clean.out << clean.err;
  ASSERT_TRUE(clean.status.success()) << clean.out << clean.err;

  trainyard::elastic::Subprocess job(
      trainyard::elastic::SubprocessOptions{.argv = recipe(dir, "killed")});
  // 2048 images / 2 ranks / 128 = 8 steps; the first checkpoint is at step 2.
  ASSERT_TRUE(trainyard::mptest::wait_for_files(
      {dir.path() / "killed" / "checkpoint_000000" / "MANIFEST.json"}, 60s));
  const int victim = trainyard::mptest::find_rank("killed", 1);
  ASSERT_GT(victim, 0) << "rank 1 of the run is not running";
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  auto killed = collect(job, 100s);
  ASSERT_FALSE(killed.timed_out) << killed.out << killed.err;
  ASSERT_TRUE(killed.status.success()) << killed.out << killed.err;

  EXPECT_NE(killed.err.find("Worker group FAILED. 1/1 attempts left"), std::string::npos)
      << killed.err;
  EXPECT_NE(killed.err.find("restart_count=1"), std::string::npos) << killed.err;
  EXPECT_NE(killed.out.find("Resuming from checkpoint_"), std::string::npos) << killed.out;
  EXPECT_NE(killed.out.find("| Restarts: 1]"), std::string::npos) << killed.out;

  const auto a = result_of(dir.path(), "clean");
  const auto b = result_of(dir.path(), "killed");
  EXPECT_EQ(b["restart_count"].get<int>(), 1);
  EXPECT_EQ(a["global_step"].get<int>(), 8);
  EXPECT_EQ(b["global_step"].get<int>(), 8);
  for (const char* metric : {"loss", "accuracy"}) {
    const double x = a[metric].get<double>(), y = b[metric].get<double>();
    EXPECT_LT(std::abs(x - y) / std::abs(x), 1e-4)
        << metric << ": uninterrupted " << x << ", restarted " << y;
  }
}

TEST(ElasticRecipe, RunningAgainWithMoreEpochsResumesTheFinishedRun) {
  TempDir dir;
  auto args = recipe(dir, "grow");
  ASSERT_TRUE(run_program(args, {}, 100s).status.success());
  args[6] = "2";  // --epochs 2
  auto again = run_program(args, {}, 100s);
  ASSERT_TRUE(again.status.success()) << again.out << again.err;
  EXPECT_NE(
      again.out.find("Resuming from checkpoint_000003 at step 8 (epoch 1, 0 samples into it)"),
      std::string::npos)
      << again.out;
  EXPECT_EQ(again.out.find("[Epoch 0 |"), std::string::npos) << "epoch 0 is not trained again";
  EXPECT_EQ(result_of(dir.path(), "grow")["global_step"].get<int>(), 16);
}

}  // namespace
