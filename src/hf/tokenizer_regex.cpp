#include "hf/tokenizer_regex.h"

#include <unicode/regex.h>
#include <unicode/utext.h>

#include <array>
#include <atomic>

#include "trainyard/error.h"

// Note [Split patterns under ICU]
// HF compiles a tokenizer.json's patterns with Oniguruma; trainyard runs them with ICU's regex
// engine, which reads the same syntax for everything these files use: alternation tried in
// order, \p{L} / \p{N} (general categories), \s (U+0009..U+000D, U+0085 and Z*: the White_Space
// property in both), (?i:...) with Unicode simple case folding ("'ſ" matches "'s"), bounded
// repeats and the (?!\S) look-ahead. Both know Unicode through their own tables (ICU 72: Unicode
// 15; see Note [Unicode versions] in unicode_text.cpp). The tests compare the ids with HF's on
// Llama 3's and Qwen2's patterns. ICU reads the UTF-8 text in place (a UText), so match offsets
// are byte offsets; a byte that starts no well-formed sequence reads as U+FFFD, a symbol, which
// is what Note [Invalid UTF-8] makes of it.

namespace trainyard::hf::internal {
namespace {

std::atomic<std::uint64_t> next_regex_serial{1};

// The matchers a thread keeps, one per pattern it used last (a tokenizer has one or two).
struct ThreadMatchers {
  static constexpr std::size_t kSlots = 4;
  struct Slot {
    std::uint64_t serial = 0;
    std::unique_ptr<icu::RegexMatcher> matcher;
  };
  std::array<Slot, kSlots> slots;
  std::size_t next_victim = 0;
  UText text = UTEXT_INITIALIZER;
  ~ThreadMatchers() { utext_close(&text); }
};

}  // namespace

Regex::Regex(std::string_view pattern, bool literal, const std::string& what)
    : source_(pattern), serial_(next_regex_serial++) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError where{};
  const icu::UnicodeString text = icu::UnicodeString::fromUTF8(
      icu::StringPiece(pattern.data(), static_cast<std::int32_t>(pattern.size())));
  compiled_.reset(icu::RegexPattern::compile(text, literal ? UREGEX_LITERAL : 0, where, status));
  TY_CHECK(U_SUCCESS(status), what, ": the pattern ", source_, " does not compile (",
           u_errorName(status), " at character ", where.offset,
           "). HINT: trainyard runs tokenizer.json patterns with ICU's regex engine, which reads "
           "the Oniguruma syntax Hugging Face's files use; a pattern that needs another feature "
           "cannot be used.");
}

Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

void Regex::find_all(std::string_view s, std::vector<Match>& out) const {
  out.clear();
  if (s.empty()) return;
  thread_local ThreadMatchers matchers;
  UErrorCode status = U_ZERO_ERROR;
  ThreadMatchers::Slot* slot = nullptr;
  for (auto& candidate : matchers.slots)
    if (candidate.serial == serial_) slot = &candidate;
  if (slot == nullptr) {
    slot = &matchers.slots[matchers.next_victim];
    matchers.next_victim = (matchers.next_victim + 1) % ThreadMatchers::kSlots;
    slot->matcher.reset(compiled_->matcher(status));
    TY_CHECK(U_SUCCESS(status), "ICU could not make a matcher for the pattern ", source_, ": ",
             u_errorName(status));
    slot->serial = serial_;
  }
  utext_openUTF8(&matchers.text, s.data(), static_cast<std::int64_t>(s.size()), &status);
  icu::RegexMatcher& matcher = *slot->matcher;
  matcher.reset(&matchers.text);
  while (matcher.find(status) && U_SUCCESS(status)) {
    const auto begin = static_cast<std::size_t>(matcher.start64(status));
    const auto end = static_cast<std::size_t>(matcher.end64(status));
    out.push_back({begin, end});
  }
  TY_CHECK(U_SUCCESS(status), "ICU failed matching the pattern ", source_, ": ",
           u_errorName(status));
}

bool replace_all(std::string_view s,
                 std::string_view literal,
                 const Regex* regex,
                 std::string_view content,
                 std::string& out) {
  thread_local std::vector<Match> matches;
  matches.clear();
  if (regex != nullptr) {
    regex->find_all(s, matches);
  } else if (!literal.empty()) {
    for (std::size_t at = s.find(literal); at != std::string_view::npos;
         at = s.find(literal, at + literal.size()))
      matches.push_back({at, at + literal.size()});
  }
  if (matches.empty()) return false;
  std::size_t done = 0;
  for (const Match& m : matches) {
    out.append(s.substr(done, m.begin - done));
    out.append(content);
    done = m.end;
  }
  out.append(s.substr(done));
  return true;
}

}  // namespace trainyard::hf::internal
