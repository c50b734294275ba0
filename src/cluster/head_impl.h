// The head's private state (Head::Impl), shared by head.cpp (start and stop), head_state.cpp
// (nodes, jobs, the scheduler, log tails) and head_routes.cpp (the HTTP API). See Note [Head
// state] in head_state.cpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "trainyard/cluster/api.h"
#include "trainyard/cluster/head.h"
#include "trainyard/cluster/job_store.h"
#include "trainyard/cluster/metrics_history.h"
#include "trainyard/cluster/state_dir.h"
#include "trainyard/cluster/status_report.h"
#include "trainyard/cluster/wire.h"
#include "trainyard/log.h"
#include "trainyard/metrics/snapshot.h"
#include "trainyard/net/http_server.h"

namespace trainyard::cluster {
namespace head_detail {

using json = nlohmann::json;

// Note [Head time]: the head's clock for heartbeat ages, node states and the metrics history is
// the wall time at the head's start plus a steady clock's elapsed time. It reads as wall time
// (the dashboard shows it), yet a system clock stepped by NTP neither declares every node dead
// (a jump forward) nor freezes the history until the clock catches up (a jump back).
inline double now_seconds() {
  using namespace std::chrono;
  static const struct {
    system_clock::time_point wall = system_clock::now();
    steady_clock::time_point steady = steady_clock::now();
  } start;
  return duration<double>(start.wall.time_since_epoch() + (steady_clock::now() - start.steady))
      .count();
}

inline int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline std::string iso8601(double unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// `body`: a json, or any message of wire.h.
inline net::ServerResponse json_response(const nlohmann::json& body, int status = 200) {
  net::ServerResponse res;
  res.status = status;
  res.body = body.dump();
  return res;
}

// The request's body as message T (wire.h): 400 naming the field when it is malformed, 413 naming
// the limit when a field is too large.
template <typename T>
T read_message(const net::ServerRequest& req) {
  try {
    return wire::parse_message(req.body, "request body").get<T>();
  } catch (const wire::MessageTooLargeError& e) {
    throw net::HttpStatusError(413, e.what());
  } catch (const InvalidArgumentError& e) {
    throw net::HttpStatusError(400, e.what());
  } catch (const nlohmann::json::exception& e) {
    throw net::HttpStatusError(400, std::string("The request body is malformed: ") + e.what());
  }
}

inline bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// A node that may still send lines or reports.
inline bool node_is_up(const std::string& state) {
  return state == api::kNodeAlive || state == api::kNodeSuspect || state == api::kNodePending;
}

}  // namespace head_detail

struct Head::Impl {
  using json = nlohmann::json;

  // A WebSocket following one job's log lines.
  struct Tail {
    std::shared_ptr<net::WebSocketConnection> ws;
    std::string job_id;
    std::mutex mu;           // one pump at a time
    int64_t last_order = 0;  // the last line sent
    bool done = false;
  };
  HeadOptions o;
  std::chrono::milliseconds suspect_after{0};
  std::unique_ptr<StateDir> state_dir;  // held while started (Note [One owner per state directory])
  std::unique_ptr<JobStore> store;
  std::filesystem::path generated_token_file;  // set by start() when it made or read one
  bool token_made = false;                     // made by this start, not read from an earlier
  std::unique_ptr<net::HttpServer> server;
  std::shared_ptr<spdlog::logger> log = logger("head");
  std::mutex mu;  // guards nodes and jobs; see Note [Head state]
  std::map<std::string, NodeRecord> nodes;
  std::map<std::string, JobRecord> jobs;
  // Recent metrics per node and rank for the history API and the dashboard; thread-safe on its
  // own (not under `mu`).
  std::unique_ptr<MetricsHistory> history;
  std::mutex tails_mu;
  std::vector<std::shared_ptr<Tail>> tails;
  // Note [Tails on their own thread]
  // Log tails are pumped on `tail_pumper`, woken by wake_tails() (new lines, a job's end) and
  // every tick_interval, never on a request's thread. A WebSocket write only queues (the server
  // writes what the client takes, Note [Serving hostile clients]): a tail stops at
  // kTailHighWaterBytes unread and goes on at a later pump, and a follower that reads nothing is
  // dropped by the server, so no follower delays another, the tick or a heartbeat. Followers are
  // capped per job and in all (HeadOptions), past that 429. Guarded by tails_mu: tails_wanted.
  static constexpr std::size_t kTailHighWaterBytes = 256 << 10;
  std::thread tail_pumper;
  std::condition_variable tails_cv;
  bool tails_wanted = false;
  bool stopping_tails = false;
  // Each node's latest metrics (a heartbeat's "metrics" field), in memory only: a restarted
  // head has none until the next heartbeats. Guarded by mu; see Note [The head's metrics].
  std::map<std::string, std::shared_ptr<const metrics::Snapshot>> node_metrics;
  std::mutex metrics_warn_mu;
  std::map<std::string, std::chrono::steady_clock::time_point> metrics_warned;  // by node
  // See Note [A head that did not run]. Guarded by mu.
  static constexpr double kPauseSlackSeconds = 1.0;
  double last_tick_at = 0;  // now_seconds() of the last tick_nodes(); 0 before the first
  // See Note [A head that turned connections away]. Guarded by mu.
  struct SilenceCredit {
    double heartbeat_at = 0;  // the last_heartbeat_at (or state_since) the credit moved it to
    double seconds = 0;       // credited since the node's last heartbeat
  };
  std::map<std::string, SilenceCredit> silence_credit;  // by node
  std::uint64_t turned_away = 0;                        // the server's evictions and refusals
  bool turning_away = false;                            // in the last tick: said once
  static constexpr std::chrono::seconds kStoreFullLogEvery{30};
  std::chrono::steady_clock::time_point store_full_logged_at{};  // ticker thread only
  std::thread ticker;
  std::mutex tick_mu;
  std::condition_variable tick_cv;
  bool stopping = false;

  // --- helpers; `mu` held ------------------------------------------------------------------------
  void save(JobRecord& j);
  void set_terminal(JobRecord& j, std::string_view status, const std::string& message);
  // The node's latest report on the job, or nullptr.
  const wire::JobReport* report_of(const JobRecord& j, const std::string& node) const;
  bool reported(const JobRecord& j, const std::string& node, wire::ReportState state) const;

  // Whether the job's ranks take resources on `node` now (Note [Head state]).
  bool placed_on(const JobRecord& j, const std::string& node) const;
  std::pair<double, double> used_on(const std::string& node) const;
  std::vector<JobRecord*> jobs_in_order();
  std::vector<NodeRecord*> nodes_in_order();
  bool all_assigned_succeeded(const JobRecord& j) const;
  bool any_succeeded(const JobRecord& j) const;

  // The gang scheduler: places each PENDING job, in submission order, on min..max alive nodes
  // with room for nproc_per_node ranks, all at once or not at all; grows RUNNING elastic jobs.
  void schedule();

  // Takes a node off one job (it died, left, or lost the job); the job fails when fewer than
  // min_nodes remain and none succeeded, or goes back to the queue if it had not started.
  void drop_node(JobRecord& j, const std::string& node_id, const std::string& why);

  // A node that is gone no longer holds the CPUs and GPUs of the job's ranks it ran.
  void release_node(JobRecord& j, const std::string& node_id);

  // A node left the cluster (died or left): take it off all its jobs and release what its ranks
  // held.
  void node_lost(const std::string& node_id, const std::string& why);

  // A node registered (again) with `reports`: a job it was running that it no longer reports
  // was lost with the worker's restart.
  void reconcile_registration(const std::string& node_id,
                              const std::vector<wire::JobReport>& reports);
  void apply_report(const std::string& node_id, const wire::JobReport& r);
  // Whether a message about `instance` is about job j's submission (Note [Job instances on the
  // wire]).
  bool same_instance(const JobRecord& j, wire::Instance instance) const;
  wire::Assignment assignment(const JobRecord& j) const;

  // Node lifecycle: alive -> suspect -> dead by heartbeat age; pending (after a restart) -> dead.
  void tick_nodes();
  // Note [A head that turned connections away] (head_state.cpp).
  void credit_turned_away_silence(double now, double tick_seconds, double dead_s);
  bool tail_finished(const std::string& job_id);
  bool logs_complete(const JobRecord& j) const;

  // Sends a tail the lines it has not sent; closes it once the job is over. Not under `mu`.
  void pump(const std::shared_ptr<Tail>& t);
  void pump_tails(const std::string& job_id);
  void wake_tails();  // see Note [Tails on their own thread]
  void tick();
  json job_json(const JobRecord& j) const;
  JobRecord& find_job(const std::string& id);
  ClusterSnapshot status_snapshot();
  // The history API's answer (`mu` not held; takes it).
  // max_points: 0 for every point, else each series thinned (Note [Thinned history]).
  json metrics_history(const std::optional<std::string>& job, std::size_t max_points);

  // --- the HTTP API (head_routes.cpp), its routes grouped by resource ----------------------------
  struct Routes;  // registers on `server`; a handler's StoreFullError answers 507
  // The authentication hook and every group below; before the server starts.
  void add_routes();
  void add_version_routes(Routes& routes);
  void add_job_routes(Routes& routes);         // Ray's Jobs API, the log tail, runtime_env packages
  void add_node_routes(Routes& routes);        // the worker protocol
  void add_cluster_routes(Routes& routes);     // status, metrics, the dashboard
  void add_rendezvous_routes(Routes& routes);  // elastic::HeadBackend's state
  // Handlers that are a step of their own; `mu` not held (each takes it where it needs it).
  net::ServerResponse submit_job(const net::ServerRequest& req);
  net::ServerResponse stop_job(const net::ServerRequest& req);
  net::ServerResponse job_logs(const net::ServerRequest& req);  // the whole log, or a page
  std::optional<net::ServerResponse> admit_log_follower(const net::ServerRequest& req);
  void follow_job_logs(std::shared_ptr<net::WebSocketConnection> ws);
  net::ServerResponse register_node(const net::ServerRequest& req);
  net::ServerResponse node_heartbeat(const net::ServerRequest& req);

  // --- metrics (head_metrics.cpp) ----------------------------------------------------------------
  // The heartbeat's metrics field of node `node_id` as a snapshot: null when absent or malformed (a
  // malformed one is logged, at most once a minute per node, and never fails the heartbeat). Not
  // under mu.
  std::shared_ptr<const metrics::Snapshot> parse_node_metrics(const std::string& node_id,
                                                              const json& metrics);
  // A heartbeat of an alive node brought `snapshot` (taken at `time`, seconds since the epoch):
  // the one place where every node snapshot the head accepts passes, called after it replaced the
  // node's latest. Not under mu. The history's ring buffers are fed here.
  void on_metrics(const std::string& node_id, double time, const metrics::Snapshot& snapshot);
  // GET /metrics: the cluster's families and every up node's latest snapshot, with node labels.
  metrics::Snapshot cluster_metrics();
  net::ServerResponse metrics_response();
};

}  // namespace trainyard::cluster
