// How a rank's metrics reach its agent: the rank writes its registry's snapshot to
// $TRAINYARD_METRICS_DIR/rank_<RANK>.json about every second (written to a temporary name and
// renamed, so a reader never sees half a file), and the agent reads the folder when it reports.
// Files, not sockets: nothing to connect, a rank that dies leaves its last reading, and an agent
// restart loses nothing.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "trainyard/metrics/snapshot.h"

namespace trainyard::metrics {

class Registry;

inline constexpr std::chrono::milliseconds kDefaultPublishInterval{1000};

// "<dir>/rank_<rank>.json".
std::string rank_file_path(const std::string& dir, int rank);

struct FilePublisherOptions {
  std::string dir;  // the folder (created when missing)
  int rank = 0;
  std::chrono::milliseconds interval = kDefaultPublishInterval;
};

// Writes `registry`'s snapshot to rank_file_path(dir, rank) every interval on a thread of its
// own, and once more when stopped or destroyed. A write that fails is logged (at most every
// minute) and tried again next interval; it never stops the rank. `registry` must outlive it.
class FilePublisher {
 public:
  // Throws InvalidArgumentError for an empty dir, a negative rank or a non-positive interval.
  FilePublisher(const Registry& registry, FilePublisherOptions options);
  ~FilePublisher();  // stop()
  FilePublisher(const FilePublisher&) = delete;
  FilePublisher& operator=(const FilePublisher&) = delete;

  // Writes now, on the caller's thread.
  void publish_now();
  // Ends the thread after a last write. Idempotent; never throws.
  void stop() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct RankSnapshot {
  int rank = 0;
  Snapshot snapshot;
};

// Every rank_<N>.json in `dir`, in rank order. A file that cannot be read or parsed is skipped
// with a warning naming it (at most one per file per minute); a missing dir gives nothing.
std::vector<RankSnapshot> read_rank_files(const std::string& dir);

// Removes every rank file in `dir` (an agent does before starting a round's ranks, so a rank of
// an earlier, larger world does not linger).
void clear_rank_files(const std::string& dir);

}  // namespace trainyard::metrics
