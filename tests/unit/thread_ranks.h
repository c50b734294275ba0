// Ranks as threads for unit tests: each thread gets a real Gloo process group over one in-memory
// c10d::HashStore, optionally wrapped in a ShmProcessGroup. The first rank's error is rethrown.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "trainyard/comm/process_group.h"
#include "trainyard/comm/shm_process_group.h"

namespace trainyard::testing {

struct ThreadRankOptions {
  std::chrono::milliseconds timeout = std::chrono::seconds(20);
  bool shm = false;                    // wrap the Gloo group in a ShmProcessGroup
  std::size_t shm_chunk_bytes = 4096;  // tiny chunks, so tensors span many of them
};

inline void run_thread_ranks(
    int world,
    const std::function<void(int rank, c10::intrusive_ptr<c10d::ProcessGroup> group)>& fn,
    ThreadRankOptions options = {}) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  // Every rank keeps its group until all are done: a rank whose body ends at once (an argument
  // check that throws before any collective) would otherwise close its Gloo pairs while a slower
  // rank is still connecting to it ("Connection closed by peer").
  std::latch all_done(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      c10::intrusive_ptr<c10d::ProcessGroup> pg;
      try {
        pg = make_gloo_group(store, r, world, InitOptions{.timeout = options.timeout});
        if (options.shm) {
          pg = c10::make_intrusive<ShmProcessGroup>(
              store, r, world, pg,
              ShmOptions{.chunk_bytes = options.shm_chunk_bytes, .timeout = options.timeout});
        }
        fn(r, pg);
      } catch (...) {
        errors[r] = std::current_exception();
      }
      all_done.arrive_and_wait();
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace trainyard::testing
