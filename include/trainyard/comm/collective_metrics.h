// What every collective trainyard issues records into metrics::process_registry(): calls and
// bytes when issued, seconds from issue to completion, and the seconds threads blocked waiting
// for it (also added to the waiting thread's blocked time, which the step timer takes as
// communication: Note [Exposed communication] in src/metrics/step_timer.cpp). The comm::
// collectives (collectives.h) call track_collective; code that issues on a c10d group directly
// records nothing, so trainyard's own call sites go through comm::all_reduce and the rest.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdint>
#include <string_view>

namespace trainyard::comm {

// The values of the label metrics::name::kOpLabel.
enum class CollectiveOp { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kBarrier };
std::string_view op_name(CollectiveOp op);

// Records one collective of `bytes` (as nccl-tests counts size: all_reduce and broadcast the
// tensor's bytes, all_gather the gathered output's, reduce_scatter the whole input's, barrier 0)
// issued at `issued`, and returns `work` wrapped so that its completion (when a wait returns or
// isCompleted() first says so) and every wait on it are recorded; the time from `issued` until
// now (the issuing call, which may itself block) counts as blocked. With recording off
// (TRAINYARD_METRICS=0) returns `work` itself. The wrapper forwards every Work method.
c10::intrusive_ptr<c10d::Work> track_collective(CollectiveOp op,
                                                std::int64_t bytes,
                                                std::chrono::steady_clock::time_point issued,
                                                c10::intrusive_ptr<c10d::Work> work);

}  // namespace trainyard::comm
