#include "trainyard/comm/device_work_beacon.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <utility>

#include "trainyard/heartbeat.h"
#include "trainyard/log.h"

// Note [Beating while device work runs]
// wait_work() returns from NCCL work at once (Note [Waiting on NCCL work], nccl.cpp): the
// caller's stream waits, the host does not. The host blocks later, in whatever first reads a
// result on the host (a loss's item(), a copy to the CPU), and nothing beats there. A rank whose
// peer is slow (rank 0 evaluating or saving a checkpoint while the others wait in the next
// all-reduce) would fall silent together with that peer, and the launcher's hang watchdog (Note
// [Hang watchdog], src/elastic/rank_monitor.cpp) would stop a healthy group once --hang-timeout
// passed, and might blame the waiting rank. Under Gloo, wait_work's slices beat while the host
// waits for a peer; this does the same for work that completes on a GPU: wait_work (and the flat
// collectives' device work), right after making the caller's stream wait for an NCCL work,
// record a CUDA event on that stream (watch_stream_wait) and hand the process's DeviceWorkBeacon a
// query of it; the beacon's thread beats while any such event is pending. An event rather than
// the work, so that the beacon holds no tensors: an NCCL work keeps its outputs alive, and FSDP's
// gathered parameters would outlive their unit by up to a beacon period.
// Waiting for a peer is progress; the rank that is really stuck (a deadlock, SIGSTOP, a kernel
// that never returns) has no collective in flight that is still waiting for others, so it falls
// silent first and is the one the watchdog names. A wait keeps the rank beating for at most
// `limit` (the group's collective timeout) after it was watched: by then NCCL's watchdog has
// failed the collective (and ended the process), and a rank still silent after that is hung for
// real. Distributed holds a beacon while its device is a GPU; ranks on the CPU watch nothing.

namespace trainyard {
namespace {

std::mutex g_beacons_mutex;
std::vector<DeviceWorkBeacon*> g_beacons;  // alive, oldest first; the last is the current one

void warn_once_unwatched(const char* why) noexcept {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  try {
    logger("comm")->warn(
        "Cannot record a CUDA event to watch a collective ({}); this rank's heartbeat pauses "
        "while its host waits for NCCL work (Note [Beating while device work runs]).",
        why);
  } catch (...) {
  }
}

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
}

void DeviceWorkBeacon::watch(std::function<bool()> done) {
  std::lock_guard lock(mutex_);
  waits_.push_back({std::move(done), std::chrono::steady_clock::now() + limit_});
}

std::size_t DeviceWorkBeacon::watched() const {
  std::lock_guard lock(mutex_);
  return waits_.size();
}

void DeviceWorkBeacon::run() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, period_, [this] { return stop_; })) {
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(waits_, [now](const Watched& w) {
      if (now >= w.until) return true;
      try {
        return w.done();
      } catch (...) {
        return true;
      }
    });
    if (!waits_.empty()) beat_();
  }
}

bool watch_with_current_beacon(std::function<bool()> done) {
  std::lock_guard lock(g_beacons_mutex);
  if (g_beacons.empty()) return false;
  g_beacons.back()->watch(std::move(done));
  return true;
}

void watch_stream_wait() noexcept {
  {
    std::lock_guard lock(g_beacons_mutex);
    if (g_beacons.empty()) return;
  }
  try {
    // The calling thread's current stream on its current device: the one that now waits.
    const c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
    auto event = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
    event->record(cuda.getStream(cuda.getDevice()));
    watch_with_current_beacon([event] { return event->query(); });
  } catch (const c10::Error& e) {
    warn_once_unwatched(e.what_without_backtrace());
  } catch (const std::exception& e) {
    warn_once_unwatched(e.what());
  }
}

}  // namespace trainyard
