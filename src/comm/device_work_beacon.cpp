#include "trainyard/comm/device_work_beacon.h"

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <utility>

#include "trainyard/heartbeat.h"

// Note [Beating while device work runs]
// wait_work() returns from NCCL work at once (Note [Waiting on NCCL work], torch_compat.cpp): the
// caller's stream waits, the host does not. The host blocks later, in whatever first reads a
// result on the host (a loss's item(), a copy to the CPU), and nothing beats there. A rank whose
// peer is slow (rank 0 evaluating or saving a checkpoint while the others wait in the next
// all-reduce) would fall silent together with that peer, and the launcher's hang watchdog (Note
// [Hang watchdog], src/elastic/rank_monitor.cpp) would stop a healthy group once --hang-timeout
// passed, and might blame the waiting rank. Under Gloo, wait_work's slices beat while the
// host waits for a peer; this is the same for work that completes on a GPU: wait_work (and the
// flat collectives' device work) hand each NCCL work to the process's DeviceWorkBeacon, whose
// thread beats while any of them is incomplete. Waiting for a peer is progress; the rank that is
// really stuck (a deadlock, SIGSTOP, a kernel that never returns) has no collective in flight
// that is still waiting for others, so it falls silent first and is the one the watchdog names.
// A work keeps the rank beating for at most `limit` (the group's collective timeout) after it
// was watched: by then NCCL's watchdog has failed the collective (and ended the process), and a
// rank still silent after that is hung for real. Distributed holds a beacon while its device is
// a GPU; ranks on the CPU never watch anything.

namespace trainyard {
namespace {

std::mutex g_beacons_mutex;
std::vector<DeviceWorkBeacon*> g_beacons;  // alive, oldest first; the last is the current one

}  // namespace

DeviceWorkBeacon::DeviceWorkBeacon(std::chrono::milliseconds limit,
                                   std::function<void()> beat,
                                   std::chrono::milliseconds period)
    : limit_(limit),
      period_(period),
      beat_(beat ? std::move(beat) : std::function<void()>([] { heartbeat(); })),
      thread_([this] { run(); }) {
  std::lock_guard lock(g_beacons_mutex);
  g_beacons.push_back(this);
}

DeviceWorkBeacon::~DeviceWorkBeacon() {
  {
    std::lock_guard lock(g_beacons_mutex);
    g_beacons.erase(std::remove(g_beacons.begin(), g_beacons.end(), this), g_beacons.end());
  }
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  works_.clear();
}

void DeviceWorkBeacon::watch(c10::intrusive_ptr<c10d::Work> work) {
  std::lock_guard lock(mutex_);
  works_.push_back({std::move(work), std::chrono::steady_clock::now() + limit_});
}

std::size_t DeviceWorkBeacon::watched() const {
  std::lock_guard lock(mutex_);
  return works_.size();
}

void DeviceWorkBeacon::run() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, period_, [this] { return stop_; })) {
    const auto now = std::chrono::steady_clock::now();
    // isCompleted() only queries the work's CUDA events (NCCL's watchdog calls it too).
    std::erase_if(works_,
                  [now](const Watched& w) { return now >= w.until || w.work->isCompleted(); });
    if (!works_.empty()) beat_();
  }
}

void watch_device_work(const c10::intrusive_ptr<c10d::Work>& work) {
  std::lock_guard lock(g_beacons_mutex);
  if (!g_beacons.empty()) g_beacons.back()->watch(work);
}

}  // namespace trainyard
