// The head under load, in one process (LibTorch-free): cluster::Head on loopback and
// net::HttpClient callers. Usage:
//   cluster_bench [--parts "api restart"] [--clients 100] [--seconds 10] [--nodes 4]
//                 [--jobs 50] [--restart-jobs 1000] [--restarts 3]
//                 [--parts metrics] [--metrics-nodes 16] [--ranks-per-node 8] [--scrape-every 0]
//                 [--heartbeat-every 2000]
// api:     --nodes fake nodes register and heartbeat every 2 s, --jobs jobs wait PENDING (each
//          asks for more nodes than there are); then --clients threads, each with a client of its
//          own (one keep-alive connection), GET one path in a loop for --seconds: requests/s and
//          the latency's p50, p99 and max, for GET /api/cluster/status and GET /api/jobs/.
// restart: a head whose store gets --restart-jobs jobs (POSTed one after another: the submit
//          rate), is stopped, and is started again --restarts times: the seconds of Head::start()
//          and from before it to the first GET /api/jobs/ answer listing every job.
// metrics: --metrics-nodes fake nodes of --ranks-per-node ranks each heartbeat realistic
//          snapshots (node families and ~40 series per rank, values changing) every 2 s (or
//          --heartbeat-every ms: shorter fills the head's history rings sooner) for
//          --seconds, while one client scrapes GET /metrics in a loop (--scrape-every ms apart):
//          the scrape's size and latency (p50, p99, max), the heartbeats' latency, and the
//          process's RSS growth after the first round (the head's cost of keeping snapshots and
//          the history), how full the history's rings are, and GET /api/cluster/metrics/history
//          (what the dashboard polls) at the end: its size and latency.
//          Also the worker's side: the time to build one heartbeat's metrics (NodeSampler on
//          this machine's /proc plus --ranks-per-node rank files read, labelled and serialised).
// hostile: one fake node heartbeats a RUNNING job every 100 ms while GET /api/version is timed,
//          for --seconds unloaded, then for --seconds under 40 idle connections, 40 clients
//          sending a byte a second (reconnecting when cut) and 64 log followers that never read:
//          p50/p99/max of both, the head's thread count and RSS; the job must end SUCCEEDED and
//          the node alive (Note [Serving hostile clients]). Then for --seconds under a flood of
//          idle connections that hold the server's caps (issue 36, defect 1): 256 from the
//          node's own address (127.0.0.1, the per-client cap) and 4 x 256 from 127.0.0.2-5 (past
//          the 768 total), each opened again when the head shuts it: the heartbeats' latency and
//          failures, what the server turned away, and again the job's and the node's state
//          (Note [Keeping room for admitted clients], Note [A head that turned connections
//          away]).
#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trainyard/cluster/api.h"
#include "trainyard/cluster/head.h"
#include "trainyard/error.h"
#include "trainyard/metrics/names.h"
#include "trainyard/metrics/node_sampler.h"
#include "trainyard/metrics/rank_files.h"
#include "trainyard/metrics/registry.h"
#include "trainyard/net/http_client.h"

namespace {

namespace fs = std::filesystem;
namespace api = trainyard::cluster::api;
namespace f = api::field;
using nlohmann::json;
using trainyard::cluster::Head;
using trainyard::cluster::HeadOptions;
using trainyard::cluster::MetricsHistoryOptions;
using trainyard::net::HttpClient;
using trainyard::net::HttpRequest;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "cluster-bench-token";

struct Options {
  std::string parts = "api restart";
  int clients = 100;
  double seconds = 10;
  int nodes = 4;
  int jobs = 50;
  int restart_jobs = 1000;
  int restarts = 3;
  int metrics_nodes = 16;
  int ranks_per_node = 8;
  int scrape_every_ms = 0;
  int heartbeat_every_ms = 2000;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

HttpRequest request(const Head& head, std::string method, std::string path, std::string body = {}) {
  HttpRequest r;
  r.method = std::move(method);
  r.url = head.url() + path;
  r.headers = {{std::string(api::kAuthorizationHeader), std::string(api::kBearerPrefix) + kToken}};
  if (!body.empty()) r.headers.emplace_back("Content-Type", "application/json");
  r.body = std::move(body);
  return r;
}

// One call that must answer 200; its body as JSON.
json call(HttpClient& client,
          const Head& head,
          std::string method,
          std::string path,
          const json& body = nullptr) {
  auto r =
      client.perform(request(head, std::move(method), path, body.is_null() ? "" : body.dump()));
  if (r.status != 200) throw trainyard::Error(path + ": " + r.describe());
  return json::parse(r.body);
}

json pending_job(int i, int nodes) {
  return {{f::kEntrypoint, "sleep 1"},
          {f::kSubmissionId, "bench-" + std::to_string(i)},
          {f::kTrainyard, {{f::kNodes, std::to_string(nodes)}}}};
}

double percentile(std::vector<double>& v, double p) {  // v sorted
  if (v.empty()) return 0;
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// --clients threads GET `path` for `seconds`; prints one row.
void hammer(const Head& head, const std::string& path, const Options& o) {
  std::atomic<bool> go{false}, done{false};
  std::vector<std::vector<double>> lat(o.clients);  // per thread, ms
  std::vector<long> errors(o.clients, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < o.clients; ++t) {
    threads.emplace_back([&, t] {
      HttpClient client;
      HttpRequest r = request(head, "GET", path);
      while (!go.load()) std::this_thread::yield();
      while (!done.load()) {
        auto t0 = Clock::now();
        try {
          auto resp = client.perform(r);
          if (resp.status != 200) ++errors[t];
        } catch (const std::exception&) {
          ++errors[t];
        }
        lat[t].push_back(seconds_since(t0) * 1e3);
      }
    });
  }
  auto t0 = Clock::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  done = true;
  for (auto& th : threads) th.join();
  double wall = seconds_since(t0);
  std::vector<double> all;
  long errs = 0;
  int starved = 0;  // clients that waited more than half the run for one answer
  for (int t = 0; t < o.clients; ++t) {
    all.insert(all.end(), lat[t].begin(), lat[t].end());
    errs += errors[t];
    if (!lat[t].empty() && *std::max_element(lat[t].begin(), lat[t].end()) > o.seconds * 500) {
      ++starved;
    }
  }
  std::sort(all.begin(), all.end());
  std::printf("%-22s %7d %9zu %7ld %7d %10.0f %8.2f %8.2f %8.2f %9.2f\n", path.c_str(), o.clients,
              all.size(), errs, starved, static_cast<double>(all.size()) / wall,
              percentile(all, 0.5), percentile(all, 0.99), percentile(all, 0.999),
              all.empty() ? 0.0 : all.back());
  std::fflush(stdout);
}

void api_part(const Options& o, const fs::path& dir) {
  Head head(HeadOptions{.port = 0, .token = kToken, .state_dir = dir / "api"});
  head.start();
  HttpClient client;
  for (int n = 0; n < o.nodes; ++n) {
    call(client, head, "POST", std::string(api::kNodesPath),
         {{f::kNodeId, "fake-node-" + std::to_string(n)},
          {f::kHostname, "fake" + std::to_string(n)},
          {f::kAddress, "127.0.0.1"},
          {f::kResources, {{f::kCpu, 4}, {f::kGpu, 0}, {f::kMemoryBytes, 16LL << 30}}}});
  }
  for (int i = 0; i < o.jobs; ++i)
    call(client, head, "POST", "/api/jobs/", pending_job(i, o.nodes + 1));
  std::atomic<bool> stop{false};
  double heartbeat_max_s = 0;   // the longest heartbeat call, written by the thread below
  std::thread heartbeats([&] {  // the fake nodes stay alive
    HttpClient hb;
    while (!stop.load()) {
      for (int n = 0; n < o.nodes; ++n) {
        auto t0 = Clock::now();
        call(hb, head, "POST", api::node_heartbeat_path("fake-node-" + std::to_string(n)),
             {{f::kUsage, json::object()}, {f::kJobs, json::array()}});
        heartbeat_max_s = std::max(heartbeat_max_s, seconds_since(t0));
      }
      for (int i = 0; i < 20 && !stop.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  json status = call(client, head, "GET", std::string(api::kStatusPath));
  std::printf(
      "api: a head with %zu nodes (heartbeating every 2 s) and %d PENDING jobs; "
      "%d clients for %.0f s per path; status body %zu B, jobs body %zu B\n",
      status["nodes"].size(), o.jobs, o.clients, o.seconds, status.dump().size(),
      call(client, head, "GET", "/api/jobs/").dump().size());
  std::printf("%-22s %7s %9s %7s %7s %10s %8s %8s %8s %9s\n", "path", "clients", "requests",
              "errors", "starved", "req/s", "p50_ms", "p99_ms", "p999_ms", "max_ms");
  hammer(head, std::string(api::kStatusPath), o);
  hammer(head, "/api/jobs/", o);
  stop = true;
  heartbeats.join();
  json end = call(client, head, "GET", std::string(api::kStatusPath));
  std::string states;
  for (const auto& n : end["nodes"]) states.append(" ").append(n.value("state", std::string("?")));
  std::printf("the longest heartbeat call took %.2f s; the nodes' states at the end:%s\n",
              heartbeat_max_s, states.c_str());
  head.stop();
}

void restart_part(const Options& o, const fs::path& dir) {
  HeadOptions ho{.port = 0, .token = kToken, .state_dir = dir / "restart"};
  {
    Head head(ho);
    head.start();
    HttpClient client;
    auto t0 = Clock::now();
    for (int i = 0; i < o.restart_jobs; ++i)
      call(client, head, "POST", "/api/jobs/", pending_job(i, 2));
    double fill = seconds_since(t0);
    std::printf(
        "restart: %d jobs POSTed one after another in %.2f s (%.0f submits/s); head.db %.1f MB\n",
        o.restart_jobs, fill, o.restart_jobs / fill,
        static_cast<double>(fs::file_size(ho.state_dir / "head.db")) / 1e6);
    head.stop();
  }
  std::printf("%-4s %10s %14s %12s\n", "run", "start_s", "first_list_s", "list_bytes");
  for (int r = 1; r <= o.restarts; ++r) {
    HttpClient client;
    auto t0 = Clock::now();
    Head head(ho);
    head.start();
    double started = seconds_since(t0);
    size_t bytes = 0;
    for (;;) {
      auto resp = client.perform(request(head, "GET", "/api/jobs/"));
      if (resp.status == 200) {
        json list = json::parse(resp.body);
        if (static_cast<int>(list.size()) == o.restart_jobs) {
          bytes = resp.body.size();
          break;
        }
      }
      if (seconds_since(t0) > 60)
        throw trainyard::Error("the restarted head did not list every job in 60 s");
    }
    std::printf("%-4d %10.3f %14.3f %12zu\n", r, started, seconds_since(t0), bytes);
    std::fflush(stdout);
    head.stop();
  }
}

// --- metrics
// --------------------------------------------------------------------------------------

namespace metrics = trainyard::metrics;
namespace mname = metrics::name;

// A field of /proc/self/status ("VmRSS:" in kB, "Threads:"), as a number.
double proc_status(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(std::strlen(key)));
  }
  return 0;
}

// Resident memory of this process, bytes.
double rss_bytes() {
  return proc_status("VmRSS:") * 1024;
}

// What one rank's registry holds after some training: ~40 series. `t` moves the values on.
metrics::Registry& rank_registry(metrics::Registry& r, double t) {
  r.gauge(mname::kTrainLoss, "loss").set(2.0 / (1 + t));
  r.gauge(mname::kTrainLearningRate, "lr").set(1e-3);
  r.gauge(mname::kTrainEpoch, "epoch").set(t / 100);
  r.gauge(mname::kTrainStep, "step").set(t);
  r.counter(mname::kTrainStepsTotal, "steps").add(1);
  r.counter(mname::kTrainSamplesTotal, "samples").add(256);
  r.counter(mname::kTrainTokensTotal, "tokens").add(256 * 2048);
  r.gauge(mname::kTrainSamplesPerSecond, "samples/s").set(1000 + t);
  r.gauge(mname::kTrainTokensPerSecond, "tokens/s").set(2e6 + t);
  r.gauge(mname::kTrainStepSeconds, "step s").set(0.25);
  for (auto phase : {mname::kPhaseData, mname::kPhaseForward, mname::kPhaseBackward,
                     mname::kPhaseCommunication, mname::kPhaseOptimizer, mname::kPhaseOther}) {
    r.counter(mname::kTrainStepPhaseSeconds, "phase s", {{"phase", std::string(phase)}}).add(0.04);
  }
  for (auto op : {mname::kOpAllReduce, mname::kOpAllGather, mname::kOpReduceScatter,
                  mname::kOpBroadcast, mname::kOpBarrier}) {
    const metrics::Labels l = {{"op", std::string(op)}};
    r.counter(mname::kCollectiveCalls, "calls", l).add(10);
    r.counter(mname::kCollectiveBytes, "bytes", l).add(1e8);
    r.counter(mname::kCollectiveSeconds, "s", l).add(0.01);
    r.counter(mname::kCollectiveWaitSeconds, "wait s", l).add(0.005);
  }
  r.counter(mname::kCheckpointSaves, "saves");
  r.counter(mname::kCheckpointSaveSeconds, "save s");
  r.counter(mname::kCheckpointSaveBytes, "save bytes");
  r.counter(mname::kCheckpointLoads, "loads");
  r.counter(mname::kCheckpointLoadSeconds, "load s");
  r.counter(mname::kCheckpointLoadBytes, "load bytes");
  r.counter(mname::kRestarts, "restarts");
  return r;
}

// One fake node's heartbeat snapshot: what a worker of 16 CPUs, 2 network and 2 disk devices
// and `ranks` ranks (processes and registries, labelled job and rank) sends.
metrics::Snapshot node_snapshot(int node, int ranks, double t) {
  using metrics::MetricType;
  auto gauge = [](std::string_view n, std::vector<metrics::Sample> s) {
    return metrics::Family{std::string(n), MetricType::kGauge, "node gauge", std::move(s)};
  };
  auto counter = [](std::string_view n, std::vector<metrics::Sample> s) {
    return metrics::Family{std::string(n), MetricType::kCounter, "node counter", std::move(s)};
  };
  std::vector<metrics::Sample> cores;
  for (int c = 0; c < 16; ++c) cores.push_back({{{"cpu", std::to_string(c)}}, 0.5 + 0.01 * c});
  auto devices = [&](std::vector<std::string> names, double v) {
    std::vector<metrics::Sample> out;
    for (auto& n : names) out.push_back({{{"device", n}}, v});
    return out;
  };
  metrics::Snapshot s = {
      gauge(mname::kNodeCpus, {{{}, 16}}),
      gauge(mname::kNodeCpuUtilization, {{{}, 0.6}}),
      gauge(mname::kNodeCoreUtilization, cores),
      gauge(mname::kNodeMemoryUsed, {{{}, 3e10 + t}}),
      gauge(mname::kNodeMemoryTotal, {{{}, 6.4e10}}),
      counter(mname::kNodeNetworkReceive, devices({"eth0", "lo"}, 1e9 * t)),
      counter(mname::kNodeNetworkTransmit, devices({"eth0", "lo"}, 1e9 * t)),
      counter(mname::kNodeDiskRead, devices({"nvme0n1", "nvme1n1"}, 1e8 * t)),
      counter(mname::kNodeDiskWritten, devices({"nvme0n1", "nvme1n1"}, 1e8 * t)),
  };
  const std::string job = "raysubmit_bench000000000000";
  for (int r = 0; r < ranks; ++r) {
    const metrics::Labels labels = {{"job_id", job}, {"rank", std::to_string(node * ranks + r)}};
    metrics::Snapshot p = {gauge(mname::kRankResidentMemory, {{labels, 4e9}}),
                           counter(mname::kRankCpuSeconds, {{labels, 10 * t}}),
                           gauge(mname::kRankCpuCores, {{labels, 0.95}})};
    metrics::merge_into(s, std::move(p));
    metrics::Registry registry;
    metrics::merge_into(s, metrics::with_labels(rank_registry(registry, t).snapshot(), labels));
  }
  return s;
}

std::size_t sample_count(const metrics::Snapshot& s) {
  std::size_t n = 0;
  for (const auto& f : s) n += f.samples.size();
  return n;
}

void metrics_part(const Options& o, const fs::path& dir) {
  // The worker's side first: one heartbeat's metrics on this machine.
  {
    const fs::path rank_dir = dir / "rank_files";
    for (int r = 0; r < o.ranks_per_node; ++r) {
      metrics::Registry registry;
      rank_registry(registry, 1);
      metrics::FilePublisher(registry, {.dir = rank_dir.string(), .rank = r}).publish_now();
    }
    metrics::NodeSampler sampler;
    std::vector<metrics::WatchedProcess> watched;
    for (int r = 0; r < o.ranks_per_node; ++r)
      watched.push_back({getpid(), {{"job_id", "j"}, {"rank", std::to_string(r)}}});
    std::vector<double> ms;
    std::size_t bytes = 0, samples = 0;
    for (int i = 0; i < 50; ++i) {
      auto t0 = Clock::now();
      metrics::Snapshot s = sampler.sample(watched);
      for (auto& r : metrics::read_rank_files(rank_dir.string())) {
        metrics::merge_into(
            s, metrics::with_labels(std::move(r.snapshot),
                                    {{"job_id", "j"}, {"rank", std::to_string(r.rank)}}));
      }
      json j;
      metrics::to_json(j, s);
      bytes = j.dump().size();
      ms.push_back(seconds_since(t0) * 1e3);
      samples = sample_count(s);
    }
    std::sort(ms.begin(), ms.end());
    std::printf(
        "metrics, a worker's heartbeat: NodeSampler + %d rank files -> %zu samples, %zu B of "
        "JSON, built in p50 %.2f ms, max %.2f ms (50 builds)\n",
        o.ranks_per_node, samples, bytes, percentile(ms, 0.5), ms.back());
  }

  Head head(HeadOptions{.port = 0, .token = kToken, .state_dir = dir / "metrics"});
  head.start();
  HttpClient client;
  const int nodes = o.metrics_nodes;
  for (int n = 0; n < nodes; ++n) {
    call(client, head, "POST", std::string(api::kNodesPath),
         {{f::kNodeId, "fake-node-" + std::to_string(n)},
          {f::kHostname, "fake" + std::to_string(n)},
          {f::kAddress, "127.0.0.1"},
          {f::kResources, {{f::kCpu, 16}, {f::kGpu, 0}, {f::kMemoryBytes, 64LL << 30}}}});
  }
  // The nodes' bodies are made ahead (the bench measures the head, not the fake workers).
  auto bodies = [&](double t) {
    std::vector<std::string> out;
    for (int n = 0; n < nodes; ++n) {
      json m;
      metrics::to_json(m, node_snapshot(n, o.ranks_per_node, t));
      out.push_back(
          json{{f::kUsage, json::object()}, {f::kJobs, json::array()}, {f::kMetrics, m}}.dump());
    }
    return out;
  };
  const std::size_t per_node = sample_count(node_snapshot(0, o.ranks_per_node, 1));
  std::vector<std::vector<std::string>> rounds = {bodies(1), bodies(2)};
  std::atomic<bool> stop{false};
  std::atomic<int> round{0};
  std::vector<double> heartbeat_ms;  // the heartbeat thread's
  double rss_after_first = 0;
  std::thread heartbeats([&] {
    HttpClient hb;
    while (!stop.load()) {
      const auto round_start = Clock::now();
      const auto& bs = rounds[static_cast<std::size_t>(round.load()) % rounds.size()];
      for (int n = 0; n < nodes; ++n) {
        auto t0 = Clock::now();
        auto r = hb.perform(request(head, "POST",
                                    api::node_heartbeat_path("fake-node-" + std::to_string(n)),
                                    bs[static_cast<std::size_t>(n)]));
        if (r.status != 200) throw trainyard::Error("heartbeat: " + r.describe());
        heartbeat_ms.push_back(seconds_since(t0) * 1e3);
      }
      if (round.fetch_add(1) == 0) rss_after_first = rss_bytes();
      const auto next = round_start + std::chrono::milliseconds(o.heartbeat_every_ms);
      while (!stop.load() && Clock::now() < next)
        std::this_thread::sleep_for(
            std::min<Clock::duration>(std::chrono::milliseconds(100), next - Clock::now()));
    }
  });
  while (round.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::vector<double> scrape_ms;
  std::size_t scrape_bytes = 0;
  const auto t0 = Clock::now();
  while (seconds_since(t0) < o.seconds) {
    auto s0 = Clock::now();
    auto r = client.perform(request(head, "GET", std::string(api::kMetricsPath)));
    if (r.status != 200) throw trainyard::Error("/metrics: " + r.describe());
    scrape_ms.push_back(seconds_since(s0) * 1e3);
    scrape_bytes = r.body.size();
    if (o.scrape_every_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(o.scrape_every_ms));
  }
  stop = true;
  heartbeats.join();
  const double rss_end = rss_bytes();

  std::sort(scrape_ms.begin(), scrape_ms.end());
  std::sort(heartbeat_ms.begin(), heartbeat_ms.end());
  std::printf(
      "metrics, the head: %d nodes x %d ranks heartbeating (%zu samples per node, "
      "%zu B per heartbeat body) every %d ms for %.0f s, %d rounds; one client scraping "
      "/metrics %s\n",
      nodes, o.ranks_per_node, per_node, rounds[0][0].size(), o.heartbeat_every_ms, o.seconds,
      round.load(),
      o.scrape_every_ms > 0 ? ("every " + std::to_string(o.scrape_every_ms) + " ms").c_str()
                            : "back to back");
  std::printf("%-22s %9s %10s %8s %8s %8s\n", "", "count", "bytes", "p50_ms", "p99_ms", "max_ms");
  std::printf("%-22s %9zu %10zu %8.2f %8.2f %8.2f\n", "GET /metrics", scrape_ms.size(),
              scrape_bytes, percentile(scrape_ms, 0.5), percentile(scrape_ms, 0.99),
              scrape_ms.back());
  std::printf("%-22s %9zu %10zu %8.2f %8.2f %8.2f\n", "POST heartbeat", heartbeat_ms.size(),
              rounds[0][0].size(), percentile(heartbeat_ms, 0.5), percentile(heartbeat_ms, 0.99),
              heartbeat_ms.back());

  // What of the growth is memory the allocator keeps for reuse (glibc keeps an arena per HTTP
  // thread that parsed a body or rendered a scrape) rather than memory the head holds.
  malloc_trim(0);
  const double rss_trimmed = rss_bytes();
  std::printf(
      "RSS after the first round %.1f MB, at the end %.1f MB (growth %.1f MB); after "
      "malloc_trim(0) %.1f MB (growth %.1f MB)\n",
      rss_after_first / 1e6, rss_end / 1e6, (rss_end - rss_after_first) / 1e6, rss_trimmed / 1e6,
      (rss_trimmed - rss_after_first) / 1e6);
  // The history the dashboard polls, as full as this run made it: every point, and thinned as the
  // dashboard asks for it (?max_points=300). Measured after the RSS: parsing 10 MB answers in this
  // process would count as the head's memory.
  for (const std::string query : {"", "?max_points=300"}) {
    std::vector<double> history_ms;
    std::size_t history_bytes = 0, history_points = 0;
    for (int i = 0; i < 10; ++i) {
      auto h0 = Clock::now();
      auto r = client.perform(request(head, "GET", std::string(api::kMetricsHistoryPath) + query));
      if (r.status != 200) throw trainyard::Error("history: " + r.describe());
      history_ms.push_back(seconds_since(h0) * 1e3);
      history_bytes = r.body.size();
      const json h = json::parse(r.body);
      history_points = h["nodes"].empty() ? 0 : h["nodes"][0]["t"].size();
    }
    std::sort(history_ms.begin(), history_ms.end());
    std::printf("%-22s %9zu %10zu %8.2f %8.2f %8.2f  (%zu points per series; %d kept)\n",
                ("GET history" + query).c_str(), history_ms.size(), history_bytes,
                percentile(history_ms, 0.5), percentile(history_ms, 0.99), history_ms.back(),
                history_points, MetricsHistoryOptions::kDefaultPoints);
  }
  head.stop();
}

// --- hostile: the head under idle, slow and non-reading clients --------------------------------

// A raw TCP client of the head: connects, sends what it is told, never reads (a small receive
// buffer, so that it stops taking data early).
struct RawClient {
  int fd = -1;
  // From `source` (a loopback address) when given, else the system's choice (127.0.0.1).
  explicit RawClient(int port, const char* source = nullptr) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int small = 4096;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    if (source != nullptr) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &from.sin_addr);
      ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from);
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~RawClient() {
    if (fd >= 0) ::close(fd);
  }
  bool send(const std::string& bytes) const {
    return fd >= 0 && ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) > 0;
  }
  // Whether the head has shut the connection (a read sees its end; nothing else is sent to it).
  bool shut() const {
    if (fd < 0) return true;
    char byte;
    const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }
};

struct Latencies {
  std::vector<double> version, heartbeat;  // ms
};

// Every 100 ms for `seconds`: GET /api/version and node n1's heartbeat, each timed; `each` runs
// between rounds (the attackers' next bytes, the job's log lines).
Latencies probe(const Head& head, double seconds, const std::function<void(int)>& each) {
  HttpClient client;
  Latencies out;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (int round = 0; Clock::now() < end; ++round) {
    each(round);
    auto t0 = Clock::now();
    call(client, head, "GET", std::string(api::kVersionPath));
    out.version.push_back(seconds_since(t0) * 1e3);
    t0 = Clock::now();
    call(client, head, "POST", api::node_heartbeat_path("n1"),
         {{f::kUsage, json::object()},
          {f::kJobs, {{{f::kJobId, "hostile"}, {f::kState, api::kReportRunning}}}}});
    out.heartbeat.push_back(seconds_since(t0) * 1e3);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return out;
}

void print_latencies(const char* phase, Latencies l) {
  std::sort(l.version.begin(), l.version.end());
  std::sort(l.heartbeat.begin(), l.heartbeat.end());
  std::printf("%-44s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.0f %8.1f\n", phase,
              percentile(l.version, 0.5), percentile(l.version, 0.99), l.version.back(),
              percentile(l.heartbeat, 0.5), percentile(l.heartbeat, 0.99), l.heartbeat.back(),
              proc_status("Threads:"), rss_bytes() / (1 << 20));
  std::fflush(stdout);
}

// A head on a free port whose nodes are dead 3 s after their last heartbeat.
HeadOptions quick_head(const fs::path& state_dir) {
  return HeadOptions{.port = 0,
                     .token = kToken,
                     .state_dir = state_dir,
                     .heartbeat_interval = std::chrono::milliseconds(500),
                     .dead_after = std::chrono::milliseconds(3'000)};
}

// Starts `head` with node n1 (4 CPUs) registered and job "hostile" submitted.
void start_with_node_and_job(Head& head, HttpClient& client) {
  head.start();
  call(client, head, "POST", std::string(api::kNodesPath),
       {{f::kNodeId, "n1"},
        {f::kHostname, "bench"},
        {f::kResources, {{f::kCpu, 4}, {f::kGpu, 0}, {f::kMemoryBytes, 1LL << 30}}}});
  call(client, head, "POST", std::string(api::kJobsPath),
       {{f::kEntrypoint, "train"}, {f::kSubmissionId, "hostile"}});
}

// The flood of the header's comment, on a head of its own with a RUNNING job.
void flood_phase(const Options& o, const fs::path& dir) {
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;  // both ends of 1,280 connections live in this process
  ::setrlimit(RLIMIT_NOFILE, &files);
  Head head(quick_head(dir / "flood"));
  HttpClient client;
  start_with_node_and_job(head, client);
  static constexpr const char* kSources[] = {"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4",
                                             "127.0.0.5"};
  // The attacker, on a thread of its own while the node heartbeats: opens the flood, then opens
  // again every connection the head shuts.
  std::atomic<bool> stop{false};
  std::size_t reopened = 0;
  std::thread attacker([&] {
    std::vector<std::pair<const char*, std::unique_ptr<RawClient>>> flood;
    for (const char* source : kSources)
      for (int i = 0; i < 256 && !stop; ++i)
        flood.emplace_back(source, std::make_unique<RawClient>(head.port(), source));
    while (!stop) {
      for (auto& [source, c] : flood)
        if (c->shut()) {
          c = std::make_unique<RawClient>(head.port(), source);
          ++reopened;
        }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  int failed = 0;
  std::string first_failure;
  Latencies l;
  const auto end = Clock::now() + std::chrono::duration<double>(o.seconds);
  while (Clock::now() < end) {
    const auto t0 = Clock::now();
    try {
      call(client, head, "POST", api::node_heartbeat_path("n1"),
           {{f::kUsage, json::object()},
            {f::kJobs, {{{f::kJobId, "hostile"}, {f::kState, api::kReportRunning}}}}});
      l.heartbeat.push_back(seconds_since(t0) * 1e3);
    } catch (const std::exception& e) {
      if (failed++ == 0) first_failure = e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop = true;
  attacker.join();
  const json job = call(client, head, "GET", api::job_path("hostile"));
  const json status = call(client, head, "GET", std::string(api::kStatusPath));
  std::sort(l.heartbeat.begin(), l.heartbeat.end());
  std::printf(
      "flood of 1,280 idle connections (256 from the node's address), %.0f s: heartbeats %zu, "
      "failed %d, p50 %.2f ms, p99 %.2f ms, max %.2f ms; %zu flood connections shut by the "
      "head and opened again; job: %s; node n1: %s\n",
      o.seconds, l.heartbeat.size(), failed, l.heartbeat.empty() ? 0 : percentile(l.heartbeat, 0.5),
      l.heartbeat.empty() ? 0 : percentile(l.heartbeat, 0.99),
      l.heartbeat.empty() ? 0 : l.heartbeat.back(), reopened, job.value(f::kStatus, "?").c_str(),
      status[f::kNodes][0].value(f::kState, "?").c_str());
  if (failed > 0) std::printf("the first failed heartbeat: %s\n", first_failure.c_str());
}

void hostile_part(const Options& o, const fs::path& dir) {
  Head head(quick_head(dir / "hostile"));
  HttpClient client;
  start_with_node_and_job(head, client);
  std::printf("%-44s %8s %8s %8s %8s %8s %8s %8s %8s\n", "phase (ms; head threads, RSS MiB)",
              "ver p50", "ver p99", "ver max", "hb p50", "hb p99", "hb max", "threads", "RSS");
  std::int64_t seq = 0;
  const std::string line(1000, 'x');
  const auto log_lines = [&](int) {
    call(client, head, "POST", api::worker_logs_path("hostile"),
         {{f::kNodeId, "n1"}, {f::kFirstSeq, seq++}, {f::kLines, {{{f::kText, line}}}}});
  };
  print_latencies("unloaded", probe(head, o.seconds, log_lines));
  std::vector<std::unique_ptr<RawClient>> idle, slow, followers;
  for (int i = 0; i < 40; ++i) idle.push_back(std::make_unique<RawClient>(head.port()));
  const std::string handshake = "GET " + api::job_logs_tail_path("hostile") +
                                " HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                                "Connection: Upgrade\r\nSec-WebSocket-Key: "
                                "dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                                "Authorization: Bearer " +
                                std::string(kToken) + "\r\n\r\n";
  for (int i = 0; i < 64; ++i) {
    followers.push_back(std::make_unique<RawClient>(head.port()));
    followers.back()->send(handshake);
  }
  const auto attack = [&](int round) {
    log_lines(round);
    if (round % 10 != 0) return;  // one byte a second from each slow client
    if (slow.empty())
      for (int i = 0; i < 40; ++i) slow.push_back(std::make_unique<RawClient>(head.port()));
    for (auto& c : slow) {
      // A client cut at the request deadline comes back at once, as an attacker would.
      if (!c->send("G")) c = std::make_unique<RawClient>(head.port());
    }
  };
  print_latencies("40 idle + 40 slow (1 B/s) + 64 followers", probe(head, o.seconds, attack));
  call(client, head, "POST", api::node_heartbeat_path("n1"),
       {{f::kUsage, json::object()},
        {f::kJobs, {{{f::kJobId, "hostile"}, {f::kState, api::kReportSucceeded}}}}});
  const json job = call(client, head, "GET", api::job_path("hostile"));
  const json status = call(client, head, "GET", std::string(api::kStatusPath));
  std::printf("job: %s; node n1: %s\n", job.value(f::kStatus, "?").c_str(),
              status[f::kNodes][0].value(f::kState, "?").c_str());
}

}  // namespace

int main(int argc, char** argv) {
  setenv("TRAINYARD_LOG_LEVEL", "warn", 0);
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cluster_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--parts")
      o.parts = value();
    else if (a == "--clients")
      o.clients = std::stoi(value());
    else if (a == "--seconds")
      o.seconds = std::stod(value());
    else if (a == "--nodes")
      o.nodes = std::stoi(value());
    else if (a == "--jobs")
      o.jobs = std::stoi(value());
    else if (a == "--restart-jobs")
      o.restart_jobs = std::stoi(value());
    else if (a == "--restarts")
      o.restarts = std::stoi(value());
    else if (a == "--metrics-nodes")
      o.metrics_nodes = std::stoi(value());
    else if (a == "--ranks-per-node")
      o.ranks_per_node = std::stoi(value());
    else if (a == "--scrape-every")
      o.scrape_every_ms = std::stoi(value());
    else if (a == "--heartbeat-every")
      o.heartbeat_every_ms = std::stoi(value());
    else {
      std::fprintf(
          stderr,
          "cluster_bench: unknown argument '%s' (see the comment atop bench/cluster_bench.cpp)\n",
          a.c_str());
      return 2;
    }
  }
  fs::path dir = fs::temp_directory_path() / ("cluster_bench." + std::to_string(getpid()));
  fs::create_directories(dir);
  int rc = 0;
  try {
    std::istringstream parts(o.parts);
    for (std::string p; parts >> p;) {
      if (p == "api")
        api_part(o, dir);
      else if (p == "restart")
        restart_part(o, dir);
      else if (p == "metrics")
        metrics_part(o, dir);
      else if (p == "hostile") {
        hostile_part(o, dir);  // its head ends before the flood's starts
        flood_phase(o, dir);
      } else
        throw trainyard::Error("unknown part '" + p + "' (api, restart, metrics, hostile)");
      std::printf("\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cluster_bench: error: %s\n", e.what());
    rc = 1;
  }
  fs::remove_all(dir);
  return rc;
}
