// String checks shared by the tests.
#pragma once

#include <cstddef>
#include <string_view>

namespace trainyard::test {

// Whether `part` occurs in `text`.
inline bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// How many times `part` occurs in `text`, overlapping occurrences included.
inline std::size_t count_of(std::string_view text, std::string_view part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string_view::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace trainyard::test
