// The worker daemon (`trainyard worker`): joins a head, registers this node's resources under a
// persistent node id, heartbeats, and runs the ranks the head places here, each job under its own
// elastic::Agent whose rendezvous is the head. Jobs keep running while the head is away; their
// logs are spooled on disk and shipped when it answers again. See Note [Worker and head].
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "trainyard/cluster/node_resources.h"
#include "trainyard/metrics/node_sampler.h"

namespace trainyard::cluster {

struct WorkerOptions {
  std::string head;                  // "host:port" or "http://host:port"; resolved on every attempt
  std::optional<std::string> token;  // the cluster token
  std::string state_dir;             // this node's id and the spools of its jobs
  DetectOptions resources{};         // what this node declares instead of what it detects
  std::string address;               // how other nodes reach this one; "": the route to the head
  // Joining: attempts start at connect_backoff and double up to connect_backoff_max, with +-20%
  // jitter, for as long as the worker runs (workers may start minutes before the head).
  std::chrono::milliseconds connect_backoff{500};
  std::chrono::milliseconds connect_backoff_max{10'000};
  // Until the head's registration answer says otherwise.
  std::chrono::milliseconds heartbeat_interval{2'000};
  // How long a job's agents ride out an unreachable head before giving up on its rendezvous.
  std::chrono::milliseconds head_outage_timeout{300'000};
  // After stop(): how long the jobs' ranks get between SIGTERM and SIGKILL, and how long the
  // worker then tries to hand the head their last logs and reports.
  std::chrono::milliseconds stop_timeout{10'000};
  bool forward_output = false;  // also print the ranks' lines on this process's stdout/stderr
  // The node's metrics in every heartbeat (Note [Metrics in heartbeats] in worker.cpp).
  metrics::NodeSamplerOptions node_sampler{};
};

class Worker {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();  // stop("exited")
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Reads or creates the node id in state_dir, recovers the spools of jobs an earlier run left,
  // and starts the daemon's thread. Throws InvalidArgumentError for bad options and Error when
  // the state directory cannot be used. Non-blocking.
  void start();

  // An orderly stop (SIGTERM to the daemon): the jobs' ranks are stopped, their reports and logs
  // handed to the head within stop_timeout, and the node leaves with `reason` ("exited",
  // "drained"), which the head does not count as a failure. Blocks; idempotent.
  void stop(const std::string& reason = "exited");

  const std::string& node_id() const;
  bool registered() const;  // the head has accepted this node since it last answered otherwise
  int running_jobs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::cluster
