// A bus-bandwidth sweep of all_reduce, all_gather, reduce_scatter and broadcast over a process
// group, each result checked element by element, reported as nccl-tests reports it (size, count,
// type, redop, root, time, algbw, busbw, #wrong; "Out of bounds values" and "Avg bus bandwidth").
// `trainyard bench collectives` and bench/allreduce_bench run it. See Note [nccl-tests layout]
// in src/comm/collective_bench.cpp for the format and where it departs from nccl-tests.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace trainyard::comm {

// The collectives the sweep measures (the metrics' CollectiveOp, collective_metrics.h, adds
// barrier).
enum class BenchOp { kAllReduce, kAllGather, kReduceScatter, kBroadcast };

// "all_reduce", "all_gather", "reduce_scatter", "broadcast".
const char* collective_op_name(BenchOp op);
// The inverse of collective_op_name. Throws InvalidArgumentError naming `text` and the four names.
BenchOp parse_collective_op(std::string_view text);
// A comma-separated list of names ("all_reduce,broadcast"); throws as parse_collective_op, and for
// an empty list.
std::vector<BenchOp> parse_collective_ops(std::string_view text);

// nccl-tests' -b/-e sizes: a number of bytes with an optional K, M or G (either case; powers of
// 1024: 1K = 1024, 64M = 67108864), fractions allowed ("0.5M"). Throws InvalidArgumentError naming
// `flag` for anything else.
std::int64_t parse_bench_bytes(std::string_view text, std::string_view flag);

enum class BenchBuffer {
  kOrdinary,  // at::zeros tensors (the shared-memory group stages them through its slots)
  kShared,    // allocate_collective_buffer: in place in shared memory under ShmProcessGroup
};

struct CollectiveBenchOptions {
  static constexpr std::int64_t kDefaultMinBytes = 1 << 10;
  static constexpr std::int64_t kDefaultMaxBytes = 64 << 20;
  static constexpr int kDefaultWarmupIters = 5;  // nccl-tests' -w default
  static constexpr int kDefaultIters = 20;       // nccl-tests' -n default

  // Run in this order, each over the whole size sweep.
  std::vector<BenchOp> ops = {BenchOp::kAllReduce, BenchOp::kAllGather, BenchOp::kReduceScatter,
                              BenchOp::kBroadcast};
  // Sizes of the whole tensor in bytes (W * n for all_gather and reduce_scatter), from min_bytes,
  // times step_factor, up to max_bytes. Elements are float32 (4 bytes, nccl-tests' "float").
  std::int64_t min_bytes = kDefaultMinBytes;
  std::int64_t max_bytes = kDefaultMaxBytes;
  int step_factor = 2;
  // Untimed calls before each size's timed ones.
  int warmup_iters = kDefaultWarmupIters;
  // Timed calls per size, when seconds_per_size is 0.
  int iters = kDefaultIters;
  // > 0: instead of `iters`, as many calls as fill about this many seconds per size (rank 0's
  // estimate from the warmup, at least 3, at most 1000).
  double seconds_per_size = 0;
  BenchBuffer buffer = BenchBuffer::kOrdinary;
  // After timing, one more call per size on rank- and index-dependent inputs, every output element
  // compared with the exact expected value.
  bool check = true;

  // Throws InvalidArgumentError naming the first bad field and its value.
  void validate() const;
};

// One line of the report: one op at one size.
struct CollectiveBenchRow {
  BenchOp op = BenchOp::kAllReduce;
  std::int64_t size_bytes = 0;  // the whole tensor (W * n for all_gather, reduce_scatter)
  std::int64_t count = 0;       // elements per call as nccl-tests counts: n, the per-rank slot,
                                // for all_gather and reduce_scatter; the whole tensor otherwise
  double time_us = 0;           // per call, the slowest rank's mean
  double algbw_gbps = 0;        // size_bytes / time, GB/s (1e9 bytes)
  double busbw_gbps = 0;        // algbw * bus_factor(op, W)
  std::int64_t wrong = -1;      // wrong output elements summed over ranks; -1: not checked
};

// nccl-tests' bus bandwidth factors: all_reduce 2(W-1)/W, all_gather and reduce_scatter (W-1)/W,
// broadcast 1 (so a single rank's all-reduce has busbw 0, as in nccl-tests).
double bus_factor(BenchOp op, int world_size);

// Runs the sweep: for each op, for each size, warmup, a barrier, the timed calls (each waited
// before the next, wait_work), the per-call time all-reduced with MAX over ranks, then (when
// options.check) the checked call with its wrong-element count all-reduced with SUM. Collective:
// every rank calls it with the same options. Rows come back on every rank, identical. Sizes whose
// per-rank slot would be empty (all_gather, reduce_scatter with size < 4 W) are skipped. When
// `report` is not null the report is written to it as rows arrive (pass stdout on rank 0 only).
// Throws what the collectives throw (NetworkError, TimeoutError) and InvalidArgumentError for bad
// options; a wrong element is not an error here: callers decide (see total_wrong).
std::vector<CollectiveBenchRow> run_collective_bench(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group,
    const CollectiveBenchOptions& options,
    std::FILE* report = nullptr);

// The report's pieces, for run_collective_bench and for tests. Lines end in '\n'.
// The opening comment lines: parameters, the group's backend and size, buffers, timing rule.
std::string format_bench_header(const CollectiveBenchOptions& options,
                                const c10::intrusive_ptr<c10d::ProcessGroup>& group);
// The title and column header lines that open one op's block.
std::string format_bench_op_header(BenchOp op, BenchBuffer buffer);
// One row, nccl-tests' columns and widths.
std::string format_bench_row(const CollectiveBenchRow& row);
// "# Out of bounds values : N OK|FAILED" (N: rows with wrong elements, as nccl-tests counts),
// "# Avg bus bandwidth    : X" (the mean of every row's busbw, printed with %g), "#".
std::string format_bench_footer(const std::vector<CollectiveBenchRow>& rows);

// Wrong elements over all rows (unchecked rows count 0).
std::int64_t total_wrong(const std::vector<CollectiveBenchRow>& rows);

}  // namespace trainyard::comm
