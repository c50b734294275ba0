// cluster::MetricsHistory: known snapshots in, the history API's exact JSON out (docs/METRICS.md);
// ring wraparound, seconds per step per phase from counter differences, nulls for what was not
// measured, the age and job caps, and the head's GET /api/cluster/metrics/history over HTTP.
#include "trainyard/cluster/metrics_history.h"

#include <gtest/gtest.h>

#include "cluster_test_util.h"
#include "trainyard/cluster/api.h"
#include "trainyard/cluster/head.h"
#include "trainyard/error.h"
#include "trainyard/metrics/names.h"

namespace trainyard::cluster {
namespace {

using metrics::Family;
using metrics::MetricType;
using metrics::Snapshot;
using nlohmann::json;
namespace mn = metrics::name;

Family gauge(std::string_view name, std::vector<metrics::Sample> samples) {
  return Family{std::string(name), MetricType::kGauge, "", std::move(samples)};
}
Family counter(std::string_view name, std::vector<metrics::Sample> samples) {
  return Family{std::string(name), MetricType::kCounter, "", std::move(samples)};
}
metrics::Labels rank_labels(const std::string& job, int rank) {
  return {{"job_id", job}, {"rank", std::to_string(rank)}};
}

// A node with 4 CPUs, one GPU, and one rank of `job` that has done `steps` steps, each taking
// 0.1 s of data, 0.2 forward, 0.3 backward, 0.05 communication, `optimizer` s optimizer.
Snapshot node_snapshot(
    double cpu, double steps, double optimizer_total, const std::string& job = "j1", int rank = 0) {
  metrics::Labels who = rank_labels(job, rank);
  auto phase = [&](std::string_view p, double v) {
    metrics::Labels l = who;
    l.emplace_back("phase", std::string(p));
    return metrics::Sample{l, v};
  };
  return {
      gauge(mn::kNodeCpus, {{{}, 4}}),
      gauge(mn::kNodeCpuUtilization, {{{}, cpu}}),
      gauge(mn::kNodeMemoryUsed, {{{}, 2e9}}),
      gauge(mn::kNodeMemoryTotal, {{{}, 8e9}}),
      gauge(mn::kGpuUtilization, {{{{"gpu", "0"}}, 0.9}}),
      gauge(mn::kGpuMemoryUsed, {{{{"gpu", "0"}}, 4e9}}),
      gauge(mn::kGpuMemoryTotal, {{{{"gpu", "0"}}, 8e10}}),
      gauge(mn::kTrainLoss, {{who, 2.5 - steps / 100}}),
      gauge(mn::kTrainSamplesPerSecond, {{who, 64}}),
      counter(mn::kTrainStepsTotal, {{who, steps}}),
      counter(mn::kTrainStepPhaseSeconds,
              {phase("data", 0.1 * steps), phase("forward", 0.2 * steps),
               phase("backward", 0.3 * steps), phase("communication", 0.05 * steps),
               phase("optimizer", optimizer_total), phase("other", 0)}),
      gauge(mn::kRankCpuCores, {{who, 0.75}}),
      gauge(mn::kRankResidentMemory, {{who, 1e9}}),
  };
}

TEST(MetricsHistoryTest, KnownSnapshotsGiveTheDocumentedJson) {
  MetricsHistory h;
  h.record("n1", 100, node_snapshot(0.5, 10, 1.0));
  h.record("n1", 102, node_snapshot(0.25, 20, 3.0));   // optimizer: 2 s over 10 steps
  h.record("n1", 104, node_snapshot(0.125, 20, 3.0));  // no step in between: nulls
  json got = h.json({{"n1", "host-1", "alive", 0.5}}, {{"j1", "RUNNING"}}, std::nullopt, 105, 2);
  json want = json::parse(R"({
    "time": 105.0, "interval_s": 2.0,
    "nodes": [{"node_id": "n1", "hostname": "host-1", "state": "alive", "heartbeat_age_s": 0.5,
               "cpus": 4.0, "memory_total_bytes": 8e9,
               "t": [100.0, 102.0, 104.0], "cpu_ratio": [0.5, 0.25, 0.125],
               "memory_used_bytes": [2e9, 2e9, 2e9],
               "gpus": [{"gpu": "0", "memory_total_bytes": 8e10,
                         "utilization_ratio": [0.9, 0.9, 0.9],
                         "memory_used_bytes": [4e9, 4e9, 4e9]}]}],
    "jobs": [{"job_id": "j1", "status": "RUNNING",
              "ranks": [{"rank": 0, "node_id": "n1", "t": [100.0, 102.0, 104.0],
                         "loss": [2.4, 2.3, 2.3],
                         "samples_per_second": [64.0, 64.0, 64.0],
                         "tokens_per_second": [null, null, null],
                         "step_seconds": {"data": [null, 0.1, null],
                                          "forward": [null, 0.2, null],
                                          "backward": [null, 0.3, null],
                                          "communication": [null, 0.05, null],
                                          "optimizer": [null, 0.2, null],
                                          "other": [null, 0.0, null]},
                         "cpu_cores": [0.75, 0.75, 0.75],
                         "resident_memory_bytes": [1e9, 1e9, 1e9]}]}]
  })");
  // Floating-point differences (0.3 * 20 - 0.3 * 10) / 10 need not be exact: compare within 1e-12.
  auto& got_steps = got["jobs"][0]["ranks"][0]["step_seconds"];
  auto& want_steps = want["jobs"][0]["ranks"][0]["step_seconds"];
  for (auto& [phase, values] : want_steps.items()) {
    ASSERT_EQ(got_steps[phase].size(), 3u) << phase;
    EXPECT_TRUE(got_steps[phase][0].is_null()) << phase;
    EXPECT_NEAR(got_steps[phase][1].get<double>(), values[1].get<double>(), 1e-12) << phase;
    EXPECT_TRUE(got_steps[phase][2].is_null()) << phase;
  }
  got_steps = want_steps;
  auto& loss = got["jobs"][0]["ranks"][0]["loss"];
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(loss[i].get<double>(), want["jobs"][0]["ranks"][0]["loss"][i].get<double>(), 1e-12);
  loss = want["jobs"][0]["ranks"][0]["loss"];
  EXPECT_EQ(got, want) << got.dump(2);
}

TEST(MetricsHistoryTest, RingsWrapAroundKeepingTheNewestPoints) {
  MetricsHistory h(MetricsHistoryOptions{.points = 3});
  for (int i = 0; i < 7; ++i) h.record("n1", 100 + i, node_snapshot(i / 10.0, 10 * i, i));
  json got = h.json({}, {}, std::nullopt, 107, 1);
  ASSERT_EQ(got["nodes"].size(), 1u);
  EXPECT_EQ(got["nodes"][0]["t"], json({104.0, 105.0, 106.0}));
  EXPECT_EQ(got["nodes"][0]["cpu_ratio"], json({0.4, 0.5, 0.6}));
  EXPECT_EQ(got["nodes"][0]["state"], "");  // not given: listed after the known nodes
  const json& rank = got["jobs"][0]["ranks"][0];
  EXPECT_EQ(got["jobs"][0]["status"], "");
  EXPECT_EQ(rank["t"], json({104.0, 105.0, 106.0}));
  // The differences span the overwritten points too: 1 s of optimizer over 10 steps.
  for (const auto& v : rank["step_seconds"]["optimizer"]) EXPECT_NEAR(v.get<double>(), 0.1, 1e-12);
}

TEST(MetricsHistoryTest, MaxPointsThinsEverySeriesEvenlyKeepingTheNewest) {
  MetricsHistory h;
  for (int i = 0; i < 10; ++i) h.record("n1", 100 + i, node_snapshot(i / 10.0, 10 * (i + 1), i));
  // 10 points, at most 4: every 3rd counted back from the newest (t 109, 106, 103, 100).
  json got = h.json({{"n1", "host-1", "alive", 0.5}}, {}, std::nullopt, 110, 1, 4);
  EXPECT_EQ(got["nodes"][0]["t"], json({100.0, 103.0, 106.0, 109.0}));
  EXPECT_EQ(got["nodes"][0]["cpu_ratio"], json({0.0, 0.3, 0.6, 0.9}));
  EXPECT_EQ(got["nodes"][0]["gpus"][0]["utilization_ratio"].size(), 4u);
  const json& rank = got["jobs"][0]["ranks"][0];
  EXPECT_EQ(rank["t"], json({100.0, 103.0, 106.0, 109.0}));
  EXPECT_EQ(rank["step_seconds"]["data"].size(), 4u);
  EXPECT_EQ(rank["cpu_cores"].size(), 4u);
  // Enough room, or 0: every point.
  EXPECT_EQ(h.json({}, {}, std::nullopt, 110, 1, 10)["nodes"][0]["t"].size(), 10u);
  EXPECT_EQ(h.json({}, {}, std::nullopt, 110, 1, 0)["nodes"][0]["t"].size(), 10u);
  // 9 of 10: a stride of 2, 5 points ending at the newest.
  EXPECT_EQ(h.json({}, {}, std::nullopt, 110, 1, 9)["nodes"][0]["t"],
            json({101.0, 103.0, 105.0, 107.0, 109.0}));
}

TEST(MetricsHistoryTest, PhasesAreNullAfterACounterResetAndWhenMissing) {
  MetricsHistory h;
  h.record("n1", 100, node_snapshot(0.5, 30, 3));
  h.record("n1", 101, node_snapshot(0.5, 5, 0.5));  // the rank restarted: counters went back
  h.record("n1", 102, node_snapshot(0.5, 15, 1.5));
  Snapshot bare = {gauge(mn::kNodeCpuUtilization, {{{}, 0.5}}),
                   gauge(mn::kTrainLoss, {{rank_labels("j1", 0), 1.0}})};
  h.record("n1", 103, bare);  // a rank without counters, a node without memory or GPUs
  h.record("n1", 103, node_snapshot(0.9, 99, 9));  // a resent heartbeat: ignored
  json got = h.json({}, {}, std::string("j1"), 104, 1);
  const json& rank = got["jobs"][0]["ranks"][0];
  EXPECT_EQ(rank["t"], json({100.0, 101.0, 102.0, 103.0}));
  const json& opt = rank["step_seconds"]["optimizer"];
  EXPECT_TRUE(opt[0].is_null());
  EXPECT_TRUE(opt[1].is_null()) << "a counter reset must not give a negative time";
  EXPECT_NEAR(opt[2].get<double>(), 0.1, 1e-12);
  EXPECT_TRUE(opt[3].is_null());
  EXPECT_EQ(rank["loss"][3], 1.0);
  EXPECT_TRUE(rank["samples_per_second"][3].is_null());
  const json& node = got["nodes"][0];
  EXPECT_TRUE(node["memory_used_bytes"][3].is_null());
  EXPECT_TRUE(node["gpus"][0]["utilization_ratio"][3].is_null());
  EXPECT_TRUE(node["cpus"].is_null());  // the newest point has none
}

TEST(MetricsHistoryTest, RanksOfTwoNodesJobFilterAndCaps) {
  MetricsHistory h(MetricsHistoryOptions{.points = 10, .max_age_s = 10, .max_jobs = 2});
  h.record("n1", 100, node_snapshot(0.5, 10, 1, "j1", 0));
  h.record("n2", 100.5, node_snapshot(0.5, 10, 1, "j1", 1));
  h.record("n1", 101, node_snapshot(0.5, 10, 1, "j2", 0));
  json all = h.json({{"n2", "h2", "suspect", 3}, {"n1", "h1", "alive", 1}},
                    {{"j1", "RUNNING"}, {"j2", "SUCCEEDED"}}, std::nullopt, 102, 1);
  ASSERT_EQ(all["nodes"].size(), 2u);
  EXPECT_EQ(all["nodes"][0]["node_id"], "n2");  // in the order given
  EXPECT_EQ(all["nodes"][0]["state"], "suspect");
  ASSERT_EQ(all["jobs"].size(), 2u);
  ASSERT_EQ(all["jobs"][0]["ranks"].size(), 2u);
  EXPECT_EQ(all["jobs"][0]["ranks"][1]["rank"], 1);
  EXPECT_EQ(all["jobs"][0]["ranks"][1]["node_id"], "n2");
  json one = h.json({}, {{"j1", "RUNNING"}, {"j2", "SUCCEEDED"}}, std::string("j2"), 102, 1);
  ASSERT_EQ(one["jobs"].size(), 1u);
  EXPECT_EQ(one["jobs"][0]["job_id"], "j2");
  json none = h.json({}, {{"j3", "PENDING"}}, std::string("j3"), 102, 1);
  EXPECT_EQ(none["jobs"], json::parse(R"([{"job_id": "j3", "status": "PENDING", "ranks": []}])"));

  // A third job drops the one whose newest point is oldest (j1: its newest is 100.5).
  h.record("n2", 103, node_snapshot(0.5, 10, 1, "j3", 0));
  EXPECT_FALSE(h.has_job("j1"));
  EXPECT_TRUE(h.has_job("j2"));
  // Points older than max_age_s go, and with them j2's series and n1's.
  h.record("n2", 112, node_snapshot(0.5, 20, 2, "j3", 0));
  EXPECT_FALSE(h.has_job("j2"));
  json aged = h.json({}, {}, std::nullopt, 112, 1);
  ASSERT_EQ(aged["nodes"].size(), 1u);
  EXPECT_EQ(aged["nodes"][0]["t"], json({103.0, 112.0}));
}

TEST(MetricsHistoryTest, OptionsAreValidated) {
  try {
    MetricsHistory h(MetricsHistoryOptions{.points = 1});
    FAIL() << "points = 1 was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("MetricsHistoryOptions.points"), std::string::npos);
  }
  EXPECT_THROW(MetricsHistory(MetricsHistoryOptions{.max_age_s = 0}), InvalidArgumentError);
  EXPECT_THROW(MetricsHistory(MetricsHistoryOptions{.max_jobs = 0}), InvalidArgumentError);
}

// The head records the metrics of every heartbeat and serves them behind the token.
TEST(MetricsHistoryTest, HeadServesTheHistoryOfHeartbeats) {
  test::TempDir dir;
  Head head(HeadOptions{.port = 0,
                        .token = "history-test-token-0123",
                        .state_dir = dir.path() / "state",
                        .heartbeat_interval = std::chrono::milliseconds(100),
                        // Far from the test's length: a loaded machine never makes n1 suspect.
                        .suspect_after = std::chrono::milliseconds(5'000),
                        .dead_after = std::chrono::milliseconds(10'000)});
  head.start();
  const std::map<std::string, std::string> auth = {
      {"Authorization", "Bearer history-test-token-0123"}};
  auto r = test::http("POST", head.url() + std::string(api::kNodesPath),
                      json{{"node_id", "n1"},
                           {"hostname", "h1"},
                           {"resources", {{"cpu", 4}, {"gpu", 0}, {"memory_bytes", 1 << 30}}}}
                          .dump(),
                      auth);
  ASSERT_EQ(r.status, 200) << r.body;
  for (int steps : {10, 20}) {
    json body = {{"jobs", json::array()}, {"metrics", node_snapshot(0.5, steps, steps / 10.0)}};
    r = test::http("POST", head.url() + api::node_heartbeat_path("n1"), body.dump(), auth);
    ASSERT_EQ(r.status, 200) << r.body;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // A malformed snapshot is dropped; the heartbeat still counts.
  r = test::http("POST", head.url() + api::node_heartbeat_path("n1"),
                 json{{"metrics", json::array({json{{"name", "bad name"}}})}}.dump(), auth);
  EXPECT_EQ(r.status, 200) << r.body;

  const std::string path = head.url() + std::string(api::kMetricsHistoryPath);
  EXPECT_EQ(test::http("GET", path).status, 401);
  json h = test::http("GET", path, "", auth).json();
  EXPECT_EQ(h["interval_s"], 0.1);
  ASSERT_EQ(h["nodes"].size(), 1u);
  EXPECT_EQ(h["nodes"][0]["hostname"], "h1");
  EXPECT_EQ(h["nodes"][0]["state"], "alive");
  EXPECT_EQ(h["nodes"][0]["cpu_ratio"], json({0.5, 0.5}));
  ASSERT_EQ(h["jobs"].size(), 1u);  // j1 is no job the head knows, but it has rank series
  EXPECT_EQ(h["jobs"][0]["job_id"], "j1");
  EXPECT_NEAR(h["jobs"][0]["ranks"][0]["step_seconds"]["optimizer"][1].get<double>(), 0.1, 1e-12);
  EXPECT_EQ(test::http("GET", path + "?max_points=2", "", auth).json()["nodes"][0]["t"].size(), 2u);
  for (const char* bad : {"1", "abc", "-3", "99999999"}) {
    auto r400 = test::http("GET", path + "?max_points=" + bad, "", auth);
    EXPECT_EQ(r400.status, 400) << bad;
    EXPECT_NE(r400.json().value("error", "").find("max_points"), std::string::npos) << r400.body;
  }
  auto missing = test::http("GET", path + "?job=nope", "", auth);
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(missing.json().value("error", "").find("'nope'"), std::string::npos) << missing.body;

  // The dashboard's files need no token (they hold no data); nothing else is open.
  auto page = test::http("GET", head.url() + std::string(api::kDashboardPath));
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("<title>trainyard</title>"), std::string::npos);
  auto chart = test::http("GET", head.url() + "/dashboard/chart.min.js");
  EXPECT_EQ(chart.status, 200);
  EXPECT_NE(chart.body.find("Chart.js v"), std::string::npos);
  EXPECT_EQ(test::http("GET", head.url() + "/dashboard/nope.js").status, 404);
  EXPECT_EQ(test::http("GET", head.url() + "/dashboard/x/../../api/jobs/").status, 401);
  EXPECT_EQ(test::http("POST", head.url() + "/dashboard").status, 401);
}

}  // namespace
}  // namespace trainyard::cluster
