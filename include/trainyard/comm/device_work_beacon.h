// DeviceWorkBeacon: keeps a rank's progress heartbeat going while collectives it has issued on a
// GPU (NCCL) are still running, since the host waits for them where nothing beats: see Note
// [Beating while device work runs] in src/comm/device_work_beacon.cpp.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace c10d {
class Work;
}

namespace trainyard {

inline constexpr std::chrono::seconds kDeviceWorkBeaconPeriod{1};

class DeviceWorkBeacon {
 public:
  // Starts a thread that, every `period`, calls `beat` (trainyard::heartbeat by default) when a
  // watched work is still incomplete and was watched less than `limit` ago, and forgets works
  // that completed or outlived `limit`. The newest beacon alive becomes the process's current
  // one, which watch_device_work() feeds.
  explicit DeviceWorkBeacon(std::chrono::milliseconds limit,
                            std::function<void()> beat = {},
                            std::chrono::milliseconds period = kDeviceWorkBeaconPeriod);
  // Stops and joins the thread and releases the works, before the caller's process group goes.
  ~DeviceWorkBeacon();
  DeviceWorkBeacon(const DeviceWorkBeacon&) = delete;
  DeviceWorkBeacon& operator=(const DeviceWorkBeacon&) = delete;

  // Watches `work` from now on. Thread-safe.
  void watch(c10::intrusive_ptr<c10d::Work> work);
  // Works watched and not yet forgotten (for tests and stats).
  std::size_t watched() const;

 private:
  struct Watched {
    c10::intrusive_ptr<c10d::Work> work;
    std::chrono::steady_clock::time_point until;
  };
  void run();

  const std::chrono::milliseconds limit_;
  const std::chrono::milliseconds period_;
  const std::function<void()> beat_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::vector<Watched> works_;
  std::thread thread_;  // last: starts once the rest is ready
};

// Hands `work` (device work the caller has queued a wait for) to the process's current beacon;
// does nothing when none exists. Thread-safe.
void watch_device_work(const c10::intrusive_ptr<c10d::Work>& work);

}  // namespace trainyard
