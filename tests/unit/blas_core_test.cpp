// blas_core: which OpenBLAS kernel sets fit which CPU (every branch, on any host), and that a
// user's OPENBLAS_CORETYPE stands. That the CLI really re-executes with fitting kernels is checked
// end to end in recipe_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "trainyard/blas_core.h"

namespace {

using trainyard::blas_core_for;
using trainyard::CpuVectorUnits;

constexpr CpuVectorUnits kAvx512{.avx512 = true, .avx2 = true};
constexpr CpuVectorUnits kAvx2{.avx512 = false, .avx2 = true};
constexpr CpuVectorUnits kSse{.avx512 = false, .avx2 = false};

TEST(BlasCore, LibTorchRunsOnOpenBlasHere) {
  // scripts/setup.sh installs libopenblas0-pthread; without it LibTorch's BLAS is 40x slower.
  auto a = torch::ones({4, 4});
  EXPECT_EQ(torch::mm(a, a).sum().item<float>(), 64.0f);
  EXPECT_FALSE(trainyard::blas_core_name().empty());
}

TEST(BlasCore, KernelsBelowTheCpuAreReplaced) {
  EXPECT_EQ(blas_core_for("Prescott", kAvx512), "SkylakeX");
  EXPECT_EQ(blas_core_for("Haswell", kAvx512), "SkylakeX");
  EXPECT_EQ(blas_core_for("Prescott", kAvx2), "Haswell");
  EXPECT_EQ(blas_core_for("Sandybridge", kAvx2), "Haswell");
}

TEST(BlasCore, KernelsThatFitAreKept) {
  for (const char* core : {"SkylakeX", "Cooperlake", "SapphireRapids", "SKYLAKEX"})
    EXPECT_EQ(blas_core_for(core, kAvx512), std::nullopt) << core;
  for (const char* core : {"Haswell", "Zen", "HASWELL"})
    EXPECT_EQ(blas_core_for(core, kAvx2), std::nullopt) << core;
  EXPECT_EQ(blas_core_for("Prescott", kSse), std::nullopt) << "nothing better to choose";
}

// Sets (or with nullptr unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(BlasCore, ASetCoreTypeIsTheUsersChoiceAndAnEmptyOneIsNot) {
  std::optional<std::string> detected;
  {
    ScopedEnv unset("OPENBLAS_CORETYPE", nullptr);
    detected = trainyard::blas_core_override();
  }
  if (!detected) GTEST_SKIP() << "OpenBLAS chose fitting kernels here: nothing to override";
  {
    ScopedEnv users("OPENBLAS_CORETYPE", "Prescott");
    EXPECT_EQ(trainyard::blas_core_override(), std::nullopt);
  }
  ScopedEnv empty("OPENBLAS_CORETYPE", "");
  EXPECT_EQ(trainyard::blas_core_override(), detected);
}

}  // namespace
