// Collectives FSDP needs beyond what LibTorch 1.13's Gloo group offers: all_gather into one flat
// buffer and reduce_scatter (Gloo has none), each in place through shared memory when every rank
// is on this host (ShmProcessGroup) and as a ring of send/recv between hosts; low-precision
// inputs are summed in fp32. Also the one capability query callers ask instead of casting.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>

namespace trainyard::comm {

// What a process group can do beyond c10d's base API. Ask this instead of dynamic_cast.
struct GroupCapabilities {
  // Buffers from allocate_collective_buffer live in memory every rank maps, and collectives on
  // them read the peers' copies in place (ShmProcessGroup).
  bool shared_memory = false;
  // allreduce accepts ReduceOp::AVG on float tensors (Gloo's does not).
  bool average_in_collective = false;
  // all_gather_flat / reduce_scatter_flat run natively (no ring of send/recv).
  bool native_flat_collectives = false;
};
GroupCapabilities capabilities_of(const c10::intrusive_ptr<c10d::ProcessGroup>& group);

enum class ReduceOp { kSum, kAvg };

// output (W * n,) receives every rank's input (n,) at offset rank * n, in rank order. `input`
// may be output's own slot (in place). Contiguous dense CPU tensors of one dtype. Asynchronous:
// wait on the returned work (trainyard::wait_work) before reading output or reusing input.
c10::intrusive_ptr<c10d::Work> all_gather_flat(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                               at::Tensor output,
                                               at::Tensor input);

// output (n,) = the sum (or mean) over ranks of their input (W * n,)'s slot [rank * n, (rank+1) * n).
// input and output are float32 or bfloat16 (either may differ from the other); bf16 values are
// summed in fp32 and rounded once at the end (Note [Low-precision reduction]). Asynchronous like
// all_gather_flat; input must stay unchanged until the work completes.
c10::intrusive_ptr<c10d::Work> reduce_scatter_flat(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group,
    at::Tensor output,
    at::Tensor input,
    ReduceOp op = ReduceOp::kSum);

// Elements each rank sends over the wire (or through shared memory) for one call, as nccl-tests
// counts them: (W - 1) * n for both, n being the per-rank slot. For tests and stats.
inline std::int64_t flat_collective_elements(std::int64_t slot_numel, int world_size) {
  return slot_numel * (world_size - 1);
}

}  // namespace trainyard::comm
