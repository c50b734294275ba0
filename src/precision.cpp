#include "trainyard/precision.h"

#include "trainyard/error.h"

namespace trainyard {

Precision parse_precision(std::string_view text, std::string_view flag) {
  for (auto p : {Precision::kFp32, Precision::kBf16Mixed, Precision::kPureBf16})
    if (text == to_string(p)) return p;
  throw InvalidArgumentError(detail::concat(
      flag, " is '", text,
      "'; expected fp32, bf16-mixed (bf16 compute with fp32 master weights and Adam state) or "
      "pure-bf16 (bf16 weights, gradients and Adam state)."));
}

std::string_view to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16Mixed:
      return "bf16-mixed";
    case Precision::kPureBf16:
      return "pure-bf16";
  }
  return "?";
}

}  // namespace trainyard
