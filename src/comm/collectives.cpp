#include "trainyard/comm/collectives.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "torch_compat.h"
#include "trainyard/comm/collective_metrics.h"
#include "trainyard/comm/device_work_beacon.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/comm/shm_process_group.h"
#include "trainyard/error.h"

namespace trainyard::comm {

// Note [Ring collectives]
// A CPU group across hosts (ProcessGroupGloo) runs flat collectives as trainyard's own ring of
// send/recv rather than Gloo's all_gather_single / reduce_scatter_single: the ring adds bf16 in
// fp32 and checks that the ranks issued the same call (below). Rank r sends to r + 1
// and receiving from r - 1, W - 1 steps of one slot (n elements) each, so every rank sends
// (W - 1) * n elements, as nccl-tests counts them; an all-reduce + slice would send twice that.
//   reduce-scatter: at step s rank r sends its partial sum of slot (r - s - 1) mod W (at s = 0
//                   its own input's slot) and receives the partial sum of slot (r - s - 2) mod W,
//                   to which it adds its input's slot in fp32; after the last step that slot is
//                   r, summed over every rank.
//   all-gather:     at step s rank r forwards slot (r - s) mod W of its output (at s = 0 its own)
//                   and receives slot (r - s - 1) mod W straight into its output.
// Partial sums travel in the input's dtype: bf16 inputs put bf16 on the wire (half the bytes),
// so each hop rounds the partial sum to bf16 once, while the additions themselves are fp32. That
// is the rounding of a bf16 sum taken in ring order; only the shared-memory path, which reads
// every rank's raw input, rounds once (Note [Flat collectives in shared memory]).
// Each call runs on its own thread, so the caller is free until it waits. Calls on one group run
// one after another, in the order this process issued them (a ticket per call): every rank issues
// them in the same order, so the ring's messages on a pair come in the same order on both ends,
// and every call can use the one tag kRingTag. Flat collectives on one group therefore never
// overlap each other (they overlap everything else); two groups' rings run side by side.
// Every send and recv waits at most the group's collective timeout.
// Before its first step a call sends what it is (kind, slot size, dtype, reduce op) to rank + 1
// and checks what rank - 1 sent, so ranks that issued different flat collectives get an error
// instead of a mix of two tensors or a size mismatch inside Gloo. A rank whose predecessor issued
// the same call but whose successor did not cannot see it; it fails when its successor stops
// answering (the group's timeout). After such an error the group's ring is out of step.

// Note [Flat collectives on devices]
// The paths above run on CPU memory. Tensors on a device (CUDA) take one of two others:
//   native:  a group with a GPU backend (GroupCapabilities::device_tensors: NCCL) runs
//            all_gather_single / reduce_scatter_single on them directly, ordered on the caller's
//            current stream. The work returned (DeviceWork) waits as Note [Waiting on NCCL work]
//            (nccl.cpp) says NCCL work must, with a timeout or without: the caller's
//            stream waits for the collective and the host does not, so slices of wait_work never
//            trip NCCL's wait(timeout), which aborts the communicator; NCCL's watchdog bounds the
//            collective instead. all_reduce, broadcast and barrier on such a group return their
//            work the same way. NCCL reduces in one dtype, so a reduce-scatter whose output dtype
//            differs reduces into a temporary of input's dtype (partial sums in that dtype, as on
//            the ring) that the work's wait() converts into output on the waiting thread's
//            current stream. CPU tensors on such a group take the ring over its CPU backend.
//   staged:  any other group (Gloo, the shared-memory group) runs the CPU path on host copies:
//            the caller's thread copies input into a pinned CPU buffer (a synchronous copy, so
//            the caller's stream has finished everything issued before the call), issues the
//            CPU collective in its place in the issue order, and a thread of the work's own
//            waits for it, copies the result into output (synchronously, on that thread's
//            stream) and only then completes the work. A caller that waited for the work may
//            read output on any stream. Staging costs two copies and a stream synchronisation
//            per call; NCCL is the fast path.
// One rank with a group that is not native copies input into output on the device (the CPU
// path's shortcut), ordered on the caller's stream like any device kernel.

namespace {

// The send/recv tag of every ring step; Gloo matches tags per pair of one group. Other users of
// send/recv on a group should not use it.
constexpr int kRingTag = 0x7452494e;  // "tRIN"

// The order of ring calls on each group: see Note [Ring collectives]. A lane exists only while
// calls on its group are in flight, and every call holds its group, so a lane never outlives its
// group and a new group at the same address gets a new lane.
struct RingLane {
  std::condition_variable turn;
  std::uint64_t issued = 0;  // guarded by RingLanes::mutex
  std::uint64_t done = 0;    // guarded by RingLanes::mutex
};

struct RingLanes {
  std::mutex mutex;
  std::unordered_map<const c10d::ProcessGroup*, std::shared_ptr<RingLane>> lanes;
};

RingLanes& ring_lanes() {
  static RingLanes lanes;
  return lanes;
}

// A flat collective running on its own thread. The destructor waits for that thread, so
// dropping the work without waiting blocks until the ring ends (bounded by the group's timeout).
class RingWork : public c10d::Work {
 public:
  RingWork(c10d::OpType type, at::Tensor result)
      : c10d::Work(-1, type), result_(std::move(result)) {}
  ~RingWork() override {
    if (thread_.joinable()) thread_.join();
  }

  // Runs `body` on this work's thread once every earlier call on `group` has finished, then
  // completes the work with its error, if any. Call once.
  void start(const c10::intrusive_ptr<c10d::ProcessGroup>& group, std::function<void()> body) {
    auto& registry = ring_lanes();
    std::shared_ptr<RingLane> lane;
    std::uint64_t ticket = 0;
    {
      std::lock_guard<std::mutex> lock(registry.mutex);
      auto& slot = registry.lanes[group.get()];
      if (!slot) slot = std::make_shared<RingLane>();
      lane = slot;
      ticket = lane->issued++;
    }
    thread_ = std::thread([this, group, lane, ticket, body = std::move(body)] {
      auto& registry = ring_lanes();
      {
        std::unique_lock<std::mutex> lock(registry.mutex);
        lane->turn.wait(lock, [&] { return lane->done == ticket; });
      }
      std::exception_ptr error;
      try {
        body();
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(registry.mutex);
        if (++lane->done == lane->issued) registry.lanes.erase(group.get());
      }
      lane->turn.notify_all();
      finish(error);
    });
  }

  void complete(std::exception_ptr error) { finish(std::move(error)); }
  std::vector<at::Tensor> result() override { return {result_}; }

 private:
  at::Tensor result_;
  std::thread thread_;  // runs the ring; joined by the destructor
};

// A flat collective on device tensors run on host copies: see Note [Flat collectives on devices].
// The destructor waits for its thread, so dropping the work without waiting blocks until the
// host collective ends (bounded by the group's timeout).
class StagedWork : public c10d::Work {
 public:
  StagedWork(c10d::OpType type, at::Tensor result)
      : c10d::Work(-1, type), result_(std::move(result)) {}
  ~StagedWork() override {
    if (thread_.joinable()) thread_.join();
  }

  // On this work's thread: waits for `host_work`, copies `host_result` into the result, then
  // completes the work with the error of either, if any. `keep` stays alive until then. Call once.
  void start(c10::intrusive_ptr<c10d::Work> host_work, at::Tensor host_result, at::Tensor keep) {
    thread_ = std::thread([this, host_work = std::move(host_work),
                           host_result = std::move(host_result), keep = std::move(keep)] {
      std::exception_ptr error;
      try {
        host_work->wait();
        result_.copy_(host_result);  // synchronous: on the device when it returns
      } catch (...) {
        error = std::current_exception();
      }
      finish(error);
    });
  }

  std::vector<at::Tensor> result() override { return {result_}; }

 private:
  at::Tensor result_;
  std::thread thread_;  // waits and copies back; joined by the destructor
};

// Work on a group's GPU backend: see Note [Flat collectives on devices]. wait(), with a timeout
// or without, is the backend's plain wait; then, when `reduced` is defined (a reduce-scatter into
// another dtype), it converts `reduced` into `output`, once, on the waiting thread's stream.
class DeviceWork : public c10d::Work {
 public:
  DeviceWork(c10::intrusive_ptr<c10d::Work> inner,
             c10d::OpType type,
             at::Tensor output = {},
             at::Tensor reduced = {})
      : c10d::Work(-1, type),
        inner_(std::move(inner)),
        output_(std::move(output)),
        reduced_(std::move(reduced)) {}

  bool isCompleted() override { return inner_->isCompleted(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  std::vector<at::Tensor> result() override {
    return output_.defined() ? std::vector<at::Tensor>{output_} : inner_->result();
  }
  bool wait(std::chrono::milliseconds /*timeout: NCCL's watchdog bounds it*/) override {
    const bool ok = inner_->wait();
    watch_stream_wait();  // Note [Beating while device work runs]
    if (reduced_.defined()) std::call_once(converted_, [&] { output_.copy_(reduced_); });
    return ok;
  }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  at::Tensor output_;
  at::Tensor reduced_;  // input's dtype, alive until converted; undefined: nothing to convert
  std::once_flag converted_;
};

// `work` as this file returns it: wrapped in DeviceWork when it runs on `group`'s GPU backend,
// which is the case when the group has one and `tensor` (any of the collective's) is on a GPU.
c10::intrusive_ptr<c10d::Work> on_backend_of(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                             bool cuda_tensor,
                                             c10::intrusive_ptr<c10d::Work> work,
                                             c10d::OpType type) {
  if (!cuda_tensor || !capabilities_of(group).device_tensors) return work;
  return c10::make_intrusive<DeviceWork>(std::move(work), type);
}

// The bound on each of the group's waits: Gloo's own timeout, else the default.
std::chrono::milliseconds collective_timeout(c10d::ProcessGroup& group) {
  return compat::gloo_timeout(group).value_or(kDefaultCollectiveTimeout);
}

int mod(int a, int w) {
  return ((a % w) + w) % w;
}

// What a ring call is, exchanged before its first step: see Note [Ring collectives].
struct RingStamp {
  enum Kind : std::int64_t { kAllGather = 1, kReduceScatter = 2 };
  std::int64_t kind = 0;
  std::int64_t slot_numel = 0;
  std::int64_t dtype = 0;
  std::int64_t op = 0;  // ReduceOp, reduce-scatter only

  at::Tensor to_tensor() const { return at::tensor({kind, slot_numel, dtype, op}, at::kLong); }
  static RingStamp from_tensor(const at::Tensor& t) {
    const auto* v = t.data_ptr<std::int64_t>();
    return RingStamp{.kind = v[0], .slot_numel = v[1], .dtype = v[2], .op = v[3]};
  }
  bool operator==(const RingStamp&) const = default;

  std::string describe() const {
    const bool known_dtype =
        dtype >= 0 && dtype < static_cast<std::int64_t>(at::ScalarType::NumOptions);
    const std::string type =
        known_dtype ? c10::toString(static_cast<at::ScalarType>(dtype)) : "an unknown dtype";
    switch (kind) {
      case kAllGather:
        return detail::concat("all_gather_flat of ", slot_numel, " x ", type, " per rank");
      case kReduceScatter:
        return detail::concat("reduce_scatter_flat with ",
                              op == static_cast<std::int64_t>(ReduceOp::kAvg) ? "AVG" : "SUM",
                              " of ", slot_numel, " x ", type, " per rank");
      default:
        return "an unknown flat collective";
    }
  }
};

// One ring step's point-to-point traffic on `group`, every wait bounded by `timeout`.
class RingPeer {
 public:
  RingPeer(c10d::ProcessGroup& group, const char* what)
      : group_(group),
        what_(what),
        rank_(group.getRank()),
        world_(group.getSize()),
        timeout_(collective_timeout(group)) {}

  int rank() const { return rank_; }
  int world() const { return world_; }

  // Sends `mine` to rank + 1 and checks that rank - 1 sent the same; throws Error naming both.
  void agree(const RingStamp& mine) {
    auto theirs = at::empty({4}, at::kLong);
    exchange(mine.to_tensor(), theirs, /*step=*/-1);
    const auto got = RingStamp::from_tensor(theirs);
    if (got == mine) return;
    throw Error(detail::concat("Rank ", rank_, "/", world_, " issued ", mine.describe(),
                               ", but rank ", mod(rank_ - 1, world_), " issued ", got.describe(),
                               ". HINT: every rank must issue the same collectives in the same "
                               "order."));
  }

  // Sends `out` to rank + 1 and receives `in` from rank - 1; returns when both are done.
  void exchange(at::Tensor out, at::Tensor in, int step) {
    std::vector<at::Tensor> recv_tensors{std::move(in)};
    std::vector<at::Tensor> send_tensors{std::move(out)};
    const int from = mod(rank_ - 1, world_);
    const int to = mod(rank_ + 1, world_);
    auto recv = group_.recv(recv_tensors, from, kRingTag);
    auto send = group_.send(send_tensors, to, kRingTag);
    wait(recv, "receiving from", from, step);
    wait(send, "sending to", to, step);
  }

 private:
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* doing, int peer, int step) {
    const auto start = std::chrono::steady_clock::now();
    try {
      work->wait(timeout_);
    } catch (const std::exception& e) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
      const auto message = detail::concat(
          "Rank ", rank_, "/", world_, ": ", what_,
          step < 0 ? std::string(" (its first exchange)")
                   : detail::concat(" step ", step + 1, " of ", world_ - 1),
          " failed ", doing, " rank ", peer, " after ", waited.count(), " ms (timeout ",
          timeout_.count(), " ms): ", e.what(),
          " HINT: a rank is stuck, died, or issued flat collectives in another order.");
      if (waited >= timeout_) throw TimeoutError(message);
      throw NetworkError(message);
    }
  }

  c10d::ProcessGroup& group_;
  const char* what_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
};

// Plain loops on the ring's own thread, rather than ATen's element-wise kernels, whose OpenMP
// teams would be started per new thread and compete with the rank's own threads.
template <typename T>
float as_float(T v) {
  return static_cast<float>(v);
}

// sum (n,) = received + own, both of type T, added in fp32.
template <typename T>
void add_pair(float* sum, const at::Tensor& received, const at::Tensor& own) {
  const T* a = received.data_ptr<T>();
  const T* b = own.data_ptr<T>();
  const std::int64_t n = received.numel();
  for (std::int64_t i = 0; i < n; ++i) sum[i] = as_float(a[i]) + as_float(b[i]);
}

// out (n,) of type T = sum / divisor, rounded once.
template <typename T>
void store(const at::Tensor& out, const float* sum, float divisor) {
  T* o = out.data_ptr<T>();
  const std::int64_t n = out.numel();
  if (divisor == 1.0f) {
    for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(sum[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(sum[i] / divisor);
  }
}

void add_pair(float* sum, const at::Tensor& received, const at::Tensor& own) {
  if (own.scalar_type() == at::kBFloat16) return add_pair<c10::BFloat16>(sum, received, own);
  add_pair<float>(sum, received, own);
}

void store(const at::Tensor& out, const float* sum, float divisor) {
  if (out.scalar_type() == at::kBFloat16) return store<c10::BFloat16>(out, sum, divisor);
  store<float>(out, sum, divisor);
}

// A reduce-scatter's working memory: (n,) in the wire dtype to send and to receive, (n,) fp32 for
// the partial sum. Allocated by the caller, on its own thread: memory a short-lived ring thread
// allocates comes from a per-thread glibc arena, which serves large blocks with fresh mmap()s,
// every page of them faulted in again on each call (Note [Reusing freed memory] in
// process_group.cpp) — that was most of the ring's time.
struct RingScratch {
  at::Tensor sending, receiving, sum;
  RingScratch(const at::Tensor& input, std::int64_t n)
      : sending(at::empty({n}, input.options())),
        receiving(at::empty({n}, input.options())),
        sum(at::empty({n}, input.options().dtype(at::kFloat))) {}
};

// See Note [Ring collectives]. output (n,), input (W * n,).
void ring_reduce_scatter(c10d::ProcessGroup& group,
                         at::Tensor output,
                         at::Tensor input,
                         ReduceOp op,
                         RingScratch& scratch) {
  RingPeer peer(group, "reduce_scatter_flat");
  const int rank = peer.rank();
  const int world = peer.world();
  const std::int64_t n = output.numel();
  const float divisor = op == ReduceOp::kAvg ? static_cast<float>(world) : 1.0f;
  const auto slot = [&](int s) { return input.narrow(0, mod(s, world) * n, n); };
  peer.agree(RingStamp{.kind = RingStamp::kReduceScatter,
                       .slot_numel = n,
                       .dtype = static_cast<std::int64_t>(input.scalar_type()),
                       .op = static_cast<std::int64_t>(op)});
  if (n == 0) return;
  float* sum = scratch.sum.data_ptr<float>();  // fp32 partial sum
  for (int step = 0; step < world - 1; ++step) {
    // Own input's slot first, then the partial sum received last step.
    peer.exchange(step == 0 ? slot(rank - 1) : scratch.sending, scratch.receiving, step);
    add_pair(sum, scratch.receiving, slot(rank - step - 2));
    if (step < world - 2) store(scratch.sending, sum, 1.0f);
  }
  store(output, sum, divisor);
}

// See Note [Ring collectives]. output (W * n,), input (n,).
void ring_all_gather(c10d::ProcessGroup& group, at::Tensor output, at::Tensor input) {
  RingPeer peer(group, "all_gather_flat");
  const int rank = peer.rank();
  const int world = peer.world();
  const std::int64_t n = input.numel();
  const auto slot = [&](int s) { return output.narrow(0, mod(s, world) * n, n); };
  auto own = slot(rank);
  if (own.data_ptr() != input.data_ptr() && n > 0)
    std::memcpy(own.data_ptr(), input.data_ptr(), n * input.element_size());
  peer.agree(RingStamp{.kind = RingStamp::kAllGather,
                       .slot_numel = n,
                       .dtype = static_cast<std::int64_t>(input.scalar_type())});
  if (n == 0) return;
  for (int step = 0; step < world - 1; ++step)
    peer.exchange(slot(rank - step), slot(rank - step - 1), step);
}

bool is_flat(const at::Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && t.is_contiguous() && t.dim() == 1;
}

void check_pair(const at::Tensor& big,
                const at::Tensor& small,
                int world,
                const char* what,
                const char* big_name,
                const char* small_name) {
  TY_CHECK(is_flat(big) && is_flat(small), what, ": ", big_name, " and ", small_name,
           " must be 1-D contiguous dense tensors, got ", big_name, " ", big.sizes(), " and ",
           small_name, " ", small.sizes(), ".");
  TY_CHECK(big.device() == small.device(), what, ": ", big_name, " and ", small_name,
           " must be on one device, got ", big.device(), " and ", small.device(), ".");
  TY_CHECK(big.is_cpu() || big.is_cuda(), what, ": tensors on ", big.device(),
           " are not supported; CPU or CUDA tensors.");
  TY_CHECK(big.numel() == small.numel() * world, what, ": ", big_name, " has ", big.numel(),
           " elements; with ", world, " ranks and a ", small_name, " of ", small.numel(),
           " it must have ", small.numel() * world, ".");
}

bool low_or_single(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16;
}

// Whether the group runs flat collectives natively on t's device: Note [Flat collectives on
// devices].
bool native_on(const GroupCapabilities& caps, const at::Tensor& t) {
  return caps.native_flat_collectives && (caps.device_tensors ? t.is_cuda() : t.is_cpu());
}

// (numel,) of like's dtype in CPU memory, pinned when `like` is a CUDA tensor (faster copies).
at::Tensor host_buffer(std::int64_t numel, const at::Tensor& like) {
  return at::empty({numel},
                   at::TensorOptions().dtype(like.scalar_type()).pinned_memory(like.is_cuda()));
}

// The name ProcessGroupNCCL gives its backend (c10d's NCCL_BACKEND_NAME), in 1.13 and 2.x.
constexpr const char* kNcclBackendName = "nccl";

}  // namespace

GroupCapabilities capabilities_of(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  TY_CHECK(group, "capabilities_of: the process group is null.");
  if (dynamic_cast<const ShmProcessGroup*>(group.get()) != nullptr)
    return GroupCapabilities{
        .shared_memory = true, .average_in_collective = true, .native_flat_collectives = true};
  // LibTorch's groups are told apart by name, not type: in 2.x every group is a c10d::ProcessGroup
  // holding backends, and this build need not link NCCL at all.
  if (group->getBackendName() == kNcclBackendName)
    return GroupCapabilities{
        .average_in_collective = true, .native_flat_collectives = true, .device_tensors = true};
  return GroupCapabilities{};
}

namespace {

std::int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  std::int64_t bytes = 0;
  for (const auto& t : tensors) bytes += static_cast<std::int64_t>(t.nbytes());
  return bytes;
}

c10::intrusive_ptr<c10d::Work> all_gather_flat_untracked(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor output, at::Tensor input);
c10::intrusive_ptr<c10d::Work> reduce_scatter_flat_untracked(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group,
    at::Tensor output,
    at::Tensor input,
    ReduceOp op);

}  // namespace

c10::intrusive_ptr<c10d::Work> all_reduce(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                          std::vector<at::Tensor>& tensors,
                                          const c10d::AllreduceOptions& options) {
  TY_CHECK(group, "all_reduce: the process group is null.");
  const auto issued = std::chrono::steady_clock::now();
  auto work = group->allreduce(tensors, options);
  work = on_backend_of(group, !tensors.empty() && tensors[0].is_cuda(), std::move(work),
                       c10d::OpType::ALLREDUCE);
  return track_collective(CollectiveOp::kAllReduce, bytes_of(tensors), issued, std::move(work));
}

c10::intrusive_ptr<c10d::Work> broadcast(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                         std::vector<at::Tensor>& tensors,
                                         const c10d::BroadcastOptions& options) {
  TY_CHECK(group, "broadcast: the process group is null.");
  const auto issued = std::chrono::steady_clock::now();
  auto work = group->broadcast(tensors, options);
  work = on_backend_of(group, !tensors.empty() && tensors[0].is_cuda(), std::move(work),
                       c10d::OpType::BROADCAST);
  return track_collective(CollectiveOp::kBroadcast, bytes_of(tensors), issued, std::move(work));
}

c10::intrusive_ptr<c10d::Work> barrier(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  TY_CHECK(group, "barrier: the process group is null.");
  const auto issued = std::chrono::steady_clock::now();
  auto work = group->barrier();
  // A group with a GPU backend runs barriers there (2.x: its default backend).
  work = on_backend_of(group, /*cuda_tensor=*/true, std::move(work), c10d::OpType::BARRIER);
  return track_collective(CollectiveOp::kBarrier, 0, issued, std::move(work));
}

c10::intrusive_ptr<c10d::Work> all_gather_flat(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                               at::Tensor output,
                                               at::Tensor input) {
  const auto issued = std::chrono::steady_clock::now();
  const auto bytes = output.defined() ? static_cast<std::int64_t>(output.nbytes()) : 0;
  auto work = all_gather_flat_untracked(group, std::move(output), std::move(input));
  return track_collective(CollectiveOp::kAllGather, bytes, issued, std::move(work));
}

c10::intrusive_ptr<c10d::Work> reduce_scatter_flat(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group,
    at::Tensor output,
    at::Tensor input,
    ReduceOp op) {
  const auto issued = std::chrono::steady_clock::now();
  const auto bytes = input.defined() ? static_cast<std::int64_t>(input.nbytes()) : 0;
  auto work = reduce_scatter_flat_untracked(group, std::move(output), std::move(input), op);
  return track_collective(CollectiveOp::kReduceScatter, bytes, issued, std::move(work));
}

namespace {

c10::intrusive_ptr<c10d::Work> all_gather_flat_untracked(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor output, at::Tensor input) {
  TY_CHECK(group, "all_gather_flat: the process group is null.");
  check_pair(output, input, group->getSize(), "all_gather_flat", "output", "input");
  TY_CHECK(output.scalar_type() == input.scalar_type(),
           "all_gather_flat: output and input must have one dtype, got ", output.scalar_type(),
           " and ", input.scalar_type(), ".");
  const auto caps = capabilities_of(group);
  if (native_on(caps, output)) {
    auto work = group->all_gather_single(output, input, c10d::AllgatherOptions());
    if (!caps.device_tensors) return work;
    return c10::make_intrusive<DeviceWork>(std::move(work), c10d::OpType::_ALLGATHER_BASE, output);
  }
  if (!output.is_cpu() && group->getSize() > 1) {  // Note [Flat collectives on devices]
    const std::int64_t n = input.numel();
    auto host_output = host_buffer(output.numel(), output);  // (W * n,)
    auto host_input = host_output.narrow(0, group->getRank() * n, n);
    host_input.copy_(input);  // synchronises the caller's stream
    auto host_work = all_gather_flat_untracked(group, host_output, host_input);
    auto work = c10::make_intrusive<StagedWork>(c10d::OpType::_ALLGATHER_BASE, output);
    work->start(std::move(host_work), host_output, host_output);
    return work;
  }
  auto work = c10::make_intrusive<RingWork>(c10d::OpType::_ALLGATHER_BASE, output);
  if (group->getSize() == 1) {
    if (output.data_ptr() != input.data_ptr()) output.copy_(input);
    work->complete(nullptr);
    return work;
  }
  work->start(group, [g = group.get(), output, input] { ring_all_gather(*g, output, input); });
  return work;
}

c10::intrusive_ptr<c10d::Work> reduce_scatter_flat_untracked(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group,
    at::Tensor output,
    at::Tensor input,
    ReduceOp op) {
  TY_CHECK(group, "reduce_scatter_flat: the process group is null.");
  check_pair(input, output, group->getSize(), "reduce_scatter_flat", "input", "output");
  TY_CHECK(low_or_single(input.scalar_type()) && low_or_single(output.scalar_type()),
           "reduce_scatter_flat: input and output must be float32 or bfloat16, got ",
           input.scalar_type(), " and ", output.scalar_type(), ".");
  const auto caps = capabilities_of(group);
  if (native_on(caps, output)) {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = op == ReduceOp::kAvg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
    if (!caps.device_tensors) return group->reduce_scatter_single(output, input, opts);
    constexpr auto type = c10d::OpType::_REDUCE_SCATTER_BASE;
    if (output.scalar_type() == input.scalar_type())
      return c10::make_intrusive<DeviceWork>(group->reduce_scatter_single(output, input, opts),
                                             type, output);
    // One dtype on NCCL: Note [Flat collectives on devices]. (n,) input's dtype.
    auto reduced = at::empty({output.numel()}, input.options());
    auto work = group->reduce_scatter_single(reduced, input, opts);
    return c10::make_intrusive<DeviceWork>(std::move(work), type, output, reduced);
  }
  if (!output.is_cpu() && group->getSize() > 1) {            // Note [Flat collectives on devices]
    auto host_input = host_buffer(input.numel(), input);     // (W * n,)
    host_input.copy_(input);                                 // synchronises the caller's stream
    auto host_output = host_buffer(output.numel(), output);  // (n,)
    auto host_work = reduce_scatter_flat_untracked(group, host_output, host_input, op);
    auto work = c10::make_intrusive<StagedWork>(c10d::OpType::_REDUCE_SCATTER_BASE, output);
    work->start(std::move(host_work), host_output, host_input);
    return work;
  }
  auto work = c10::make_intrusive<RingWork>(c10d::OpType::_REDUCE_SCATTER_BASE, output);
  if (group->getSize() == 1) {
    output.copy_(input);
    work->complete(nullptr);
    return work;
  }
  auto scratch = std::make_shared<RingScratch>(input, output.numel());
  work->start(group, [g = group.get(), output, input, op, scratch] {
    ring_reduce_scatter(*g, output, input, op, *scratch);
  });
  return work;
}

}  // namespace

}  // namespace trainyard::comm
