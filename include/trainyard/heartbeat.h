// Progress heartbeats between a rank and its launcher, for the launcher's hang watchdog: the rank
// calls heartbeat() as it makes progress; the launcher reads, through HeartbeatFile, when it last
// did. The two share one small file named by $TRAINYARD_HEARTBEAT_FILE. No LibTorch here: comm/,
// train/ and the launcher all use it. See Note [Hang watchdog] in src/elastic/rank_monitor.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "trainyard/env.h"  // kHeartbeatFileEnv: the path of a rank's file

namespace trainyard {

// Records that this process is making progress. Cheap enough for every training step and every
// slice of a wait loop: after the first call (which maps the file) it is a clock read (vDSO, no
// syscall) and a relaxed atomic store. A no-op when $TRAINYARD_HEARTBEAT_FILE is unset or its
// file cannot be mapped (then one warning on stderr). Thread-safe, never throws, never blocks.
//
// Call it from the thread whose progress matters (the training loop) and from inside waits on
// peers (a collective waiting for a slow or hung peer is progress of this rank; the peer's silence
// is what names it). A program that never calls it is never judged hung.
void heartbeat() noexcept;

// For bounded waits inside libraries, on whatever thread they run (an S3 request retrying within
// its deadline): beats when this thread has called heartbeat() itself (it is a thread whose
// progress matters, waiting), or while some thread is inside a HeartbeatRelay (it waits for this
// one). A helper thread (a lease renewer) never keeps a hung training thread looking alive.
void heartbeat_while_waiting() noexcept;

// While one exists, heartbeat_while_waiting() beats from any thread: for a thread that blocks on
// another's bounded work (joining a background checkpoint save to S3). Thread-safe.
class HeartbeatRelay {
 public:
  HeartbeatRelay() noexcept;
  ~HeartbeatRelay();
  HeartbeatRelay(const HeartbeatRelay&) = delete;
  HeartbeatRelay& operator=(const HeartbeatRelay&) = delete;
};

// The launcher's side of one rank's heartbeat file: creates it (empty: never beaten) and reads
// the time of the last beat. Not thread-safe; one monitor thread owns it. Move-only.
class HeartbeatFile {
 public:
  // Creates (or truncates) the file at path and maps it. Throws Error naming the path.
  explicit HeartbeatFile(std::string path);
  ~HeartbeatFile();
  HeartbeatFile(HeartbeatFile&& other) noexcept;
  HeartbeatFile& operator=(HeartbeatFile&& other) noexcept;
  HeartbeatFile(const HeartbeatFile&) = delete;
  HeartbeatFile& operator=(const HeartbeatFile&) = delete;

  const std::string& path() const { return path_; }
  // When the rank last called heartbeat() (steady_clock, the same clock in every process of
  // this host), or nullopt when it never has.
  std::optional<std::chrono::steady_clock::time_point> last_beat() const;

 private:
  std::string path_;
  void* map_ = nullptr;  // the file's mapping, owned; nullptr after a move
};

}  // namespace trainyard
