#include "trainyard/comm/collective_metrics.h"

#include <array>
#include <atomic>

#include "trainyard/metrics/names.h"
#include "trainyard/metrics/recording.h"
#include "trainyard/metrics/registry.h"

namespace trainyard::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kOps = 5;

// One op's series, looked up once per process: the hot path only adds to them.
struct OpSeries {
  metrics::Counter* calls;
  metrics::Counter* bytes;
  metrics::Counter* seconds;
  metrics::Counter* wait_seconds;
};

const std::array<OpSeries, kOps>& op_series() {
  static const std::array<OpSeries, kOps> series = [] {
    namespace name = metrics::name;
    auto& registry = metrics::process_registry();
    std::array<OpSeries, kOps> out{};
    for (int i = 0; i < kOps; ++i) {
      const metrics::Labels labels{
          {std::string(name::kOpLabel), std::string(op_name(static_cast<CollectiveOp>(i)))}};
      out[i] = OpSeries{
          .calls = &registry.counter(name::kCollectiveCalls, "Collectives issued.", labels),
          .bytes = &registry.counter(
              name::kCollectiveBytes,
              "Bytes of the collectives issued, as nccl-tests counts size (all_reduce, broadcast: "
              "the tensor; all_gather: the gathered output; reduce_scatter: the whole input).",
              labels),
          .seconds = &registry.counter(name::kCollectiveSeconds,
                                       "Seconds from issuing each collective until this rank saw "
                                       "it complete (a wait or poll), overlapped or not.",
                                       labels),
          .wait_seconds = &registry.counter(
              name::kCollectiveWaitSeconds,
              "Seconds threads blocked waiting for collectives (exposed communication).", labels)};
    }
    return out;
  }();
  return series;
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A collective's work, recording its completion and the waits on it. Completion is taken when
// this rank first sees it (a wait returning or isCompleted() answering true), which is when the
// rank could use the result.
class TrackedWork final : public c10d::Work {
 public:
  TrackedWork(const OpSeries& series,
              Clock::time_point issued,
              c10::intrusive_ptr<c10d::Work> inner)
      : c10d::Work(-1, c10d::OpType::UNKNOWN),
        series_(series),
        issued_(issued),
        inner_(std::move(inner)) {}

  ~TrackedWork() override {
    try {  // a group's isCompleted() may rethrow the collective's error; destructors never throw
      if (!done_.load(std::memory_order_relaxed) && inner_->isCompleted()) mark_done();
    } catch (...) {
    }
  }

  bool isCompleted() override {
    const bool completed = inner_->isCompleted();
    if (completed) mark_done();
    return completed;
  }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override { inner_->synchronize(); }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }

  bool wait(std::chrono::milliseconds timeout) override {
    const auto start = Clock::now();
    struct Blocked {  // counted however the wait ends (a timed-out slice of wait_work throws)
      TrackedWork& self;
      Clock::time_point start;
      ~Blocked() {
        const double s = seconds_between(start, Clock::now());
        self.series_.wait_seconds->add(s);
        metrics::add_thread_blocked_seconds(s);
      }
    } blocked{*this, start};
    const bool ok = inner_->wait(timeout);
    mark_done();
    return ok;
  }

 private:
  void mark_done() {
    if (done_.exchange(true, std::memory_order_relaxed)) return;
    series_.seconds->add(seconds_between(issued_, Clock::now()));
  }

  const OpSeries& series_;
  Clock::time_point issued_;
  c10::intrusive_ptr<c10d::Work> inner_;
  std::atomic<bool> done_{false};
};

}  // namespace

std::string_view op_name(CollectiveOp op) {
  namespace name = metrics::name;
  switch (op) {
    case CollectiveOp::kAllReduce:
      return name::kOpAllReduce;
    case CollectiveOp::kAllGather:
      return name::kOpAllGather;
    case CollectiveOp::kReduceScatter:
      return name::kOpReduceScatter;
    case CollectiveOp::kBroadcast:
      return name::kOpBroadcast;
    case CollectiveOp::kBarrier:
      return name::kOpBarrier;
  }
  return name::kOpAllReduce;
}

c10::intrusive_ptr<c10d::Work> track_collective(CollectiveOp op,
                                                std::int64_t bytes,
                                                Clock::time_point issued,
                                                c10::intrusive_ptr<c10d::Work> work) {
  if (!metrics::recording_enabled() || !work) return work;
  const OpSeries& series = op_series()[static_cast<int>(op)];
  series.calls->add(1);
  series.bytes->add(static_cast<double>(bytes));
  // The issuing call itself blocked the caller (a shared-memory group may run small collectives
  // in place): exposed communication too.
  const double issuing = seconds_between(issued, Clock::now());
  series.wait_seconds->add(issuing);
  metrics::add_thread_blocked_seconds(issuing);
  return c10::make_intrusive<TrackedWork>(series, issued, std::move(work));
}

}  // namespace trainyard::comm
