// The scaling model behind `trainyard bench scaling`: measured weak-scaling efficiency of a recipe
// run at several world sizes, and a prediction of it at larger ones from one rank's compute time
// per step and the ring all-reduce cost of its gradients at a given bus bandwidth. LibTorch-free.
// See Note [Scaling model] in scaling_model.cpp for the formulas and what they leave out.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace trainyard::plan {

// One measured run of a recipe at `world_size` ranks, each with the same per-rank batch.
struct ScalingPoint {
  int world_size = 1;
  double epoch_time_s = 0;   // training time of one epoch (no startup, no evaluation)
  double samples_per_s = 0;  // samples trained by all ranks / the slowest rank's training time
  double step_time_s = 0;    // training time / optimizer steps per rank; 0: unknown
};

struct ScalingModelOptions {
  double compute_time_s = 0;        // one step's compute on one rank (the W = 1 step time)
  std::int64_t gradient_bytes = 0;  // bytes all-reduced per step: parameters x 4 for fp32
  double busbw_gbps = 0;            // all_reduce bus bandwidth, GB/s (1e9 bytes), nccl-tests' busbw

  // Throws InvalidArgumentError naming the first field that is not > 0.
  void validate() const;
};

// The seconds one ring all-reduce of `bytes` takes among `world_size` ranks at bus bandwidth
// `busbw_gbps`: 2 (W - 1) / W x bytes / busbw (0 for one rank). nccl-tests defines busbw so that
// this holds.
double ring_all_reduce_seconds(std::int64_t bytes, int world_size, double busbw_gbps);

// The predicted step time at `world_size`: compute + ring all-reduce, no overlap.
double predicted_step_time_s(const ScalingModelOptions& options, int world_size);
// T(1) / T(W) with T = predicted_step_time_s: the weak-scaling efficiency the model predicts.
double predicted_efficiency(const ScalingModelOptions& options, int world_size);

// samples_per_s(W) / (W x samples_per_s(1)): measured weak-scaling efficiency; `one` is the
// W = 1 point. Throws InvalidArgumentError when one's throughput is not > 0.
double measured_efficiency(const ScalingPoint& point, const ScalingPoint& one);

// "1,2,4" -> {1, 2, 4}: positive, distinct; throws InvalidArgumentError naming `flag` otherwise.
// An empty text gives an empty list.
std::vector<int> parse_world_sizes(std::string_view text, std::string_view flag);

// "44.7M", "1G", "1048576": bytes with an optional K, M or G (powers of 1024); throws
// InvalidArgumentError naming `flag` for anything else or a value < 1.
std::int64_t parse_byte_count(std::string_view text, std::string_view flag);

}  // namespace trainyard::plan
