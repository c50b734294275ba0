// The FashionMNIST recipe end to end through the real CLI: two ranks, one epoch on 6,000 images.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "../multiproc/multiproc_util.h"
#include "trainyard/blas_core.h"
#include "trainyard/models/resnet.h"

namespace {
using trainyard::mptest::read_file;
using trainyard::mptest::run_program;
using trainyard::mptest::TempDir;
using namespace std::chrono_literals;

// The kernel set a recipe rank must have run: none where LibTorch runs no OpenBLAS (PyTorch's
// wheel runs MKL); with OPENBLAS_CORETYPE preset in this test's environment (some machines preset
// it because other kernels compute wrong results there) the user's choice stands, so the rank runs
// what this process runs under the same variable; without it, kernels that fit the CPU
// (blas_core.h).
void expect_blas_core_of_a_rank(const nlohmann::json& config) {
  const auto core = config["blas_core"].get<std::string>();
  if (trainyard::blas_core_name().empty()) {
    EXPECT_EQ(core, "") << "LibTorch runs no OpenBLAS here, so the rank has no kernel set";
    return;
  }
  const char* preset = std::getenv("OPENBLAS_CORETYPE");
  if (preset != nullptr && *preset != '\0') {
    EXPECT_EQ(core, trainyard::blas_core_name()) << "OPENBLAS_CORETYPE=" << preset << " stands";
  } else {
    EXPECT_FALSE(trainyard::blas_core_for(core).has_value()) << core;
  }
}

// `trainyard run` hands its programs OPENBLAS_CORETYPE where OpenBLAS picks kernels below this
// CPU, never where the user set it or TRAINYARD_BLAS_CORE_FIX=0.
TEST(Recipe, LaunchedProgramsGetOpenBlasKernelsThatFitTheCpu) {
  auto core_seen = [](std::vector<std::pair<std::string, std::string>> env) {
    auto r = run_program({TRAINYARD_CLI_PATH, "run", "--nproc-per-node", "1", "--", "/bin/sh", "-c",
                          "echo \"CORE=[$OPENBLAS_CORETYPE]\""},
                         std::move(env));
    EXPECT_TRUE(r.status.success()) << r.out << r.err;
    return r.out;
  };
  EXPECT_NE(core_seen({{"OPENBLAS_CORETYPE", "Sandybridge"}}).find("CORE=[Sandybridge]"),
            std::string::npos)
      << "a user's OPENBLAS_CORETYPE stands";
  // The automatic choice, seen only where this machine's environment does not preset one (the
  // test process then shows OpenBLAS's own detection).
  const char* preset = std::getenv("OPENBLAS_CORETYPE");
  if (preset != nullptr && *preset != '\0') return;
  const auto fix = trainyard::blas_core_override();
  EXPECT_NE(core_seen({{"TRAINYARD_BLAS_CORE_FIX", "0"}}).find("CORE=[]"), std::string::npos);
  EXPECT_NE(core_seen({}).find("CORE=[" + fix.value_or("") + "]"), std::string::npos)
      << "expected the kernels " << fix.value_or("<none: OpenBLAS's choice fits>");
}

// A rank started without a trainyard parent (as torchrun would start it) re-executes itself with
// fitting kernels before training.
TEST(Recipe, ARankStartedByHandRunsOpenBlasKernelsThatFitTheCpu) {
  TempDir dir;
  int port = 0;
  trainyard::mptest::bind_loopback(/*listen=*/false, &port);  // closed again: free for rank 0
  auto r = run_program({TRAINYARD_CLI_PATH, "train", "fashion-mnist", "--workers", "1", "--epochs",
                        "1", "--limit", "256", "--storage", dir.str(), "--name", "by-hand"},
                       {{"RANK", "0"},
                        {"WORLD_SIZE", "1"},
                        {"LOCAL_RANK", "0"},
                        {"LOCAL_WORLD_SIZE", "1"},
                        {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", std::to_string(port)}},
                       60s);
  ASSERT_TRUE(r.status.success()) << r.out << r.err;
  expect_blas_core_of_a_rank(
      nlohmann::json::parse(read_file(dir.path() / "by-hand" / "config.json")));
}

TEST(Recipe, TwoWorkersOneEpochLearnAndWriteResults) {
  TempDir dir;
  auto r = run_program({TRAINYARD_CLI_PATH, "train", "fashion-mnist", "--workers", "2", "--epochs",
                        "1", "--limit", "6000", "--storage", dir.str(), "--name", "smoke"},
                       {}, 100s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_TRUE(r.status.success()) << r.out << r.err;

  // Per-epoch lines in the seed's shape from both ranks: 6,000 / 2 ranks / 128 = 24 steps.
  for (const char* rank : {"0", "1"}) {
    const std::string line = std::string("[Epoch 0 | CPU") + rank + ": Process rank " + rank +
                             " | Batchsize: 128 | Steps: 24 | Total epoch time: ";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
  EXPECT_NE(r.out.find("Training result"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checkpoint_dir_name   checkpoint_000000"), std::string::npos) << r.out;
  // No progress bar when the output is a pipe.
  EXPECT_EQ(r.out.find("Epoch 0 ["), std::string::npos) << r.out;

  auto result = nlohmann::json::parse(read_file(dir.path() / "smoke" / "result.json"));
  EXPECT_GT(result["accuracy"].get<double>(), 0.70) << result.dump();
  EXPECT_LT(result["loss"].get<double>(), 1.2) << result.dump();
  EXPECT_EQ(result["world_size"].get<int>(), 2);
  EXPECT_EQ(result["training_iteration"].get<int>(), 1);
  EXPECT_GT(result["train_samples_per_s"].get<double>(), 0);
  EXPECT_NE(r.out.find(std::to_string(result["accuracy"].get<double>()).substr(0, 5)),
            std::string::npos)
      << "the table shows result.json's accuracy";

  // The checkpoint loads into a fresh ResNet18 with torchvision's parameter names.
  auto model = trainyard::models::resnet18(1, 10);
  torch::load(model, (dir.path() / "smoke" / "checkpoint_000000" / "model.pt").string());
  auto params = model->named_parameters();
  ASSERT_TRUE(params.contains("layer4.1.bn2.weight"));
  EXPECT_EQ(params["conv1.weight"].sizes(), torch::IntArrayRef({64, 1, 7, 7}));
  auto config = nlohmann::json::parse(read_file(dir.path() / "smoke" / "config.json"));
  EXPECT_EQ(config["limit"].get<int>(), 6000);
  // The CLI re-executed itself if OpenBLAS had picked kernels below this CPU (blas_core.h).
  expect_blas_core_of_a_rank(config);
}

TEST(Recipe, MissingDataNamesTheFileAndThePackage) {
  TempDir dir;
  auto r = run_program({TRAINYARD_CLI_PATH, "train", "fashion-mnist", "--workers", "2",
                        "--data-dir", (dir.path() / "nothing").string(), "--storage", dir.str()},
                       {}, 60s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_FALSE(r.status.success());
  EXPECT_NE(r.err.find("train-images-idx3-ubyte.gz does not exist"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dataset-fashion-mnist"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Root Cause"), std::string::npos) << r.err;
}

TEST(Recipe, RejectsBadFlagsBeforeStartingRanks) {
  TempDir dir;
  auto r = run_program(
      {TRAINYARD_CLI_PATH, "train", "fashion-mnist", "--epochs", "0", "--storage", dir.str()});
  EXPECT_FALSE(r.status.success());
  EXPECT_NE(r.err.find("--epochs must be >= 1, got 0"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("Launching"), std::string::npos) << "no ranks for a bad flag: " << r.err;
}

}  // namespace
