// launch() in the test process with its output captured: the launcher's own stderr (logs and the
// failure summary), the ranks' forwarded output, the result and how long it took.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "trainyard/elastic/launcher.h"

namespace trainyard::elastic {

struct Captured {
  LaunchResult result;
  std::string out;
  std::string err;
  std::chrono::milliseconds elapsed{0};
};

inline Captured launch_captured(const LaunchOptions& options) {
  Captured c;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const auto start = std::chrono::steady_clock::now();
  try {
    c.result = launch(options);
  } catch (...) {
    testing::internal::GetCapturedStdout();
    testing::internal::GetCapturedStderr();
    throw;
  }
  c.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  c.out = testing::internal::GetCapturedStdout();
  c.err = testing::internal::GetCapturedStderr();
  return c;
}

}  // namespace trainyard::elastic
