#include <set>

#include "cluster/head_impl.h"
#include "trainyard/cluster/job_spec.h"

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
// until they are gone). A node that dies or leaves takes its ranks with it: its reports of
// running jobs are dropped then (release_node), whatever the job's state, and a restarted head
// drops those of nodes it knows are gone, so no terminal state keeps a reservation.

namespace trainyard::cluster {

using nlohmann::json;
namespace f = api::field;
using namespace head_detail;

void Head::Impl::save(JobRecord& j) {
  store->update_job(j);
}

void Head::Impl::set_terminal(JobRecord& j, std::string_view status, const std::string& message) {
  j.status = status;
  j.message = message;
  j.end_time_ms = now_ms();
  store->append_event(j.job_id, "status", std::string(status) + ": " + message);
  log->info("job {} {}: {}", j.job_id, status, message);
}

const wire::JobReport* Head::Impl::report_of(const JobRecord& j, const std::string& node) const {
  auto it = j.reports.find(node);
  return it == j.reports.end() ? nullptr : &it->second;
}

bool Head::Impl::reported(const JobRecord& j,
                          const std::string& node,
                          wire::ReportState state) const {
  const wire::JobReport* r = report_of(j, node);
  return r != nullptr && r->state == state;
}

bool Head::Impl::placed_on(const JobRecord& j, const std::string& node) const {
  if (reported(j, node, wire::ReportState::kRunning)) return true;
  const wire::JobReport* r = report_of(j, node);
  return !api::is_terminal_status(j.status) && contains(j.assigned_nodes, node) &&
         (r == nullptr || !wire::is_terminal(r->state));
}

std::pair<double, double> Head::Impl::used_on(const std::string& node) const {
  double cpu = 0, gpu = 0;
  for (const auto& [id, j] : jobs) {
    if (!placed_on(j, node)) continue;
    cpu += job_cpus_per_node(j);
    gpu += job_gpus_per_node(j);
  }
  return {cpu, gpu};
}

std::vector<JobRecord*> Head::Impl::jobs_in_order() {
  std::vector<JobRecord*> out;
  for (auto& [id, j] : jobs) out.push_back(&j);
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->order < b->order; });
  return out;
}

std::vector<NodeRecord*> Head::Impl::nodes_in_order() {
  std::vector<NodeRecord*> out;
  for (auto& [id, n] : nodes) out.push_back(&n);
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) {
    return a->registered_at != b->registered_at ? a->registered_at < b->registered_at
                                                : a->node_id < b->node_id;
  });
  return out;
}

bool Head::Impl::all_assigned_succeeded(const JobRecord& j) const {
  if (j.assigned_nodes.empty()) return false;
  for (const auto& n : j.assigned_nodes) {
    if (!reported(j, n, wire::ReportState::kSucceeded)) return false;
  }
  return true;
}

bool Head::Impl::any_succeeded(const JobRecord& j) const {
  for (const auto& [n, r] : j.reports) {
    if (r.state == wire::ReportState::kSucceeded) return true;
  }
  return false;
}

void Head::Impl::schedule() {
  std::map<std::string, std::pair<double, double>> free;  // alive nodes only
  for (NodeRecord* n : nodes_in_order()) {
    if (n->state != api::kNodeAlive) continue;
    auto [cpu, gpu] = used_on(n->node_id);
    free[n->node_id] = {n->resources.cpu - cpu, n->resources.gpu - gpu};
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
      if (contains(j->assigned_nodes, id) || (grow && j->reports.count(id))) continue;
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

void Head::Impl::drop_node(JobRecord& j, const std::string& node_id, const std::string& why) {
  if (api::is_terminal_status(j.status) || !contains(j.assigned_nodes, node_id)) return;
  if (reported(j, node_id, wire::ReportState::kSucceeded)) return;  // its part is done
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

void Head::Impl::node_lost(const std::string& node_id, const std::string& why) {
  node_metrics.erase(node_id);  // its series leave /metrics (Note [The head's metrics])
  for (JobRecord* j : jobs_in_order()) {
    drop_node(*j, node_id, why);
    release_node(*j, node_id);
  }
}

void Head::Impl::release_node(JobRecord& j, const std::string& node_id) {
  if (!reported(j, node_id, wire::ReportState::kRunning)) return;
  j.reports.erase(node_id);  // its ranks are gone with it: their CPUs and GPUs are free
  store->append_event(j.job_id, "released", "node " + node_id + " is gone");
  save(j);
}

// Note [Job instances on the wire]
// A deleted job's submission id may be submitted again. The worker that ran the old job may
// still hold it (its final report not yet taken, its lines still spooled) and report on it, or
// ship its lines, after the new job of the same id exists: that gave the new job a wrong FAILED
// and the old job's lines. So an assignment carries the job's instance (its submission order,
// which SQLite's AUTOINCREMENT never reuses), and the worker's reports and log batches carry it
// back: the head takes them only for the instance it has, tells a worker reporting another one
// running to stop it, and answers another instance's lines as stored so that they are dropped.
// A message without an instance (0: an older worker) is taken as before.
bool Head::Impl::same_instance(const JobRecord& j, wire::Instance instance) const {
  return instance == 0 || instance == j.order;
}

void Head::Impl::reconcile_registration(const std::string& node_id,
                                        const std::vector<wire::JobReport>& reports) {
  std::set<std::string> held;
  for (const auto& r : reports) held.insert(r.job_id);
  for (JobRecord* j : jobs_in_order()) {
    if (reported(*j, node_id, wire::ReportState::kRunning) && !held.count(j->job_id)) {
      drop_node(*j, node_id, "restarted without the job");
    }
  }
}

void Head::Impl::apply_report(const std::string& node_id, const wire::JobReport& r) {
  using wire::ReportState;
  auto it = jobs.find(r.job_id);
  if (it == jobs.end()) return;
  JobRecord& j = it->second;
  if (!contains(j.assigned_nodes, node_id)) return;  // Note [Head state]
  if (!same_instance(j, r.instance)) return;         // Note [Job instances on the wire]
  if (const wire::JobReport* old = report_of(j, node_id); old != nullptr && *old == r) return;
  j.reports[node_id] = r;
  if (api::is_terminal_status(j.status)) {
    save(j);
    return;
  }
  if (r.state == ReportState::kRunning) {
    if (j.status == api::kPending) {
      j.status = api::kRunning;
      j.message = "Job is running.";
      store->append_event(j.job_id, "status", "RUNNING: reported by node " + node_id);
    }
  } else if (r.state == ReportState::kSucceeded) {
    if (all_assigned_succeeded(j)) {
      j.driver_exit_code = 0;
      set_terminal(j, api::kSucceeded, "Job finished successfully.");
    }
  } else if (r.state == ReportState::kFailed && r.error_type == wire::kNodeRestarted) {
    // The node's worker restarted and its ranks died with it: a lost node, as a dead one is
    // (an elastic job goes on without it), not a failure of the job's program.
    drop_node(j, node_id, r.message.empty() ? "restarted" : r.message);
    return;
  } else if (r.state == ReportState::kFailed) {
    if (r.exit_code) j.driver_exit_code = *r.exit_code;
    if (r.failed_rank) j.failed_rank = *r.failed_rank;
    j.failed_node = node_id;
    j.error_type = r.error_type.empty() ? std::string(wire::kCommandError) : r.error_type;
    j.last_lines = r.last_lines;
    set_terminal(j, api::kFailed,
                 r.message.empty() ? "The job failed on node " + node_id + "." : r.message);
  } else if (r.state == ReportState::kStopped && !j.stop_requested) {
    drop_node(j, node_id, "stopped the job");
    return;
  }
  save(j);
}

wire::Assignment Head::Impl::assignment(const JobRecord& j) const {
  return wire::Assignment{.job_id = j.job_id,
                          .instance = j.order,
                          .entrypoint = j.entrypoint,
                          .env = j.env_vars,
                          .launch = j.launch,
                          .min_nodes = j.min_nodes,
                          .max_nodes = j.max_nodes};
}

// Note [A head that turned connections away]
// Past its connection caps the server makes room by shutting down connections no hook has
// admitted (Note [Keeping room for admitted clients] in http_server.cpp), and refuses a new one
// only when every other is an authenticated client's. Either way a node's heartbeat may have been
// the one turned away (its connection had not sent its headers yet, or the head was full of
// genuine clients): silence the head caused is not the node's. So while the server turns
// connections away, each tick's time is credited to every node's heartbeat age, as a pause is
// (Note [A head that did not run]), but at most dead_after in all since a node's last heartbeat:
// a flood that never stops delays a dead node's verdict by dead_after, and cannot hide it.
void Head::Impl::credit_turned_away_silence(double now, double tick_seconds, double dead_s) {
  if (!server) return;
  const auto stats = server->stats();
  const std::uint64_t now_turned_away = stats.connections_evicted + stats.connections_refused;
  const bool turning = now_turned_away != turned_away;
  turned_away = now_turned_away;
  if (turning && !turning_away)
    log->warn(
        "The head is past its connection caps and turning connections away (an overload, or a "
        "flood of idle connections): node heartbeats lost to that are not counted against the "
        "nodes, for up to {:.1f} s each.",
        dead_s);
  turning_away = turning;
  for (auto& [id, n] : nodes) {
    const bool pending = n.state == api::kNodePending;
    if (!pending && n.state != api::kNodeAlive && n.state != api::kNodeSuspect) continue;
    double& heard_at = pending ? n.state_since : n.last_heartbeat_at;
    SilenceCredit& credit = silence_credit[id];
    if (credit.heartbeat_at != heard_at) credit = {.heartbeat_at = heard_at};  // heard since
    if (!turning) continue;
    const double add = std::min({tick_seconds, dead_s - credit.seconds, now - heard_at});
    if (add <= 0) continue;
    heard_at += add;
    credit.seconds += add;
    credit.heartbeat_at = heard_at;
  }
}

// Note [A head that did not run]
// A heartbeat's age says a node is silent only while the head was there to hear it. A head that
// was stopped (SIGSTOP, a suspended VM) or starved of CPU for longer than dead_after used to
// wake up, see every node's last heartbeat as old and declare them all dead, failing their jobs,
// although the heartbeats were waiting unread in its sockets. So each tick measures how long it
// has been since the previous one: whatever exceeds the tick interval by more than
// kPauseSlackSeconds was time the head did not run, and it is not counted against any node (their
// ages are credited with it, never past now). Said once per pause, at warning level.
void Head::Impl::tick_nodes() {
  double now = now_seconds();
  double suspect_s = std::chrono::duration<double>(suspect_after).count();
  double dead_s = std::chrono::duration<double>(o.dead_after).count();
  const double tick_s = std::chrono::duration<double>(o.tick_interval).count();
  const double paused = last_tick_at > 0 ? now - last_tick_at - tick_s : 0;
  last_tick_at = now;
  if (paused > kPauseSlackSeconds) {
    log->warn(
        "The head did not run for {:.1f} s (stopped, or starved of CPU): node heartbeats it "
        "could not read in that time are not counted against the nodes.",
        paused);
    for (auto& [id, n] : nodes) {
      n.last_heartbeat_at = std::min(now, n.last_heartbeat_at + paused);
      if (n.state == api::kNodePending) n.state_since = std::min(now, n.state_since + paused);
    }
  }
  // The tick's own time: a pause beyond the slack was credited above.
  const double ticked = paused > kPauseSlackSeconds ? tick_s : tick_s + std::max(0.0, paused);
  credit_turned_away_silence(now, ticked, dead_s);
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
      log->warn("node {} ({}) is suspect: no heartbeat for {:.1f} s", n->node_id, n->hostname, age);
    }
  }
}

bool Head::Impl::tail_finished(const std::string& job_id) {
  auto it = jobs.find(job_id);
  if (it == jobs.end()) return true;
  const JobRecord& j = it->second;
  if (!api::is_terminal_status(j.status)) return false;
  for (const auto& [node, r] : j.reports) {
    if (r.state != wire::ReportState::kRunning) continue;
    auto n = nodes.find(node);
    if (n != nodes.end() && node_is_up(n->second.state)) return false;
  }
  return logs_complete(j);
}

// Note [A job ends before its logs]
// A job's state and its nodes' CPUs follow its ranks: a worker reports a job ended as soon as its
// agent does. Its lines may still be spooled there (a job that printed 2M lines in its last
// seconds): they follow, in batches. Lines used to come first, and a job stayed RUNNING, holding
// its CPUs while another waited, for minutes after its ranks exited. So a final report says how
// many lines the node printed (JobReport::line_count), and an ended job's logs are complete once
// every node that is still up has shipped that many; a lost node's lines may never come, and do not
// hold the end back. Clients that follow a job (`trainyard logs -f`, `submit`, the WebSocket
// tail) read on until then: JobDetails::logs_complete.
bool Head::Impl::logs_complete(const JobRecord& j) const {
  if (!api::is_terminal_status(j.status)) return false;
  for (const auto& [node, r] : j.reports) {
    if (!r.line_count) continue;  // an older worker, which ships its lines before its report
    const auto n = nodes.find(node);
    if (n == nodes.end() || !node_is_up(n->second.state)) continue;
    if (store->stored_lines(j.job_id, node) < *r.line_count) return false;
  }
  return true;
}

void Head::Impl::pump(const std::shared_ptr<Tail>& t) {
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
    // A follower with much unread goes on at the next pump (Note [Tails on their own thread]);
    // one that reads nothing at all is dropped by the server.
    if (t->ws->buffered_bytes() >= kTailHighWaterBytes) return;
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

void Head::Impl::pump_tails(const std::string& job_id) {
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

void Head::Impl::wake_tails() {
  {
    std::lock_guard<std::mutex> lock(tails_mu);
    tails_wanted = true;
  }
  tails_cv.notify_all();
}

void Head::Impl::tick() {
  {
    std::lock_guard<std::mutex> lock(mu);
    tick_nodes();
    schedule();
  }
  wake_tails();  // a job may have ended
}

json Head::Impl::job_json(const JobRecord& j) const {
  return job_details(j, o.token, logs_complete(j));
}

JobRecord& Head::Impl::find_job(const std::string& id) {
  auto it = jobs.find(id);
  if (it == jobs.end()) {
    throw net::HttpStatusError(404, "Job '" + id + "' does not exist.");
  }
  return it->second;
}

ClusterSnapshot Head::Impl::status_snapshot() {
  double now = now_seconds();
  ClusterSnapshot out;
  out.time = iso8601(now);
  out.head_problem = store->write_problem().value_or("");
  for (std::string_view s :
       {api::kPending, api::kRunning, api::kStopped, api::kSucceeded, api::kFailed}) {
    out.jobs[std::string(s)] = 0;
  }
  std::vector<JobRecord*> ordered = jobs_in_order();
  for (JobRecord* j : ordered) ++out.jobs[j->status];
  std::vector<NodeRecord*> dead;
  for (NodeRecord* n : nodes_in_order()) {
    SnapshotNode node{.node_id = n->node_id,
                      .hostname = n->hostname,
                      .address = n->address,
                      .state = parse_node_state(n->state),
                      .reason = n->reason,
                      .resources = n->resources,
                      .heartbeat_age_s = std::max(0.0, now - n->last_heartbeat_at)};
    node.resources.gpus.clear();  // the snapshot's totals only
    for (JobRecord* j : ordered) {
      if (!placed_on(*j, n->node_id)) continue;
      auto pos = std::find(j->assigned_nodes.begin(), j->assigned_nodes.end(), n->node_id);
      int index =
          pos == j->assigned_nodes.end() ? 0 : static_cast<int>(pos - j->assigned_nodes.begin());
      NodeRanks ranks{.job_id = j->job_id};
      for (int k = 0; k < j->launch.nproc_per_node; ++k)
        ranks.ranks.push_back(index * j->launch.nproc_per_node + k);
      node.ranks.push_back(std::move(ranks));
    }
    auto [cpu_used, gpu_used] = used_on(n->node_id);
    node.usage = NodeUsage{.cpu_used = cpu_used,
                           .memory_used_bytes = n->usage.memory_used_bytes,
                           .gpu_used = gpu_used};
    out.nodes.push_back(std::move(node));
    if (n->state == api::kNodeDead) dead.push_back(n);
  }
  std::sort(dead.begin(), dead.end(),
            [](auto* a, auto* b) { return a->state_since > b->state_since; });
  for (size_t i = 0; i < dead.size() && static_cast<int>(i) < o.failures_shown; ++i) {
    out.failures.push_back(NodeFailure{.node_id = dead[i]->node_id,
                                       .hostname = dead[i]->hostname,
                                       .time = iso8601(dead[i]->state_since),
                                       .reason = dead[i]->reason});
  }
  for (JobRecord* j : ordered) {
    if (j->status != api::kPending || !j->assigned_nodes.empty() || j->stop_requested) continue;
    out.demands.push_back(ResourceDemand{.job_id = j->job_id,
                                         .cpu = job_cpus_per_node(*j),
                                         .gpu = job_gpus_per_node(*j),
                                         .nodes = j->min_nodes});
  }
  return out;
}

}  // namespace trainyard::cluster
