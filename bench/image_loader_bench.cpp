// Does the ImageFolder loader keep a model fed? Measured side by side in one run:
//   1. decoding alone: JPEGs of ImageNet's typical size (500x375, quality 90) decoded on one
//      thread, images/s;
//   2. the loader: ImageFolderLoader with the train transform (RandomResizedCrop to --size, flip,
//      normalise) at each --threads count, images/s (and per thread);
//   3. the model: --model's training step (forward, backward, Adam) at --size on one LibTorch
//      thread, as each of 2 ranks on 2 cores runs it, images/s.
// The ratio model / loader-per-thread is the share of one core that decoding for one rank takes.
// Usage:
//   image_loader_bench [--images 256] [--threads "1 2"] [--size 224] [--batch 32]
//                      [--model resnet50] [--model-batch 8] [--steps 3] [--dir DIR] [--keep]
// The folder (DIR/train/<class>/*.jpg and DIR/val/...) is written under /tmp unless --dir names
// one; --keep leaves it for bench/image_folder.sh, which runs the recipe on it.
#include <torch/torch.h>
#include <turbojpeg.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "trainyard/data/image_decode.h"
#include "trainyard/data/image_folder.h"
#include "trainyard/error.h"
#include "trainyard/models/image_model.h"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Args {
  int images = 256;
  std::string threads = "1 2";
  int size = 224;
  int batch = 32;
  std::string model = "resnet50";
  int model_batch = 8;
  int steps = 3;
  std::string dir;
  bool keep = false;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A photo-like RGB image: smooth gradients and blobs plus noise, so that a JPEG of it has about
// the entropy (and the decoding cost) of a natural image, not of a flat one.
std::vector<std::uint8_t> synthetic_photo(int width, int height, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> noise(0, 12);
  const double fx = 2 + 6 * u(rng), fy = 2 + 6 * u(rng), phase = 6.28 * u(rng);
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const double sx = static_cast<double>(x) / width, sy = static_cast<double>(y) / height;
      for (int c = 0; c < 3; ++c) {
        const double v = 128 +
                         70 * std::sin(fx * sx * 6.28 + phase + c) * std::cos(fy * sy * 6.28 - c) +
                         40 * (sx - sy) + noise(rng);
        pixels[(static_cast<std::size_t>(y) * width + x) * 3 + c] =
            static_cast<std::uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  return pixels;
}

void write_jpeg(const fs::path& path, const std::vector<std::uint8_t>& rgb, int width, int height) {
  tjhandle handle = tjInitCompress();
  TY_CHECK(handle != nullptr, "tjInitCompress failed");
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(handle, rgb.data(), width, 0, height, TJPF_RGB, &out, &size,
                             TJSAMP_420, 90, TJFLAG_ACCURATEDCT);
  if (rc == 0) std::ofstream(path, std::ios::binary).write(reinterpret_cast<char*>(out), size);
  tjFree(out);
  tjDestroy(handle);
  TY_CHECK(rc == 0, "tjCompress2 failed for ", path.string());
}

// DIR/train/class_k/NNNN.jpg (`images` over 4 classes) and DIR/val/ (a quarter as many).
std::int64_t write_folder(const fs::path& dir, int images) {
  std::mt19937 rng(7);
  std::int64_t bytes = 0;
  constexpr int kClasses = 4, kWidth = 500, kHeight = 375;  // ImageNet's most common size
  for (const auto& [split, count] : {std::pair{"train", images}, std::pair{"val", images / 4}}) {
    for (int i = 0; i < std::max(count, kClasses); ++i) {
      const fs::path folder = dir / split / ("class_" + std::to_string(i % kClasses));
      fs::create_directories(folder);
      char name[32];
      std::snprintf(name, sizeof name, "%05d.jpg", i);
      write_jpeg(folder / name, synthetic_photo(kWidth, kHeight, rng), kWidth, kHeight);
      bytes += static_cast<std::int64_t>(fs::file_size(folder / name));
    }
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "image_loader_bench: %s needs a value\n", flag.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (flag == "--images")
      a.images = std::stoi(value());
    else if (flag == "--threads")
      a.threads = value();
    else if (flag == "--size")
      a.size = std::stoi(value());
    else if (flag == "--batch")
      a.batch = std::stoi(value());
    else if (flag == "--model")
      a.model = value();
    else if (flag == "--model-batch")
      a.model_batch = std::stoi(value());
    else if (flag == "--steps")
      a.steps = std::stoi(value());
    else if (flag == "--dir")
      a.dir = value();
    else if (flag == "--keep")
      a.keep = true;
    else {
      std::fprintf(stderr, "image_loader_bench: unknown flag '%s' (see the file's comment)\n",
                   flag.c_str());
      return 2;
    }
  }
  const fs::path dir = a.dir.empty() ? fs::temp_directory_path() /
                                           ("image_loader_bench." + std::to_string(::getpid()))
                                     : fs::path(a.dir);
  try {
    torch::set_num_threads(1);
    auto t0 = Clock::now();
    const std::int64_t bytes = write_folder(dir, a.images);
    std::printf("wrote %d training JPEGs of 500x375 (%.1f KB each on average) in %.1f s to %s\n",
                a.images, bytes / 1e3 / (a.images + a.images / 4), seconds_since(t0), dir.c_str());

    // 1. Decoding alone, one thread.
    const trainyard::data::ImageFolder train((dir / "train").string());
    t0 = Clock::now();
    for (const auto& s : train.samples()) trainyard::data::decode_image_file(s.path);
    const double decode_rate = static_cast<double>(train.size()) / seconds_since(t0);
    std::printf("%-44s %9.1f images/s\n", "decode only (TurboJPEG), 1 thread", decode_rate);

    // 2. The loader with the train transform.
    std::vector<std::int64_t> indices(static_cast<std::size_t>(train.size()));
    for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<std::int64_t>(i);
    double best_per_thread = 0;
    std::istringstream thread_counts(a.threads);
    for (int threads; thread_counts >> threads;) {
      trainyard::data::ImageFolderLoader loader(
          train, indices,
          {.batch_size = a.batch,
           .threads = threads,
           .transform = {.kind = trainyard::data::ImageTransform::kTrain, .size = a.size}});
      t0 = Clock::now();
      std::int64_t n = 0;
      while (auto batch = loader.next()) n += batch->inputs.size(0);
      const double rate = static_cast<double>(n) / seconds_since(t0);
      best_per_thread = std::max(best_per_thread, rate / threads);
      char label[64];
      std::snprintf(label, sizeof label, "loader, train transform to %d, %d thread(s)", a.size,
                    threads);
      std::printf("%-44s %9.1f images/s (%.1f per thread)\n", label, rate, rate / threads);
    }

    // 3. The model's training step on one thread.
    auto model = trainyard::models::image_model(a.model, 3, 1000);
    model->train();
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
    auto x = torch::randn({a.model_batch, 3, a.size, a.size});
    auto y = torch::randint(1000, {a.model_batch}, torch::kInt64);
    auto step = [&] {
      adam.zero_grad();
      torch::cross_entropy_loss(model->forward(x), y).backward();
      adam.step();
    };
    step();  // warm-up: allocations, oneDNN primitives
    t0 = Clock::now();
    for (int s = 0; s < a.steps; ++s) step();
    const double model_rate = a.steps * a.model_batch / seconds_since(t0);
    char label[64];
    std::snprintf(label, sizeof label, "%s training step at %d, 1 thread", a.model.c_str(), a.size);
    std::printf("%-44s %9.1f images/s\n", label, model_rate);
    std::printf(
        "a rank training %s needs %.1f%% of one loader thread (model %.1f / loader %.1f "
        "images/s per thread): %s\n",
        a.model.c_str(), 100 * model_rate / best_per_thread, model_rate, best_per_thread,
        model_rate < best_per_thread ? "one loader thread keeps it fed"
                                     : "more loader threads are needed");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "image_loader_bench: error: %s\n", e.what());
    if (!a.keep) fs::remove_all(dir);
    return 1;
  }
  if (!a.keep) fs::remove_all(dir);
  return 0;
}
