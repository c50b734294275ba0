// How comm/ makes LibTorch's process groups, and what differs between the CPU build and the CUDA
// build (NCCL), behind functions the rest of comm/ calls: see Note [LibTorch's process groups] in
// torch_compat.cpp. Private to comm/.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <optional>
#include <string>

namespace trainyard::comm::compat {

// The LibTorch version this build was compiled against (its headers' TORCH_VERSION, "2.15.0").
const char* built_torch_version();

// The version of the LibTorch this process runs with, read beside the loaded libtorch_cpu.so
// ("2.15.0+cu132"), or "unknown".
std::string loaded_torch_version();

// "CPU", or for the CUDA build the CUDA and NCCL versions it was compiled with ("CUDA 13.0, NCCL
// 2.30.7"). Defined in no_nccl.cpp or nccl.cpp.
std::string accelerator_description();

// A process group whose collectives run on `gloo` (for CPU tensors, and CUDA tensors, which Gloo
// stages through the host itself).
c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank,
                                                  int world_size,
                                                  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo);

// The timeout of `group`'s Gloo (its own, or on 2.x its CPU backend's), or nullopt when it has
// none (the shared-memory group, a group of another kind).
std::optional<std::chrono::milliseconds> gloo_timeout(c10d::ProcessGroup& group);

// Whether this build has LibTorch's NCCL process group (the CUDA build).
bool nccl_available();

// A process group whose collectives on CUDA tensors run on NCCL (one GPU per rank: `device_index`)
// and on CPU tensors on `gloo`, so that the small CPU tensors the library exchanges (counts,
// flags, metrics) need no copies to the GPU. Every collective, and NCCL's watchdog, time out
// after `timeout`: a dead peer ends the rank with an error instead of a hang. Throws Error when
// nccl_available() is false.
c10::intrusive_ptr<c10d::ProcessGroup> nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank,
                                                  int world_size,
                                                  int device_index,
                                                  std::chrono::milliseconds timeout,
                                                  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo);

// True for work that completes on a GPU stream (NCCL): waiting for it is queueing the wait on the
// current stream, not blocking the host (Note [Waiting on NCCL work]).
bool completes_on_device(const c10::intrusive_ptr<c10d::Work>& work);

// CUDA devices this process sees (0 without CUDA).
int cuda_device_count();

// Makes `index` the calling thread's current CUDA device (through c10's device guard, so no CUDA
// headers are needed). Call only when cuda_device_count() > 0.
void set_cuda_device(int index);

}  // namespace trainyard::comm::compat
