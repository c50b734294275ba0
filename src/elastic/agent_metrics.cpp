// The agent's view of its ranks' metrics.
#include "trainyard/elastic/agent_metrics.h"

#include <string>

#include "elastic/rank_monitor.h"
#include "trainyard/env.h"
#include "trainyard/metrics/names.h"
#include "trainyard/metrics/rank_files.h"

namespace trainyard::elastic {

AgentMetrics::AgentMetrics(std::string job, std::string dir)
    : dir_(std::move(dir)), job_(std::move(job)) {
  if (dir_.empty()) {
    scratch_ = std::make_unique<ScratchDir>(
        "metrics", "set TMPDIR to a writable folder, or run without --metrics-port.");
    dir_ = scratch_->path();
  }
}

AgentMetrics::~AgentMetrics() = default;

std::pair<std::string, std::string> AgentMetrics::env() const {
  return {kMetricsDirEnv, dir_};
}

void AgentMetrics::on_event(const AgentEvent& event) {
  std::lock_guard<std::mutex> lock(mutex_);
  switch (event.kind) {
    case AgentEventKind::kRoundStarted:
      pid_by_rank_.clear();
      rank_offset_ = event.rank_offset;
      metrics::clear_rank_files(dir_);
      break;
    case AgentEventKind::kRanksStarted:
      pid_by_rank_.clear();
      for (std::size_t local = 0; local < event.pids.size(); ++local)
        pid_by_rank_[rank_offset_ + static_cast<int>(local)] = event.pids[local];
      break;
    case AgentEventKind::kRankExited:
      pid_by_rank_.erase(event.rank_exit.rank);
      break;
    case AgentEventKind::kRestarting:
    case AgentEventKind::kFinished:
      pid_by_rank_.clear();
      break;
  }
}

std::vector<metrics::WatchedProcess> AgentMetrics::processes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<metrics::WatchedProcess> out;
  out.reserve(pid_by_rank_.size());
  for (const auto& [rank, pid] : pid_by_rank_) {
    out.push_back(metrics::WatchedProcess{
        .pid = pid,
        .labels = {{std::string(metrics::name::kJobLabel), job_},
                   {std::string(metrics::name::kRankLabel), std::to_string(rank)}}});
  }
  return out;
}

metrics::Snapshot AgentMetrics::rank_snapshot() const {
  metrics::Snapshot out;
  for (metrics::RankSnapshot& r : metrics::read_rank_files(dir_)) {
    metrics::merge_into(
        out,
        metrics::with_labels(std::move(r.snapshot),
                             {{std::string(metrics::name::kJobLabel), job_},
                              {std::string(metrics::name::kRankLabel), std::to_string(r.rank)}}));
  }
  return out;
}

}  // namespace trainyard::elastic
