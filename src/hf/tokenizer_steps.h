// Private to src/hf: the steps of a tokenizer.json pipeline that hf::Tokenizer implements, as
// the file names them: normalisers, pre-tokenisers and decoders, each a variant of its kinds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "hf/tokenizer_regex.h"
#include "hf/unicode_text.h"

namespace trainyard::hf::internal {

// Normalisers. Prepend: the prefix before every non-empty piece. Replace: every match of the
// pattern (a literal when `regex` is empty) becomes `content`.
struct PrependNormalizer {
  std::string prefix;
};
struct ReplaceNormalizer {
  std::string literal;
  std::optional<Regex> regex;
  std::string content;
};
using NormalizerStep = std::variant<text::NormalForm, PrependNormalizer, ReplaceNormalizer>;

// Pre-tokenisers: see Note [Pre-tokeniser steps] in src/hf/pre_tokenizer.cpp.
enum class SplitBehavior : std::uint8_t {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous
};
struct SplitPreTokenizer {
  Regex pattern;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};
struct ByteLevelPreTokenizer {
  bool add_prefix_space = true;  // HF's defaults
  bool use_regex = true;         // GPT-2's split pattern
};
enum class PrependScheme : std::uint8_t { kFirst, kAlways, kNever };
struct MetaspacePreTokenizer {
  std::string replacement = "\u2581";  // "▁"
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;
};
using PreTokenizerStep =
    std::variant<SplitPreTokenizer, ByteLevelPreTokenizer, MetaspacePreTokenizer>;

// Decoders: see Note [Decoder chain] in src/hf/decoder.cpp.
struct ByteLevelDecoder {};
struct ReplaceDecoder {
  std::string literal;
  std::optional<Regex> regex;
  std::string content;
};
struct ByteFallbackDecoder {};
struct FuseDecoder {};
struct StripDecoder {
  std::string content;  // one character
  std::size_t start = 0;
  std::size_t stop = 0;
};
struct MetaspaceDecoder {
  std::string replacement = "\u2581";
  bool drop_first_token_replacements = true;  // prepend_scheme is not "never"
};
using DecoderStep = std::variant<ByteLevelDecoder,
                                 ReplaceDecoder,
                                 ByteFallbackDecoder,
                                 FuseDecoder,
                                 StripDecoder,
                                 MetaspaceDecoder>;

// The token a byte becomes under byte_fallback: "<0x0A>" for 10.
std::string byte_fallback_token(unsigned char byte);

}  // namespace trainyard::hf::internal
