#include "trainyard/blas_core.h"
#include "trainyard/env.h"

#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "trainyard/log.h"

namespace trainyard {
namespace {

bool one_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (::strcasecmp(name.c_str(), n) == 0) return true;
  return false;
}

// OpenBLAS's build configuration, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Prescott
// MAX_THREADS=64".
std::string blas_config() {
  using Config = char* (*)();
  auto* fn = reinterpret_cast<Config>(::dlsym(RTLD_DEFAULT, "openblas_get_config"));
  const char* config = fn != nullptr ? fn() : nullptr;
  return config != nullptr ? std::string(config) : std::string();
}

// True when /proc/self/exe is this program, not a dynamic loader that was asked to run it
// (`ld-linux-x86-64.so.2 ./trainyard ...`), which execv would start without the program.
bool self_exe_is_this_program() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return false;
  path[n] = '\0';
  const char* base = std::strrchr(path, '/');
  return std::strncmp(base != nullptr ? base + 1 : path, "ld-", 3) != 0;
}

}  // namespace

std::string blas_core_name() {
  // Looked up at run time: LibTorch links OpenBLAS through libblas.so.3, which may be another BLAS.
  using CoreName = char* (*)();
  auto* fn = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = fn != nullptr ? fn() : nullptr;
  return name != nullptr ? std::string(name) : std::string();
}

CpuVectorUnits CpuVectorUnits::of_this_cpu() {
  __builtin_cpu_init();
  return {.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl"),
          .avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
          .vendor = __builtin_cpu_is("intel") ? Vendor::kIntel
                    : __builtin_cpu_is("amd") ? Vendor::kAmd
                                              : Vendor::kOther};
}

std::optional<std::string> blas_core_for(const std::string& core, CpuVectorUnits cpu) {
  // See Note [Kernels known to be correct].
  using Vendor = CpuVectorUnits::Vendor;
  if (cpu.vendor == Vendor::kIntel && cpu.avx512 &&
      !one_of(core, {"SkylakeX", "Cooperlake", "SapphireRapids"}))
    return "SkylakeX";
  // On AMD also in place of OpenBLAS's own AVX-512 choice (it picks Cooperlake on Zen 4/5).
  if (cpu.vendor == Vendor::kAmd && cpu.avx2 && !one_of(core, {"Haswell", "Zen"})) return "Haswell";
  if (cpu.vendor == Vendor::kIntel && !cpu.avx512 && cpu.avx2 &&
      !one_of(core, {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"}))
    return "Haswell";
  return std::nullopt;
}

std::optional<std::string> blas_core_override() {
  // OpenBLAS reads an empty OPENBLAS_CORETYPE as "no such core" and falls back to its detection.
  if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set != nullptr && *set != '\0')
    return std::nullopt;
  const std::string core = blas_core_name();
  if (core.empty() || blas_config().find("DYNAMIC_ARCH") == std::string::npos) return std::nullopt;
  return blas_core_for(core);
}

namespace {

bool fix_disabled() {
  const char* fix = std::getenv(kBlasCoreFixEnv);
  return fix != nullptr && std::strcmp(fix, "0") == 0;
}

// The kernels to export, or nullopt; in a process started with them, checks they were taken.
std::optional<std::string> core_to_export() {
  if (fix_disabled()) return std::nullopt;
  if (const char* asked = std::getenv(kBlasCoreSetEnv); asked != nullptr) {
    // Started with the variables a trainyard parent (or the re-exec) set: never export again.
    const char* set = std::getenv("OPENBLAS_CORETYPE");
    if (set != nullptr && std::strcmp(set, asked) == 0 && !one_of(blas_core_name(), {asked}))
      logger("blas")->warn("OpenBLAS runs its {} kernels although OPENBLAS_CORETYPE={} was set",
                           blas_core_name(), asked);
    return std::nullopt;
  }
  return blas_core_override();
}

void export_core(const std::string& core) {
  logger("blas")->debug(
      "OpenBLAS chose its {} kernels on a CPU with {}; OPENBLAS_CORETYPE={} from here on (set "
      "OPENBLAS_CORETYPE to choose, or TRAINYARD_BLAS_CORE_FIX=0 to keep the detected kernels)",
      blas_core_name(), core == "SkylakeX" ? "AVX-512" : "AVX2", core);
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  ::setenv(kBlasCoreSetEnv, core.c_str(), 1);
}

}  // namespace

void set_blas_core_for_children() {
  if (const auto core = core_to_export()) export_core(*core);
}

void reexec_if_blas_core_misdetected(char** argv) {
  const auto core = core_to_export();
  if (!core || !self_exe_is_this_program()) return;
  export_core(*core);
  logger("blas")->debug("restarting with OPENBLAS_CORETYPE={}", *core);
  ::execv("/proc/self/exe", argv);
  const int error = errno;
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv(kBlasCoreSetEnv);
  logger("blas")->warn(
      "re-executing with OPENBLAS_CORETYPE={} failed ({}); going on with OpenBLAS's {} kernels",
      *core, std::strerror(error), blas_core_name());
}

}  // namespace trainyard
