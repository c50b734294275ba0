// The head under load, in one process (LibTorch-free): cluster::Head on loopback and
// net::HttpClient callers. Usage:
//   cluster_bench [--parts "api restart"] [--clients 100] [--seconds 10] [--nodes 4]
//                 [--jobs 50] [--restart-jobs 1000] [--restarts 3]
// api:     --nodes fake nodes register and heartbeat every 2 s, --jobs jobs wait PENDING (each
//          asks for more nodes than there are); then --clients threads, each with a client of its
//          own (one keep-alive connection), GET one path in a loop for --seconds: requests/s and
//          the latency's p50, p99 and max, for GET /api/cluster/status and GET /api/jobs/.
// restart: a head whose store gets --restart-jobs jobs (POSTed one after another: the submit
//          rate), is stopped, and is started again --restarts times: the seconds of Head::start()
//          and from before it to the first GET /api/jobs/ answer listing every job.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trainyard/cluster/api.h"
#include "trainyard/cluster/head.h"
#include "trainyard/error.h"
#include "trainyard/net/http_client.h"

namespace {

namespace fs = std::filesystem;
namespace api = trainyard::cluster::api;
namespace f = api::field;
using nlohmann::json;
using trainyard::cluster::Head;
using trainyard::cluster::HeadOptions;
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
      else
        throw trainyard::Error("unknown part '" + p + "' (api, restart)");
      std::printf("\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cluster_bench: error: %s\n", e.what());
    rc = 1;
  }
  fs::remove_all(dir);
  return rc;
}
