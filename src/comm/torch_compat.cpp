#include "torch_compat.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <c10/core/impl/VirtualGuardImpl.h>

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "trainyard/error.h"

// Note [Two LibTorch lines]
// trainyard builds against Debian's LibTorch 1.13 (CPU; the line CI builds and tests) and against
// LibTorch 2.x (what most users download, and what a pip PyTorch ships, with CUDA and NCCL).
// Between them c10d changed shape: in 1.13 ProcessGroupGloo *is* a c10d::ProcessGroup; in 2.x it
// is a c10d::Backend, and a c10d::ProcessGroup holds one backend per device type and dispatches
// each collective to the backend of its tensors' device. Everything above this file sees only
// c10d::ProcessGroup, whose collective methods (allreduce, broadcast, _allgather_base, ...) are
// the same virtual functions in both lines, so the difference stays here: how a group is made
// from a backend, and how one kind of work is waited for. NCCL exists only in the 2.x line (the
// Debian build has no CUDA).

namespace trainyard::comm::compat {

const char* torch_line() {
  return TORCH_VERSION_MAJOR >= 2 ? "2.x" : "1.13";
}

c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank,
                                                  int world_size,
                                                  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo) {
#if TORCH_VERSION_MAJOR >= 2
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  c10::intrusive_ptr<c10d::Backend> backend = gloo;
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  if (torch::cuda::is_available())
    group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
#else
  (void)store;
  (void)rank;
  (void)world_size;
  return gloo;
#endif
}

std::optional<std::chrono::milliseconds> gloo_timeout(c10d::ProcessGroup& group) {
  c10d::ProcessGroupGloo* gloo = nullptr;
#if TORCH_VERSION_MAJOR >= 2
  try {
    gloo = dynamic_cast<c10d::ProcessGroupGloo*>(group.getBackend(c10::DeviceType::CPU).get());
  } catch (const std::exception&) {
    return std::nullopt;  // no CPU backend (the shared-memory group registers none)
  }
#else
  gloo = dynamic_cast<c10d::ProcessGroupGloo*>(&group);
#endif
  if (gloo == nullptr) return std::nullopt;
  return gloo->getOptions()->timeout;
}

bool nccl_available() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank,
                                                  int world_size,
                                                  int device_index,
                                                  std::chrono::milliseconds timeout,
                                                  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo) {
#ifdef USE_C10D_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  // See Note [Binding NCCL to the rank's GPU]. setBackend() passes the group's device on.
  const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_index));
  group->setBoundDeviceId(device);
#else
  (void)device_index;
#endif
  c10::intrusive_ptr<c10d::Backend> cpu = gloo;
  c10::intrusive_ptr<c10d::Backend> cuda = nccl;
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, cpu);
  group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, cuda);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  nccl->eagerConnectSingleDevice(device);
#endif
  return group;
#else
  (void)store;
  (void)rank;
  (void)world_size;
  (void)device_index;
  (void)timeout;
  (void)gloo;
  throw Error(detail::concat(
      "NCCL was asked for, but this build of trainyard has no NCCL: it was built against LibTorch ",
      torch_line(),
      " without CUDA. HINT: build against a CUDA LibTorch 2.x (see README, \"GPUs\"), or use the "
      "Gloo backend (TRAINYARD_BACKEND=gloo)."));
#endif
}

// Note [Binding NCCL to the rank's GPU]
// A ProcessGroupNCCL creates its communicator lazily, on the first collective, for the device of
// that collective's tensors, and a barrier() before any collective has no tensor: it guesses the
// device from the rank (rank % GPUs), which is wrong when ranks of several nodes count GPUs
// differently or CUDA_VISIBLE_DEVICES reorders them, and NCCL then hangs or fails in an
// unrelated place. From LibTorch 2.3 on the group is bound to the rank's device (what Python's
// init_process_group(device_id=...) does): barriers use it, and the communicator is made now
// (eagerConnectSingleDevice), so a rank that cannot reach its peers over NCCL fails here, at
// init, within the store's timeout, rather than in the first step. Older 2.x lines keep the lazy
// connect (make_nccl_group has already made the device current, which their barrier uses).

// Note [Waiting on NCCL work]
// NCCL work completes on a CUDA stream. Its wait() makes the caller's current stream wait for it
// and returns: the host need not block, and reading a result on the host synchronises anyway. Its
// wait(timeout), by contrast, blocks the host until the work is done, and when the timeout passes
// (counted from the work's start, not from the call) it marks the work failed and aborts the
// communicator: polling it in slices, as wait_work does for Gloo to keep the rank's heartbeat
// going, would kill any collective longer than one slice. So NCCL work gets one plain wait();
// a dead peer is caught by NCCL's watchdog, which fails the rank after the group's timeout.
bool completes_on_device(const c10::intrusive_ptr<c10d::Work>& work) {
#ifdef USE_C10D_NCCL
  return dynamic_cast<c10d::ProcessGroupNCCL::WorkNCCL*>(work.get()) != nullptr;
#else
  (void)work;
  return false;
#endif
}

int cuda_device_count() {
  return static_cast<int>(torch::cuda::device_count());
}

void set_cuda_device(int index) {
  c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA)
      .setDevice(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)));
}

}  // namespace trainyard::comm::compat
