// The head's dashboard in a real headless browser (Debian's chromium through chromedriver and the
// W3C WebDriver protocol): a head fed over real HTTP by two simulated workers, each running one
// rank of a job and sending realistic metrics snapshots in every heartbeat. The page must chart
// every rank, list both nodes healthy, and show a node unhealthy once its heartbeats stop.
// Saves a screenshot to build/test-artifacts/dashboard.png.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <thread>

#include "../prerequisite.h"
#include "../unit/cluster_test_util.h"
#include "dashboard_page.h"
#include "trainyard/cluster/api.h"
#include "trainyard/cluster/head.h"
#include "trainyard/metrics/names.h"
#include "trainyard/metrics/snapshot.h"
#include "webdriver.h"

namespace trainyard::cluster {
namespace {

using nlohmann::json;
namespace mn = metrics::name;

constexpr char kToken[] = "dashboard-test-token";

// One worker's heartbeats, every 200 ms on a thread of its own, until stop(): a job report
// ("running") and a snapshot of its node and its one rank, whose step counters advance with time.
class SimulatedWorker {
 public:
  SimulatedWorker(
      std::string head_url, std::string node, std::string job, int rank, double slowness)
      : url_(std::move(head_url)),
        node_(std::move(node)),
        job_(std::move(job)),
        rank_(rank),
        slowness_(slowness) {
    post(std::string(api::kNodesPath),
         {{"node_id", node_},
          {"hostname", "host-" + node_},
          {"address", "10.0.0." + std::to_string(rank_ + 1)},
          {"resources", {{"cpu", 8}, {"gpu", 1}, {"memory_bytes", int64_t{32} << 30}}}});
    thread_ = std::thread([this] {
      while (!stopping_) {
        beat();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }
  ~SimulatedWorker() { stop(); }
  void stop() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  json post(const std::string& path, const json& body) {
    net::HttpRequest r;
    r.method = "POST";
    r.url = url_ + path;
    r.body = body.dump();
    r.headers = {{"Content-Type", "application/json"},
                 {"Authorization", std::string("Bearer ") + kToken}};
    r.timeout = std::chrono::milliseconds(5'000);
    auto res = http_.perform(r);
    if (res.status != 200) throw Error("The head answered " + res.describe());
    return json::parse(res.body);
  }

  metrics::Snapshot snapshot() {
    ++beats_;
    const double steps = 5.0 * beats_;
    const metrics::Labels who = {{"job_id", job_}, {"rank", std::to_string(rank_)}};
    auto phase = [&](std::string_view p, double per_step) {
      metrics::Labels l = who;
      l.emplace_back("phase", std::string(p));
      return metrics::Sample{l, per_step * steps};
    };
    using metrics::Family;
    using metrics::MetricType;
    const double wave = 0.1 * std::sin(beats_ / 3.0);
    const metrics::Labels gpu0 = {{"gpu", "0"}};
    return {
        {std::string(mn::kNodeCpus), MetricType::kGauge, "", {{{}, 8}}},
        {std::string(mn::kNodeCpuUtilization), MetricType::kGauge, "", {{{}, 0.55 + wave}}},
        {std::string(mn::kNodeMemoryUsed),
         MetricType::kGauge,
         "",
         {{{}, (12.0 + wave) * (1 << 30)}}},
        {std::string(mn::kNodeMemoryTotal), MetricType::kGauge, "", {{{}, 32.0 * (1 << 30)}}},
        {std::string(mn::kGpuUtilization), MetricType::kGauge, "", {{gpu0, 0.8 + wave}}},
        {std::string(mn::kGpuMemoryUsed), MetricType::kGauge, "", {{gpu0, 30e9}}},
        {std::string(mn::kGpuMemoryTotal), MetricType::kGauge, "", {{gpu0, 80e9}}},
        {std::string(mn::kTrainLoss), MetricType::kGauge, "", {{who, 3.0 / (1 + 0.05 * beats_)}}},
        {std::string(mn::kTrainSamplesPerSecond), MetricType::kGauge, "", {{who, 256 / slowness_}}},
        {std::string(mn::kTrainStepsTotal), MetricType::kCounter, "", {{who, steps}}},
        {std::string(mn::kTrainStepPhaseSeconds),
         MetricType::kCounter,
         "",
         {phase(mn::kPhaseData, 0.02 * slowness_), phase(mn::kPhaseForward, 0.08),
          phase(mn::kPhaseBackward, 0.15), phase(mn::kPhaseCommunication, 0.04 * slowness_),
          phase(mn::kPhaseOptimizer, 0.03), phase(mn::kPhaseOther, 0.01)}},
        {std::string(mn::kRankCpuCores), MetricType::kGauge, "", {{who, 0.97}}},
        {std::string(mn::kRankResidentMemory), MetricType::kGauge, "", {{who, 3.5e9}}},
    };
  }

  void beat() {
    json report = {{"job_id", job_},       {"state", "running"},         {"restart_count", 0},
                   {"exit_code", nullptr}, {"failed_rank", nullptr},     {"message", ""},
                   {"error_type", ""},     {"last_lines", json::array()}};
    json body = {{"usage", {{"cpu_used", 1}, {"memory_used_bytes", int64_t{12} << 30}}},
                 {"jobs", json::array({report})},
                 {"metrics", snapshot()}};
    try {
      post(api::node_heartbeat_path(node_), body);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "heartbeat of " << node_ << ": " << e.what();
    }
  }

  net::HttpClient http_;
  std::string url_, node_, job_;
  int rank_;
  double slowness_;
  int beats_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

TEST(DashboardTest, ChartsEveryRankAndShowsALostNodeInABrowser) {
  for (const char* p : {TRAINYARD_CHROMIUM_PATH, TRAINYARD_CHROMEDRIVER_PATH}) {
    if (!std::filesystem::exists(p)) {
      TY_MISSING_PREREQUISITE(
          p << " is missing: install chromium and chromium-driver (scripts/setup.sh) "
            << "to run the dashboard's browser test.");
    }
  }
  test::TempDir dir;
  Head head(HeadOptions{.port = 0,
                        .token = kToken,
                        .state_dir = dir.path() / "state",
                        .heartbeat_interval = std::chrono::milliseconds(200),
                        .suspect_after = std::chrono::milliseconds(2'000),
                        .dead_after = std::chrono::milliseconds(6'000),
                        .tick_interval = std::chrono::milliseconds(100)});
  head.start();
  const std::map<std::string, std::string> auth = {
      {"Authorization", std::string("Bearer ") + kToken}};
  auto submitted = test::http("POST", head.url() + std::string(api::kJobsPath),
                              json{{"entrypoint", "python train.py"},
                                   {"submission_id", "train-gpt"},
                                   {"trainyard", {{"nodes", "2"}, {"nproc_per_node", 1}}}}
                                  .dump(),
                              auth);
  ASSERT_EQ(submitted.status, 200) << submitted.body;
  const std::string job = submitted.json()["job_id"];

  SimulatedWorker a(head.url(), "node-a", job, 0, 1.0);
  SimulatedWorker b(head.url(), "node-b", job, 1, 2.5);  // a straggler: slow data and comms
  ASSERT_TRUE(test::eventually(
      [&] {
        return test::http("GET", head.url() + api::job_path(job), "", auth)
                   .json()
                   .value("status", "") == "RUNNING";
      },
      std::chrono::seconds(10)))
      << "the job did not start on the simulated workers";

  test::WebDriver browser(test::WebDriverOptions{.chromedriver = TRAINYARD_CHROMEDRIVER_PATH,
                                                 .chromium = TRAINYARD_CHROMIUM_PATH,
                                                 .work_dir = dir.path()});
  test::ScreenshotAtExit screenshot(
      browser, std::filesystem::path(TRAINYARD_TEST_ARTIFACTS_DIR) / "dashboard.png");
  browser.navigate(head.url() + std::string(api::kDashboardPath) + "#token=" + kToken);

  // Every rank charted with at least two points (one refresh after a few heartbeats), both
  // nodes alive.
  json page;
  bool charted = test::eventually(
      [&] {
        page = browser.execute(test::kReadPage);
        return page.value("ready", false) && page["job"] == job &&
               test::every_rank_has_points(page["loss"], 2, 2) &&
               test::every_rank_has_points(page["throughput"], 2, 2) &&
               test::every_rank_has_points(page["communication"], 2, 1) &&
               page["steps"].size() == 6 && test::every_rank_has_points(page["steps"], 6, 2) &&
               page["nodeCpu"] == 2 && page["gpuCharts"] == 2 &&
               test::node_state(page, "node-a") == "alive" &&
               test::node_state(page, "node-b") == "alive";
      },
      std::chrono::seconds(15));
  ASSERT_TRUE(charted) << page.dump(1);
  EXPECT_TRUE(page["error"].is_null()) << page["error"];
  // The token left the address bar once read.
  EXPECT_EQ(browser.execute("return location.hash;"), "");

  // The jobs table's logs view fetches the job's logs.
  auto logged =
      test::http("POST", head.url() + api::worker_logs_path(job),
                 json{{"node_id", "node-a"},
                      {"first_seq", 0},
                      {"lines", json::array({json{{"rank", 0}, {"text", "step 10 loss 2.31"}}})}}
                     .dump(),
                 auth);
  ASSERT_EQ(logged.status, 200) << logged.body;
  browser.execute(
      "document.querySelector('#jobs tr[data-job-id=\"' + arguments[0] +"
      "'\"] td:last-child button').click();",
      json::array({job}));
  std::string logs;
  EXPECT_TRUE(test::eventually(
      [&] {
        logs = browser.execute("return document.getElementById('logs-text').textContent;");
        return logs.find("[node-a:0] step 10 loss 2.31") != std::string::npos;
      },
      std::chrono::seconds(5)))
      << logs;

  // node-b stops beating: the page marks it unhealthy (suspect, then dead) with a red badge.
  b.stop();
  bool unhealthy = test::eventually(
      [&] {
        page = browser.execute(test::kReadPage);
        std::string s = test::node_state(page, "node-b");
        return s == "suspect" || s == "dead";
      },
      std::chrono::seconds(10));
  ASSERT_TRUE(unhealthy) << page.dump(1);
  for (const auto& n : page["nodes"]) {
    if (n["id"] == "node-b") {
      EXPECT_NE(n["badge"].get<std::string>().find("bad"), std::string::npos) << n;
    }
    if (n["id"] == "node-a") {
      EXPECT_EQ(n["state"], "alive") << n;
    }
  }

  const std::string bytes = screenshot.save();
  ASSERT_GT(bytes.size(), 8u);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
}

}  // namespace
}  // namespace trainyard::cluster
