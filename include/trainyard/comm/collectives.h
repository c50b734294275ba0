// Every collective trainyard issues, recorded as metrics (collective_metrics.h), and the flat ones
// FSDP needs: all_gather into one flat buffer and reduce_scatter, each in place through shared
// memory when every rank
// is on this host (ShmProcessGroup) and as a ring of send/recv otherwise; low-precision inputs
// are added in fp32. CUDA tensors go to the group natively where it takes them (NCCL) and are
// staged through CPU memory otherwise. Also the one capability query callers ask instead of
// casting. Notes [Flat collectives in shared memory] (shm_process_group.cpp), [Ring collectives]
// and [Flat collectives on devices] (collectives.cpp) describe the paths.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <vector>

namespace trainyard::comm {

// What a process group can do beyond c10d's base API. Ask this instead of dynamic_cast.
struct GroupCapabilities {
  // Buffers from allocate_collective_buffer live in memory every rank maps, and collectives on
  // them read the peers' copies in place (ShmProcessGroup).
  bool shared_memory = false;
  // allreduce accepts ReduceOp::AVG on float tensors (Gloo's does not); with device_tensors, on
  // CUDA tensors.
  bool average_in_collective = false;
  // all_gather_flat / reduce_scatter_flat run natively (no ring of send/recv); with
  // device_tensors, on CUDA tensors (CPU ones take the ring).
  bool native_flat_collectives = false;
  // Collectives on CUDA tensors run on a GPU backend (NCCL: getBackendName() "nccl"), ordered on
  // the caller's current stream; CPU tensors go to the group's CPU backend (Gloo). Without it,
  // the flat collectives stage CUDA tensors through CPU memory.
  bool device_tensors = false;
};
// Thread-safe; throws InvalidArgumentError for a null group.
GroupCapabilities capabilities_of(const c10::intrusive_ptr<c10d::ProcessGroup>& group);

enum class ReduceOp { kSum, kAvg };

// output (W * n,) receives every rank's input (n,) at offset rank * n, in rank order. `input`
// may be output's own slot (in place). 1-D contiguous dense tensors of one dtype on one device;
// throws InvalidArgumentError, before any communication, for others or for sizes that do not fit
// W. CUDA tensors: see Note [Flat collectives on devices] (native on NCCL, where wait() does not
// block the host but orders the caller's stream; elsewhere staged through CPU memory, the
// caller's stream synchronised when the call is issued).
// Under ShmProcessGroup an output from allocate_collective_buffer is read by the peers where it
// is (no staging). Asynchronous: wait on the returned work (trainyard::wait_work) before reading
// output or reusing input. Every rank issues the same flat collectives in the same order; ranks
// that do not get an error naming both calls (on a ring, only the ranks whose predecessor
// differs; the others time out). On other groups the ring runs on its own thread,
// flat collectives on one group one at a time in issue order; each send/recv waits at most the
// group's timeout. Call from one thread per group (issue order is the order across ranks).
c10::intrusive_ptr<c10d::Work> all_gather_flat(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                               at::Tensor output,
                                               at::Tensor input);

// output (n,) = the sum (or mean) over ranks of their input (W * n,)'s slot rank, elements
// [rank * n, (rank + 1) * n). input and output are float32 or bfloat16 (either may differ from the
// other); `output` may be input's own slot when they share a dtype. Additions are fp32. Under
// ShmProcessGroup every rank's raw input is summed in rank order and rounded to output's dtype
// once, so all ranks' shares are computed alike (in place when input comes from
// allocate_collective_buffer). On a ring, partial sums travel in input's dtype, so a bf16 input
// is rounded to bf16 at each of the W - 2 inner hops: the error of a bf16 sum in ring order (Note
// [Ring collectives]); pass fp32 input where that matters. NCCL sums in input's dtype likewise
// and, where output's dtype differs, converts into output when the work is waited for. Devices,
// asynchrony and the other rules as for all_gather_flat; input must stay unchanged until the work
// completes.
c10::intrusive_ptr<c10d::Work> reduce_scatter_flat(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group,
    at::Tensor output,
    at::Tensor input,
    ReduceOp op = ReduceOp::kSum);

// The c10d collectives trainyard issues, on `group` as group->allreduce(...) etc., recorded into
// metrics::process_registry() (comm/collective_metrics.h: calls, bytes, seconds, blocked
// seconds per op). Library code issues through these, never on the group directly, so that every
// collective is counted. Asynchronous: wait on the returned work (trainyard::wait_work). Work on
// a GPU backend waits as Note [Flat collectives on devices] says, with or without a timeout.
c10::intrusive_ptr<c10d::Work> all_reduce(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                          std::vector<at::Tensor>& tensors,
                                          const c10d::AllreduceOptions& options = {});
c10::intrusive_ptr<c10d::Work> broadcast(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                         std::vector<at::Tensor>& tensors,
                                         const c10d::BroadcastOptions& options = {});
c10::intrusive_ptr<c10d::Work> barrier(const c10::intrusive_ptr<c10d::ProcessGroup>& group);

// Elements each rank sends over the wire (or through shared memory) for one call, as nccl-tests
// counts them: (W - 1) * n for both, n being the per-rank slot. For tests and stats.
inline std::int64_t flat_collective_elements(std::int64_t slot_numel, int world_size) {
  return slot_numel * (world_size - 1);
}

}  // namespace trainyard::comm
