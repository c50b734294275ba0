// The head's metrics: each node's latest snapshot from its heartbeats and GET /metrics, the
// cluster's families and every up node's snapshot in Prometheus' text format.
//
// Note [The head's metrics]
// A worker sends its node's snapshot (node families, its ranks' processes and the ranks' own
// registries, labelled job and rank) in every heartbeat. The head keeps the latest per node, in
// memory only, as an immutable shared_ptr: the heartbeat swaps the pointer under `mu`, and
// /metrics copies the pointers under `mu` and renders outside it, so a scrape of a large cluster
// never holds up a heartbeat. A node that dies or leaves is dropped (node_lost), its series leave
// /metrics and Prometheus marks them stale. The head adds the node label and overrides one a
// worker sent: two nodes can never write the same series. The cluster's own families come first
// and every family appears once (merge_into); a label set that appears twice in a family (a
// worker's bug) is written once, as Prometheus refuses a scrape with duplicate series.
#include <algorithm>
#include <set>

#include "cluster/head_impl.h"
#include "trainyard/metrics/names.h"

namespace trainyard::cluster {

using nlohmann::json;
namespace f = api::field;
namespace name = metrics::name;
using namespace head_detail;

namespace {

constexpr std::chrono::minutes kMetricsWarnEvery{1};

metrics::Family gauge(std::string_view family, std::string help) {
  return {
      .name = std::string(family), .type = metrics::MetricType::kGauge, .help = std::move(help)};
}

// `snapshot` with the node label set to `node_id` on every sample, first.
metrics::Snapshot with_node_label(metrics::Snapshot snapshot, const std::string& node_id) {
  for (metrics::Family& fam : snapshot) {
    for (metrics::Sample& s : fam.samples) {
      std::erase_if(s.labels, [](const auto& l) { return l.first == name::kNodeLabel; });
    }
  }
  return metrics::with_labels(std::move(snapshot), {{std::string(name::kNodeLabel), node_id}});
}

// Drops every sample whose label set (in any order) an earlier sample of its family already
// has: Prometheus refuses a whole scrape with a duplicate series in it.
void drop_duplicate_series(metrics::Snapshot& snapshot) {
  for (metrics::Family& fam : snapshot) {
    std::set<metrics::Labels> seen;
    std::erase_if(fam.samples, [&](const metrics::Sample& s) {
      metrics::Labels sorted = s.labels;
      std::sort(sorted.begin(), sorted.end());
      return !seen.insert(std::move(sorted)).second;
    });
  }
}

}  // namespace

std::shared_ptr<const metrics::Snapshot> Head::Impl::parse_node_metrics(const std::string& node_id,
                                                                        const json& metrics) {
  if (metrics.is_null()) return nullptr;
  try {
    auto snapshot = std::make_shared<metrics::Snapshot>();
    metrics::from_json(metrics, *snapshot);
    return snapshot;
  } catch (const std::exception& e) {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(metrics_warn_mu);
    auto [last, first] = metrics_warned.try_emplace(node_id, now);
    if (first || now - last->second >= kMetricsWarnEvery) {
      last->second = now;
      log->warn(
          "node {} sent malformed metrics in a heartbeat (ignored; the heartbeat counts): {} "
          "HINT: are the worker and the head the same trainyard version? (logged at most once a "
          "minute per node)",
          node_id, e.what());
    }
    return nullptr;
  }
}

void Head::Impl::on_metrics(const std::string& node_id,
                            double time,
                            const metrics::Snapshot& snapshot) {
  history->record(node_id, time, snapshot);  // GET /api/cluster/metrics/history
}

metrics::Snapshot Head::Impl::cluster_metrics() {
  metrics::Family node_states = gauge(name::kClusterNodes, "Nodes the head knows, by state.");
  metrics::Family job_statuses = gauge(name::kClusterJobs, "Jobs the head knows, by status.");
  metrics::Family ages = gauge(name::kNodeHeartbeatAge,
                               "Seconds since the node's last heartbeat (alive, suspect or "
                               "pending nodes).");
  metrics::Family up = gauge(name::kNodeUp, "1 when the node is alive, else 0 (suspect, pending).");
  std::vector<std::pair<std::string, std::shared_ptr<const metrics::Snapshot>>> snapshots;
  {
    std::lock_guard<std::mutex> lock(mu);
    const double now = now_seconds();
    std::map<std::string, int> by_state;
    for (std::string_view s : {api::kNodeAlive, api::kNodeSuspect, api::kNodePending,
                               api::kNodeDead, api::kNodeExited, api::kNodeDrained}) {
      by_state[std::string(s)] = 0;
    }
    for (NodeRecord* n : nodes_in_order()) {
      by_state[n->state]++;
      if (!node_is_up(n->state)) continue;
      const metrics::Labels node = {{std::string(name::kNodeLabel), n->node_id}};
      ages.samples.push_back({node, std::max(0.0, now - n->last_heartbeat_at)});
      up.samples.push_back({node, n->state == api::kNodeAlive ? 1.0 : 0.0});
      auto snap = node_metrics.find(n->node_id);
      const bool reporting = n->state == api::kNodeAlive || n->state == api::kNodeSuspect;
      if (reporting && snap != node_metrics.end()) snapshots.emplace_back(n->node_id, snap->second);
    }
    for (const auto& [state, count] : by_state) {
      node_states.samples.push_back({{{std::string(name::kStateLabel), state}}, double(count)});
    }
    std::map<std::string, int> by_status;
    for (std::string_view s :
         {api::kPending, api::kRunning, api::kStopped, api::kSucceeded, api::kFailed}) {
      by_status[std::string(s)] = 0;
    }
    for (const auto& [id, j] : jobs) by_status[j.status]++;
    for (const auto& [status, count] : by_status) {
      job_statuses.samples.push_back({{{std::string(name::kStatusLabel), status}}, double(count)});
    }
  }
  metrics::Snapshot out = {std::move(node_states), std::move(job_statuses), std::move(ages),
                           std::move(up)};
  for (auto& [node_id, snapshot] : snapshots) {
    metrics::merge_into(out, with_node_label(*snapshot, node_id));
  }
  drop_duplicate_series(out);
  return out;
}

net::ServerResponse Head::Impl::metrics_response() {
  net::ServerResponse res;
  res.content_type = std::string(metrics::kPrometheusContentType);
  res.body = metrics::prometheus_text(cluster_metrics());
  return res;
}

}  // namespace trainyard::cluster
