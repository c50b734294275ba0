// What this build of trainyard runs with: the LibTorch it was compiled against and the one it
// loaded, CPU or CUDA (with NCCL), and the process-group backends it can make. `trainyard
// --version` prints it.
#pragma once

#include <string>
#include <vector>

namespace trainyard::comm {

struct BuildInfo {
  std::string built_torch;            // the headers' TORCH_VERSION, "2.15.0"
  std::string loaded_torch;           // beside the loaded libtorch_cpu.so, "2.15.0+cu132"
  std::string accelerator;            // "CPU", or "CUDA 13.0, NCCL 2.30.7"
  std::vector<std::string> backends;  // "gloo", "shm", and "nccl" in the CUDA build
};

// Reads the loaded library's folder; cheap, no process group is made.
BuildInfo build_info();

// Two lines: "LibTorch 2.15.0+cu132 (CPU), built against 2.15.0" and
// "process-group backends: gloo, shm".
std::string describe(const BuildInfo& info);

}  // namespace trainyard::comm
