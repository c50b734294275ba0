// Whether library code records metrics, and the time each thread spent blocked on collectives:
// the two things the collectives (which add blocked time) and the step timer (which takes it out
// of the phase it happened in) share. See Note [Exposed communication] in
// src/metrics/step_timer.cpp.
#pragma once

namespace trainyard::metrics {

// False when the environment sets TRAINYARD_METRICS=0 (kMetricsEnv in env.h):
// the step timer and the collective counters then record nothing, which is how their overhead is
// measured (bench/metrics_overhead.sh). Read once per process; thread-safe.
bool recording_enabled();

// Seconds the calling thread has blocked waiting for collectives since it started; only grows.
// Thread-local, so reading and adding cost a few nanoseconds and need no lock.
double thread_blocked_seconds() noexcept;
void add_thread_blocked_seconds(double seconds) noexcept;

}  // namespace trainyard::metrics
