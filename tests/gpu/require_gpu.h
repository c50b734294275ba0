// The GPU tests' skip: where the build's LibTorch has no CUDA or no GPU is visible (CI), a test
// skips saying why.
#pragma once

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>

namespace trainyard::testing {

inline bool have_gpu(std::string* why) {
  if (!torch::cuda::is_available()) {
    *why = "no CUDA: this build's LibTorch has none or no GPU is visible";
    return false;
  }
  return true;
}

}  // namespace trainyard::testing

#define REQUIRE_GPU()                                               \
  do {                                                              \
    std::string why;                                                \
    if (!::trainyard::testing::have_gpu(&why)) GTEST_SKIP() << why; \
  } while (0)
