// The configuration of any causal language model trainyard builds, chosen by config.json's
// model_type. One value that the recipe, generation, export and the planner pass around without
// knowing the architecture: it forwards to the architecture's own config, which states the facts
// models/architecture.h lists. The set of architectures is Variant; adding one is its own files
// and one entry there. LibTorch-free, like the configs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "trainyard/models/gpt_neox_config.h"
#include "trainyard/models/llama_config.h"
#include "trainyard/models/qwen3_config.h"

namespace trainyard::models {

class CausalLmConfig {
 public:
  // Every architecture trainyard builds, each with its model (make_causal_lm).
  using Variant = std::variant<GptNeoXConfig, LlamaConfig, Qwen3Config>;

  template <typename Config>
  requires std::is_constructible_v<Variant, Config> CausalLmConfig(Config config)
      : config_(std::move(config)) {}  // NOLINT: implicit

  // Every architecture's presets ("pythia-70m", ...). Throws InvalidArgumentError naming the known
  // ones.
  static CausalLmConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  static bool is_preset(const std::string& name);
  // A Hugging Face config.json, parsed once and read by the architecture whose kModelTypes has
  // its model_type (a file without model_type is read as GPT-NeoX). Throws InvalidArgumentError
  // for text that is not a JSON object, naming an unsupported model_type and the supported ones,
  // and whatever the architecture's reader refuses.
  static CausalLmConfig from_json(const std::string& json_text);
  // The architecture's config.json, as Hugging Face writes it.
  std::string to_json() const;

  // The architecture's validate(): throws InvalidArgumentError naming the bad field.
  void validate() const;

  std::string_view model_type() const;    // config.json's "gpt_neox", "llama", "qwen2", ...
  std::string_view architecture() const;  // for people: "GPT-NeoX", "Llama"

  // The fields every architecture has.
  std::int64_t vocab_size() const;
  std::int64_t hidden_size() const;
  std::int64_t num_hidden_layers() const;
  std::int64_t intermediate_size() const;
  std::int64_t num_attention_heads() const;
  std::int64_t max_position_embeddings() const;
  // Parameters of the model, by formula (allocates nothing).
  std::int64_t parameter_count() const;

  // The architecture's facts (models/architecture.h).
  ParameterLayout parameter_layout() const;
  std::vector<LayerLinear> layer_linears() const;
  bool is_unused_checkpoint_tensor(std::string_view name) const;
  double layer_activation_bytes(const ActivationShape& shape) const;

  // The architecture's own config, or null when it is another architecture's.
  template <typename Config>
  const Config* get_if() const {
    return std::get_if<Config>(&config_);
  }
  const Variant& variant() const { return config_; }

  bool operator==(const CausalLmConfig&) const = default;

 private:
  Variant config_;
};

}  // namespace trainyard::models
