// Durations as users write them: a decimal number of seconds ("30", "0.5"), the unit of every
// time flag, environment variable and --rdzv-conf value. Parsing is strict (the whole text, a
// finite number); each caller states its own range and its own message.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

namespace trainyard {

// The number of seconds `text` spells, when the whole of it is a finite decimal number within
// [min, max]; nullopt otherwise (empty, trailing characters, out of range, NaN).
std::optional<std::chrono::milliseconds> parse_seconds(std::string_view text,
                                                       double min,
                                                       double max);

}  // namespace trainyard
