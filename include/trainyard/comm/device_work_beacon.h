// DeviceWorkBeacon: keeps a rank's progress heartbeat going while collectives it has issued on a
// GPU (NCCL) are still running, since the host waits for them where nothing beats: see Note
// [Beating while device work runs] in src/comm/device_work_beacon.cpp.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace trainyard {

inline constexpr std::chrono::seconds kDeviceWorkBeaconPeriod{1};

class DeviceWorkBeacon {
 public:
  // Starts a thread that, every `period`, calls `beat` (trainyard::heartbeat by default) when a
  // watched wait is still pending and was watched less than `limit` ago, and forgets waits that
  // are done or outlived `limit`. The newest beacon alive becomes the process's current one,
  // which watch_stream_wait() feeds.
  explicit DeviceWorkBeacon(std::chrono::milliseconds limit,
                            std::function<void()> beat = {},
                            std::chrono::milliseconds period = kDeviceWorkBeaconPeriod);
  // Stops and joins the thread.
  ~DeviceWorkBeacon();
  DeviceWorkBeacon(const DeviceWorkBeacon&) = delete;
  DeviceWorkBeacon& operator=(const DeviceWorkBeacon&) = delete;

  // Watches a wait from now on: `done` answers whether it is over. It is called on the beacon's
  // thread, so it must be thread-safe and cheap (a CUDA event query); an exception counts as
  // done. Thread-safe.
  void watch(std::function<bool()> done);
  // Waits watched and not yet forgotten (for tests and stats).
  std::size_t watched() const;

 private:
  struct Watched {
    std::function<bool()> done;
    std::chrono::steady_clock::time_point until;
  };
  void run();

  const std::chrono::milliseconds limit_;
  const std::chrono::milliseconds period_;
  const std::function<void()> beat_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::vector<Watched> waits_;
  std::thread thread_;  // last: starts once the rest is ready
};

// Hands `done` to the process's current beacon (the newest alive); false when there is none.
// Thread-safe.
bool watch_with_current_beacon(std::function<bool()> done);

// To be called right after the calling thread's current CUDA stream was made to wait for device
// work (NCCL work's wait()): records an event on that stream, which completes once the work has,
// and hands the current beacon a query of it. Does nothing when no beacon exists. Never throws:
// an event that cannot be recorded is logged once and leaves this wait unwatched.
void watch_stream_wait() noexcept;

}  // namespace trainyard
