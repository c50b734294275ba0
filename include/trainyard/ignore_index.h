// The label that leaves a position out of a causal-LM loss: Hugging Face's (and PyTorch
// cross_entropy's default) -100. Data sets write it (padding, prompts); the loss skips it.
#pragma once

#include <cstdint>

namespace trainyard {

inline constexpr std::int64_t kIgnoreIndex = -100;

}  // namespace trainyard
