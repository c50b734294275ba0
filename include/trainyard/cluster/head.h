// The head of a trainyard cluster: serves Ray's Jobs API and the worker protocol over HTTP (see
// cluster/api.h), keeps nodes, jobs, logs and rendezvous states in a JobStore, tracks each node's
// life (alive -> suspect -> dead by heartbeats), places jobs on nodes all at once (a gang of
// MIN..MAX nodes) and follows them by the workers' reports. See Note [Head state] in
// src/cluster/head_state.cpp.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "trainyard/cluster/metrics_history.h"

namespace trainyard::cluster {

struct HeadOptions {
  static constexpr int kDefaultPort = 8265;  // Ray's dashboard port, where Ray's clients look
  static constexpr int kDefaultHttpThreads = 8;
  std::string bind_address = "127.0.0.1";  // --bind; beyond loopback only with a token
  int port = kDefaultPort;                 // 0: the system picks one; read it with port()
  // Required of every call (cluster/auth.h). When unset, start() reads or makes
  // <state_dir>/token (Note [Secure by default] in auth.cpp); token() says which.
  std::optional<std::string> token;
  // --insecure-no-token: serve without a token (loopback only). Leaves token unset.
  bool unauthenticated = false;
  std::filesystem::path state_dir;                      // holds head.db; required
  std::chrono::milliseconds heartbeat_interval{2'000};  // told to workers at registration
  // A node without a heartbeat for this long is suspect; zero means 3 heartbeat intervals.
  std::chrono::milliseconds suspect_after{0};
  std::chrono::milliseconds dead_after{10'000};  // ... and dead ("heartbeat timeout")
  std::chrono::milliseconds tick_interval{500};  // node lifecycle, scheduling, log tails
  int http_threads = kDefaultHttpThreads;  // run handlers; connections and log tails hold none
  // WebSocket log followers (`ray job logs -f`), per job and in all; past them 429.
  int max_log_followers_per_job = 32;
  int max_log_followers = 128;
  int failures_shown = 10;  // most recent node failures in the status snapshot
  // Points kept per metrics series for the history API and the dashboard (one per heartbeat);
  // points older than history_points heartbeat intervals are dropped too.
  int history_points = MetricsHistoryOptions::kDefaultPoints;
};

// Validates the options: InvalidArgumentError naming the field (and, for a non-loopback bind
// without a token, --bind and --insecure-no-token).
void validate(const HeadOptions& options);

// The prefix of a log line served by GET /api/jobs/{id}/logs and the tail: "[<short id>:<rank>] ".
// The short id is the node id itself up to 12 characters, else its first 8.
std::string node_short_id(const std::string& node_id);
std::string log_line_prefix(const std::string& node_id, int rank);

class Head {
 public:
  explicit Head(HeadOptions options);  // validate(options); nothing runs until start()
  ~Head();                             // stop()
  Head(const Head&) = delete;
  Head& operator=(const Head&) = delete;

  // Opens the store (nodes it knew become "pending" until they register again), listens and
  // starts the background tick; returns once listening. Error naming the database or the address
  // when either fails. start() and stop() are called from one thread.
  void start();
  // Closes log tails, stops serving and the tick; blocks until running handlers have returned
  // (well under a second). Idempotent; the store keeps everything.
  void stop();
  int port() const;         // after start()
  std::string url() const;  // "http://<bind address>:<port>"
  // After start(): the token every call needs (the one given or the one generated), or nullopt
  // when unauthenticated; and the generated token's file, empty when one was given.
  const std::optional<std::string>& token() const;
  std::filesystem::path generated_token_file() const;

  // The cluster snapshot served at GET /api/cluster/status:
  // {"time": ISO8601, "nodes": [{node_id, hostname, address, state, reason,
  //    resources{cpu, gpu, memory_bytes}, usage{cpu_used (CPUs of placed ranks),
  //    memory_used_bytes, gpu_used (GPUs of placed ranks)}, heartbeat_age_s,
  //    ranks[{job_id, ranks[...]}]}],
  //  "failures": [{node_id, hostname, time, reason}], "demands": [{job_id, cpu, gpu, nodes}]
  //  (cpu and gpu per node, nodes = the minimum), "jobs": {"PENDING": n, ...}}.
  // Thread-safe.
  nlohmann::json status();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::cluster
