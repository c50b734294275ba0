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
#include <mutex>
#include <random>
#include <thread>

#include "trainyard/error.h"
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

namespace {

constexpr int kMaxRanks = 64;
constexpr std::uint32_t kMagic = 0x7459534d;  // "tYSM"
constexpr int kSpins = 2000;
constexpr auto kSlice = std::chrono::milliseconds(50);

struct alignas(64) Counter {
  std::atomic<std::uint32_t> value;
};

struct Header {
  std::uint32_t magic;
  std::uint32_t world_size;
  std::uint64_t chunk_bytes;
  Counter arrived[kMaxRanks];
  std::int32_t pids[kMaxRanks];
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

std::string pid_namespace() {
  char buf[64] = {};
  ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

std::string store_get_string(c10d::Store& store, const std::string& key) {
  auto v = store.get(key);
  return std::string(v.begin(), v.end());
}

void store_set_string(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
}

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
  enum class Kind { kAllreduce, kBroadcast, kBarrier };
  struct Job {
    Kind kind = Kind::kAllreduce;
    at::Tensor tensor;
    c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM;
    int root = 0;
    c10::intrusive_ptr<ShmWork> work;
  };

  int rank = 0;
  int world = 1;
  ShmOptions options;
  std::string segment_name;
  void* base = nullptr;
  std::size_t mapped_bytes = 0;
  Header* header = nullptr;
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

  void run_allreduce(const Job& job) {
    const std::size_t elem = job.tensor.element_size();
    const std::size_t bytes = job.tensor.numel() * elem;
    auto* data = static_cast<char*>(job.tensor.data_ptr());
    for (std::size_t off = 0; off < bytes; off += options.chunk_bytes, ++chunk_count) {
      const std::size_t n = std::min(options.chunk_bytes, bytes - off);
      std::memcpy(slot(rank), data + off, n);
      barrier();
      const std::size_t elems = n / elem;
      const std::size_t part = (elems + world - 1) / world;
      const std::size_t begin = std::min(elems, part * rank);
      const std::size_t count = std::min(elems, begin + part) - begin;
      if (count > 0) {
        char* slots[kMaxRanks];
        for (int p = 0; p < world; ++p) slots[p] = slot(p);
        switch (job.tensor.scalar_type()) {
          case at::kFloat:
            reduce_part<float>(slots, world, rank, begin, count, job.op);
            break;
          case at::kDouble:
            reduce_part<double>(slots, world, rank, begin, count, job.op);
            break;
          case at::kInt:
            reduce_part<std::int32_t>(slots, world, rank, begin, count, job.op);
            break;
          case at::kLong:
            reduce_part<std::int64_t>(slots, world, rank, begin, count, job.op);
            break;
          default:
            TY_ASSERT(false, "dtype ", job.tensor.scalar_type(), " reached the shared-memory path");
        }
      }
      barrier();
      for (int p = 0; p < world; ++p) {
        const std::size_t pb = std::min(elems, part * p);
        const std::size_t pc = std::min(elems, pb + part) - pb;
        if (pc > 0) std::memcpy(data + off + pb * elem, slot(p) + pb * elem, pc * elem);
      }
    }
  }

  void run_broadcast(const Job& job) {
    const std::size_t bytes = job.tensor.numel() * job.tensor.element_size();
    auto* data = static_cast<char*>(job.tensor.data_ptr());
    for (std::size_t off = 0; off < bytes; off += options.chunk_bytes, ++chunk_count) {
      const std::size_t n = std::min(options.chunk_bytes, bytes - off);
      if (rank == job.root) std::memcpy(slot(job.root), data + off, n);
      barrier();
      if (rank != job.root) std::memcpy(data + off, slot(job.root), n);
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
          case Kind::kBarrier:
            // Orders after every queued shared-memory collective, then after Gloo's.
            barrier();
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

  c10::intrusive_ptr<c10d::Work> enqueue(Job job, c10d::OpType type) {
    job.work = c10::make_intrusive<ShmWork>(job.tensor, type);
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

  // Rank 0 creates the segment and publishes its name; everyone maps it and reports.
  std::string failure;
  int fd = -1;
  bool created = false;
  auto fail = [&](const std::string& what) {
    if (failure.empty()) failure = what;
  };
  auto map_segment = [&] {
    s.base = ::mmap(nullptr, s.mapped_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s.base == MAP_FAILED) {
      s.base = nullptr;
      fail(detail::concat("cannot map ", s.segment_name, ": ", std::strerror(errno)));
    } else {
      s.header = static_cast<Header*>(s.base);
    }
  };
  try {
    if (rank == 0) {
      std::random_device rd;
      s.segment_name = detail::concat("/trainyard-", ::getpid(), "-", std::hex, rd(), rd());
      fd = ::shm_open(s.segment_name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
      created = fd >= 0;
      if (fd < 0)
        fail(detail::concat("cannot create ", s.segment_name, ": ", std::strerror(errno)));
      // Reserve the pages now: a sparse segment on a full /dev/shm would SIGBUS mid-collective.
      const int rc = fd >= 0 ? ::posix_fallocate(fd, 0, static_cast<off_t>(s.mapped_bytes)) : 0;
      if (rc != 0)
        fail(detail::concat("cannot reserve ", s.mapped_bytes >> 20, " MiB in /dev/shm: ",
                            std::strerror(rc), " (a small /dev/shm, as in a container?)"));
      if (failure.empty()) map_segment();
      if (s.header != nullptr) {
        s.header->world_size = static_cast<std::uint32_t>(size);
        s.header->chunk_bytes = options.chunk_bytes;
        s.header->magic = kMagic;
      }
      // The store's round trip orders these header writes before the other ranks' reads.
      store_set_string(*store, prefix + "segment", failure.empty() ? s.segment_name : "");
    } else {
      s.segment_name = store_get_string(*store, prefix + "segment");
      if (s.segment_name.empty()) fail("rank 0 could not create the segment");
      if (failure.empty()) fd = ::shm_open(s.segment_name.c_str(), O_RDWR | O_CLOEXEC, 0600);
      if (failure.empty() && fd < 0)
        fail(detail::concat("cannot open ", s.segment_name, ": ", std::strerror(errno),
                            " (is this rank on another host?)"));
      struct stat st {};
      if (failure.empty() &&
          (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != s.mapped_bytes))
        fail(detail::concat("segment ", s.segment_name, " holds ", st.st_size, " bytes, expected ",
                            s.mapped_bytes, " (ranks disagree on world size or chunk_bytes)"));
      if (failure.empty()) map_segment();
      if (s.header != nullptr &&
          (s.header->magic != kMagic || s.header->world_size != static_cast<std::uint32_t>(size) ||
           s.header->chunk_bytes != options.chunk_bytes))
        fail(detail::concat("segment ", s.segment_name, " was made for ", s.header->world_size,
                            " ranks and ", s.header->chunk_bytes,
                            "-byte chunks; this rank expects ", size, " and ",
                            options.chunk_bytes));
    }
    if (fd >= 0) ::close(fd);
    fd = -1;
    if (s.header != nullptr) s.header->pids[rank] = ::getpid();
    store_set_string(*store, prefix + "ok/" + std::to_string(rank),
                     failure.empty() ? "1" + pid_namespace() : "0" + failure);

    std::string first_failure;
    s.check_pids = true;
    const std::string mine = "1" + pid_namespace();
    for (int r = 0; r < size; ++r) {
      auto v = store_get_string(*store, prefix + "ok/" + std::to_string(r));
      if (v.empty() || v[0] != '1') {
        if (first_failure.empty()) first_failure = detail::concat("rank ", r, ": ", v.substr(1));
      } else if (v != mine) {
        s.check_pids = false;  // another pid namespace: pids say nothing about liveness here
      }
    }
    if (created) ::shm_unlink(s.segment_name.c_str());  // every rank has it mapped, or failed
    created = false;
    if (!first_failure.empty())
      throw Error("Shared-memory process group unavailable: " + first_failure);
  } catch (...) {
    // Nothing outlives a failed constructor: no descriptor, no mapping, no name in /dev/shm.
    if (fd >= 0) ::close(fd);
    if (created) ::shm_unlink(s.segment_name.c_str());
    if (s.base != nullptr) ::munmap(s.base, s.mapped_bytes);
    s.base = nullptr;
    throw;
  }
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
  if (impl_->base != nullptr) ::munmap(impl_->base, impl_->mapped_bytes);
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
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::alltoall_base(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes,
    const c10d::AllToAllOptions& opts) {
  return inner_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
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
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return inner_->_allgather_base(output, input, opts);
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

}  // namespace trainyard
