// DeviceWorkBeacon (Note [Beating while device work runs]): beats while a watched work is
// incomplete and younger than its limit, and at no other time. Works here are c10d::Work objects
// whose completion the test sets, standing in for NCCL work (tests/gpu runs the real thing).
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "trainyard/comm/device_work_beacon.h"

namespace {

using namespace std::chrono_literals;
using trainyard::DeviceWorkBeacon;

constexpr auto kPeriod = 10ms;

class SettableWork : public c10d::Work {
 public:
  bool isCompleted() override { return done.load(); }
  std::atomic<bool> done{false};
};

// Beats counted over `span`.
int beats_during(std::atomic<int>& beats, std::chrono::milliseconds span) {
  const int before = beats.load();
  std::this_thread::sleep_for(span);
  return beats.load() - before;
}

TEST(DeviceWorkBeacon, BeatsWhileAWatchedWorkIsIncompleteAndStopsWhenItCompletes) {
  std::atomic<int> beats{0};
  DeviceWorkBeacon beacon(
      60s, [&] { ++beats; }, kPeriod);
  EXPECT_EQ(beats_during(beats, 100ms), 0) << "nothing watched: no beats";

  auto work = c10::make_intrusive<SettableWork>();
  beacon.watch(work);
  EXPECT_GE(beats_during(beats, 200ms), 5) << "a work in flight keeps the rank beating";
  EXPECT_EQ(beacon.watched(), 1u);

  work->done = true;
  std::this_thread::sleep_for(5 * kPeriod);
  EXPECT_EQ(beacon.watched(), 0u) << "a completed work is forgotten";
  EXPECT_EQ(beats_during(beats, 100ms), 0) << "no beats once the work completed";
}

TEST(DeviceWorkBeacon, AWorkKeepsTheRankBeatingAtMostTheLimit) {
  std::atomic<int> beats{0};
  DeviceWorkBeacon beacon(
      100ms, [&] { ++beats; }, kPeriod);
  auto stuck = c10::make_intrusive<SettableWork>();  // never completes
  beacon.watch(stuck);
  std::this_thread::sleep_for(150ms + 5 * kPeriod);
  EXPECT_EQ(beacon.watched(), 0u) << "past its limit the work is forgotten";
  EXPECT_EQ(beats_during(beats, 100ms), 0) << "a collective past the timeout is a hang";
}

TEST(DeviceWorkBeacon, WatchDeviceWorkFeedsTheNewestLiveBeacon) {
  auto work = c10::make_intrusive<SettableWork>();
  trainyard::watch_device_work(work);  // no beacon: nothing happens
  std::atomic<int> outer_beats{0}, inner_beats{0};
  DeviceWorkBeacon outer(
      60s, [&] { ++outer_beats; }, kPeriod);
  {
    DeviceWorkBeacon inner(
        60s, [&] { ++inner_beats; }, kPeriod);
    trainyard::watch_device_work(work);
    EXPECT_EQ(inner.watched(), 1u);
    EXPECT_EQ(outer.watched(), 0u);
  }
  trainyard::watch_device_work(work);  // the inner one is gone: the outer is current again
  EXPECT_EQ(outer.watched(), 1u);
  EXPECT_GE(beats_during(outer_beats, 100ms), 3);
  work->done = true;
}

}  // namespace
