#include "trainyard/plan/scaling_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "trainyard/error.h"

namespace trainyard::plan {

// Note [Scaling model]
// ~~~~~~~~~~~~~~~~~~~~
// Weak scaling: every rank keeps the recipe's per-rank batch, so W ranks train W times the samples
// per step. With perfect scaling a step takes as long at W ranks as at one, and
//
//   efficiency(W) = samples_per_s(W) / (W x samples_per_s(1))      (measured)
//                 = T(1) / T(W)                                     (T: the time of one step)
//
// The model predicts T(W) = t_compute + t_comm(W) with
//
//   t_compute  = T(1), measured at one rank, where the all-reduce is a no-op;
//   t_comm(W)  = 2 (W - 1) / W x gradient_bytes / busbw,
//
// the time of a ring all-reduce of the gradients: each rank sends and receives 2 (W - 1) / W of
// the buffer, which is how nccl-tests turns an all_reduce's time into its bus bandwidth (busbw =
// algbw x 2 (W - 1) / W), so a measured busbw plugs straight in. It ignores the overlap of the
// all-reduce with the backward pass (DDP's buckets start reducing before backward ends) and the
// latency term of the ring (2 (W - 1) hops, which matters only for small buffers): t_comm is an
// upper bound on the cost, the predicted efficiency a lower bound, as long as compute per rank
// stays what it was at one rank (no shared cores, no memory-bandwidth contention).

void ScalingModelOptions::validate() const {
  TY_CHECK(compute_time_s > 0, "ScalingModelOptions::compute_time_s must be > 0, got ",
           compute_time_s, ".");
  TY_CHECK(gradient_bytes > 0, "ScalingModelOptions::gradient_bytes must be > 0, got ",
           gradient_bytes, ".");
  TY_CHECK(busbw_gbps > 0, "ScalingModelOptions::busbw_gbps must be > 0, got ", busbw_gbps, ".");
}

double ring_all_reduce_seconds(std::int64_t bytes, int world_size, double busbw_gbps) {
  TY_CHECK(world_size >= 1, "world_size must be >= 1, got ", world_size, ".");
  TY_CHECK(busbw_gbps > 0, "busbw_gbps must be > 0, got ", busbw_gbps, ".");
  const double factor = 2.0 * (world_size - 1) / world_size;
  return factor * static_cast<double>(bytes) / (busbw_gbps * 1e9);
}

double predicted_step_time_s(const ScalingModelOptions& options, int world_size) {
  options.validate();
  return options.compute_time_s +
         ring_all_reduce_seconds(options.gradient_bytes, world_size, options.busbw_gbps);
}

double predicted_efficiency(const ScalingModelOptions& options, int world_size) {
  return predicted_step_time_s(options, 1) / predicted_step_time_s(options, world_size);
}

double measured_efficiency(const ScalingPoint& point, const ScalingPoint& one) {
  TY_CHECK(one.samples_per_s > 0, "The 1-rank run's throughput must be > 0, got ",
           one.samples_per_s, " samples/s.");
  return point.samples_per_s / (point.world_size * one.samples_per_s);
}

std::vector<int> parse_world_sizes(std::string_view text, std::string_view flag) {
  std::vector<int> sizes;
  std::size_t begin = 0;
  while (begin < text.size()) {
    const auto end = std::min(text.find(',', begin), text.size());
    const std::string item(text.substr(begin, end - begin));
    char* rest = nullptr;
    const long value = std::strtol(item.c_str(), &rest, 10);
    TY_CHECK(!item.empty() && *rest == '\0' && value >= 1 && value <= 1 << 20, flag,
             " takes positive world sizes separated by commas (\"1,2,4\"), got '", text, "'.");
    TY_CHECK(std::find(sizes.begin(), sizes.end(), value) == sizes.end(), flag, " names ", value,
             " twice in '", text, "'.");
    sizes.push_back(static_cast<int>(value));
    begin = end + 1;
  }
  return sizes;
}

std::int64_t parse_byte_count(std::string_view text, std::string_view flag) {
  const std::string s(text);
  char* rest = nullptr;
  double value = std::strtod(s.c_str(), &rest);
  const std::string suffix(rest);
  bool known = rest != s.c_str();
  if (suffix == "K" || suffix == "k") {
    value *= 1 << 10;
  } else if (suffix == "M" || suffix == "m") {
    value *= 1 << 20;
  } else if (suffix == "G" || suffix == "g") {
    value *= 1 << 30;
  } else {
    known = known && suffix.empty();
  }
  TY_CHECK(known && std::isfinite(value) && value >= 1, flag,
           " takes a number of bytes >= 1 with an optional K, M or G (\"44.7M\"), got '", text,
           "'.");
  return static_cast<std::int64_t>(std::llround(value));
}

}  // namespace trainyard::plan
