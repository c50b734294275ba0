#include "trainyard/models/causal_lm.h"

#include "trainyard/models/gpt_neox.h"
#include "trainyard/models/llama.h"

namespace trainyard::models {

CausalLm make_causal_lm(const CausalLmConfig& config, CausalLmInit init) {
  return std::visit(
      [&](const auto& c) -> CausalLm {
        using Config = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<Config, GptNeoXConfig>)
          return CausalLm(
              std::static_pointer_cast<CausalLmImpl>(std::make_shared<GptNeoXImpl>(c, init)));
        else
          return CausalLm(
              std::static_pointer_cast<CausalLmImpl>(std::make_shared<LlamaImpl>(c, init)));
      },
      config.variant());
}

}  // namespace trainyard::models
