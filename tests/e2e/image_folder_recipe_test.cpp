// The image-folder recipe end to end through the real CLI: an ImageFolder made of FashionMNIST
// images (greyscale PNGs and JPEGs, one corrupt file), ResNet18 at 32x32 on two ranks under
// `trainyard run`, accuracy above chance on val/, and a second start of the same run that resumes
// from its checkpoint and trains nothing more. Also: bad flags fail before any rank starts.
#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../image_fixtures.h"
#include "../multiproc/multiproc_util.h"
#include "../text.h"
#include "trainyard/data/fashion_mnist.h"

namespace {
namespace fs = std::filesystem;
using trainyard::mptest::read_file;
using trainyard::mptest::run_program;
using trainyard::mptest::TempDir;
using trainyard::test::jpeg_bytes;
using trainyard::test::write_bytes;
using trainyard::test::write_png;
using namespace std::chrono_literals;

// FashionMNIST classes that a few dozen images each tell apart: T-shirt/top, Trouser, Sneaker,
// Bag. The folder names sort as bag, sneaker, trouser, tshirt: labels 0..3.
struct FolderClass {
  std::int64_t label;  // FashionMNIST's
  const char* folder;
};
constexpr FolderClass kClasses[] = {{0, "tshirt"}, {1, "trouser"}, {7, "sneaker"}, {8, "bag"}};
constexpr int kClassCount = 4;
constexpr int kTrainPerClass = 64;
constexpr int kValPerClass = 16;
// Sorts last in bag/; its samples are replaced by sneaker/'s first image.
constexpr const char* kCorruptFile = "train/bag/zz_corrupt.jpg";

// The first `per_class` images of each class of `set` as root/<class>/NNN.{png,jpg}: greyscale,
// 28x28, even ones as PNG, odd ones as JPEG (quality 95). Fatal failures return early.
void write_split(const trainyard::data::FashionMnist& set, const fs::path& root, int per_class) {
  const auto images = set.images.contiguous();  // (N, 28, 28) uint8
  const auto labels = set.labels.contiguous();  // (N,) int64
  const auto* label = labels.data_ptr<std::int64_t>();
  const auto* pixel = images.data_ptr<std::uint8_t>();
  constexpr int kSide = 28;
  for (const auto& c : kClasses) {
    fs::create_directories(root / c.folder);
    int written = 0;
    for (std::int64_t i = 0; i < set.size() && written < per_class; ++i) {
      if (label[i] != c.label) continue;
      const std::vector<std::uint8_t> grey(pixel + i * kSide * kSide,
                                           pixel + (i + 1) * kSide * kSide);
      char stem[16];
      std::snprintf(stem, sizeof(stem), "%03d", written);
      const auto path = (root / c.folder / stem).string();
      if (written % 2 == 0) {
        ASSERT_NO_FATAL_FAILURE(write_png(
            path + ".png",
            {.width = kSide, .height = kSide, .color_type = PNG_COLOR_TYPE_GRAY, .rows = grey}));
      } else {
        const auto jpeg = jpeg_bytes(grey, kSide, kSide, TJPF_GRAY, TJSAMP_GRAY, 95);
        ASSERT_FALSE(jpeg.empty()) << path;
        ASSERT_NO_FATAL_FAILURE(write_bytes(path + ".jpg", jpeg));
      }
      ++written;
    }
    ASSERT_EQ(written, per_class) << "too few FashionMNIST images of label " << c.label;
  }
}

// DIR/train (kTrainPerClass images per class from FashionMNIST's training split, plus
// kCorruptFile) and DIR/val (kValPerClass per class from its test split).
void write_image_folder(const fs::path& dir) {
  using trainyard::data::load_fashion_mnist;
  using trainyard::data::Split;
  const std::string source = trainyard::data::kFashionMnistDir;
  ASSERT_NO_FATAL_FAILURE(
      write_split(load_fashion_mnist(source, Split::kTrain, 2000), dir / "train", kTrainPerClass));
  ASSERT_NO_FATAL_FAILURE(
      write_split(load_fashion_mnist(source, Split::kTest, 1000), dir / "val", kValPerClass));
  const std::string text = "this is not a JPEG";
  ASSERT_NO_FATAL_FAILURE(write_bytes((dir / kCorruptFile).string(),
                                      std::vector<std::uint8_t>(text.begin(), text.end())));
}

bool fashion_mnist_present() {
  return fs::exists(fs::path(trainyard::data::kFashionMnistDir) / "train-images-idx3-ubyte.gz");
}

using trainyard::test::contains;

using trainyard::mptest::result_of;

// Two ranks under `trainyard run`: 257 training files / 2 ranks = 129 each (the sampler pads one),
// 8 full batches of 16 per epoch (Note [Full training batches]); 5 epochs are 40 steps.
constexpr int kEpochs = 5;
constexpr int kStepsPerEpoch = 8;

std::vector<std::string> two_ranks(const TempDir& dir, const std::string& name) {
  return {TRAINYARD_CLI_PATH,
          "run",
          "--nproc-per-node",
          "2",
          "--",
          TRAINYARD_CLI_PATH,
          "train",
          "image-folder",
          "--data",
          (dir.path() / "data").string(),
          "--model",
          "resnet18",
          "--image-size",
          "32",
          "--epochs",
          std::to_string(kEpochs),
          "--batch-size",
          "16",
          "--loader-threads",
          "1",
          "--seed",
          "1",
          "--storage",
          dir.str(),
          "--name",
          name,
          "--no-progress"};
}

TEST(ImageFolderRecipe, TwoRanksLearnSkipTheCorruptFileAndTheRunResumes) {
  if (!fashion_mnist_present())
    TY_MISSING_PREREQUISITE("Debian's dataset-fashion-mnist is not installed");
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(write_image_folder(dir.path() / "data"));

  auto r = run_program(two_ranks(dir, "imgs"), {}, 70s);
  const std::string all = r.out + r.err;
  ASSERT_FALSE(r.timed_out) << all;
  ASSERT_TRUE(r.status.success()) << all;

  // Both ranks trained every epoch, in the seed's per-epoch line.
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    for (const char* rank : {"0", "1"}) {
      const std::string line =
          "[Epoch " + std::to_string(epoch) + " | CPU" + rank + ": Process rank " + rank +
          " | Batchsize: 16 | Steps: " + std::to_string(kStepsPerEpoch) + " | Total epoch time: ";
      EXPECT_TRUE(contains(r.out, line)) << line << "\n" << r.out;
    }
  }
  // The corrupt file is named where a rank first met it, and counted.
  const std::string corrupt = (dir.path() / "data" / kCorruptFile).string();
  EXPECT_TRUE(contains(all, "Cannot decode " + corrupt)) << all;
  EXPECT_TRUE(contains(all, "Skipped")) << all;
  EXPECT_TRUE(contains(r.out, "Training result")) << r.out;
  EXPECT_TRUE(contains(r.out, "top5_accuracy")) << r.out;

  const auto first = result_of(dir.path(), "imgs");
  EXPECT_GT(first["accuracy"].get<double>(), 1.0 / kClassCount) << "above chance: " << first.dump();
  // With fewer than five classes top-5 is top-4: every label is among them (Note [Top-5 with few
  // classes] in src/train/image_folder_recipe.cpp).
  EXPECT_DOUBLE_EQ(first["top5_accuracy"].get<double>(), 1.0) << first.dump();
  EXPECT_GT(first["loss"].get<double>(), 0) << first.dump();
  EXPECT_EQ(first["val_images"].get<int>(), kClassCount * kValPerClass) << first.dump();
  EXPECT_EQ(first["corrupt_files"].get<int>(), 1) << first.dump();
  EXPECT_GE(first["skipped_images"].get<int>(), 1) << first.dump();
  EXPECT_EQ(first["global_step"].get<int>(), kEpochs * kStepsPerEpoch) << first.dump();
  EXPECT_EQ(first["world_size"].get<int>(), 2);
  EXPECT_GT(first["train_samples_per_s"].get<double>(), 0);
  EXPECT_EQ(first["checkpoint_dir_name"].get<std::string>(), "checkpoint_000000");
  auto config = nlohmann::json::parse(read_file(dir.path() / "imgs" / "config.json"));
  EXPECT_EQ(config["model"].get<std::string>(), "resnet18");
  EXPECT_EQ(config["num_classes"].get<int>(), kClassCount);
  EXPECT_EQ(config["train_images"].get<int>(), kClassCount * kTrainPerClass + 1);

  // The same command again: it resumes after the last epoch, trains nothing and evaluates the
  // checkpoint, which is the model the first run evaluated.
  auto again = run_program(two_ranks(dir, "imgs"), {}, 40s);
  ASSERT_FALSE(again.timed_out) << again.out << again.err;
  ASSERT_TRUE(again.status.success()) << again.out << again.err;
  EXPECT_TRUE(contains(again.out, "Resuming from checkpoint_000000 at step " +
                                      std::to_string(kEpochs * kStepsPerEpoch) + " (epoch " +
                                      std::to_string(kEpochs) + ", 0 samples into it)"))
      << again.out;
  EXPECT_FALSE(contains(again.out, "[Epoch ")) << "no epoch is trained again: " << again.out;
  const auto second = result_of(dir.path(), "imgs");
  EXPECT_EQ(second["global_step"].get<int>(), kEpochs * kStepsPerEpoch) << second.dump();
  EXPECT_DOUBLE_EQ(second["accuracy"].get<double>(), first["accuracy"].get<double>());
  EXPECT_NEAR(second["loss"].get<double>(), first["loss"].get<double>(),
              1e-5 * first["loss"].get<double>())
      << "the same model on the same images";
}

// `trainyard train image-folder ARGS` run bare; the flags are checked before any rank starts.
trainyard::mptest::RunOutput bare(const TempDir& dir, std::vector<std::string> args) {
  std::vector<std::string> argv = {TRAINYARD_CLI_PATH, "train",  "image-folder", "--workers", "2",
                                   "--storage",        dir.str()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv, {}, 30s);
}

TEST(ImageFolderRecipe, BadFlagsFailBeforeStartingRanksAndNameTheProblem) {
  TempDir dir;
  const fs::path data = dir.path() / "data";  // train/ and val/ (empty classes: never scanned)
  fs::create_directories(data / "train" / "cats");
  fs::create_directories(data / "val" / "cats");
  const fs::path no_val = dir.path() / "no_val";
  fs::create_directories(no_val / "train" / "cats");
  const std::string missing = (dir.path() / "nowhere").string();

  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> expected;  // parts of the message
  };
  const std::vector<Case> cases = {
      {{}, {"--data is required", "train/ and val/"}},
      {{"--data", missing}, {"--data " + missing + " does not exist", "HINT"}},
      {{"--data", no_val.string()},
       {"has no val/ folder", (no_val / "val").string() + " does not exist"}},
      {{"--data", data.string(), "--model", "resnet9"},
       {"--model resnet9 is not a model", "resnet50", "efficientnet_b7"}},
      {{"--data", data.string(), "--image-size", "0"}, {"--image-size must be >= 1, got 0"}},
      {{"--data", data.string(), "--loader-threads", "0"}, {"--loader-threads must be >= 1"}},
  };
  for (const auto& c : cases) {
    std::string flags;
    for (const auto& a : c.args) flags += " " + a;
    const auto r = bare(dir, c.args);
    ASSERT_FALSE(r.timed_out) << flags;
    EXPECT_FALSE(r.status.success()) << flags << ": " << r.out << r.err;
    for (const auto& part : c.expected)
      EXPECT_TRUE(contains(r.err, part)) << flags << ": expected '" << part << "' in\n" << r.err;
    EXPECT_FALSE(contains(r.err, "Launching")) << "no ranks for a bad flag: " << r.err;
  }
}

// val/ with classes train/ lacks is found by the ranks, which scan the folders: the run fails
// naming the classes on each side.
TEST(ImageFolderRecipe, DifferentClassFoldersInTrainAndValAreNamed) {
  TempDir dir;
  const fs::path data = dir.path() / "data";
  const trainyard::data::RgbImage image(8, 8);
  for (const char* folder : {"train/cats", "train/dogs", "val/cats", "val/birds"}) {
    fs::create_directories(data / folder);
    ASSERT_NO_FATAL_FAILURE(
        trainyard::test::write_png_rgb((data / folder / "a.png").string(), image));
  }
  auto r = run_program({TRAINYARD_CLI_PATH, "train", "image-folder", "--workers", "1", "--data",
                        data.string(), "--model", "resnet18", "--storage", dir.str()},
                       {}, 60s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_FALSE(r.status.success());
  EXPECT_TRUE(contains(r.err, "only in train/: dogs; only in val/: birds")) << r.err;
  EXPECT_TRUE(contains(r.err, "Root Cause")) << r.err;
}

}  // namespace
