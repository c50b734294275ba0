// Prerequisites a test needs from the machine (etcd, the venv's moto, prometheus, chromium, network
// namespaces): skipped on a developer's machine that lacks one, a failure under CI.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace trainyard::test {

// True under CI (CI=true or CI=1), where scripts/setup.sh has installed every prerequisite.
inline bool running_under_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && (std::string(ci) == "true" || std::string(ci) == "1");
}

}  // namespace trainyard::test

// For a test whose prerequisite (etcd, moto's S3 server, the venv's torch, network namespaces) is
// missing: skipped with the reason on a developer's machine; failed under CI, where the setup
// script installs it, so that a green suite never means "tested nothing". Returns from the test (or
// SetUp, which then skips the body).
#define TY_MISSING_PREREQUISITE(reason)                                                            \
  do {                                                                                             \
    if (::trainyard::test::running_under_ci()) {                                                   \
      GTEST_FAIL() << reason                                                                       \
                   << " (CI is set: scripts/setup.sh installs this, so its absence is a failure)"; \
    } else {                                                                                       \
      GTEST_SKIP() << reason;                                                                      \
    }                                                                                              \
  } while (0)
