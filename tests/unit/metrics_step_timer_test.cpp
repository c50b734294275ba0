// StepTimer (metrics/step_timer.h): phases timed by real sleeps add up to the step, the time the
// thread blocked on collectives moves into the phase communication, and a disabled timer records
// nothing. Each test has a Registry of its own.
#include "trainyard/metrics/step_timer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "trainyard/metrics/names.h"
#include "trainyard/metrics/recording.h"
#include "trainyard/metrics/registry.h"

namespace {
using trainyard::metrics::Phase;
using trainyard::metrics::Registry;
using trainyard::metrics::StepTimer;
using trainyard::metrics::StepTimes;
namespace name = trainyard::metrics::name;

// A sleep is never shorter than asked; on a busy, shared 2-core machine it may be much longer
// (a bound that still catches time counted twice or in the wrong phase).
constexpr double kSlack = 0.5;

void sleep_s(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

double phase_total(Registry& r, std::string_view phase) {
  return trainyard::metrics::find_value(r.snapshot(), name::kTrainStepPhaseSeconds,
                                        {{std::string(name::kPhaseLabel), std::string(phase)}});
}

TEST(StepTimer, PhasesOfKnownSleepsAddUpToTheStep) {
  Registry registry;
  StepTimer timer(registry, /*enabled=*/true);
  timer.begin_step();
  sleep_s(0.02);  // data
  timer.phase(Phase::kForward);
  sleep_s(0.04);
  timer.phase(Phase::kBackward);
  sleep_s(0.06);
  timer.phase(Phase::kOptimizer);
  sleep_s(0.03);
  timer.phase(Phase::kOther);
  sleep_s(0.01);
  const StepTimes t = timer.end_step();

  const std::pair<Phase, double> expected[] = {
      {Phase::kData, 0.02},      {Phase::kForward, 0.04}, {Phase::kBackward, 0.06},
      {Phase::kOptimizer, 0.03}, {Phase::kOther, 0.01},   {Phase::kCommunication, 0}};
  double sum = 0;
  for (const auto& [phase, seconds] : expected) {
    SCOPED_TRACE(std::string(trainyard::metrics::phase_name(phase)));
    EXPECT_GE(t[phase], seconds);
    EXPECT_LE(t[phase], seconds + kSlack);
    // The counter holds the same seconds as the returned times.
    EXPECT_DOUBLE_EQ(phase_total(registry, trainyard::metrics::phase_name(phase)), t[phase]);
    sum += t[phase];
  }
  EXPECT_NEAR(t.total, sum, 1e-12);
  EXPECT_GE(t.total, 0.16);
  EXPECT_DOUBLE_EQ(trainyard::metrics::find_value(registry.snapshot(), name::kTrainStepSeconds),
                   t.total);
  EXPECT_FALSE(timer.in_step());
}

TEST(StepTimer, BlockedTimeMovesFromThePhaseIntoCommunication) {
  Registry registry;
  StepTimer timer(registry, /*enabled=*/true);
  timer.begin_step();
  timer.phase(Phase::kBackward);
  sleep_s(0.05);
  // A wait on a collective that blocked 30 ms of those 50 (TrackedWork adds it like this).
  trainyard::metrics::add_thread_blocked_seconds(0.03);
  timer.phase(Phase::kOptimizer);
  sleep_s(0.02);
  const StepTimes t = timer.end_step();
  EXPECT_NEAR(t[Phase::kCommunication], 0.03, 1e-9);
  EXPECT_GE(t[Phase::kBackward], 0.02);
  EXPECT_LE(t[Phase::kBackward], 0.02 + kSlack);
  EXPECT_GE(t[Phase::kOptimizer], 0.02);
  EXPECT_NEAR(
      t[Phase::kData] + t[Phase::kBackward] + t[Phase::kCommunication] + t[Phase::kOptimizer],
      t.total, 1e-12);
  // Blocked time of another thread is not this step's.
  std::thread([] { trainyard::metrics::add_thread_blocked_seconds(5); }).join();
  timer.begin_step();
  sleep_s(0.01);
  EXPECT_EQ(timer.end_step()[Phase::kCommunication], 0);
}

TEST(StepTimer, BlockedTimeIsCappedAtThePhaseLength) {
  Registry registry;
  StepTimer timer(registry, /*enabled=*/true);
  timer.begin_step();
  timer.phase(Phase::kForward);
  trainyard::metrics::add_thread_blocked_seconds(10);  // more than the phase lasted
  const StepTimes t = timer.end_step();
  EXPECT_EQ(t[Phase::kForward], 0);
  EXPECT_LT(t[Phase::kCommunication], 1);
  EXPECT_NEAR(t.total, t[Phase::kCommunication] + t[Phase::kData], 1e-12);
}

TEST(StepTimer, StepsAccumulateAndAnUnendedStepIsDropped) {
  Registry registry;
  StepTimer timer(registry, /*enabled=*/true);
  double forward = 0;
  for (int i = 0; i < 3; ++i) {
    timer.begin_step();
    timer.phase(Phase::kForward);
    sleep_s(0.01);
    forward += timer.end_step()[Phase::kForward];
  }
  timer.begin_step();  // the loader had no batch: never ended
  timer.phase(Phase::kForward);
  sleep_s(0.02);
  timer.begin_step();  // the next epoch
  EXPECT_DOUBLE_EQ(phase_total(registry, name::kPhaseForward), forward);
  EXPECT_GE(forward, 0.03);
  // phase() and end_step() outside a step do nothing.
  Registry other;
  StepTimer idle(other, /*enabled=*/true);
  idle.phase(Phase::kForward);
  EXPECT_EQ(idle.end_step().total, 0);
  EXPECT_EQ(phase_total(other, name::kPhaseForward), 0);
}

TEST(StepTimer, DisabledRecordsNothing) {
  Registry registry;
  StepTimer timer(registry, /*enabled=*/false);
  timer.begin_step();
  timer.phase(Phase::kForward);
  sleep_s(0.01);
  EXPECT_EQ(timer.end_step().total, 0);
  EXPECT_FALSE(timer.in_step());
  EXPECT_TRUE(registry.snapshot().empty());
}

}  // namespace
