// The image-folder recipe on a GPU through the real CLI: a tiny ImageFolder (three classes told
// apart by their dominant colour) trained by one rank with --device cuda, accuracy above chance on
// val/, and a second start of the same run with one more epoch that resumes from the checkpoint
// onto the GPU and trains that epoch. Skips, saying why, where the build has no CUDA or no GPU is
// visible (CI); runs on a GPU machine (bench/gpu/device_check.sh).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../image_fixtures.h"
#include "../multiproc/multiproc_util.h"
#include "../text.h"
#include "require_gpu.h"
#include "trainyard/data/image_decode.h"

namespace {
namespace fs = std::filesystem;
using trainyard::mptest::read_file;
using trainyard::mptest::run_program;
using trainyard::mptest::TempDir;
using namespace std::chrono_literals;

// Folder names sort as blue, green, red: labels 0..2, each the index of its bright channel.
constexpr const char* kClasses[] = {"blue", "green", "red"};
constexpr int kBrightChannel[] = {2, 1, 0};
constexpr int kClassCount = 3;
constexpr int kTrainPerClass = 32;
constexpr int kValPerClass = 8;
constexpr int kSide = 12;  // pixels; --image-size 16 resizes the crops up
constexpr int kBatchSize = 8;
// 96 training images on one rank: 12 full batches of 8 per epoch.
constexpr int kStepsPerEpoch = kClassCount * kTrainPerClass / kBatchSize;

// root/<class>/NNN.png: RGB noise around a bright class channel (~200) and two dark ones (~50),
// so that any crop of an image tells its class.
void write_split(const fs::path& root, int per_class, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> noise(-30, 30);
  for (int c = 0; c < kClassCount; ++c) {
    fs::create_directories(root / kClasses[c]);
    for (int i = 0; i < per_class; ++i) {
      trainyard::data::RgbImage image(kSide, kSide);
      for (int y = 0; y < kSide; ++y)
        for (int x = 0; x < kSide; ++x)
          for (int ch = 0; ch < 3; ++ch)
            image.at(y, x)[ch] =
                static_cast<std::uint8_t>((ch == kBrightChannel[c] ? 200 : 50) + noise(gen));
      char stem[16];
      std::snprintf(stem, sizeof(stem), "%03d.png", i);
      ASSERT_NO_FATAL_FAILURE(
          trainyard::test::write_png_rgb((root / kClasses[c] / stem).string(), image));
    }
  }
}

using trainyard::test::contains;

// `trainyard train image-folder` run bare with one rank on the GPU, for `epochs` epochs of the run
// DIR/<name>. Debug logs name the device the process group is on.
trainyard::mptest::RunOutput train_on_gpu(const TempDir& dir, const std::string& name, int epochs) {
  return run_program({TRAINYARD_CLI_PATH,
                      "train",
                      "image-folder",
                      "--device",
                      "cuda",
                      "--workers",
                      "1",
                      "--data",
                      (dir.path() / "data").string(),
                      "--model",
                      "resnet18",
                      "--image-size",
                      "16",
                      "--epochs",
                      std::to_string(epochs),
                      "--batch-size",
                      std::to_string(kBatchSize),
                      "--loader-threads",
                      "2",
                      "--seed",
                      "1",
                      "--storage",
                      dir.str(),
                      "--name",
                      name,
                      "--no-progress"},
                     {{"TRAINYARD_LOG_LEVEL", "debug"}}, 50s);
}

using trainyard::mptest::result_of;

TEST(GpuRecipes, ImageFolderTrainsOnTheGpuAndResumesThere) {
  REQUIRE_GPU();
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(write_split(dir.path() / "data" / "train", kTrainPerClass, 1));
  ASSERT_NO_FATAL_FAILURE(write_split(dir.path() / "data" / "val", kValPerClass, 2));

  // Two epochs from scratch.
  auto r = train_on_gpu(dir, "imgs", 2);
  const std::string all = r.out + r.err;
  ASSERT_FALSE(r.timed_out) << all;
  ASSERT_TRUE(r.status.success()) << all;
  EXPECT_TRUE(contains(all, "process group ready on cuda:0")) << "not on the GPU:\n" << all;
  EXPECT_TRUE(contains(r.out, "Training result")) << r.out;
  const auto first = result_of(dir.path(), "imgs");
  EXPECT_GT(first["accuracy"].get<double>(), 1.0 / kClassCount) << "above chance: " << first.dump();
  EXPECT_GT(first["loss"].get<double>(), 0) << first.dump();
  EXPECT_EQ(first["val_images"].get<int>(), kClassCount * kValPerClass) << first.dump();
  EXPECT_EQ(first["global_step"].get<int>(), 2 * kStepsPerEpoch) << first.dump();
  EXPECT_EQ(first["skipped_images"].get<int>(), 0) << first.dump();

  // The same run with a third epoch: it loads the checkpoint (model and Adam moments) onto the
  // GPU, trains epoch 2 alone, and evaluates again.
  auto again = train_on_gpu(dir, "imgs", 3);
  const std::string all_again = again.out + again.err;
  ASSERT_FALSE(again.timed_out) << all_again;
  ASSERT_TRUE(again.status.success()) << all_again;
  EXPECT_TRUE(contains(all_again, "process group ready on cuda:0")) << all_again;
  EXPECT_TRUE(contains(again.out, "Resuming from checkpoint_")) << again.out;
  EXPECT_TRUE(contains(
      again.out, "at step " + std::to_string(2 * kStepsPerEpoch) + " (epoch 2, 0 samples into it)"))
      << again.out;
  EXPECT_FALSE(contains(again.out, "[Epoch 0 ")) << "epoch 0 trained again: " << again.out;
  EXPECT_TRUE(contains(again.out, "[Epoch 2 ")) << again.out;
  const auto second = result_of(dir.path(), "imgs");
  EXPECT_EQ(second["global_step"].get<int>(), 3 * kStepsPerEpoch) << second.dump();
  EXPECT_GT(second["accuracy"].get<double>(), 1.0 / kClassCount)
      << "above chance: " << second.dump();
}

}  // namespace
