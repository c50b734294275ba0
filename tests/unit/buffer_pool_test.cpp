// FSDP's buffer pool (Note [FSDP buffer pool]): blocks come back for reuse, the idle limit
// unmaps the rest, and a block outlives the pool object that handed it out.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "fsdp/buffer_pool.h"

using trainyard::fsdp::BufferPool;

TEST(BufferPool, ReusesAReturnedBlockOfTheSameSize) {
  BufferPool pool(1 << 30);
  void* first = nullptr;
  {
    auto block = pool.take(3 << 20);
    first = block.get();
    std::memset(block.get(), 1, 3 << 20);  // writable, all of it
  }
  EXPECT_EQ(pool.stats().idle_bytes, std::size_t{3} << 20);
  auto again = pool.take(3 << 20);
  EXPECT_EQ(again.get(), first);
  auto stats = pool.stats();
  EXPECT_EQ(stats.takes, 2u);
  EXPECT_EQ(stats.reuses, 1u);
  EXPECT_EQ(stats.idle_bytes, 0u);
  EXPECT_EQ(stats.mapped_bytes, std::size_t{3} << 20);
}

TEST(BufferPool, ReusesOnlyBlocksTheRequestMostlyFills) {
  BufferPool pool(1 << 30);
  { auto big = pool.take(8 << 20); }
  auto small = pool.take(1 << 20);  // 1/8 of the idle block: a new one
  auto fits = pool.take((8 << 20) - (512 << 10));
  auto stats = pool.stats();
  EXPECT_EQ(stats.reuses, 1u);
  EXPECT_EQ(stats.mapped_bytes, std::size_t{9} << 20);
  EXPECT_EQ(stats.peak_mapped_bytes, std::size_t{9} << 20);
}

TEST(BufferPool, UnmapsWhatIsBeyondTheIdleLimit) {
  BufferPool pool(4 << 20);
  {
    auto a = pool.take(3 << 20);
    auto b = pool.take(3 << 20);
  }  // the first back is kept, the second would exceed 4 MiB idle
  auto stats = pool.stats();
  EXPECT_EQ(stats.idle_bytes, std::size_t{3} << 20);
  EXPECT_EQ(stats.mapped_bytes, std::size_t{3} << 20);
  EXPECT_EQ(stats.peak_mapped_bytes, std::size_t{6} << 20);
}

TEST(BufferPool, ABlockOutlivesThePoolAndComesBackFromAnotherThread) {
  at::DataPtr block;
  {
    BufferPool pool(1 << 30);
    block = pool.take(100);
  }
  static_cast<char*>(block.get())[4095] = 7;  // a whole page, still mapped
  std::thread([b = std::move(block)]() mutable { b.clear(); }).join();
}
