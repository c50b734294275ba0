// cluster::Head over real HTTP on 127.0.0.1: auth, Ray Jobs API validation, a simulated worker
// (plain HTTP calls) through a job's life, gang scheduling with demands, node lifecycle, a head
// restart on the same state_dir, rendezvous compare-and-set and the WebSocket log tail.
#include "trainyard/cluster/head.h"

#include <gtest/gtest.h>

#include <functional>

#include <cstdlib>
#include <fstream>
#include <future>

#include "../log_capture.h"
#include "cluster_test_util.h"
#include "trainyard/cluster/api.h"
#include "trainyard/error.h"

namespace trainyard::cluster {
namespace {

using nlohmann::json;
using test::eventually;
using test::HttpResult;

HeadOptions short_lived(HeadOptions o);

class HeadTest : public ::testing::Test {
 protected:
  HeadOptions options(std::optional<std::string> token = std::nullopt) {
    return HeadOptions{.port = 0,
                       .token = std::move(token),
                       .state_dir = dir_.path() / "state",
                       .heartbeat_interval = std::chrono::milliseconds(100),
                       .suspect_after = std::chrono::milliseconds(5000),
                       .dead_after = std::chrono::milliseconds(10000),
                       .tick_interval = std::chrono::milliseconds(50)};
  }
  void start(HeadOptions o) {
    head_ = std::make_unique<Head>(std::move(o));
    head_->start();
    token_ = head_->token();  // given, or made in the state directory
  }
  void restart() {
    HeadOptions o = short_lived(options(token_));
    head_.reset();
    start(o);
  }
  HttpResult call(const std::string& method,
                  const std::string& path,
                  const json& body = nullptr,
                  std::map<std::string, std::string> headers = {}) {
    if (token_ && !headers.count("Authorization") && !headers.count("X-Ray-Authorization"))
      headers["Authorization"] = "Bearer " + *token_;
    return test::http(method, head_->url() + path, body.is_null() ? "" : body.dump(), headers);
  }
  // A request with a body that is not JSON (or too large to build as JSON), with the token.
  HttpResult call_text(const std::string& method,
                       const std::string& path,
                       const std::string& text) {
    return test::http(method, head_->url() + path, text, {{"Authorization", "Bearer " + *token_}});
  }
  json get(const std::string& path) { return call("GET", path).json(); }
  std::string submit(json body) {
    auto r = call("POST", "/api/jobs/", body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.json().value("job_id", "");
  }
  void register_node(const std::string& id, double cpu, json reports = json::array()) {
    auto r = call("POST", "/api/cluster/nodes",
                  {{"node_id", id},
                   {"hostname", "host-" + id},
                   {"address", "10.0.0." + id.substr(1)},
                   {"resources", {{"cpu", cpu}, {"gpu", 0}, {"memory_bytes", 1 << 30}}},
                   {"jobs", reports}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json()["heartbeat_interval_ms"], 100);
  }
  json heartbeat(const std::string& id, json reports = json::array()) {
    auto r = call("POST", api::node_heartbeat_path(id),
                  {{"usage", {{"cpu_used", 0.5}, {"memory_used_bytes", 1000}}}, {"jobs", reports}});
    EXPECT_EQ(r.status, 200) << r.body;
    return r.json();
  }
  static json report(const std::string& job, const std::string& state) {
    return {{"job_id", job},          {"state", state},
            {"restart_count", 0},     {"exit_code", nullptr},
            {"failed_rank", nullptr}, {"message", ""},
            {"error_type", ""},       {"last_lines", json::array()}};
  }
  std::string status_of(const std::string& job) {
    return get("/api/jobs/" + job).value("status", "?");
  }
  // Heartbeats `node` 30 times 100 ms apart (3 s: twice short_lived's dead_after), calling
  // `before(step)` ahead of each; the slowest heartbeat's milliseconds.
  double heartbeats_for_3s(const std::string& node, const std::function<void(int)>& before = {}) {
    double worst_ms = 0;
    for (int step = 0; step < 30; ++step) {
      if (before) before(step);
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_EQ(heartbeat(node)["registered"], true);
      worst_ms = std::max(worst_ms, std::chrono::duration<double, std::milli>(
                                        std::chrono::steady_clock::now() - t0)
                                        .count());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return worst_ms;
  }
  json node_in_status(const std::string& id) {
    json st = get("/api/cluster/status");
    for (const auto& n : st["nodes"])
      if (n["node_id"] == id) return n;
    return nullptr;
  }

  test::TempDir dir_;
  std::optional<std::string> token_;
  std::unique_ptr<Head> head_;
};

TEST_F(HeadTest, TokenIsRequiredAndAcceptedInEitherHeader) {
  start(options("s3cret-token-0123456789"));
  auto r = test::http("GET", head_->url() + "/api/jobs/");
  EXPECT_EQ(r.status, 401);
  EXPECT_TRUE(r.json().contains("error"));
  EXPECT_EQ(call("GET", "/api/jobs/", nullptr, {{"Authorization", "Bearer nope"}}).status, 403);
  EXPECT_EQ(call("GET", "/api/jobs/", nullptr,
                 {{"X-Ray-Authorization", "Bearer s3cret-token-0123456789"}})
                .status,
            200);
  // The token never shows in a listing.
  std::string id =
      submit({{"entrypoint", "echo s3cret-token-0123456789"},
              {"runtime_env", {{"env_vars", {{"T", "s3cret-token-0123456789"}, {"U", "u"}}}}}});
  auto listing = call("GET", "/api/jobs/");
  EXPECT_EQ(listing.body.find("s3cret-token-0123456789"), std::string::npos) << listing.body;
  EXPECT_EQ(listing.json()[0]["runtime_env"]["env_vars"]["T"], "<redacted>");
  EXPECT_EQ(listing.json()[0]["runtime_env"]["env_vars"]["U"], "u");
  // The WebSocket tail is behind the token too.
  EXPECT_EQ(test::websocket_read_all("ws://127.0.0.1:" + std::to_string(head_->port()) +
                                     api::job_logs_tail_path(id)),
            "<refused 401>\n");
}

TEST_F(HeadTest, WithoutATokenTheHeadMakesOneAndRequiresIt) {
  test::LogCapture log("head");
  start(options());
  EXPECT_NE(log.text().find(": made in "), std::string::npos) << log.text();
  const auto file = dir_.path() / "state" / "token";
  EXPECT_EQ(head_->generated_token_file(), file);
  ASSERT_TRUE(token_.has_value());
  EXPECT_EQ(token_->size(), 64u);  // 32 random bytes as hex
  EXPECT_EQ(load_token(file), *token_);
  EXPECT_EQ(std::filesystem::status(file).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  // Loopback is no excuse: a local client without the token is refused.
  EXPECT_EQ(test::http("GET", head_->url() + "/api/jobs/").status, 401);
  EXPECT_EQ(test::http("POST", head_->url() + "/api/jobs/", R"({"entrypoint": "id"})").status, 401);
  EXPECT_EQ(call("GET", "/api/jobs/").status, 200);
  // A restarted head keeps its token, so its workers and clients keep working.
  const std::string before = *token_;
  head_.reset();
  start(options());
  EXPECT_EQ(token_, before);
  EXPECT_NE(log.text().find(": kept in " + file.string()), std::string::npos) << log.text();
  // A given token is used instead, and nothing is made.
  head_.reset();
  std::filesystem::remove(file);
  start(options("given-token-0123456789"));
  EXPECT_EQ(token_, "given-token-0123456789");
  EXPECT_TRUE(head_->generated_token_file().empty());
  EXPECT_FALSE(std::filesystem::exists(file));
  // Note [A token file only its user controls]: a guessable token is refused, never shown.
  head_.reset();
  try {
    start(options("x"));
    ADD_FAILURE() << "a 1-character token was taken";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("holds a token of 1 character; the head takes one of at "
                                         "least 16"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(HeadTest, TokenlessHeadRefusesBrowsersAndForeignHosts) {
  HeadOptions o = options();
  o.unauthenticated = true;
  start(o);
  EXPECT_FALSE(token_.has_value());
  EXPECT_EQ(call("GET", "/api/version").json()["version"], "2");
  auto r =
      call("POST", "/api/jobs/", {{"entrypoint", "true"}}, {{"Origin", "http://evil.example"}});
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_EQ(call("GET", "/api/jobs/", nullptr, {{"Host", "evil.example"}}).status, 403);
  EXPECT_EQ(call("GET", "/api/jobs/").status, 200);
}

TEST_F(HeadTest, NonLoopbackBindWithoutTokenIsRefused) {
  HeadOptions o = options();
  o.bind_address = "0.0.0.0";
  o.unauthenticated = true;
  try {
    Head head(o);
    FAIL() << "a public head without a token was created";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("--bind"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--insecure-no-token"), std::string::npos) << e.what();
  }
  // Without --insecure-no-token the head makes a token and may listen beyond loopback.
  o.unauthenticated = false;
  EXPECT_NO_THROW(Head{o});
}

TEST_F(HeadTest, RayJobsApiValidatesAndAnswersLikeRay) {
  start(options());
  auto expect_400 = [&](const json& body, const std::vector<std::string>& words) {
    auto r = call("POST", "/api/jobs/", body);
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.body;
    std::string err = r.json().value("error", "");
    for (const auto& w : words) EXPECT_NE(err.find(w), std::string::npos) << w << " in " << err;
  };
  expect_400(json::object(), {"entrypoint"});
  expect_400({{"entrypoint", 5}}, {"entrypoint", "string"});
  expect_400({{"entrypoint", "x"}, {"bogus", 1}}, {"bogus"});
  expect_400({{"entrypoint", "x"}, {"runtime_env", {{"pip", json::array()}, {"working_dir", "."}}}},
             {"pip", "working_dir"});
  expect_400({{"entrypoint", "x"}, {"metadata", {{"a", 1}}}}, {"metadata.a"});
  expect_400({{"entrypoint", "x"}, {"entrypoint_num_cpus", "2"}}, {"entrypoint_num_cpus"});
  expect_400({{"entrypoint", "x"}, {"trainyard", {{"nodes", "3:1"}}}}, {"trainyard.nodes"});
  expect_400({{"entrypoint", "x"}, {"trainyard", {{"gpus", 1}}}}, {"trainyard.gpus"});
  // A NUL byte would cut the command or the variable where C ends the string (issue 36, defect
  // 7): "echo a\0b; echo c" ran `echo a` and succeeded.
  const auto env = [](json vars) { return json{{"env_vars", std::move(vars)}}; };
  expect_400({{"entrypoint", std::string("echo a\0b; echo c", 16)}},
             {"'entrypoint' holds a NUL byte at offset 6"});
  expect_400({{"entrypoint", "x"},
              {"runtime_env", env({{"A", std::string("1\0"
                                                     "2",
                                                     3)}})}},
             {"'runtime_env.env_vars.A' holds a NUL byte"});
  expect_400({{"entrypoint", "x"}, {"runtime_env", env({{std::string("A\0B", 3), "1"}})}},
             {"'runtime_env.env_vars key' holds a NUL byte"});
  expect_400({{"entrypoint", "x"}, {"metadata", {{"a", std::string("\0", 1)}}}}, {"metadata.a"});
  expect_400({{"entrypoint", "x"}, {"runtime_env", env({{"", "1"}})}}, {"not an environment"});
  expect_400({{"entrypoint", "x"}, {"runtime_env", env({{"A=B", "1"}})}}, {"'A=B'"});
  for (const char* contract :
       {"RANK", "WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RUN_ID", "TRAINYARD_JOB_ID"})
    expect_400({{"entrypoint", "x"}, {"runtime_env", env({{contract, "1"}})}},
               {std::string("sets ") + contract, "torchrun's contract"});
  auto bad = call_text("POST", "/api/jobs/", "{not json");
  EXPECT_EQ(bad.status, 400);

  std::string generated = submit({{"entrypoint", "true"}});
  EXPECT_EQ(generated.rfind("raysubmit_", 0), 0u);
  EXPECT_EQ(generated.size(), 26u);
  EXPECT_EQ(submit({{"entrypoint", "sleep 100"}, {"submission_id", "s1"}}), "s1");
  auto dup = call("POST", "/api/jobs/", {{"entrypoint", "true"}, {"submission_id", "s1"}});
  EXPECT_EQ(dup.status, 409);
  // `?after=N` pages a log from line N: the whole value, not a prefix of it ("1e3" is not 1).
  EXPECT_EQ(call("GET", "/api/jobs/s1/logs?after=0").status, 200);
  for (const char* bad : {"1e3", "5x", "-1", ""}) {
    auto page = call("GET", std::string("/api/jobs/s1/logs?after=") + bad);
    EXPECT_EQ(page.status, 400) << bad;
    EXPECT_NE(page.body.find("'after' must be a line number"), std::string::npos) << page.body;
  }
  auto missing = call("GET", "/api/jobs/nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(missing.json().value("error", "").find("nope"), std::string::npos);
  json details = get("/api/jobs/s1");
  EXPECT_EQ(details["type"], "SUBMISSION");
  EXPECT_EQ(details["status"], "PENDING");
  EXPECT_EQ(details["entrypoint"], "sleep 100");
  EXPECT_TRUE(details["end_time"].is_null());
  EXPECT_EQ(details["trainyard"]["nodes"], "1");
  EXPECT_EQ(get("/api/jobs/").size(), 2u);
  auto del = call("DELETE", "/api/jobs/s1");
  EXPECT_EQ(del.status, 400);
  EXPECT_NE(del.json().value("error", "").find("PENDING"), std::string::npos);
  EXPECT_EQ(call("POST", "/api/jobs/s1/stop").json()["stopped"], true);
  EXPECT_EQ(status_of("s1"), "STOPPED");
  EXPECT_EQ(call("POST", "/api/jobs/s1/stop").json()["stopped"], false);
  EXPECT_EQ(call("DELETE", "/api/jobs/s1").json()["deleted"], true);
  EXPECT_EQ(call("GET", "/api/jobs/s1").status, 404);
  EXPECT_EQ(call("GET", "/api/nothing").status, 404);
}

// What Ray 2.60's JobSubmissionClient sends for runtime_envs the head does not take: pip comes
// with the client's _ray_commit beside it, and a working_dir is first looked for and uploaded
// under /api/packages/. Each answer names what the user asked for.
TEST_F(HeadTest, RayClientsRuntimeEnvRequestsAreRefusedByName) {
  start(options());
  auto pip = call("POST", "/api/jobs/",
                  {{"entrypoint", "true"},
                   {"runtime_env",
                    {{"pip", {{"packages", {"requests"}}, {"pip_check", false}}},
                     {"_ray_commit", "b7f4259e944bf6959f721b106adc366ddfa0c356"}}},
                   {"metadata", json::object()}});
  EXPECT_EQ(pip.status, 400) << pip.body;
  const std::string pip_error = pip.json().value("error", "");
  EXPECT_NE(pip_error.find("key 'pip' is not supported"), std::string::npos) << pip_error;
  EXPECT_EQ(pip_error.find("_ray_commit"), std::string::npos) << pip_error;
  // _ray_commit alone asks for nothing.
  EXPECT_EQ(call("POST", "/api/jobs/",
                 {{"entrypoint", "true"},
                  {"runtime_env", {{"env_vars", {{"A", "1"}}}, {"_ray_commit", "abc"}}}})
                .status,
            200);
  const std::string package = "/api/packages/gcs/_ray_pkg_d153ea9f1b5b2d56.zip";
  for (const auto& r : {call("GET", package), call_text("PUT", package, "PK\x03\x04 zip bytes")}) {
    EXPECT_EQ(r.status, 400) << r.body;
    const std::string error = r.json().value("error", "");
    EXPECT_NE(error.find("'working_dir' and 'py_modules' are not supported"), std::string::npos)
        << error;
  }
  EXPECT_EQ(test::http("GET", head_->url() + package).status, 401);  // behind the token too
}

TEST_F(HeadTest, HostileBodiesAreRefusedAndTheHeadLivesOn) {
  start(options());
  // 200,000 levels of nesting crashed a server thread (stack overflow) before.
  const std::string deep = std::string(200'000, '[') + std::string(200'000, ']');
  for (const char* path : {"/api/cluster/nodes", "/api/jobs/"}) {
    auto r = call_text("POST", path, "{\"node_id\": " + deep + "}");
    EXPECT_EQ(r.status, 400) << path << ": " << r.body.substr(0, 200);
    EXPECT_NE(r.json().value("error", "").find("deeper than 32"), std::string::npos) << r.body;
  }
  // A body past the server's limit is refused before it is read, naming the limit.
  auto big = call("POST", "/api/jobs/", {{"entrypoint", std::string(9 << 20, 'x')}});
  EXPECT_EQ(big.status, 413) << big.body.substr(0, 200);
  EXPECT_NE(big.json().value("error", "").find("limit of 8388608 bytes"), std::string::npos)
      << big.body;
  // A field past its own limit: 413 naming the field and the limit.
  auto field = call("POST", "/api/jobs/", {{"entrypoint", std::string(200'000, 'x')}});
  EXPECT_EQ(field.status, 413) << field.body.substr(0, 200);
  EXPECT_NE(field.json().value("error", "").find("'entrypoint' is 200000 bytes"), std::string::npos)
      << field.body;
  EXPECT_EQ(get("/api/jobs/").size(), 0u);  // nothing was kept
  EXPECT_EQ(call("GET", "/api/version").json()["version"], "2");
}

TEST_F(HeadTest, ASecondHeadOnTheSameStateDirIsRefusedAndSecretsArePrivate) {
  start(options());
  std::string id = submit(
      {{"entrypoint", "true"}, {"runtime_env", {{"env_vars", {{"AWS_SECRET_ACCESS_KEY", "k"}}}}}});
  try {
    Head second(short_lived(options()));
    second.start();
    FAIL() << "a second head started on the same state directory";
  } catch (const InvalidArgumentError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("is in use by trainyard head (host "), std::string::npos) << msg;
    EXPECT_NE(msg.find("a second trainyard head there would take over"), std::string::npos) << msg;
    EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << msg;
    EXPECT_NE(msg.find("started "), std::string::npos) << msg;
    EXPECT_NE(msg.find("--state-dir"), std::string::npos) << msg;
  }
  // The first head did not notice.
  EXPECT_EQ(status_of(id), "PENDING");
  const auto mode = [](const std::filesystem::path& p) {
    return std::filesystem::status(p).permissions() & std::filesystem::perms::all;
  };
  const auto state = dir_.path() / "state";
  EXPECT_EQ(mode(state), std::filesystem::perms::owner_all);
  const auto rw = std::filesystem::perms::owner_read | std::filesystem::perms::owner_write;
  for (const char* f : {"head.db", "head.db-wal", "head.db-shm", "lock"}) {
    ASSERT_TRUE(std::filesystem::exists(state / f)) << f;
    EXPECT_EQ(mode(state / f), rw) << f;
  }
  // Once the first head stops, the folder is free.
  restart();
  EXPECT_EQ(status_of(id), "PENDING");
}

TEST_F(HeadTest, SimulatedWorkerRunsAJobToSuccess) {
  start(options());
  register_node("n1", 4);
  std::string id = submit({{"entrypoint", "python train.py"},
                           {"runtime_env", {{"env_vars", {{"A", "1"}}}}},
                           {"trainyard", {{"nodes", "1"}, {"nproc_per_node", 2}}}});
  json hb;
  ASSERT_TRUE(eventually([&] {
    hb = heartbeat("n1");
    return !hb["assignments"].empty();
  }));
  EXPECT_EQ(hb["registered"], true);
  json a = hb["assignments"][0];
  EXPECT_EQ(a["job_id"], id);
  EXPECT_EQ(a["entrypoint"], "python train.py");
  EXPECT_EQ(a["env"]["A"], "1");
  EXPECT_EQ(a["nproc_per_node"], 2);
  EXPECT_EQ(a["min_nodes"], 1);
  EXPECT_EQ(a["max_nodes"], 1);
  EXPECT_EQ(node_in_status("n1")["usage"]["cpu_used"], 2.0);

  hb = heartbeat("n1", json::array({report(id, "running")}));
  EXPECT_TRUE(hb["assignments"].empty());  // acknowledged by the report
  EXPECT_TRUE(hb["stop"].empty());
  EXPECT_EQ(status_of(id), "RUNNING");

  json logs = {{"node_id", "n1"},
               {"first_seq", 0},
               {"lines", {{{"rank", 0}, {"text", "hello"}}, {{"rank", 1}, {"text", "world"}}}}};
  EXPECT_EQ(call("POST", api::worker_logs_path(id), logs).json()["next_seq"], 2);
  EXPECT_EQ(call("POST", api::worker_logs_path(id), logs).json()["next_seq"], 2);  // a resend
  EXPECT_EQ(get(api::job_logs_path(id))["logs"], "[n1:0] hello\n[n1:1] world\n");
  EXPECT_EQ(call("POST", api::worker_logs_path("nope"), logs).status, 404);

  heartbeat("n1", json::array({report(id, "succeeded")}));
  json details = get("/api/jobs/" + id);
  EXPECT_EQ(details["status"], "SUCCEEDED");
  EXPECT_EQ(details["driver_exit_code"], 0);
  EXPECT_FALSE(details["end_time"].is_null());
  EXPECT_EQ(details["trainyard"]["assigned_nodes"], json::array({"n1"}));
  EXPECT_EQ(node_in_status("n1")["usage"]["cpu_used"], 0.0);
}

TEST_F(HeadTest, AFailedRankFailsTheJobAndStopsTheOtherNodes) {
  start(options());
  register_node("n1", 2);
  register_node("n2", 2);
  std::string id = submit({{"entrypoint", "false"}, {"trainyard", {{"nodes", "2"}}}});
  ASSERT_TRUE(eventually([&] { return !heartbeat("n1")["assignments"].empty(); }));
  ASSERT_FALSE(heartbeat("n2")["assignments"].empty());
  heartbeat("n1", json::array({report(id, "running")}));
  heartbeat("n2", json::array({report(id, "running")}));
  json failed = report(id, "failed");
  failed["exit_code"] = 3;
  failed["failed_rank"] = 1;
  failed["message"] = "rank 1 exited with code 3";
  failed["error_type"] = "RANK_FAILED";
  failed["last_lines"] = {"Traceback", "ValueError: boom"};
  heartbeat("n1", json::array({failed}));
  json d = get("/api/jobs/" + id);
  EXPECT_EQ(d["status"], "FAILED");
  EXPECT_EQ(d["message"], "rank 1 exited with code 3");
  EXPECT_EQ(d["error_type"], "RANK_FAILED");
  EXPECT_EQ(d["driver_exit_code"], 3);
  EXPECT_EQ(d["trainyard"]["failed_rank"], 1);
  EXPECT_EQ(d["trainyard"]["failed_node"], "n1");
  EXPECT_EQ(d["trainyard"]["last_lines"], json::array({"Traceback", "ValueError: boom"}));
  EXPECT_EQ(heartbeat("n2", json::array({report(id, "running")}))["stop"], json::array({id}));
}

TEST_F(HeadTest, GangJobWaitsForEnoughNodesAndShowsItsDemand) {
  start(options());
  register_node("n1", 4);
  register_node("n2", 4);
  std::string id = submit({{"entrypoint", "x"},
                           {"entrypoint_num_cpus", 2},
                           {"trainyard", {{"nodes", "3"}, {"nproc_per_node", 2}}}});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a few scheduling ticks
  EXPECT_EQ(status_of(id), "PENDING");
  EXPECT_TRUE(heartbeat("n1")["assignments"].empty());
  json st = get("/api/cluster/status");
  ASSERT_EQ(st["demands"].size(), 1u);
  EXPECT_EQ(st["demands"][0]["job_id"], id);
  EXPECT_EQ(st["demands"][0]["cpu"], 4.0);
  EXPECT_EQ(st["demands"][0]["nodes"], 3);
  EXPECT_EQ(st["jobs"]["PENDING"], 1);
  EXPECT_EQ(st["jobs"]["RUNNING"], 0);
  EXPECT_FALSE(get("/api/jobs/" + id)["trainyard"]["demand"].is_null());
  // An elastic job that fits on the two nodes goes first, so the gang job still waits.
  std::string small = submit({{"entrypoint", "y"}, {"trainyard", {{"nodes", "1:2"}}}});
  ASSERT_TRUE(eventually(
      [&] { return get("/api/jobs/" + small)["trainyard"]["assigned_nodes"].size() == 2; }));
  heartbeat("n1", json::array({report(small, "succeeded")}));
  heartbeat("n2", json::array({report(small, "succeeded")}));
  EXPECT_EQ(status_of(small), "SUCCEEDED");
  register_node("n3", 4);
  ASSERT_TRUE(eventually(
      [&] { return get("/api/jobs/" + id)["trainyard"]["assigned_nodes"].size() == 3; }));
  EXPECT_TRUE(get("/api/cluster/status")["demands"].empty());
  for (const char* n : {"n1", "n2", "n3"}) EXPECT_EQ(heartbeat(n)["assignments"].size(), 1u);
}

HeadOptions short_lived(HeadOptions o) {
  o.suspect_after = std::chrono::milliseconds(400);
  o.dead_after = std::chrono::milliseconds(1500);
  return o;
}

TEST_F(HeadTest, ADeadNodesReservationIsReleasedWhenItsJobFails) {
  // A job FAILED by its node's death kept the node's CPU reserved forever, across restarts:
  // after that the node ran nothing and a job waited as a demand for good.
  start(short_lived(options()));
  register_node("n1", 1);
  std::string id = submit({{"entrypoint", "x"}});
  ASSERT_TRUE(eventually([&] { return !heartbeat("n1")["assignments"].empty(); }));
  heartbeat("n1", json::array({report(id, "running")}));
  ASSERT_TRUE(eventually([&] { return status_of(id) == "FAILED"; }));
  ASSERT_EQ(node_in_status("n1")["state"], "dead");
  // The node comes back (its worker restarted, without the job) and has its CPU to give.
  register_node("n1", 1);
  EXPECT_EQ(node_in_status("n1")["usage"]["cpu_used"], 0.0);
  std::string next = submit({{"entrypoint", "y"}});
  ASSERT_TRUE(eventually([&] {
    return get("/api/jobs/" + next)["trainyard"]["assigned_nodes"] == json::array({"n1"});
  })) << get("/api/cluster/status").dump();
  // A second death of a node whose job already ended: released as well.
  heartbeat("n1", json::array({report(next, "running")}));
  call("POST", "/api/jobs/" + next + "/stop");
  ASSERT_TRUE(eventually([&] { return node_in_status("n1")["state"] == "dead"; }));
  restart();
  register_node("n1", 1);
  EXPECT_EQ(node_in_status("n1")["usage"]["cpu_used"], 0.0);
  std::string third = submit({{"entrypoint", "z"}});
  EXPECT_TRUE(eventually([&] {
    return get("/api/jobs/" + third)["trainyard"]["assigned_nodes"] == json::array({"n1"});
  })) << get("/api/cluster/status").dump();
}

TEST_F(HeadTest, FloodsAndFollowersThatDoNotReadDelayNoHeartbeat) {
  // Under civetweb 33 idle connections, 40 slow clients or 32 followers that did not read took
  // every thread: heartbeats went unread, nodes were declared dead and the running job FAILED.
  start(short_lived(options()));  // suspect after 0.4 s without a heartbeat, dead after 1.5 s
  register_node("n1", 2);
  std::string id = submit({{"entrypoint", "x"}});
  ASSERT_TRUE(eventually([&] { return !heartbeat("n1")["assignments"].empty(); }));
  heartbeat("n1", json::array({report(id, "running")}));
  std::vector<std::unique_ptr<test::RawClient>> idle, slow, followers;
  for (int i = 0; i < 40; ++i) {
    idle.push_back(std::make_unique<test::RawClient>(head_->port()));
    slow.push_back(std::make_unique<test::RawClient>(head_->port()));
  }
  int admitted = 0, refused = 0;
  for (int i = 0; i < 64; ++i) {
    followers.push_back(std::make_unique<test::RawClient>(head_->port()));
    followers.back()->send(test::websocket_handshake(api::job_logs_tail_path(id), *token_));
    const std::string answer = followers.back()->read_head(std::chrono::seconds(5), 8192);
    if (answer.find(" 101 ") != std::string::npos) ++admitted;
    if (answer.find(" 429 ") != std::string::npos) ++refused;
  }
  EXPECT_EQ(admitted, 32);  // HeadOptions::max_log_followers_per_job
  EXPECT_EQ(refused, 32);
  const std::string text(2000, 'y');
  EXPECT_LT(heartbeats_for_3s("n1",
                              [&](int step) {
                                for (auto& c : slow) c->send("G");
                                call("POST", api::worker_logs_path(id),
                                     {{"node_id", "n1"},
                                      {"first_seq", step},
                                      {"lines", {{{"rank", 0}, {"text", text}}}}});
                              }),
            1000);
  EXPECT_EQ(node_in_status("n1")["state"], "alive");
  heartbeat("n1", json::array({report(id, "succeeded")}));
  EXPECT_EQ(status_of(id), "SUCCEEDED");
}

// Note [Keeping room for admitted clients], Note [A head that turned connections away]: idle
// connections without a token, 300 from the workers' own address (past its 256 per address) and
// 4 x 256 from four other hosts (past the 768 in all), made the server refuse every heartbeat:
// the node was declared dead and its running job FAILED. The flood now makes room for them.
TEST_F(HeadTest, IdleConnectionFloodsWithoutATokenTurnAwayNoHeartbeat) {
  if (!test::raise_open_files_limit(4096))
    GTEST_SKIP() << "the hard limit on open files is below 4096: the flood needs ~2,700";
  start(short_lived(options()));  // suspect after 0.4 s without a heartbeat, dead after 1.5 s
  register_node("n1", 2);
  std::string id = submit({{"entrypoint", "x"}});
  ASSERT_TRUE(eventually([&] { return !heartbeat("n1")["assignments"].empty(); }));
  heartbeat("n1", json::array({report(id, "running")}));
  std::vector<std::unique_ptr<test::RawClient>> flood;
  for (int i = 0; i < 300; ++i) flood.push_back(std::make_unique<test::RawClient>(head_->port()));
  for (const char* from : {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"})
    for (int i = 0; i < 256; ++i)
      flood.push_back(std::make_unique<test::RawClient>(head_->port(), from));
  for (const auto& c : flood) ASSERT_TRUE(c->connected());
  EXPECT_LT(heartbeats_for_3s("n1"), 1000);
  EXPECT_EQ(node_in_status("n1")["state"], "alive");
  EXPECT_EQ(status_of(id), "RUNNING");
  heartbeat("n1", json::array({report(id, "succeeded")}));
  EXPECT_EQ(status_of(id), "SUCCEEDED");
}

TEST_F(HeadTest, AReusedSubmissionIdIgnoresTheOldJobsLateReportsAndLines) {
  // Note [Job instances on the wire]: a deleted job's id submitted again got the old job's late
  // FAILED and its lines.
  start(options());
  register_node("n1", 2);
  const json body = {{"entrypoint", "x"}, {"submission_id", "s1"}};
  submit(body);
  json hb;
  ASSERT_TRUE(eventually([&] { return !(hb = heartbeat("n1"))["assignments"].empty(); }));
  const std::int64_t old_instance = hb["assignments"][0]["instance"];
  json done = report("s1", "succeeded");
  done["instance"] = old_instance;
  heartbeat("n1", json::array({done}));
  ASSERT_EQ(status_of("s1"), "SUCCEEDED");
  ASSERT_EQ(call("DELETE", "/api/jobs/s1").status, 200);
  submit(body);
  ASSERT_TRUE(eventually([&] { return !(hb = heartbeat("n1"))["assignments"].empty(); }));
  const std::int64_t instance = hb["assignments"][0]["instance"];
  EXPECT_NE(instance, old_instance);
  // The old submission's late word and lines: ignored, and a running one is told to stop.
  json late = report("s1", "failed");
  late["instance"] = old_instance;
  late["message"] = "the old job failed";
  heartbeat("n1", json::array({late}));
  EXPECT_EQ(status_of("s1"), "PENDING");
  json old_running = report("s1", "running");
  old_running["instance"] = old_instance;
  EXPECT_EQ(heartbeat("n1", json::array({old_running}))["stop"], json::array({"s1"}));
  EXPECT_EQ(status_of("s1"), "PENDING");
  auto lines = call("POST", api::worker_logs_path("s1"),
                    {{"node_id", "n1"},
                     {"instance", old_instance},
                     {"first_seq", 0},
                     {"lines", {{{"rank", 0}, {"text", "old line"}}}}});
  EXPECT_EQ(lines.json()["next_seq"], 1);  // taken, so the worker drops them
  EXPECT_EQ(get(api::job_logs_path("s1"))["logs"], "");
  // The new submission's own word counts.
  json running = report("s1", "running");
  running["instance"] = instance;
  EXPECT_TRUE(heartbeat("n1", json::array({running}))["stop"].empty());
  EXPECT_EQ(status_of("s1"), "RUNNING");
  call("POST", api::worker_logs_path("s1"),
       {{"node_id", "n1"},
        {"instance", instance},
        {"first_seq", 0},
        {"lines", {{{"rank", 0}, {"text", "new line"}}}}});
  EXPECT_EQ(get(api::job_logs_path("s1"))["logs"], "[n1:0] new line\n");
}

TEST_F(HeadTest, AFullDiskIsA507NamingItAndTheHeadGoesOnWhenSpaceReturns) {
  // Note [A full disk]: before, the head logged "database or disk is full" twice a tick,
  // answered 500s and `submit` waited without a word.
  const auto small = dir_.path() / "small";
  std::filesystem::create_directories(small);
  const std::string mount = "mount -t tmpfs -o size=2m tmpfs '" + small.string() + "' 2>/dev/null";
  if (std::system(mount.c_str()) != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  struct Unmount {
    std::filesystem::path path;
    ~Unmount() { (void)std::system(("umount -l '" + path.string() + "'").c_str()); }
  } unmount{small};
  HeadOptions o = options();
  o.state_dir = small / "state";
  start(o);
  submit({{"entrypoint", "x"}, {"submission_id", "before"}});
  {
    std::ofstream fill(small / "filler", std::ios::binary);
    const std::string chunk(64 << 10, 'f');
    while (fill.write(chunk.data(), static_cast<std::streamsize>(chunk.size())) && fill.flush()) {
    }
  }
  HttpResult full;
  for (int i = 0; i < 50; ++i) {  // until a write needs a page the disk no longer has
    full = call("POST", "/api/jobs/", {{"entrypoint", std::string(4000, 'e')}});
    if (full.status != 200) break;
  }
  ASSERT_EQ(full.status, 507) << full.body;
  const std::string why = full.json().value("error", "");
  EXPECT_NE(why.find("disk is full"), std::string::npos) << why;
  EXPECT_NE(why.find(small.string()), std::string::npos) << why;
  json st = get("/api/cluster/status");
  EXPECT_EQ(st["head"]["healthy"], false);
  EXPECT_NE(st["head"]["problem"].get<std::string>().find("disk is full"), std::string::npos);
  EXPECT_EQ(call("GET", "/api/jobs/before").status, 200);  // reads go on
  // Space returns: the head goes on by itself.
  std::filesystem::remove(small / "filler");
  EXPECT_EQ(call("POST", "/api/jobs/", {{"entrypoint", "x"}, {"submission_id", "after"}}).status,
            200);
  st = get("/api/cluster/status");
  EXPECT_EQ(st["head"]["healthy"], true);
  EXPECT_EQ(status_of("after"), "PENDING");
}

TEST_F(HeadTest, SilentNodeGoesSuspectThenDeadAndFailsItsJob) {
  start(short_lived(options()));
  register_node("n1", 2);
  std::string id = submit({{"entrypoint", "x"}});
  ASSERT_TRUE(eventually([&] { return !heartbeat("n1")["assignments"].empty(); }));
  heartbeat("n1", json::array({report(id, "running")}));
  ASSERT_TRUE(eventually([&] { return node_in_status("n1")["state"] == "suspect"; }));
  ASSERT_TRUE(eventually([&] { return node_in_status("n1")["state"] == "dead"; }));
  json st = get("/api/cluster/status");
  EXPECT_EQ(node_in_status("n1")["reason"], "heartbeat timeout");
  ASSERT_EQ(st["failures"].size(), 1u);
  EXPECT_EQ(st["failures"][0]["node_id"], "n1");
  EXPECT_EQ(st["failures"][0]["reason"], "heartbeat timeout");
  json d = get("/api/jobs/" + id);
  EXPECT_EQ(d["status"], "FAILED");
  EXPECT_EQ(d["message"], "node n1 died (heartbeat timeout)");
  EXPECT_EQ(d["trainyard"]["failed_node"], "n1");
  // The dead node is told to register again.
  EXPECT_EQ(heartbeat("n1")["registered"], false);
}

TEST_F(HeadTest, ElasticJobGrowsOntoANewNodeAndOutlivesLosingOne) {
  start(short_lived(options()));
  register_node("n1", 1);
  std::string id = submit({{"entrypoint", "x"}, {"trainyard", {{"nodes", "1:2"}}}});
  ASSERT_TRUE(eventually([&] { return !heartbeat("n1")["assignments"].empty(); }));
  heartbeat("n1", json::array({report(id, "running")}));
  EXPECT_EQ(status_of(id), "RUNNING");
  register_node("n2", 1);
  ASSERT_TRUE(eventually([&] {
    heartbeat("n1", json::array({report(id, "running")}));
    return !heartbeat("n2")["assignments"].empty();
  }));
  EXPECT_EQ(get("/api/jobs/" + id)["trainyard"]["assigned_nodes"], json::array({"n1", "n2"}));
  heartbeat("n2", json::array({report(id, "running")}));
  // n2 goes silent; n1 keeps beating. One node is still the job's minimum: it keeps running.
  ASSERT_TRUE(eventually([&] {
    heartbeat("n1", json::array({report(id, "running")}));
    return node_in_status("n2")["state"] == "dead";
  }));
  EXPECT_EQ(status_of(id), "RUNNING");
  EXPECT_EQ(get("/api/jobs/" + id)["trainyard"]["assigned_nodes"], json::array({"n1"}));
  heartbeat("n1", json::array({report(id, "succeeded")}));
  EXPECT_EQ(status_of(id), "SUCCEEDED");
}

TEST_F(HeadTest, PlacedJobWhoseNodeDiesBeforeStartingIsPlacedAgain) {
  start(short_lived(options()));
  register_node("n1", 1);
  register_node("n2", 1);
  std::string id = submit({{"entrypoint", "x"}, {"trainyard", {{"nodes", "2"}}}});
  ASSERT_TRUE(eventually([&] { return !heartbeat("n1")["assignments"].empty(); }));
  // n2 never beats: it dies; the job, not started yet, goes back to the queue.
  ASSERT_TRUE(eventually([&] {
    heartbeat("n1");
    return node_in_status("n2")["state"] == "dead";
  }));
  json d = get("/api/jobs/" + id);
  EXPECT_EQ(d["status"], "PENDING");
  EXPECT_TRUE(d["trainyard"]["assigned_nodes"].empty());
  EXPECT_TRUE(heartbeat("n1")["assignments"].empty());
  register_node("n3", 1);
  ASSERT_TRUE(eventually([&] {
    return get("/api/jobs/" + id)["trainyard"]["assigned_nodes"] == json::array({"n1", "n3"});
  }));
}

TEST_F(HeadTest, StoppingARunningJobTellsItsNodes) {
  start(options());
  register_node("n1", 1);
  std::string id = submit({{"entrypoint", "sleep 100"}});
  ASSERT_TRUE(eventually([&] { return !heartbeat("n1")["assignments"].empty(); }));
  heartbeat("n1", json::array({report(id, "running")}));
  EXPECT_EQ(call("POST", api::job_stop_path(id)).json()["stopped"], true);
  EXPECT_EQ(status_of(id), "STOPPED");
  json hb = heartbeat("n1", json::array({report(id, "running")}));
  EXPECT_EQ(hb["stop"], json::array({id}));
  EXPECT_TRUE(hb["assignments"].empty());
  // Its ranks hold the CPU until the node reports them stopped.
  std::string next = submit({{"entrypoint", "true"}});
  EXPECT_TRUE(get("/api/jobs/" + next)["trainyard"]["assigned_nodes"].empty());
  EXPECT_TRUE(heartbeat("n1", json::array({report(id, "stopped")}))["stop"].empty());
  EXPECT_EQ(status_of(id), "STOPPED");
  ASSERT_TRUE(eventually([&] { return !heartbeat("n1")["assignments"].empty(); }));
}

TEST_F(HeadTest, WorkerRestartedWithoutItsJobFailsIt) {
  start(options());
  register_node("n1", 2);
  std::string id = submit({{"entrypoint", "x"}});
  std::string other = submit({{"entrypoint", "y"}});
  ASSERT_TRUE(eventually([&] { return heartbeat("n1")["assignments"].size() == 2; }));
  heartbeat("n1", json::array({report(id, "running"), report(other, "running")}));
  register_node("n1", 2, json::array({report(other, "running")}));  // lost `id`
  EXPECT_EQ(status_of(id), "FAILED");
  EXPECT_EQ(get("/api/jobs/" + id)["message"], "node n1 restarted without the job");
  EXPECT_EQ(status_of(other), "RUNNING");
}

TEST_F(HeadTest, LeavingNodeIsNotAFailure) {
  start(options());
  register_node("n1", 2);
  auto r = call("POST", api::node_leave_path("n1"), {{"reason", "drained"}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(node_in_status("n1")["state"], "drained");
  EXPECT_TRUE(get("/api/cluster/status")["failures"].empty());
}

TEST_F(HeadTest, RestartKeepsJobsLogsRendezvousAndNodesComeBackPending) {
  start(short_lived(options()));
  register_node("n1", 1);
  register_node("n2", 1);
  std::string id = submit({{"entrypoint", "x"}, {"trainyard", {{"nodes", "1"}}}});
  std::string other = submit({{"entrypoint", "y"}, {"trainyard", {{"nodes", "1"}}}});
  ASSERT_TRUE(eventually([&] {
    return get("/api/jobs/" + id)["trainyard"]["assigned_nodes"] == json::array({"n1"}) &&
           get("/api/jobs/" + other)["trainyard"]["assigned_nodes"] == json::array({"n2"});
  }));
  heartbeat("n1", json::array({report(id, "running")}));
  heartbeat("n2", json::array({report(other, "running")}));
  call("POST", api::worker_logs_path(id),
       {{"node_id", "n1"}, {"first_seq", 0}, {"lines", {{{"rank", 0}, {"text", "before"}}}}});
  auto w = call("POST", api::rdzv_path(id), {{"state", "round-1"}, {"token", nullptr}}).json();
  ASSERT_EQ(w["written"], true);

  restart();
  EXPECT_EQ(status_of(id), "RUNNING");
  EXPECT_EQ(get(api::job_logs_path(id))["logs"], "[n1:0] before\n");
  EXPECT_EQ(get(api::rdzv_path(id))["state"], "round-1");
  EXPECT_EQ(get(api::rdzv_path(id))["token"], w["token"]);
  EXPECT_EQ(node_in_status("n1")["state"], "pending");
  EXPECT_EQ(heartbeat("n1")["registered"], false);
  // n1 registers again with its report; n2 never comes back.
  register_node("n1", 1, json::array({report(id, "running")}));
  EXPECT_EQ(node_in_status("n1")["state"], "alive");
  ASSERT_TRUE(eventually([&] {
    heartbeat("n1", json::array({report(id, "running")}));  // n1 stays alive meanwhile
    return node_in_status("n2")["state"] == "dead";
  }));
  EXPECT_EQ(node_in_status("n2")["reason"], "heartbeat timeout");
  EXPECT_EQ(get("/api/jobs/" + other)["message"], "node n2 died (heartbeat timeout)");
  EXPECT_EQ(status_of(other), "FAILED");
  heartbeat("n1", json::array({report(id, "succeeded")}));
  EXPECT_EQ(status_of(id), "SUCCEEDED");
}

TEST_F(HeadTest, RendezvousCompareAndSetOverHttp) {
  start(options());
  EXPECT_EQ(call("GET", api::rdzv_path("run")).status, 404);
  json a = call("POST", api::rdzv_path("run"), {{"state", "s1"}, {"token", nullptr}}).json();
  EXPECT_EQ(a["written"], true);
  json b = call("POST", api::rdzv_path("run"), {{"state", "s2"}, {"token", nullptr}}).json();
  EXPECT_EQ(b["written"], false);
  EXPECT_EQ(b["state"], "s1");
  json c = call("POST", api::rdzv_path("run"), {{"state", "s2"}, {"token", a["token"]}}).json();
  EXPECT_EQ(c["written"], true);
  json d = call("POST", api::rdzv_path("run"), {{"state", "s3"}, {"token", a["token"]}}).json();
  EXPECT_EQ(d["written"], false);
  EXPECT_EQ(d["state"], "s2");
  EXPECT_EQ(d["token"], c["token"]);
  EXPECT_EQ(call("POST", api::rdzv_path("run"), {{"token", nullptr}}).status, 400);
}

TEST_F(HeadTest, LogTailSendsOldAndNewLinesAndClosesAtTheEnd) {
  start(options());
  register_node("n1", 2);
  std::string id = submit({{"entrypoint", "x"}});
  ASSERT_TRUE(eventually([&] { return !heartbeat("n1")["assignments"].empty(); }));
  heartbeat("n1", json::array({report(id, "running")}));
  call("POST", api::worker_logs_path(id),
       {{"node_id", "n1"}, {"first_seq", 0}, {"lines", {{{"rank", 0}, {"text", "old"}}}}});
  auto tail = std::async(std::launch::async, [&] {
    return test::websocket_read_all(
        "ws://127.0.0.1:" + std::to_string(head_->port()) + api::job_logs_tail_path(id),
        "Bearer " + *token_);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the client connects
  call("POST", api::worker_logs_path(id),
       {{"node_id", "n1"}, {"first_seq", 1}, {"lines", {{{"rank", 0}, {"text", "new"}}}}});
  EXPECT_EQ(tail.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "the tail closed while the job runs: " << tail.get();
  heartbeat("n1", json::array({report(id, "succeeded")}));
  ASSERT_EQ(tail.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(tail.get(), "[n1:0] old\n[n1:0] new\n<closed>\n");
}

// Note [A job ends before its logs]: a final report that counts 3 lines of which the head holds
// 1 ends the job and frees its CPUs at once (a waiting job is placed), while its logs stay
// incomplete, and the WebSocket tail open, until the other 2 arrive.
TEST_F(HeadTest, AJobEndsWithItsRanksAndItsLogsFollow) {
  start(options());
  register_node("n1", 2);
  const std::string id = submit({{"entrypoint", "x"}, {"entrypoint_num_cpus", 2}});
  const std::string next = submit({{"entrypoint", "y"}, {"entrypoint_num_cpus", 2}});
  ASSERT_TRUE(eventually([&] { return !heartbeat("n1")["assignments"].empty(); }));
  heartbeat("n1", json::array({report(id, "running")}));
  EXPECT_EQ(status_of(next), "PENDING");
  auto line = [&](int seq, const char* text) {
    call("POST", api::worker_logs_path(id),
         {{"node_id", "n1"}, {"first_seq", seq}, {"lines", {{{"rank", 0}, {"text", text}}}}});
  };
  line(0, "one");
  auto tail = std::async(std::launch::async, [&] {
    return test::websocket_read_all(
        "ws://127.0.0.1:" + std::to_string(head_->port()) + api::job_logs_tail_path(id),
        "Bearer " + *token_);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the client connects
  json ended = report(id, "succeeded");
  ended["line_count"] = 3;
  heartbeat("n1", json::array({ended}));
  EXPECT_EQ(status_of(id), "SUCCEEDED");
  EXPECT_EQ(get("/api/jobs/" + id)["trainyard"]["logs_complete"], false);
  ASSERT_TRUE(eventually([&] {
    return !get("/api/jobs/" + next)["trainyard"]["assigned_nodes"].empty();
  })) << "the ended job still holds its CPUs";
  EXPECT_EQ(tail.wait_for(std::chrono::milliseconds(500)), std::future_status::timeout)
      << "the tail closed before the logs were complete: " << tail.get();
  line(1, "two");
  line(2, "three");
  EXPECT_EQ(get("/api/jobs/" + id)["trainyard"]["logs_complete"], true);
  ASSERT_EQ(tail.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(tail.get(), "[n1:0] one\n[n1:0] two\n[n1:0] three\n<closed>\n");
  EXPECT_EQ(get(api::job_logs_path(id))["logs"], "[n1:0] one\n[n1:0] two\n[n1:0] three\n");
}

}  // namespace
}  // namespace trainyard::cluster
