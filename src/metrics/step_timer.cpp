#include "trainyard/metrics/step_timer.h"

#include <algorithm>

#include "trainyard/metrics/names.h"
#include "trainyard/metrics/registry.h"

namespace trainyard::metrics {

// Note [Exposed communication]
// Collectives mostly overlap computation (DDP's bucket all-reduces run while backward goes on,
// FSDP prefetches its gathers); what costs step time is only the part a thread waits for. Every
// wait on a collective's work adds the seconds it blocked to a thread-local total
// (add_thread_blocked_seconds: TrackedWork::wait in src/comm/collective_metrics.cpp, which every
// trainyard collective returns, so wait_work, wait_collective and direct waits all count). When
// a phase ends, the timer takes the growth of that total during the phase out of the phase and
// adds it to Phase::kCommunication: a backward of 80 ms that waited 20 ms for the last buckets
// is 60 ms backward and 20 ms communication. The time is never counted twice and the phases
// still add up to the step (blocked time is capped at the phase's own length). Thread-local,
// because only the training loop's thread's waits stall the step; the collectives' own threads
// (Gloo's, the ring's) are not the step's time.

namespace {
constexpr std::string_view kPhaseHelp =
    "Seconds of training steps spent in each phase; communication is the time the step's thread "
    "blocked on collectives, taken out of the phase it happened in.";
}  // namespace

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::kData:
      return name::kPhaseData;
    case Phase::kForward:
      return name::kPhaseForward;
    case Phase::kBackward:
      return name::kPhaseBackward;
    case Phase::kCommunication:
      return name::kPhaseCommunication;
    case Phase::kOptimizer:
      return name::kPhaseOptimizer;
    case Phase::kOther:
      return name::kPhaseOther;
  }
  return name::kPhaseOther;
}

StepTimer::StepTimer(Registry& registry, bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  for (int p = 0; p < kPhaseCount; ++p) {
    phase_counters_[p] = &registry.counter(
        name::kTrainStepPhaseSeconds, kPhaseHelp,
        {{std::string(name::kPhaseLabel), std::string(phase_name(static_cast<Phase>(p)))}});
  }
  step_gauge_ = &registry.gauge(name::kTrainStepSeconds, "Wall seconds of the last training step.");
}

void StepTimer::begin_step() {
  if (!enabled_) return;
  step_start_ = phase_start_ = Clock::now();
  blocked_at_phase_start_ = thread_blocked_seconds();
  phase_ = Phase::kData;
  times_ = StepTimes{};
  in_step_ = true;
}

void StepTimer::close_phase(Clock::time_point now) {
  const double elapsed = std::chrono::duration<double>(now - phase_start_).count();
  const double blocked_total = thread_blocked_seconds();
  const double blocked =
      std::clamp(blocked_total - blocked_at_phase_start_, 0.0, std::max(elapsed, 0.0));
  times_.seconds[static_cast<int>(phase_)] += elapsed - blocked;
  times_.seconds[static_cast<int>(Phase::kCommunication)] += blocked;
  phase_start_ = now;
  blocked_at_phase_start_ = blocked_total;
}

void StepTimer::phase(Phase phase) {
  if (!enabled_ || !in_step_) return;
  close_phase(Clock::now());
  phase_ = phase;
}

StepTimes StepTimer::end_step() {
  if (!enabled_ || !in_step_) return StepTimes{};
  const auto now = Clock::now();
  close_phase(now);
  in_step_ = false;
  times_.total = 0;
  for (int p = 0; p < kPhaseCount; ++p) {
    phase_counters_[p]->add(times_.seconds[p]);
    times_.total += times_.seconds[p];
  }
  step_gauge_->set(times_.total);
  return times_;
}

}  // namespace trainyard::metrics
