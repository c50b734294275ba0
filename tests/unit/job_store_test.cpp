// cluster::JobStore: persistence across reopen, idempotent log lines, rendezvous compare-and-set,
// a newer schema and a damaged file refused with the file's name.
#include "trainyard/cluster/job_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <fstream>

#include "cluster_test_util.h"
#include "trainyard/error.h"

namespace trainyard::cluster {
namespace {

JobRecord sample_job(const std::string& id) {
  JobRecord j;
  j.job_id = j.submission_id = id;
  j.status = "PENDING";
  j.entrypoint = "echo hi";
  j.metadata = {{"owner", "me"}};
  j.entrypoint_num_cpus = 2;
  j.launch.nodes = "1:2";
  j.launch.hang_timeout = std::chrono::milliseconds(2500);
  j.min_nodes = 1;
  j.max_nodes = 2;
  j.assigned_nodes = {"n1"};
  j.failed_rank = 3;
  j.last_lines = {"a", "b"};
  return j;
}

TEST(JobStoreTest, JobsNodesAndEventsSurviveReopen) {
  test::TempDir dir;
  {
    JobStore store(dir.path());
    JobRecord a = sample_job("a"), b = sample_job("b");
    EXPECT_TRUE(store.insert_job(a));
    EXPECT_TRUE(store.insert_job(b));
    EXPECT_LT(a.order, b.order);
    JobRecord dup = sample_job("a");
    EXPECT_FALSE(store.insert_job(dup));
    a.status = "RUNNING";
    a.driver_exit_code = 7;
    store.update_job(a);
    store.append_event("a", "status", "RUNNING");
    NodeRecord n;
    n.node_id = "n1";
    n.hostname = "h";
    n.state = "alive";
    n.resources.cpu = 4;
    store.put_node(n);
  }
  JobStore store(dir.path());
  auto jobs = store.list_jobs();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].job_id, "a");
  EXPECT_EQ(jobs[0].status, "RUNNING");
  EXPECT_EQ(jobs[0].driver_exit_code, 7);
  EXPECT_EQ(jobs[0].entrypoint_num_cpus, 2.0);
  EXPECT_FALSE(jobs[0].entrypoint_num_gpus.has_value());
  EXPECT_EQ(jobs[0].metadata["owner"], "me");
  EXPECT_EQ(jobs[0].assigned_nodes, std::vector<std::string>{"n1"});
  EXPECT_EQ(jobs[0].failed_rank, 3);
  EXPECT_EQ(jobs[0].last_lines.size(), 2u);
  EXPECT_EQ(jobs[0].launch.nodes, "1:2");
  EXPECT_EQ(jobs[0].launch.hang_timeout, std::chrono::milliseconds(2500));
  EXPECT_FALSE(jobs[0].launch.restart_backoff.has_value()) << "the agent's default";
  EXPECT_EQ(store.list_events("a").size(), 1u);
  auto node = store.get_node("n1");
  ASSERT_TRUE(node);
  EXPECT_EQ(node->resources.cpu, 4);
  EXPECT_TRUE(store.delete_job("a"));
  EXPECT_FALSE(store.get_job("a"));
  EXPECT_TRUE(store.list_events("a").empty());
}

TEST(JobStoreTest, LogLinesAreStoredOncePerSeq) {
  test::TempDir dir;
  JobStore store(dir.path());
  EXPECT_EQ(store.append_logs("j", "n1", 0, {{0, "l0"}, {1, "l1"}}), 2);
  EXPECT_EQ(store.append_logs("j", "n1", 0, {{0, "l0"}, {1, "l1"}}), 2);  // a resend
  EXPECT_EQ(store.append_logs("j", "n1", 1, {{1, "l1"}, {0, "l2"}}), 3);  // overlapping
  EXPECT_EQ(store.append_logs("j", "n2", 0, {{2, "m0"}}), 1);
  auto lines = store.read_logs("j");
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].text, "l0");
  EXPECT_EQ(lines[2].text, "l2");
  EXPECT_EQ(lines[3].node_id, "n2");
  EXPECT_EQ(lines[3].rank, 2);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i].order, static_cast<int64_t>(i + 1));
  auto rest = store.read_logs("j", 2);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].text, "l2");
}

TEST(JobStoreTest, RendezvousCompareAndSet) {
  test::TempDir dir;
  std::string token;
  {
    JobStore store(dir.path());
    EXPECT_FALSE(store.get_rdzv("r"));
    auto w = store.set_rdzv("r", "s1", std::nullopt);
    EXPECT_TRUE(w.written);
    EXPECT_EQ(w.state, "s1");
    auto again = store.set_rdzv("r", "other", std::nullopt);  // exists: not written
    EXPECT_FALSE(again.written);
    EXPECT_EQ(again.state, "s1");
    EXPECT_EQ(again.token, w.token);
    auto stale = store.set_rdzv("r", "s2", std::string("bogus"));
    EXPECT_FALSE(stale.written);
    auto ok = store.set_rdzv("r", std::string("s2\0bin", 6), w.token);
    EXPECT_TRUE(ok.written);
    EXPECT_NE(ok.token, w.token);
    EXPECT_FALSE(store.set_rdzv("r", "s3", w.token).written);  // the old token is stale now
    EXPECT_FALSE(store.set_rdzv("missing", "x", std::string("1")).written);
    token = ok.token;
  }
  JobStore store(dir.path());
  auto st = store.get_rdzv("r");
  ASSERT_TRUE(st);
  EXPECT_EQ(st->state, std::string("s2\0bin", 6));
  EXPECT_EQ(st->token, token);
}

TEST(JobStoreTest, NewerSchemaIsRefused) {
  test::TempDir dir;
  { JobStore store(dir.path()); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() / "head.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE schema_version SET version = 99", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  try {
    JobStore store(dir.path());
    FAIL() << "a newer schema was opened";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("schema version 99"), std::string::npos) << m;
    EXPECT_NE(m.find((dir.path() / "head.db").string()), std::string::npos) << m;
  }
}

// A head upgraded over a state directory of schema 1 (no launch durations) keeps its jobs: they
// read as the agent's defaults, and take durations from then on.
TEST(JobStoreTest, ASchemaOneDatabaseIsMigrated) {
  test::TempDir dir;
  {
    JobStore store(dir.path());
    JobRecord a = sample_job("a");
    ASSERT_TRUE(store.insert_job(a));
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() / "head.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "ALTER TABLE jobs DROP COLUMN restart_backoff_s; "
                         "ALTER TABLE jobs DROP COLUMN restart_backoff_max_s; "
                         "ALTER TABLE jobs DROP COLUMN hang_timeout_s; "
                         "DELETE FROM schema_version; INSERT INTO schema_version VALUES (1)",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  {
    JobStore store(dir.path());
    auto a = store.get_job("a");
    ASSERT_TRUE(a);
    EXPECT_EQ(a->entrypoint, "echo hi");
    EXPECT_FALSE(a->launch.hang_timeout.has_value());
    a->launch.hang_timeout = std::chrono::milliseconds(4000);
    store.update_job(*a);
  }
  JobStore store(dir.path());
  EXPECT_EQ(store.get_job("a")->launch.hang_timeout, std::chrono::milliseconds(4000));
  ASSERT_EQ(sqlite3_open((dir.path() / "head.db").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT MAX(version) FROM schema_version", -1, &s, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(s, 0), JobStore::kSchemaVersion);
  sqlite3_finalize(s);
  sqlite3_close(db);
}

TEST(JobStoreTest, DamagedFileIsAnErrorNamingIt) {
  test::TempDir dir;
  std::ofstream(dir.path() / "head.db") << std::string(4096, 'x');
  try {
    JobStore store(dir.path());
    FAIL() << "a damaged database was opened";
  } catch (const CorruptDataError& e) {
    EXPECT_NE(std::string(e.what()).find((dir.path() / "head.db").string()), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace trainyard::cluster
