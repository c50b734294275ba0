// Causal self-attention through LibTorch's fused kernels (scaled_dot_product_attention: flash or
// memory-efficient attention) where the LibTorch line has them: 2.x on a GPU. Note [Fused
// attention on GPUs] in src/nn/attention.cpp.
#pragma once

namespace at {
class Tensor;
}

namespace trainyard::nn {

// Whether fused_causal_attention runs for tensors like `q`: LibTorch 2.x and a CUDA tensor.
bool fused_causal_attention_available(const at::Tensor& q);

// softmax(q k^T / sqrt(head_size) + causal mask) v for q, k, v (B, heads, T, head_size), with
// dropout on the probabilities at rate `dropout` (0 in eval). Throws Error where it is not
// available.
at::Tensor fused_causal_attention(const at::Tensor& q,
                                  const at::Tensor& k,
                                  const at::Tensor& v,
                                  double dropout);

}  // namespace trainyard::nn
