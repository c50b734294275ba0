// The line format of `trainyard tokenize`: each line of text becomes a line of token ids
// separated by single spaces (an empty line stays empty), and --decode reads such lines back,
// with spaces, commas or tabs between the ids. Streams of any length, in chunks.
#pragma once

#include <cstddef>
#include <istream>
#include <ostream>

#include "trainyard/hf/tokenizer.h"

namespace trainyard::hf {

struct EncodeLinesOptions {
  bool add_special_tokens = true;  // the post-processor's template (Tokenizer::encode)
  int threads = 0;                 // encoding threads; 0: every usable CPU
  std::size_t chunk_bytes = std::size_t{32} << 20;  // text read and encoded at a time
};

// Encodes each line of `in` (its bytes without the '\n'; a '\r' stays part of it) and writes its
// ids to `out`. Returns the number of lines. Blocks until `in` ends.
std::size_t encode_lines(const Tokenizer& tok,
                         std::istream& in,
                         std::ostream& out,
                         const EncodeLinesOptions& options = {});

// Reads lines of ids and writes each line's text (Tokenizer::decode) and a '\n'. Throws
// InvalidArgumentError naming the line for anything but integer ids. Returns the number of lines.
std::size_t decode_lines(const Tokenizer& tok,
                         std::istream& in,
                         std::ostream& out,
                         bool skip_special_tokens = false);

}  // namespace trainyard::hf
