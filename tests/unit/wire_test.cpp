// The cluster's messages (cluster/wire.h): each round-trips through its JSON, the fields a peer
// may leave out are optional, and what a hostile client could send (deep nesting, huge fields,
// wrong types) is refused with the field and the limit named.
#include "trainyard/cluster/wire.h"

#include <gtest/gtest.h>

#include "../text.h"

namespace trainyard::cluster::wire {
namespace {

using nlohmann::json;
using test::contains;

template <typename T>
T round_trip(const T& v) {
  return parse_message(json(v).dump(), "message").get<T>();
}

std::string nested(int depth) {
  return std::string(static_cast<std::size_t>(depth), '[') +
         std::string(static_cast<std::size_t>(depth), ']');
}

template <typename T>
std::string error_of(const json& j) {
  try {
    (void)j.get<T>();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "<accepted>";
}

TEST(Wire, EveryMessageRoundTrips) {
  const JobReport failed{.job_id = "j1",
                         .state = ReportState::kFailed,
                         .restart_count = 2,
                         .ranks = {2, 3},
                         .world_size = 4,
                         .exit_code = 1,
                         .failed_rank = 3,
                         .error_type = std::string(kCommandError),
                         .message = "rank 3 exited with 1",
                         .last_lines = {"Traceback", "ValueError"}};
  EXPECT_EQ(round_trip(failed), failed);
  const JobReport running{.job_id = "j2"};
  EXPECT_EQ(round_trip(running), running);

  const Registration reg{.node_id = "n1",
                         .hostname = "host",
                         .address = "127.0.0.1",
                         .resources = {.cpu = 4, .gpu = 0, .memory_bytes = 1 << 30},
                         .jobs = {failed, running}};
  const auto reg2 = round_trip(reg);
  EXPECT_EQ(reg2.node_id, "n1");
  EXPECT_EQ(reg2.resources, reg.resources);
  ASSERT_EQ(reg2.jobs.size(), 2u);
  EXPECT_EQ(reg2.jobs[0], failed);

  const Assignment a{.job_id = "j1",
                     .entrypoint = "python train.py",
                     .env = {{"A", "1"}},
                     .launch = {.nodes = "1:3",
                                .nproc_per_node = 2,
                                .max_restarts = 4,
                                .hang_timeout = std::chrono::milliseconds(1500)},
                     .min_nodes = 1,
                     .max_nodes = 3};
  const auto answer =
      round_trip(HeartbeatAnswer{.registered = true, .assignments = {a}, .stop = {"j0"}});
  EXPECT_TRUE(answer.registered);
  ASSERT_EQ(answer.assignments.size(), 1u);
  EXPECT_EQ(answer.assignments[0].entrypoint, "python train.py");
  EXPECT_EQ(answer.assignments[0].env.at("A"), "1");
  EXPECT_EQ(answer.assignments[0].max_nodes, 3);
  EXPECT_EQ(answer.assignments[0].launch.max_restarts, 4);
  EXPECT_EQ(answer.assignments[0].launch.hang_timeout, std::chrono::milliseconds(1500));
  EXPECT_FALSE(answer.assignments[0].launch.restart_backoff.has_value()) << "the agent's default";
  EXPECT_EQ(answer.stop, std::vector<std::string>{"j0"});

  const auto batch = round_trip(LogBatch{.node_id = "n1", .first_seq = 7, .lines = {{1, "hello"}}});
  EXPECT_EQ(batch.first_seq, 7);
  ASSERT_EQ(batch.lines.size(), 1u);
  EXPECT_EQ(batch.lines[0].rank, 1);
  EXPECT_EQ(batch.lines[0].text, "hello");

  JobSubmission sub{.entrypoint = "echo hi",
                    .launch = {.nodes = "1:3",
                               .nproc_per_node = 2,
                               .restart_backoff = std::chrono::milliseconds(250),
                               .hang_timeout = std::chrono::milliseconds(0)}};
  sub.env_vars = {{"K", "V"}};
  sub.metadata = {{"owner", "me"}};
  sub.submission_id = "s1";
  sub.entrypoint_num_cpus = 0.5;
  const auto sub2 = round_trip(sub);
  EXPECT_EQ(sub2.entrypoint, "echo hi");
  EXPECT_EQ(sub2.submission_id, "s1");
  EXPECT_EQ(sub2.env_vars, sub.env_vars);
  EXPECT_EQ(sub2.metadata, sub.metadata);
  EXPECT_EQ(sub2.launch.nodes, "1:3");
  EXPECT_EQ(sub2.launch.restart_backoff, std::chrono::milliseconds(250));
  EXPECT_EQ(sub2.launch.hang_timeout, std::chrono::milliseconds(0)) << "0: the watchdog off";
  EXPECT_EQ(sub2.entrypoint_num_cpus, 0.5);

  JobDetails d{.job_id = "s1", .submission_id = "s1", .status = "FAILED", .failed_rank = 1};
  d.demand = JobDemand{.cpu = 2, .gpu = 0};
  const json dj = d;
  EXPECT_EQ(dj["type"], "SUBMISSION");  // Ray's clients read these
  EXPECT_TRUE(dj["driver_info"].is_null());
  EXPECT_EQ(dj["trainyard"]["demand"]["CPU"], 2);
  const auto d2 = round_trip(d);
  EXPECT_EQ(d2.status, "FAILED");
  EXPECT_EQ(d2.failed_rank, 1);
  ASSERT_TRUE(d2.demand.has_value());
  EXPECT_EQ(d2.demand->cpu, 2);
}

TEST(Wire, OptionalFieldsMayBeNullOrAbsent) {
  // What an older worker, or Ray's own client, sends.
  const auto r = json{{"job_id", "j"},          {"state", "running"}, {"exit_code", nullptr},
                      {"failed_rank", nullptr}, {"message", ""},      {"last_lines", json::array()}}
                     .get<JobReport>();
  EXPECT_EQ(r.state, ReportState::kRunning);
  EXPECT_FALSE(r.exit_code.has_value());
  const auto hb = json::object().get<Heartbeat>();
  EXPECT_TRUE(hb.jobs.empty());
  EXPECT_TRUE(hb.metrics.is_null());
  EXPECT_EQ(json::object().get<LeaveRequest>().reason, "exited");
}

TEST(Wire, NestingDeeperThanTheLimitIsRefusedBeforeParsing) {
  EXPECT_NO_THROW(parse_message(nested(kMaxDepth), "body"));
  try {
    parse_message(nested(200'000), "request body");
    FAIL() << "a document nested 200,000 deep was parsed";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), "request body nests arrays and objects deeper than 32"))
        << e.what();
  }
  // Brackets inside strings are text, escaped quotes included.
  const std::string in_string = "{\"a\": \"" + std::string(100, '[') + "\\\"" + "\"}";
  EXPECT_EQ(parse_message(in_string, "body")["a"].get<std::string>().size(), 101u);
  EXPECT_THROW(parse_message("{\"a\": ", "body"), InvalidArgumentError);
  EXPECT_TRUE(parse_message("", "body").is_object());
}

TEST(Wire, FieldsPastTheirLimitsAreTooLargeNamingTheLimit) {
  auto too_large = [](const json& body) -> std::string {
    try {
      (void)body.get<JobSubmission>();
    } catch (const MessageTooLargeError& e) {
      return e.what();
    }
    return "<not too large>";
  };
  const std::string long_command(kMaxEntrypointBytes + 1, 'x');
  std::string e = too_large({{"entrypoint", long_command}});
  EXPECT_TRUE(contains(e, "'entrypoint' is 131073 bytes; the limit is 131072 bytes")) << e;
  EXPECT_TRUE(contains(e, "MAX_ARG_STRLEN")) << e;

  json env = json::object();
  for (std::size_t i = 0; i <= kMaxEnvVars; ++i) env["V" + std::to_string(i)] = "1";
  e = too_large({{"entrypoint", "x"}, {"runtime_env", {{"env_vars", env}}}});
  EXPECT_TRUE(contains(e, "'runtime_env.env_vars' has 257 entries; the limit is 256")) << e;

  e = too_large({{"entrypoint", "x"},
                 {"runtime_env", {{"env_vars", {{"BIG", std::string(kMaxEnvBytes, 'v')}}}}}});
  EXPECT_TRUE(contains(e, "'runtime_env.env_vars' is 262147 bytes; the limit is 262144")) << e;

  e = too_large({{"entrypoint", "x"}, {"metadata", {{"k", std::string(kMaxMetadataBytes, 'm')}}}});
  EXPECT_TRUE(contains(e, "'metadata' is 16385 bytes; the limit is 16384")) << e;

  json lines = json::array();
  for (std::size_t i = 0; i <= kMaxLogLinesPerBatch; ++i) lines.push_back({{"text", "x"}});
  EXPECT_THROW((json{{"node_id", "n"}, {"first_seq", 0}, {"lines", lines}}.get<LogBatch>()),
               MessageTooLargeError);
  EXPECT_THROW((json{{"node_id", std::string(kMaxIdBytes + 1, 'n')}, {"resources", json::object()}}
                    .get<Registration>()),
               MessageTooLargeError);
}

TEST(Wire, WrongTypesAndValuesNameTheField) {
  std::string e = error_of<Registration>(
      {{"node_id", "../etc"}, {"resources", {{"cpu", 1}, {"gpu", 0}, {"memory_bytes", 1}}}});
  EXPECT_TRUE(contains(e, "'node_id' must be 1 to 128 letters")) << e;
  e = error_of<Registration>(
      {{"node_id", "n1"}, {"resources", {{"cpu", -1}, {"gpu", 0}, {"memory_bytes", 1}}}});
  EXPECT_TRUE(contains(e, "finite and not negative")) << e;
  e = error_of<JobReport>({{"job_id", "j"}, {"state", "exploded"}});
  EXPECT_TRUE(contains(e, "running, succeeded, failed or stopped; got 'exploded'")) << e;
  e = error_of<JobReport>({{"job_id", "j"}, {"state", "running"}, {"ranks", "all"}});
  EXPECT_TRUE(contains(e, "'ranks' field must be an array")) << e;
  e = error_of<JobSubmission>(
      {{"entrypoint", "x"}, {"trainyard", {{"nproc_per_node", 1LL << 40}}}});
  EXPECT_TRUE(contains(e, "'trainyard.nproc_per_node' must be an integer from 1 to 2147483647"))
      << e;
  e = error_of<JobSubmission>({{"entrypoint", "x"}, {"trainyard", {{"hang_timeout_s", -1}}}});
  EXPECT_TRUE(contains(e, "'trainyard.hang_timeout_s' must be a number of seconds from 0 to")) << e;
  e = error_of<JobSubmission>(
      {{"entrypoint", "x"}, {"trainyard", {{"restart_backoff_s", "soon"}}}});
  EXPECT_TRUE(contains(e, "'trainyard.restart_backoff_s' must be a number of seconds")) << e;
  e = error_of<LeaveRequest>({{"reason", "bored"}});
  EXPECT_TRUE(contains(e, "\"exited\" or \"drained\"")) << e;
  e = error_of<Assignment>(
      {{"job_id", "j"}, {"entrypoint", "x"}, {"min_nodes", 3}, {"max_nodes", 2}});
  EXPECT_TRUE(contains(e, "'max_nodes' must be an integer from 3")) << e;
}

}  // namespace
}  // namespace trainyard::cluster::wire
