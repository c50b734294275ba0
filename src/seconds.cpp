#include "trainyard/seconds.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace trainyard {

std::optional<std::chrono::milliseconds> parse_seconds(std::string_view text,
                                                       double min,
                                                       double max) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return std::nullopt;
  const std::string copy(text);  // strtod needs a terminated string
  char* end = nullptr;
  const double seconds = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(seconds) || seconds < min ||
      seconds > max)
    return std::nullopt;
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

}  // namespace trainyard
