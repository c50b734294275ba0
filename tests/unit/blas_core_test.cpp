// blas_core: which OpenBLAS kernel sets fit which CPU (every branch, on any host), and that a
// user's OPENBLAS_CORETYPE stands. That the CLI really re-executes with fitting kernels is checked
// end to end in recipe_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "trainyard/blas_core.h"

namespace {

using trainyard::blas_core_for;
using trainyard::CpuVectorUnits;

using Vendor = CpuVectorUnits::Vendor;
constexpr CpuVectorUnits kIntelAvx512{.avx512 = true, .avx2 = true, .vendor = Vendor::kIntel};
constexpr CpuVectorUnits kIntelAvx2{.avx512 = false, .avx2 = true, .vendor = Vendor::kIntel};
constexpr CpuVectorUnits kAmdAvx512{.avx512 = true, .avx2 = true, .vendor = Vendor::kAmd};
constexpr CpuVectorUnits kAmdAvx2{.avx512 = false, .avx2 = true, .vendor = Vendor::kAmd};
constexpr CpuVectorUnits kOtherAvx512{.avx512 = true, .avx2 = true, .vendor = Vendor::kOther};
constexpr CpuVectorUnits kSse{.avx512 = false, .avx2 = false, .vendor = Vendor::kIntel};

// LibTorch's sgemm through whatever BLAS it runs here (MKL in PyTorch's wheel, OpenBLAS in some
// distributions' builds, with the machine's kernel choice or a preset OPENBLAS_CORETYPE) against
// a double-precision triple loop. Odd sizes reach the kernels' edge paths; wrong kernels for a CPU
// give errors of order 1, not 1e-5.
TEST(BlasCore, LibTorchMatmulOnThisMachinesKernelsIsCorrect) {
  torch::manual_seed(7);
  for (auto [m, k, n] : {std::array<int64_t, 3>{1, 1, 1},
                         {17, 33, 65},
                         {96, 257, 31},
                         {128, 128, 128},
                         {301, 77, 190}}) {
    auto a = torch::randn({m, k});
    auto b = torch::randn({k, n});
    auto got = torch::mm(a, b);  // (m, n) float through OpenBLAS
    auto ad = a.to(torch::kDouble), bd = b.to(torch::kDouble);
    auto want = torch::zeros({m, n}, torch::kDouble);
    auto A = ad.accessor<double, 2>(), B = bd.accessor<double, 2>();
    auto W = want.accessor<double, 2>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p)
        for (int64_t j = 0; j < n; ++j) W[i][j] += A[i][p] * B[p][j];
    // fp32 accumulation over k terms of unit variance: error ~ 1e-7 * sqrt(k) * |sum|.
    const double err = (got.to(torch::kDouble) - want).abs().max().item<double>();
    EXPECT_LT(err, 1e-4 * std::sqrt(static_cast<double>(k)) + 1e-5)
        << m << "x" << k << " @ " << k << "x" << n << " (OpenBLAS kernels: '"
        << trainyard::blas_core_name() << "', empty where LibTorch runs another BLAS)";
  }
}

TEST(BlasCore, KernelsBelowTheCpuAreReplacedByOnesKnownCorrectForTheVendor) {
  EXPECT_EQ(blas_core_for("Prescott", kIntelAvx512), "SkylakeX");
  EXPECT_EQ(blas_core_for("Haswell", kIntelAvx512), "SkylakeX");
  EXPECT_EQ(blas_core_for("Prescott", kIntelAvx2), "Haswell");
  EXPECT_EQ(blas_core_for("Sandybridge", kIntelAvx2), "Haswell");
  // AMD: AVX2 kernels even where the CPU has AVX-512 (Note [Kernels known to be correct]).
  EXPECT_EQ(blas_core_for("Prescott", kAmdAvx512), "Haswell");
  EXPECT_EQ(blas_core_for("Prescott", kAmdAvx2), "Haswell");
  EXPECT_EQ(blas_core_for("Barcelona", kAmdAvx2), "Haswell");
}

TEST(BlasCore, KernelsThatFitAreKept) {
  for (const char* core : {"SkylakeX", "Cooperlake", "SapphireRapids", "SKYLAKEX"})
    EXPECT_EQ(blas_core_for(core, kIntelAvx512), std::nullopt) << core;
  for (const char* core : {"Haswell", "Zen", "HASWELL"}) {
    EXPECT_EQ(blas_core_for(core, kIntelAvx2), std::nullopt) << core;
    EXPECT_EQ(blas_core_for(core, kAmdAvx512), std::nullopt) << "AVX2 is what AMD gets: " << core;
  }
  for (const char* core : {"SkylakeX", "Cooperlake"})
    EXPECT_EQ(blas_core_for(core, kAmdAvx512), "Haswell") << "AVX-512 kernels on AMD: " << core;
  EXPECT_EQ(blas_core_for("Prescott", kSse), std::nullopt) << "nothing better to choose";
  EXPECT_EQ(blas_core_for("Prescott", kOtherAvx512), std::nullopt)
      << "an unknown vendor gets no kernels that are not known to be correct on it";
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
  {
    ScopedEnv users("OPENBLAS_CORETYPE", "Prescott");
    EXPECT_EQ(trainyard::blas_core_override(), std::nullopt) << "a user's choice stands";
  }
  std::optional<std::string> detected;
  {
    ScopedEnv unset("OPENBLAS_CORETYPE", nullptr);
    detected = trainyard::blas_core_override();
  }
  ScopedEnv empty("OPENBLAS_CORETYPE", "");
  EXPECT_EQ(trainyard::blas_core_override(), detected) << "an empty value is no choice";
}

}  // namespace
