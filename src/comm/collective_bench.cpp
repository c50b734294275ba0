#include "trainyard/comm/collective_bench.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/printf.h>

#include "trainyard/comm/collectives.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/comm/shm_process_group.h"
#include "trainyard/error.h"

namespace trainyard::comm {

// Note [nccl-tests layout]
// nccl-tests is one binary per collective (all_reduce_perf, ...), each printing a parameter line,
// a column header, one row per size with an out-of-place and an in-place group of columns, and
// the closing "# Out of bounds values" and "# Avg bus bandwidth" lines. One run of ours covers
// several collectives, so the report is one parameter block, then one block per op, each opened
// by a "# <op> (in place|out of place)" title and nccl-tests' column header, then one closing
// pair over every row of every op:
//   # nThread 1 nGpus 1 minBytes 1024 maxBytes 262144 step: 2(factor) warmup iters: 5 iters: 20 ...
//   # all_reduce (in place)
//   #       size         count      type   redop    root     time   algbw   busbw #wrong
//   #        (B)    (elements)                               (us)  (GB/s)  (GB/s)
//           1024           256     float     sum      -1    31.05    0.03    0.03      0
//   # Out of bounds values : 0 OK
//   # Avg bus bandwidth    : 0.41325
// Columns, widths and number formats are nccl-tests' (common.cu's Reporter): size is the whole
// tensor in bytes (W * n for all_gather and reduce_scatter), count is the elements one call
// names (n, the per-rank slot, for all_gather and reduce_scatter; the whole tensor for
// all_reduce and broadcast), redop "sum" or "none", root -1 or the broadcast root, time in us
// with 2, 1 or 0 decimals below 100, below 10000 and above, algbw = size / time and busbw =
// algbw * bus_factor in GB/s with 2 decimals, #wrong the wrong elements summed over ranks (-1
// unchecked). "Out of bounds values" counts the rows with wrong elements, and "Avg bus
// bandwidth" is the plain mean of every row's busbw, as nccl-tests computes both.
// Where we depart: one group of columns, not two, because c10d's all_reduce and broadcast only
// work in place, and the flat collectives are in place exactly when the buffers are shared
// (BenchBuffer::kShared: all_gather's input is its output's slot, reduce_scatter's output its
// input's slot), which the block title says; time is the slowest rank's (nccl-tests' -a 3; its
// default, -a 1, is the mean over ranks); warmup runs before every size, not once at the
// smallest and largest; and each call is waited for before the next is issued, since a CPU
// group has no stream to queue them on.

namespace {

constexpr std::int64_t kElementBytes = 4;  // float32, nccl-tests' "float"
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 40;
// Calibrated iteration counts (seconds_per_size > 0) stay within these.
constexpr double kMinCalibratedIters = 3;
constexpr double kMaxCalibratedIters = 1000;
// Inputs are ((k + 1) * (rank + 3)) mod kPatternModulus: integers, so sums over ranks are exact in
// fp32 (below 2^24) for any world size under 67,000.
constexpr std::int64_t kPatternModulus = 251;

// Rank `rank`'s input values for global elements [begin, begin + numel): (numel,) float32.
at::Tensor pattern(std::int64_t begin, std::int64_t numel, int rank) {
  return at::arange(begin + 1, begin + numel + 1, at::kLong)
      .mul_(rank + 3)
      .remainder_(kPatternModulus)
      .to(at::kFloat);
}

// The sum over every rank's pattern for elements [begin, begin + numel): (numel,) float32.
at::Tensor pattern_sum(std::int64_t begin, std::int64_t numel, int world_size) {
  auto sum = at::zeros({numel}, at::kFloat);
  for (int q = 0; q < world_size; ++q) sum.add_(pattern(begin, numel, q));
  return sum;
}

// One op at one size: its tensors and how to issue it.
struct Case {
  BenchOp op;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  int rank = 0;
  int world = 1;
  std::int64_t slot = 0;  // n: per-rank elements of all_gather and reduce_scatter
  // all_reduce, broadcast: the tensor (numel,). all_gather: the output, reduce_scatter: the input
  // (W * n,).
  at::Tensor whole;
  // all_gather: the input, reduce_scatter: the output (n,): whole's slot `rank` for shared
  // buffers, a tensor of its own otherwise. Undefined for all_reduce and broadcast.
  at::Tensor part;

  c10::intrusive_ptr<c10d::Work> launch() {
    switch (op) {
      case BenchOp::kAllReduce: {
        std::vector<at::Tensor> tensors{whole};
        return all_reduce(group, tensors);
      }
      case BenchOp::kBroadcast: {
        std::vector<at::Tensor> tensors{whole};
        c10d::BroadcastOptions options;
        options.rootRank = 0;
        return broadcast(group, tensors, options);
      }
      case BenchOp::kAllGather:
        return all_gather_flat(group, whole, part);
      case BenchOp::kReduceScatter:
        return reduce_scatter_flat(group, part, whole);
    }
    throw Error(detail::concat("unknown collective op ", static_cast<int>(op)));
  }

  void run_once() { wait_work(launch()); }

  // Fresh inputs; outputs that the call must overwrite are set to -1 (never a pattern value).
  void fill_inputs() {
    switch (op) {
      case BenchOp::kAllReduce:
      case BenchOp::kBroadcast:
        whole.copy_(pattern(0, whole.numel(), rank));
        break;
      case BenchOp::kAllGather:
        whole.fill_(-1);
        part.copy_(pattern(rank * slot, slot, rank));
        break;
      case BenchOp::kReduceScatter:
        whole.copy_(pattern(0, whole.numel(), rank));
        if (!part.is_alias_of(whole)) part.fill_(-1);
        break;
    }
  }

  // Output elements that differ from the exact expected values, on this rank.
  std::int64_t count_wrong() const {
    at::Tensor got, want;
    switch (op) {
      case BenchOp::kAllReduce:
        got = whole;
        want = pattern_sum(0, whole.numel(), world);
        break;
      case BenchOp::kBroadcast:
        got = whole;
        want = pattern(0, whole.numel(), /*rank=*/0);
        break;
      case BenchOp::kAllGather: {
        got = whole;
        want = at::empty({whole.numel()}, at::kFloat);
        for (int q = 0; q < world; ++q)
          want.narrow(0, q * slot, slot).copy_(pattern(q * slot, slot, q));
        break;
      }
      case BenchOp::kReduceScatter:
        got = part;
        want = pattern_sum(rank * slot, slot, world);
        break;
    }
    return got.ne(want).sum().item<std::int64_t>();
  }
};

at::Tensor make_buffer(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                       std::int64_t numel,
                       BenchBuffer buffer) {
  if (buffer == BenchBuffer::kShared)
    return allocate_collective_buffer(group, numel, at::TensorOptions().dtype(at::kFloat));
  return at::zeros({numel}, at::kFloat);
}

// The case for `op` at nominal size `bytes`, or one with no elements when the size holds no slot.
Case make_case(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
               BenchOp op,
               std::int64_t bytes,
               BenchBuffer buffer) {
  Case c{.op = op, .group = group, .rank = group->getRank(), .world = group->getSize()};
  const std::int64_t count = bytes / kElementBytes;
  const bool flat = op == BenchOp::kAllGather || op == BenchOp::kReduceScatter;
  c.slot = flat ? count / c.world : count;
  const std::int64_t numel = flat ? c.slot * c.world : count;
  if (numel == 0) return c;
  c.whole = make_buffer(group, numel, buffer);
  if (flat)
    c.part = buffer == BenchBuffer::kShared ? c.whole.narrow(0, c.rank * c.slot, c.slot)
                                            : at::zeros({c.slot}, at::kFloat);
  return c;
}

// Seconds per call on this rank, over `iters` calls after a barrier.
double time_calls(Case& c, int iters) {
  wait_work(barrier(c.group));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) c.run_once();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

// `value` reduced over ranks with `op` (a collective).
template <typename T>
T all_reduce_scalar(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                    T value,
                    c10d::ReduceOp op) {
  std::vector<at::Tensor> tensors{
      at::full({1}, value, at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value))};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  wait_work(all_reduce(group, tensors, options));
  return tensors[0].item<T>();
}

// The timed calls per size: options.iters, or rank 0's estimate of what fills seconds_per_size.
int iterations(Case& c, const CollectiveBenchOptions& options) {
  if (options.seconds_per_size <= 0) {
    for (int i = 0; i < options.warmup_iters; ++i) c.run_once();
    return options.iters;
  }
  const double estimate = time_calls(c, std::max(1, options.warmup_iters));
  std::vector<at::Tensor> planned{
      at::tensor({std::clamp(options.seconds_per_size / std::max(estimate, 1e-9),
                             kMinCalibratedIters, kMaxCalibratedIters)},
                 at::kDouble)};
  c10d::BroadcastOptions root0;
  root0.rootRank = 0;
  wait_work(broadcast(c.group, planned, root0));
  return static_cast<int>(planned[0].item<double>());
}

const char* redop_name(BenchOp op) {
  return op == BenchOp::kAllReduce || op == BenchOp::kReduceScatter ? "sum" : "none";
}

int root_of(BenchOp op) {
  return op == BenchOp::kBroadcast ? 0 : -1;
}

bool in_place(BenchOp op, BenchBuffer buffer) {
  return buffer == BenchBuffer::kShared || op == BenchOp::kAllReduce || op == BenchOp::kBroadcast;
}

// printf's formats, as nccl-tests writes its columns, into a string (fmt's printf).
template <typename... Args>
std::string printf_string(const char* format, const Args&... args) {
  return fmt::sprintf(format, args...);
}

}  // namespace

const char* collective_op_name(BenchOp op) {
  switch (op) {
    case BenchOp::kAllReduce:
      return "all_reduce";
    case BenchOp::kAllGather:
      return "all_gather";
    case BenchOp::kReduceScatter:
      return "reduce_scatter";
    case BenchOp::kBroadcast:
      return "broadcast";
  }
  return "unknown";
}

BenchOp parse_collective_op(std::string_view text) {
  for (auto op :
       {BenchOp::kAllReduce, BenchOp::kAllGather, BenchOp::kReduceScatter, BenchOp::kBroadcast})
    if (text == collective_op_name(op)) return op;
  throw InvalidArgumentError(
      detail::concat("Unknown collective '", text,
                     "'; expected all_reduce, all_gather, reduce_scatter or broadcast."));
}

std::vector<BenchOp> parse_collective_ops(std::string_view text) {
  std::vector<BenchOp> ops;
  while (!text.empty()) {
    const auto comma = text.find(',');
    const auto name = text.substr(0, comma);
    if (!name.empty()) ops.push_back(parse_collective_op(name));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
  }
  TY_CHECK(!ops.empty(), "The list of collectives is empty; name at least one of all_reduce, ",
           "all_gather, reduce_scatter, broadcast.");
  return ops;
}

std::int64_t parse_bench_bytes(std::string_view text, std::string_view flag) {
  const std::string s(text);
  char* end = nullptr;
  const double value = s.empty() ? -1 : std::strtod(s.c_str(), &end);
  double scale = 0;
  if (end != nullptr && end != s.c_str()) {
    const std::string_view rest(end);
    if (rest.empty()) scale = 1;
    if (rest.size() == 1) {
      const int unit = std::tolower(static_cast<unsigned char>(rest[0]));
      scale = unit == 'k' ? 0x1p10 : unit == 'm' ? 0x1p20 : unit == 'g' ? 0x1p30 : 0;
    }
  }
  const double bytes = value * scale;
  TY_CHECK(scale > 0 && std::isfinite(bytes) && bytes >= 0 && bytes < 9.2e18, flag, " is '", text,
           "'; expected a number of bytes with an optional K, M or G (powers of 1024, as "
           "nccl-tests' -b and -e take them), such as 1K, 64M or 1048576.");
  return static_cast<std::int64_t>(bytes);
}

void CollectiveBenchOptions::validate() const {
  TY_CHECK(!ops.empty(), "CollectiveBenchOptions::ops is empty; name at least one collective.");
  TY_CHECK(min_bytes >= kElementBytes, "CollectiveBenchOptions::min_bytes is ", min_bytes,
           "; it must hold one float32 element (>= 4).");
  TY_CHECK(max_bytes >= min_bytes && max_bytes <= kMaxBytes,
           "CollectiveBenchOptions::max_bytes is ", max_bytes,
           "; it must be in [min_bytes = ", min_bytes, ", 2^40].");
  TY_CHECK(step_factor >= 2, "CollectiveBenchOptions::step_factor is ", step_factor,
           "; it must be >= 2.");
  TY_CHECK(warmup_iters >= 0, "CollectiveBenchOptions::warmup_iters is ", warmup_iters,
           "; it must be >= 0.");
  TY_CHECK(std::isfinite(seconds_per_size) && seconds_per_size >= 0,
           "CollectiveBenchOptions::seconds_per_size is ", seconds_per_size, "; it must be >= 0.");
  TY_CHECK(iters >= 1 || seconds_per_size > 0, "CollectiveBenchOptions::iters is ", iters,
           "; it must be >= 1.");
}

double bus_factor(BenchOp op, int world_size) {
  const double n = world_size;
  switch (op) {
    case BenchOp::kAllReduce:
      return 2 * (n - 1) / n;
    case BenchOp::kAllGather:
    case BenchOp::kReduceScatter:
      return (n - 1) / n;
    case BenchOp::kBroadcast:
      return 1;
  }
  return 1;
}

std::vector<CollectiveBenchRow> run_collective_bench(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group,
    const CollectiveBenchOptions& options,
    std::FILE* report) {
  TY_CHECK(group, "run_collective_bench: the process group is null.");
  options.validate();
  const int world = group->getSize();
  const auto write = [report](const std::string& text) {
    if (report == nullptr) return;
    std::fputs(text.c_str(), report);
    std::fflush(report);
  };
  write(format_bench_header(options, group));
  std::vector<CollectiveBenchRow> rows;
  for (const BenchOp op : options.ops) {
    write(format_bench_op_header(op, options.buffer));
    for (std::int64_t bytes = options.min_bytes; bytes <= options.max_bytes;
         bytes *= options.step_factor) {
      Case c = make_case(group, op, bytes, options.buffer);
      if (!c.whole.defined()) continue;  // smaller than one element per rank
      c.fill_inputs();
      const int iters = iterations(c, options);
      const double seconds = all_reduce_scalar(group, time_calls(c, iters), c10d::ReduceOp::MAX);
      CollectiveBenchRow row{.op = op,
                             .size_bytes = c.whole.numel() * kElementBytes,
                             .count = op == BenchOp::kAllGather || op == BenchOp::kReduceScatter
                                          ? c.slot
                                          : c.whole.numel(),
                             .time_us = seconds * 1e6};
      row.algbw_gbps = static_cast<double>(row.size_bytes) / seconds / 1e9;
      row.busbw_gbps = row.algbw_gbps * bus_factor(op, world);
      if (options.check) {
        c.fill_inputs();
        c.run_once();
        row.wrong = all_reduce_scalar<std::int64_t>(group, c.count_wrong(), c10d::ReduceOp::SUM);
      }
      rows.push_back(row);
      write(format_bench_row(row));
    }
  }
  write(format_bench_footer(rows));
  return rows;
}

std::string format_bench_header(const CollectiveBenchOptions& options,
                                const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  const std::string iters = options.seconds_per_size > 0
                                ? printf_string("auto (%g s per size)", options.seconds_per_size)
                                : std::to_string(options.iters);
  std::string buffers = "ordinary buffers";
  if (options.buffer == BenchBuffer::kShared)
    buffers = capabilities_of(group).shared_memory
                  ? "shared buffers (allocate_collective_buffer, in shared memory)"
                  : "shared buffers (allocate_collective_buffer; this group has no shared memory)";
  return printf_string(
             "# nThread 1 nGpus 1 minBytes %lld maxBytes %lld step: %d(factor) warmup iters: %d "
             "iters: %s agg iters: 1 validation: %d graph: 0\n",
             static_cast<long long>(options.min_bytes), static_cast<long long>(options.max_bytes),
             options.step_factor, options.warmup_iters, iters.c_str(), options.check ? 1 : 0) +
         printf_string("#\n# Using process group %s: %d ranks, one per process, float32, %s\n",
                       group->getBackendName().c_str(), group->getSize(), buffers.c_str()) +
         "# time: per call, the slowest rank's mean; algbw = size / time; busbw = algbw x "
         "2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter), 1 (broadcast)\n";
}

std::string format_bench_op_header(BenchOp op, BenchBuffer buffer) {
  return printf_string("#\n# %s (%s)\n", collective_op_name(op),
                       in_place(op, buffer) ? "in place" : "out of place") +
         printf_string("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s\n", "size", "count", "type",
                       "redop", "root", "time", "algbw", "busbw", "#wrong") +
         printf_string("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "",
                       "", "", "(us)", "(GB/s)", "(GB/s)", "");
}

std::string format_bench_row(const CollectiveBenchRow& row) {
  const char* time_format = row.time_us >= 10000.0 ? "%7.0f"
                            : row.time_us >= 100.0 ? "%7.1f"
                                                   : "%7.2f";
  const std::string time = printf_string(time_format, row.time_us);
  return printf_string("%12lld  %12lld  %8s  %6s  %6d  %7s  %6.2f  %6.2f  %5lld\n",
                       static_cast<long long>(row.size_bytes), static_cast<long long>(row.count),
                       "float", redop_name(row.op), root_of(row.op), time.c_str(), row.algbw_gbps,
                       row.busbw_gbps, static_cast<long long>(row.wrong));
}

std::string format_bench_footer(const std::vector<CollectiveBenchRow>& rows) {
  int failed = 0;
  double busbw_sum = 0;
  for (const auto& row : rows) {
    failed += row.wrong > 0 ? 1 : 0;
    busbw_sum += row.busbw_gbps;
  }
  const double average = rows.empty() ? 0 : busbw_sum / static_cast<double>(rows.size());
  return printf_string("# Out of bounds values : %d %s\n", failed, failed > 0 ? "FAILED" : "OK") +
         printf_string("# Avg bus bandwidth    : %g\n", average) + "#\n";
}

std::int64_t total_wrong(const std::vector<CollectiveBenchRow>& rows) {
  std::int64_t wrong = 0;
  for (const auto& row : rows) wrong += std::max<std::int64_t>(row.wrong, 0);
  return wrong;
}

}  // namespace trainyard::comm
