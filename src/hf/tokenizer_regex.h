// Private to src/hf: the regular expressions of a tokenizer.json (the Split pre-tokeniser's and
// the Replace normaliser's and decoder's patterns), which HF compiles with Oniguruma, run with
// ICU's regex engine on UTF-8 text. See Note [Split patterns under ICU] in tokenizer_regex.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <unicode/uversion.h>

U_NAMESPACE_BEGIN
class RegexPattern;
U_NAMESPACE_END

namespace trainyard::hf::internal {

// Byte offsets of one match: [begin, end).
struct Match {
  std::size_t begin;
  std::size_t end;
};

class Regex {
 public:
  // A pattern as tokenizer.json writes it: {"Regex": pattern} (literal false) or {"String": text}
  // (literal true: the text itself). Throws InvalidArgumentError naming `what` (the file and
  // field) when ICU cannot compile it.
  Regex(std::string_view pattern, bool literal, const std::string& what);
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Replaces `out` with the leftmost non-overlapping matches in `text`, in order. Thread-safe:
  // each thread matches with a matcher of its own.
  void find_all(std::string_view text, std::vector<Match>& out) const;

  const std::string& pattern() const { return source_; }

 private:
  std::string source_;
  std::unique_ptr<icu::RegexPattern> compiled_;
  std::uint64_t serial_;  // unique in the process: names this pattern's per-thread matchers
};

// Appends s to `out` with every match of `regex`, or of `literal` when regex is null, replaced by
// `content`, as HF's Replace normaliser and decoder do. Returns false (appending nothing) when
// nothing matches.
bool replace_all(std::string_view s,
                 std::string_view literal,
                 const Regex* regex,
                 std::string_view content,
                 std::string& out);

}  // namespace trainyard::hf::internal
