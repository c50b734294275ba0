// GPT-NeoX (Black et al. 2022), the architecture of Pythia and dolly-v2, built as Hugging Face's
// GPTNeoXForCausalLM builds it: the same configuration fields, module tree and parameter names
// (gpt_neox.layers.0.attention.query_key_value.weight, embed_out.weight, ...) and the same
// forward arithmetic, so HF state dicts line up. Parameters can be created on the meta device and
// initialised later one tensor at a time, identically, from (seed, parameter name).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "trainyard/models/causal_lm.h"
#include "trainyard/models/gpt_neox_config.h"
#include "trainyard/models/layers.h"

#include <cstdint>
#include <string>
#include <vector>

namespace trainyard::models {

// GptNeoX's construction options are every causal LM's (models/causal_lm.h).
using GptNeoXInit = CausalLmInit;

// Causal self-attention with a fused, per-head [q|k|v] projection and rotary embeddings on the
// first rotary_ndims dimensions of each head (HF's GPTNeoXAttention).
class GptNeoXAttentionImpl : public torch::nn::Module {
 public:
  GptNeoXAttentionImpl(const GptNeoXConfig& config, const torch::TensorOptions& options);
  // (B, T, hidden) -> (B, T, hidden). Scores and softmax in fp32, the rest in the input's dtype.
  torch::Tensor forward(const torch::Tensor& x) { return forward_cached(x, nullptr); }
  // The same for positions [past, past + T) where `cache` holds past positions' keys and values
  // (none when null); appends this call's keys and values to it.
  torch::Tensor forward_cached(const torch::Tensor& x, KvCache::Layer* cache);

  Dense query_key_value{nullptr};  // hidden -> 3 * hidden, head h's [q|k|v] at [3hs*h, 3hs*(h+1))
  Dense dense{nullptr};            // hidden -> hidden

 private:
  std::int64_t num_heads_, head_size_, rotary_ndims_;
  double rotary_base_, attention_dropout_;
};
TORCH_MODULE(GptNeoXAttention);

// dense_4h_to_h(gelu(dense_h_to_4h(x))), exact (erf) GELU.
class GptNeoXMlpImpl : public torch::nn::Module {
 public:
  GptNeoXMlpImpl(const GptNeoXConfig& config, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, hidden) -> (B, T, hidden)

  Dense dense_h_to_4h{nullptr}, dense_4h_to_h{nullptr};
};
TORCH_MODULE(GptNeoXMlp);

// One transformer layer (HF's GPTNeoXLayer): the unit FSDP wraps, found by dynamic_cast.
class GptNeoXLayerImpl : public torch::nn::Module {
 public:
  GptNeoXLayerImpl(const GptNeoXConfig& config, const torch::TensorOptions& options);
  // (B, T, hidden) -> (B, T, hidden)
  torch::Tensor forward(const torch::Tensor& x) { return forward_cached(x, nullptr); }
  // See GptNeoXAttentionImpl::forward_cached.
  torch::Tensor forward_cached(const torch::Tensor& x, KvCache::Layer* cache);

  LayerNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  GptNeoXAttention attention{nullptr};
  GptNeoXMlp mlp{nullptr};

 private:
  bool use_parallel_residual_;
  double hidden_dropout_;
};
TORCH_MODULE(GptNeoXLayer);

// HF's GPTNeoXModel: embedding, layers (each called through trainyard::nn::call_unit), final norm.
class GptNeoXModelImpl : public torch::nn::Module {
 public:
  GptNeoXModelImpl(const GptNeoXConfig& config, const torch::TensorOptions& options);
  // (B, T) int64 token ids -> (B, T, hidden) final hidden states.
  torch::Tensor forward(const torch::Tensor& input_ids);

  std::int64_t num_layers() const { return static_cast<std::int64_t>(layers->size()); }
  GptNeoXLayerImpl& layer(std::int64_t index);

  Embedding embed_in{nullptr};
  torch::nn::ModuleList layers{nullptr};  // GptNeoXLayer each
  LayerNorm final_layer_norm{nullptr};

 private:
  std::int64_t max_positions_;
  double hidden_dropout_;
};
TORCH_MODULE(GptNeoXModel);

// HF's GPTNeoXForCausalLM: GptNeoXModel plus the untied output projection embed_out.
class GptNeoXImpl : public CausalLmImpl {
 public:
  // Validates the config. See GptNeoXInit for devices and Note [Per-name initialisation].
  explicit GptNeoXImpl(GptNeoXConfig config, GptNeoXInit init = {});

  // (B, T) int64 token ids, T <= max_position_embeddings -> (B, T, vocab_size) logits, in the
  // parameters' dtype.
  torch::Tensor forward(const torch::Tensor& input_ids) override;
  // See CausalLmImpl::forward_cached.
  torch::Tensor forward_cached(const torch::Tensor& input_ids, KvCache& cache) override;

  // Fills `tensor` (any device and floating dtype, shaped as the parameter) with the initial value
  // of the parameter `full_name` (as named_parameters() of a GptNeoXImpl names it) under `seed`,
  // exactly as the constructor does: Dense and Embedding weights ~ normal(0, initializer_range),
  // biases 0, LayerNorm weights 1. Throws InvalidArgumentError for a name that is not one of
  // GPT-NeoX's parameters. Needs no model, so FSDP can materialise meta parameters unit by unit.
  static void init_parameter(const GptNeoXConfig& config,
                             const std::string& full_name,
                             torch::Tensor& tensor,
                             std::uint64_t seed);
  // The same with this model's config and seed.
  void init_parameter(const std::string& full_name, torch::Tensor& tensor) const override;

  // GptNeoXLayerImpl; the units of their own are gpt_neox.embed_in and embed_out.
  bool is_layer(const torch::nn::Module& module) const override;
  std::vector<std::string> unit_names() const override;

  const GptNeoXConfig& config() const { return config_; }

  GptNeoXModel gpt_neox{nullptr};
  Dense embed_out{nullptr};  // hidden -> vocab_size, no bias

 private:
  GptNeoXConfig config_;
};
TORCH_MODULE(GptNeoX);

}  // namespace trainyard::models
