// Logging: levels, a component tag and the rank in every line, e.g.
//   [I 12:00:01.123 rank 1/2 ddp] built 3 buckets
// TRAINYARD_LOG_LEVEL (trace, debug, info, warn, error) is the one switch for the level.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace trainyard {

// The logger for one component ("ddp", "launcher", ...). Thread-safe; loggers are cached.
std::shared_ptr<spdlog::logger> logger(const std::string& component);

// Sets the "rank R/W" part of every line; before it is called lines say "rank -".
void set_log_rank(int rank, int world_size);

}  // namespace trainyard
