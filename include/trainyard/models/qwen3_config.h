// The configuration of Qwen3 as Hugging Face's Qwen3Config writes it (config.json, model_type
// "qwen3"): Llama's sizes and rotary embeddings, head_dim 128 unless given, attention_bias on all
// four attention projections, no MLP biases, and each query and key head RMS-normalised before
// its rotation. The presets with their exact parameter counts. LibTorch-free, like
// llama_config.h; qwen3.h builds the model from it.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/models/architecture.h"
#include "trainyard/models/llama_config.h"

namespace trainyard::models {

struct Qwen3Config {
  static constexpr std::string_view kArchitecture = "Qwen3";
  static constexpr std::string_view kModelTypes[] = {"qwen3"};

  std::int64_t vocab_size = 151936;
  std::int64_t hidden_size = 4096;
  std::int64_t intermediate_size = 22016;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 32;
  std::int64_t num_key_value_heads = 32;
  std::int64_t head_dim = 128;  // Qwen3's default, whatever hidden_size / num_attention_heads is
  std::int64_t max_position_embeddings = 32768;
  double rms_norm_eps = 1e-6;  // the layers' norms and the per-head q_norm and k_norm
  double rope_theta = 10000;
  RopeScaling rope_scaling;
  bool attention_bias = false;  // q_proj, k_proj, v_proj and o_proj biases
  bool tie_word_embeddings = false;
  double attention_dropout = 0;
  double initializer_range = 0.02;

  // "qwen3-0.6b".
  static Qwen3Config preset(const std::string& name);
  static std::vector<std::string> preset_names();

  // Reads config.json as Llama's reader does (required sizes, rope_scaling, what the model lacks
  // refused by name), with Qwen3's defaults; a sliding window on any layer shorter than
  // max_position_embeddings is refused. Validates the result.
  static Qwen3Config from_json(const nlohmann::json& j);
  // As Hugging Face writes it; from_json(to_json()) == *this.
  std::string to_json() const;
  // Throws InvalidArgumentError naming the first bad field (as LlamaConfig's fields) and its value.
  void validate() const;

  // The same model without the per-head norms: the parts Qwen3 shares with Llama (its MLP, rotary
  // frequencies, checks) read it.
  LlamaConfig llama() const;

  // The facts every architecture states (models/architecture.h).
  std::string_view model_type() const { return "qwen3"; }
  ParameterLayout parameter_layout() const;
  std::int64_t parameter_count() const { return parameter_layout().total(); }
  std::vector<LayerLinear> layer_linears() const { return llama().layer_linears(); }
  bool is_unused_checkpoint_tensor(std::string_view name) const {
    return llama().is_unused_checkpoint_tensor(name);
  }
  // Llama's layer (Note [Llama activations]) plus what the per-head norms keep.
  double layer_activation_bytes(const ActivationShape& shape) const;

  bool operator==(const Qwen3Config&) const = default;
};

// Qwen3(config) as a CausalLm (qwen3.cpp), for make_causal_lm.
CausalLm make_model(const Qwen3Config& config, CausalLmInit init);

}  // namespace trainyard::models
