// What trainyard's transformers share below their public headers: per-name initialisation
// (Note [Per-name initialisation] in models/causal_lm.h) by a parameter's kind and shape, HF-style
// parameter names split into layer index and module path, rotary embeddings in rotate-half
// layout, and causal self-attention over (B, heads, T, head_size) tensors.
#pragma once

#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/models/causal_lm.h"
#include "trainyard/nn/unit_hook.h"

namespace trainyard::models::parts {

enum class InitKind { kNormal, kZeros, kOnes, kUniform };

// A parameter's shape and how it starts.
struct ParamSpec {
  InitKind kind;
  std::vector<std::int64_t> shape;
  double bound = 0;  // kUniform: U(-bound, bound)
};

// Dense (in -> out) weight and bias by the last component of the name: weight ~ normal, bias 0.
std::optional<ParamSpec> dense_spec(std::string_view field, std::int64_t in, std::int64_t out);
// A LoRA factor (models/lora.h) of rank r named "<linear>.lora_A.weight" (r, in), uniform in
// +-1/sqrt(in), or "<linear>.lora_B.weight" (out, r), zero, from the spec `base` gives
// "<linear>.weight"; nullopt for any other name.
std::optional<ParamSpec> lora_spec(
    std::string_view name,
    std::int64_t r,
    const std::function<std::optional<ParamSpec>(std::string_view)>& base);
// lora_spec for a model built with LoRA adapters, else (and for other names) base(name).
std::optional<ParamSpec> spec_with_lora(
    const CausalLmImpl& model,
    std::string_view name,
    const std::function<std::optional<ParamSpec>(std::string_view)>& base);
// LayerNorm / RmsNorm weight (1) and bias (0).
std::optional<ParamSpec> norm_spec(std::string_view field, std::int64_t features);

// "<prefix><index>.<module path>.<field>", e.g. "model.layers.3.mlp.up_proj.weight" with prefix
// "model.layers.": index 3, module "mlp.up_proj", field "weight". Nullopt for any other name or an
// index outside [0, num_layers).
struct LayerParamName {
  std::int64_t index = -1;
  std::string_view module, field;
};
std::optional<LayerParamName> split_layer_name(std::string_view name,
                                               std::string_view prefix,
                                               std::int64_t num_layers);
// The part of `name` after `prefix` when it starts with it.
std::optional<std::string_view> after_prefix(std::string_view name, std::string_view prefix);

// Fills `tensor` as `spec` says from the generator of (seed, name): see Note [Per-name
// initialisation]. `model` names the architecture in errors; `spec` null means `name` is not one
// of its parameters (an InvalidArgumentError naming the model's layer count).
void init_from_spec(const std::optional<ParamSpec>& spec,
                    const std::string& name,
                    torch::Tensor& tensor,
                    std::uint64_t seed,
                    double stddev,
                    std::string_view model,
                    std::int64_t num_layers);

torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training);

// (x1, x2) -> (-x2, x1) over the halves of the last dimension.
torch::Tensor rotate_half(const torch::Tensor& x);
// cos and sin (T, dim) for positions [past, past + T) from inverse frequencies (dim / 2) in fp32:
// HF's emb = cat(freqs, freqs), cast to `dtype` (HF casts the fp32 tables to the activations').
std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const torch::Tensor& inv_freq,
                                                       std::int64_t past,
                                                       std::int64_t seq,
                                                       torch::ScalarType dtype);
// Rotates the first `dim` dimensions of x (B, heads, T, head_size) by position; cos/sin (T, dim).
torch::Tensor apply_rotary(const torch::Tensor& x,
                           const torch::Tensor& cos,
                           const torch::Tensor& sin,
                           std::int64_t dim);

// (B, kv_heads, T, d) -> (B, kv_heads * n, T, d), each key/value head repeated for the n query
// heads it serves (HF's repeat_kv): grouped-query attention.
torch::Tensor repeat_kv(const torch::Tensor& x, std::int64_t n);

// (B, T, heads * d) -> (B, heads, T, d).
torch::Tensor split_heads(const torch::Tensor& x, std::int64_t heads, std::int64_t d);

// Llama's attention after its projections: rotates q (B, H, T, d) and k (B, KV, T, d) for
// positions [past, past + T), where `cache` holds the past positions' keys and values (none when
// null) and gets this call's appended (the key/value heads, not their repeats), then attends
// causally with each key/value head serving H / KV query heads. Returns (B, T, H * d).
torch::Tensor rotary_gqa_attention(torch::Tensor q,
                                   torch::Tensor k,
                                   torch::Tensor v,
                                   const torch::Tensor& inv_freq,
                                   KvCache::Layer* cache,
                                   double dropout,
                                   bool training);

// Causal softmax attention of q (B, H, T, d) over k, v (B, H, past + T, d): query i (position
// past + i) sees keys 0 ... past + i. Scores and softmax in fp32 whatever the activations' dtype
// (as HF upcasts), scaled by d^-0.5; the fused kernel where Note [Fused attention on GPUs] allows.
// Returns (B, T, H * d).
torch::Tensor causal_attention(const torch::Tensor& q,
                               const torch::Tensor& k,
                               const torch::Tensor& v,
                               double dropout,
                               bool training);

// What the parameter `name` of Llama(config) is, or nullopt when there is none by that name
// (llama.cpp): architectures built on Llama's layers extend it.
std::optional<ParamSpec> llama_param_spec(const LlamaConfig& config, std::string_view name);

// Throws InvalidArgumentError naming `model` unless `ids` are (B, T) int64 token ids whose
// positions [past, past + T) are within max_positions.
void check_token_ids(const torch::Tensor& ids,
                     std::int64_t past,
                     std::int64_t max_positions,
                     std::string_view model);

// module->forward(x) through trainyard::nn::call_unit, so that a wrapper (FSDP, activation
// checkpointing) may run around it. The unit's forward holds the module by value: a hook may call
// it again in backward (activation checkpointing), after this frame is gone.
template <typename Module>
torch::Tensor call_as_unit(const std::shared_ptr<Module>& module, const torch::Tensor& x) {
  return trainyard::nn::call_unit(
      *module, x, [module](const torch::Tensor& in) { return module->forward(in); });
}

// x through each of `layers` (all of type Layer) in turn, each as a unit.
template <typename Layer>
torch::Tensor call_layers(torch::nn::ModuleList& layers, torch::Tensor x) {
  for (std::size_t i = 0; i < layers->size(); ++i) x = call_as_unit(layers->ptr<Layer>(i), x);
  return x;
}

// For decoding: x through each layer's forward_cached with its entry of `cache`.
template <typename Layer>
torch::Tensor call_layers_cached(torch::nn::ModuleList& layers, torch::Tensor x, KvCache& cache) {
  cache.layers.resize(layers->size());
  for (std::size_t i = 0; i < layers->size(); ++i)
    x = layers->ptr<Layer>(i)->forward_cached(x, &cache.layers[i]);
  return x;
}

}  // namespace trainyard::models::parts
