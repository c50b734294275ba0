// Wrap policies: which submodules of a model become FSDP units (each gathered, freed and
// reduce-scattered as one flat buffer). The root keeps every parameter no unit claims.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace trainyard::fsdp {

struct WrapPolicy {
  // Called for every submodule, innermost first, with its qualified name ("gpt_neox.layers.3"),
  // the module, and how many parameter elements of its subtree no inner unit has claimed yet.
  // True makes it a unit owning those parameters. Empty: the root is the only unit.
  std::function<bool(
      const std::string& name, const torch::nn::Module& module, std::int64_t unclaimed_numel)>
      wraps;
  // Qualified names that must each become a unit; construction fails naming any that does not.
  std::vector<std::string> required_names;
};

// One unit per module of type T (PyTorch's transformer_auto_wrap_policy), e.g. one per
// GptNeoXLayerImpl.
template <typename T>
WrapPolicy wrap_modules_of_type() {
  return {.wraps = [](const std::string&, const torch::nn::Module& module, std::int64_t) {
    return dynamic_cast<const T*>(&module) != nullptr;
  }};
}

// A unit for each submodule whose not yet claimed parameters number at least `min_numel`
// (PyTorch's size_based_auto_wrap_policy).
WrapPolicy wrap_by_parameter_count(std::int64_t min_numel);

// A unit for each submodule named in `names` (qualified names, as named_modules() gives them).
// Names that match no submodule are an error at construction.
WrapPolicy wrap_modules_named(std::vector<std::string> names);

// A unit for each submodule any of `policies` wraps; every policy's required names stay required.
// E.g. GPT-NeoX's layers and its two embeddings, which hold a quarter of pythia's parameters:
//   wrap_any_of({wrap_modules_of_type<GptNeoXLayerImpl>(),
//                wrap_modules_named({"gpt_neox.embed_in", "embed_out"})})
WrapPolicy wrap_any_of(std::vector<WrapPolicy> policies);

}  // namespace trainyard::fsdp
