// The element-wise Adam and AdamW update that FusedAdam and FusedAdamW share: one pass over a
// parameter, its gradient and its moments (all float32, or all bfloat16), spread over the
// intra-op threads. Plain pointers and floats, no tensors, so that its translation unit can be
// built with OpenMP (see Note [at::parallel_for needs OpenMP] in adam_update.cpp). Private to
// src/optim.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace trainyard::optim::detail {

// How the weight decay enters the update.
enum class WeightDecay {
  kNone,       // weight_decay == 0
  kL2,         // Adam: the gradient gains weight_decay * p
  kDecoupled,  // AdamW: p shrinks by the factor (1 - lr * weight_decay) before the update
};

// The coefficients of one step, computed in double and rounded to float once, as LibTorch's
// kernels round their scalar arguments.
struct AdamCoefficients {
  WeightDecay weight_decay_kind = WeightDecay::kNone;
  bool amsgrad = false;
  float beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0;
  float sqrt_bias_correction2 = 1;  // sqrt(1 - beta2^t)
  float step_size = 0;              // lr / (1 - beta1^t)
  float eps = 0;
  float weight_decay = 0;  // kL2: the gradient's coefficient
  float decay = 1;         // kDecoupled: 1 - lr * weight_decay
};

// One parameter's buffers, each `numel` contiguous elements of T (float or c10::BFloat16);
// max_exp_avg_sq is null without amsgrad.
template <typename T>
struct AdamBuffers {
  T* param = nullptr;
  const T* grad = nullptr;
  T* exp_avg = nullptr;
  T* exp_avg_sq = nullptr;
  T* max_exp_avg_sq = nullptr;
  int64_t numel = 0;
};

// Updates the parameter and its moments in place, in one pass, split by at::parallel_for into
// contiguous ranges, one per intra-op thread (at::get_num_threads()) but no more than
// ceil(numel / kAdamGrain). bf16 buffers are computed in float and rounded to nearest once per
// stored value (Note [Pure bf16] in src/fsdp/fully_sharded_data_parallel.cpp). Blocks until
// done; not to be called on the same buffers from two threads at once.
void adam_update(const AdamBuffers<float>& buffers, const AdamCoefficients& c);
void adam_update(const AdamBuffers<c10::BFloat16>& buffers, const AdamCoefficients& c);

// The parallel grain: a tensor of at most 64K elements (28 bytes of traffic each, 1.8 MB) is
// updated on the calling thread, and a larger one gives each thread more than half of that: far
// more work than waking a thread costs.
constexpr int64_t kAdamGrain = int64_t{1} << 16;

}  // namespace trainyard::optim::detail
