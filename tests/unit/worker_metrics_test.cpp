// A real cluster::Worker heartbeating a real Head on 127.0.0.1: its heartbeats carry the node's
// families and each running job's ranks (their processes and their rank files, labelled job and
// rank), which the head's /metrics shows with the node label; a rank file of an earlier round
// does not linger, and a job that ended is no longer reported.
#include <gtest/gtest.h>

#include <chrono>

#include "cluster_test_util.h"
#include "trainyard/cluster/api.h"
#include "trainyard/cluster/head.h"
#include "trainyard/cluster/worker.h"

namespace trainyard::cluster {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using test::eventually;

constexpr const char* kToken = "worker-metrics-token";

// Each rank writes rank_<RANK>.json as the ranks' FilePublisher would (a temporary name, then a
// rename) with a loss of RANK.5, then sleeps until stopped. In the first round (restart count 0)
// rank 0 also writes a file for rank 7 and fails, so a second round starts.
constexpr const char* kEntrypoint = R"(d="$TRAINYARD_METRICS_DIR"; mkdir -p "$d" &&
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ]; then
  printf '[]' > "$d/rank_7.json"; exit 3
fi
printf '[{"name":"trainyard_train_loss","type":"gauge","help":"The loss.","samples":[{"value":%s.5}]}]' "$RANK" > "$d/tmp.$RANK" &&
mv "$d/tmp.$RANK" "$d/rank_$RANK.json" && exec sleep 60)";

class WorkerMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    head_ = std::make_unique<Head>(HeadOptions{.port = 0,
                                               .token = kToken,
                                               .state_dir = dir_.path() / "head",
                                               .heartbeat_interval = milliseconds(200),
                                               .tick_interval = milliseconds(50)});
    head_->start();
    WorkerOptions o;
    o.head = head_->url();
    o.token = kToken;
    o.state_dir = (dir_.path() / "worker").string();
    o.resources.num_cpus = 2;
    o.address = "127.0.0.1";
    o.stop_timeout = milliseconds(2'000);
    worker_ = std::make_unique<Worker>(std::move(o));
    worker_->start();
    ASSERT_TRUE(eventually([&] { return worker_->registered(); }));
  }
  void TearDown() override {
    worker_.reset();
    head_.reset();
  }
  test::HttpResult call(const std::string& method, const std::string& path, const json& body) {
    return test::http(method, head_->url() + path, body.is_null() ? "" : body.dump(),
                      {{"Authorization", std::string("Bearer ") + kToken}});
  }
  std::string scrape() { return call("GET", std::string(api::kMetricsPath), nullptr).body; }

  test::TempDir dir_;
  std::unique_ptr<Head> head_;
  std::unique_ptr<Worker> worker_;
};

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(WorkerMetricsTest, ASecondWorkerOnTheSameStateDirIsRefused) {
  // Two workers sharing a folder would take the same node id and run every job twice.
  WorkerOptions o;
  o.head = head_->url();
  o.token = kToken;
  o.state_dir = (dir_.path() / "worker").string();
  Worker second(std::move(o));
  try {
    second.start();
    FAIL() << "a second worker started on the same state directory";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(has(e.what(), "is in use by trainyard worker (host ")) << e.what();
  }
  EXPECT_EQ(
      std::filesystem::status(dir_.path() / "worker").permissions() & std::filesystem::perms::all,
      std::filesystem::perms::owner_all);
}

TEST_F(WorkerMetricsTest, HeartbeatsCarryTheNodeAndItsRanksUntilTheJobEnds) {
  const std::string node = worker_->node_id();
  auto submitted = call("POST", std::string(api::kJobsPath),
                        {{"entrypoint", kEntrypoint},
                         {"submission_id", "m1"},
                         {"trainyard", {{"nproc_per_node", 2}, {"max_restarts", 1}}}});
  ASSERT_EQ(submitted.status, 200) << submitted.body;
  const std::string rank0 = "{node=\"" + node + "\",job_id=\"m1\",rank=\"0\"}";
  const std::string rank1 = "{node=\"" + node + "\",job_id=\"m1\",rank=\"1\"}";
  std::string text;
  ASSERT_TRUE(eventually(
      [&] {
        text = scrape();
        return has(text, "trainyard_train_loss" + rank0 + " 0.5") &&
               has(text, "trainyard_train_loss" + rank1 + " 1.5") &&
               has(text, "trainyard_rank_resident_memory_bytes" + rank0) &&
               has(text, "trainyard_rank_resident_memory_bytes" + rank1);
      },
      milliseconds(20'000)))
      << text;
  // The node's own families, with the node label the head adds and nothing else.
  EXPECT_TRUE(has(text, "trainyard_node_cpu_utilization_ratio{node=\"" + node + "\"} ")) << text;
  EXPECT_TRUE(has(text, "trainyard_node_memory_total_bytes{node=\"" + node + "\"} ")) << text;
  // The second round cleared the first round's files.
  EXPECT_FALSE(has(text, "rank=\"7\"")) << text;
  EXPECT_EQ(call("GET", api::job_path("m1"), nullptr).json().value("status", ""), "RUNNING");

  ASSERT_EQ(call("POST", api::job_stop_path("m1"), nullptr).status, 200);
  ASSERT_TRUE(eventually(
      [&] {
        text = scrape();
        return !has(text, "job_id=\"m1\"");
      },
      milliseconds(15'000)))
      << text;
  EXPECT_TRUE(has(text, "trainyard_node_cpu_utilization_ratio{node=\"" + node + "\"} ")) << text;
}

}  // namespace
}  // namespace trainyard::cluster
