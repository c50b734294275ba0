// The configuration of Llama and its relatives as Hugging Face's LlamaConfig, MistralConfig and
// Qwen2Config write it (config.json, model_type "llama", "mistral", "qwen2"): sizes, grouped-query
// attention, rotary embeddings with rope_scaling ("linear", "llama3"), biases, tied embeddings;
// the presets (Llama 2 and 3, TinyLlama, SmolLM2) with their exact parameter counts.
// LibTorch-free, like gpt_neox_config.h; llama.h builds the model from it.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/models/architecture.h"

namespace trainyard::models {

// Hugging Face's rope_scaling (or transformers v5's rope_parameters).
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1;
  // llama3 only: wavelengths longer than original / low_freq_factor are slowed by `factor`,
  // shorter than original / high_freq_factor kept, those between interpolated.
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  std::int64_t original_max_position_embeddings = 8192;

  bool operator==(const RopeScaling&) const = default;
};

// Which of the family a config.json describes: its model_type, and transformers' class for it.
// The biases and config.json keys follow it (from_json).
enum class LlamaVariant { kLlama, kMistral, kQwen2 };

struct LlamaConfig {
  static constexpr std::string_view kArchitecture = "Llama";
  static constexpr std::string_view kModelTypes[] = {"llama", "mistral", "qwen2"};

  LlamaVariant variant = LlamaVariant::kLlama;
  std::int64_t vocab_size = 32000;
  std::int64_t hidden_size = 4096;
  std::int64_t intermediate_size = 11008;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 32;
  std::int64_t num_key_value_heads = 32;        // < num_attention_heads: grouped-query attention
  std::int64_t head_dim = 0;                    // 0: hidden_size / num_attention_heads
  std::int64_t max_position_embeddings = 2048;  // longest sequence forward() accepts
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  RopeScaling rope_scaling;
  bool qkv_bias = false;  // q_proj, k_proj, v_proj biases (Llama's attention_bias; Qwen2: true)
  bool o_bias = false;    // o_proj bias (Llama's attention_bias; Qwen2: false)
  bool mlp_bias = false;  // gate_proj, up_proj, down_proj biases
  bool tie_word_embeddings = false;  // the output projection is embed_tokens' weight
  double attention_dropout = 0;      // on the attention probabilities (training only)
  double initializer_range = 0.02;   // std of the normal init of linear and embedding weights

  // "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3.2-1b", "tinyllama-1.1b",
  // "smollm2-135m", and "llama-tiny" (2 layers, grouped-query attention, for tests).
  static LlamaConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();

  // Reads a Hugging Face config.json of model_type llama, mistral or qwen2 (CausalLmConfig::
  // from_json parses and dispatches). The size fields are
  // required (an error names the missing ones); what this model lacks (hidden_act other than
  // silu, a rope_scaling type other than linear and llama3, a Mistral/Qwen2 sliding window
  // shorter than max_position_embeddings) is refused naming the key. Validates the result.
  static LlamaConfig from_json(const nlohmann::json& j);
  // As Hugging Face writes it; from_json(to_json()) == *this.
  std::string to_json() const;

  // Throws InvalidArgumentError naming the first bad field and its value.
  void validate() const;

  std::int64_t head_size() const {
    return head_dim > 0 ? head_dim : hidden_size / num_attention_heads;
  }

  // The facts every architecture states (models/architecture.h).
  std::string_view model_type() const;  // "llama", "mistral" or "qwen2"
  ParameterLayout parameter_layout() const;
  std::int64_t parameter_count() const { return parameter_layout().total(); }
  // self_attn.q_proj, k_proj, v_proj, o_proj, mlp.gate_proj, up_proj, down_proj.
  std::vector<LayerLinear> layer_linears() const;
  // Rotary frequencies older checkpoints saved: "*.self_attn.rotary_emb.inv_freq",
  // "model.rotary_emb.inv_freq"; with tied embeddings, "lm_head.weight", which some exporters
  // write equal to the input embedding (a different one unties the model: Note [A tied model's
  // written output projection] in src/train/causal_lm_source.cpp).
  bool is_unused_checkpoint_tensor(std::string_view name) const;
  // What autograd keeps for one layer (Note [Llama activations]).
  double layer_activation_bytes(const ActivationShape& shape) const;

  bool operator==(const LlamaConfig&) const = default;
};

// Llama(config) as a CausalLm (llama.cpp), for make_causal_lm.
CausalLm make_model(const LlamaConfig& config, CausalLmInit init);

}  // namespace trainyard::models
