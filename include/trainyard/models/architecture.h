// What every causal-LM architecture states about itself, each in its own files (gpt_neox_config.h,
// llama_config.h, ...), so that LoRA, checkpoint loading, the memory planner and FSDP read them
// without naming an architecture. The set of architectures is declared once, in
// causal_lm_config.h (CausalLmConfig::Variant); an architecture's config type provides:
//
//   static constexpr std::string_view kArchitecture;   // for people: "GPT-NeoX", "Llama"
//   static constexpr std::string_view kModelTypes[];   // config.json model_types it reads
//   static Config preset(const std::string&); static std::vector<std::string> preset_names();
//   static Config from_json(const nlohmann::json&);    // config.json, parsed once by the caller
//   std::string to_json() const; void validate() const;
//   std::string_view model_type() const;
//   ParameterLayout parameter_layout() const;          // every parameter tensor, by unit
//   std::vector<LayerLinear> layer_linears() const;    // LoRA's targets
//   bool is_unused_checkpoint_tensor(std::string_view name) const;  // may be static
//   double layer_activation_bytes(const ActivationShape&) const;   // the memory planner's
//
// and, declared beside the config and defined with its model (gpt_neox.cpp, ...),
//
//   CausalLm make_model(const Config&, CausalLmInit);
//
// so that the compiler refuses an architecture without a model (make_causal_lm). LibTorch-free:
// the model's types are only named here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainyard::models {

class CausalLm;  // models/causal_lm.h
struct CausalLmInit;

// One linear layer of a transformer layer: its path below the layer and its sizes.
struct LayerLinear {
  std::string name;  // "self_attn.q_proj", "attention.query_key_value", ...
  std::int64_t in = 0, out = 0;
};

// The elements of every parameter tensor of a model, grouped as FSDP wraps them (the root with the
// final norm, and the embedding when tied; the input embedding; each layer; the output
// projection). Each layer's tensors are in the order named_parameters() lists them; across
// units the order is not the model's, and ZeRO-1's planned owners come from sorting the sizes as
// ShardedAdam does, not from this order. What parameter counts, the memory planner's unit sizes
// and ZeRO-1's owners are computed from.
struct ParameterLayout {
  std::int64_t embedding = 0;            // the input embedding (= the untied output projection)
  std::vector<std::int64_t> layer;       // one transformer layer's tensors, in module order
  std::int64_t layer_norm_elements = 0;  // of those, the norms' (autocast does not copy them)
  std::int64_t num_layers = 0;
  std::vector<std::int64_t> final_norm;  // the norm after the layers
  bool tied = false;                     // the output projection is the embedding's weight

  std::int64_t layer_elements() const;
  std::int64_t total() const;  // the model's parameter count
};

// A micro-batch as the memory planner sizes activations: B sequences of T tokens, computing in
// bf16 (2 bytes an element) or fp32.
struct ActivationShape {
  std::int64_t micro_batch = 1;
  std::int64_t seq_len = 1;
  bool bf16 = false;
};

}  // namespace trainyard::models
