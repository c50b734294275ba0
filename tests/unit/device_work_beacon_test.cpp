// DeviceWorkBeacon (Note [Beating while device work runs]): beats while a watched wait is pending
// and younger than its limit, and at no other time. The waits here are flags the test sets,
// standing in for the CUDA events that watch_stream_wait() records (tests/gpu runs those).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "trainyard/comm/device_work_beacon.h"

namespace {

using namespace std::chrono_literals;
using trainyard::DeviceWorkBeacon;

constexpr auto kPeriod = 10ms;

// Beats counted over `span`.
int beats_during(std::atomic<int>& beats, std::chrono::milliseconds span) {
  const int before = beats.load();
  std::this_thread::sleep_for(span);
  return beats.load() - before;
}

// Whether `condition` holds within a few seconds (the beacon's thread may be slow to run on a
// loaded machine; the waits end as soon as it has).
template <typename Condition>
bool eventually(Condition condition) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(DeviceWorkBeacon, BeatsWhileAWatchedWaitIsPendingAndStopsWhenItIsDone) {
  std::atomic<int> beats{0};
  DeviceWorkBeacon beacon(
      60s, [&] { ++beats; }, kPeriod);
  EXPECT_EQ(beats_during(beats, 100ms), 0) << "nothing watched: no beats";

  std::atomic<bool> done{false};
  beacon.watch([&] { return done.load(); });
  EXPECT_TRUE(eventually([&] { return beats.load() >= 5; }))
      << "a collective in flight keeps the rank beating";
  EXPECT_EQ(beacon.watched(), 1u);

  done = true;
  EXPECT_TRUE(eventually([&] { return beacon.watched() == 0; })) << "a finished wait is forgotten";
  EXPECT_EQ(beats_during(beats, 100ms), 0) << "no beats once the wait is over";
}

TEST(DeviceWorkBeacon, AWaitKeepsTheRankBeatingAtMostTheLimit) {
  std::atomic<int> beats{0};
  DeviceWorkBeacon beacon(
      100ms, [&] { ++beats; }, kPeriod);
  beacon.watch([] { return false; });  // never done
  EXPECT_TRUE(eventually([&] { return beacon.watched() == 0; }))
      << "past its limit the wait is forgotten";
  EXPECT_EQ(beats_during(beats, 100ms), 0) << "a collective past the timeout is a hang";
}

TEST(DeviceWorkBeacon, AQueryThatThrowsCountsAsDone) {
  std::atomic<int> beats{0};
  DeviceWorkBeacon beacon(
      60s, [&] { ++beats; }, kPeriod);
  beacon.watch([]() -> bool { throw std::runtime_error("the event's device is gone"); });
  EXPECT_TRUE(eventually([&] { return beacon.watched() == 0; }));
  EXPECT_EQ(beats.load(), 0);
}

TEST(DeviceWorkBeacon, WaitsGoToTheNewestLiveBeacon) {
  std::atomic<bool> done{false};
  auto wait = [&] { return done.load(); };
  EXPECT_FALSE(trainyard::watch_with_current_beacon(wait)) << "no beacon: nothing watches";
  trainyard::watch_stream_wait();  // no beacon: returns without touching CUDA
  std::atomic<int> outer_beats{0}, inner_beats{0};
  DeviceWorkBeacon outer(
      60s, [&] { ++outer_beats; }, kPeriod);
  {
    DeviceWorkBeacon inner(
        60s, [&] { ++inner_beats; }, kPeriod);
    EXPECT_TRUE(trainyard::watch_with_current_beacon(wait));
    EXPECT_EQ(inner.watched(), 1u);
    EXPECT_EQ(outer.watched(), 0u);
  }
  EXPECT_TRUE(trainyard::watch_with_current_beacon(wait));  // the inner one is gone
  EXPECT_EQ(outer.watched(), 1u);
  EXPECT_TRUE(eventually([&] { return outer_beats.load() >= 3; }));
  done = true;
}

// On a machine without CUDA (CI) recording the event fails: the wait goes unwatched, and the
// caller (wait_work) is not disturbed.
TEST(DeviceWorkBeacon, WithoutCudaAStreamWaitIsLeftUnwatched) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "CUDA is here: tests/gpu watches real events";
  DeviceWorkBeacon beacon(
      60s, [] {}, kPeriod);
  trainyard::watch_stream_wait();
  trainyard::watch_stream_wait();  // the warning once, no exception either time
  EXPECT_EQ(beacon.watched(), 0u);
}

}  // namespace
