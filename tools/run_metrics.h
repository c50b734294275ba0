// `trainyard run --metrics-port`: the agent's own Prometheus endpoint, serving this node's
// metrics and its ranks' (labelled job, node, rank) at /metrics while the ranks run.
#pragma once

#include <memory>
#include <string>

#include "trainyard/elastic/launcher.h"

namespace trainyard::cli {

struct RunMetricsOptions {
  std::string bind_address = "127.0.0.1";
  int port = 0;     // 0: a free port, printed
  std::string job;  // the job label: the run id
};

// Serves /metrics from construction to destruction. Throws Error when the port cannot be bound.
class RunMetrics {
 public:
  explicit RunMetrics(RunMetricsOptions options);
  ~RunMetrics();
  RunMetrics(const RunMetrics&) = delete;
  RunMetrics& operator=(const RunMetrics&) = delete;

  // Adds the ranks' metrics folder to options.extra_env and chains on_event, so the ranks are
  // followed; call before the launch.
  void attach(elastic::LaunchOptions& options);
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::cli
