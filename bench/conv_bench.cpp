// Per-tap weight gradient (Note [Per-tap weight gradient], src/models/tap_conv2d.cpp) against
// LibTorch's oneDNN backward-weights kernel, measured side by side in one run:
//   1. each distinct convolution of ResNet-18 on 28x28 FashionMNIST images, batch 128;
//   2. a whole ResNet-18 training step (forward, loss, backward) with and without it.
// One intra-op thread, as each rank of the recipe runs.
//   build/bench/conv_bench [--batch 128] [--repeats 7] [--threads 1]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "trainyard/blas_core.h"
#include "trainyard/error.h"
#include "trainyard/models/resnet.h"
#include "trainyard/models/tap_conv2d.h"

namespace {

struct Args {
  int64_t batch = 128;
  int repeats = 7;
  int threads = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    TY_CHECK(i + 1 < argc, "flag ", flag, " needs a value");
    const char* v = argv[++i];
    if (flag == "--batch")
      a.batch = std::atoll(v);
    else if (flag == "--repeats")
      a.repeats = std::atoi(v);
    else if (flag == "--threads")
      a.threads = std::atoi(v);
    else
      TY_CHECK(false, "unknown flag ", flag, "; see the usage at the top of conv_bench.cpp");
  }
  TY_CHECK(a.batch >= 1 && a.repeats >= 2 && a.threads >= 1,
           "need --batch >= 1, --repeats >= 2, --threads >= 1");
  return a;
}

// Median wall time in ms over `repeats` calls, after one warm-up call.
double median_ms(const std::function<void()>& fn, int repeats) {
  fn();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

struct ConvShape {
  int64_t in, out, kernel, stride, map;  // map: input height = width
};

}  // namespace

int main(int argc, char** argv) try {
  trainyard::reexec_if_blas_core_misdetected(argv);
  const auto args = parse(argc, argv);
  torch::set_num_threads(args.threads);
  torch::manual_seed(0);
  const std::vector<ConvShape> shapes = {
      {64, 64, 3, 1, 7},   {64, 128, 3, 2, 7},  {128, 128, 3, 1, 4}, {128, 256, 3, 2, 4},
      {256, 256, 3, 1, 2}, {256, 512, 3, 2, 2}, {512, 512, 3, 1, 1}, {64, 128, 1, 2, 7},
      {128, 256, 1, 2, 4}, {256, 512, 1, 2, 2},
  };
  std::printf("# weight gradient, batch %lld, %d thread(s), median of %d\n",
              static_cast<long long>(args.batch), args.threads, args.repeats);
  std::printf("%-24s %6s %10s %10s %8s %10s\n", "conv (in->out kxk /s @map)", "live", "oneDNN ms",
              "per-tap ms", "speedup", "max relerr");
  for (const auto& s : shapes) {
    const int64_t pad = s.kernel / 2;
    auto x = torch::randn({args.batch, s.in, s.map, s.map});
    auto w = torch::randn({s.out, s.in, s.kernel, s.kernel});
    auto g = torch::randn_like(torch::conv2d(x, w, {}, s.stride, pad));
    torch::Tensor reference, per_tap;
    const double onednn = median_ms(
        [&] {
          reference = std::get<1>(at::convolution_backward(g, x, w, c10::nullopt,
                                                           {s.stride, s.stride}, {pad, pad}, {1, 1},
                                                           false, {0, 0}, 1, {false, true, false}));
        },
        args.repeats);
    const double tap = median_ms(
        [&] {
          per_tap = trainyard::models::conv2d_weight_grad_per_tap(g, x, {s.kernel, s.kernel},
                                                                  {s.stride, s.stride}, {pad, pad});
        },
        args.repeats);
    const double err = ((per_tap - reference).abs().max() / reference.abs().max()).item<double>();
    char name[64];
    std::snprintf(name, sizeof name, "%lld->%lld %lldx%lld /%lld @%lld", (long long)s.in,
                  (long long)s.out, (long long)s.kernel, (long long)s.kernel, (long long)s.stride,
                  (long long)s.map);
    const double live = trainyard::models::live_fraction({s.kernel, s.kernel}, {s.stride, s.stride},
                                                         {pad, pad}, {s.map, s.map});
    std::printf("%-24s %6.2f %10.2f %10.2f %7.2fx %10.1e\n", name, live, onednn, tap, onednn / tap,
                err);
  }

  // Whole training steps, alternating the two models so that drift hits both alike.
  auto x = torch::randn({args.batch, 1, 28, 28});
  auto y = torch::randint(0, 10, {args.batch});
  auto step = [&](trainyard::models::ResNet& m) {
    return median_ms(
        [&] {
          m->zero_grad();
          torch::nn::functional::cross_entropy(m->forward(x), y).backward();
        },
        args.repeats);
  };
  auto stock = trainyard::models::resnet18(1, 10, /*max_live_fraction=*/0);
  auto tapped = trainyard::models::resnet18(1, 10);
  double stock_ms = 0, tapped_ms = 0;
  for (int round = 0; round < 3; ++round) {
    stock_ms += step(stock) / 3;
    tapped_ms += step(tapped) / 3;
  }
  std::printf("\n# ResNet-18 training step (forward+backward), batch %lld\n",
              static_cast<long long>(args.batch));
  std::printf(
      "oneDNN everywhere            %8.1f ms\nper-tap at live <= %.2f      %8.1f ms\n"
      "speedup %.2fx\n",
      stock_ms, trainyard::models::kMaxLiveFraction, tapped_ms, stock_ms / tapped_ms);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "conv_bench: %s\n", e.what());
  return 1;
}
