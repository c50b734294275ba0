#include "trainyard/hf/tokenize_lines.h"

#include <charconv>
#include <string>
#include <vector>

#include "trainyard/error.h"

namespace trainyard::hf {
namespace {

bool is_separator(char c) {
  return c == ' ' || c == ',' || c == '\t' || c == '\r';
}

void append_ids(const std::vector<std::int32_t>& ids, std::string& out) {
  char digits[16];
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out.push_back(' ');
    out.append(digits, std::to_chars(digits, digits + sizeof(digits), ids[i]).ptr);
  }
  out.push_back('\n');
}

}  // namespace

std::size_t encode_lines(const Tokenizer& tok,
                         std::istream& in,
                         std::ostream& out,
                         const EncodeLinesOptions& options) {
  std::vector<std::string> lines;
  std::size_t bytes = 0;
  std::size_t count = 0;
  std::string text;
  auto flush = [&] {
    text.clear();
    for (const auto& ids : tok.encode_batch(lines, options.add_special_tokens, options.threads))
      append_ids(ids, text);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    count += lines.size();
    lines.clear();
    bytes = 0;
  };
  for (std::string line; std::getline(in, line);) {
    bytes += line.size() + 1;
    lines.push_back(std::move(line));
    if (bytes >= options.chunk_bytes) flush();
  }
  if (!lines.empty()) flush();
  out.flush();
  return count;
}

std::size_t decode_lines(const Tokenizer& tok,
                         std::istream& in,
                         std::ostream& out,
                         bool skip_special_tokens) {
  std::vector<std::int32_t> ids;
  std::size_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    ids.clear();
    const char* p = line.data();
    const char* const end = p + line.size();
    while (p < end) {
      if (is_separator(*p)) {
        ++p;
        continue;
      }
      std::int32_t id = 0;
      const auto [next, error] = std::from_chars(p, end, id);
      TY_CHECK(error == std::errc() && (next == end || is_separator(*next)), "line ", line_number,
               " of the input: \"", line.substr(p - line.data(), 20),
               "\" is not a token id. HINT: decoding reads lines of integer ids separated by "
               "spaces or commas, as `trainyard tokenize` writes them.");
      ids.push_back(id);
      p = next;
    }
    const std::string text = tok.decode(ids, skip_special_tokens);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.put('\n');
  }
  out.flush();
  return line_number;
}

}  // namespace trainyard::hf
