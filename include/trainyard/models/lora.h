// LoRA (Hu et al. 2021), parameter-efficient fine-tuning as Hugging Face's PEFT does it: chosen
// linear layers get y = W x + b + (alpha / r) * B A dropout(x), A (r, in) ~ U(-1/sqrt(in),
// 1/sqrt(in)) (PEFT's kaiming_uniform with a = sqrt(5)), B (out, r) zero, and every other
// parameter is frozen. LibTorch-free: the options and counts; models build the adapters
// (CausalLmInit::lora).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainyard/models/causal_lm_config.h"

namespace trainyard::models {

struct LoraOptions {
  std::int64_t r = 16;    // rank of the update
  double alpha = 32;      // the update is scaled by alpha / r
  double dropout = 0.05;  // on the adapter's input, training only
  // Linear layers by the last part of their name (q_proj, v_proj, dense_h_to_4h, ...), or
  // "all-linear": every linear layer of the transformer layers (PEFT's; not the output head).
  std::vector<std::string> targets = {"q_proj", "v_proj"};  // llama-recipes' defaults

  double scaling() const { return alpha / static_cast<double>(r); }
  // Throws InvalidArgumentError naming the flag (--lora-r, ...).
  void validate() const;
  bool operator==(const LoraOptions&) const = default;
};

// The linear layers of one transformer layer (CausalLmConfig::layer_linears) that
// options.targets selects. Throws InvalidArgumentError naming a target the architecture
// has no linear layer for, and listing the ones it has.
std::vector<LayerLinear> lora_targets(const CausalLmConfig& config, const LoraOptions& options);
// The adapters' parameters: r x (in + out) per targeted linear layer, in every layer.
std::int64_t lora_parameter_count(const CausalLmConfig& config, const LoraOptions& options);

}  // namespace trainyard::models
