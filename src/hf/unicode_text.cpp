#include "hf/unicode_text.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/uniset.h>
#include <unicode/utf8.h>

#include <array>
#include <memory>

#include "trainyard/error.h"

namespace trainyard::hf::text {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The range the second byte of a sequence led by b0 must fall in (Unicode 15, table 3-7), and how
// many continuation bytes follow the lead; 0 for a byte that leads nothing.
struct Lead {
  int continuations;
  unsigned char second_min;
  unsigned char second_max;
};

Lead lead_of(unsigned char b0) {
  if (b0 >= 0xC2 && b0 <= 0xDF) return {1, 0x80, 0xBF};
  if (b0 == 0xE0) return {2, 0xA0, 0xBF};
  if (b0 == 0xED) return {2, 0x80, 0x9F};
  if (b0 >= 0xE1 && b0 <= 0xEF) return {2, 0x80, 0xBF};
  if (b0 == 0xF0) return {3, 0x90, 0xBF};
  if (b0 >= 0xF1 && b0 <= 0xF3) return {3, 0x80, 0xBF};
  if (b0 == 0xF4) return {3, 0x80, 0x8F};
  return {0, 0, 0};
}

bool is_continuation(unsigned char b) {
  return b >= 0x80 && b <= 0xBF;
}

// The bytes of the ill-formed part at s[i]: the longest prefix of a well-formed sequence, at
// least one byte ("maximal subpart"; Rust's Utf8Error::error_len).
std::size_t maximal_subpart(std::string_view s, std::size_t i) {
  const Lead lead = lead_of(static_cast<unsigned char>(s[i]));
  std::size_t k = 1;
  if (lead.continuations == 0 || i + 1 >= s.size()) return 1;
  const auto b1 = static_cast<unsigned char>(s[i + 1]);
  if (b1 < lead.second_min || b1 > lead.second_max) return 1;
  ++k;
  while (k <= static_cast<std::size_t>(lead.continuations) && i + k < s.size() &&
         is_continuation(static_cast<unsigned char>(s[i + k])))
    ++k;
  return k;
}

constexpr std::array<CharClass, 128> ascii_classes() {
  std::array<CharClass, 128> classes{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      classes[c] = CharClass::kLetter;
    else if (c >= '0' && c <= '9')
      classes[c] = CharClass::kNumber;
    else if ((c >= '\t' && c <= '\r') || c == ' ')
      classes[c] = CharClass::kSpace;
    else
      classes[c] = CharClass::kOther;
  }
  return classes;
}
constexpr std::array<CharClass, 128> kAsciiClasses = ascii_classes();

// Oniguruma's Unicode classes, which HF's pattern is compiled with: \p{L} is general category L,
// \p{N} is N, and \s is U+0009..U+000D, U+0085 and the categories Zs, Zl, Zp.
CharClass classify(UChar32 c) {
  if (c < 128) return kAsciiClasses[c];
  if (c == 0x85) return CharClass::kSpace;
  switch (u_charType(c)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::kNumber;
    case U_SPACE_SEPARATOR:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
      return CharClass::kSpace;
    default:
      return CharClass::kOther;
  }
}

// The code point of the well-formed sequence at s[i].
UChar32 decode_at(std::string_view s, std::size_t i) {
  UChar32 c = 0;
  std::size_t offset = i;
  U8_NEXT_UNSAFE(reinterpret_cast<const uint8_t*>(s.data()), offset, c);
  return c;
}

const icu::Normalizer2& unfiltered(NormalForm form);

// Note [Unicode versions]
// HF's normalisers come from the Rust crate unicode-normalization-alignments, whose tables are
// Unicode 9.0's: a combining mark added later (U+0C3C TELUGU SIGN NUKTA, Unicode 14) has class 0
// there and is never reordered or composed. ICU 72 knows Unicode 15.0, so the normaliser is
// ICU's filtered to the characters Unicode 9.0 had; every other one passes through as a
// boundary, which is what the old tables do. Checked on every code point against tokenizers
// 0.23.2: the same NFC for each alone, after "a", and after "a" + U+0301 or U+0316.
// The split pattern's classes (Oniguruma's \p{L}, \p{N}) are Unicode 16.0's in tokenizers 0.23;
// ICU 72 agrees on every character Unicode 15.0 assigns and calls the 5,004 that Unicode 16.0
// added (Egyptian hieroglyphs, Kirat Rai, ...) unassigned, so HF reads them as letters and
// numbers where trainyard reads them as "other". No tables are written here to paper over that.
constexpr const char* kHfNormalizationAge = "[:age=9.0:]";  // assigned in Unicode 9.0 or before

const icu::Normalizer2& normalizer_for(NormalForm form) {
  static const std::array<std::unique_ptr<icu::FilteredNormalizer2>, 4> filtered = [] {
    UErrorCode status = U_ZERO_ERROR;
    static icu::UnicodeSet age(icu::UnicodeString(kHfNormalizationAge), status);
    TY_CHECK_T(Error, U_SUCCESS(status), "ICU could not build the set ", kHfNormalizationAge, ": ",
               u_errorName(status));
    age.freeze();
    std::array<std::unique_ptr<icu::FilteredNormalizer2>, 4> all;
    for (NormalForm f : {NormalForm::kNfc, NormalForm::kNfd, NormalForm::kNfkc, NormalForm::kNfkd})
      all[static_cast<int>(f)] = std::make_unique<icu::FilteredNormalizer2>(unfiltered(f), age);
    return all;
  }();
  return *filtered[static_cast<int>(form)];
}

const icu::Normalizer2& unfiltered(NormalForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::kNfc:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::kNfd:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::kNfkc:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::kNfkd:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  TY_CHECK_T(Error, U_SUCCESS(status) && n != nullptr, "ICU has no normalisation data (",
             u_errorName(status), "). HINT: install libicu72 (scripts/setup.sh).");
  return *n;
}

// Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(UChar32 c) {
  if (c < 128)
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  const int8_t type = u_charType(c);
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || type == U_NON_SPACING_MARK ||
         type == U_ENCLOSING_MARK || type == U_COMBINING_SPACING_MARK ||
         type == U_DECIMAL_DIGIT_NUMBER || type == U_CONNECTOR_PUNCTUATION ||
         u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}

bool is_white_space(UChar32 c) {
  return u_hasBinaryProperty(c, UCHAR_WHITE_SPACE);
}

}  // namespace

int sequence_length(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  const Lead lead = lead_of(b0);
  if (lead.continuations == 0 || i + lead.continuations >= s.size()) return 0;
  const auto b1 = static_cast<unsigned char>(s[i + 1]);
  if (b1 < lead.second_min || b1 > lead.second_max) return 0;
  for (int k = 2; k <= lead.continuations; ++k)
    if (!is_continuation(static_cast<unsigned char>(s[i + k]))) return 0;
  return lead.continuations + 1;
}

void append_lossy(std::string& out, std::string_view bytes) {
  std::size_t i = 0;
  std::size_t valid_from = 0;
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const int length = sequence_length(bytes, i);
    if (length > 0) {
      i += length;
      continue;
    }
    out.append(bytes.substr(valid_from, i - valid_from));
    out.append(kReplacement);
    i += maximal_subpart(bytes, i);
    valid_from = i;
  }
  out.append(bytes.substr(valid_from));
}

Char char_at(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {kAsciiClasses[b0], 1};
  const int length = sequence_length(s, i);
  if (length == 0) return {CharClass::kOther, 1};
  return {classify(decode_at(s, i)), static_cast<std::uint8_t>(length)};
}

bool normalize(NormalForm form, std::string_view s, std::string& out) {
  // ASCII is in every form; most text is, and skips ICU.
  std::size_t first_non_ascii = 0;
  while (first_non_ascii < s.size() && static_cast<unsigned char>(s[first_non_ascii]) < 0x80)
    ++first_non_ascii;
  if (first_non_ascii == s.size()) return false;

  const icu::Normalizer2& normalizer = normalizer_for(form);
  // The well-formed runs between ill-formed bytes: Note [Invalid UTF-8].
  auto for_each_run = [&](auto&& on_run, auto&& on_bad_bytes) {
    std::size_t run_start = 0;
    std::size_t i = 0;
    while (i < s.size()) {
      const int length = sequence_length(s, i);
      if (length > 0) {
        i += length;
        continue;
      }
      if (i > run_start) on_run(s.substr(run_start, i - run_start));
      on_bad_bytes(s.substr(i, 1));
      run_start = ++i;
    }
    if (i > run_start) on_run(s.substr(run_start, i - run_start));
  };

  bool normalized = true;
  UErrorCode status = U_ZERO_ERROR;
  for_each_run(
      [&](std::string_view run) {
        if (normalized &&
            !normalizer.isNormalizedUTF8(icu::StringPiece(run.data(), run.size()), status))
          normalized = false;
      },
      [](std::string_view) {});
  TY_CHECK_T(Error, U_SUCCESS(status), "ICU could not check a normal form: ", u_errorName(status));
  if (normalized) return false;

  icu::StringByteSink<std::string> sink(&out);
  for_each_run(
      [&](std::string_view run) {
        normalizer.normalizeUTF8(0, icu::StringPiece(run.data(), run.size()), sink, nullptr,
                                 status);
      },
      [&](std::string_view bad) { out.append(bad); });
  TY_CHECK_T(Error, U_SUCCESS(status), "ICU could not normalise text: ", u_errorName(status));
  return true;
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  const int length = sequence_length(s, 0);
  return length > 0 && is_word_char(decode_at(s, 0));
}

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  std::size_t i = s.size() - 1;
  while (i > 0 && is_continuation(static_cast<unsigned char>(s[i])) && s.size() - i < 4) --i;
  const int length = sequence_length(s, i);
  return length > 0 && i + length == s.size() && is_word_char(decode_at(s, i));
}

std::size_t leading_space_length(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const int length = sequence_length(s, i);
    if (length == 0 || !is_white_space(decode_at(s, i))) break;
    i += length;
  }
  return i;
}

std::size_t trailing_space_length(std::string_view s) {
  std::size_t end = s.size();
  while (end > 0) {
    std::size_t i = end - 1;
    while (i > 0 && is_continuation(static_cast<unsigned char>(s[i])) && end - i < 4) --i;
    const int length = sequence_length(s, i);
    if (length == 0 || i + length != end || !is_white_space(decode_at(s, i))) break;
    end = i;
  }
  return s.size() - end;
}

}  // namespace trainyard::hf::text
