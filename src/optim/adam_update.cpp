#include "adam_update.h"

#include <ATen/Config.h>
#include <ATen/Parallel.h>

#include <cmath>

// Note [at::parallel_for needs OpenMP]
// LibTorch built with AT_PARALLEL_OPENMP (as PyTorch's x86 wheels are) defines at::parallel_for
// inline in its headers, and ATen/ParallelOpenMP.h opens the `#pragma omp parallel` region only
// where _OPENMP is defined: in a translation unit compiled without -fopenmp, parallel_for silently
// runs the whole range on the calling thread, whatever at::get_num_threads() says. So this file,
// and only this one, is compiled with OpenMP (CMakeLists.txt: LibTorch's own runtime, libgomp, so
// the threads are the intra-op pool that at::set_num_threads sizes), without the precompiled header
// (parsed without OpenMP), and with -fno-math-errno so that std::sqrt is one instruction the loop
// can vectorise instead of a call that may set errno.
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "adam_update.cpp must be compiled with OpenMP: see Note [at::parallel_for needs OpenMP]"
#endif

namespace trainyard::optim::detail {
namespace {

// The element-wise update, with LibTorch's Adam and AdamW formulas and association order:
//   kL2:         g = g + wd * p                                    (Adam)
//   kDecoupled:  p = p * (1 - lr * wd)                             (AdamW, before the rest)
//   m = m * b1 + (1 - b1) * g;  v = v * b2 + ((1 - b2) * g) * g
//   p = p + (-step_size * m) / (sqrt(v) / sqrt(bc2) + eps)     (v -> max(v_max, v) with amsgrad)
// The options are template parameters, so the loop has no branch per element and vectorises.
// LibTorch's vectorised kernels may contract some of these into fused multiply-adds, so the two
// agree to float rounding, not bit for bit.
// In bf16 (T = c10::BFloat16) every load widens to float and every store rounds to nearest even
// once, so the arithmetic is the float one.
template <typename T, WeightDecay kWeightDecay, bool kAmsgrad>
void update_range(const AdamBuffers<T>& b, int64_t begin, int64_t end, const AdamCoefficients& c) {
  T* __restrict p = b.param;
  const T* __restrict grad = b.grad;
  T* __restrict m = b.exp_avg;
  T* __restrict v = b.exp_avg_sq;
  T* __restrict v_max = b.max_exp_avg_sq;
  const AdamCoefficients k = c;  // a local copy: the stores through p, m, v cannot change it
  for (int64_t i = begin; i < end; ++i) {
    float param = p[i];
    float g = grad[i];
    if constexpr (kWeightDecay == WeightDecay::kL2) g = g + k.weight_decay * param;
    if constexpr (kWeightDecay == WeightDecay::kDecoupled) param = param * k.decay;
    const float mi = static_cast<float>(m[i]) * k.beta1 + k.one_minus_beta1 * g;
    const float vi = static_cast<float>(v[i]) * k.beta2 + (k.one_minus_beta2 * g) * g;
    m[i] = mi;
    v[i] = vi;
    float second = vi;
    if constexpr (kAmsgrad) {
      // torch.maximum propagates a NaN from either side (std::max would drop one); written as a
      // select, which vectorises.
      const float previous = static_cast<float>(v_max[i]);
      second = (vi > previous || vi != vi) ? vi : previous;
      v_max[i] = second;
    }
    const float denom = std::sqrt(second) / k.sqrt_bias_correction2 + k.eps;
    p[i] = param + (-k.step_size * mi) / denom;
  }
}

template <typename T>
using UpdateRange = void (*)(const AdamBuffers<T>&, int64_t, int64_t, const AdamCoefficients&);

template <typename T, WeightDecay kWeightDecay>
UpdateRange<T> pick(bool amsgrad) {
  return amsgrad ? &update_range<T, kWeightDecay, true> : &update_range<T, kWeightDecay, false>;
}

template <typename T>
UpdateRange<T> pick(const AdamCoefficients& c) {
  switch (c.weight_decay_kind) {
    case WeightDecay::kL2:
      return pick<T, WeightDecay::kL2>(c.amsgrad);
    case WeightDecay::kDecoupled:
      return pick<T, WeightDecay::kDecoupled>(c.amsgrad);
    case WeightDecay::kNone:
      break;
  }
  return pick<T, WeightDecay::kNone>(c.amsgrad);
}

template <typename T>
void update(const AdamBuffers<T>& buffers, const AdamCoefficients& c) {
  const UpdateRange<T> range = pick<T>(c);
  at::parallel_for(0, buffers.numel, kAdamGrain,
                   [&](int64_t begin, int64_t end) { range(buffers, begin, end, c); });
}

}  // namespace

void adam_update(const AdamBuffers<float>& buffers, const AdamCoefficients& c) {
  update(buffers, c);
}

void adam_update(const AdamBuffers<c10::BFloat16>& buffers, const AdamCoefficients& c) {
  update(buffers, c);
}

}  // namespace trainyard::optim::detail
