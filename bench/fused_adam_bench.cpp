// FusedAdamW against torch::optim::AdamW, and FusedAdam against torch::optim::Adam, on what FSDP
// hands its optimizer: a few large flat fp32 tensors, one per unit. For each intra-op thread
// count, shape and pair, the stock and the fused optimizer step the same parameters in turn
// (alternating, so that drift in the machine's speed hits both alike), after one warm-up step
// each that allocates the moments. Prints the median and fastest step time of each, the ratio of
// the medians, the fused step's memory traffic (28 bytes an element: parameter and both moments
// read and written, gradient read) and the page faults per stock step (its temporaries are as
// large as the parameter; glibc maps and unmaps allocations that large, so each one is faulted in
// again every step).
//   build/bench/fused_adam_bench [--repeats 7] [--threads 1,2]
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "trainyard/error.h"
#include "trainyard/optim/fused_adam.h"
#include "trainyard/optim/fused_adamw.h"

namespace {

struct Args {
  int repeats = 7;
  std::vector<int> threads = {1, 2};
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    TY_CHECK(i + 1 < argc, "flag ", flag, " needs a value");
    const std::string v = argv[++i];
    if (flag == "--repeats") {
      a.repeats = std::atoi(v.c_str());
    } else if (flag == "--threads") {
      a.threads.clear();
      std::stringstream list(v);
      for (std::string n; std::getline(list, n, ',');) a.threads.push_back(std::atoi(n.c_str()));
    } else {
      TY_CHECK(false, "unknown flag ", flag, "; see the usage at the top of fused_adam_bench.cpp");
    }
  }
  TY_CHECK(a.repeats >= 1, "need --repeats >= 1, got ", a.repeats);
  for (int t : a.threads) TY_CHECK(t >= 1, "need --threads >= 1 each, got ", t);
  return a;
}

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// One step's wall time and minor page faults.
struct Sample {
  double ms;
  long faults;
};

Sample step(torch::optim::Optimizer& optimizer) {
  const long faults = minor_faults();
  const auto start = std::chrono::steady_clock::now();
  optimizer.step();
  const auto end = std::chrono::steady_clock::now();
  return {std::chrono::duration<double, std::milli>(end - start).count(), minor_faults() - faults};
}

struct Summary {
  double median_ms, min_ms, faults_per_step;
};

Summary summarize(const std::vector<Sample>& samples) {
  std::vector<double> ms;
  double faults = 0;
  for (const auto& s : samples) {
    ms.push_back(s.ms);
    faults += static_cast<double>(s.faults) / static_cast<double>(samples.size());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), faults};
}

struct Shape {
  const char* name;
  int64_t count, numel;  // `count` flat tensors of `numel` elements
};

// Flat fp32 parameters with fixed random gradients.
std::vector<torch::Tensor> make_params(const Shape& s) {
  std::vector<torch::Tensor> params;
  for (int64_t i = 0; i < s.count; ++i) {
    auto p = torch::randn({s.numel}).set_requires_grad(true);
    p.mutable_grad() = torch::randn({s.numel});
    params.push_back(p);
  }
  return params;
}

}  // namespace

int main(int argc, char** argv) try {
  const auto args = parse(argc, argv);
  torch::manual_seed(0);
  const std::vector<Shape> shapes = {{"1 x 70M", 1, 70'000'000}, {"12 x 6M", 12, 6'000'000}};
  std::vector<std::vector<torch::Tensor>> params;
  for (const auto& s : shapes) params.push_back(make_params(s));
  // The FSDP example's options (weight decay left at AdamW's default, 0.01); Adam with the same.
  const auto adamw = torch::optim::AdamWOptions(2e-5).eps(1e-8);
  const auto adam = torch::optim::AdamOptions(2e-5).eps(1e-8).weight_decay(0.01);

  std::printf(
      "# step time in ms, median (fastest) of %d, stock and fused alternating; lr 2e-5, "
      "eps 1e-8, weight decay 0.01\n",
      args.repeats);
  std::printf("%-6s %-8s %7s %17s %17s %12s %10s %13s\n", "pair", "shape", "threads", "stock ms",
              "fused ms", "stock/fused", "fused GB/s", "stock faults");
  for (const int threads : args.threads) {
    torch::set_num_threads(threads);
    for (size_t s = 0; s < shapes.size(); ++s) {
      for (const bool w : {true, false}) {
        std::unique_ptr<torch::optim::Optimizer> stock, fused;
        if (w) {
          stock = std::make_unique<torch::optim::AdamW>(params[s], adamw);
          fused = std::make_unique<trainyard::optim::FusedAdamW>(params[s], adamw);
        } else {
          stock = std::make_unique<torch::optim::Adam>(params[s], adam);
          fused = std::make_unique<trainyard::optim::FusedAdam>(params[s], adam);
        }
        step(*stock);  // warm-up: allocates the moments
        step(*fused);
        std::vector<Sample> stock_samples, fused_samples;
        for (int r = 0; r < args.repeats; ++r) {
          stock_samples.push_back(step(*stock));
          fused_samples.push_back(step(*fused));
        }
        const auto st = summarize(stock_samples), fu = summarize(fused_samples);
        const double bytes = 28.0 * static_cast<double>(shapes[s].count * shapes[s].numel);
        std::printf("%-6s %-8s %7d %8.1f (%6.1f) %8.1f (%6.1f) %11.2fx %10.1f %13.0f\n",
                    w ? "AdamW" : "Adam", shapes[s].name, threads, st.median_ms, st.min_ms,
                    fu.median_ms, fu.min_ms, st.median_ms / fu.median_ms,
                    bytes / (fu.median_ms * 1e6), st.faults_per_step);
        std::fflush(stdout);
      }
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fused_adam_bench: %s\n", e.what());
  return 1;
}
