#include "trainyard/blas_core.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "trainyard/log.h"

namespace trainyard {
namespace {

bool one_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

}  // namespace

std::string blas_core_name() {
  // Looked up at run time: LibTorch links OpenBLAS through libblas.so.3, which may be another BLAS.
  using CoreName = char* (*)();
  auto* fn = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = fn != nullptr ? fn() : nullptr;
  return name != nullptr ? std::string(name) : std::string();
}

std::optional<std::string> blas_core_for(const std::string& core) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx512 && !one_of(core, {"SkylakeX", "Cooperlake", "SapphireRapids"})) return "SkylakeX";
  if (!avx512 && avx2 && !one_of(core, {"Haswell", "Zen", "SkylakeX", "Cooperlake"}))
    return "Haswell";
  return std::nullopt;
}

std::optional<std::string> blas_core_override() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return std::nullopt;
  const std::string core = blas_core_name();
  if (core.empty()) return std::nullopt;
  return blas_core_for(core);
}

void reexec_if_blas_core_misdetected(char** argv) {
  if (const char* fix = std::getenv("TRAINYARD_BLAS_CORE_FIX"); fix && std::strcmp(fix, "0") == 0)
    return;
  const auto core = blas_core_override();
  if (!core) return;
  auto log = logger("blas");
  log->debug(
      "OpenBLAS chose its {} kernels on a CPU with {}; restarting with OPENBLAS_CORETYPE={} (set "
      "OPENBLAS_CORETYPE to choose, or TRAINYARD_BLAS_CORE_FIX=0 to keep the detected kernels)",
      blas_core_name(), *core == "SkylakeX" ? "AVX-512" : "AVX2", *core);
  ::setenv("OPENBLAS_CORETYPE", core->c_str(), 1);
  ::execv("/proc/self/exe", argv);
  log->warn(
      "re-executing with OPENBLAS_CORETYPE={} failed ({}); going on with OpenBLAS's {} kernels",
      *core, std::strerror(errno), blas_core_name());
}

}  // namespace trainyard
