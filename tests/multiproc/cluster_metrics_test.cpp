// The head's /metrics scraped by a real Prometheus: a head and two `trainyard worker` processes
// run a 2-node fashion-mnist job; Prometheus (Debian's, scraping every second with the cluster
// token) must hold both nodes' CPU series and each rank's training series, labelled node, job and
// rank, and promtool must find nothing wrong with the live /metrics text.
#include <gtest/gtest.h>
#include <unistd.h>

#include <signal.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "../e2e/dashboard_page.h"
#include "../e2e/webdriver.h"
#include "../prerequisite.h"
#include "cluster_fixture.h"
#include "multiproc_util.h"
#include "trainyard/net/http_client.h"

#ifndef TRAINYARD_CLI_PATH
#error "TRAINYARD_CLI_PATH must name the trainyard binary (a compile definition)"
#endif

namespace trainyard::mptest {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr const char* kPromtool = "/usr/bin/promtool";

net::HttpResponse get(const std::string& url, const std::string& token = "") {
  net::HttpClient client;
  net::HttpRequest request{.method = "GET", .url = url};
  if (!token.empty()) request.headers = {{"Authorization", "Bearer " + token}};
  request.timeout = 5s;
  return client.perform(request);
}

// A Prometheus server of its own: config and TSDB in `dir`, listening on a free loopback port.
class Prometheus {
 public:
  Prometheus(const std::filesystem::path& dir, int target_port, const std::string& token_file)
      : dir_(dir) {
    bind_loopback(false, &port_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "prometheus.yml")
        << "global:\n"
        << "  scrape_interval: 1s\n"
        << "  scrape_timeout: 1s\n"
        << "scrape_configs:\n"
        << "  - job_name: trainyard\n"
        << "    authorization:\n"
        << "      credentials_file: " << token_file << "\n"
        << "    static_configs:\n"
        << "      - targets: ['127.0.0.1:" << target_port << "']\n";
    const std::string command = std::string("exec ") + kPrometheus +
                                " --config.file=" + (dir_ / "prometheus.yml").string() +
                                " --storage.tsdb.path=" + (dir_ / "data").string() +
                                " --web.listen-address=127.0.0.1:" + std::to_string(port_) + " >>" +
                                (dir_ / "prometheus.log").string() + " 2>&1";
    process_ = std::make_unique<elastic::Subprocess>(
        elastic::SubprocessOptions{.argv = {"/bin/sh", "-c", command},
                                   .stdout_mode = elastic::OutputMode::kInherit,
                                   .stderr_mode = elastic::OutputMode::kInherit,
                                   .destructor_term_timeout = 5s});
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return read_file(dir_ / "prometheus.log"); }
  bool ready() const {
    try {
      return get(url() + "/-/ready").status == 200;
    } catch (const std::exception&) {
      return false;
    }
  }
  // The instant vector of `metric` (a bare name: nothing to escape), [] when the query fails.
  json query(const std::string& metric) const {
    try {
      const auto r = get(url() + "/api/v1/query?query=" + metric);
      const json j = json::parse(r.body, nullptr, false);
      if (r.status != 200 || !j.is_object() || j.value("status", "") != "success")
        return json::array();
      return j["data"]["result"];
    } catch (const std::exception&) {
      return json::array();
    }
  }
  // Prometheus' whole answer to a PromQL expression ({"status": "success"|"error", ...}).
  json evaluate(const std::string& expr) const {
    std::string encoded;
    for (unsigned char c : expr) {
      if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
        encoded += static_cast<char>(c);
      } else {
        char hex[4];
        std::snprintf(hex, sizeof hex, "%%%02X", c);
        encoded += hex;
      }
    }
    const auto r = get(url() + "/api/v1/query?query=" + encoded);
    return json::parse(r.body, nullptr, false);
  }
  // The target's health ("up", "down", "unknown") and last error, for failure messages.
  std::string targets() const {
    try {
      return get(url() + "/api/v1/targets").body;
    } catch (const std::exception& e) {
      return e.what();
    }
  }

 private:
  std::filesystem::path dir_;
  int port_ = 0;
  std::unique_ptr<elastic::Subprocess> process_;
};

// The values of `label` over a query's series whose labels include every one of `match`.
std::set<std::string> label_values(const json& result,
                                   const std::string& label,
                                   const std::map<std::string, std::string>& match = {}) {
  std::set<std::string> out;
  for (const auto& series : result) {
    const json& m = series["metric"];
    bool all = true;
    for (const auto& [k, v] : match) all = all && m.value(k, "") == v;
    if (all && m.contains(label)) out.insert(m[label].get<std::string>());
  }
  return out;
}

// The ranks of `job` whose value in a query's result is above 0.
std::set<std::string> ranks_above_zero(const json& result, const std::string& job) {
  std::set<std::string> out;
  for (const auto& series : result) {
    const json& m = series["metric"];
    if (m.value("job_id", "") != job || !m.contains("rank")) continue;
    if (std::stod(series["value"][1].get<std::string>()) > 0)
      out.insert(m["rank"].get<std::string>());
  }
  return out;
}

// A head (running no ranks) and two workers w1 and w2 of 2 CPUs, then a 2-node fashion-mnist job
// `id` that runs long enough to be watched (500 epochs of 256 images; the tests stop it).
void start_long_job(ClusterFixture& cluster,
                    const std::string& id,
                    const std::filesystem::path& storage) {
  // Suspect after 3 s of silence, dead after 10 s: Prometheus or a browser beside two ranks on two
  // cores must not make a healthy node look unhealthy.
  cluster.set_heartbeat("1", "10");
  cluster.start_head({"--num-cpus", "0"});
  cluster.start_worker("w1", {"--num-cpus", "2"});
  cluster.start_worker("w2", {"--num-cpus", "2"});
  ASSERT_TRUE(ClusterFixture::eventually([&] { return cluster.nodes_in("alive") == 2; }, 20s))
      << cluster.log_of("head") << cluster.log_of("w1") << cluster.log_of("w2");
  const RunOutput submitted = cluster.cli({"submit",
                                           "--nodes",
                                           "2",
                                           "--nproc-per-node",
                                           "1",
                                           "--submission-id",
                                           id,
                                           "--no-wait",
                                           "--",
                                           kCli,
                                           "train",
                                           "fashion-mnist",
                                           "--epochs",
                                           "500",
                                           "--limit",
                                           "256",
                                           "--batch-size",
                                           "32",
                                           "--threads",
                                           "1",
                                           "--storage",
                                           storage.string(),
                                           "--name",
                                           id,
                                           "--no-progress"},
                                          30s);
  ASSERT_EQ(submitted.status.exit_code, 0) << submitted.out << submitted.err;
}

TEST(ClusterMetricsTest, PrometheusScrapesNodeAndRankSeriesFromTheHead) {
  if (access(kPrometheus, X_OK) != 0) {
    TY_MISSING_PREREQUISITE(kPrometheus << " is not installed (scripts/setup.sh installs "
                                        << "Debian's prometheus)");
  }
  TempDir dir;
  ClusterFixture cluster{kCli, dir.path()};
  ASSERT_NO_FATAL_FAILURE(start_long_job(cluster, "fmnist", dir.path() / "runs"));
  Prometheus prometheus(dir.path() / "prometheus", cluster.port(), cluster.token_file().string());
  ASSERT_TRUE(ClusterFixture::eventually([&] { return prometheus.ready(); }, 15s))
      << prometheus.log();

  const std::set<std::string> nodes = {cluster.node_id("w1"), cluster.node_id("w2")};
  const std::set<std::string> ranks = {"0", "1"};
  json cpu, samples_per_second, loss;
  const bool all_there = ClusterFixture::eventually(
      [&] {
        cpu = prometheus.query("trainyard_node_cpu_utilization_ratio");
        samples_per_second = prometheus.query("trainyard_train_samples_per_second");
        loss = prometheus.query("trainyard_train_loss");
        return label_values(cpu, "node") == nodes &&
               ranks_above_zero(samples_per_second, "fmnist") == ranks &&
               label_values(loss, "rank", {{"job_id", "fmnist"}}) == ranks;
      },
      40s);
  EXPECT_TRUE(all_there) << "cpu: " << cpu.dump() << "\nsamples/s: " << samples_per_second.dump()
                         << "\nloss: " << loss.dump() << "\ntargets: " << prometheus.targets()
                         << "\n"
                         << cluster.log_of("head") << cluster.log_of("w1");
  EXPECT_EQ(label_values(cpu, "node"), nodes) << cpu.dump();
  // Each rank's series carries the node that ran it.
  EXPECT_EQ(label_values(loss, "node", {{"job_id", "fmnist"}}), nodes) << loss.dump();
  EXPECT_EQ(label_values(samples_per_second, "node", {{"job_id", "fmnist"}}), nodes)
      << samples_per_second.dump();
  // The cluster's own families come through too.
  EXPECT_EQ(label_values(prometheus.query("trainyard_node_up"), "node"), nodes);

  // Every query of docs/grafana/trainyard.json evaluates on this Prometheus (the variables set to
  // match everything), and the training and node panels' queries find series.
  const json grafana =
      json::parse(read_file(std::string(TRAINYARD_SOURCE_DIR) + "/docs/grafana/trainyard.json"));
  int evaluated = 0;
  for (const auto& panel : grafana["panels"]) {
    const std::string title = panel.value("title", "");
    for (const auto& target : panel.value("targets", json::array())) {
      std::string expr = target["expr"];
      for (const std::string var : {"$job", "$node"}) {
        for (auto at = expr.find(var); at != std::string::npos; at = expr.find(var))
          expr.replace(at, var.size(), ".*");
      }
      json answer = prometheus.evaluate(expr);
      ++evaluated;
      EXPECT_EQ(answer.value("status", ""), "success") << title << ": " << expr << "\n" << answer;
      // These find series once rate()'s window holds two scrapes of the counters.
      const bool must_find = title == "Loss per rank" || title == "Throughput per rank" ||
                             title == "Step time by phase, per rank" || title == "CPU utilisation";
      if (must_find && target["refId"] == "A") {
        ClusterFixture::eventually(
            [&] {
              answer = prometheus.evaluate(expr);
              return answer.contains("data") && !answer["data"]["result"].empty();
            },
            15s);
        EXPECT_FALSE(answer["data"]["result"].empty()) << title << ": " << expr << "\n" << answer;
      }
    }
  }
  EXPECT_GT(evaluated, 20);

  // Prometheus' linter on the live text.
  if (access(kPromtool, X_OK) == 0) {
    const auto scrape = get(cluster.address() + "/metrics", cluster.token());
    ASSERT_EQ(scrape.status, 200) << scrape.body;
    std::ofstream(dir.path() / "scrape.txt") << scrape.body;
    const RunOutput lint = run_program({"/bin/sh", "-c",
                                        std::string(kPromtool) + " check metrics < '" +
                                            (dir.path() / "scrape.txt").string() + "' 2>&1"},
                                       {}, 20s);
    EXPECT_EQ(lint.status.exit_code, 0) << lint.out << lint.err;
    EXPECT_EQ(lint.out, "") << scrape.body;
  }
  cluster.cli({"stop", "fmnist"}, 10s);
}

// The dashboard in a real browser while a real 2-node job trains: every rank's loss, throughput
// and step-time series hold points, and a worker that stops (SIGSTOP: no more heartbeats) turns
// unhealthy on the page. Saves a screenshot as build/test-artifacts/dashboard-cluster.png.
TEST(ClusterMetricsTest, TheDashboardChartsARealJobPerRankAndAStoppedNodeTurnsUnhealthy) {
  for (const char* p : {TRAINYARD_CHROMIUM_PATH, TRAINYARD_CHROMEDRIVER_PATH}) {
    if (access(p, X_OK) != 0) {
      TY_MISSING_PREREQUISITE(
          p << " is missing: install chromium and chromium-driver (scripts/setup.sh) "
            << "to run the dashboard's browser test.");
    }
  }
  TempDir dir;
  ClusterFixture cluster{kCli, dir.path()};
  ASSERT_NO_FATAL_FAILURE(start_long_job(cluster, "watched", dir.path() / "runs"));

  test::WebDriver browser(test::WebDriverOptions{.chromedriver = TRAINYARD_CHROMEDRIVER_PATH,
                                                 .chromium = TRAINYARD_CHROMIUM_PATH,
                                                 .work_dir = dir.path() / "browser"});
  test::ScreenshotAtExit screenshot(
      browser, std::filesystem::path(TRAINYARD_TEST_ARTIFACTS_DIR) / "dashboard-cluster.png");
  browser.navigate(cluster.address() + "/dashboard#token=" + cluster.token());
  json page;
  const std::string w1 = cluster.node_id("w1"), w2 = cluster.node_id("w2");
  const bool charted = ClusterFixture::eventually(
      [&] {
        page = browser.execute(test::kReadPage);
        return page.value("ready", false) && page["job"] == "watched" &&
               test::every_rank_has_points(page["loss"], 2, 2) &&
               test::every_rank_has_points(page["throughput"], 2, 2) &&
               test::every_rank_has_points(page["communication"], 2, 1) &&
               test::node_state(page, w1) == "alive" && test::node_state(page, w2) == "alive";
      },
      40s);
  ASSERT_TRUE(charted) << page.dump(1) << cluster.log_of("w1") << cluster.log_of("w2")
                       << cluster.cli({"logs", "watched"}, 10s).out;
  EXPECT_TRUE(page["error"].is_null()) << page["error"];
  EXPECT_EQ(page["nodeCpu"], 2) << page.dump(1);

  // A stopped worker sends no heartbeats: suspect after three missed ones, then dead.
  ASSERT_EQ(::kill(cluster.worker("w2").pid(), SIGSTOP), 0);
  const bool unhealthy = ClusterFixture::eventually(
      [&] {
        page = browser.execute(test::kReadPage);
        const std::string state = test::node_state(page, w2);
        return state == "suspect" || state == "dead";
      },
      15s);
  ::kill(cluster.worker("w2").pid(), SIGCONT);
  ASSERT_TRUE(unhealthy) << page.dump(1);
  EXPECT_EQ(test::node_state(page, w1), "alive") << page.dump(1);

  EXPECT_EQ(screenshot.save().substr(1, 3), "PNG");
  cluster.cli({"stop", "watched"}, 10s);
}

}  // namespace
}  // namespace trainyard::mptest
