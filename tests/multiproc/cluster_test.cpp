// The standing cluster end to end on loopback: `trainyard head` and `trainyard worker` processes,
// jobs submitted through the CLI and through Ray's client calls, a head killed mid-job, a worker
// killed mid-job, and the security rules of the API.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "../text.h"
#include "cluster_fixture.h"
#include "multiproc_util.h"
#include "trainyard/cluster/auth.h"
#include "trainyard/cluster/wire.h"
#include "trainyard/net/http_client.h"
#include "trainyard/net/http_server.h"

#ifndef TRAINYARD_CLI_PATH
#error "TRAINYARD_CLI_PATH must name the trainyard binary (a compile definition)"
#endif

namespace trainyard::mptest {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

using trainyard::test::contains;
using trainyard::test::count_of;

// A raw request to the head, for status codes the CLI turns into messages.
net::HttpResponse raw(const std::string& method,
                      const std::string& url,
                      std::vector<std::pair<std::string, std::string>> headers = {},
                      std::string body = "") {
  net::HttpClient client;
  net::HttpRequest request{.method = method, .url = url, .body = std::move(body)};
  request.headers = std::move(headers);
  request.timeout = 5s;
  return client.perform(request);
}

class ClusterTest : public ::testing::Test {
 protected:
  TempDir dir;
  ClusterFixture cluster{kCli, dir.path()};

  // A head that runs no ranks itself and two workers of 2 CPUs, all registered.
  void start_head_and_two_workers() {
    cluster.start_head({"--num-cpus", "0"});
    cluster.start_worker("w1", {"--num-cpus", "2"});
    cluster.start_worker("w2", {"--num-cpus", "2"});
    ASSERT_TRUE(ClusterFixture::eventually([&] { return cluster.nodes_in("alive") == 2; }, 20s))
        << cluster.log_of("head") << cluster.log_of("w1") << cluster.log_of("w2");
  }
};

TEST_F(ClusterTest, WorkersStartedBeforeTheHeadJoinWhenItComesUp) {
  cluster.start_worker("w1", {"--num-cpus", "2", "--memory", "1073741824"});
  cluster.start_worker("w2", {"--num-cpus", "1", "--memory", "2147483648"});
  std::this_thread::sleep_for(2s);  // the workers retry against a port nobody serves yet
  ASSERT_TRUE(cluster.worker("w1").running()) << cluster.log_of("w1");
  cluster.start_head({"--num-cpus", "1", "--memory", "1073741824"});
  ASSERT_TRUE(ClusterFixture::eventually([&] { return cluster.nodes_in("alive") == 3; }, 20s))
      << cluster.log_of("head") << cluster.log_of("w1");
  const RunOutput status = cluster.cli({"status"});
  ASSERT_EQ(status.status.exit_code, 0) << status.err;
  EXPECT_TRUE(contains(status.out, "Autoscaler status")) << status.out;
  EXPECT_TRUE(contains(status.out, "Idle:")) << status.out;
  EXPECT_TRUE(contains(status.out, " 0.0/4.0 CPU")) << status.out;
  EXPECT_TRUE(contains(status.out, "/4.00GiB memory")) << status.out;
  EXPECT_TRUE(contains(status.out, "(no failures)")) << status.out;
  EXPECT_TRUE(contains(status.out, cluster.node_id("w1").substr(0, 8))) << status.out;
  const RunOutput verbose = cluster.cli({"status", "-v"});
  EXPECT_TRUE(contains(verbose.out, "127.0.0.1")) << verbose.out;
}

TEST_F(ClusterTest, TwoNodeJobSucceedsWithLogsPrefixedByNodeAndRank) {
  start_head_and_two_workers();
  const RunOutput r =
      cluster.cli({"submit", "--nodes", "2", "--nproc-per-node", "1", "--submission-id",
                   "two-nodes", "--", "sh", "-c", "echo \"hello from rank $RANK of $WORLD_SIZE\""},
                  45s);
  ASSERT_EQ(r.status.exit_code, 0) << r.out << r.err << cluster.log_of("head");
  EXPECT_TRUE(contains(r.out, "Job 'two-nodes' submitted successfully")) << r.out;
  EXPECT_TRUE(contains(r.out, "Job 'two-nodes' succeeded")) << r.out;
  for (const std::string name : {"w1", "w2"}) {
    const std::string id = cluster.node_id(name);
    const bool has_line = contains(r.out, id.substr(0, 8) + ":0] hello from rank 0 of 2") ||
                          contains(r.out, id.substr(0, 8) + ":1] hello from rank 1 of 2");
    EXPECT_TRUE(has_line) << "node " << name << " (" << id << ") ran no rank:\n" << r.out;
  }
  const RunOutput rank1 = cluster.cli({"logs", "two-nodes", "--rank", "1"});
  EXPECT_EQ(count_of(rank1.out, "hello from rank"), 1u) << rank1.out;
  EXPECT_TRUE(contains(rank1.out, "hello from rank 1 of 2")) << rank1.out;
}

TEST_F(ClusterTest, AnEntrypointThatDoesNotExistFailsWithItsError) {
  start_head_and_two_workers();
  const RunOutput r = cluster.cli(
      {"submit", "--submission-id", "missing", "--", "/no/such/program", "--flag"}, 30s);
  EXPECT_EQ(r.status.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "Job 'missing' failed")) << r.out;
  const json job = cluster.job("missing");
  ASSERT_TRUE(job.is_object());
  EXPECT_EQ(job["status"], "FAILED");
  EXPECT_EQ(job["driver_exit_code"], 127) << job.dump(2);
  EXPECT_TRUE(contains(job["trainyard"]["last_lines"].dump(), "/no/such/program")) << job.dump(2);
}

// `submit` takes `trainyard run`'s restart flags, and each node's agent applies them: a rank that
// beats and then hangs is stopped after --hang-timeout (1 s), not the agent's default 30 s.
TEST_F(ClusterTest, SubmitsHangTimeoutReachesEveryNodesWatchdog) {
  start_head_and_two_workers();
  const RunOutput r = cluster.cli(
      {"submit", "--submission-id", "hangs", "--hang-timeout", "1", "--restart-backoff", "45", "--",
       TRAINYARD_HEARTBEAT_HELPER, "beat=300;err=rank 0 about to hang;stop"},
      45s);
  EXPECT_EQ(r.status.exit_code, 1) << r.out << r.err;
  const json job = cluster.job("hangs");
  ASSERT_TRUE(job.is_object());
  EXPECT_EQ(job["status"], "FAILED") << job.dump(2);
  EXPECT_EQ(job["trainyard"]["hang_timeout_s"], 1.0) << job.dump(2);
  // A first back-off above the default longest (30 s) raises the longest, as `run` does: the
  // agents start the job (they refuse a longest back-off shorter than the first). With no
  // restarts it is never waited.
  EXPECT_EQ(job["trainyard"]["restart_backoff_s"], 45.0) << job.dump(2);
  EXPECT_EQ(job["trainyard"]["restart_backoff_max_s"], 45.0) << job.dump(2);
  // The watchdog that stopped the rank was --hang-timeout's (the default would say 30.0 s).
  EXPECT_TRUE(contains(job["message"].get<std::string>(), "hung: no progress for 1.0 s"))
      << job.dump(2) << r.out;
  // A bad value is refused by the CLI as `trainyard run` refuses it.
  const RunOutput bad = cluster.cli({"submit", "--hang-timeout", "-1", "--", "true"});
  EXPECT_NE(bad.status.exit_code, 0) << bad.out << bad.err;
  EXPECT_TRUE(contains(bad.err, "--hang-timeout: must be a number of seconds in [0, 1000000]"))
      << bad.err;
}

TEST_F(ClusterTest, AJobAskingForMoreNodesThanExistWaitsAsADemand) {
  start_head_and_two_workers();
  const RunOutput r = cluster.cli(
      {"submit", "--nodes", "3", "--submission-id", "too-big", "--no-wait", "--", "true"});
  ASSERT_EQ(r.status.exit_code, 0) << r.out << r.err;
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(cluster.job("too-big").value("status", ""), "PENDING");
  const RunOutput status = cluster.cli({"status"});
  EXPECT_FALSE(contains(status.out, "(no resource demands)")) << status.out;
  EXPECT_TRUE(contains(status.out, "too-big")) << status.out;
  // Stopping a pending job ends it at once.
  const RunOutput stop = cluster.cli({"stop", "too-big"});
  EXPECT_EQ(stop.status.exit_code, 0) << stop.err;
  EXPECT_EQ(cluster.wait_for_terminal("too-big", 10s), "STOPPED");
}

TEST_F(ClusterTest, HeadKilledMidJobRestartsAndTheJobFinishesWithEveryLine) {
  start_head_and_two_workers();
  const RunOutput r =
      cluster.cli({"submit", "--nodes", "2", "--submission-id", "survivor", "--no-wait", "--", "sh",
                   "-c", "for i in $(seq 1 40); do echo \"rank $RANK step $i\"; sleep 0.25; done"});
  ASSERT_EQ(r.status.exit_code, 0) << r.err;
  ASSERT_TRUE(ClusterFixture::eventually(
      [&] { return cluster.job("survivor").value("status", "") == "RUNNING"; }, 20s));
  std::this_thread::sleep_for(2s);
  cluster.head().send_signal(SIGKILL);
  cluster.head().wait_for(5s);
  std::this_thread::sleep_for(2s);  // the ranks train on without the head
  cluster.start_head({"--num-cpus", "0"});
  EXPECT_EQ(cluster.wait_for_terminal("survivor", 40s), "SUCCEEDED")
      << cluster.log_of("head") << cluster.log_of("w1");
  const RunOutput logs = cluster.cli({"logs", "survivor"});
  for (int rank = 0; rank < 2; ++rank) {
    for (int i = 1; i <= 40; ++i) {
      const std::string line = "rank " + std::to_string(rank) + " step " + std::to_string(i) + "\n";
      ASSERT_EQ(count_of(logs.out, line), 1u) << "'" << line << "' in\n" << logs.out;
    }
  }
}

// Note [Clients ride out a head restart]: `submit` and `logs -f` started before the head is killed
// wait for it (saying so on stderr), then print every line once and the job's success.
TEST_F(ClusterTest, SubmitAndLogsFollowRideOutAHeadRestart) {
  start_head_and_two_workers();
  // Each client writes into files of its own, so that the test sees when it is following.
  const auto client = [&](const std::string& name, std::vector<std::string> args) {
    args.insert(args.begin(), {"/bin/sh", "-c", "exec \"$0\" \"$@\" >\"$OUT\" 2>\"$ERR\"", kCli});
    return std::make_unique<elastic::Subprocess>(
        elastic::SubprocessOptions{.argv = std::move(args),
                                   .env = {{"TRAINYARD_ADDRESS", cluster.address()},
                                           {"TRAINYARD_TOKEN", cluster.token()},
                                           {"OUT", (dir.path() / (name + ".out")).string()},
                                           {"ERR", (dir.path() / (name + ".err")).string()}}});
  };
  auto submit = client("submit", {"submit", "--submission-id", "rider", "--", "sh", "-c",
                                  "for i in $(seq 1 30); do echo \"step $i\"; sleep 0.25; done"});
  ASSERT_TRUE(ClusterFixture::eventually(
      [&] {
        const auto job = cluster.job("rider");  // null until submit has sent it
        return job.is_object() && job.value("status", "") == "RUNNING";
      },
      20s));
  auto follower = client("follower", {"logs", "-f", "rider"});
  // Both follow the job (they have printed a line of it) when the head goes.
  ASSERT_TRUE(ClusterFixture::eventually(
      [&] {
        return contains(read_file(dir.path() / "submit.out"), "step ") &&
               contains(read_file(dir.path() / "follower.out"), "step ");
      },
      20s));
  cluster.head().send_signal(SIGKILL);
  cluster.head().wait_for(5s);
  std::this_thread::sleep_for(3s);  // ten times what three quick attempts would wait
  cluster.start_head({"--num-cpus", "0"});
  auto outputs = collect_all({submit.get(), follower.get()}, 60s);  // statuses; text in the files
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const std::string name = i == 0 ? "submit" : "follower";
    outputs[i].out = read_file(dir.path() / (name + ".out"));
    outputs[i].err = read_file(dir.path() / (name + ".err"));
  }
  for (const RunOutput& out : outputs) {
    EXPECT_EQ(out.status.exit_code, 0) << out.out << out.err << cluster.log_of("head");
    for (int i = 1; i <= 30; ++i) {
      const std::string line = "step " + std::to_string(i) + "\n";
      EXPECT_EQ(count_of(out.out, line), 1u) << "'" << line << "' in\n" << out.out;
    }
    EXPECT_TRUE(contains(out.err, "does not answer")) << out.err;
    EXPECT_TRUE(contains(out.err, "retrying for up to 60 s")) << out.err;
    EXPECT_TRUE(contains(out.err, "answers again (after ")) << out.err;
  }
  EXPECT_TRUE(contains(outputs[0].out, "Job 'rider' succeeded")) << outputs[0].out;
}

// Note [A job ends before its logs]: many lines, more than one batch holds, all reach `submit`,
// which follows the job until the head holds every one of them.
TEST_F(ClusterTest, EveryLineOfAJobThatPrintsManyReachesTheClient) {
  start_head_and_two_workers();
  const RunOutput r =
      cluster.cli({"submit", "--submission-id", "chatty", "--", "seq", "1", "30000"}, 60s);
  ASSERT_EQ(r.status.exit_code, 0) << r.err << cluster.log_of("w1") << cluster.log_of("w2");
  EXPECT_EQ(count_of(r.out, ":0] "), 30000u);
  EXPECT_TRUE(contains(r.out, ":0] 30000\n")) << r.out.substr(r.out.size() - 500);
  EXPECT_TRUE(contains(r.out, "Job 'chatty' succeeded")) << r.out.substr(r.out.size() - 500);
}

// Note [A submission that landed]: a head that takes a submission and loses its answer (here, a
// 503 after taking it) gets the same submission again; its 409 for the client's own id at that
// later attempt means the job exists, and submit goes on with it. A 409 at the first attempt,
// or for a job of another entrypoint, is a refusal.
TEST(ClusterClient, ASubmissionWhoseAnswerWasLostIsNotSubmittedTwice) {
  // A head of one job: the first submission takes it; lose_next makes the next answer a 503.
  net::HttpServer head(net::HttpServerOptions{});
  std::mutex mu;
  std::optional<cluster::wire::JobSubmission> taken;
  int posts = 0;
  bool lose_next = true;
  head.route("POST", "/api/jobs/", [&](const net::ServerRequest& req) {
    std::lock_guard<std::mutex> lock(mu);
    ++posts;
    const auto submission = json::parse(req.body).get<cluster::wire::JobSubmission>();
    const bool conflict = taken.has_value();
    if (!taken) taken = submission;
    net::ServerResponse res;
    if (std::exchange(lose_next, false)) {
      res.status = 503;
      res.body = json{{"error", "restarting"}}.dump();
    } else if (conflict) {
      res.status = 409;
      res.body = json{{"error", "A job with submission_id '" + *submission.submission_id +
                                    "' already exists."}}
                     .dump();
    } else {
      res.body = json(cluster::wire::SubmitAnswer{.job_id = *submission.submission_id,
                                                  .submission_id = *submission.submission_id})
                     .dump();
    }
    return res;
  });
  head.route("GET", "/api/jobs/{id}", [&](const net::ServerRequest& req) {
    std::lock_guard<std::mutex> lock(mu);
    net::ServerResponse res;
    res.body = json(cluster::wire::JobDetails{.job_id = req.params.at("id"),
                                              .submission_id = req.params.at("id"),
                                              .status = "PENDING",
                                              .entrypoint = taken->entrypoint})
                   .dump();
    return res;
  });
  head.start();
  const std::vector<std::pair<std::string, std::string>> env = {
      {"TRAINYARD_ADDRESS", "http://127.0.0.1:" + std::to_string(head.port())},
      {"TRAINYARD_TOKEN", "a-token-for-the-test-head-0123456789"}};
  auto submit = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), {kCli, "submit", "--no-wait"});
    return run_program(argv, env, 30s);
  };

  // Taken, answer lost, sent again: the client's own job.
  const RunOutput lost = submit({"--", "echo", "once"});
  EXPECT_EQ(lost.status.exit_code, 0) << lost.out << lost.err;
  EXPECT_EQ(posts, 2);
  ASSERT_TRUE(taken.has_value());
  const std::string id = taken->submission_id.value_or("");
  EXPECT_TRUE(id.starts_with("raysubmit_")) << id;
  EXPECT_TRUE(contains(lost.out, "Job '" + id + "' submitted successfully")) << lost.out;

  // A 409 at a later attempt for a job of another command: someone else's id.
  lose_next = true;
  const RunOutput other = submit({"--submission-id", id, "--", "echo", "twice"});
  EXPECT_NE(other.status.exit_code, 0) << other.out;
  EXPECT_TRUE(contains(other.err, "'" + id + "' already exists")) << other.err;

  // A 409 at the first attempt: a refusal even for the same command.
  const RunOutput again = submit({"--submission-id", id, "--", "echo", "once"});
  EXPECT_NE(again.status.exit_code, 0) << again.out;
  EXPECT_TRUE(contains(again.err, "'" + id + "' already exists")) << again.err;
  EXPECT_EQ(posts, 5);
}

TEST_F(ClusterTest, AKilledWorkerIsNamedInTheFailedJobAndTheStatus) {
  start_head_and_two_workers();
  const std::string lost = cluster.node_id("w2");
  const RunOutput r = cluster.cli({"submit", "--nodes", "2", "--submission-id", "loses-a-node",
                                   "--no-wait", "--", "sleep", "60"});
  ASSERT_EQ(r.status.exit_code, 0) << r.err;
  ASSERT_TRUE(ClusterFixture::eventually(
      [&] { return cluster.job("loses-a-node").value("status", "") == "RUNNING"; }, 20s));
  cluster.worker("w2").send_signal(SIGKILL);
  EXPECT_EQ(cluster.wait_for_terminal("loses-a-node", 30s), "FAILED") << cluster.log_of("head");
  const json job = cluster.job("loses-a-node");
  EXPECT_TRUE(contains(job.value("message", ""), lost)) << job.dump(2);
  EXPECT_TRUE(contains(job.value("message", ""), "heartbeat")) << job.dump(2);
  const RunOutput status = cluster.cli({"status"});
  EXPECT_TRUE(contains(status.out, lost.substr(0, 8))) << status.out;
  EXPECT_TRUE(contains(status.out, "heartbeat timeout")) << status.out;
  EXPECT_EQ(cluster.nodes_in("dead"), 1u);
}

TEST_F(ClusterTest, AnElasticJobGoesOnWithoutAKilledWorkerAndGrowsBackWhenANodeJoins) {
  start_head_and_two_workers();
  const RunOutput r = cluster.cli({"submit", "--nodes", "1:2", "--max-restarts", "3",
                                   "--submission-id", "elastic", "--no-wait", "--", "sh", "-c",
                                   "echo \"rank $RANK of world $WORLD_SIZE\"; sleep 12"});
  ASSERT_EQ(r.status.exit_code, 0) << r.err;
  const auto logs = [&] { return cluster.cli({"logs", "elastic"}).out; };
  ASSERT_TRUE(ClusterFixture::eventually([&] { return count_of(logs(), "of world 2") == 2; }, 30s))
      << logs() << cluster.log_of("head");
  cluster.worker("w2").send_signal(SIGKILL);
  // The survivor's agent sees the lost node's rendezvous heartbeat expire and goes on alone.
  ASSERT_TRUE(ClusterFixture::eventually([&] { return contains(logs(), "of world 1"); }, 40s))
      << logs() << cluster.log_of("w1");
  // A new node joins: the head places the job on it too, and the ranks restart at world size 2.
  cluster.start_worker("w3", {"--num-cpus", "2"});
  ASSERT_TRUE(ClusterFixture::eventually([&] { return count_of(logs(), "of world 2") == 4; }, 40s))
      << logs() << cluster.log_of("w3") << cluster.log_of("head");
  EXPECT_EQ(cluster.wait_for_terminal("elastic", 40s), "SUCCEEDED") << cluster.log_of("head");
}

TEST_F(ClusterTest, AHeadThatWasStoppedDoesNotDeclareItsNodesDead) {
  // The head is stopped for longer than --dead-after (3 s) while a job runs: the heartbeats it
  // could not read in that time count against nobody (Note [A head that did not run]).
  start_head_and_two_workers();
  const RunOutput r = cluster.cli(
      {"submit", "--nodes", "2", "--submission-id", "paused", "--no-wait", "--", "sleep", "12"});
  ASSERT_EQ(r.status.exit_code, 0) << r.err;
  ASSERT_TRUE(ClusterFixture::eventually(
      [&] { return cluster.job("paused").value("status", "") == "RUNNING"; }, 20s));
  cluster.head().send_signal(SIGSTOP);
  std::this_thread::sleep_for(5s);
  cluster.head().send_signal(SIGCONT);
  std::this_thread::sleep_for(1500ms);  // several ticks of the woken head
  EXPECT_EQ(cluster.nodes_in("dead"), 0u) << cluster.log_of("head");
  EXPECT_EQ(cluster.job("paused").value("status", ""), "RUNNING") << cluster.log_of("head");
  EXPECT_EQ(cluster.wait_for_terminal("paused", 40s), "SUCCEEDED") << cluster.log_of("head");
  EXPECT_TRUE(contains(cluster.log_of("head"), "The head did not run for "))
      << cluster.log_of("head");
}

TEST_F(ClusterTest, AWorkerStoppedWithSigtermLeavesWithoutAFailure) {
  start_head_and_two_workers();
  cluster.worker("w2").send_signal(SIGTERM);
  ASSERT_TRUE(cluster.worker("w2").wait_for(15s).has_value());
  ASSERT_TRUE(ClusterFixture::eventually([&] { return cluster.nodes_in("exited") == 1; }, 10s));
  const RunOutput status = cluster.cli({"status"});
  EXPECT_TRUE(contains(status.out, "(no failures)")) << status.out;
}

// Ray 2.60's own JobSubmissionClient and `ray job submit/status/logs/list/stop/delete` against
// the head, the token sent as Ray sends it (RAY_AUTH_MODE=token with RAY_AUTH_TOKEN or
// RAY_AUTH_TOKEN_PATH, or --headers). The script gives up by itself after 45 s.
TEST_F(ClusterTest, RayJobSubmissionClientCallsWork) {
  cluster.start_head({"--num-cpus", "2"});
  ASSERT_TRUE(ClusterFixture::eventually([&] { return cluster.nodes_in("alive") == 1; }, 20s))
      << cluster.log_of("head");
  const RunOutput r =
      run_program({TRAINYARD_PYTHON,
                   std::string(TRAINYARD_SOURCE_DIR) + "/tests/multiproc/python/ray_jobs_client.py",
                   cluster.address()},
                  {{"TRAINYARD_TOKEN", cluster.token()}}, 50s);
  EXPECT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.status.exit_code, 0) << r.out << r.err << cluster.log_of("head");
  EXPECT_TRUE(contains(r.out, "all Ray client calls answered")) << r.out;
}

TEST_F(ClusterTest, OutputThatIsNotUtf8ReachesTheLogsWithReplacementCharacters) {
  cluster.start_head({"--num-cpus", "1"});
  ASSERT_TRUE(ClusterFixture::eventually([&] { return cluster.nodes_in("alive") == 1; }, 20s));
  const RunOutput r = cluster.cli({"submit", "--submission-id", "latin1", "--", "sh", "-c",
                                   "printf 'caf\\351 au lait\\n'; printf '\\377\\376\\n' >&2"},
                                  30s);
  ASSERT_EQ(r.status.exit_code, 0) << r.out << r.err << cluster.log_of("head");
  EXPECT_TRUE(contains(r.out, "caf\xEF\xBF\xBD au lait")) << r.out;
}

TEST_F(ClusterTest, TheTokenIsCheckedOnEveryCall) {
  cluster.start_head({"--num-cpus", "0"});
  const std::string jobs = cluster.address() + "/api/jobs/";
  ASSERT_TRUE(ClusterFixture::eventually(
      [&] {
        try {
          return raw("GET", cluster.address() + "/api/version").status != 0;
        } catch (const std::exception&) {
          return false;
        }
      },
      10s));
  EXPECT_EQ(raw("GET", jobs).status, 401);
  EXPECT_EQ(raw("GET", jobs, {{"Authorization", "Bearer wrong"}}).status, 403);
  EXPECT_EQ(raw("GET", jobs, {{"Authorization", "Bearer " + cluster.token()}}).status, 200);
  EXPECT_EQ(raw("GET", jobs, {{"X-Ray-Authorization", "Bearer " + cluster.token()}}).status, 200);
  EXPECT_EQ(raw("POST", jobs, {{"Origin", "http://evil.example"}},
                R"({"entrypoint": "touch /tmp/pwned"})")
                .status,
            401);
  EXPECT_EQ(raw("POST", cluster.address() + "/api/cluster/nodes", {}, "{}").status, 401);
  // The token never shows up in what the head prints.
  EXPECT_FALSE(contains(cluster.log_of("head"), cluster.token()));
}

TEST_F(ClusterTest, AHeadWithoutATokenMakesOneThatLocalClientsFind) {
  // `trainyard head` with no token and no --state-dir: the token is made in ~/.trainyard/head,
  // a client of the same user finds it there, and a request without it is refused.
  const auto home = dir.path() / "home";
  std::filesystem::create_directories(home);
  const std::string address = cluster.address();
  const std::vector<std::pair<std::string, std::string>> env = {{"HOME", home.string()},
                                                                {"TRAINYARD_TOKEN", ""}};
  elastic::Subprocess head(elastic::SubprocessOptions{
      .argv = {kCli, "head", "--port", std::to_string(cluster.port()), "--num-cpus", "0"},
      .env = env});
  const auto token_file = home / ".trainyard" / "head" / "token";
  RunOutput status;
  ASSERT_TRUE(ClusterFixture::eventually(
      [&] {
        status = run_program({kCli, "status", "--address", address}, env, 10s);
        return status.status.exit_code == 0;
      },
      20s))
      << status.out << status.err;
  EXPECT_TRUE(contains(status.out, "Node status")) << status.out;
  EXPECT_EQ(std::filesystem::status(home / ".trainyard" / "head").permissions() &
                std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  EXPECT_EQ(raw("GET", address + "/api/jobs/").status, 401);
  EXPECT_EQ(raw("POST", address + "/api/jobs/", {}, R"({"entrypoint": "id"})").status, 401);
  // Another user's client (another home) has no token.
  const RunOutput stranger =
      run_program({kCli, "status", "--address", address},
                  {{"HOME", (dir.path() / "stranger").string()}, {"TRAINYARD_TOKEN", ""}}, 10s);
  EXPECT_NE(stranger.status.exit_code, 0);
  EXPECT_TRUE(contains(stranger.err, "401")) << stranger.err;
  head.send_signal(SIGTERM);
  const RunOutput out = collect(head, 15s);
  EXPECT_TRUE(contains(out.out, "The cluster token is in " + token_file.string())) << out.out;
  EXPECT_FALSE(contains(out.out + out.err, cluster::load_token(token_file)));
}

TEST_F(ClusterTest, SubmitPassesTheCommandsOwnFlagsAfterEnvAndMetadata) {
  // `--env A=B -- sh -c ...` was refused: "The following argument was not expected: -c".
  cluster.start_head();
  ASSERT_TRUE(ClusterFixture::eventually([&] { return cluster.nodes_in("alive") == 1; }, 20s));
  const RunOutput env = cluster.cli(
      {"submit", "--env", "A=B", "--env", "C=D", "--", "sh", "-c", "echo \"A is $A, C is $C\""});
  EXPECT_EQ(env.status.exit_code, 0) << env.out << env.err;
  EXPECT_TRUE(contains(env.out, "A is B, C is D")) << env.out;
  const RunOutput meta =
      cluster.cli({"submit", "--metadata", "k=v", "--submission-id", "listing", "--", "ls", "-la"});
  EXPECT_EQ(meta.status.exit_code, 0) << meta.out << meta.err;
  EXPECT_EQ(cluster.job("listing")["metadata"]["k"], "v");
}

TEST_F(ClusterTest, UnsafeHeadSettingsAreRefused) {
  // A bind beyond loopback without a token.
  const RunOutput open =
      run_program({kCli, "head", "--bind", "0.0.0.0", "--port", "0", "--insecure-no-token",
                   "--state-dir", (dir.path() / "open").string()},
                  {{"TRAINYARD_TOKEN", ""}}, 10s);
  EXPECT_NE(open.status.exit_code, 0);
  EXPECT_TRUE(contains(open.err, "--bind")) << open.err;
  EXPECT_TRUE(contains(open.err, "--insecure-no-token")) << open.err;
  // A directory given as the token file.
  const RunOutput folder =
      run_program({kCli, "head", "--port", "0", "--token-file", dir.path().string(), "--state-dir",
                   (dir.path() / "folder").string()},
                  {}, 10s);
  EXPECT_NE(folder.status.exit_code, 0);
  EXPECT_TRUE(contains(folder.err, dir.path().string() + " is a directory")) << folder.err;
  // A token file others can read.
  ::chmod(cluster.token_file().c_str(), 0644);
  const RunOutput readable =
      run_program({kCli, "head", "--port", "0", "--token-file", cluster.token_file().string(),
                   "--state-dir", (dir.path() / "readable").string()},
                  {}, 10s);
  EXPECT_NE(readable.status.exit_code, 0);
  EXPECT_TRUE(contains(readable.err, cluster.token_file().string())) << readable.err;
  EXPECT_TRUE(contains(readable.err, "chmod 600")) << readable.err;
  ::chmod(cluster.token_file().c_str(), 0600);

  // Note [A token file only its user controls]: a guessable token, from a file or the variable.
  auto head = [&](const std::string& token_file, const std::string& state, const char* token) {
    std::vector<std::string> argv = {kCli, "head",        "--port",
                                     "0",  "--state-dir", (dir.path() / state).string()};
    if (!token_file.empty()) argv.insert(argv.end(), {"--token-file", token_file});
    return run_program(argv, {{"TRAINYARD_TOKEN", token}}, 10s);
  };
  const auto short_file = dir.path() / "short-token";
  std::ofstream(short_file) << "x\n";
  ::chmod(short_file.c_str(), 0600);
  for (const auto& r : {head(short_file.string(), "short", ""), head("", "short-env", "abc")}) {
    EXPECT_NE(r.status.exit_code, 0);
    EXPECT_TRUE(contains(r.err, "the head takes one of at least 16")) << r.err;
  }
  // A token file in a folder others may write (not sticky): someone else may replace it.
  const auto shared = dir.path() / "shared";
  std::filesystem::create_directories(shared);
  std::filesystem::copy_file(cluster.token_file(), shared / "token");
  ::chmod(shared.c_str(), 0777);
  const RunOutput writable = head((shared / "token").string(), "writable", "");
  EXPECT_NE(writable.status.exit_code, 0);
  EXPECT_TRUE(contains(writable.err, "someone other than this user or root may replace"))
      << writable.err;
  ::chmod(shared.c_str(), 0700);
  if (::geteuid() != 0) return;  // what follows gives files away, which only root may
  // As root: a token file, or a state directory, that another user owns.
  const uid_t nobody = 65534;
  ASSERT_EQ(::chown((shared / "token").c_str(), nobody, nobody), 0);
  const RunOutput foreign = head((shared / "token").string(), "foreign", "");
  EXPECT_NE(foreign.status.exit_code, 0);
  EXPECT_TRUE(contains(foreign.err, "belongs to uid 65534")) << foreign.err;
  std::filesystem::create_directories(dir.path() / "their-state");
  ASSERT_EQ(::chown((dir.path() / "their-state").c_str(), nobody, nobody), 0);
  const RunOutput their_state = head(cluster.token_file().string(), "their-state", "");
  EXPECT_NE(their_state.status.exit_code, 0);
  EXPECT_TRUE(contains(their_state.err, "belongs to uid 65534, not to this user"))
      << their_state.err;
}

TEST_F(ClusterTest, BadRequestsGetClearAnswers) {
  cluster.start_head({"--num-cpus", "0"});
  ASSERT_TRUE(ClusterFixture::eventually([&] { return cluster.status().is_object(); }, 10s));
  const RunOutput unknown = cluster.cli({"logs", "no-such-job"});
  EXPECT_NE(unknown.status.exit_code, 0);
  EXPECT_TRUE(contains(unknown.err, "no-such-job")) << unknown.err;
  const auto auth = std::vector<std::pair<std::string, std::string>>{
      {"Authorization", "Bearer " + cluster.token()}};
  const auto malformed = raw("POST", cluster.address() + "/api/jobs/", auth, "{not json");
  EXPECT_EQ(malformed.status, 400);
  const auto no_entrypoint = raw("POST", cluster.address() + "/api/jobs/", auth, "{}");
  EXPECT_EQ(no_entrypoint.status, 400);
  EXPECT_TRUE(contains(no_entrypoint.body, "entrypoint")) << no_entrypoint.body;
  const auto conda =
      raw("POST", cluster.address() + "/api/jobs/", auth,
          R"({"entrypoint": "true", "runtime_env": {"conda": "env", "working_dir": "."}})");
  EXPECT_EQ(conda.status, 400);
  EXPECT_TRUE(contains(conda.body, "conda") && contains(conda.body, "working_dir")) << conda.body;
}

}  // namespace
}  // namespace trainyard::mptest
