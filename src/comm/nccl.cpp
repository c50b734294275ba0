// The CUDA build's side of torch_compat.h: LibTorch's NCCL process group (the CPU build compiles
// no_nccl.cpp instead; CMakeLists.txt chooses).
#include "torch_compat.h"

#include <cuda.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "trainyard/error.h"

namespace trainyard::comm::compat {

std::string accelerator_description() {
  return detail::concat("CUDA ", CUDA_VERSION / 1000, ".", CUDA_VERSION % 1000 / 10, ", NCCL ",
                        NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH);
}

bool nccl_available() {
  return true;
}

c10::intrusive_ptr<c10d::ProcessGroup> nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank,
                                                  int world_size,
                                                  int device_index,
                                                  std::chrono::milliseconds timeout,
                                                  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  // See Note [Binding NCCL to the rank's GPU]. setBackend() passes the group's device on.
  const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_index));
  group->setBoundDeviceId(device);
  c10::intrusive_ptr<c10d::Backend> cpu = gloo;
  c10::intrusive_ptr<c10d::Backend> cuda = nccl;
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, cpu);
  group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, cuda);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  nccl->eagerConnectSingleDevice(device);
  return group;
}

// Note [Binding NCCL to the rank's GPU]
// A ProcessGroupNCCL creates its communicator lazily, on the first collective, for the device of
// that collective's tensors, and a barrier() before any collective has no tensor: it guesses the
// device from the rank (rank % GPUs), which is wrong when ranks of several nodes count GPUs
// differently or CUDA_VISIBLE_DEVICES reorders them, and NCCL then hangs or fails in an
// unrelated place. The group is bound to the rank's device (what Python's
// init_process_group(device_id=...) does): barriers use it, and the communicator is made now
// (eagerConnectSingleDevice), so a rank that cannot reach its peers over NCCL fails here, at
// init, within the store's timeout, rather than in the first step.

// Note [Waiting on NCCL work]
// NCCL work completes on a CUDA stream. Its wait() makes the caller's current stream wait for it
// and returns: the host need not block, and reading a result on the host synchronises anyway. Its
// wait(timeout), by contrast, blocks the host until the work is done, and when the timeout passes
// (counted from the work's start, not from the call) it marks the work failed and aborts the
// communicator: polling it in slices, as wait_work does for Gloo to keep the rank's heartbeat
// going, would kill any collective longer than one slice. So NCCL work gets one plain wait();
// a dead peer is caught by NCCL's watchdog, which fails the rank after the group's timeout.
bool completes_on_device(const c10::intrusive_ptr<c10d::Work>& work) {
  return dynamic_cast<c10d::ProcessGroupNCCL::WorkNCCL*>(work.get()) != nullptr;
}

}  // namespace trainyard::comm::compat
