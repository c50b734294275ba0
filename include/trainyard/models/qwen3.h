// Qwen3, built as Hugging Face's Qwen3ForCausalLM builds it: Llama's decoder (llama.h: SwiGLU MLP,
// RMSNorm in fp32, rotate-half rotary embeddings, grouped-query attention) whose attention
// RMS-normalises each query and key head over head_dim before rotating it (self_attn.q_norm,
// self_attn.k_norm), with the same module tree and parameter names, so HF state dicts line up.
// Deferred and per-name initialisation as the other architectures (models/causal_lm.h).
#pragma once

#include <torch/nn/modules/container/modulelist.h>

#include "trainyard/models/causal_lm.h"
#include "trainyard/models/layers.h"
#include "trainyard/models/llama.h"
#include "trainyard/models/qwen3_config.h"

namespace trainyard::models {

// Llama's attention with q_norm and k_norm (head_dim each) on every head before the rotation.
class Qwen3AttentionImpl : public torch::nn::Module {
 public:
  Qwen3AttentionImpl(const Qwen3Config& config, const torch::TensorOptions& options);
  // As LlamaAttentionImpl::forward_cached.
  torch::Tensor forward_cached(const torch::Tensor& x,
                               const torch::Tensor& inv_freq,
                               KvCache::Layer* cache);

  Dense q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};

 private:
  std::int64_t num_heads_, num_kv_heads_, head_size_;
  double attention_dropout_;
};
TORCH_MODULE(Qwen3Attention);

// One decoder layer (HF's Qwen3DecoderLayer), pre-norm as Llama's; the unit FSDP wraps.
class Qwen3DecoderLayerImpl : public torch::nn::Module {
 public:
  Qwen3DecoderLayerImpl(const Qwen3Config& config, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x) { return forward_cached(x, nullptr); }
  torch::Tensor forward_cached(const torch::Tensor& x, KvCache::Layer* cache);

  Qwen3Attention self_attn{nullptr};
  LlamaMlp mlp{nullptr};
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};

 private:
  LlamaConfig rotary_;  // what llama_inv_freq reads
};
TORCH_MODULE(Qwen3DecoderLayer);

// HF's Qwen3Model: embedding, layers (each called through trainyard::nn::call_unit), final norm.
class Qwen3ModelImpl : public torch::nn::Module {
 public:
  Qwen3ModelImpl(const Qwen3Config& config, const torch::TensorOptions& options);

  std::int64_t num_layers() const { return static_cast<std::int64_t>(layers->size()); }

  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};  // Qwen3DecoderLayer each
  RmsNorm norm{nullptr};
};
TORCH_MODULE(Qwen3Model);

// HF's Qwen3ForCausalLM: Qwen3Model plus lm_head, or embed_tokens' weight when tied.
class Qwen3Impl : public CausalLmImpl {
 public:
  // Validates the config. See CausalLmInit for devices and Note [Per-name initialisation].
  explicit Qwen3Impl(Qwen3Config config, CausalLmInit init = {});

  torch::Tensor forward(const torch::Tensor& input_ids) override;
  torch::Tensor forward_cached(const torch::Tensor& input_ids, KvCache& cache) override;
  // As Llama's: linear and embedding weights ~ normal(0, initializer_range), biases 0, norms 1.
  void init_parameter(const std::string& full_name, torch::Tensor& tensor) const override;
  // Qwen3DecoderLayerImpl; the embeddings as Llama's (LlamaImpl::unit_names).
  bool is_layer(const torch::nn::Module& module) const override;
  std::vector<std::string> unit_names() const override;

  Qwen3Model model{nullptr};
  Dense lm_head{nullptr};  // hidden -> vocab_size, no bias; null when tied

 private:
  torch::Tensor logits(const torch::Tensor& hidden);  // (B, T, hidden) -> (B, T, vocab)

  Qwen3Config config_;
};
TORCH_MODULE(Qwen3);

}  // namespace trainyard::models
