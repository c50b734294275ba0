#include "trainyard/models/qwen3_config.h"

#include "models/config_fields.h"
#include "trainyard/error.h"

namespace trainyard::models {
namespace {

using Qwen3Preset = NamedPreset<Qwen3Config>;

// Sizes from each model's config.json on the Hugging Face hub.
const std::vector<Qwen3Preset>& qwen3_presets() {
  static const std::vector<Qwen3Preset> all = {
      {"qwen3-0.6b", Qwen3Config{.vocab_size = 151936,
                                 .hidden_size = 1024,
                                 .intermediate_size = 3072,
                                 .num_hidden_layers = 28,
                                 .num_attention_heads = 16,
                                 .num_key_value_heads = 8,
                                 .head_dim = 128,
                                 .max_position_embeddings = 40960,
                                 .rms_norm_eps = 1e-6,
                                 .rope_theta = 1000000,
                                 .tie_word_embeddings = true}},
  };
  return all;
}

Qwen3Config from_llama(const LlamaConfig& l) {
  return Qwen3Config{.vocab_size = l.vocab_size,
                     .hidden_size = l.hidden_size,
                     .intermediate_size = l.intermediate_size,
                     .num_hidden_layers = l.num_hidden_layers,
                     .num_attention_heads = l.num_attention_heads,
                     .num_key_value_heads = l.num_key_value_heads,
                     .head_dim = l.head_dim,
                     .max_position_embeddings = l.max_position_embeddings,
                     .rms_norm_eps = l.rms_norm_eps,
                     .rope_theta = l.rope_theta,
                     .rope_scaling = l.rope_scaling,
                     .attention_bias = l.qkv_bias,
                     .tie_word_embeddings = l.tie_word_embeddings,
                     .attention_dropout = l.attention_dropout,
                     .initializer_range = l.initializer_range};
}

}  // namespace

Qwen3Config Qwen3Config::preset(const std::string& name) {
  return find_preset(qwen3_presets(), name, "Qwen3");
}

std::vector<std::string> Qwen3Config::preset_names() {
  return names_of(qwen3_presets());
}

Qwen3Config Qwen3Config::from_json(const Json& j) {
  // Llama's reader, for Llama's model_type: attention_bias biases all four projections, as
  // Qwen3Attention's; Qwen3's MLP has no biases whatever mlp_bias says (transformers ignores
  // it), and head_dim is 128 unless given.
  Json as_llama = j;
  as_llama["model_type"] = "llama";
  as_llama.erase("mlp_bias");
  if (!as_llama.contains("head_dim") || as_llama["head_dim"].is_null()) as_llama["head_dim"] = 128;
  auto c = from_llama(LlamaConfig::from_json(as_llama));
  refuse_sliding_window(j, WindowedLayers::kFromMaxWindowLayers, c.num_hidden_layers,
                        c.max_position_embeddings);
  return c;
}

std::string Qwen3Config::to_json() const {
  Json j = Json::parse(llama().to_json());
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = model_type();
  j.erase("mlp_bias");
  j["use_sliding_window"] = false;
  return j.dump(2);
}

void Qwen3Config::validate() const {
  llama().validate();
}

LlamaConfig Qwen3Config::llama() const {
  return LlamaConfig{.variant = LlamaVariant::kLlama,
                     .vocab_size = vocab_size,
                     .hidden_size = hidden_size,
                     .intermediate_size = intermediate_size,
                     .num_hidden_layers = num_hidden_layers,
                     .num_attention_heads = num_attention_heads,
                     .num_key_value_heads = num_key_value_heads,
                     .head_dim = head_dim,
                     .max_position_embeddings = max_position_embeddings,
                     .rms_norm_eps = rms_norm_eps,
                     .rope_theta = rope_theta,
                     .rope_scaling = rope_scaling,
                     .qkv_bias = attention_bias,
                     .o_bias = attention_bias,
                     .mlp_bias = false,
                     .tie_word_embeddings = tie_word_embeddings,
                     .attention_dropout = attention_dropout,
                     .initializer_range = initializer_range};
}

ParameterLayout Qwen3Config::parameter_layout() const {
  auto p = llama().parameter_layout();
  const auto d = llama().head_size();
  p.layer.insert(p.layer.end(), {d, d});  // self_attn.q_norm, self_attn.k_norm
  p.layer_norm_elements += 2 * d;
  return p;
}

// Note [Qwen3 activations]
// Llama's layer (Note [Llama activations]) plus the per-head norms on q (B,T,q) and k (B,T,kv):
// each keeps its fp32 input (4), the normalised value cast back (c) and its output (c).
double Qwen3Config::layer_activation_bytes(const ActivationShape& shape) const {
  const auto l = llama();
  const double bt = static_cast<double>(shape.micro_batch) * static_cast<double>(shape.seq_len);
  const double qk =
      static_cast<double>((num_attention_heads + num_key_value_heads) * l.head_size());
  const double c = shape.bf16 ? 2 : 4;
  return l.layer_activation_bytes(shape) + (4 + 2 * c) * bt * qk;
}

}  // namespace trainyard::models
