// trainyard's caching CPU allocator (Note [Caching CPU allocator]). The cache is one per process
// and other tests use it too (FSDP's buffers), so these tests look at differences in its stats
// and use sizes of their own.
#include "trainyard/memory/caching_allocator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <thread>

namespace memory = trainyard::memory;

TEST(CachingAllocator, SizeClassesAreEighthsOfAPowerOfTwoInWholePages) {
  EXPECT_EQ(memory::cache_size_class(std::size_t{1} << 20), std::size_t{1} << 20);
  EXPECT_EQ(memory::cache_size_class((std::size_t{1} << 20) + 1), (std::size_t{9} << 20) / 8);
  EXPECT_EQ(memory::cache_size_class(std::size_t{200} << 20), std::size_t{208} << 20);
  for (std::size_t n : {std::size_t{1} << 20, std::size_t{3000001}, std::size_t{123456789}}) {
    const auto c = memory::cache_size_class(n);
    EXPECT_GE(c, n);
    EXPECT_LE(c, n + n / 8 + 4096);
    EXPECT_EQ(c % 4096, 0u);
  }
}

TEST(CachingAllocator, AFreedBlockServesTheNextRequestOfItsClass) {
  auto* alloc = memory::caching_allocator();
  const std::size_t n = (std::size_t{37} << 20) + 12345;  // a class no other test uses
  void* first = nullptr;
  {
    auto block = alloc->allocate(n);
    first = block.get();
    std::memset(block.get(), 1, n);  // all of it writable
  }
  const auto before = memory::cache_stats();
  auto again = alloc->allocate(n - 1000);  // same class
  const auto after = memory::cache_stats();
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(after.reuses, before.reuses + 1);
  EXPECT_EQ(after.maps, before.maps);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes + memory::cache_size_class(n));
}

TEST(CachingAllocator, SmallRequestsAndRawAllocationsWork) {
  auto* alloc = memory::caching_allocator();
  const auto before = memory::cache_stats();
  {
    auto small = alloc->allocate(1000);
    std::memset(small.get(), 2, 1000);
  }
  EXPECT_EQ(memory::cache_stats().maps, before.maps);  // not cached
  void* raw = alloc->raw_allocate(std::size_t{5} << 20);
  std::memset(raw, 3, std::size_t{5} << 20);
  alloc->raw_deallocate(raw);
  void* raw_small = alloc->raw_allocate(64);
  alloc->raw_deallocate(raw_small);
}

// Idle blocks of other classes are unmapped rather than let mapped memory pass 5/4 of the peak
// in use plus the slack.
TEST(CachingAllocator, IdleBlocksOfOtherClassesGiveWayToANewClass) {
  auto* alloc = memory::caching_allocator();
  const auto base = memory::cache_stats();
  const std::size_t big = base.peak_in_use_bytes + memory::kCacheSlackBytes + base.learnt_bytes +
                          (std::size_t{64} << 20);
  { auto a = alloc->allocate(big); }  // now idle: the peak in use is at least `big`
  const auto idle = memory::cache_stats();
  ASSERT_GE(idle.idle_bytes, memory::cache_size_class(big));
  // A request of another class, as large again: mapping it beside the idle block would exceed
  // 5/4 of the peak in use + slack, so the idle block goes.
  auto b = alloc->allocate(big + big / 4);
  const auto after = memory::cache_stats();
  EXPECT_GT(after.unmaps, idle.unmaps);
  EXPECT_LE(after.mapped_bytes,
            after.peak_in_use_bytes + after.peak_in_use_bytes / 4 + memory::kCacheSlackBytes);
}

TEST(CachingAllocator, BlocksComeBackFromAnyThreadAndTensorsUseIt) {
  auto* alloc = memory::caching_allocator();
  auto block = alloc->allocate(std::size_t{3} << 20);
  std::thread([b = std::move(block)]() mutable { b.clear(); }).join();
  // As LibTorch's CPU allocator: a tensor's storage is a cached block.
  memory::install_caching_allocator();
  ASSERT_TRUE(memory::caching_allocator_installed());
  const auto before = memory::cache_stats();
  auto t = torch::ones({1 << 20});  // 4 MiB
  EXPECT_GT(memory::cache_stats().in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(t.sum().item<float>(), float(1 << 20));
}

// Two classes that do not fit under the bound together, needed in turn (as a training step needs
// its tensors every step): the first turns shed and remap, then the bound has learnt both and
// nothing is mapped or unmapped any more.
TEST(CachingAllocator, AClassNeededAgainAfterBeingShedIsKept) {
  auto* alloc = memory::caching_allocator();
  const auto base = memory::cache_stats();
  const std::size_t big = base.peak_in_use_bytes + memory::kCacheSlackBytes + base.learnt_bytes +
                          (std::size_t{96} << 20);
  auto turn = [&] {
    { auto a = alloc->allocate(big); }
    { auto b = alloc->allocate(big + big / 4); }
  };
  turn();
  turn();
  const auto learnt = memory::cache_stats();
  EXPECT_GT(learnt.unmaps, 0u);
  for (int i = 0; i < 3; ++i) turn();
  const auto after = memory::cache_stats();
  EXPECT_EQ(after.maps, learnt.maps);
  EXPECT_EQ(after.unmaps, learnt.unmaps);
}
