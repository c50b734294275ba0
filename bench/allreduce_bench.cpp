// Bus bandwidth sweep of all-reduce, flat all-gather or flat reduce-scatter over the process group
// init() builds (shared memory on one host, Gloo otherwise; TRAINYARD_SHM=0 forces Gloo, whose
// flat collectives are a ring of send/recv), printed as nccl-tests prints it: size is the whole
// (W * n) tensor, algbw = size / time, busbw = algbw * 2(n-1)/n for all-reduce and
// algbw * (n-1)/n for all-gather and reduce-scatter. Run as the ranks of a job:
//   build/trainyard run --nproc-per-node 2 -- build/bench/allreduce_bench [--min-bytes 1024]
//       [--max-bytes 268435456] [--warmup 3] [--seconds-per-size 1.0] [--buffer ordinary|shared]
//       [--collective allreduce|all_gather|reduce_scatter]
// --buffer shared takes tensors from allocate_collective_buffer, as DDP's buckets and FSDP's flat
// parameters are: in place in shared memory under the shared-memory group; the flat collectives
// then also alias their slot (all-gather from its own slot, reduce-scatter into it).
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "trainyard/comm/collectives.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/comm/shm_process_group.h"
#include "trainyard/error.h"

namespace {

struct Args {
  std::int64_t min_bytes = 1 << 10;
  std::int64_t max_bytes = 256ll << 20;
  int warmup = 3;
  double seconds_per_size = 1.0;  // measuring budget per size; at least 3 iterations
  bool shared_buffer = false;     // --buffer shared
  std::string collective = "allreduce";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    TY_CHECK(i + 1 < argc, "flag ", flag, " needs a value");
    const char* v = argv[++i];
    if (flag == "--min-bytes")
      a.min_bytes = std::atoll(v);
    else if (flag == "--max-bytes")
      a.max_bytes = std::atoll(v);
    else if (flag == "--warmup")
      a.warmup = std::atoi(v);
    else if (flag == "--seconds-per-size")
      a.seconds_per_size = std::atof(v);
    else if (flag == "--buffer" &&
             (std::strcmp(v, "ordinary") == 0 || std::strcmp(v, "shared") == 0))
      a.shared_buffer = std::strcmp(v, "shared") == 0;
    else if (flag == "--collective" &&
             (std::strcmp(v, "allreduce") == 0 || std::strcmp(v, "all_gather") == 0 ||
              std::strcmp(v, "reduce_scatter") == 0))
      a.collective = v;
    else
      TY_CHECK(false, "unknown flag ", flag, "; see the usage at the top of allreduce_bench.cpp");
  }
  TY_CHECK(a.min_bytes >= 4 && a.max_bytes >= a.min_bytes, "need 4 <= --min-bytes <= --max-bytes");
  return a;
}

using Launch = std::function<c10::intrusive_ptr<c10d::Work>()>;

double time_collective(c10d::ProcessGroup& pg, const Launch& launch, int iters) {
  pg.barrier()->wait();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) launch()->wait();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

// The collective on a (numel,) float tensor (the whole W * n for the flat ones).
Launch make_launch(const Args& args,
                   const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                   std::int64_t numel) {
  namespace comm = trainyard::comm;
  auto flat = args.shared_buffer ? trainyard::allocate_collective_buffer(
                                       group, numel, torch::dtype(torch::kFloat32))
                                 : torch::zeros({numel}, torch::kFloat32);
  flat.fill_(1);
  if (args.collective == "allreduce")
    return [group, flat] {
      std::vector<torch::Tensor> v{flat};
      return group->allreduce(v);
    };
  const std::int64_t n = numel / group->getSize();
  auto slot = args.shared_buffer ? flat.narrow(0, group->getRank() * n, n)
                                 : torch::ones({n}, torch::kFloat32);
  if (args.collective == "all_gather")
    return [group, flat, slot] { return comm::all_gather_flat(group, flat, slot); };
  return [group, flat, slot] { return comm::reduce_scatter_flat(group, slot, flat); };
}

}  // namespace

int main(int argc, char** argv) try {
  const auto args = parse(argc, argv);
  auto dist = trainyard::init();
  auto& pg = *dist->process_group();
  const int n = dist->world_size();
  const bool allreduce = args.collective == "allreduce";
  const double bus_factor = n == 1 ? 1.0 : allreduce ? 2.0 * (n - 1) / n : 1.0 * (n - 1) / n;
  if (dist->rank() == 0) {
    std::printf("# %s, %s, %d ranks, %s buffers\n", args.collective.c_str(),
                pg.getBackendName().c_str(), n, args.shared_buffer ? "shared" : "ordinary");
    std::printf("# %12s %12s %6s %6s %10s %8s %8s\n", "size", "count", "type", "redop", "time",
                "algbw", "busbw");
    std::printf("# %12s %12s %6s %6s %10s %8s %8s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)",
                "(GB/s)");
  }
  double busbw_sum = 0;
  int sizes = 0;
  for (std::int64_t size = args.min_bytes; size <= args.max_bytes; size *= 2) {
    // Flat collectives need W equal slots: the whole tensor rounds down to a multiple of W floats.
    const std::int64_t numel = allreduce ? size / 4 : size / 4 / n * n;
    if (numel == 0) continue;
    const std::int64_t bytes = numel * 4;
    const auto launch = make_launch(args, dist->process_group(), numel);
    // Calibrate on rank 0's estimate so every rank runs the same number of iterations.
    double est = time_collective(pg, launch, std::max(1, args.warmup));
    auto iters_t = torch::tensor({std::max(3.0, args.seconds_per_size / std::max(est, 1e-6))});
    std::vector<torch::Tensor> v{iters_t};
    c10d::BroadcastOptions root0;
    pg.broadcast(v, root0)->wait();
    const int iters = static_cast<int>(std::min(1000.0, iters_t.item<double>()));
    const double secs = time_collective(pg, launch, iters);
    const double algbw = static_cast<double>(bytes) / secs / 1e9;
    const double busbw = algbw * bus_factor;
    busbw_sum += busbw;
    ++sizes;
    if (dist->rank() == 0) {
      std::printf("  %12lld %12lld %6s %6s %10.1f %8.3f %8.3f\n", static_cast<long long>(bytes),
                  static_cast<long long>(numel), "float",
                  args.collective == "all_gather" ? "none" : "sum", secs * 1e6, algbw, busbw);
      std::fflush(stdout);
    }
  }
  if (dist->rank() == 0) std::printf("# Avg bus bandwidth    : %.3f GB/s\n", busbw_sum / sizes);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
  return 1;
}
