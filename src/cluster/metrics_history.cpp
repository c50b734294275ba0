#include "trainyard/cluster/metrics_history.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include "trainyard/cluster/api.h"
#include "trainyard/error.h"
#include "trainyard/metrics/names.h"

// Note [History series]
// Every heartbeat adds one point to its node's series (t, CPU ratio, memory used, and per GPU
// utilisation and memory used) and one to the series of each (job, rank) its snapshot carries
// (t, loss, samples/s, tokens/s, the rank process' CPU ratio and RSS, and seconds per step per
// phase). A rank's series are keyed by (job, rank), not by node, so a rank that an elastic restart
// moved keeps one line; its node_id is the node of its newest point. A value the snapshot lacks is
// NaN, written as null. Seconds per step per phase are differences of counters between a rank's
// consecutive points: (phase_seconds_total - previous) / (steps_total - previous), null for the
// first point, when no step was done in between, and when a counter went backwards (the rank
// restarted). Every series lives in a ring buffer of `points` entries; points older than
// max_age_s before the newest recorded time are dropped too, so that a finished job's ranks and a
// dead node's series age out of the history although nothing pushes them out.

namespace trainyard::cluster {

using Json = nlohmann::json;
namespace mn = metrics::name;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The phases in the order the JSON lists them.
constexpr std::array<std::string_view, 6> kPhases = {mn::kPhaseData,      mn::kPhaseForward,
                                                     mn::kPhaseBackward,  mn::kPhaseCommunication,
                                                     mn::kPhaseOptimizer, mn::kPhaseOther};

// A bounded series: push() drops the oldest entry once `capacity` are held. Memory grows with
// the points actually recorded, so a short job or a new node costs little.
template <typename T>
class Ring {
 public:
  explicit Ring(size_t capacity) : capacity_(capacity) {}
  void push(T item) {
    items_.push_back(std::move(item));
    if (items_.size() > capacity_) items_.pop_front();
  }
  void pop_front() { items_.pop_front(); }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const T& operator[](size_t i) const { return items_[i]; }
  const T& front() const { return items_.front(); }
  const T& back() const { return items_.back(); }

 private:
  size_t capacity_;
  std::deque<T> items_;
};

struct GpuPoint {
  double utilization = kNaN;
  double memory_used = kNaN;
  double memory_total = kNaN;
};

struct NodePoint {
  double t = 0;
  double cpus = kNaN;
  double cpu_ratio = kNaN;
  double memory_used = kNaN;
  double memory_total = kNaN;
  std::map<std::string, GpuPoint> gpus;  // by the gpu label
};

struct RankPoint {
  double t = 0;
  double loss = kNaN;
  double samples_per_second = kNaN;
  double tokens_per_second = kNaN;
  double cpu_cores = kNaN;
  double resident_memory = kNaN;
  std::array<double, kPhases.size()> step_seconds{kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
};

struct NodeSeries {
  explicit NodeSeries(size_t n) : points(n) {}
  Ring<NodePoint> points;
};

struct RankSeries {
  explicit RankSeries(size_t n) : points(n) {}
  Ring<RankPoint> points;
  std::string node_id;
  // The counters at the previous point, for the differences (NaN: unknown).
  double steps_total = kNaN;
  std::array<double, kPhases.size()> phase_totals{kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
};

using RankKey = std::pair<std::string, int>;  // (job, rank)

const std::string* label(const metrics::Labels& labels, std::string_view name) {
  for (const auto& [k, v] : labels)
    if (k == name) return &v;
  return nullptr;
}

// The value of the first sample of family `name` whose labels are exactly `match` in any order,
// over every family of that name; NaN when there is none.
double value_of(const metrics::Snapshot& s, std::string_view name, const metrics::Labels& match) {
  for (const metrics::Family& f : s) {
    if (f.name != name) continue;
    for (const metrics::Sample& sample : f.samples) {
      if (sample.labels.size() != match.size()) continue;
      bool all = true;
      for (const auto& [k, v] : match) {
        const std::string* got = label(sample.labels, k);
        all = all && got && *got == v;
      }
      if (all) return sample.value;
    }
  }
  return kNaN;
}

std::optional<int> parse_rank(const std::string& s) {
  if (s.empty() || s.size() > 9 ||
      !std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); }))
    return std::nullopt;
  return std::stoi(s);
}

Json number(double v) {
  return std::isfinite(v) ? Json(v) : Json(nullptr);
}

}  // namespace

void validate(const MetricsHistoryOptions& o) {
  TY_CHECK(o.points >= 2 && o.points <= MetricsHistoryOptions::kMaxPoints,
           "MetricsHistoryOptions.points must be in [2, ", MetricsHistoryOptions::kMaxPoints,
           "]; got ", o.points, ".");
  TY_CHECK(o.max_age_s > 0, "MetricsHistoryOptions.max_age_s must be positive; got ", o.max_age_s,
           " s.");
  TY_CHECK(o.max_jobs >= 1, "MetricsHistoryOptions.max_jobs must be at least 1; got ", o.max_jobs,
           ".");
}

struct MetricsHistory::Impl {
  MetricsHistoryOptions o;
  mutable std::mutex mu;  // guards everything below
  std::map<std::string, NodeSeries> nodes;
  std::map<RankKey, RankSeries> ranks;
  double newest = 0;  // the newest time recorded

  void record_node(const std::string& node_id, double time, const metrics::Snapshot& s);
  void record_rank(const RankKey& key,
                   const std::string& node_id,
                   double time,
                   const metrics::Snapshot& s);
  void prune();
  Json node_json(const NodeSeries* series, std::size_t max_points) const;
  Json rank_json(const RankKey& key, const RankSeries& series, std::size_t max_points) const;
};

MetricsHistory::MetricsHistory(MetricsHistoryOptions options) : impl_(std::make_unique<Impl>()) {
  validate(options);
  impl_->o = options;
}

MetricsHistory::~MetricsHistory() = default;

void MetricsHistory::record(const std::string& node_id,
                            double time,
                            const metrics::Snapshot& snapshot) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  auto n = m.nodes.find(node_id);
  if (n != m.nodes.end() && !n->second.points.empty() && time <= n->second.points.back().t) return;
  m.record_node(node_id, time, snapshot);
  std::set<RankKey> seen;
  for (const metrics::Family& f : snapshot) {
    for (const metrics::Sample& sample : f.samples) {
      const std::string* job = label(sample.labels, mn::kJobLabel);
      const std::string* rank = label(sample.labels, mn::kRankLabel);
      if (!job || !rank) continue;
      if (auto r = parse_rank(*rank)) seen.insert({*job, *r});
    }
  }
  for (const RankKey& key : seen) m.record_rank(key, node_id, time, snapshot);
  m.newest = std::max(m.newest, time);
  m.prune();
}

void MetricsHistory::Impl::record_node(const std::string& node_id,
                                       double time,
                                       const metrics::Snapshot& s) {
  NodePoint p;
  p.t = time;
  p.cpus = value_of(s, mn::kNodeCpus, {});
  p.cpu_ratio = value_of(s, mn::kNodeCpuUtilization, {});
  p.memory_used = value_of(s, mn::kNodeMemoryUsed, {});
  p.memory_total = value_of(s, mn::kNodeMemoryTotal, {});
  for (std::string_view name : {mn::kGpuUtilization, mn::kGpuMemoryUsed, mn::kGpuMemoryTotal}) {
    for (const metrics::Family& f : s) {
      if (f.name != name) continue;
      for (const metrics::Sample& sample : f.samples) {
        const std::string* gpu = label(sample.labels, mn::kGpuLabel);
        if (!gpu || sample.labels.size() != 1) continue;
        GpuPoint& g = p.gpus[*gpu];
        if (name == mn::kGpuUtilization) g.utilization = sample.value;
        if (name == mn::kGpuMemoryUsed) g.memory_used = sample.value;
        if (name == mn::kGpuMemoryTotal) g.memory_total = sample.value;
      }
    }
  }
  nodes.try_emplace(node_id, static_cast<size_t>(o.points)).first->second.points.push(std::move(p));
}

void MetricsHistory::Impl::record_rank(const RankKey& key,
                                       const std::string& node_id,
                                       double time,
                                       const metrics::Snapshot& s) {
  if (!ranks.count(key)) {
    std::set<std::string> jobs;
    for (const auto& [k, r] : ranks) jobs.insert(k.first);
    if (!jobs.count(key.first) && static_cast<int>(jobs.size()) >= o.max_jobs) {
      // Drop the job whose newest point is oldest.
      std::map<std::string, double> newest_of;
      for (const auto& [k, r] : ranks) {
        double t = r.points.empty() ? 0 : r.points.back().t;
        auto [it, fresh] = newest_of.try_emplace(k.first, t);
        if (!fresh) it->second = std::max(it->second, t);
      }
      auto oldest = std::min_element(newest_of.begin(), newest_of.end(),
                                     [](auto& a, auto& b) { return a.second < b.second; });
      std::erase_if(ranks, [&](const auto& kv) { return kv.first.first == oldest->first; });
    }
  }
  RankSeries& r = ranks.try_emplace(key, static_cast<size_t>(o.points)).first->second;
  // Two nodes may report one rank around an elastic move: the charts need times in order.
  if (!r.points.empty() && time <= r.points.back().t) return;
  r.node_id = node_id;
  const metrics::Labels who = {{std::string(mn::kJobLabel), key.first},
                               {std::string(mn::kRankLabel), std::to_string(key.second)}};
  RankPoint p;
  p.t = time;
  p.loss = value_of(s, mn::kTrainLoss, who);
  p.samples_per_second = value_of(s, mn::kTrainSamplesPerSecond, who);
  p.tokens_per_second = value_of(s, mn::kTrainTokensPerSecond, who);
  p.cpu_cores = value_of(s, mn::kRankCpuCores, who);
  p.resident_memory = value_of(s, mn::kRankResidentMemory, who);
  const double steps = value_of(s, mn::kTrainStepsTotal, who);
  const double step_diff = steps - r.steps_total;  // NaN when either is unknown
  for (size_t i = 0; i < kPhases.size(); ++i) {
    metrics::Labels with_phase = who;
    with_phase.emplace_back(std::string(mn::kPhaseLabel), std::string(kPhases[i]));
    const double total = value_of(s, mn::kTrainStepPhaseSeconds, with_phase);
    const double diff = total - r.phase_totals[i];
    if (step_diff > 0 && diff >= 0) p.step_seconds[i] = diff / step_diff;
    r.phase_totals[i] = total;
  }
  r.steps_total = steps;
  r.points.push(std::move(p));
}

void MetricsHistory::Impl::prune() {
  const double cutoff = newest - o.max_age_s;
  for (auto it = nodes.begin(); it != nodes.end();) {
    auto& pts = it->second.points;
    while (!pts.empty() && pts.front().t < cutoff) pts.pop_front();
    it = pts.empty() ? nodes.erase(it) : std::next(it);
  }
  for (auto it = ranks.begin(); it != ranks.end();) {
    auto& pts = it->second.points;
    while (!pts.empty() && pts.front().t < cutoff) pts.pop_front();
    it = pts.empty() ? ranks.erase(it) : std::next(it);
  }
}

// Note [Thinned history]
// A full history is large: 16 nodes of 8 ranks with 900 points per series come to 11.5 MB of JSON
// (docs/BENCHMARKS.md), too much for a page that polls every 2 s. The dashboard asks for
// ?max_points=N instead: every k-th point with k = ceil(n / N), counted back from the newest, so
// the newest point is always there, the whole window is still spanned, and a thinned series keeps
// its shape (a gauge's value and a step time at each kept moment are exact, not averaged).
namespace {
std::vector<size_t> thinned(size_t n, size_t max_points) {
  std::vector<size_t> kept;
  if (n == 0) return kept;
  const size_t stride = max_points == 0 || n <= max_points ? 1 : (n + max_points - 1) / max_points;
  for (size_t back = 0; back < n; back += stride) kept.push_back(n - 1 - back);
  std::reverse(kept.begin(), kept.end());
  return kept;
}
}  // namespace

Json MetricsHistory::Impl::node_json(const NodeSeries* series, std::size_t max_points) const {
  Json t = Json::array(), cpu = Json::array(), mem = Json::array(), gpus = Json::array();
  Json out = {{"cpus", nullptr}, {"memory_total_bytes", nullptr}};
  if (series) {
    const auto& pts = series->points;
    const std::vector<size_t> kept = thinned(pts.size(), max_points);
    std::set<std::string> gpu_ids;
    for (size_t i : kept) {
      t.push_back(pts[i].t);
      cpu.push_back(number(pts[i].cpu_ratio));
      mem.push_back(number(pts[i].memory_used));
      for (const auto& [id, g] : pts[i].gpus) gpu_ids.insert(id);
    }
    if (!pts.empty()) {
      out["cpus"] = number(pts.back().cpus);
      out["memory_total_bytes"] = number(pts.back().memory_total);
    }
    for (const std::string& id : gpu_ids) {
      Json util = Json::array(), used = Json::array();
      double total = kNaN;
      for (size_t i : kept) {
        auto g = pts[i].gpus.find(id);
        GpuPoint p = g == pts[i].gpus.end() ? GpuPoint{} : g->second;
        util.push_back(number(p.utilization));
        used.push_back(number(p.memory_used));
        if (std::isfinite(p.memory_total)) total = p.memory_total;
      }
      gpus.push_back({{"gpu", id},
                      {"memory_total_bytes", number(total)},
                      {"utilization_ratio", util},
                      {"memory_used_bytes", used}});
    }
  }
  out["t"] = t;
  out["cpu_ratio"] = cpu;
  out["memory_used_bytes"] = mem;
  out["gpus"] = gpus;
  return out;
}

Json MetricsHistory::Impl::rank_json(const RankKey& key,
                                     const RankSeries& r,
                                     std::size_t max_points) const {
  Json t = Json::array(), loss = Json::array(), sps = Json::array(), tps = Json::array(),
       cpu = Json::array(), rss = Json::array();
  std::array<Json, kPhases.size()> phases;
  phases.fill(Json::array());
  for (size_t i : thinned(r.points.size(), max_points)) {
    const RankPoint& p = r.points[i];
    t.push_back(p.t);
    loss.push_back(number(p.loss));
    sps.push_back(number(p.samples_per_second));
    tps.push_back(number(p.tokens_per_second));
    cpu.push_back(number(p.cpu_cores));
    rss.push_back(number(p.resident_memory));
    for (size_t k = 0; k < kPhases.size(); ++k) phases[k].push_back(number(p.step_seconds[k]));
  }
  Json step = Json::object();
  for (size_t k = 0; k < kPhases.size(); ++k) step[std::string(kPhases[k])] = phases[k];
  return {{"rank", key.second},   {"node_id", r.node_id},      {"t", t},
          {"loss", loss},         {"samples_per_second", sps}, {"tokens_per_second", tps},
          {"step_seconds", step}, {"cpu_cores", cpu},          {"resident_memory_bytes", rss}};
}

Json MetricsHistory::json(const std::vector<HistoryNodeInfo>& nodes,
                          const std::vector<HistoryJobInfo>& jobs,
                          const std::optional<std::string>& job,
                          double now,
                          double interval_s,
                          std::size_t max_points) const {
  // The series are copied under the lock and written out after it, so that heartbeats (record())
  // do not wait while a large answer is built.
  std::map<std::string, NodeSeries> node_series;
  std::map<RankKey, RankSeries> rank_series;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    node_series = impl_->nodes;
    for (const auto& [key, series] : impl_->ranks)
      if (!job || key.first == *job) rank_series.emplace(key, series);
  }
  const Impl& m = *impl_;  // node_json and rank_json read only their arguments
  Json out = {
      {"time", now}, {"interval_s", interval_s}, {"nodes", Json::array()}, {"jobs", Json::array()}};
  std::set<std::string> listed;
  auto add_node = [&](const std::string& id, const std::string& hostname, const std::string& state,
                      Json age) {
    auto it = node_series.find(id);
    Json n = {{"node_id", id}, {"hostname", hostname}, {"state", state}, {"heartbeat_age_s", age}};
    n.update(m.node_json(it == node_series.end() ? nullptr : &it->second, max_points));
    out["nodes"].push_back(std::move(n));
    listed.insert(id);
  };
  for (const HistoryNodeInfo& n : nodes)
    add_node(n.node_id, n.hostname, n.state, n.heartbeat_age_s);
  for (const auto& [id, series] : node_series) {
    if (!listed.count(id)) add_node(id, "", "", nullptr);
  }

  std::vector<std::pair<std::string, std::string>> job_list;  // (id, status)
  std::set<std::string> known;
  for (const HistoryJobInfo& j : jobs) {
    known.insert(j.job_id);
    job_list.emplace_back(j.job_id, j.status);
  }
  for (const auto& [key, series] : rank_series) {
    if (!known.count(key.first)) {
      known.insert(key.first);
      job_list.emplace_back(key.first, "");
    }
  }
  for (const auto& [id, status] : job_list) {
    if (job && id != *job) continue;
    Json ranks = Json::array();
    for (auto it = rank_series.lower_bound({id, std::numeric_limits<int>::min()});
         it != rank_series.end() && it->first.first == id; ++it) {
      ranks.push_back(m.rank_json(it->first, it->second, max_points));
    }
    if (ranks.empty() && !job) continue;  // without a filter: jobs with rank series only
    out["jobs"].push_back({{"job_id", id}, {"status", status}, {"ranks", std::move(ranks)}});
  }
  return out;
}

bool MetricsHistory::has_job(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->ranks.lower_bound({job_id, std::numeric_limits<int>::min()});
  return it != impl_->ranks.end() && it->first.first == job_id;
}

}  // namespace trainyard::cluster
