#include "trainyard/nn/attention.h"

#include <ATen/ATen.h>

#include "trainyard/error.h"

// Note [Fused attention on GPUs]
// GPT-NeoX's attention as Hugging Face writes it (and trainyard's CPU path, which matches it to
// the ulp) materialises the (T, T) scores per head in fp32: at sequence 2048 that is 16 MiB per
// head and sample, written and read several times. LibTorch 2.x's scaled_dot_product_attention
// computes the same function in one fused kernel without the scores (flash attention for bf16,
// memory-efficient attention for fp32), which is what PyTorch's own models use on GPUs. It is
// taken on CUDA only: on the CPU the exact path stays, so CPU results keep equalling HF's.

namespace trainyard::nn {

bool fused_causal_attention_available(const at::Tensor& q) {
  return q.is_cuda();
}

at::Tensor fused_causal_attention(const at::Tensor& q,
                                  const at::Tensor& k,
                                  const at::Tensor& v,
                                  double dropout) {
  TY_CHECK(fused_causal_attention_available(q), "fused_causal_attention needs CUDA tensors (got ",
           q.device(), "); check fused_causal_attention_available first.");
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout, /*is_causal=*/true);
}

}  // namespace trainyard::nn
