// The head's recent history of the metrics workers send in their heartbeats: fixed-capacity ring
// buffers of a few series per node and per (job, rank), and the JSON of the history API
// (GET /api/cluster/metrics/history, docs/METRICS.md) the dashboard draws. See Note [History
// series] in src/cluster/metrics_history.cpp.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/metrics/snapshot.h"

namespace trainyard::cluster {

struct MetricsHistoryOptions {
  static constexpr int kDefaultPoints = 900;  // 30 min of the default 2 s heartbeats
  static constexpr int kMaxPoints = 86'400;   // a day of 1 s heartbeats
  static constexpr double kDefaultMaxAgeS = 1800;
  static constexpr int kDefaultMaxJobs = 32;
  int points = kDefaultPoints;  // capacity of every series' ring buffer, in [2, kMaxPoints]
  // Points older than this, measured from the newest time recorded, are dropped; a series left
  // empty (a finished job's ranks, a dead node's) goes with them. Seconds, > 0.
  double max_age_s = kDefaultMaxAgeS;
  // Jobs with rank series kept at most; past it the job whose newest point is oldest is dropped.
  int max_jobs = kDefaultMaxJobs;
};

// Validates the options: InvalidArgumentError naming the field and value.
void validate(const MetricsHistoryOptions& options);

// What the head knows of a node and a job besides their series, for json().
struct HistoryNodeInfo {
  std::string node_id;
  std::string hostname;
  std::string state;  // api::kNodeAlive, ...
  double heartbeat_age_s = 0;
};
struct HistoryJobInfo {
  std::string job_id;
  std::string status;  // api::kRunning, ...
};

// Thread-safe: record() and json() may be called from any thread at once.
class MetricsHistory {
 public:
  explicit MetricsHistory(MetricsHistoryOptions options = {});  // validate(options)
  ~MetricsHistory();
  MetricsHistory(const MetricsHistory&) = delete;
  MetricsHistory& operator=(const MetricsHistory&) = delete;

  // Adds one point at `time` (seconds since the epoch) to `node_id`'s series and to the series of
  // every (job, rank) whose samples `snapshot` holds (labels job and rank); node families are the
  // unlabelled ones. A time not after the node's last point is ignored (a resent heartbeat).
  void record(const std::string& node_id, double time, const metrics::Snapshot& snapshot);

  // The history API's JSON (docs/METRICS.md): `nodes` in the order given, then nodes with series
  // that were not given (state ""); `jobs` with rank series in the order given, then the others
  // (status ""); only `job` when set (with no ranks when it has none). `now` (seconds since the
  // epoch) and `interval_s` (the heartbeat interval) are written as "time" and "interval_s".
  // `max_points` > 0 thins each series to at most that many points, evenly spaced and always
  // ending with the newest (see Note [Thinned history]); 0 gives every point.
  nlohmann::json json(const std::vector<HistoryNodeInfo>& nodes,
                      const std::vector<HistoryJobInfo>& jobs,
                      const std::optional<std::string>& job,
                      double now,
                      double interval_s,
                      std::size_t max_points = 0) const;

  // Whether any series of `job_id` is kept.
  bool has_job(const std::string& job_id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::cluster
