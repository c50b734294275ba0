#include "trainyard/cluster/head.h"

#include <algorithm>
#include <condition_variable>
#include <ctime>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "trainyard/cluster/api.h"
#include "trainyard/cluster/auth.h"
#include "trainyard/cluster/job_spec.h"
#include "trainyard/cluster/job_store.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/net/http_server.h"

#ifndef TRAINYARD_VERSION_STRING
#define TRAINYARD_VERSION_STRING "0.1.0"
#endif

// Note [Head state]
// The head keeps nodes and jobs in memory, behind one mutex, and writes every change of them
// through to the JobStore before answering; a restarted head reads them back. Heartbeat times
// and usage are not written (a restarted head has no heartbeats anyway: the nodes it knew are
// "pending" until they register again, and dead when they do not within dead_after).
// A job is PENDING until placed, still PENDING once placed (assigned_nodes set) until a node
// reports it running, then RUNNING. A placed job's Assignment is sent in every heartbeat answer
// to an assigned node until that node reports on the job (the worker ignores an assignment of a
// job it already runs), so a lost answer loses nothing. Reports are taken only from assigned
// nodes; a node reporting a job running that it should not run (the job is terminal, stopped,
// deleted, or the node was taken off it) is told to stop it in the heartbeat's answer.
// A node's CPUs and GPUs are taken by a job's ranks while the job is placed there and not
// finished on that node, or while the node still reports it running (a stopped job's ranks
// until they are gone).

namespace trainyard::cluster {
namespace {

using nlohmann::json;
namespace f = api::field;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string iso8601(double unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

net::HttpResponse json_response(const json& body, int status = 200) {
  net::HttpResponse res;
  res.status = status;
  res.body = body.dump();
  return res;
}

json parse_body(const net::HttpRequest& req) {
  if (req.body.empty()) return json::object();
  json j = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw net::HttpError(400, "The request body is not valid JSON.");
  return j;
}

std::string required_string(const json& body, const char* field) {
  auto it = body.find(field);
  if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) {
    throw net::HttpError(
        400, std::string("The field '") + field + "' is missing or is not a non-empty string.");
  }
  return it->get<std::string>();
}

double number_or(const json& j, const char* field, double fallback) {
  auto it = j.find(field);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

bool is_report_terminal(const std::string& s) {
  return s == api::kReportSucceeded || s == api::kReportFailed || s == api::kReportStopped;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// A node that may still send lines or reports.
bool node_is_up(const std::string& state) {
  return state == api::kNodeAlive || state == api::kNodeSuspect || state == api::kNodePending;
}

}  // namespace

std::string node_short_id(const std::string& node_id) {
  return node_id.size() <= 12 ? node_id : node_id.substr(0, 8);
}

std::string log_line_prefix(const std::string& node_id, int rank) {
  return "[" + node_short_id(node_id) + ":" + std::to_string(rank) + "] ";
}

void validate(const HeadOptions& o) {
  TY_CHECK(!o.state_dir.empty(), "HeadOptions.state_dir is empty: give the head a directory for ",
           "its database (--state-dir).");
  TY_CHECK(o.port >= 0 && o.port <= 65535, "HeadOptions.port must be in [0, 65535]; got ", o.port,
           ".");
  TY_CHECK(o.heartbeat_interval.count() > 0, "HeadOptions.heartbeat_interval must be positive; ",
           "got ", o.heartbeat_interval.count(), " ms.");
  TY_CHECK(o.suspect_after.count() >= 0, "HeadOptions.suspect_after must not be negative; got ",
           o.suspect_after.count(), " ms.");
  auto suspect = o.suspect_after.count() > 0 ? o.suspect_after : 3 * o.heartbeat_interval;
  TY_CHECK(o.dead_after > suspect, "HeadOptions.dead_after (", o.dead_after.count(),
           " ms) must be longer than suspect_after (", suspect.count(), " ms).");
  TY_CHECK(o.tick_interval.count() > 0, "HeadOptions.tick_interval must be positive; got ",
           o.tick_interval.count(), " ms.");
  TY_CHECK(o.http_threads >= 2, "HeadOptions.http_threads must be at least 2; got ", o.http_threads,
           ".");
  check_bind_policy(o.bind_address, o.token);
}

struct Head::Impl {
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
  std::unique_ptr<JobStore> store;
  std::unique_ptr<net::HttpServer> server;
  std::shared_ptr<spdlog::logger> log = logger("head");

  std::mutex mu;  // guards nodes and jobs; see Note [Head state]
  std::map<std::string, NodeRecord> nodes;
  std::map<std::string, JobRecord> jobs;

  std::mutex tails_mu;
  std::vector<std::shared_ptr<Tail>> tails;

  std::thread ticker;
  std::mutex tick_mu;
  std::condition_variable tick_cv;
  bool stopping = false;

  // --- helpers; `mu` held ------------------------------------------------------------------------
  void save(JobRecord& j) { store->update_job(j); }

  void set_terminal(JobRecord& j, std::string_view status, const std::string& message) {
    j.status = status;
    j.message = message;
    j.end_time_ms = now_ms();
    store->append_event(j.job_id, "status", std::string(status) + ": " + message);
    log->info("job {} {}: {}", j.job_id, status, message);
  }

  std::string report_state(const JobRecord& j, const std::string& node) const {
    auto it = j.reports.find(node);
    if (it == j.reports.end() || !it->is_object()) return "";
    return it->value(f::kState, "");
  }

  // Whether the job's ranks take resources on `node` now (Note [Head state]).
  bool placed_on(const JobRecord& j, const std::string& node) const {
    std::string r = report_state(j, node);
    if (r == api::kReportRunning) return true;
    return !api::is_terminal_status(j.status) && contains(j.assigned_nodes, node) &&
           !is_report_terminal(r);
  }

  std::pair<double, double> used_on(const std::string& node) const {
    double cpu = 0, gpu = 0;
    for (const auto& [id, j] : jobs) {
      if (!placed_on(j, node)) continue;
      cpu += job_cpus_per_node(j);
      gpu += job_gpus_per_node(j);
    }
    return {cpu, gpu};
  }

  std::vector<JobRecord*> jobs_in_order() {
    std::vector<JobRecord*> out;
    for (auto& [id, j] : jobs) out.push_back(&j);
    std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->order < b->order; });
    return out;
  }

  std::vector<NodeRecord*> nodes_in_order() {
    std::vector<NodeRecord*> out;
    for (auto& [id, n] : nodes) out.push_back(&n);
    std::sort(out.begin(), out.end(), [](auto* a, auto* b) {
      return a->registered_at != b->registered_at ? a->registered_at < b->registered_at
                                                  : a->node_id < b->node_id;
    });
    return out;
  }

  bool all_assigned_succeeded(const JobRecord& j) const {
    if (j.assigned_nodes.empty()) return false;
    for (const auto& n : j.assigned_nodes) {
      if (report_state(j, n) != api::kReportSucceeded) return false;
    }
    return true;
  }

  bool any_succeeded(const JobRecord& j) const {
    for (const auto& [n, r] : j.reports.items()) {
      if (r.is_object() && r.value(f::kState, "") == api::kReportSucceeded) return true;
    }
    return false;
  }

  // The gang scheduler: see HeadOptions and the rules. Considers jobs in submission order.
  void schedule() {
    std::map<std::string, std::pair<double, double>> free;  // alive nodes only
    for (NodeRecord* n : nodes_in_order()) {
      if (n->state != api::kNodeAlive) continue;
      auto [cpu, gpu] = used_on(n->node_id);
      free[n->node_id] = {number_or(n->resources, f::kCpu, 0) - cpu,
                          number_or(n->resources, f::kGpu, 0) - gpu};
    }
    std::vector<std::string> order;
    for (NodeRecord* n : nodes_in_order()) {
      if (free.count(n->node_id)) order.push_back(n->node_id);
    }
    for (JobRecord* j : jobs_in_order()) {
      if (api::is_terminal_status(j->status) || j->stop_requested) continue;
      bool fresh = j->status == api::kPending && j->assigned_nodes.empty();
      bool grow =
          j->status == api::kRunning && static_cast<int>(j->assigned_nodes.size()) < j->max_nodes;
      if (!fresh && !grow) continue;
      double cpu = job_cpus_per_node(*j), gpu = job_gpus_per_node(*j);
      std::vector<std::string> fit;
      for (const auto& id : order) {
        if (contains(j->assigned_nodes, id) || (grow && j->reports.contains(id))) continue;
        auto& [fc, fg] = free[id];
        if (fc + 1e-9 >= cpu && fg + 1e-9 >= gpu) fit.push_back(id);
        if (static_cast<int>(fit.size() + j->assigned_nodes.size()) >= j->max_nodes) break;
      }
      if (fresh && static_cast<int>(fit.size()) < j->min_nodes) continue;  // all or nothing
      if (fit.empty()) continue;
      for (const auto& id : fit) {
        free[id].first -= cpu;
        free[id].second -= gpu;
        j->assigned_nodes.push_back(id);
        j->reports.erase(id);
      }
      std::string list;
      for (const auto& id : fit) list += (list.empty() ? "" : ", ") + id;
      store->append_event(j->job_id, "assigned", list);
      log->info("job {} {} node(s) {}", j->job_id, fresh ? "placed on" : "grown onto", list);
      save(*j);
    }
  }

  // A node left the cluster (died or left): take it off its jobs. See the rules.
  // Takes a node off one job (it died, left, or lost the job): see the rules.
  void drop_node(JobRecord& j, const std::string& node_id, const std::string& why) {
    if (api::is_terminal_status(j.status) || !contains(j.assigned_nodes, node_id)) return;
    if (report_state(j, node_id) == api::kReportSucceeded) return;  // its part is done
    j.assigned_nodes.erase(std::remove(j.assigned_nodes.begin(), j.assigned_nodes.end(), node_id),
                           j.assigned_nodes.end());
    store->append_event(j.job_id, "node_lost", "node " + node_id + " " + why);
    if (all_assigned_succeeded(j)) {
      j.driver_exit_code = 0;
      set_terminal(j, api::kSucceeded, "Job finished successfully.");
    } else if (static_cast<int>(j.assigned_nodes.size()) < j.min_nodes && !any_succeeded(j)) {
      if (j.status == api::kRunning) {
        j.error_type = "NODE_DIED";
        j.failed_node = node_id;
        set_terminal(j, api::kFailed, "node " + node_id + " " + why);
      } else {
        // Placed but not started: back to the queue; the other nodes are told to stop.
        for (const auto& other : j.assigned_nodes) j.reports.erase(other);
        j.assigned_nodes.clear();
        store->append_event(j.job_id, "requeued", "node " + node_id + " " + why);
      }
    }
    save(j);
  }

  // A node left the cluster (died or left): take it off all its jobs.
  void node_lost(const std::string& node_id, const std::string& why) {
    for (JobRecord* j : jobs_in_order()) drop_node(*j, node_id, why);
  }

  // A node registered (again) with `reports`: a job it was running that it no longer reports
  // was lost with the worker's restart.
  void reconcile_registration(const std::string& node_id, const json& reports) {
    std::set<std::string> reported;
    if (reports.is_array()) {
      for (const auto& r : reports) {
        if (r.is_object()) reported.insert(r.value(f::kJobId, ""));
      }
    }
    for (JobRecord* j : jobs_in_order()) {
      if (report_state(*j, node_id) == api::kReportRunning && !reported.count(j->job_id)) {
        drop_node(*j, node_id, "restarted without the job");
      }
    }
  }

  void apply_report(const std::string& node_id, const json& r) {
    if (!r.is_object()) return;
    auto it = jobs.find(r.value(f::kJobId, ""));
    if (it == jobs.end()) return;
    JobRecord& j = it->second;
    if (!contains(j.assigned_nodes, node_id)) return;  // Note [Head state]
    if (j.reports.contains(node_id) && j.reports[node_id] == r) return;
    j.reports[node_id] = r;
    std::string state = r.value(f::kState, "");
    if (api::is_terminal_status(j.status)) {
      save(j);
      return;
    }
    if (state == api::kReportRunning) {
      if (j.status == api::kPending) {
        j.status = api::kRunning;
        j.message = "Job is running.";
        store->append_event(j.job_id, "status", "RUNNING: reported by node " + node_id);
      }
    } else if (state == api::kReportSucceeded) {
      if (all_assigned_succeeded(j)) {
        j.driver_exit_code = 0;
        set_terminal(j, api::kSucceeded, "Job finished successfully.");
      }
    } else if (state == api::kReportFailed) {
      std::string msg = r.value(f::kMessage, "");
      auto code = r.find(f::kExitCode);
      if (code != r.end() && code->is_number_integer()) j.driver_exit_code = code->get<int>();
      auto rank = r.find(f::kFailedRank);
      if (rank != r.end() && rank->is_number_integer()) j.failed_rank = rank->get<int>();
      j.failed_node = node_id;
      j.error_type = r.value(f::kErrorType, "");
      if (j.error_type.empty()) j.error_type = "ENTRYPOINT_FAILED";
      j.last_lines.clear();
      if (auto ll = r.find(f::kLastLines); ll != r.end() && ll->is_array()) {
        for (const auto& l : *ll) {
          if (l.is_string()) j.last_lines.push_back(l.get<std::string>());
        }
      }
      if (msg.empty()) msg = "The job failed on node " + node_id + ".";
      set_terminal(j, api::kFailed, msg);
    } else if (state == api::kReportStopped && !j.stop_requested) {
      drop_node(j, node_id, "stopped the job");
      return;
    }
    save(j);
  }

  json assignment(const JobRecord& j) const {
    json env = json::object();
    if (j.runtime_env.contains(f::kEnvVars)) env = j.runtime_env[f::kEnvVars];
    return json{{f::kJobId, j.job_id},
                {f::kEntrypoint, j.entrypoint},
                {f::kEnv, env},
                {f::kNprocPerNode, j.nproc_per_node},
                {f::kMinNodes, j.min_nodes},
                {f::kMaxNodes, j.max_nodes},
                {f::kMaxRestarts, j.max_restarts}};
  }

  // Node lifecycle: alive -> suspect -> dead by heartbeat age; pending (after a restart) -> dead.
  void tick_nodes() {
    double now = now_seconds();
    double suspect_s = std::chrono::duration<double>(suspect_after).count();
    double dead_s = std::chrono::duration<double>(o.dead_after).count();
    for (NodeRecord* n : nodes_in_order()) {
      bool up = n->state == api::kNodeAlive || n->state == api::kNodeSuspect;
      double age = now - (n->state == api::kNodePending ? n->state_since : n->last_heartbeat_at);
      if ((up || n->state == api::kNodePending) && age > dead_s) {
        n->state = api::kNodeDead;
        n->reason = "heartbeat timeout";
        n->state_since = now;
        store->put_node(*n);
        log->warn("node {} ({}) is dead: no heartbeat for {:.1f} s", n->node_id, n->hostname, age);
        node_lost(n->node_id, "died (heartbeat timeout)");
      } else if (n->state == api::kNodeAlive && age > suspect_s) {
        n->state = api::kNodeSuspect;
        n->state_since = now;
        store->put_node(*n);
        log->warn("node {} ({}) is suspect: no heartbeat for {:.1f} s", n->node_id, n->hostname,
                  age);
      }
    }
  }

  bool tail_finished(const std::string& job_id) {
    auto it = jobs.find(job_id);
    if (it == jobs.end()) return true;
    const JobRecord& j = it->second;
    if (!api::is_terminal_status(j.status)) return false;
    for (const auto& [node, r] : j.reports.items()) {
      if (!r.is_object() || r.value(f::kState, "") != api::kReportRunning) continue;
      auto n = nodes.find(node);
      if (n != nodes.end() && node_is_up(n->second.state)) return false;
    }
    return true;
  }

  // Sends a tail the lines it has not sent; closes it once the job is over. Not under `mu`.
  void pump(const std::shared_ptr<Tail>& t) {
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->done) return;
    if (t->ws->closed()) {
      t->done = true;
      return;
    }
    bool finished;
    {
      std::lock_guard<std::mutex> l(mu);
      finished = tail_finished(t->job_id);  // before reading: no line is missed
    }
    for (;;) {
      std::vector<LogLine> lines = store->read_logs(t->job_id, t->last_order, 1000);
      if (lines.empty()) break;
      std::string text;
      for (const LogLine& l : lines) text += log_line_prefix(l.node_id, l.rank) + l.text + "\n";
      t->last_order = lines.back().order;
      if (!t->ws->send_text(text)) {
        t->done = true;
        return;
      }
    }
    if (finished) {
      t->ws->close();
      t->done = true;
    }
  }

  void pump_tails(const std::string& job_id) {
    std::vector<std::shared_ptr<Tail>> all;
    {
      std::lock_guard<std::mutex> lock(tails_mu);
      tails.erase(std::remove_if(tails.begin(), tails.end(), [](auto& t) { return t->done; }),
                  tails.end());
      all = tails;
    }
    for (auto& t : all) {
      if (job_id.empty() || t->job_id == job_id) pump(t);
    }
  }

  void tick() {
    {
      std::lock_guard<std::mutex> lock(mu);
      tick_nodes();
      schedule();
    }
    pump_tails("");
  }

  json job_json(const JobRecord& j) const { return job_details(j, o.token); }

  JobRecord& find_job(const std::string& id) {
    auto it = jobs.find(id);
    if (it == jobs.end()) {
      throw net::HttpError(404, "Job '" + id + "' does not exist.");
    }
    return it->second;
  }

  json status_snapshot() {
    double now = now_seconds();
    json out = {{f::kTime, iso8601(now)},
                {f::kNodes, json::array()},
                {f::kFailures, json::array()},
                {f::kDemands, json::array()},
                {f::kJobs, json::object()}};
    for (std::string_view s :
         {api::kPending, api::kRunning, api::kStopped, api::kSucceeded, api::kFailed}) {
      out[f::kJobs][std::string(s)] = 0;
    }
    std::vector<JobRecord*> ordered = jobs_in_order();
    for (JobRecord* j : ordered) out[f::kJobs][j->status] = out[f::kJobs][j->status].get<int>() + 1;
    std::vector<NodeRecord*> dead;
    for (NodeRecord* n : nodes_in_order()) {
      json ranks = json::array();
      for (JobRecord* j : ordered) {
        if (!placed_on(*j, n->node_id)) continue;
        auto pos = std::find(j->assigned_nodes.begin(), j->assigned_nodes.end(), n->node_id);
        int index =
            pos == j->assigned_nodes.end() ? 0 : static_cast<int>(pos - j->assigned_nodes.begin());
        json r = json::array();
        for (int k = 0; k < j->nproc_per_node; ++k) r.push_back(index * j->nproc_per_node + k);
        ranks.push_back({{f::kJobId, j->job_id}, {f::kRanks, r}});
      }
      auto [cpu_used, gpu_used] = used_on(n->node_id);
      json resources = {
          {f::kCpu, number_or(n->resources, f::kCpu, 0)},
          {f::kGpu, number_or(n->resources, f::kGpu, 0)},
          {f::kMemoryBytes, static_cast<int64_t>(number_or(n->resources, f::kMemoryBytes, 0))}};
      json usage = {
          {f::kCpuUsed, cpu_used},
          {f::kMemoryUsedBytes, static_cast<int64_t>(number_or(n->usage, f::kMemoryUsedBytes, 0))}};
      out[f::kNodes].push_back({{f::kNodeId, n->node_id},
                                {f::kHostname, n->hostname},
                                {f::kAddress, n->address},
                                {f::kState, n->state},
                                {f::kReason, n->reason},
                                {f::kResources, resources},
                                {f::kUsage, usage},
                                {f::kHeartbeatAgeS, std::max(0.0, now - n->last_heartbeat_at)},
                                {f::kRanks, ranks}});
      if (n->state == api::kNodeDead) dead.push_back(n);
    }
    std::sort(dead.begin(), dead.end(),
              [](auto* a, auto* b) { return a->state_since > b->state_since; });
    for (size_t i = 0; i < dead.size() && static_cast<int>(i) < o.failures_shown; ++i) {
      out[f::kFailures].push_back({{f::kNodeId, dead[i]->node_id},
                                   {f::kHostname, dead[i]->hostname},
                                   {f::kTime, iso8601(dead[i]->state_since)},
                                   {f::kReason, dead[i]->reason}});
    }
    for (JobRecord* j : ordered) {
      if (j->status != api::kPending || !j->assigned_nodes.empty() || j->stop_requested) continue;
      out[f::kDemands].push_back({{f::kJobId, j->job_id},
                                  {f::kCpu, job_cpus_per_node(*j)},
                                  {f::kGpu, job_gpus_per_node(*j)},
                                  {f::kNodes, j->min_nodes}});
    }
    return out;
  }

  void add_routes();
};

void Head::Impl::add_routes() {
  net::HttpServer& s = *server;
  s.set_hook([this](const net::HttpRequest& req) { return check_request(req, o.token); });

  s.route("GET", std::string(api::kVersionPath), [](const net::HttpRequest&) {
    return json_response({{"version", "2"},
                          {"ray_version", "2.9.0"},
                          {"ray_commit", "trainyard"},
                          {"trainyard_version", TRAINYARD_VERSION_STRING}});
  });

  // --- Ray Jobs API ------------------------------------------------------------------------------
  s.route("POST", std::string(api::kJobsPath), [this](const net::HttpRequest& req) {
    JobRecord job;
    try {
      job = job_from_submission(parse_body(req));
    } catch (const InvalidArgumentError& e) {
      throw net::HttpError(400, e.what());
    }
    std::lock_guard<std::mutex> lock(mu);
    if (jobs.count(job.job_id) || !store->insert_job(job)) {
      throw net::HttpError(409, "A job with submission_id '" + job.submission_id +
                                    "' already exists. Hint: give another submission_id, or "
                                    "none for a new one.");
    }
    store->append_event(job.job_id, "submitted", job.entrypoint);
    log->info("job {} submitted: nodes {} x {} rank(s)", job.job_id, job.nodes, job.nproc_per_node);
    jobs[job.job_id] = job;
    schedule();
    return json_response({{f::kJobId, job.job_id}, {f::kSubmissionId, job.submission_id}});
  });

  s.route("GET", std::string(api::kJobsPath), [this](const net::HttpRequest&) {
    std::lock_guard<std::mutex> lock(mu);
    json out = json::array();
    for (JobRecord* j : jobs_in_order()) out.push_back(job_json(*j));
    return json_response(out);
  });

  s.route("GET", std::string(api::kJobPattern), [this](const net::HttpRequest& req) {
    std::lock_guard<std::mutex> lock(mu);
    return json_response(job_json(find_job(req.params.at("id"))));
  });

  s.route("DELETE", std::string(api::kJobPattern), [this](const net::HttpRequest& req) {
    std::lock_guard<std::mutex> lock(mu);
    JobRecord& j = find_job(req.params.at("id"));
    if (!api::is_terminal_status(j.status)) {
      throw net::HttpError(400, "Job '" + j.job_id + "' is " + j.status +
                                    ": only a finished job (STOPPED, SUCCEEDED or FAILED) can "
                                    "be deleted. Hint: stop it first.");
    }
    std::string id = j.job_id;
    store->delete_job(id);
    jobs.erase(id);
    return json_response({{f::kDeleted, true}});
  });

  s.route("POST", std::string(api::kJobStopPattern), [this](const net::HttpRequest& req) {
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
    if (stopped) pump_tails(id);
    return json_response({{f::kStopped, stopped}});
  });

  s.route("GET", std::string(api::kJobLogsPattern), [this](const net::HttpRequest& req) {
    std::string id;
    {
      std::lock_guard<std::mutex> lock(mu);
      id = find_job(req.params.at("id")).job_id;
    }
    std::string text;
    for (const LogLine& l : store->read_logs(id)) {
      text += log_line_prefix(l.node_id, l.rank) + l.text + "\n";
    }
    return json_response({{f::kLogs, text}});
  });

  s.websocket(std::string(api::kJobLogsTailPattern),
              [this](std::shared_ptr<net::WebSocketConnection> ws) {
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
              });

  // --- worker protocol ---------------------------------------------------------------------------
  s.route("POST", std::string(api::kNodesPath), [this](const net::HttpRequest& req) {
    json body = parse_body(req);
    std::string id = required_string(body, f::kNodeId);
    std::lock_guard<std::mutex> lock(mu);
    double now = now_seconds();
    NodeRecord& n = nodes[id];
    n.node_id = id;
    n.hostname = body.value(f::kHostname, "");
    n.address = body.value(f::kAddress, req.remote_address);
    n.resources = body.value(f::kResources, json::object());
    n.state = api::kNodeAlive;
    n.reason = "";
    n.registered_at = now;
    n.last_heartbeat_at = now;
    n.state_since = now;
    n.usage = json::object();
    store->put_node(n);
    log->info("node {} ({}, {}) registered: {}", id, n.hostname, n.address, n.resources.dump());
    json reports = body.value(f::kJobs, json::array());
    reconcile_registration(id, reports);
    if (reports.is_array()) {
      for (const auto& report : reports) apply_report(id, report);
    }
    schedule();
    return json_response({{f::kHeartbeatIntervalMs, o.heartbeat_interval.count()}});
  });

  s.route("POST", std::string(api::kNodeHeartbeatPattern), [this](const net::HttpRequest& req) {
    json body = parse_body(req);
    std::string id = req.params.at("node");
    json out = {
        {f::kRegistered, false}, {f::kAssignments, json::array()}, {f::kStop, json::array()}};
    std::string touched;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = nodes.find(id);
      if (it == nodes.end() ||
          (it->second.state != api::kNodeAlive && it->second.state != api::kNodeSuspect)) {
        return json_response(out);
      }
      NodeRecord& n = it->second;
      n.last_heartbeat_at = now_seconds();
      if (auto u = body.find(f::kUsage); u != body.end() && u->is_object()) n.usage = *u;
      if (n.state == api::kNodeSuspect) {
        n.state = api::kNodeAlive;
        n.state_since = n.last_heartbeat_at;
        store->put_node(n);
        log->info("node {} is alive again", id);
      }
      json reports = body.value(f::kJobs, json::array());
      if (!reports.is_array()) reports = json::array();
      for (const auto& r : reports) apply_report(id, r);
      schedule();
      out[f::kRegistered] = true;
      for (const auto& r : reports) {
        if (!r.is_object() || r.value(f::kState, "") != api::kReportRunning) continue;
        std::string jid = r.value(f::kJobId, "");
        auto j = jobs.find(jid);
        if (j == jobs.end() || api::is_terminal_status(j->second.status) ||
            j->second.stop_requested || !contains(j->second.assigned_nodes, id)) {
          out[f::kStop].push_back(jid);
        }
      }
      for (JobRecord* j : jobs_in_order()) {
        if (api::is_terminal_status(j->status) || j->stop_requested) continue;
        if (contains(j->assigned_nodes, id) && !j->reports.contains(id)) {
          out[f::kAssignments].push_back(assignment(*j));
        }
      }
    }
    pump_tails("");  // a job may have ended
    return json_response(out);
  });

  s.route("POST", std::string(api::kNodeLeavePattern), [this](const net::HttpRequest& req) {
    json body = parse_body(req);
    std::string id = req.params.at("node");
    std::string reason = body.value(f::kReason, std::string(api::kNodeExited));
    if (reason != api::kNodeExited && reason != api::kNodeDrained) {
      throw net::HttpError(
          400, "The field 'reason' must be \"exited\" or \"drained\"; got \"" + reason + "\".");
    }
    std::lock_guard<std::mutex> lock(mu);
    auto it = nodes.find(id);
    if (it == nodes.end()) throw net::HttpError(404, "Node '" + id + "' is not registered.");
    NodeRecord& n = it->second;
    n.state = reason;
    n.reason = reason;
    n.state_since = now_seconds();
    store->put_node(n);
    log->info("node {} left ({})", id, reason);
    node_lost(id, "left (" + reason + ")");
    return json_response(json::object());
  });

  s.route("POST", std::string(api::kWorkerLogsPattern), [this](const net::HttpRequest& req) {
    json body = parse_body(req);
    std::string id = req.params.at("id");
    std::string node = required_string(body, f::kNodeId);
    auto fs = body.find(f::kFirstSeq);
    if (fs == body.end() || !fs->is_number_integer() || fs->get<int64_t>() < 0) {
      throw net::HttpError(400, "The field 'first_seq' must be a non-negative integer.");
    }
    auto ls = body.find(f::kLines);
    if (ls == body.end() || !ls->is_array()) {
      throw net::HttpError(400, "The field 'lines' must be an array of {rank, text}.");
    }
    std::vector<JobStore::RankText> lines;
    for (const auto& l : *ls) {
      if (!l.is_object() || !l.contains(f::kText) || !(*l.find(f::kText)).is_string()) {
        throw net::HttpError(400, "Every entry of 'lines' must be {\"rank\": int, \"text\": str}.");
      }
      lines.push_back({l.value(f::kRank, 0), l[f::kText].get<std::string>()});
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      find_job(id);
    }
    int64_t next = store->append_logs(id, node, fs->get<int64_t>(), lines);
    pump_tails(id);
    return json_response({{f::kNextSeq, next}});
  });

  s.route("GET", std::string(api::kStatusPath), [this](const net::HttpRequest&) {
    std::lock_guard<std::mutex> lock(mu);
    return json_response(status_snapshot());
  });

  // --- rendezvous --------------------------------------------------------------------------------
  s.route("GET", std::string(api::kRdzvPattern), [this](const net::HttpRequest& req) {
    std::string run_id = req.params.at("run_id");
    auto st = store->get_rdzv(run_id);
    if (!st) throw net::HttpError(404, "No rendezvous state for run '" + run_id + "'.");
    return json_response({{f::kState, st->state}, {f::kToken, st->token}});
  });

  s.route("POST", std::string(api::kRdzvPattern), [this](const net::HttpRequest& req) {
    json body = parse_body(req);
    auto st = body.find(f::kState);
    if (st == body.end() || !st->is_string()) {
      throw net::HttpError(400, "The field 'state' must be a string.");
    }
    std::optional<std::string> token;
    if (auto t = body.find(f::kToken); t != body.end() && !t->is_null()) {
      if (!t->is_string()) throw net::HttpError(400, "The field 'token' must be a string or null.");
      token = t->get<std::string>();
    }
    RdzvState r = store->set_rdzv(req.params.at("run_id"), st->get<std::string>(), token);
    return json_response({{f::kState, r.state}, {f::kToken, r.token}, {f::kWritten, r.written}});
  });
}

Head::Head(HeadOptions options) : impl_(std::make_unique<Impl>()) {
  validate(options);
  impl_->o = std::move(options);
  impl_->suspect_after =
      impl_->o.suspect_after.count() > 0 ? impl_->o.suspect_after : 3 * impl_->o.heartbeat_interval;
}

Head::~Head() {
  stop();
}

void Head::start() {
  Impl& m = *impl_;
  TY_CHECK(!m.server, "Head::start() was called twice.");
  m.store = std::make_unique<JobStore>(m.o.state_dir);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.nodes.clear();
    m.jobs.clear();
    double now = now_seconds();
    for (NodeRecord& n : m.store->list_nodes()) {
      if (n.state == api::kNodeAlive || n.state == api::kNodeSuspect ||
          n.state == api::kNodePending) {
        n.state = api::kNodePending;  // until it registers again (Note [Head state])
        n.state_since = now;
        m.store->put_node(n);
      }
      m.nodes[n.node_id] = n;
    }
    for (JobRecord& j : m.store->list_jobs()) m.jobs[j.job_id] = std::move(j);
  }
  m.server = std::make_unique<net::HttpServer>(net::HttpServerOptions{
      .bind_address = m.o.bind_address, .port = m.o.port, .threads = m.o.http_threads});
  m.add_routes();
  try {
    m.server->start();
  } catch (...) {
    m.server.reset();
    m.store.reset();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(m.tick_mu);
    m.stopping = false;
  }
  m.ticker = std::thread([&m] {
    std::unique_lock<std::mutex> lock(m.tick_mu);
    while (!m.stopping) {
      m.tick_cv.wait_for(lock, m.o.tick_interval, [&m] { return m.stopping; });
      if (m.stopping) break;
      lock.unlock();
      try {
        m.tick();
      } catch (const std::exception& e) {
        m.log->error("the head's tick failed: {}", e.what());
      }
      lock.lock();
    }
  });
  m.log->info("head listening on {} (state in {}, {})", url(), m.store->path().string(),
              m.o.token ? "token required" : "no token: loopback only");
}

void Head::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.tick_mu);
    m.stopping = true;
  }
  m.tick_cv.notify_all();
  if (m.ticker.joinable()) m.ticker.join();
  if (m.server) {
    m.server->stop();
    m.server.reset();
  }
  {
    std::lock_guard<std::mutex> lock(m.tails_mu);
    m.tails.clear();
  }
  m.store.reset();
}

int Head::port() const {
  return impl_->server ? impl_->server->port() : 0;
}

std::string Head::url() const {
  std::string host = impl_->o.bind_address == "0.0.0.0" ? "127.0.0.1" : impl_->o.bind_address;
  return "http://" + host + ":" + std::to_string(port());
}

nlohmann::json Head::status() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->status_snapshot();
}

}  // namespace trainyard::cluster
