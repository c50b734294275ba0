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

#include "trainyard/models/gpt_neox_config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace trainyard::models {

struct GptNeoXInit {
  // torch::kMeta creates shapes only (no storage, no initialisation); any other device gets
  // initialised fp32 parameters.
  torch::Device device = torch::kCPU;
  std::uint64_t seed = 0;  // see Note [Per-name initialisation]
  // CPU parameters with their shapes but no memory (zero-byte storage) and no values: for
  // FullyShardedDataParallel, which allocates and initialises one unit at a time through
  // FsdpOptions::param_init (GptNeoXImpl::init_parameter), so the full model never exists in one
  // process. Such a model cannot run until FSDP has taken it.
  bool deferred = false;
};

// Note [Per-name initialisation]
// Every parameter is initialised from its own CPU generator seeded with a hash of (seed, full
// parameter name), never from the global generator. So a tensor's values depend only on its name,
// the seed and the config: not on what else was built, in which order, on which rank, or whether
// it was materialised from the meta device later by GptNeoXImpl::init_parameter. The values are
// drawn in fp32 on the CPU and copied into the tensor (rounded for other dtypes).

// The building blocks: LibTorch's Linear, LayerNorm and Embedding allocate and initialise in their
// constructors, so these register `weight` / `bias` with torch::empty(shape, options) instead and
// leave initialisation to the owner (a meta-device model allocates nothing).

// y = x W^T + b, W (out_features, in_features).
class DenseImpl : public torch::nn::Module {
 public:
  DenseImpl(std::int64_t in_features,
            std::int64_t out_features,
            bool bias,
            const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // (out_features, in_features)
  torch::Tensor bias;    // (out_features), or undefined
};
TORCH_MODULE(Dense);

// torch::layer_norm over the last dimension; computes in the input's dtype as torch does.
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(std::int64_t features, double eps, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // (features)
  torch::Tensor bias;    // (features)
  double eps;
};
TORCH_MODULE(LayerNorm);

// A lookup table: (...) int64 ids -> (..., dim).
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(std::int64_t count, std::int64_t dim, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& ids);

  torch::Tensor weight;  // (count, dim)
};
TORCH_MODULE(Embedding);

// The keys and values of the positions a model has seen, per layer, so that decoding feeds one
// new token at a time (GptNeoXImpl::forward_cached). Starts empty.
struct KvCache {
  struct Layer {
    torch::Tensor key, value;  // (B, heads, T_past, head_size); undefined while empty
  };
  std::vector<Layer> layers;
  std::int64_t length() const {  // positions cached
    return layers.empty() || !layers[0].key.defined() ? 0 : layers[0].key.size(2);
  }
};

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
class GptNeoXImpl : public torch::nn::Module {
 public:
  // Validates the config. See GptNeoXInit for devices and Note [Per-name initialisation].
  explicit GptNeoXImpl(GptNeoXConfig config, GptNeoXInit init = {});

  // (B, T) int64 token ids, T <= max_position_embeddings -> (B, T, vocab_size) logits, in the
  // parameters' dtype.
  torch::Tensor forward(const torch::Tensor& input_ids);
  // For decoding (an unwrapped model, no autograd needed): the logits of positions
  // [cache.length(), cache.length() + T) given the cached ones, in fp32; appends to `cache`. Equal
  // to the last T positions of forward() over the whole sequence.
  torch::Tensor forward_cached(const torch::Tensor& input_ids, KvCache& cache);
  // HF's causal-LM loss of forward(input_ids) against labels (B, T): see causal_lm_loss.
  torch::Tensor loss(const torch::Tensor& input_ids, const torch::Tensor& labels);

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
  void init_parameter(const std::string& full_name, torch::Tensor& tensor) const;

  const GptNeoXConfig& config() const { return config_; }
  std::uint64_t seed() const { return seed_; }

  GptNeoXModel gpt_neox{nullptr};
  Dense embed_out{nullptr};  // hidden -> vocab_size, no bias

 private:
  GptNeoXConfig config_;
  std::uint64_t seed_;
};
TORCH_MODULE(GptNeoX);

// Hugging Face's causal-LM loss: mean cross entropy (in fp32) of logits[:, :-1] (B, T, V) against
// labels[:, 1:] (B, T) int64; labels equal to kIgnoreIndex (-100) are left out of the mean.
constexpr std::int64_t kIgnoreIndex = -100;
torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace trainyard::models
