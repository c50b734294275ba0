#include "trainyard/memory/caching_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace trainyard::memory {

// Note [Caching CPU allocator]
// A training step allocates and frees the same large tensors every step: activations and their
// gradients, the logits, FSDP's gathered parameters and flat gradients, from a megabyte to a
// quarter of a gigabyte each. glibc serves them badly either way. With its defaults each is a
// fresh mmap whose every page is faulted in again each step (~15 us a page on these VMs: pythia-
// 70m FULL_SHARD trains 2-3x slower). Told to keep freed memory in the heap instead (mallopt
// M_MMAP_MAX 0, what init() did before this allocator), the heap fragments: a freed 200 MB hole
// is split by smaller requests and the next step's tensor no longer fits, so the heap grows step
// after step while the bytes in use stay flat (pythia-70m FULL_SHARD fp32: RSS 2.3, 3.0, 3.0,
// 3.4, 3.6 GiB over 7 steps, +587 MiB from step 1 to 5, against +2 MiB with this allocator;
// docs/BENCHMARKS.md, "Memory").
// So requests of kCachedMinBytes or more get blocks of their size class (an eighth of a power of
// two: at most 12.5% larger, and the tail a tensor does not use is never touched, so it costs no
// RSS), mapped once and kept: a freed block waits for the next request of its class. The sizes
// repeat from step to step, so after the first step nothing is mapped or faulted; and a block
// only ever serves its class, so nothing fragments. The cost is that memory one class frees is
// not lent to another. That is bounded: before mapping a new block, idle blocks of other classes
// (the largest first) are unmapped until mapped memory stays within 5/4 of the peak in use plus
// kCacheSlackBytes. A class whose block was shed and is then needed again is one the workload
// uses every step (a step's classes can add up to more than its peak in use: a class's blocks
// are not lent to another); shedding it again would cost its page faults every step, so the
// bound grows by its size, once per such remap. A workload whose sizes keep changing never
// remaps a class, so it maps and unmaps (at glibc's cost) but never holds much more than it
// ever used. Smaller requests go to c10's own allocator
// (glibc's heap, which reuses them well). Every block is freed through one function that looks
// its pointer up, so raw_allocate()/raw_deallocate() work as LibTorch expects.

namespace {

struct Cache {
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> idle;  // size class -> blocks
  std::unordered_map<void*, std::size_t> live;               // block -> size class
  std::unordered_set<std::size_t> shed_classes;  // classes whose idle blocks were unmapped
  CacheStats stats;
};

Cache& cache() {
  static auto* c = new Cache();  // never destroyed: blocks may be freed during exit
  return *c;
}

void unmap_all(const std::vector<std::pair<void*, std::size_t>>& blocks) {
  for (auto& [ptr, size] : blocks) munmap(ptr, size);
}

// Unmaps idle blocks, largest first, until mapping `want` more keeps within `limit` (or none is
// left). Called with the lock held; the blocks to unmap are returned, to unmap after unlocking.
std::vector<std::pair<void*, std::size_t>> shed_idle(Cache& c,
                                                     std::size_t want,
                                                     std::size_t limit) {
  std::vector<std::pair<void*, std::size_t>> out;
  while (c.stats.mapped_bytes + want > limit && c.stats.idle_bytes > 0) {
    auto largest = c.idle.end();
    for (auto it = c.idle.begin(); it != c.idle.end(); ++it)
      if (!it->second.empty() && (largest == c.idle.end() || it->first > largest->first))
        largest = it;
    if (largest == c.idle.end()) break;
    c.shed_classes.insert(largest->first);
    out.emplace_back(largest->second.back(), largest->first);
    largest->second.pop_back();
    c.stats.idle_bytes -= largest->first;
    c.stats.mapped_bytes -= largest->first;
    ++c.stats.unmaps;
  }
  return out;
}

void* take(std::size_t size) {
  auto& c = cache();
  std::vector<std::pair<void*, std::size_t>> shed;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.idle.find(size);
    if (it != c.idle.end() && !it->second.empty()) {
      void* ptr = it->second.back();
      it->second.pop_back();
      c.stats.idle_bytes -= size;
      c.stats.in_use_bytes += size;
      c.stats.peak_in_use_bytes = std::max(c.stats.peak_in_use_bytes, c.stats.in_use_bytes);
      ++c.stats.reuses;
      c.live.emplace(ptr, size);
      return ptr;
    }
    // A class shed before and needed again: the workload uses it every step, and shedding it
    // would cost its page faults every step. Allow its size beyond the bound from now on.
    if (c.shed_classes.erase(size) > 0) c.stats.learnt_bytes += size;
    const auto peak = std::max(c.stats.peak_in_use_bytes, c.stats.in_use_bytes + size);
    shed = shed_idle(c, size, peak + peak / 4 + kCacheSlackBytes + c.stats.learnt_bytes);
  }
  unmap_all(shed);
  void* ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ptr == MAP_FAILED) {  // out of memory: give back every idle block and try once more
    {
      std::lock_guard<std::mutex> lock(c.mutex);
      shed = shed_idle(c, size, 0);
    }
    unmap_all(shed);
    ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  TORCH_CHECK(ptr != MAP_FAILED, "trainyard's CPU allocator: mapping ", size,
              " bytes failed: ", std::strerror(errno),
              ". HINT: the process is out of memory; use a smaller batch, shard over more ranks, "
              "or enable activation checkpointing.");
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats.mapped_bytes += size;
  c.stats.peak_mapped_bytes = std::max(c.stats.peak_mapped_bytes, c.stats.mapped_bytes);
  c.stats.in_use_bytes += size;
  c.stats.peak_in_use_bytes = std::max(c.stats.peak_in_use_bytes, c.stats.in_use_bytes);
  ++c.stats.maps;
  c.live.emplace(ptr, size);
  return ptr;
}

// Frees any pointer this allocator handed out: a cached block goes back to its class, anything
// else (a small request) to c10.
void give_back(void* ptr) {
  if (ptr == nullptr) return;
  auto& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.live.find(ptr);
    if (it != c.live.end()) {
      const auto size = it->second;
      c.live.erase(it);
      c.idle[size].push_back(ptr);
      c.stats.in_use_bytes -= size;
      c.stats.idle_bytes += size;
      return;
    }
  }
  c10::free_cpu(ptr);
}

c10::DataPtr allocate_cached(std::size_t nbytes) {
  if (nbytes < kCachedMinBytes) {
    void* ptr = c10::alloc_cpu(nbytes);
    return {ptr, ptr, &c10::free_cpu, c10::Device(c10::DeviceType::CPU)};
  }
  void* ptr = take(cache_size_class(nbytes));
  return {ptr, ptr, &give_back, c10::Device(c10::DeviceType::CPU)};
}

class CachingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t nbytes) override {
    return allocate_cached(nbytes);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &give_back;
  }
};

CachingAllocator* const g_allocator = new CachingAllocator();  // never destroyed, as cache()
std::atomic<bool> g_installed{false};

}  // namespace

std::size_t cache_size_class(std::size_t nbytes) {
  static const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t octave = std::bit_floor(std::max(nbytes, std::size_t{8}));
  const std::size_t step = std::max(octave / 8, page);
  return (nbytes + step - 1) / step * step;
}

c10::Allocator* caching_allocator() {
  return g_allocator;
}

void install_caching_allocator() {
  if (g_installed.exchange(true)) return;
  c10::SetCPUAllocator(g_allocator, /*priority=*/1);  // above c10's default (0)
}

bool caching_allocator_installed() {
  return g_installed.load();
}

void release_idle_blocks() {
  auto& c = cache();
  std::vector<std::pair<void*, std::size_t>> blocks;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    for (auto& [size, ptrs] : c.idle) {
      for (void* ptr : ptrs) blocks.emplace_back(ptr, size);
      c.stats.idle_bytes -= size * ptrs.size();
      c.stats.mapped_bytes -= size * ptrs.size();
      c.stats.unmaps += ptrs.size();
      ptrs.clear();
    }
  }
  unmap_all(blocks);
}

CacheStats cache_stats() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

}  // namespace trainyard::memory
