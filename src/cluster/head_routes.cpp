#include <cctype>
#include <charconv>

#include "cluster/dashboard.h"
#include "cluster/head_impl.h"
#include "trainyard/cluster/auth.h"
#include "trainyard/cluster/job_spec.h"
#include "trainyard/elastic/head_backend.h"

#ifndef TRAINYARD_VERSION_STRING
#define TRAINYARD_VERSION_STRING "0.1.0"
#endif

// The head's HTTP API: Ray's Jobs API, the worker protocol, the cluster status and the rendezvous
// endpoints (paths in cluster/api.h), each a thin handler over Head::Impl's state. add_routes()
// registers them one group per resource, in that order; a handler that is a step of its own is a
// member of Head::Impl, defined after its group.

namespace trainyard::cluster {

using nlohmann::json;
namespace f = api::field;
using namespace head_detail;

namespace {
constexpr std::int64_t kLogPageLines = 10'000;  // per GET of /logs?after=N
}  // namespace

// Every handler: a store that cannot be written for want of space is 507 with the reason, not
// a 500 (Note [A full disk] in job_store.cpp).
struct Head::Impl::Routes {
  net::HttpServer& http;  // Head::Impl's server, which outlives the registration

  void route(const std::string& method, std::string_view pattern, net::HttpHandler handler) {
    http.route(method, std::string(pattern),
               [handler = std::move(handler)](const net::ServerRequest& req) {
                 try {
                   return handler(req);
                 } catch (const StoreFullError& e) {
                   throw net::HttpStatusError(507, e.what());
                 }
               });
  }
  void websocket(std::string_view pattern,
                 net::WebSocketHandler handler,
                 net::WebSocketAdmission admission) {
    http.websocket(std::string(pattern), std::move(handler), std::move(admission));
  }
};

void Head::Impl::add_routes() {
  server->set_hook([this](const net::ServerRequest& req) -> std::optional<net::ServerResponse> {
    // The dashboard's files hold no data; its script sends the token on every call.
    if (o.token && is_dashboard_request(req)) return std::nullopt;
    return check_request(req, o.token);
  });
  Routes routes{*server};
  add_version_routes(routes);
  add_job_routes(routes);
  add_node_routes(routes);
  add_cluster_routes(routes);
  add_rendezvous_routes(routes);
}

void Head::Impl::add_version_routes(Routes& routes) {
  routes.route("GET", api::kVersionPath, [](const net::ServerRequest&) {
    return json_response({{"version", "2"},
                          {"ray_version", "2.9.0"},
                          {"ray_commit", "trainyard"},
                          {"trainyard_version", TRAINYARD_VERSION_STRING}});
  });
}

// --- Ray Jobs API --------------------------------------------------------------------------------

void Head::Impl::add_job_routes(Routes& routes) {
  routes.route("POST", api::kJobsPath,
               [this](const net::ServerRequest& req) { return submit_job(req); });

  routes.route("GET", api::kJobsPath, [this](const net::ServerRequest&) {
    std::lock_guard<std::mutex> lock(mu);
    json out = json::array();
    for (JobRecord* j : jobs_in_order()) out.push_back(job_json(*j));
    return json_response(out);
  });

  routes.route("GET", api::kJobPattern, [this](const net::ServerRequest& req) {
    std::lock_guard<std::mutex> lock(mu);
    return json_response(job_json(find_job(req.params.at("id"))));
  });

  routes.route("DELETE", api::kJobPattern, [this](const net::ServerRequest& req) {
    std::lock_guard<std::mutex> lock(mu);
    JobRecord& j = find_job(req.params.at("id"));
    if (!api::is_terminal_status(j.status)) {
      throw net::HttpStatusError(400,
                                 "Job '" + j.job_id + "' is " + j.status +
                                     ": only a finished job (STOPPED, SUCCEEDED or FAILED) can "
                                     "be deleted. Hint: stop it first.");
    }
    std::string id = j.job_id;
    store->delete_job(id);
    jobs.erase(id);
    return json_response({{f::kDeleted, true}});
  });

  routes.route("POST", api::kJobStopPattern,
               [this](const net::ServerRequest& req) { return stop_job(req); });
  routes.route("GET", api::kJobLogsPattern,
               [this](const net::ServerRequest& req) { return job_logs(req); });
  routes.websocket(
      api::kJobLogsTailPattern,
      [this](std::shared_ptr<net::WebSocketConnection> ws) { follow_job_logs(std::move(ws)); },
      [this](const net::ServerRequest& req) { return admit_log_follower(req); });

  // Ray's client asks for (GET) and uploads (PUT) a runtime_env working_dir or py_modules here
  // before it submits; a 404 would read "not there yet, upload it", and the upload's 404 "No such
  // path". Both say instead what the submission's runtime_env check would.
  const auto refuse_package = [](const net::ServerRequest&) -> net::ServerResponse {
    throw net::HttpStatusError(
        400,
        "The runtime_env keys 'working_dir' and 'py_modules' are not supported (Ray's client "
        "uploads them here before it submits): trainyard runs the entrypoint in the worker's own "
        "environment and takes only runtime_env.env_vars. Hint: put the files on a path the "
        "nodes share and start there, e.g. the entrypoint 'cd /shared/project && python "
        "train.py'.");
  };
  routes.route("GET", api::kPackagePattern, refuse_package);
  routes.route("PUT", api::kPackagePattern, refuse_package);
}

net::ServerResponse Head::Impl::submit_job(const net::ServerRequest& req) {
  JobRecord job;
  const auto submission = read_message<wire::JobSubmission>(req);
  try {
    job = job_from_submission(submission);
  } catch (const InvalidArgumentError& e) {
    throw net::HttpStatusError(400, e.what());
  }
  std::lock_guard<std::mutex> lock(mu);
  if (jobs.count(job.job_id) || !store->insert_job(job)) {
    throw net::HttpStatusError(409, "A job with submission_id '" + job.submission_id +
                                        "' already exists. Hint: give another submission_id, or "
                                        "none for a new one.");
  }
  store->append_event(job.job_id, "submitted", job.entrypoint);
  log->info("job {} submitted: nodes {} x {} rank(s)", job.job_id, job.launch.nodes,
            job.launch.nproc_per_node);
  jobs[job.job_id] = job;
  schedule();
  return json_response(
      wire::SubmitAnswer{.job_id = job.job_id, .submission_id = job.submission_id});
}

net::ServerResponse Head::Impl::stop_job(const net::ServerRequest& req) {
  bool stopped = false;
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu);
    JobRecord& j = find_job(req.params.at("id"));
    id = j.job_id;
    if (!api::is_terminal_status(j.status)) {
      j.stop_requested = true;
      set_terminal(j, api::kStopped, "Job was intentionally stopped.");
      save(j);
      stopped = true;
    }
  }
  if (stopped) wake_tails();
  return json_response(wire::StopAnswer{.stopped = stopped});
}

net::ServerResponse Head::Impl::job_logs(const net::ServerRequest& req) {
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu);
    id = find_job(req.params.at("id")).job_id;
  }
  // Ray's answer is the whole log. `?after=N` (trainyard's, for followers such as
  // `trainyard logs -f`) pages instead: the lines after line N, at most kLogPageLines, and
  // "next", the N to ask for next.
  const auto after = req.query.find("after");
  std::int64_t from = 0;
  std::int64_t limit = INT64_MAX;
  if (after != req.query.end()) {
    // The whole value as a decimal line number: "1e3" or "5x" is not 1 or 5.
    const auto& text = after->second;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), from);
    if (ec != std::errc() || end != text.data() + text.size() || from < 0)
      throw net::HttpStatusError(
          400, "The query 'after' must be a line number (0, 1, 2, ...); got '" + text + "'.");
    limit = kLogPageLines;
  }
  wire::LogPage page;
  std::int64_t next = from;
  for (const LogLine& l : store->read_logs(id, from, limit)) {
    page.logs += log_line_prefix(l.node_id, l.rank) + l.text + "\n";
    next = l.order;
  }
  if (after != req.query.end()) page.next = next;
  return json_response(page);
}

// Followers are capped per job and in all: each costs the head a buffer and a share of the
// tail pump (Note [Tails on their own thread]).
std::optional<net::ServerResponse> Head::Impl::admit_log_follower(const net::ServerRequest& req) {
  const std::string& id = req.params.at("id");
  std::size_t of_job = 0, all = 0;
  {
    std::lock_guard<std::mutex> lock(tails_mu);
    for (const auto& t : tails) {
      if (t->ws->closed()) continue;
      ++all;
      if (t->job_id == id) ++of_job;
    }
  }
  if (of_job >= static_cast<std::size_t>(o.max_log_followers_per_job)) {
    return net::ServerResponse::json_error(
        429, "Job '" + id + "' has " + std::to_string(of_job) +
                 " log followers, the most a job may have (--max-log-followers-per-job). "
                 "Hint: GET " +
                 api::job_logs_path(id) +
                 "?after=N pages through the log "
                 "without holding a connection.");
  }
  if (all >= static_cast<std::size_t>(o.max_log_followers)) {
    return net::ServerResponse::json_error(
        429, "The head has " + std::to_string(all) +
                 " log followers, the most it serves at once. Try again later, or page "
                 "through GET " +
                 api::job_logs_path(id) + "?after=N.");
  }
  return std::nullopt;
}

void Head::Impl::follow_job_logs(std::shared_ptr<net::WebSocketConnection> ws) {
  std::string id = ws->request().params.at("id");
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!jobs.count(id)) {
      ws->send_text("Job '" + id + "' does not exist.\n");
      ws->close();
      return;
    }
  }
  auto t = std::make_shared<Tail>();
  t->ws = ws;
  t->job_id = id;
  {
    std::lock_guard<std::mutex> lock(tails_mu);
    tails.push_back(t);
  }
  pump(t);
}

// --- worker protocol -----------------------------------------------------------------------------

void Head::Impl::add_node_routes(Routes& routes) {
  routes.route("POST", api::kNodesPath,
               [this](const net::ServerRequest& req) { return register_node(req); });
  routes.route("POST", api::kNodeHeartbeatPattern,
               [this](const net::ServerRequest& req) { return node_heartbeat(req); });

  routes.route("POST", api::kNodeLeavePattern, [this](const net::ServerRequest& req) {
    const std::string reason = read_message<wire::LeaveRequest>(req).reason;
    std::string id = req.params.at("node");
    std::lock_guard<std::mutex> lock(mu);
    auto it = nodes.find(id);
    if (it == nodes.end()) throw net::HttpStatusError(404, "Node '" + id + "' is not registered.");
    NodeRecord& n = it->second;
    n.state = reason;
    n.reason = reason;
    n.state_since = now_seconds();
    store->put_node(n);
    log->info("node {} left ({})", id, reason);
    node_lost(id, "left (" + reason + ")");
    return json_response(json::object());
  });

  routes.route("POST", api::kWorkerLogsPattern, [this](const net::ServerRequest& req) {
    const auto batch = read_message<wire::LogBatch>(req);
    std::string id = req.params.at("id");
    std::vector<JobStore::RankText> lines;
    lines.reserve(batch.lines.size());
    for (const auto& l : batch.lines) lines.push_back({l.rank, l.text});
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!same_instance(find_job(id), batch.instance)) {
        // Another submission's lines (Note [Job instances on the wire]): taken, and dropped.
        return json_response(wire::LogBatchAnswer{
            .next_seq = batch.first_seq + static_cast<std::int64_t>(batch.lines.size())});
      }
    }
    int64_t next = store->append_logs(id, batch.node_id, batch.first_seq, lines);
    wake_tails();
    return json_response(wire::LogBatchAnswer{.next_seq = next});
  });
}

net::ServerResponse Head::Impl::register_node(const net::ServerRequest& req) {
  const auto reg = read_message<wire::Registration>(req);
  const std::string& id = reg.node_id;
  std::lock_guard<std::mutex> lock(mu);
  double now = now_seconds();
  NodeRecord& n = nodes[id];
  n.node_id = id;
  n.hostname = reg.hostname;
  n.address = reg.address.empty() ? req.remote_address : reg.address;
  n.resources = reg.resources;
  n.state = api::kNodeAlive;
  n.reason = "";
  n.registered_at = now;
  n.last_heartbeat_at = now;
  n.state_since = now;
  n.usage = {};
  store->put_node(n);
  log->info("node {} ({}, {}) registered: {}", id, n.hostname, n.address, json(n.resources).dump());
  reconcile_registration(id, reg.jobs);
  for (const auto& report : reg.jobs) apply_report(id, report);
  schedule();
  return json_response(
      wire::RegistrationAnswer{.heartbeat_interval_ms = o.heartbeat_interval.count()});
}

net::ServerResponse Head::Impl::node_heartbeat(const net::ServerRequest& req) {
  const auto hb = read_message<wire::Heartbeat>(req);
  std::string id = req.params.at("node");
  wire::HeartbeatAnswer out;
  // Parsed before taking mu: a large snapshot does not hold up the rest of the head.
  std::shared_ptr<const metrics::Snapshot> snapshot = parse_node_metrics(id, hb.metrics);
  double time = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = nodes.find(id);
    if (it == nodes.end() ||
        (it->second.state != api::kNodeAlive && it->second.state != api::kNodeSuspect)) {
      return json_response(out);
    }
    NodeRecord& n = it->second;
    n.last_heartbeat_at = time = now_seconds();
    // Note [The head's metrics]: a heartbeat without (valid) metrics leaves the node without.
    if (snapshot) {
      node_metrics[id] = snapshot;
    } else {
      node_metrics.erase(id);
    }
    n.usage = hb.usage;
    if (n.state == api::kNodeSuspect) {
      n.state = api::kNodeAlive;
      n.state_since = n.last_heartbeat_at;
      store->put_node(n);
      log->info("node {} is alive again", id);
    }
    for (const auto& r : hb.jobs) apply_report(id, r);
    schedule();
    out.registered = true;
    for (const auto& r : hb.jobs) {
      if (r.state != wire::ReportState::kRunning) continue;
      auto j = jobs.find(r.job_id);
      if (j == jobs.end() || api::is_terminal_status(j->second.status) ||
          j->second.stop_requested || !contains(j->second.assigned_nodes, id) ||
          !same_instance(j->second, r.instance)) {
        out.stop.push_back(r.job_id);
      }
    }
    for (JobRecord* j : jobs_in_order()) {
      if (api::is_terminal_status(j->status) || j->stop_requested) continue;
      if (contains(j->assigned_nodes, id) && !j->reports.count(id)) {
        out.assignments.push_back(assignment(*j));
      }
    }
  }
  if (snapshot) on_metrics(id, time, *snapshot);
  wake_tails();  // a job may have ended
  return json_response(out);
}

// --- cluster status and observability (docs/METRICS.md) ------------------------------------------

void Head::Impl::add_cluster_routes(Routes& routes) {
  routes.route("GET", api::kStatusPath, [this](const net::ServerRequest&) {
    std::lock_guard<std::mutex> lock(mu);
    return json_response(status_snapshot());
  });

  routes.route("GET", api::kMetricsHistoryPath, [this](const net::ServerRequest& req) {
    std::optional<std::string> job;
    if (auto q = req.query.find("job"); q != req.query.end()) job = q->second;
    std::size_t max_points = 0;  // all; see Note [Thinned history]
    if (auto q = req.query.find("max_points"); q != req.query.end()) {
      const std::string& v = q->second;
      const bool digits =
          !v.empty() && v.size() <= 6 &&
          std::all_of(v.begin(), v.end(), [](unsigned char c) { return std::isdigit(c); });
      if (!digits || std::stoul(v) < 2) {
        throw net::HttpStatusError(
            400, "max_points must be a whole number from 2 to 999999; got '" + v + "'.");
      }
      max_points = std::stoul(v);
    }
    return json_response(metrics_history(job, max_points));
  });

  routes.route("GET", api::kDashboardPath,
               [](const net::ServerRequest&) { return *dashboard_response(""); });
  routes.route("GET", std::string(api::kDashboardPath) + "/{file}",
               [](const net::ServerRequest& req) {
                 auto res = dashboard_response(req.params.at("file"));
                 if (!res) {
                   throw net::HttpStatusError(
                       404, "The dashboard has no file '" + req.params.at("file") + "'.");
                 }
                 return *res;
               });

  // Prometheus' scrape target (Note [The head's metrics]); behind the token like every route.
  routes.route("GET", api::kMetricsPath,
               [this](const net::ServerRequest&) { return metrics_response(); });
}

json Head::Impl::metrics_history(const std::optional<std::string>& job, std::size_t max_points) {
  std::vector<HistoryNodeInfo> node_info;
  std::vector<HistoryJobInfo> job_info;
  const double now = now_seconds();
  {
    std::lock_guard<std::mutex> lock(mu);
    for (NodeRecord* n : nodes_in_order()) {
      node_info.push_back(
          {n->node_id, n->hostname, n->state, std::max(0.0, now - n->last_heartbeat_at)});
    }
    for (JobRecord* j : jobs_in_order()) job_info.push_back({j->job_id, j->status});
    if (job && !jobs.count(*job) && !history->has_job(*job)) {
      throw net::HttpStatusError(404, "Job '" + *job + "' does not exist.");
    }
  }
  return history->json(node_info, job_info, job, now,
                       std::chrono::duration<double>(o.heartbeat_interval).count(), max_points);
}

// --- rendezvous (elastic::HeadBackend) -----------------------------------------------------------

void Head::Impl::add_rendezvous_routes(Routes& routes) {
  routes.route("GET", api::kRdzvPattern, [this](const net::ServerRequest& req) {
    std::string run_id = req.params.at("run_id");
    auto st = store->get_rdzv(run_id);
    if (!st) throw net::HttpStatusError(404, "No rendezvous state for run '" + run_id + "'.");
    return json_response(elastic::HeadRdzvState{.state = st->state, .token = st->token});
  });

  routes.route("POST", api::kRdzvPattern, [this](const net::ServerRequest& req) {
    const auto w = read_message<elastic::HeadRdzvWrite>(req);
    RdzvState r = store->set_rdzv(req.params.at("run_id"), w.state, w.token);
    return json_response(
        elastic::HeadRdzvState{.state = r.state, .token = r.token, .written = r.written});
  });
}

}  // namespace trainyard::cluster
