// GPT-NeoX's configuration as plain data: Hugging Face's GPTNeoXConfig fields, the presets, the
// config.json reader and writer, and the parameter count by formula. LibTorch-free, so planning
// tools (trainyard::plan) and config checks need no tensors; gpt_neox.h builds the model from it.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/models/architecture.h"

namespace trainyard::models {

// Hugging Face's GPTNeoXConfig fields (config.json), with HF's defaults.
struct GptNeoXConfig {
  static constexpr std::string_view kArchitecture = "GPT-NeoX";
  static constexpr std::string_view kModelTypes[] = {"gpt_neox"};

  std::int64_t vocab_size = 50432;
  std::int64_t hidden_size = 6144;
  std::int64_t num_hidden_layers = 44;
  std::int64_t num_attention_heads = 64;
  std::int64_t intermediate_size = 24576;
  double rotary_pct = 0.25;  // share of each head's dimensions that get rotary embeddings
  double rotary_emb_base = 10000;
  std::int64_t max_position_embeddings = 2048;  // longest sequence forward() accepts
  double layer_norm_eps = 1e-5;
  bool use_parallel_residual = true;  // x + attn(ln1(x)) + mlp(ln2(x)); else one after the other
  double hidden_dropout = 0;     // after the embedding, the attention and the MLP (training only)
  double attention_dropout = 0;  // on the attention probabilities (training only)
  double initializer_range = 0.02;  // std of the normal init of Dense and Embedding weights

  // "pythia-14m", "pythia-70m", "pythia-160m", "pythia-410m", "dolly-v2-7b", and "tiny" (a
  // 2-layer, 32-wide model for tests). Throws InvalidArgumentError naming the known ones.
  static GptNeoXConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();

  // Reads a Hugging Face config.json (model_type "gpt_neox"; CausalLmConfig::from_json parses
  // and dispatches). The fields that give the model its
  // size (vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
  // max_position_embeddings) are required: an error names the missing ones. Unknown keys are
  // ignored; keys that change the architecture in ways this model lacks (tie_word_embeddings,
  // rope_scaling, attention_bias false, hidden_act other than "gelu") are refused. Validates the
  // result.
  static GptNeoXConfig from_json(const nlohmann::json& j);
  // The fields above plus model_type, architectures, hidden_act and tie_word_embeddings, as HF
  // writes them; from_json(to_json()) == *this.
  std::string to_json() const;

  // Throws InvalidArgumentError naming the first bad field and its value.
  void validate() const;

  std::int64_t head_size() const { return hidden_size / num_attention_heads; }
  // HF's int(head_size * rotary_pct): the leading dimensions of each head that are rotated.
  std::int64_t rotary_ndims() const;
  // The facts every architecture states (models/architecture.h).
  std::string_view model_type() const { return "gpt_neox"; }
  ParameterLayout parameter_layout() const;
  std::int64_t parameter_count() const { return parameter_layout().total(); }
  // attention.query_key_value, attention.dense, mlp.dense_h_to_4h, mlp.dense_4h_to_h.
  std::vector<LayerLinear> layer_linears() const;
  // Buffers older checkpoints saved beside the weights that the model recomputes from config.json:
  // "*.attention.rotary_emb.inv_freq", "*.attention.bias" (the causal mask),
  // "*.attention.masked_bias".
  static bool is_unused_checkpoint_tensor(std::string_view name);
  // What autograd keeps for one layer (Note [GPT-NeoX activations]).
  double layer_activation_bytes(const ActivationShape& shape) const;

  bool operator==(const GptNeoXConfig&) const = default;
};

// GptNeoX(config) as a CausalLm (gpt_neox.cpp), for make_causal_lm.
CausalLm make_model(const GptNeoXConfig& config, CausalLmInit init);

}  // namespace trainyard::models
