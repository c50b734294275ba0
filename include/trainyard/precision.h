// The numeric precision of a training job: what the recipes' --precision (and --pure-bf16) and
// `trainyard plan --precision` name, parsed once at the flag. LibTorch-free; the engines map it
// to their own settings (FSDP's MixedPrecision, DDP's autocast).
#pragma once

#include <string_view>

namespace trainyard {

enum class Precision {
  kFp32,       // fp32 parameters, gradients, optimizer state and compute
  kBf16Mixed,  // bf16 compute; fp32 master weights, gradients and Adam state
  // bf16 everywhere: parameters, gradients, reductions and Adam state, no fp32 master copy
  // (llama-recipes' --pure_bf16). Half the model-state memory of bf16-mixed; an update smaller
  // than half a bf16 ulp of its weight (2^-9 relative) is lost.
  kPureBf16,
};

// "fp32", "bf16-mixed" or "pure-bf16"; anything else throws InvalidArgumentError naming `flag`.
Precision parse_precision(std::string_view text, std::string_view flag = "--precision");
std::string_view to_string(Precision precision);

// Whether forward and backward compute in bf16.
inline bool computes_in_bf16(Precision precision) {
  return precision != Precision::kFp32;
}

}  // namespace trainyard
