// The Trainer's Result (result.json and the seeds' "Training result" table) and the shared run
// configs' flag checks; LibTorch-free.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../temp_dir.h"
#include "trainyard/error.h"
#include "trainyard/train/result.h"
#include "trainyard/train/run_config.h"

namespace {
namespace fs = std::filesystem;
using namespace trainyard::train;

class ResultTable : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty-result-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { trainyard::test::remove_all(dir_); }
  std::string printed(const std::string& json) {
    std::ofstream(dir_ / "result.json") << json;
    ::testing::internal::CaptureStdout();
    try {
      print_training_result(dir_.string());
    } catch (...) {
      ::testing::internal::GetCapturedStdout();  // one capture at a time
      throw;
    }
    return ::testing::internal::GetCapturedStdout();
  }
  fs::path dir_;
};

TEST_F(ResultTable, PrintsTheSeedsRowsThenTheRecipesInOrder) {
  Result r{.checkpoint_dir_name = "checkpoint_000000",
           .time_this_iter_s = 3366.8271,
           .time_total_s = 3366.8271,
           .metrics = {{"epoch", 0, 0},
                       {"step", 193, 0},
                       {"train_loss", 0.216309, 5},
                       {"tokens_per_s", 1234.5, 1, /*in_table=*/false}},
           .config_json = R"({"recipe": "causal-lm"})"};
  const auto json = nlohmann::json::parse(result_json(r));
  EXPECT_EQ(json["step"].get<std::int64_t>(), 193) << "integers stay integers";
  EXPECT_DOUBLE_EQ(json["tokens_per_s"].get<double>(), 1234.5) << "every metric is in the file";
  EXPECT_EQ(json["config"]["recipe"], "causal-lm");
  EXPECT_DOUBLE_EQ(r.metric("train_loss"), 0.216309);
  EXPECT_THROW(r.metric("accuracy"), trainyard::InvalidArgumentError);

  // The seed's table, row for row (time_this_iter_s with three decimals).
  const std::string expected =
      "╭─────────────────────────────────────────╮\n"
      "│ Training result                         │\n"
      "├─────────────────────────────────────────┤\n"
      "│ checkpoint_dir_name   checkpoint_000000 │\n"
      "│ time_this_iter_s               3366.827 │\n"
      "│ time_total_s                   3366.827 │\n"
      "│ training_iteration                    1 │\n"
      "│ epoch                                 0 │\n"
      "│ step                                193 │\n"
      "│ train_loss                      0.21631 │\n"
      "╰─────────────────────────────────────────╯\n";
  EXPECT_EQ(printed(result_json(r)), expected);
}

TEST_F(ResultTable, AMetricWithoutAValueShowsAsADash) {
  Result r{.metrics = {{"train_loss", std::nan(""), 5}, {"step", 3, 0}}};
  const auto table = printed(result_json(r));
  EXPECT_NE(table.find("│ train_loss                    - │"), std::string::npos) << table;
  EXPECT_NE(table.find("│ step                          3 │"), std::string::npos) << table;
}

TEST_F(ResultTable, AMissingOrBrokenResultIsAClearError) {
  try {
    print_training_result((dir_ / "nothing").string());
    FAIL();
  } catch (const trainyard::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the job did not finish"), std::string::npos);
  }
  EXPECT_THROW(printed("{not json"), trainyard::CorruptDataError);
  EXPECT_THROW(printed(R"({"table": [{"key": "loss", "decimals": 4}]})"),
               trainyard::CorruptDataError)
      << "a table row without its value";
}

TEST(RunConfigs, BadValuesNameTheFlag) {
  auto message = [](auto config) {
    try {
      config.validate();
    } catch (const trainyard::InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(RunConfig{.name = "a"}), "no error");
  EXPECT_NE(message(RunConfig{.name = "a/b"}).find("--name must be a non-empty folder name"),
            std::string::npos);
  EXPECT_NE(message(RunConfig{.storage = "", .name = "a"}).find("--storage must name"),
            std::string::npos);
  EXPECT_NE(message(RunConfig{.name = "a", .num_to_keep = -1}).find("--num-to-keep must be >= 0"),
            std::string::npos);
  EXPECT_NE(message(ScalingConfig{.workers = 0}).find("--workers must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(message(ScalingConfig{.device = "gpu"}).find("--device must be cpu or cuda, got 'gpu'"),
            std::string::npos);
  EXPECT_NE(message(RunConfig{.name = "a", .collective_timeout = std::chrono::milliseconds(0)})
                .find("--collective-timeout must be more than 0 seconds"),
            std::string::npos);
  EXPECT_EQ((RunConfig{.storage = "s3://b/runs", .name = "x"}.uri()), "s3://b/runs/x");
}

}  // namespace
