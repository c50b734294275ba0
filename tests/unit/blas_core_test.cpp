// blas_core: which OpenBLAS kernel sets fit this CPU, and that a user's OPENBLAS_CORETYPE stands.
// That the CLI really re-executes with fitting kernels is checked end to end in recipe_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "trainyard/blas_core.h"

namespace {

TEST(BlasCore, LibTorchRunsOnOpenBlasHere) {
  // scripts/setup.sh installs libopenblas0-pthread; without it LibTorch's BLAS is 40x slower.
  auto a = torch::ones({4, 4});
  EXPECT_EQ(torch::mm(a, a).sum().item<float>(), 64.0f);
  EXPECT_FALSE(trainyard::blas_core_name().empty());
}

TEST(BlasCore, KernelsBelowTheCpuAreReplaced) {
  __builtin_cpu_init();
  EXPECT_FALSE(trainyard::blas_core_for("SkylakeX").has_value()) << "fits any x86-64 CPU here";
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl"))
    GTEST_SKIP() << "this CPU has no AVX-512: the Prescott -> SkylakeX case does not apply";
  EXPECT_EQ(trainyard::blas_core_for("Prescott"), "SkylakeX");
  EXPECT_EQ(trainyard::blas_core_for("Haswell"), "SkylakeX");
  EXPECT_FALSE(trainyard::blas_core_for("Cooperlake").has_value());
}

TEST(BlasCore, ASetCoreTypeIsTheUsersChoice) {
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = before ? before : "";
  ::setenv("OPENBLAS_CORETYPE", "Prescott", 1);
  EXPECT_FALSE(trainyard::blas_core_override().has_value());
  if (before) {
    ::setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  } else {
    ::unsetenv("OPENBLAS_CORETYPE");
  }
}

}  // namespace
