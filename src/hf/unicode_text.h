// The Unicode pieces the tokenizer needs, on UTF-8 text: well-formedness, Rust's lossy
// conversion, ICU's normalisation forms, and the character classes of GPT-2's split pattern
// (Oniguruma's \p{L}, \p{N}, \s) and of the added-token rules (Rust regex's \w, \s).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace trainyard::hf::text {

// The length of the well-formed UTF-8 sequence at s[i] (1 to 4), or 0 when there is none.
int sequence_length(std::string_view s, std::size_t i);

// Appends `bytes` with every ill-formed part replaced by U+FFFD, one per maximal subpart, as
// Rust's String::from_utf8_lossy does.
void append_lossy(std::string& out, std::string_view bytes);

// One class per character for GPT-2's pattern; they partition the characters.
enum class CharClass : std::uint8_t { kLetter, kNumber, kSpace, kOther };

struct Char {
  CharClass cls;
  std::uint8_t length;  // bytes
};

// The character at s[i] (i < s.size()); a byte that starts no well-formed sequence is a
// one-byte kOther character (Note [Invalid UTF-8]).
Char char_at(std::string_view s, std::size_t i);

enum class NormalForm : std::uint8_t { kNfc, kNfd, kNfkc, kNfkd };

// Appends `s` in the given form; ill-formed bytes pass through untouched and split the text into
// runs normalised separately. Returns false (appending nothing) when `s` is already in the form.
bool normalize(NormalForm form, std::string_view s, std::string& out);

// Whether the first / last character of s is a word character (Rust regex's Unicode \w), as
// added tokens with single_word: true ask.
bool starts_with_word(std::string_view s);
bool ends_with_word(std::string_view s);
// The bytes of white space (Unicode White_Space) that s begins / ends with.
std::size_t leading_space_length(std::string_view s);
std::size_t trailing_space_length(std::string_view s);

}  // namespace trainyard::hf::text
