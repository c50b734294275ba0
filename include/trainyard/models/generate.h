// Text generation with a causal LM (models/causal_lm.h) and its key/value cache: the prompt is read
// once, then one token at a time is fed back. Greedy (the most likely token) or sampled with a
// temperature, top-k and top-p (nucleus) filtering from a seeded generator, so a run is
// reproducible.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "trainyard/models/causal_lm.h"

namespace trainyard::models {

struct GenerateOptions {
  std::int64_t max_new_tokens = 64;
  bool greedy = false;
  double temperature = 1.0;  // > 0; logits are divided by it before sampling
  std::int64_t top_k = 0;    // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // keep the most likely tokens whose probabilities sum to p; 1: all
  std::uint64_t seed = 0;
  std::optional<std::int64_t> eos_id;  // stop after generating it
  // Only ids below this are generated (a tokenizer smaller than the padded embedding); 0: all.
  std::int64_t vocab_limit = 0;

  // Throws InvalidArgumentError naming the flag (--temperature, --top-k, ...).
  void validate() const;
};

// The new token ids after `prompt` (at least one id); stops at max_new_tokens, at eos_id, or when
// the model's max_position_embeddings are used up (a warning says so when max_new_tokens asked
// for more). Runs in eval mode without autograd.
std::vector<std::int64_t> generate(CausalLmImpl& model,
                                   const std::vector<std::int64_t>& prompt,
                                   const GenerateOptions& options);

}  // namespace trainyard::models
