#include "trainyard/data/instruction_data.h"
#include "trainyard/data/data_file.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "trainyard/error.h"
#include "trainyard/ignore_index.h"

namespace trainyard::data {
namespace {

using Json = nlohmann::json;

constexpr std::pair<std::string_view, DataFormat> kFormatNames[] = {
    {"text", DataFormat::kText},
    {"samsum", DataFormat::kSamsum},
    {"alpaca", DataFormat::kAlpaca},
    {"jsonl", DataFormat::kJsonl},
};

// llama-recipes' samsum prompt and Stanford Alpaca's two (with and without an input).
constexpr std::string_view kSamsumPrompt = "Summarize this dialog:\n{dialogue}\n---\nSummary:\n";
constexpr std::string_view kAlpacaPromptWithInput =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n";
constexpr std::string_view kAlpacaPrompt =
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n";

// The string field `name` of `record`; errors name the record and the field.
std::string field(const Json& record, const std::string& name, const std::string& where) {
  const auto it = record.find(name);
  TY_CHECK(it != record.end(), where, ": the record has no \"", name,
           "\" field. HINT: every record needs it",
           name == "dialogue" || name == "summary" ? " (samsum records hold dialogue and summary)"
           : name == "instruction" || name == "output"
               ? " (alpaca records hold instruction, input and output)"
               : "",
           ".");
  TY_CHECK(it->is_string(), where, ": the field \"", name, "\" must be a string, got ",
           it->type_name(), ".");
  return it->get<std::string>();
}

// `templ` with each {name} replaced by the record's field; "{{" and "}}" are literal braces.
std::string fill_template(std::string_view templ, const Json& record, const std::string& where) {
  std::string out;
  for (std::size_t i = 0; i < templ.size(); ++i) {
    const char ch = templ[i];
    if ((ch == '{' || ch == '}') && i + 1 < templ.size() && templ[i + 1] == ch) {
      out += ch;
      ++i;
      continue;
    }
    if (ch != '{') {
      out += ch;
      continue;
    }
    const auto close = templ.find('}', i);
    TY_CHECK(close != std::string_view::npos,
             "--prompt-template has a '{' without a closing '}' "
             "at character ",
             i, ". HINT: write {{ for a literal brace.");
    out += field(record, std::string(templ.substr(i + 1, close - i - 1)), where);
    i = close;
  }
  return out;
}

PromptResponse to_prompt_response(const Json& record,
                                  const RecordFormat& format,
                                  std::string where) {
  TY_CHECK(record.is_object(), where, ": a record must be a JSON object, got ", record.type_name(),
           ".");
  PromptResponse out{.where = std::move(where)};
  switch (format.format) {
    case DataFormat::kSamsum:
      out.prompt = fill_template(kSamsumPrompt, record, out.where);
      out.response = field(record, "summary", out.where);
      break;
    case DataFormat::kAlpaca: {
      const bool has_input = record.contains("input") && record["input"].is_string() &&
                             !record["input"].get<std::string>().empty();
      out.prompt =
          fill_template(has_input ? kAlpacaPromptWithInput : kAlpacaPrompt, record, out.where);
      out.response = field(record, "output", out.where);
      break;
    }
    case DataFormat::kJsonl:
      out.prompt = fill_template(format.prompt_template, record, out.where);
      out.response = field(record, format.response_field, out.where);
      break;
    case DataFormat::kText:
      throw InvalidArgumentError("The text format has lines, not records.");
  }
  return out;
}

}  // namespace

DataFormat parse_data_format(std::string_view name, std::string_view flag) {
  std::string known;
  for (const auto& [n, f] : kFormatNames) {
    if (n == name) return f;
    known += detail::concat(known.empty() ? "" : ", ", n);
  }
  throw InvalidArgumentError(
      detail::concat(flag, " must be one of ", known, ", got '", name, "'."));
}

std::string_view to_string(DataFormat format) {
  for (const auto& [n, f] : kFormatNames)
    if (f == format) return n;
  return "unknown";
}

std::vector<PromptResponse> read_records(const std::string& path, const RecordFormat& format) {
  TY_CHECK(format.format != DataFormat::kJsonl ||
               (!format.prompt_template.empty() && !format.response_field.empty()),
           "--data-format jsonl needs --prompt-template (e.g. \"Question: {question}\\nAnswer: \") "
           "and --response-field (e.g. answer).");
  const std::string all = read_data_file(path, "give the JSON or JSON-lines file of records.");
  std::vector<PromptResponse> out;
  const auto first = all.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && all[first] == '[') {  // one JSON array
    Json records;
    try {
      records = Json::parse(all);
    } catch (const Json::parse_error& e) {
      throw InvalidArgumentError(detail::concat(path, " is not valid JSON: ", e.what()));
    }
    for (std::size_t i = 0; i < records.size(); ++i)
      out.push_back(to_prompt_response(records[i], format, detail::concat(path, "[", i, "]")));
  } else {  // JSON lines
    std::istringstream lines(all);
    std::string line;
    for (std::int64_t number = 1; std::getline(lines, line); ++number) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const auto where = detail::concat(path, ":", number);
      Json record;
      try {
        record = Json::parse(line);
      } catch (const Json::parse_error& e) {
        throw InvalidArgumentError(detail::concat(where, " is not valid JSON: ", e.what(),
                                                  " HINT: a JSON-lines file holds one object "
                                                  "per line."));
      }
      out.push_back(to_prompt_response(record, format, where));
    }
  }
  TY_CHECK(!out.empty(), "--data ", path, " holds no record.");
  return out;
}

Examples tokenize_examples(const std::vector<PromptResponse>& records,
                           const ExampleTokens& tokens,
                           std::int64_t seq_len,
                           bool truncate) {
  Examples out;
  // See Note [Prompts longer than seq_len].
  const std::size_t surely_too_long =
      tokens.longest_token_bytes == 0
          ? SIZE_MAX
          : kPromptBytesPerToken * tokens.longest_token_bytes * static_cast<std::size_t>(seq_len);
  for (const auto& r : records) {
    if (r.prompt.size() > surely_too_long) {
      if (out.dropped++ == 0) out.first_dropped = r.where;
      continue;
    }
    std::vector<std::int32_t> ids;
    if (tokens.bos) ids.push_back(*tokens.bos);
    const auto prompt = tokens.encode(r.prompt);
    ids.insert(ids.end(), prompt.begin(), prompt.end());
    const auto masked = static_cast<std::int64_t>(ids.size());
    // See Note [Prompts longer than seq_len].
    if (masked >= seq_len) {
      if (out.dropped++ == 0) out.first_dropped = r.where;
      continue;
    }
    const auto response = tokens.encode(r.response);
    ids.insert(ids.end(), response.begin(), response.end());
    if (tokens.eos) ids.push_back(*tokens.eos);
    if (truncate && static_cast<std::int64_t>(ids.size()) > seq_len) {
      ids.resize(static_cast<std::size_t>(seq_len));
      ++out.truncated;
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      out.ids.push_back(ids[i]);
      out.labels.push_back(
          static_cast<std::int64_t>(i) < masked ? static_cast<std::int32_t>(kIgnoreIndex) : ids[i]);
    }
    out.offsets.push_back(static_cast<std::int64_t>(out.ids.size()));
  }
  return out;
}

Examples pack(const Examples& examples, std::int64_t seq_len) {
  Examples out{.truncated = examples.truncated,
               .dropped = examples.dropped,
               .first_dropped = examples.first_dropped};
  const std::int64_t rows = examples.tokens() / seq_len;
  out.ids.assign(examples.ids.begin(), examples.ids.begin() + rows * seq_len);
  out.labels.assign(examples.labels.begin(), examples.labels.begin() + rows * seq_len);
  for (std::int64_t r = 1; r <= rows; ++r) out.offsets.push_back(r * seq_len);
  return out;
}

LmBatch example_batch(const Examples& examples,
                      const std::vector<std::int64_t>& indices,
                      std::int32_t pad_id) {
  std::int64_t longest = 0;
  for (const auto e : indices) {
    TY_CHECK(e >= 0 && e < examples.size(), "Example ", e, " is outside the ", examples.size(),
             " prepared examples.");
    longest = std::max(longest, examples.length(e));
  }
  const auto batch = static_cast<std::int64_t>(indices.size());
  auto inputs = torch::full({batch, longest}, pad_id, torch::kInt64);
  auto labels = torch::full({batch, longest}, kIgnoreIndex, torch::kInt64);
  auto* in = inputs.data_ptr<std::int64_t>();
  auto* lab = labels.data_ptr<std::int64_t>();
  LmBatch out;
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto e = indices[static_cast<std::size_t>(b)];
    const auto begin = examples.offsets[e], n = examples.length(e);
    for (std::int64_t t = 0; t < n; ++t) {
      in[b * longest + t] = examples.ids[begin + t];
      lab[b * longest + t] = examples.labels[begin + t];
    }
    out.tokens += n;
  }
  out.input_ids = inputs;
  out.labels = labels;
  return out;
}

std::vector<std::vector<std::int64_t>> length_grouped_batches(const Examples& examples,
                                                              std::int64_t batch_size,
                                                              int world_size,
                                                              int rank,
                                                              std::uint64_t seed,
                                                              std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(examples.size()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return examples.length(a) > examples.length(b);
  });
  std::vector<std::vector<std::int64_t>> all;
  for (std::size_t i = 0; i + static_cast<std::size_t>(batch_size) <= order.size();
       i += static_cast<std::size_t>(batch_size))
    all.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(i),
                     order.begin() + static_cast<std::ptrdiff_t>(i) + batch_size);
  std::mt19937_64 gen(seed + static_cast<std::uint64_t>(epoch));
  std::shuffle(all.begin(), all.end(), gen);
  all.resize(all.size() / static_cast<std::size_t>(world_size) *
             static_cast<std::size_t>(world_size));
  std::vector<std::vector<std::int64_t>> mine;
  for (std::size_t i = static_cast<std::size_t>(rank); i < all.size();
       i += static_cast<std::size_t>(world_size))
    mine.push_back(std::move(all[i]));
  return mine;
}

std::pair<std::vector<PromptResponse>, std::vector<PromptResponse>> split_records(
    std::vector<PromptResponse> records, double fraction, std::uint64_t seed) {
  TY_CHECK(fraction > 0 && fraction < 1, "--val-fraction must be in (0, 1), got ", fraction, ".");
  std::mt19937_64 gen(seed);
  std::shuffle(records.begin(), records.end(), gen);
  const auto val = static_cast<std::size_t>(static_cast<double>(records.size()) * fraction);
  TY_CHECK(val >= 1 && val < records.size(), "--val-fraction ", fraction, " of ", records.size(),
           " records leaves ", val == 0 ? "no record to validate on" : "no record to train on",
           ". HINT: give more records, or --val-data FILE.");
  std::vector<PromptResponse> validation(records.end() - static_cast<std::ptrdiff_t>(val),
                                         records.end());
  records.resize(records.size() - val);
  return {std::move(records), std::move(validation)};
}

}  // namespace trainyard::data
