#include "trainyard/comm/shm_process_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "comm/shared_segment.h"
#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"

namespace trainyard {

// Note [Shared-memory all-reduce]
// The segment holds a header (one barrier counter and one pid per rank) and two banks of
// world_size chunk-sized slots. A tensor is processed chunk by chunk, the banks alternating:
//   1. each rank copies its chunk into its own slot;                  barrier
//   2. rank r reduces part r (a 1/W slice) of every slot into its own slot's part r;   barrier
//   3. each rank copies part p of slot p, for every p, back into its tensor.
// No barrier is needed after step 3: a bank is written again two chunks later, and every rank
// passes the next chunk's barriers only after all ranks finished step 3 here. Broadcast is
// steps 1 (root only) and 3 (from the root's slot). A barrier is a per-rank counter in shared
// memory: a rank stores its new generation and wakes futex waiters; waiting spins briefly, then
// sleeps on the futex in short slices, checking the deadline and whether the peer still lives.

// Note [Collectives in place]
// A tensor from allocate_shared() lives in a segment that every rank maps: rank r's copy is
// region r, at the same offset in every region. Its collectives skip the staging slots:
//   all-reduce: barrier; rank r reduces part r of every rank's copy into its own copy; barrier;
//               rank r copies every other part p from rank p's copy; barrier.
//   broadcast:  barrier; every rank but the root copies the root's copy; barrier.
// The last barrier keeps a rank from changing its copy (zeroing gradients, the next update) while
// a peer still reads it. For a rank, an all-reduce of n bytes reads 2n and writes n, against 4n
// read and 3n written through the slots; and it is three barriers, not two per chunk.
// Every collective, in place or staged, first publishes what it is (kind, root, reduce op, dtype,
// buffer, offset, size, and the generation of its first barrier) and checks the other ranks'
// after that barrier, so ranks that issued different collectives get an error, not a mix of two
// tensors or barriers out of step.

// Note [Flat collectives in shared memory]
// all-gather (input (n,) into output (W * n,) at slot rank) and reduce-scatter (input (W * n,),
// output (n,) = the reduction of slot rank over ranks), for FSDP. The tensor the peers read is
// the output of an all-gather and the input of a reduce-scatter; when it lies in an
// allocate_shared() buffer they read it in place:
//   all-gather:     each rank copies its input into its own slot of its output, unless the input
//                   is that slot; barrier; rank r copies slot p of rank p's output into slot p
//                   of its own, for every p != r; barrier.
//   reduce-scatter: barrier; rank r sums slot r of every rank's input into its output; barrier.
// Otherwise they are staged, one barrier per chunk, the banks alternating as in
// Note [Shared-memory all-reduce]: for an all-gather each rank copies the next chunk of its input
// into its staging slot, then every rank copies the peers' slots out; for a reduce-scatter each
// rank's staging slot holds W pieces, piece q being the next chunk of its input's slot q, and
// rank r sums piece r of every slot. Sums run in rank order in fp32 blocks and are rounded to the
// output's dtype once (bf16 inputs are never added in bf16), so every rank's share is computed
// alike whichever path it took. An output that is the input's own slot (reduce-scatter) is
// written block by block after that block was read.

namespace {

constexpr int kMaxRanks = 64;
constexpr std::uint32_t kMagic = 0x7459534d;  // "tYSM"
constexpr int kSpins = 2000;
constexpr auto kSlice = std::chrono::milliseconds(50);

struct alignas(64) Counter {
  std::atomic<std::uint32_t> value;
};

// What a rank's next collective is, published before its first barrier and compared after it
// (see Note [Collectives in place]). `generation` is that barrier's, so an entry left over from an
// earlier collective never matches.
struct alignas(64) OpStamp {
  std::uint32_t generation;
  std::uint16_t kind;  // Impl::Kind
  std::int16_t root;   // broadcast only
  std::int32_t reduce_op;
  std::int32_t dtype;
  std::uint64_t buffer;  // allocate_shared()'s 1-based count; 0: staged through the slots
  std::uint64_t offset;  // bytes into the rank's region
  std::uint64_t bytes;
  bool operator==(const OpStamp&) const = default;
};

struct Header {
  std::uint32_t magic;
  std::uint32_t world_size;
  std::uint64_t chunk_bytes;
  Counter arrived[kMaxRanks];
  std::int32_t pids[kMaxRanks];
  // Two sets, by the parity of the stamp's generation: a rank that leaves a one-barrier collective
  // at once may publish its next stamp while a peer still reads this one.
  OpStamp ops[2][kMaxRanks];
};
constexpr std::size_t kHeaderBytes = (sizeof(Header) + 4095) / 4096 * 4096;

std::uint32_t* futex_word(Counter& c) {
  return reinterpret_cast<std::uint32_t*>(&c.value);
}

void futex_wake_all(Counter& c) {
  ::syscall(SYS_futex, futex_word(c), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void futex_wait(Counter& c, std::uint32_t seen, std::chrono::milliseconds slice) {
  timespec ts{.tv_sec = 0, .tv_nsec = static_cast<long>(slice.count()) * 1000000L};
  ::syscall(SYS_futex, futex_word(c), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

// False once `pid` has exited: gone (ESRCH), or a zombie its parent has not reaped yet.
bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno != ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return true;  // no /proc: trust kill()
  char state = '?';
  // The state follows the command name, which is in parentheses and may contain spaces.
  int c;
  while ((c = std::fgetc(f)) != EOF && c != ')') {
  }
  if (c == ')' && std::fscanf(f, " %c", &state) != 1) state = '?';
  std::fclose(f);
  return state != 'Z' && state != 'X';
}

// One allocate_shared() buffer: world_size regions of region_bytes, rank r's at r * region_bytes.
struct SharedBuffer {
  std::shared_ptr<SharedSegment> segment;
  std::size_t region_bytes = 0;
  std::uint64_t id = 0;  // 1-based count of the group's buffers, alike on every rank
  char* region(int rank) const {
    return static_cast<char*>(segment->base) + static_cast<std::size_t>(rank) * region_bytes;
  }
};

template <typename T>
void reduce_into(T* dst, const T* src, std::size_t n, c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
      break;
    case c10d::ReduceOp::MIN:
      for (std::size_t i = 0; i < n; ++i) dst[i] = std::min(dst[i], src[i]);
      break;
    case c10d::ReduceOp::MAX:
      for (std::size_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
      break;
    default:
      TY_ASSERT(false, "unsupported reduce op reached the shared-memory path");
  }
}

// Reduces elements [begin, begin + count) of every rank's slot into `rank`'s own slot. AVG sums,
// then scales the part by 1 / world while it is still in cache.
template <typename T>
void reduce_part(char* const* slots,
                 int world,
                 int rank,
                 std::size_t begin,
                 std::size_t count,
                 c10d::ReduceOp::RedOpType op) {
  T* dst = reinterpret_cast<T*>(slots[rank]) + begin;
  const auto combine = op == c10d::ReduceOp::AVG ? c10d::ReduceOp::SUM : op;
  for (int peer = 0; peer < world; ++peer)
    if (peer != rank)
      reduce_into(dst, reinterpret_cast<const T*>(slots[peer]) + begin, count, combine);
  if (op == c10d::ReduceOp::AVG) {
    const T scale = T(1) / static_cast<T>(world);
    for (std::size_t i = 0; i < count; ++i) dst[i] *= scale;
  }
}

// Adds (or, for the first part, stores) `count` elements of type T at `src` into acc.
template <typename T>
void accumulate(float* acc, const char* src, std::size_t count, bool first) {
  const T* in = reinterpret_cast<const T*>(src);
  if (first) {
    for (std::size_t i = 0; i < count; ++i) acc[i] = static_cast<float>(in[i]);
  } else {
    for (std::size_t i = 0; i < count; ++i) acc[i] += static_cast<float>(in[i]);
  }
}

// out (count,) = the sum over ranks p of parts[p] (count,), added in rank order in fp32 and
// divided by `world` when `avg`, then rounded once to out_type. Inputs and output are float or
// bfloat16. Reads each block of every part before writing that block of `out`, so `out` may be
// one of the parts. See Note [Flat collectives in shared memory].
void sum_parts(char* out,
               at::ScalarType out_type,
               const char* const* parts,
               at::ScalarType in_type,
               int world,
               std::size_t count,
               bool avg) {
  constexpr std::size_t kBlock = 1024;
  float acc[kBlock];
  const std::size_t in_elem = c10::elementSize(in_type);
  const std::size_t out_elem = c10::elementSize(out_type);
  for (std::size_t begin = 0; begin < count; begin += kBlock) {
    const std::size_t m = std::min(kBlock, count - begin);
    for (int p = 0; p < world; ++p) {
      const char* src = parts[p] + begin * in_elem;
      if (in_type == at::kBFloat16) {
        accumulate<c10::BFloat16>(acc, src, m, p == 0);
      } else {
        accumulate<float>(acc, src, m, p == 0);
      }
    }
    if (avg) {
      const float w = static_cast<float>(world);
      for (std::size_t i = 0; i < m; ++i) acc[i] /= w;
    }
    char* dst = out + begin * out_elem;
    if (out_type == at::kBFloat16) {
      auto* o = reinterpret_cast<c10::BFloat16*>(dst);
      for (std::size_t i = 0; i < m; ++i) o[i] = c10::BFloat16(acc[i]);
    } else {
      std::memcpy(dst, acc, m * sizeof(float));
    }
  }
}

class ShmWork : public c10d::Work {
 public:
  ShmWork(at::Tensor tensor, c10d::OpType type)
      : c10d::Work(-1, type, nullptr, std::vector<at::Tensor>{tensor}),
        tensor_(std::move(tensor)) {}
  void complete(std::exception_ptr error) { finish(std::move(error)); }
  std::vector<at::Tensor> result() override { return {tensor_}; }

 private:
  at::Tensor tensor_;
};

}  // namespace

struct ShmProcessGroup::Impl {
  enum class Kind { kAllreduce, kBroadcast, kBarrier, kAllGather, kReduceScatter };
  struct Job {
    Kind kind = Kind::kAllreduce;
    // The tensor every rank's stamp describes and the peers may read: an all-gather's output, a
    // reduce-scatter's input (W * n,).
    at::Tensor tensor;
    // The other side of a flat collective: an all-gather's input, a reduce-scatter's output (n,).
    at::Tensor other;
    c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM;
    int root = 0;
    // Set for a tensor inside an allocate_shared() buffer: see Note [Collectives in place].
    std::shared_ptr<SharedBuffer> buffer;
    std::size_t offset = 0;  // bytes from the start of this rank's region
    c10::intrusive_ptr<ShmWork> work;
  };

  int rank = 0;
  int world = 1;
  ShmOptions options;
  std::shared_ptr<SharedSegment> segment;
  void* base = nullptr;  // segment's
  std::size_t mapped_bytes = 0;
  Header* header = nullptr;
  c10::intrusive_ptr<c10d::Store> store;  // for allocate_shared()
  std::string prefix;                     // this group's keys in the store

  std::mutex buffers_mutex;
  std::vector<std::weak_ptr<SharedBuffer>> buffers;  // guarded by buffers_mutex
  std::uint64_t buffer_count = 0;                    // guarded by buffers_mutex
  bool check_pids = false;
  std::uint32_t generation = 0;           // comm thread only
  std::uint64_t chunk_count = 0;          // comm thread only
  std::string broken;                     // comm thread only: why the group stopped working
  std::atomic<bool> stop_waiting{false};  // set by the destructor: abandon a barrier
  c10d::ProcessGroup* inner = nullptr;    // the owning group's inner group; outlives Impl

  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Job> jobs;   // guarded by mutex
  bool stopping = false;  // guarded by mutex
  std::thread worker;

  char* slot(int bank_rank) const {
    const std::size_t bank = static_cast<std::size_t>(chunk_count % 2);
    return static_cast<char*>(base) + kHeaderBytes +
           (bank * world + static_cast<std::size_t>(bank_rank)) * options.chunk_bytes;
  }

  void barrier() {
    const std::uint32_t gen = ++generation;
    header->arrived[rank].value.store(gen, std::memory_order_release);
    futex_wake_all(header->arrived[rank]);
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    for (int peer = 0; peer < world; ++peer) {
      if (peer == rank) continue;
      auto& counter = header->arrived[peer];
      for (int spins = 0;; ++spins) {
        const std::uint32_t seen = counter.value.load(std::memory_order_acquire);
        if (static_cast<std::int32_t>(seen - gen) >= 0) break;
        if (spins < kSpins) continue;
        futex_wait(counter, seen, kSlice);
        heartbeat();  // waiting for a peer is progress; see Note [Hang watchdog]
        if (stop_waiting.load(std::memory_order_relaxed))
          throw Error(detail::concat("Rank ", rank, "/", world,
                                     ": the shared-memory process group was destroyed while a "
                                     "collective waited for rank ",
                                     peer, "."));
        if (check_pids && !process_alive(header->pids[peer]))
          throw NetworkError(detail::concat(
              "Rank ", rank, "/", world, ": rank ", peer, " (pid ", header->pids[peer],
              ") exited during a shared-memory collective. HINT: its own log names the cause."));
        if (std::chrono::steady_clock::now() > deadline)
          throw TimeoutError(detail::concat(
              "Rank ", rank, "/", world, ": rank ", peer,
              " did not reach a shared-memory collective within ", options.timeout.count(),
              " ms. HINT: a rank is stuck or issued collectives in another order."));
      }
    }
  }

  // Reduces part `rank` (a 1/world slice) of the `elems`-element arrays at slots[p], one per
  // rank, into slots[rank].
  void reduce_my_part(char* const* slots, std::size_t elems, const Job& job) const {
    const std::size_t part = (elems + world - 1) / world;
    const std::size_t begin = std::min(elems, part * rank);
    const std::size_t count = std::min(elems, begin + part) - begin;
    if (count == 0) return;
    switch (job.tensor.scalar_type()) {
      case at::kFloat:
        return reduce_part<float>(slots, world, rank, begin, count, job.op);
      case at::kDouble:
        return reduce_part<double>(slots, world, rank, begin, count, job.op);
      case at::kInt:
        return reduce_part<std::int32_t>(slots, world, rank, begin, count, job.op);
      case at::kLong:
        return reduce_part<std::int64_t>(slots, world, rank, begin, count, job.op);
      default:
        TY_ASSERT(false, "dtype ", job.tensor.scalar_type(), " reached the shared-memory path");
    }
  }

  // Copies part p of slots[p] into `out`, for every rank p other than `skip`.
  void gather_parts(
      char* out, char* const* slots, std::size_t elems, std::size_t elem, int skip) const {
    const std::size_t part = (elems + world - 1) / world;
    for (int p = 0; p < world; ++p) {
      const std::size_t begin = std::min(elems, part * p);
      const std::size_t count = std::min(elems, begin + part) - begin;
      if (p != skip && count > 0)
        std::memcpy(out + begin * elem, slots[p] + begin * elem, count * elem);
    }
  }

  void run_allreduce(const Job& job) {
    if (job.buffer) return run_allreduce_in_place(job);
    const std::size_t elem = job.tensor.element_size();
    const std::size_t bytes = job.tensor.numel() * elem;
    auto* data = static_cast<char*>(job.tensor.data_ptr());
    char* slots[kMaxRanks];
    for (std::size_t off = 0; off < bytes; off += options.chunk_bytes, ++chunk_count) {
      const std::size_t n = std::min(options.chunk_bytes, bytes - off);
      std::memcpy(slot(rank), data + off, n);
      if (off == 0) {
        agree(job);
      } else {
        barrier();
      }
      for (int p = 0; p < world; ++p) slots[p] = slot(p);
      reduce_my_part(slots, n / elem, job);
      barrier();
      gather_parts(data + off, slots, n / elem, elem, /*skip=*/-1);
    }
  }

  static std::string reduce_op_name(std::int32_t op) {
    switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
      case c10d::ReduceOp::SUM:
        return "SUM";
      case c10d::ReduceOp::AVG:
        return "AVG";
      case c10d::ReduceOp::MIN:
        return "MIN";
      case c10d::ReduceOp::MAX:
        return "MAX";
      default:
        return detail::concat("reduce op ", op);
    }
  }

  static std::string describe(const OpStamp& op) {
    const char* kinds[] = {"an all-reduce", "a broadcast", "a barrier", "an all-gather",
                           "a reduce-scatter"};
    std::string out = op.kind < 5 ? kinds[op.kind] : "an unknown collective";
    const auto kind = static_cast<Kind>(op.kind);
    if (kind == Kind::kBarrier) return out;
    if (kind == Kind::kBroadcast)
      out += detail::concat(" from rank ", op.root);
    else if (kind != Kind::kAllGather)
      out += detail::concat(" with ", reduce_op_name(op.reduce_op));
    out += detail::concat(" of ", op.bytes, " bytes of ",
                          c10::toString(static_cast<at::ScalarType>(op.dtype)));
    if (op.buffer == 0) return out + ", staged";
    return out + detail::concat(" at offset ", op.offset, " of shared buffer ", op.buffer);
  }

  // Publishes what this rank is about to do, passes a barrier and checks that every rank does the
  // same: see Note [Collectives in place].
  void agree(const Job& job) {
    const OpStamp mine{
        .generation = generation + 1,
        .kind = static_cast<std::uint16_t>(job.kind),
        .root = static_cast<std::int16_t>(job.kind == Kind::kBroadcast ? job.root : 0),
        .reduce_op = job.kind == Kind::kAllreduce || job.kind == Kind::kReduceScatter
                         ? static_cast<std::int32_t>(job.op)
                         : 0,
        .dtype = static_cast<std::int32_t>(job.tensor.scalar_type()),
        .buffer = job.buffer ? job.buffer->id : 0,
        .offset = job.offset,
        .bytes = static_cast<std::uint64_t>(job.tensor.numel()) * job.tensor.element_size()};
    auto& stamps = header->ops[mine.generation % 2];
    stamps[rank] = mine;
    barrier();
    for (int p = 0; p < world; ++p) {
      const OpStamp theirs = stamps[p];
      if (theirs.generation == mine.generation && theirs == mine) continue;
      throw Error(detail::concat(
          "Rank ", rank, "/", world, " issued ", describe(mine), ", but rank ", p,
          theirs.generation == mine.generation ? detail::concat(" issued ", describe(theirs))
                                               : std::string(" issued another kind of collective"),
          ". HINT: every rank must issue the same collectives in the same order."));
    }
  }

  // Every rank's copy of an in-place job's tensor.
  std::vector<char*> copies_of(const Job& job) const {
    std::vector<char*> copies(static_cast<std::size_t>(world));
    for (int p = 0; p < world; ++p)
      copies[static_cast<std::size_t>(p)] = job.buffer->region(p) + job.offset;
    return copies;
  }

  void run_allreduce_in_place(const Job& job) {
    agree(job);
    const auto copies = copies_of(job);
    const std::size_t elem = job.tensor.element_size();
    const std::size_t elems = static_cast<std::size_t>(job.tensor.numel());
    reduce_my_part(copies.data(), elems, job);
    barrier();
    gather_parts(copies[static_cast<std::size_t>(rank)], copies.data(), elems, elem, rank);
    barrier();
  }

  void run_broadcast(const Job& job) {
    const std::size_t bytes = job.tensor.numel() * job.tensor.element_size();
    if (job.buffer) {
      agree(job);
      const auto copies = copies_of(job);
      if (rank != job.root && bytes > 0)
        std::memcpy(copies[static_cast<std::size_t>(rank)],
                    copies[static_cast<std::size_t>(job.root)], bytes);
      barrier();
      return;
    }
    auto* data = static_cast<char*>(job.tensor.data_ptr());
    for (std::size_t off = 0; off < bytes; off += options.chunk_bytes, ++chunk_count) {
      const std::size_t n = std::min(options.chunk_bytes, bytes - off);
      if (rank == job.root) std::memcpy(slot(job.root), data + off, n);
      if (off == 0) {
        agree(job);
      } else {
        barrier();
      }
      if (rank != job.root) std::memcpy(data + off, slot(job.root), n);
    }
  }

  // Copies a (W * n,) all-gather, in place or staged: see Note [Flat collectives in shared memory].
  void run_all_gather(const Job& job) {
    const std::size_t slot_bytes = job.other.numel() * job.other.element_size();
    auto* out = static_cast<char*>(job.tensor.data_ptr());
    const auto* in = static_cast<const char*>(job.other.data_ptr());
    char* own = out + rank * slot_bytes;
    if (in != own && slot_bytes > 0) std::memcpy(own, in, slot_bytes);
    if (job.buffer) {
      agree(job);
      const auto copies = copies_of(job);
      for (int p = 0; p < world; ++p)
        if (p != rank && slot_bytes > 0)
          std::memcpy(out + p * slot_bytes, copies[static_cast<std::size_t>(p)] + p * slot_bytes,
                      slot_bytes);
      barrier();
      return;
    }
    if (slot_bytes == 0) return agree(job);
    for (std::size_t off = 0; off < slot_bytes; off += options.chunk_bytes, ++chunk_count) {
      const std::size_t n = std::min(options.chunk_bytes, slot_bytes - off);
      std::memcpy(slot(rank), in + off, n);
      if (off == 0) {
        agree(job);
      } else {
        barrier();
      }
      for (int p = 0; p < world; ++p)
        if (p != rank) std::memcpy(out + p * slot_bytes + off, slot(p), n);
    }
  }

  // Sums (or averages) a (W * n,) reduce-scatter into this rank's (n,) output, in place or
  // staged: see Note [Flat collectives in shared memory].
  void run_reduce_scatter(const Job& job) {
    const std::size_t n = static_cast<std::size_t>(job.other.numel());
    const std::size_t elem = job.tensor.element_size();
    const auto in_type = job.tensor.scalar_type();
    const auto out_type = job.other.scalar_type();
    auto* out = static_cast<char*>(job.other.data_ptr());
    const bool avg = job.op == c10d::ReduceOp::AVG;
    std::vector<const char*> parts(static_cast<std::size_t>(world));
    if (job.buffer) {
      agree(job);
      const auto copies = copies_of(job);
      for (int p = 0; p < world; ++p)
        parts[static_cast<std::size_t>(p)] = copies[static_cast<std::size_t>(p)] + rank * n * elem;
      sum_parts(out, out_type, parts.data(), in_type, world, n, avg);
      barrier();
      return;
    }
    if (n == 0) return agree(job);
    // Each staging slot holds `world` pieces of `piece` elements, one for each rank.
    const std::size_t piece = options.chunk_bytes / (static_cast<std::size_t>(world) * elem);
    const auto* in = static_cast<const char*>(job.tensor.data_ptr());
    for (std::size_t off = 0; off < n; off += piece, ++chunk_count) {
      const std::size_t count = std::min(piece, n - off);
      for (int q = 0; q < world; ++q)
        std::memcpy(slot(rank) + q * piece * elem, in + (q * n + off) * elem, count * elem);
      if (off == 0) {
        agree(job);
      } else {
        barrier();
      }
      for (int p = 0; p < world; ++p)
        parts[static_cast<std::size_t>(p)] = slot(p) + rank * piece * elem;
      sum_parts(out + off * job.other.element_size(), out_type, parts.data(), in_type, world, count,
                avg);
    }
  }

  void serve() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return stopping || !jobs.empty(); });
        if (jobs.empty()) return;
        job = std::move(jobs.front());
        if (stopping && broken.empty())
          broken = detail::concat("Rank ", rank, "/", world,
                                  ": the shared-memory process group was destroyed with this "
                                  "collective still queued.");
        jobs.pop_front();
      }
      std::exception_ptr error;
      try {
        if (!broken.empty()) throw NetworkError(broken);
        switch (job.kind) {
          case Kind::kAllreduce:
            run_allreduce(job);
            break;
          case Kind::kBroadcast:
            run_broadcast(job);
            break;
          case Kind::kAllGather:
            run_all_gather(job);
            break;
          case Kind::kReduceScatter:
            run_reduce_scatter(job);
            break;
          case Kind::kBarrier:
            // Orders after every queued shared-memory collective, then after Gloo's.
            agree(job);
            inner->barrier()->wait();
            break;
        }
      } catch (const std::exception& e) {
        if (broken.empty()) broken = e.what();
        error = std::current_exception();
      } catch (...) {
        if (broken.empty()) broken = "unknown error in a shared-memory collective";
        error = std::current_exception();
      }
      job.work->complete(error);
    }
  }

  // The allocate_shared() buffer whose region of this rank holds all of `t`, if any.
  void find_buffer(const at::Tensor& t, Job& job) {
    const char* begin = static_cast<const char*>(t.data_ptr());
    const std::size_t bytes = t.numel() * t.element_size();
    std::lock_guard<std::mutex> lock(buffers_mutex);
    for (const auto& weak : buffers) {
      auto buffer = weak.lock();
      if (!buffer) continue;
      const char* region = buffer->region(rank);
      if (begin >= region && begin + bytes <= region + buffer->region_bytes) {
        job.buffer = std::move(buffer);
        job.offset = static_cast<std::size_t>(begin - region);
        return;
      }
    }
  }

  c10::intrusive_ptr<c10d::Work> enqueue(Job job, c10d::OpType type) {
    find_buffer(job.tensor, job);
    job.work = c10::make_intrusive<ShmWork>(
        job.kind == Kind::kReduceScatter ? job.other : job.tensor, type);
    auto work = job.work;
    {
      std::lock_guard<std::mutex> lock(mutex);
      jobs.push_back(std::move(job));
    }
    changed.notify_one();
    return work;
  }
};

ShmProcessGroup::ShmProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                 int rank,
                                 int size,
                                 c10::intrusive_ptr<c10d::ProcessGroup> inner,
                                 ShmOptions options)
    : c10d::ProcessGroup(rank, size), impl_(std::make_unique<Impl>()), inner_(std::move(inner)) {
  TY_CHECK(size >= 1 && size <= kMaxRanks, "ShmProcessGroup supports 1 to ", kMaxRanks,
           " ranks, got ", size, ".");
  TY_CHECK(options.chunk_bytes >= 4096 && options.chunk_bytes % 64 == 0,
           "ShmOptions.chunk_bytes must be a multiple of 64 and >= 4096, got ", options.chunk_bytes,
           ".");
  auto& s = *impl_;
  s.rank = rank;
  s.world = size;
  s.options = options;
  s.inner = inner_.get();
  s.mapped_bytes = kHeaderBytes + 2 * static_cast<std::size_t>(size) * options.chunk_bytes;
  // Each rank counts the groups it made with this name; ranks make groups in the same order, so
  // the count names this group's keys alike everywhere and never reuses an old group's keys.
  const std::string base_key = "trainyard/shm/" + options.name + "/";
  const auto instance = store->add(base_key + "instances/" + std::to_string(rank), 1);
  const std::string prefix = base_key + std::to_string(instance) + "/";

  auto mapped =
      map_group_segment(*store, prefix, rank, size, s.mapped_bytes, [&](void* base) -> std::string {
        auto* header = static_cast<Header*>(base);
        if (rank == 0) {
          header->world_size = static_cast<std::uint32_t>(size);
          header->chunk_bytes = options.chunk_bytes;
          header->magic = kMagic;
        } else if (header->magic != kMagic ||
                   header->world_size != static_cast<std::uint32_t>(size) ||
                   header->chunk_bytes != options.chunk_bytes) {
          return detail::concat("the segment was made for ", header->world_size, " ranks and ",
                                header->chunk_bytes, "-byte chunks; this rank expects ", size,
                                " and ", options.chunk_bytes);
        }
        header->pids[rank] = ::getpid();
        return "";
      });
  s.segment = std::move(mapped.segment);
  s.base = s.segment->base;
  s.header = static_cast<Header*>(s.base);
  s.check_pids = mapped.same_pid_namespace;
  s.store = store;
  s.prefix = prefix;
  s.worker = std::thread([&s] { s.serve(); });
}

ShmProcessGroup::~ShmProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->stop_waiting = true;  // a barrier in progress gives up; queued jobs fail fast
  impl_->changed.notify_all();
  if (impl_->worker.joinable()) impl_->worker.join();
}

at::Tensor ShmProcessGroup::allocate_shared(std::int64_t numel, at::ScalarType dtype) {
  TY_CHECK(numel >= 0, "allocate_shared: numel must be >= 0, got ", numel, ".");
  auto& s = *impl_;
  const std::size_t bytes = static_cast<std::size_t>(numel) * c10::elementSize(dtype);
  auto buffer = std::make_shared<SharedBuffer>();
  buffer->region_bytes = std::max<std::size_t>(4096, (bytes + 4095) / 4096 * 4096);
  {
    std::lock_guard<std::mutex> lock(s.buffers_mutex);
    buffer->id = ++s.buffer_count;
  }
  auto mapped = map_group_segment(*s.store, detail::concat(s.prefix, "buffer/", buffer->id, "/"),
                                  s.rank, s.world, buffer->region_bytes * s.world,
                                  [](void*) { return std::string(); });
  buffer->segment = std::move(mapped.segment);
  {
    std::lock_guard<std::mutex> lock(s.buffers_mutex);
    std::erase_if(s.buffers, [](const auto& b) { return b.expired(); });
    s.buffers.push_back(buffer);
  }
  // The tensor keeps the mapping alive, also after this group is gone.
  auto tensor = at::from_blob(
      buffer->region(s.rank), {numel}, [buffer](void*) {}, at::TensorOptions().dtype(dtype));
  return tensor.zero_();
}

namespace {
bool shm_eligible(const std::vector<at::Tensor>& tensors) {
  if (tensors.size() != 1) return false;
  const auto& t = tensors[0];
  return t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() &&
         !t.is_complex() && t.element_size() <= 8;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const auto op = opts.reduceOp.op_;
  if (!shm_eligible(tensors)) return inner_->allreduce(tensors, opts);
  const auto dtype = tensors[0].scalar_type();
  const bool floating = dtype == at::kFloat || dtype == at::kDouble;
  const bool supported = (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::MIN ||
                          op == c10d::ReduceOp::MAX || (op == c10d::ReduceOp::AVG && floating)) &&
                         (floating || dtype == at::kInt || dtype == at::kLong);
  if (!supported) return inner_->allreduce(tensors, opts);
  return impl_->enqueue(Impl::Job{.tensor = tensors[0], .op = op}, c10d::OpType::ALLREDUCE);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  if (!shm_eligible(tensors) || opts.rootTensor != 0) return inner_->broadcast(tensors, opts);
  TY_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "broadcast root ", opts.rootRank,
           " is outside [0, ", getSize(), ").");
  return impl_->enqueue(Impl::Job{.kind = Impl::Kind::kBroadcast,
                                  .tensor = tensors[0],
                                  .root = static_cast<int>(opts.rootRank)},
                        c10d::OpType::BROADCAST);
}

namespace {
// A flat collective's pair: input (n,) and output (W * n,) for an all-gather, or the other way
// round for a reduce-scatter. `small` may be `big`'s slot `rank`, and must not overlap it
// otherwise.
void check_flat(
    const at::Tensor& big, const at::Tensor& small, int rank, int world, const char* what) {
  TY_CHECK(big.numel() == small.numel() * world, what, ": the flat tensor has ", big.numel(),
           " elements; with ", world, " ranks and a slot of ", small.numel(), " it must have ",
           small.numel() * world, ".");
  const auto* b = static_cast<const char*>(big.data_ptr());
  const auto* s = static_cast<const char*>(small.data_ptr());
  const std::size_t big_bytes = big.numel() * big.element_size();
  const std::size_t small_bytes = small.numel() * small.element_size();
  const bool own_slot = big.scalar_type() == small.scalar_type() &&
                        s == b + static_cast<std::size_t>(rank) * small_bytes;
  const bool disjoint = s + small_bytes <= b || b + big_bytes <= s;
  TY_CHECK(own_slot || disjoint || small_bytes == 0, what,
           ": the slot tensor overlaps the flat one other than as rank ", rank, "'s own slot.");
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::all_gather_single(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  if (!shm_eligible({output}) || !shm_eligible({input}) ||
      output.scalar_type() != input.scalar_type())
    return inner_->all_gather_single(output, input, opts);
  check_flat(output, input, getRank(), getSize(), "all-gather");
  return impl_->enqueue(Impl::Job{.kind = Impl::Kind::kAllGather, .tensor = output, .other = input},
                        c10d::OpType::_ALLGATHER_BASE);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::reduce_scatter_single(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const auto op = opts.reduceOp.op_;
  const auto floating = [](const at::Tensor& t) {
    return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
  };
  if (!shm_eligible({output}) || !shm_eligible({input}) || !floating(output) || !floating(input) ||
      (op != c10d::ReduceOp::SUM && op != c10d::ReduceOp::AVG))
    return inner_->reduce_scatter_single(output, input, opts);
  check_flat(input, output, getRank(), getSize(), "reduce-scatter");
  return impl_->enqueue(
      Impl::Job{.kind = Impl::Kind::kReduceScatter, .tensor = input, .other = output, .op = op},
      c10d::OpType::_REDUCE_SCATTER_BASE);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return inner_->allreduce_coalesced(tensors, opts);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  return inner_->reduce(tensors, opts);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_->allgather(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return inner_->gather(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return inner_->scatter(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return inner_->reduce_scatter(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::all_to_all_single(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes,
    const c10d::AllToAllOptions& opts) {
  return inner_->all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::send(std::vector<at::Tensor>& tensors,
                                                     int dst_rank,
                                                     int tag) {
  return inner_->send(tensors, dst_rank, tag);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::recv(std::vector<at::Tensor>& tensors,
                                                     int src_rank,
                                                     int tag) {
  return inner_->recv(tensors, src_rank, tag);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::barrier(const c10d::BarrierOptions& /*opts*/) {
  return impl_->enqueue(Impl::Job{.kind = Impl::Kind::kBarrier, .tensor = at::empty({0})},
                        c10d::OpType::BARRIER);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_->allgather_coalesced(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  return inner_->alltoall(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  return inner_->recvAnysource(tensors, tag);
}
void ShmProcessGroup::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  inner_->monitoredBarrier(opts, wait_all_ranks);
}

c10::intrusive_ptr<c10d::ProcessGroup> make_local_group(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    c10::intrusive_ptr<c10d::ProcessGroup> inner,
    ShmOptions options) {
  try {
    return c10::make_intrusive<ShmProcessGroup>(store, rank, size, inner, std::move(options));
  } catch (const Error& e) {
    logger("comm")->warn("{}; using Gloo for every collective.", e.what());
    return inner;
  }
}

at::Tensor allocate_collective_buffer(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                      std::int64_t numel,
                                      const at::TensorOptions& options) {
  auto* shm = dynamic_cast<ShmProcessGroup*>(group.get());
  if (shm != nullptr && options.device().is_cpu() && options.layout() == at::kStrided) {
    try {
      return shm->allocate_shared(numel, c10::typeMetaToScalarType(options.dtype()));
    } catch (const InvalidArgumentError&) {
      throw;  // the ranks asked for different sizes: a bug to report, not to work around
    } catch (const Error& e) {
      logger("comm")->warn("{}; this buffer's collectives are staged through the segment.",
                           e.what());
    }
  }
  return at::zeros({numel}, options);
}

}  // namespace trainyard
