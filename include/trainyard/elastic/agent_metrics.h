// What an agent knows of its ranks' metrics: the folder they publish to ($TRAINYARD_METRICS_DIR,
// metrics/rank_files.h) and their pids, kept current from the agent's events, read out as one
// Snapshot labelled {job_id, rank}. The cluster worker sends it to the head in its heartbeats; a
// standalone `trainyard run --metrics-port` serves it with the node's metrics.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/elastic/agent_event.h"
#include "trainyard/metrics/node_sampler.h"
#include "trainyard/metrics/snapshot.h"

namespace trainyard::elastic {

class ScratchDir;

class AgentMetrics {
 public:
  // `job`: the job label's value (the cluster's job id, or the run id). `dir`: this agent's own
  // folder for its ranks' files (created by the ranks' publishers); empty: a private folder in
  // /dev/shm (else $TMPDIR), removed with this object (throws Error when it cannot be made).
  explicit AgentMetrics(std::string job, std::string dir = "");
  ~AgentMetrics();
  AgentMetrics(const AgentMetrics&) = delete;
  AgentMetrics& operator=(const AgentMetrics&) = delete;

  // {TRAINYARD_METRICS_DIR, dir}: add it to LaunchOptions::extra_env.
  std::pair<std::string, std::string> env() const;
  const std::string& dir() const { return dir_; }

  // Feed every AgentEvent (LaunchOptions::on_event): a new round clears the ranks' old files
  // (a rank of a larger earlier world must not linger), started ranks' pids are watched, exited
  // ones are not, and the end clears both. Thread-safe.
  void on_event(const AgentEvent& event);

  // The running ranks' processes, labelled {job_id, rank}, for NodeSampler::sample().
  std::vector<metrics::WatchedProcess> processes() const;

  // Every rank's published snapshot, labelled {job_id, rank}, merged. Thread-safe.
  metrics::Snapshot rank_snapshot() const;

 private:
  std::unique_ptr<ScratchDir> scratch_;  // when no dir was given
  std::string dir_;
  const std::string job_;
  mutable std::mutex mutex_;
  std::map<int, int> pid_by_rank_;  // guarded by mutex_; global rank -> pid
  int rank_offset_ = 0;             // guarded by mutex_; the round's global rank of local rank 0
};

}  // namespace trainyard::elastic
