// A shared-memory segment that every rank of a group maps, set up collectively through a c10d
// store: what ShmProcessGroup's staging segment and allocate_shared() buffers are made of.
// Private to src/comm.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace trainyard {

// A shared-memory mapping, unmapped when its last user lets go.
struct SharedSegment {
  void* base = nullptr;
  std::size_t bytes = 0;
  SharedSegment() = default;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment();
};

struct MappedSegment {
  std::shared_ptr<SharedSegment> segment;
  bool same_pid_namespace = true;  // every rank's pids mean something in this process
};

// Collective over `store`, keys under `prefix`: rank 0 creates a `bytes`-long segment in /dev/shm
// and runs `prepare` on it before publishing its name; every other rank maps it and runs
// `prepare` (to check it). `prepare` returns "" or what is wrong. The name is unlinked once every
// rank has reported, so nothing is left in /dev/shm. On every rank, throws Error naming the first
// rank that failed (InvalidArgumentError when the ranks disagree on `bytes`).
MappedSegment map_group_segment(c10d::Store& store,
                                const std::string& prefix,
                                int rank,
                                int size,
                                std::size_t bytes,
                                const std::function<std::string(void* base)>& prepare);

}  // namespace trainyard
