// ShmProcessGroup: a c10d::ProcessGroup for ranks that share one host. All-reduces, broadcasts,
// flat all-gathers and flat reduce-scatters of dense CPU tensors go through a shared-memory
// segment (memcpy and in-place reductions, no sockets, no kernel copies); every other collective
// is forwarded to an inner group (Gloo). See Note [Shared-memory all-reduce] in
// shm_process_group.cpp.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace trainyard {

struct ShmOptions {
  static constexpr std::size_t kDefaultChunkBytes = 4u << 20;
  // Bytes each rank stages per step; the segment holds 2 x world_size chunks.
  std::size_t chunk_bytes = kDefaultChunkBytes;
  // Bound on every wait for a peer; a dead peer is noticed sooner by its pid.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Names this group's keys in the store. Groups made one after another over the same store and
  // name are told apart by a per-rank count, so ranks must create them in the same order.
  std::string name = "default";
};

class ShmProcessGroup : public c10d::ProcessGroup {
 public:
  // Collective over the store: rank 0 creates the segment, the others map it. Throws Error on
  // every rank when the segment cannot be set up on some rank (make_local_group falls back).
  // The destructor abandons a collective in progress and fails queued ones.
  ShmProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                  int rank,
                  int size,
                  c10::intrusive_ptr<c10d::ProcessGroup> inner,
                  ShmOptions options = {});
  ~ShmProcessGroup() override;

  const std::string getBackendName() const override { return "trainyard-shm"; }

  // Through shared memory: one dense CPU tensor of float, double, int32 or int64 with SUM, MIN or
  // MAX, or float/double with AVG (all-reduce); any dtype up to 8 bytes (broadcast). Anything
  // else goes to the inner group.
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  // Flat collectives through shared memory (Note [Flat collectives in shared memory]): input (n,)
  // into output (world_size * n,) at rank * n; any dtype up to 8 bytes. `input` may be output's
  // own slot. In place when output comes from allocate_shared; else staged. Other tensors (not
  // one dense contiguous CPU tensor each) go to the inner group.
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output,
                                                   at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override;
  // output (n,) = SUM or AVG over ranks of input (world_size * n,)'s slot rank: float32 or
  // bfloat16, each of its own (bf16 summed in fp32, rounded once). `output` may be input's own
  // slot. In place when input comes from allocate_shared; else staged. Anything else goes to the
  // inner group.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;

  // Forwarded to the inner group.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output,
                                                   at::Tensor& input,
                                                   std::vector<int64_t>& output_split_sizes,
                                                   std::vector<int64_t>& input_split_sizes,
                                                   const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int src_rank,
                                      int tag) override;
  // After every queued shared-memory collective, then the inner group's barrier.
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  // Collective: a zero-filled (numel,) tensor in a segment that every rank maps. All-reduces,
  // broadcasts and flat collectives of a tensor inside it (the same offset and size on every rank)
  // read the peers' copies where they are, with no staging: see Notes [Collectives in place] and
  // [Flat collectives in shared memory]. Every rank allocates
  // the same sizes in the same order, from one thread. Throws, on every rank, Error when /dev/shm
  // cannot hold it and InvalidArgumentError when the ranks asked for different sizes.
  at::Tensor allocate_shared(std::int64_t numel, at::ScalarType dtype);

  const c10::intrusive_ptr<c10d::ProcessGroup>& inner() const { return inner_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  c10::intrusive_ptr<c10d::ProcessGroup> inner_;
};

// A group for ranks on one host: a ShmProcessGroup over `inner` when every rank can map the
// shared segment (same host, /dev/shm usable), else `inner` itself, with a log line saying why.
c10::intrusive_ptr<c10d::ProcessGroup> make_local_group(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    c10::intrusive_ptr<c10d::ProcessGroup> inner,
    ShmOptions options = {});

// A zero-filled (numel,) tensor to all-reduce or broadcast over `group` again and again (DDP's
// buckets, sharded parameters): ShmProcessGroup::allocate_shared for a CPU tensor when `group` is
// one (collective then), else, or when /dev/shm is too small (with a warning), at::zeros.
at::Tensor allocate_collective_buffer(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                      std::int64_t numel,
                                      const at::TensorOptions& options);

}  // namespace trainyard
