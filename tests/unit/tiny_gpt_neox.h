// The small GPT-NeoX the FSDP tests train: a vocabulary of 61 so that no unit's element count
// divides evenly and every flat buffer needs padding, and seeded batches every world size agrees
// on.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "trainyard/models/gpt_neox.h"

namespace trainyard::testing {

inline models::GptNeoXConfig tiny_gpt_neox_config() {
  models::GptNeoXConfig c;
  c.vocab_size = 61;
  c.hidden_size = 16;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  c.intermediate_size = 40;
  c.rotary_pct = 0.5;
  c.max_position_embeddings = 16;
  return c;
}

// (rows, seq) token ids of step `step`: rank r of W with batch B trains on rows [r * B, (r + 1) *
// B) of tiny_gpt_neox_batch(step, W * B, seq).
inline torch::Tensor tiny_gpt_neox_batch(int step, std::int64_t rows, std::int64_t seq) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return torch::randint(0, tiny_gpt_neox_config().vocab_size, {rows, seq}, gen,
                        torch::TensorOptions().dtype(torch::kInt64));
}

}  // namespace trainyard::testing
