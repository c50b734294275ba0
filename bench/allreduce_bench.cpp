// Bus bandwidth sweep of one collective over the process group init() builds (shared memory on
// one host, Gloo otherwise; TRAINYARD_SHM=0 forces Gloo, whose flat collectives are a ring of
// send/recv): a thin wrapper over comm::run_collective_bench, which `trainyard bench collectives`
// also runs (all four collectives, nccl-tests' format: Note [nccl-tests layout] in
// src/comm/collective_bench.cpp). Size is the whole (W * n) tensor, algbw = size / time, busbw =
// algbw * 2(n-1)/n for all-reduce and algbw * (n-1)/n for all-gather and reduce-scatter, as
// nccl-tests defines them. Every result is checked; a wrong element exits 1. Run as the ranks of
// a job:
//   build/trainyard run --nproc-per-node 2 -- build/bench/allreduce_bench [--min-bytes 1024]
//       [--max-bytes 268435456] [--warmup 3] [--seconds-per-size 1.0] [--buffer ordinary|shared]
//       [--collective allreduce|all_gather|reduce_scatter|broadcast]
// --buffer shared takes tensors from allocate_collective_buffer, as DDP's buckets and FSDP's flat
// parameters are: in place in shared memory under the shared-memory group; the flat collectives
// then also alias their slot (all-gather from its own slot, reduce-scatter into it).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "trainyard/comm/collective_bench.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/error.h"

namespace {

trainyard::comm::CollectiveBenchOptions parse(int argc, char** argv) {
  using trainyard::comm::BenchBuffer;
  trainyard::comm::CollectiveBenchOptions o{.ops = {trainyard::comm::BenchOp::kAllReduce},
                                            .min_bytes = 1 << 10,
                                            .max_bytes = 256ll << 20,
                                            .warmup_iters = 3,
                                            .seconds_per_size = 1.0};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    TY_CHECK(i + 1 < argc, "flag ", flag, " needs a value");
    const std::string v = argv[++i];
    if (flag == "--min-bytes")
      o.min_bytes = trainyard::comm::parse_bench_bytes(v, flag);
    else if (flag == "--max-bytes")
      o.max_bytes = trainyard::comm::parse_bench_bytes(v, flag);
    else if (flag == "--warmup")
      o.warmup_iters = std::atoi(v.c_str());
    else if (flag == "--seconds-per-size")
      o.seconds_per_size = std::atof(v.c_str());
    else if (flag == "--buffer" && (v == "ordinary" || v == "shared"))
      o.buffer = v == "shared" ? BenchBuffer::kShared : BenchBuffer::kOrdinary;
    else if (flag == "--collective")
      o.ops = {trainyard::comm::parse_collective_op(v == "allreduce" ? "all_reduce" : v)};
    else
      TY_CHECK(false, "unknown flag ", flag, "; see the usage at the top of allreduce_bench.cpp");
  }
  o.validate();
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const auto options = parse(argc, argv);
  auto dist = trainyard::init();
  const auto rows = trainyard::comm::run_collective_bench(dist->process_group(), options,
                                                          dist->rank() == 0 ? stdout : nullptr);
  if (const auto wrong = trainyard::comm::total_wrong(rows); wrong > 0) {
    std::fprintf(stderr, "allreduce_bench: rank %d: %lld output elements were wrong\n",
                 dist->rank(), static_cast<long long>(wrong));
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
  return 1;
}
