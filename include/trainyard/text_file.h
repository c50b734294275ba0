// Small text files read whole (/proc, /sys and cgroup files, a few KiB at most), and the trimming
// their values need. LibTorch-free.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace trainyard {

// The whole content of the file at `path`, or nullopt when it cannot be opened or read.
std::optional<std::string> read_text_file(const std::string& path);

// `text` without leading and trailing spaces, tabs, carriage returns and newlines.
std::string trim_whitespace(std::string_view text);

}  // namespace trainyard
