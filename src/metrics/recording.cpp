#include "trainyard/metrics/recording.h"

#include <cstdlib>
#include <cstring>

#include "trainyard/env.h"

namespace trainyard::metrics {
namespace {

thread_local double t_blocked_seconds = 0;

}  // namespace

bool recording_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv(kMetricsEnv);
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

double thread_blocked_seconds() noexcept {
  return t_blocked_seconds;
}

void add_thread_blocked_seconds(double seconds) noexcept {
  t_blocked_seconds += seconds;
}

}  // namespace trainyard::metrics
