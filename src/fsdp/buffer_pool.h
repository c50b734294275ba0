// Memory for FSDP's per-step buffers (gathered parameters, flat gradients, reduction outputs);
// not public. See Note [FSDP buffer pool] in buffer_pool.cpp.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <memory>

namespace trainyard::fsdp {

struct BufferPoolStats {
  std::size_t mapped_bytes = 0;       // blocks the pool holds, in use or idle
  std::size_t peak_mapped_bytes = 0;  // largest mapped_bytes so far
  std::size_t idle_bytes = 0;         // blocks waiting to be reused
  std::size_t takes = 0;              // blocks handed out
  std::size_t reuses = 0;             // of them, blocks handed out again without mapping memory
};

class BufferPool {
 public:
  // Keeps at most `idle_limit` bytes of returned blocks for reuse; beyond it a returned block
  // is unmapped.
  explicit BufferPool(std::size_t idle_limit);

  // `nbytes` of page-aligned memory, not zeroed. Dropping the DataPtr (on any thread, also
  // after the pool object is gone) gives the block back. Throws c10::Error when the system has
  // no memory left.
  at::DataPtr take(std::size_t nbytes);

  void set_idle_limit(std::size_t idle_limit);
  BufferPoolStats stats() const;

  struct Impl;  // shared with the blocks handed out

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace trainyard::fsdp
