// Where a training step's time goes: the recipe names the phase it enters (data, forward,
// backward, optimizer, other) and the timer adds up each phase's seconds, moving the time the
// thread blocked on collectives meanwhile into the phase communication (Note [Exposed
// communication] in src/metrics/step_timer.cpp). A step's phases add up to the step's time.
//
//   StepTimer timer(metrics::process_registry());   // the Trainer owns one: trainer.phase(...)
//   timer.begin_step();                              // in Phase::kData
//   while (auto batch = loader.next()) {
//     timer.phase(Phase::kForward);   ... forward ...
//     timer.phase(Phase::kBackward);  ... backward (DDP all-reduces: communication) ...
//     timer.phase(Phase::kOptimizer); ... optimizer.step() ...
//     timer.phase(Phase::kOther);     ... logging, checkpoints ...
//     timer.end_step();  timer.begin_step();
//   }
#pragma once

#include <array>
#include <chrono>
#include <string_view>

#include "trainyard/metrics/recording.h"

namespace trainyard::metrics {

class Counter;
class Gauge;
class Registry;

// The phases of a step; the values of the label name::kPhaseLabel.
enum class Phase { kData, kForward, kBackward, kCommunication, kOptimizer, kOther };
inline constexpr int kPhaseCount = 6;

// name::kPhaseData, ... for each phase.
std::string_view phase_name(Phase phase);

// One step's seconds by phase.
struct StepTimes {
  std::array<double, kPhaseCount> seconds{};  // indexed by Phase
  double total = 0;                           // the step's wall time: the phases' sum

  double operator[](Phase phase) const { return seconds[static_cast<int>(phase)]; }
};

// Times the steps of one thread (the thread that runs the training loop: blocked time is counted
// per thread). Adds each ended step's phases to the counter name::kTrainStepPhaseSeconds{phase}
// and sets the gauge name::kTrainStepSeconds in `registry`, which must outlive it. When
// `enabled` is false (TRAINYARD_METRICS=0) every call returns at once and records nothing. Not
// thread-safe: one thread drives it. Each call costs one steady_clock read.
class StepTimer {
 public:
  explicit StepTimer(Registry& registry, bool enabled = recording_enabled());

  bool enabled() const { return enabled_; }
  // Starts a step in Phase::kData (loading the batch), dropping one begun and not ended.
  void begin_step();
  // Ends the current phase and enters `phase`. Ignored outside a step.
  void phase(Phase phase);
  // Ends the step: records it and returns its times (all zero when disabled or outside a step).
  StepTimes end_step();
  bool in_step() const { return in_step_; }
  // The current step's times so far, the current phase excluded. For tests.
  const StepTimes& current() const { return times_; }

 private:
  using Clock = std::chrono::steady_clock;
  void close_phase(Clock::time_point now);

  bool enabled_;
  bool in_step_ = false;
  Phase phase_ = Phase::kData;
  Clock::time_point step_start_{};
  Clock::time_point phase_start_{};
  double blocked_at_phase_start_ = 0;
  StepTimes times_;
  std::array<Counter*, kPhaseCount> phase_counters_{};
  Gauge* step_gauge_ = nullptr;
};

}  // namespace trainyard::metrics
