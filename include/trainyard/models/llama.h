// Llama (Touvron et al. 2023) and its relatives Mistral and Qwen2, built as Hugging Face's
// LlamaForCausalLM builds them: the same module tree and parameter names
// (model.layers.0.self_attn.q_proj.weight, lm_head.weight absent when tied) and the same forward
// arithmetic (RMSNorm in fp32, SwiGLU, rotate-half rotary embeddings with rope_scaling, grouped-
// query attention), so HF state dicts line up. Deferred and per-name initialisation as GPT-NeoX
// (models/causal_lm.h).
#pragma once

#include <torch/nn/modules/container/modulelist.h>

#include "trainyard/models/causal_lm.h"
#include "trainyard/models/layers.h"
#include "trainyard/models/llama_config.h"

namespace trainyard::models {

// HF's inverse rotary frequencies (head_size / 2) in fp32: 1 / theta^(2j / head_size), scaled as
// config.rope_scaling says (linear: / factor; llama3: by wavelength, see its Note in llama.cpp).
torch::Tensor llama_inv_freq(const LlamaConfig& config, const torch::Device& device);

// Self-attention with separate q/k/v/o projections; num_key_value_heads key/value heads, each
// serving num_attention_heads / num_key_value_heads query heads.
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaConfig& config, const torch::TensorOptions& options);
  // (B, T, hidden) -> (B, T, hidden) for positions [past, past + T) where `cache` holds the past
  // positions' keys and values (none when null); appends this call's to it. `inv_freq` as
  // llama_inv_freq gives it.
  torch::Tensor forward_cached(const torch::Tensor& x,
                               const torch::Tensor& inv_freq,
                               KvCache::Layer* cache);

  Dense q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  std::int64_t num_heads_, num_kv_heads_, head_size_;
  double attention_dropout_;
};
TORCH_MODULE(LlamaAttention);

// down_proj(silu(gate_proj(x)) * up_proj(x)).
class LlamaMlpImpl : public torch::nn::Module {
 public:
  LlamaMlpImpl(const LlamaConfig& config, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, hidden) -> (B, T, hidden)

  Dense gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMlp);

// One decoder layer (HF's LlamaDecoderLayer), pre-norm: x + attn(norm(x)), then + mlp(norm(.)).
// The unit FSDP wraps.
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaConfig& config, const torch::TensorOptions& options);
  // (B, T, hidden) -> (B, T, hidden); see LlamaAttentionImpl::forward_cached.
  torch::Tensor forward(const torch::Tensor& x) { return forward_cached(x, nullptr); }
  torch::Tensor forward_cached(const torch::Tensor& x, KvCache::Layer* cache);

  LlamaAttention self_attn{nullptr};
  LlamaMlp mlp{nullptr};
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaDecoderLayer);

// HF's LlamaModel: embedding, layers (each called through trainyard::nn::call_unit), final norm.
class LlamaModelImpl : public torch::nn::Module {
 public:
  LlamaModelImpl(const LlamaConfig& config, const torch::TensorOptions& options);

  std::int64_t num_layers() const { return static_cast<std::int64_t>(layers->size()); }
  LlamaDecoderLayerImpl& layer(std::int64_t index);

  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};  // LlamaDecoderLayer each
  RmsNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

// HF's LlamaForCausalLM: LlamaModel plus lm_head, or embed_tokens' weight when tied.
class LlamaImpl : public CausalLmImpl {
 public:
  // Validates the config. See CausalLmInit for devices and Note [Per-name initialisation].
  explicit LlamaImpl(LlamaConfig config, CausalLmInit init = {});

  torch::Tensor forward(const torch::Tensor& input_ids) override;
  torch::Tensor forward_cached(const torch::Tensor& input_ids, KvCache& cache) override;
  // Linear and embedding weights ~ normal(0, initializer_range), biases 0, RMSNorm weights 1.
  void init_parameter(const std::string& full_name, torch::Tensor& tensor) const override;
  // LlamaDecoderLayerImpl; units of their own: model.embed_tokens and lm_head, or none when tied
  // (then the embedding stays in the root unit, which the output projection also reads).
  bool is_layer(const torch::nn::Module& module) const override;
  std::vector<std::string> unit_names() const override;

  const LlamaConfig& config() const { return config_; }

  LlamaModel model{nullptr};
  Dense lm_head{nullptr};  // hidden -> vocab_size, no bias; null when tied

 private:
  torch::Tensor logits(const torch::Tensor& hidden);  // (B, T, hidden) -> (B, T, vocab)

  LlamaConfig config_;
};
TORCH_MODULE(Llama);

}  // namespace trainyard::models
