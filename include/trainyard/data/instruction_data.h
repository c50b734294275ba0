// Instruction data for causal-LM fine-tuning as Meta's llama-recipes prepares it (seed 002):
// records of a prompt and a response (samsum dialogues, alpaca instructions, or any JSON lines
// with a prompt template), tokenised as BOS + prompt + response + EOS with BOS and the prompt
// masked out of the loss, then packed into seq_len rows (every position a real token) or grouped
// by length into padded batches.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/data/text_lines.h"

namespace trainyard::data {

enum class DataFormat {
  kText,    // one training line per line (text_lines.h); not records
  kSamsum,  // {"dialogue", "summary"}: "Summarize this dialog:\n{dialogue}\n---\nSummary:\n"
  kAlpaca,  // {"instruction", "input", "output"} with Stanford Alpaca's two prompts
  kJsonl,   // any object: RecordFormat::prompt_template and response_field
};
// "text", "samsum", "alpaca", "jsonl"; anything else throws InvalidArgumentError naming `flag`.
DataFormat parse_data_format(std::string_view name, std::string_view flag = "--data-format");
std::string_view to_string(DataFormat format);

struct RecordFormat {
  DataFormat format = DataFormat::kSamsum;
  std::string prompt_template;  // kJsonl: text with {field} placeholders, "{{" and "}}" literal
  std::string response_field;   // kJsonl: the field holding the response
};

struct PromptResponse {
  std::string prompt, response;
  std::string where;  // "file:line" (JSON lines) or "file[index]" (a JSON array), for messages
};

// The records of `path`: a JSON array of objects, or one object per line (JSON lines; blank lines
// skipped). Throws InvalidArgumentError naming the file and line (or index) of invalid JSON, a
// record missing a field or holding a non-string one, a template naming a field a record lacks,
// and a file without records.
std::vector<PromptResponse> read_records(const std::string& path, const RecordFormat& format);

// Tokenised examples, concatenated: example e is positions [offsets[e], offsets[e + 1]).
struct Examples {
  std::vector<std::int32_t> ids;
  std::vector<std::int32_t> labels;      // the ids, kIgnoreIndex over BOS and the prompt
  std::vector<std::int64_t> offsets{0};  // size() + 1 entries
  std::int64_t truncated = 0;  // examples whose response was cut at seq_len (padding only)
  std::int64_t dropped = 0;    // examples whose BOS + prompt alone filled seq_len
  std::string first_dropped;   // where the first dropped one is

  std::int64_t size() const { return static_cast<std::int64_t>(offsets.size()) - 1; }
  std::int64_t length(std::int64_t e) const { return offsets[e + 1] - offsets[e]; }
  std::int64_t tokens() const { return static_cast<std::int64_t>(ids.size()); }
};

struct ExampleTokens {
  Encoder encode;  // text to ids without special tokens
  std::optional<std::int32_t> bos, eos;
  std::size_t longest_token_bytes = 0;  // the most bytes one token stands for; 0: unknown
};

// Note [Prompts longer than seq_len]
// An example whose BOS + prompt alone has seq_len tokens or more leaves no response token to learn
// within a row: it is dropped and counted, both when packing and when padding. A prompt of more
// than kPromptBytesPerToken x longest_token_bytes x seq_len bytes is dropped without encoding it:
// no token stands for more than longest_token_bytes bytes of the normalised text, and normalising
// (NFC, Llama 2's "▁") shrinks a text by less than kPromptBytesPerToken, so it has seq_len tokens
// or more. Encoding one such record whole (a 50 MB field) once took 2.4 GB to learn that. When
// padding, an example longer than seq_len otherwise keeps its first seq_len tokens (the response
// cut short): truncated and counted. Packing cuts nothing: examples flow across rows.
inline constexpr std::size_t kPromptBytesPerToken = 4;
Examples tokenize_examples(const std::vector<PromptResponse>& records,
                           const ExampleTokens& tokens,
                           std::int64_t seq_len,
                           bool truncate);

// llama-recipes' ConcatDataset: every example's ids and labels end to end, cut into rows of
// exactly seq_len (the tail shorter than a row is left out); each row is one example.
Examples pack(const Examples& examples, std::int64_t seq_len);

// Examples `indices` as a batch padded to the longest of them: inputs (B, T) with pad_id after
// each example, labels kIgnoreIndex there; tokens counts the real positions.
LmBatch example_batch(const Examples& examples,
                      const std::vector<std::int64_t>& indices,
                      std::int32_t pad_id);

// llama-recipes' DistributedLengthBasedBatchSampler: the examples sorted by length (longest
// first), cut into batches of batch_size (the last, smaller one dropped), the batches shuffled by
// seed + epoch, trimmed to a multiple of world_size, and rank r taking batches r, r + world_size,
// ... Every rank gets as many batches and every batch's examples have similar lengths, so padding
// costs little.
std::vector<std::vector<std::int64_t>> length_grouped_batches(const Examples& examples,
                                                              std::int64_t batch_size,
                                                              int world_size,
                                                              int rank,
                                                              std::uint64_t seed,
                                                              std::int64_t epoch);

// The last `fraction` of `records` (after a shuffle seeded by `seed`) for validation, the rest
// for training. fraction in (0, 1); both parts non-empty or InvalidArgumentError.
std::pair<std::vector<PromptResponse>, std::vector<PromptResponse>> split_records(
    std::vector<PromptResponse> records, double fraction, std::uint64_t seed);

}  // namespace trainyard::data
