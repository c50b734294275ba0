// The CPU build's side of torch_compat.h: no CUDA libraries linked, so no NCCL (the CUDA build
// compiles nccl.cpp instead; CMakeLists.txt chooses).
#include "torch_compat.h"

#include "trainyard/error.h"

namespace trainyard::comm::compat {

std::string accelerator_description() {
  return "CPU";
}

bool nccl_available() {
  return false;
}

c10::intrusive_ptr<c10d::ProcessGroup> nccl_group(const c10::intrusive_ptr<c10d::Store>&,
                                                  int,
                                                  int,
                                                  int,
                                                  std::chrono::milliseconds,
                                                  c10::intrusive_ptr<c10d::ProcessGroupGloo>) {
  throw Error(
      "NCCL was asked for, but this build of trainyard has no NCCL: it is the CPU build, linked "
      "without LibTorch's CUDA libraries. HINT: build with CUDA (scripts/build.sh --cuda, README "
      "\"GPUs\"), or use the Gloo backend (TRAINYARD_BACKEND=gloo).");
}

bool completes_on_device(const c10::intrusive_ptr<c10d::Work>&) {
  return false;
}

}  // namespace trainyard::comm::compat
