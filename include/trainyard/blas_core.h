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

// The OPENBLAS_CORETYPE to use instead of OpenBLAS's kernel set `core` on this CPU when `core`
// uses fewer vector units than it has (SkylakeX for AVX-512, Haswell for AVX2); nullopt when
// `core` fits.
std::optional<std::string> blas_core_for(const std::string& core);

// blas_core_for(blas_core_name()), or nullopt when no OpenBLAS is loaded or OPENBLAS_CORETYPE is
// already set (the user's choice stands).
std::optional<std::string> blas_core_override();

// For main(), first thing: when blas_core_override() has a value, sets OPENBLAS_CORETYPE and
// re-executes this program with the same arguments (so it and every process it starts, ranks and
// Python peers alike, get the right kernels; a debug log line says so); does not return then.
// Returns when there is nothing to fix, when TRAINYARD_BLAS_CORE_FIX=0, or when the re-exec
// fails (with a warning).
void reexec_if_blas_core_misdetected(char** argv);

}  // namespace trainyard
