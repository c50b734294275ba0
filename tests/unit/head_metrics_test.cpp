// The head's GET /metrics over real HTTP on 127.0.0.1: simulated workers heartbeat known
// snapshots and the scrape shows exactly those values with node labels, the cluster's families
// (zeros included), each family once; dead nodes leave; malformed metrics never fail a
// heartbeat; the token guards it; promtool (Prometheus' linter) finds nothing to report.
#include <curl/curl.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>

#include <fstream>
#include <map>
#include <sstream>

#include "../prerequisite.h"
#include "cluster_test_util.h"
#include "trainyard/cluster/api.h"
#include "trainyard/cluster/head.h"
#include "trainyard/metrics/names.h"
#include "trainyard/metrics/snapshot.h"

namespace trainyard::cluster {
namespace {

using nlohmann::json;
using test::eventually;
namespace name = metrics::name;
using std::chrono::milliseconds;

struct Scrape {
  long status = 0;
  std::string content_type;
  std::string body;
};

// GET /metrics as Prometheus does it; the Content-Type comes back too.
Scrape scrape(const std::string& url, const std::optional<std::string>& token) {
  Scrape r;
  CURL* c = curl_easy_init();
  curl_slist* headers = nullptr;
  if (token) headers = curl_slist_append(headers, ("Authorization: Bearer " + *token).c_str());
  curl_easy_setopt(c, CURLOPT_URL, (url + std::string(api::kMetricsPath)).c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &test::curl_append);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10'000L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  if (curl_easy_perform(c) == CURLE_OK) {
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    char* type = nullptr;
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &type);
    if (type != nullptr) r.content_type = type;
  }
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  return r;
}

// "name{labels} value" -> value, for every sample line of a scrape.
std::map<std::string, std::string> sample_lines(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    out[line.substr(0, space)] = line.substr(space + 1);
  }
  return out;
}

// How often each family's "# TYPE" line appears.
std::map<std::string, int> type_lines(const std::string& text) {
  std::map<std::string, int> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    out[line.substr(7, line.find(' ', 7) - 7)]++;
  }
  return out;
}

// What a worker with one rank of job `job` sends: node families and the rank's.
metrics::Snapshot worker_snapshot(double cpu_ratio, const std::string& job, int rank, double loss) {
  const metrics::Labels r = {{"job_id", job}, {"rank", std::to_string(rank)}};
  return {
      {.name = std::string(name::kNodeCpuUtilization),
       .type = metrics::MetricType::kGauge,
       .help = "Busy fraction of all CPUs.",
       .samples = {{{}, cpu_ratio}}},
      {.name = std::string(name::kNodeNetworkReceive),
       .type = metrics::MetricType::kCounter,
       .help = "Bytes received.",
       .samples = {{{{"device", "eth0"}}, 1000}, {{{"device", "lo"}}, 5}}},
      {.name = std::string(name::kRankResidentMemory),
       .type = metrics::MetricType::kGauge,
       .help = "Resident memory of the rank's process.",
       .samples = {{r, 1e9}}},
      {.name = std::string(name::kTrainLoss),
       .type = metrics::MetricType::kGauge,
       .help = "The last loss.",
       .samples = {{r, loss}}},
  };
}

json as_json(const metrics::Snapshot& s) {
  json j;
  metrics::to_json(j, s);
  return j;
}

class HeadMetricsTest : public ::testing::Test {
 protected:
  void start(std::optional<std::string> token = "metrics-test-token-0123",
             milliseconds suspect_after = milliseconds(5'000),
             milliseconds dead_after = milliseconds(10'000)) {
    token_ = token;
    head_ = std::make_unique<Head>(HeadOptions{.port = 0,
                                               .token = token,
                                               .state_dir = dir_.path() / "state",
                                               .heartbeat_interval = milliseconds(100),
                                               .suspect_after = suspect_after,
                                               .dead_after = dead_after,
                                               .tick_interval = milliseconds(50)});
    head_->start();
  }
  test::HttpResult post(const std::string& path, const json& body) {
    std::map<std::string, std::string> headers;
    if (token_) headers["Authorization"] = "Bearer " + *token_;
    return test::http("POST", head_->url() + path, body.dump(), headers);
  }
  void register_node(const std::string& id) {
    auto r = post(std::string(api::kNodesPath),
                  {{"node_id", id},
                   {"hostname", "host-" + id},
                   {"address", "127.0.0.1"},
                   {"resources", {{"cpu", 4}, {"gpu", 0}, {"memory_bytes", 1 << 30}}},
                   {"jobs", json::array()}});
    ASSERT_EQ(r.status, 200) << r.body;
  }
  // A heartbeat carrying `metrics` (left out when null); the head must accept it.
  void heartbeat(const std::string& id, const json& metrics) {
    json body = {{"usage", {{"cpu_used", 0.5}, {"memory_used_bytes", 1000}}},
                 {"jobs", json::array()}};
    if (!metrics.is_null()) body[api::field::kMetrics] = metrics;
    auto r = post(api::node_heartbeat_path(id), body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json()["registered"], true) << r.body;
  }
  Scrape get_metrics() { return scrape(head_->url(), token_); }

  test::TempDir dir_;
  std::optional<std::string> token_;
  std::unique_ptr<Head> head_;
};

TEST_F(HeadMetricsTest, ShowsEachNodesSnapshotWithNodeLabelsAndTheClusterFamilies) {
  start();
  register_node("n1");
  register_node("n2");
  heartbeat("n1", as_json(worker_snapshot(0.25, "job-a", 0, 2.5)));
  heartbeat("n2", as_json(worker_snapshot(0.75, "job-a", 1, 2.25)));

  const Scrape s = get_metrics();
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.content_type, metrics::kPrometheusContentType);
  const auto lines = sample_lines(s.body);
  const std::map<std::string, std::string> expected = {
      {R"(trainyard_node_cpu_utilization_ratio{node="n1"})", "0.25"},
      {R"(trainyard_node_cpu_utilization_ratio{node="n2"})", "0.75"},
      {R"(trainyard_node_network_receive_bytes_total{node="n1",device="eth0"})", "1000"},
      {R"(trainyard_node_network_receive_bytes_total{node="n1",device="lo"})", "5"},
      {R"(trainyard_node_network_receive_bytes_total{node="n2",device="eth0"})", "1000"},
      {R"(trainyard_node_network_receive_bytes_total{node="n2",device="lo"})", "5"},
      {R"(trainyard_rank_resident_memory_bytes{node="n1",job_id="job-a",rank="0"})", "1e+09"},
      {R"(trainyard_rank_resident_memory_bytes{node="n2",job_id="job-a",rank="1"})", "1e+09"},
      {R"(trainyard_train_loss{node="n1",job_id="job-a",rank="0"})", "2.5"},
      {R"(trainyard_train_loss{node="n2",job_id="job-a",rank="1"})", "2.25"},
      {R"(trainyard_cluster_nodes{state="alive"})", "2"},
      {R"(trainyard_cluster_nodes{state="suspect"})", "0"},
      {R"(trainyard_cluster_nodes{state="pending"})", "0"},
      {R"(trainyard_cluster_nodes{state="dead"})", "0"},
      {R"(trainyard_cluster_nodes{state="exited"})", "0"},
      {R"(trainyard_cluster_nodes{state="drained"})", "0"},
      {R"(trainyard_cluster_jobs{status="PENDING"})", "0"},
      {R"(trainyard_cluster_jobs{status="RUNNING"})", "0"},
      {R"(trainyard_cluster_jobs{status="STOPPED"})", "0"},
      {R"(trainyard_cluster_jobs{status="SUCCEEDED"})", "0"},
      {R"(trainyard_cluster_jobs{status="FAILED"})", "0"},
      {R"(trainyard_node_up{node="n1"})", "1"},
      {R"(trainyard_node_up{node="n2"})", "1"},
  };
  for (const auto& [series, value] : expected) {
    ASSERT_TRUE(lines.count(series)) << series << " missing from\n" << s.body;
    EXPECT_EQ(lines.at(series), value) << series;
  }
  // Heartbeat ages are fresh; nothing else is there.
  for (const char* n : {"n1", "n2"}) {
    const std::string series = std::string(name::kNodeHeartbeatAge) + "{node=\"" + n + "\"}";
    ASSERT_TRUE(lines.count(series)) << s.body;
    EXPECT_LT(std::stod(lines.at(series)), 5.0);
  }
  EXPECT_EQ(lines.size(), expected.size() + 2) << s.body;
  for (const auto& [family, count] : type_lines(s.body)) EXPECT_EQ(count, 1) << family;
  EXPECT_EQ(type_lines(s.body).size(), 8u) << s.body;
  EXPECT_NE(s.body.find("# TYPE trainyard_node_network_receive_bytes_total counter\n"),
            std::string::npos);

  // The latest heartbeat wins; a job's submission shows in the job counts.
  heartbeat("n1", as_json(worker_snapshot(0.5, "job-a", 0, 1.5)));
  auto submitted = post("/api/jobs/", {{"entrypoint", "true"}, {"submission_id", "j1"}});
  ASSERT_EQ(submitted.status, 200) << submitted.body;
  const auto later = sample_lines(get_metrics().body);
  EXPECT_EQ(later.at(R"(trainyard_train_loss{node="n1",job_id="job-a",rank="0"})"), "1.5");
  EXPECT_EQ(later.at(R"(trainyard_node_cpu_utilization_ratio{node="n1"})"), "0.5");
  EXPECT_EQ(later.size(), lines.size());
  const int pending_or_running =
      std::stoi(later.at(R"(trainyard_cluster_jobs{status="PENDING"})")) +
      std::stoi(later.at(R"(trainyard_cluster_jobs{status="RUNNING"})"));
  EXPECT_EQ(pending_or_running, 1);
}

TEST_F(HeadMetricsTest, RequiresTheToken) {
  start();
  EXPECT_EQ(scrape(head_->url(), std::nullopt).status, 401);
  EXPECT_EQ(scrape(head_->url(), "wrong").status, 403);
  EXPECT_EQ(scrape(head_->url(), "metrics-test-token-0123").status, 200);
}

TEST_F(HeadMetricsTest, ADeadNodesSeriesLeave) {
  start("metrics-test-token-0123", milliseconds(1'000), milliseconds(2'000));
  register_node("n1");
  register_node("n2");
  heartbeat("n1", as_json(worker_snapshot(0.25, "job-a", 0, 2.5)));
  heartbeat("n2", as_json(worker_snapshot(0.75, "job-a", 1, 2.25)));
  ASSERT_NE(get_metrics().body.find("node=\"n2\""), std::string::npos);
  // n1 keeps beating; n2 falls silent until the head declares it dead.
  std::string body;
  ASSERT_TRUE(eventually(
      [&] {
        heartbeat("n1", as_json(worker_snapshot(0.25, "job-a", 0, 2.5)));
        body = get_metrics().body;
        return body.find(R"(trainyard_cluster_nodes{state="dead"} 1)") != std::string::npos;
      },
      milliseconds(10'000)))
      << body;
  EXPECT_EQ(body.find("node=\"n2\""), std::string::npos) << body;
  EXPECT_NE(body.find(R"(trainyard_train_loss{node="n1",job_id="job-a",rank="0"} 2.5)"),
            std::string::npos)
      << body;
  EXPECT_NE(body.find(R"(trainyard_cluster_nodes{state="alive"} 1)"), std::string::npos) << body;
  // A node that leaves goes too.
  ASSERT_EQ(post(api::node_leave_path("n1"), {{"reason", "exited"}}).status, 200);
  body = get_metrics().body;
  EXPECT_EQ(body.find("node=\"n1\""), std::string::npos) << body;
  EXPECT_NE(body.find(R"(trainyard_cluster_nodes{state="exited"} 1)"), std::string::npos) << body;
}

TEST_F(HeadMetricsTest, MalformedMetricsNeverFailAHeartbeat) {
  start();
  register_node("n1");
  heartbeat("n1", as_json(worker_snapshot(0.25, "job-a", 0, 2.5)));
  ASSERT_NE(get_metrics().body.find("node=\"n1\",job_id="), std::string::npos);
  for (const json& bad :
       {json{{"not", "a list"}}, json::array({{{"name", "bad name"}, {"type", "gauge"}}}),
        json::array({{{"name", "x"}, {"type", "gauge"}, {"samples", {{{"value", "high"}}}}}})}) {
    heartbeat("n1", bad);
    // The node's series are gone rather than stale; the cluster's stay.
    const std::string body = get_metrics().body;
    EXPECT_EQ(body.find("job_id=\"job-a\""), std::string::npos) << body;
    EXPECT_NE(body.find(R"(trainyard_node_up{node="n1"} 1)"), std::string::npos) << body;
  }
  // A heartbeat without metrics (an older worker) is fine too.
  heartbeat("n1", nullptr);
  EXPECT_EQ(get_metrics().status, 200);
}

TEST_F(HeadMetricsTest, TheHeadsNodeLabelWinsAndDuplicateSeriesAreWrittenOnce) {
  start();
  register_node("n1");
  metrics::Snapshot s = {{.name = "trainyard_train_loss",
                          .type = metrics::MetricType::kGauge,
                          .help = "The last loss.",
                          .samples = {{{{"node", "impostor"}, {"rank", "0"}}, 1.0},
                                      {{{"rank", "0"}}, 2.0},
                                      {{{"rank", "1"}}, 3.0}}}};
  heartbeat("n1", as_json(s));
  const std::string body = get_metrics().body;
  EXPECT_EQ(body.find("impostor"), std::string::npos) << body;
  const auto lines = sample_lines(body);
  EXPECT_EQ(lines.at(R"(trainyard_train_loss{node="n1",rank="0"})"), "1");
  EXPECT_EQ(lines.at(R"(trainyard_train_loss{node="n1",rank="1"})"), "3");
  std::size_t rank0 = 0;
  for (std::size_t at = 0; (at = body.find("rank=\"0\"", at)) != std::string::npos; ++at) ++rank0;
  EXPECT_EQ(rank0, 1u) << body;
}

// Prometheus' own linter on a scrape with every kind of family the workers send.
TEST_F(HeadMetricsTest, PromtoolFindsNoProblems) {
  const char* promtool = "/usr/bin/promtool";
  if (access(promtool, X_OK) != 0)
    TY_MISSING_PREREQUISITE("promtool is not installed (apt-get install prometheus)");
  start();
  register_node("n1");
  register_node("n2");
  heartbeat("n1", as_json(worker_snapshot(0.25, "job-a", 0, 2.5)));
  heartbeat("n2", as_json(worker_snapshot(0.75, "job-a", 1, 2.25)));
  const Scrape s = get_metrics();
  ASSERT_EQ(s.status, 200);
  const auto path = dir_.path() / "scrape.txt";
  std::ofstream(path) << s.body;
  const std::string command = std::string(promtool) + " check metrics < " + path.string() + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output << "\n" << s.body;
  EXPECT_EQ(output, "") << s.body;
}

}  // namespace
}  // namespace trainyard::cluster
