// Text for causal language modelling, prepared as the seed's fine-tuning job prepares
// tiny_shakespeare: the corpus split on newlines, empty lines and speaker lines (ending in ':')
// dropped, each line tokenised and truncated or padded to seq_len tokens; labels are the inputs
// with the padding masked out of the loss (kIgnoreIndex, trainyard/ignore_index.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace trainyard::data {

// The corpus's training lines, in order: split on '\n' (a trailing '\r' is removed), without
// empty lines and lines whose last character is ':'.
std::vector<std::string_view> training_lines(std::string_view corpus);

// Every kept line as seq_len token ids: the first seq_len of its tokens, then pad_id.
struct TokenizedLines {
  std::int64_t seq_len = 0;
  std::int32_t pad_id = 0;
  std::vector<std::int32_t> ids;      // size() * seq_len
  std::vector<std::int32_t> lengths;  // real (unpadded, truncated) tokens of each line
  // Lines left out because they encode to fewer than 2 tokens: after the shift such a line has no
  // target token, and a batch of them gives a loss of NaN.
  std::int64_t skipped = 0;

  std::int64_t size() const { return static_cast<std::int64_t>(lengths.size()); }
  std::int64_t tokens() const;  // real tokens in all lines
};

using Encoder = std::function<std::vector<std::int32_t>(std::string_view)>;

// Tokenises `lines` with `encode`. Lines that encode to fewer than 2 tokens are left out and
// counted (TokenizedLines::skipped).
TokenizedLines tokenize_lines(const std::vector<std::string_view>& lines,
                              const Encoder& encode,
                              std::int64_t seq_len,
                              std::int32_t pad_id);

struct PreparedText {
  TokenizedLines lines;
  std::string cache_path;   // where the prepared tokens are (or could not be) kept
  bool from_cache = false;  // read from cache_path instead of tokenised now
};

// The prepared lines of the corpus at `path`, from the token cache next to it when one matches
// (the corpus's SHA-256, `tokenizer_id`, seq_len and pad_id are recorded in it), else prepared
// now and cached: <path>.<hash>.tokens, or under $XDG_CACHE_HOME (~/.cache)/trainyard when the
// corpus's folder is not writable. Lines of fewer than 2 tokens are skipped with a warning saying
// how many. Throws InvalidArgumentError when the file cannot be read or holds no training line,
// and when every training line was skipped (naming the file and why); a damaged cache is
// prepared again, with a warning.
PreparedText prepare_text(const std::string& path,
                          const std::string& tokenizer_id,
                          const Encoder& encode,
                          std::int64_t seq_len,
                          std::int32_t pad_id);

// Rows `indices` of `lines`: inputs (B, seq_len) int64 and labels (B, seq_len) int64 with the
// padding set to kIgnoreIndex (-100).
struct LmBatch {
  torch::Tensor input_ids;
  torch::Tensor labels;
  std::int64_t tokens = 0;  // real tokens in the batch
};
LmBatch causal_lm_batch(const TokenizedLines& lines, const std::vector<std::int64_t>& indices);

}  // namespace trainyard::data
