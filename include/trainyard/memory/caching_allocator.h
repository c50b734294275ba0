// trainyard's caching CPU allocator: large blocks mapped once and reused by size class, so a
// training step faults in no fresh pages and the heap does not fragment. See Note [Caching CPU
// allocator] in src/memory/caching_allocator.cpp.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>

namespace trainyard::memory {

// Requests of at least this many bytes come from the cache; smaller ones from c10's allocator.
constexpr std::size_t kCachedMinBytes = std::size_t{1} << 20;
// Idle blocks are unmapped rather than let mapped memory exceed 5/4 of the peak in use plus this
// (and plus what the cache learnt the workload needs every step: Note [Caching CPU allocator]).
constexpr std::size_t kCacheSlackBytes = std::size_t{64} << 20;

struct CacheStats {
  std::size_t mapped_bytes = 0;       // blocks held, in use or idle
  std::size_t peak_mapped_bytes = 0;  // largest mapped_bytes so far
  std::size_t in_use_bytes = 0;       // blocks handed out and not yet given back
  std::size_t peak_in_use_bytes = 0;
  std::size_t idle_bytes = 0;    // blocks waiting for a request of their size class
  std::size_t maps = 0;          // blocks mapped
  std::size_t reuses = 0;        // requests served from an idle block
  std::size_t unmaps = 0;        // idle blocks unmapped to stay within the bound
  std::size_t learnt_bytes = 0;  // the bound's growth for classes needed again after a shed
};

// The process's caching allocator (one per process, never destroyed: blocks may be freed at any
// time, on any thread). Usable directly, as FSDP does for its buffers, whether or not it is
// LibTorch's CPU allocator.
c10::Allocator* caching_allocator();

// Makes caching_allocator() LibTorch's CPU allocator (c10::SetCPUAllocator), for every tensor
// allocated afterwards; tensors allocated before keep their own deleters. Idempotent.
void install_caching_allocator();
bool caching_allocator_installed();

CacheStats cache_stats();

// Unmaps every idle block, returning its memory to the system: for buffers a phase that is over
// needed (FSDP's construction builds each unit's full fp32 values once) and the steps to come
// will not. Thread-safe.
void release_idle_blocks();

// The block size a request of `nbytes` (>= kCachedMinBytes) gets: rounded up to an eighth of its
// power of two, and to whole pages.
std::size_t cache_size_class(std::size_t nbytes);

}  // namespace trainyard::memory
