// OpenBLAS picks its kernels for the CPU it detects as it loads, before main(). On some virtual
// machines it detects an SSE3-only "Prescott" on a CPU with AVX-512, and LibTorch's sgemm runs
// about 5x slower (docs/BENCHMARKS.md). OPENBLAS_CORETYPE overrides the choice, but only in a new
// process: hence a re-exec from main().
#pragma once

#include <optional>
#include <string>

namespace trainyard {

// The kernel set OpenBLAS chose in this process, e.g. "SkylakeX"; "" when no OpenBLAS is loaded.
std::string blas_core_name();

// What decides which OpenBLAS kernel sets a CPU runs correctly and fast.
struct CpuVectorUnits {
  enum class Vendor { kOther, kIntel, kAmd };
  bool avx512 = false;  // AVX-512 F, CD, DQ, BW and VL (OpenBLAS's SkylakeX kernels)
  bool avx2 = false;    // AVX2 and FMA (its Haswell kernels)
  Vendor vendor = Vendor::kOther;
  static CpuVectorUnits of_this_cpu();
};

// Note [Kernels known to be correct]
// The OPENBLAS_CORETYPE to use instead of OpenBLAS's kernel set `core` (compared without case),
// choosing only kernels known to compute correctly on that vendor: on Intel, SkylakeX for AVX-512
// and Haswell for AVX2 where `core` uses fewer vector units than the CPU has; on AMD, Haswell
// (AVX2) in place of anything else, OpenBLAS's own AVX-512 choice (Cooperlake on Zen 4/5)
// included: some OpenBLAS builds compute wrong results with their AVX-512 kernels there, which is
// why some environments preset OPENBLAS_CORETYPE=Haswell. On any other vendor nothing is chosen.
// nullopt when `core` is already right.
std::optional<std::string> blas_core_for(const std::string& core,
                                         CpuVectorUnits cpu = CpuVectorUnits::of_this_cpu());

// blas_core_for(blas_core_name()) for an OpenBLAS that can switch kernels at run time
// (DYNAMIC_ARCH); nullopt when none is loaded, when it cannot switch, or when OPENBLAS_CORETYPE is
// set to anything non-empty (the user's choice stands).
std::optional<std::string> blas_core_override();

// For a process that only launches others (`trainyard run`, a bare `trainyard train`): when
// blas_core_override() has a value, sets OPENBLAS_CORETYPE (and TRAINYARD_BLAS_CORE_SET, so that
// the children can tell it did not come from the user) for every process started from now on:
// ranks and Python peers alike get the right kernels. This process keeps OpenBLAS's choice.
void set_blas_core_for_children();

// For a process that computes, before it starts threads or children: when blas_core_override()
// has a value, sets the variables as above and re-executes this program with `argv`; does not
// return then. Programs started some other way (test binaries, examples started by hand) keep
// OpenBLAS's choice. In a process whose parent set the variables, warns if OpenBLAS did not take
// the kernels it was told to. Returns when there is nothing to fix, when TRAINYARD_BLAS_CORE_FIX=0,
// or when the re-exec fails (with a warning; the variables are unset again).
void reexec_if_blas_core_misdetected(char** argv);

}  // namespace trainyard
