#include "buffer_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace trainyard::fsdp {

// Note [FSDP buffer pool]
// Every step FSDP allocates and frees the same large buffers: each unit's gathered parameters
// (twice under FULL_SHARD), its flat gradient and its reduce-scatter output, from megabytes to a
// quarter of a gigabyte each. Through malloc they fare badly either way. With glibc's defaults
// each is a fresh mmap, and its every page is faulted in again each step (~15 us a page on these
// VMs: Note [Reusing freed memory] in src/comm/process_group.cpp). With freed memory kept in the
// heap, as init() sets it, the heap fragments: the buffers interleave with the optimizer state and
// LibTorch's temporaries, a freed 200 MB hole gets split by smaller requests, and the next step's
// buffer no longer fits, so the heap grows by gigabytes over the first steps while the bytes in
// use stay flat (pythia-410m: 3.2 GiB in use in a 5.9 GiB heap). So FSDP maps its buffers itself
// and keeps returned blocks for reuse: the sizes repeat exactly from step to step (one per distinct
// unit size and dtype), so a step after the first maps nothing and faults nothing. A block is
// reused for a request of at least 7/8 of its size; idle blocks beyond the limit (set from the
// largest units, so the working set of limit_all_gathers and Note [Settling reductions] fits) are
// unmapped. The blocks are freed by the last DataPtr, which shares ownership of the pool, so a
// tensor that outlives FSDP (a gradient) stays valid.
struct BufferPool::Impl {
  explicit Impl(std::size_t limit) : idle_limit(limit) {}
  ~Impl() {
    for (auto& [size, ptr] : idle) munmap(ptr, size);
  }

  std::mutex mutex;
  std::size_t idle_limit;
  std::multimap<std::size_t, void*> idle;  // block size -> block
  BufferPoolStats stats;
};

namespace {

struct Lease {
  std::shared_ptr<BufferPool::Impl> pool;
  void* ptr;
  std::size_t size;  // the block's, a multiple of the page size
};

std::size_t page_rounded(std::size_t n) {
  static const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return std::max<std::size_t>(n + page - 1, page) / page * page;
}

void give_back(void* ctx) {
  std::unique_ptr<Lease> lease(static_cast<Lease*>(ctx));
  auto& impl = *lease->pool;
  {
    std::lock_guard<std::mutex> lock(impl.mutex);
    if (impl.stats.idle_bytes + lease->size <= impl.idle_limit) {
      impl.idle.emplace(lease->size, lease->ptr);
      impl.stats.idle_bytes += lease->size;
      return;
    }
    impl.stats.mapped_bytes -= lease->size;
  }
  munmap(lease->ptr, lease->size);
}

}  // namespace

BufferPool::BufferPool(std::size_t idle_limit) : impl_(std::make_shared<Impl>(idle_limit)) {}

void BufferPool::set_idle_limit(std::size_t idle_limit) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->idle_limit = idle_limit;
}

BufferPoolStats BufferPool::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stats;
}

at::DataPtr BufferPool::take(std::size_t nbytes) {
  const std::size_t want = page_rounded(nbytes);
  void* ptr = nullptr;
  std::size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    ++impl_->stats.takes;
    // The smallest idle block that fits, if the request fills at least 7/8 of it.
    auto it = impl_->idle.lower_bound(want);
    if (it != impl_->idle.end() && want >= it->first - it->first / 8) {
      size = it->first;
      ptr = it->second;
      impl_->idle.erase(it);
      impl_->stats.idle_bytes -= size;
      ++impl_->stats.reuses;
    }
  }
  if (ptr == nullptr) {
    size = want;
    ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(ptr != MAP_FAILED, "FSDP buffer pool: mapping ", size,
                " bytes failed: ", std::strerror(errno),
                ". HINT: the rank is out of memory; shard over more ranks or use a smaller "
                "--batch-size.");
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stats.mapped_bytes += size;
    impl_->stats.peak_mapped_bytes =
        std::max(impl_->stats.peak_mapped_bytes, impl_->stats.mapped_bytes);
  }
  auto* lease = new Lease{impl_, ptr, size};
  return at::DataPtr(ptr, lease, &give_back, c10::Device(c10::kCPU));
}

}  // namespace trainyard::fsdp
