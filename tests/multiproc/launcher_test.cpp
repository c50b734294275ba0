// The local launcher (`trainyard run`): the torchrun environment contract, output forwarding,
// failure handling with the root-cause summary, signals (to the binary, whose main() turns them
// into Agent::stop()), and a real PyTorch DDP script. Ranks are real processes; tests drive
// launch() in-process or run the trainyard binary. agent_test.cpp covers the Agent object.
#include "trainyard/elastic/launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../text.h"
#include "launch_capture.h"
#include "multiproc_util.h"
#include "trainyard/cluster/node_resources.h"
#include "trainyard/cpu_count.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/error.h"

#ifndef TRAINYARD_CLI_PATH
#error "TRAINYARD_CLI_PATH must name the trainyard binary (a compile definition)"
#endif
#ifndef TRAINYARD_TEST_HELPERS_DIR
#error "TRAINYARD_TEST_HELPERS_DIR must name tests/multiproc/helpers (a compile definition)"
#endif

namespace trainyard::elastic {
namespace {

using namespace std::chrono_literals;
using mptest::read_file;
using mptest::run_program;
using mptest::RunOutput;
using mptest::TempDir;
using Env = std::map<std::string, std::string>;

using mptest::kCli;

RunOutput run_cli(std::vector<std::string> args,
                  std::vector<std::pair<std::string, std::string>> env = {},
                  std::chrono::milliseconds timeout = 20s) {
  args.insert(args.begin(), kCli);
  return run_program(std::move(args), std::move(env), timeout);
}

using trainyard::test::contains;

// Parses `env -0` output.
Env parse_env(const std::string& text) {
  Env env;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\0', start);
    if (end == std::string::npos) end = text.size();
    std::string entry = text.substr(start, end - start);
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
    start = end + 1;
  }
  return env;
}

// The lines (ending in "\r\n", '\r' or '\n') of text that start with prefix, in order.
std::string lines_of(const std::string& text, const std::string& prefix) {
  std::string picked;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find_first_of("\r\n", start);
    end = end == std::string::npos ? text.size() : end + 1;
    if (end < text.size() && text[end - 1] == '\r' && text[end] == '\n') ++end;
    if (text.compare(start, prefix.size(), prefix) == 0) picked += text.substr(start, end - start);
    start = end;
  }
  return picked;
}

bool port_is_free(int port) {
  UniqueFd sock(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

// The port a launch picks for MASTER_PORT stays bound by the agent while the ranks run, so that no
// other program on the host is handed it before rank 0's store binds it, and the store still can
// (SO_REUSEADDR, listening): Note [Holding the master port].
TEST(Launcher, HoldsTheMasterPortItPickedUntilTheRoundEnds) {
  TempDir dir;
  const std::string probe = R"(
import os, socket
port = int(os.environ["MASTER_PORT"])
other = socket.socket()
try:
    other.bind(("127.0.0.1", port))
    print("another program got the port")
except OSError as e:
    print("another program was refused:", e.errno)
store = socket.socket()
store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
store.bind(("", port))
store.listen()
print("the store listens")
)";
  auto c = launch_captured(
      LaunchOptions{.command = {"/usr/bin/python3", "-c", probe}, .run_id = "port-test"});
  ASSERT_TRUE(c.result.succeeded) << c.out << c.err;
  EXPECT_NE(c.out.find("another program was refused: 98"), std::string::npos) << c.out << c.err;
  EXPECT_NE(c.out.find("the store listens"), std::string::npos) << c.out << c.err;
}

TEST(Launcher, SetsTheTorchrunEnvironmentForEveryRank) {
  TempDir dir;
  ASSERT_EQ(setenv("TY_LAUNCHER_INHERITED", "kept", 1), 0);
  auto c = launch_captured(
      LaunchOptions{.command = {"/bin/sh", "-c", R"(env -0 > "$OUTDIR/rank_$RANK")"},
                    .nproc_per_node = 3,
                    .run_id = "env-test",
                    .max_restarts = 2,
                    .role = "trainer",
                    .extra_env = {{"OUTDIR", dir.str()}, {"PYTHONUNBUFFERED", "from-extra-env"}}});
  unsetenv("TY_LAUNCHER_INHERITED");
  ASSERT_TRUE(c.result.succeeded) << c.err;
  ASSERT_EQ(c.result.exits.size(), 3u);
  EXPECT_EQ(c.result.exit_code(), 0);
  EXPECT_EQ(c.result.first_failure, -1);

  const char* parent_omp = std::getenv("OMP_NUM_THREADS");
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    Env env = parse_env(read_file(dir.path() / ("rank_" + std::to_string(rank))));
    const Env expected = {
        {"RANK", std::to_string(rank)},
        {"LOCAL_RANK", std::to_string(rank)},
        {"WORLD_SIZE", "3"},
        {"LOCAL_WORLD_SIZE", "3"},
        {"GROUP_RANK", "0"},
        {"GROUP_WORLD_SIZE", "1"},
        {"ROLE_RANK", std::to_string(rank)},
        {"ROLE_NAME", "trainer"},
        {"ROLE_WORLD_SIZE", "3"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"TORCHELASTIC_RESTART_COUNT", "0"},
        {"TORCHELASTIC_MAX_RESTARTS", "2"},
        {"TORCHELASTIC_RUN_ID", "env-test"},
        {"TORCHELASTIC_USE_AGENT_STORE", "False"},
        {"OMP_NUM_THREADS", parent_omp != nullptr ? parent_omp : "1"},
        {"PYTHONUNBUFFERED", "from-extra-env"},  // extra_env wins over the launcher's own
        {"OUTDIR", dir.str()},
        {"TY_LAUNCHER_INHERITED", "kept"},
    };
    for (const auto& [key, value] : expected) {
      ASSERT_TRUE(env.count(key)) << key << " is not set";
      EXPECT_EQ(env[key], value) << key;
    }
    if (port.empty()) port = env["MASTER_PORT"];
    EXPECT_EQ(env["MASTER_PORT"], port) << "every rank must get the same MASTER_PORT";
    EXPECT_EQ(c.result.exits[rank].rank, rank);
    EXPECT_EQ(c.result.exits[rank].local_rank, rank);
    EXPECT_GT(c.result.exits[rank].pid, 0);
  }
  const int port_number = std::stoi(port);
  EXPECT_GT(port_number, 0);
  EXPECT_LE(port_number, 65535);
  EXPECT_TRUE(port_is_free(port_number)) << "MASTER_PORT " << port_number << " is taken";
  // The resolved configuration is logged at start, and the round's result with its port.
  EXPECT_TRUE(contains(c.err, "master 127.0.0.1:<free port>")) << c.err;
  EXPECT_TRUE(contains(c.err, "  master_port=" + port + "\n")) << c.err;
  EXPECT_TRUE(contains(c.err, "run id 'env-test'")) << c.err;
}

TEST(Launcher, StaticContractOnTheSecondNode) {
  TempDir dir;
  auto c = launch_captured(
      LaunchOptions{.command = {"/bin/sh", "-c", R"(env -0 > "$OUTDIR/rank_$RANK")"},
                    .nproc_per_node = 2,
                    .nnodes = 2,
                    .node_rank = 1,
                    .master_addr = "10.1.2.3",
                    .master_port = 29999,
                    .extra_env = {{"OUTDIR", dir.str()}}});
  ASSERT_TRUE(c.result.succeeded) << c.err;
  for (int local_rank = 0; local_rank < 2; ++local_rank) {
    const int rank = 2 + local_rank;
    Env env = parse_env(read_file(dir.path() / ("rank_" + std::to_string(rank))));
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(local_rank));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], "1");
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(env["MASTER_ADDR"], "10.1.2.3");
    EXPECT_EQ(env["MASTER_PORT"], "29999");
    EXPECT_EQ(c.result.exits[local_rank].rank, rank);
  }
}

TEST(Launcher, PrefixesEveryLineKeepsCarriageReturnsAndWritesRawLogs) {
  TempDir logs;
  const std::string script =
      R"(printf 'first line\nbar 10%%\rbar 20%%\r\nout-%s no newline' "$RANK"; )"
      R"(printf 'warn-%s\n' "$RANK" >&2)";
  auto c = launch_captured(LaunchOptions{.command = {"/bin/sh", "-c", script},
                                         .nproc_per_node = 2,
                                         .run_id = "logs-test",
                                         .log_dir = (logs.path() / "a" / "b").string()});
  ASSERT_TRUE(c.result.succeeded) << c.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[rank" + std::to_string(rank) + "]: ";
    const std::string r = std::to_string(rank);
    // Other ranks' lines may come between this rank's lines, never inside one.
    EXPECT_EQ(lines_of(c.out, p), p + "first line\n" + p + "bar 10%\r" + p + "bar 20%\r\n" + p +
                                      "out-" + r + " no newline\n")
        << c.out;
    EXPECT_TRUE(contains(c.err, p + "warn-" + r + "\n")) << c.err;
    const auto dir = logs.path() / "a" / "b" / "logs-test" / "attempt_0" / r;
    EXPECT_EQ(read_file(dir / "stdout.log"),
              "first line\nbar 10%\rbar 20%\r\nout-" + r + " no newline");
    EXPECT_EQ(read_file(dir / "stderr.log"), "warn-" + r + "\n");
  }
  // Nothing on stdout but whole, prefixed lines.
  const std::regex whole_lines(R"((\[rank[01]\]: [^\r\n]*(\r\n|\r|\n))*)");
  EXPECT_TRUE(std::regex_match(c.out, whole_lines)) << c.out;
}

TEST(Launcher, LinesOfDifferentRanksNeverInterleave) {
  constexpr int kLines = 2000;
  // Each echo is its own write(2); three ranks race to the launcher's stdout.
  const std::string script = "i=0; while [ $i -lt " + std::to_string(kLines) +
                             " ]; do echo \"$RANK:$i:" + std::string(150, 'x') +
                             "\"; i=$((i+1)); done";
  auto c =
      launch_captured(LaunchOptions{.command = {"/bin/sh", "-c", script}, .nproc_per_node = 3});
  ASSERT_TRUE(c.result.succeeded) << c.err;
  const std::regex line_re(R"(\[rank([0-2])\]: ([0-2]):(\d+):x{150})");
  std::vector<int> next(3, 0);
  std::istringstream lines(c.out);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << "mangled line: " << line;
    const int rank = std::stoi(m[1]);
    ASSERT_EQ(m[1], m[2]) << line;
    ASSERT_EQ(std::stoi(m[3]), next[rank]) << "lines of rank " << rank << " out of order";
    ++next[rank];
    ++count;
  }
  EXPECT_EQ(count, 3 * kLines);
  EXPECT_EQ(next, std::vector<int>(3, kLines));
}

TEST(Launcher, NoPrefixForwardsLinesVerbatim) {
  auto c = launch_captured(LaunchOptions{.command = {"/bin/sh", "-c", "echo plain-$RANK"},
                                         .nproc_per_node = 2,
                                         .prefix_output = false});
  ASSERT_TRUE(c.result.succeeded) << c.err;
  EXPECT_TRUE(contains(c.out, "plain-0\n")) << c.out;
  EXPECT_TRUE(contains(c.out, "plain-1\n")) << c.out;
  EXPECT_FALSE(contains(c.out, "[rank")) << c.out;
}

TEST(Launcher, FailedRankStopsTheOthersAndIsTheRootCause) {
  auto c = launch_captured(LaunchOptions{
      .command =
          {"/bin/sh", "-c",
           R"(if [ "$RANK" = 1 ]; then sleep 0.2; echo failing >&2; exit 3; fi; exec sleep 30)"},
      .nproc_per_node = 3,
      .term_timeout = 5s});
  // The others would sleep 30 s; the bound leaves room for a loaded machine.
  EXPECT_LT(c.elapsed, 20s) << "the sleeping ranks were not stopped";
  EXPECT_FALSE(c.result.succeeded);
  EXPECT_EQ(c.result.exit_code(), 3);
  ASSERT_EQ(c.result.first_failure, 1);
  ASSERT_EQ(c.result.exits.size(), 3u);
  const RankExit& root = c.result.exits[1];
  EXPECT_EQ(root.rank, 1);
  EXPECT_EQ(root.exit_code, 3);
  EXPECT_EQ(root.signal, 0);
  EXPECT_FALSE(root.stopped_by_launcher);
  for (int other : {0, 2}) {
    const RankExit& e = c.result.exits[other];
    EXPECT_EQ(e.signal, SIGTERM) << "rank " << other;
    EXPECT_TRUE(e.stopped_by_launcher) << "rank " << other;
    EXPECT_FALSE(mptest::process_alive(e.pid)) << "rank " << other;
    EXPECT_TRUE(contains(c.err, "exitcode  : -15 (pid: " + std::to_string(e.pid) + ")")) << c.err;
    EXPECT_TRUE(
        contains(c.err, "traceback : Signal 15 (SIGTERM) received by PID " + std::to_string(e.pid)))
        << c.err;
  }
  const std::string root_block = "Root Cause (first observed failure):\n[1]:\n";
  const auto at = c.err.find(root_block);
  ASSERT_NE(at, std::string::npos) << c.err;
  const std::string root_text = c.err.substr(at);
  EXPECT_TRUE(contains(root_text, "  rank      : 1 (local_rank: 1)\n")) << root_text;
  EXPECT_TRUE(contains(root_text, "  exitcode  : 3 (pid: " + std::to_string(root.pid) + ")\n"))
      << root_text;
  EXPECT_TRUE(contains(root_text, "  error_file: <N/A>\n")) << root_text;
  EXPECT_TRUE(contains(c.err, "sh FAILED\n")) << c.err;
  EXPECT_TRUE(contains(c.err, "[rank1]: failing\n")) << c.err;
}

TEST(Launcher, RankIgnoringSigtermIsKilledAfterTermTimeout) {
  auto c = launch_captured(LaunchOptions{
      .command = {"/bin/sh", "-c",
                  R"(trap '' TERM; if [ "$RANK" = 0 ]; then sleep 0.2; exit 5; fi; sleep 30)"},
      .nproc_per_node = 2,
      .term_timeout = 300ms});
  EXPECT_EQ(c.result.exit_code(), 5);
  ASSERT_EQ(c.result.first_failure, 0);
  EXPECT_EQ(c.result.exits[1].signal, SIGKILL);
  EXPECT_GE(c.elapsed, 500ms);
  EXPECT_LT(c.elapsed, 20s) << "rank 1 would sleep 30 s unless killed";
  EXPECT_TRUE(contains(c.err, "exitcode  : -9 (pid: ")) << c.err;
  EXPECT_TRUE(contains(c.err, "sending SIGKILL")) << c.err;
}

TEST(Launcher, ProgramNotFoundIsAClearError) {
  try {
    launch_captured(
        LaunchOptions{.command = {"ty-no-such-program", "--flag"}, .nproc_per_node = 2});
    FAIL() << "launched a program that does not exist";
  } catch (const Error& e) {
    EXPECT_TRUE(
        contains(e.what(), "Could not start 'ty-no-such-program': No such file or directory"))
        << e.what();
  }
}

TEST(Launcher, RejectsBadOptions) {
  auto expect_invalid = [](const LaunchOptions& o, const std::string& part) {
    try {
      launch(o);
      ADD_FAILURE() << "accepted options that should fail with: " << part;
    } catch (const InvalidArgumentError& e) {
      EXPECT_TRUE(contains(e.what(), part)) << e.what();
    }
  };
  const std::vector<std::string> cmd = {"/bin/true"};
  expect_invalid({.command = cmd, .nproc_per_node = 0}, "nproc_per_node must be between 1 and");
  expect_invalid({.command = cmd, .nproc_per_node = 0}, "got 0");
  expect_invalid({.command = cmd, .nnodes = 0}, "nnodes must be >= 1, got 0");
  expect_invalid({.command = cmd, .nnodes = 2, .node_rank = 2, .master_port = 1234},
                 "node_rank must be in [0, 2) for nnodes 2, got 2");
  expect_invalid({.command = cmd, .node_rank = -1}, "got -1");
  expect_invalid({.command = {}}, "LaunchOptions.command is empty");
  expect_invalid({.command = cmd, .nnodes = 2, .node_rank = 0}, "master_port 0");
  expect_invalid({.command = cmd, .extra_env = {{"A=B", "c"}}},
                 "extra_env has a bad variable name 'A=B'");
}

// Signals are main()'s (tools/stop_signals.h): launch() and its Agent leave the handlers alone,
// so that several agents can run in one process. See LauncherCli.SigintStopsTheRanks.
TEST(Launcher, InstallsNoSignalHandlers) {
  struct sigaction before {
  }, during{}, during_pipe{}, before_pipe{};
  ASSERT_EQ(sigaction(SIGINT, nullptr, &before), 0);
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &before_pipe), 0);
  bool looked = false;
  auto c =
      launch_captured(LaunchOptions{.command = {"/bin/true"}, .on_event = [&](const AgentEvent& e) {
                                      if (e.kind != AgentEventKind::kRanksStarted) return;
                                      looked = sigaction(SIGINT, nullptr, &during) == 0 &&
                                               sigaction(SIGPIPE, nullptr, &during_pipe) == 0;
                                    }});
  ASSERT_TRUE(c.result.succeeded);
  ASSERT_TRUE(looked);
  EXPECT_EQ(before.sa_handler, during.sa_handler);
  EXPECT_EQ(before_pipe.sa_handler, during_pipe.sa_handler);
}

TEST(Launcher, SelfExecutableIsThisTestBinary) {
  const std::string self = self_executable();
  EXPECT_EQ(self, std::filesystem::canonical("/proc/self/exe").string());
  EXPECT_TRUE(contains(self, "multiproc_tests")) << self;
}

TEST(Launcher, TtyFlagFollowsTheLaunchersStdout) {
  unsetenv("TRAINYARD_TTY");
  TempDir dir;
  const LaunchOptions options{
      .command = {"/bin/sh", "-c", R"(printf '%s' "${TRAINYARD_TTY-unset}" > "$OUTDIR/tty")"},
      .extra_env = {{"OUTDIR", dir.str()}}};
  // stdout is a terminal: a pseudo-terminal stands in for one.
  UniqueFd master(posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  ASSERT_TRUE(master.valid());
  ASSERT_EQ(grantpt(master.get()), 0);
  ASSERT_EQ(unlockpt(master.get()), 0);
  UniqueFd slave(open(ptsname(master.get()), O_RDWR | O_NOCTTY | O_CLOEXEC));
  ASSERT_TRUE(slave.valid());
  std::fflush(stdout);
  UniqueFd saved(dup(STDOUT_FILENO));
  dup2(slave.get(), STDOUT_FILENO);
  LaunchResult on_tty;
  try {
    on_tty = launch(options);
  } catch (...) {
    dup2(saved.get(), STDOUT_FILENO);
    throw;
  }
  dup2(saved.get(), STDOUT_FILENO);
  ASSERT_TRUE(on_tty.succeeded);
  EXPECT_EQ(read_file(dir.path() / "tty"), "1");

  // stdout is not a terminal (a pipe under the capture).
  auto c = launch_captured(options);
  ASSERT_TRUE(c.result.succeeded);
  EXPECT_EQ(read_file(dir.path() / "tty"), "unset");
}

// --- the trainyard binary ------------------------------------------------------------------------

TEST(LauncherCli, FailureGivesTheRootCauseExitCodeAndSummary) {
  auto r = run_cli({"run", "--nproc-per-node", "3", "--", "/bin/sh", "-c",
                    R"(if [ "$RANK" = 2 ]; then exit 3; fi; exec sleep 30)"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_LT(r.elapsed, 20s) << "the other ranks would sleep 30 s unless stopped";
  EXPECT_EQ(r.status.exit_code, 3) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m,
                                std::regex(R"(Root Cause \(first observed failure\):\n\[\d+\]:\n)"
                                           R"(  time      : \d{4}-\d\d-\d\d_\d\d:\d\d:\d\d\n)"
                                           R"(  host      : .+\n)"
                                           R"(  rank      : 2 \(local_rank: 2\)\n)"
                                           R"(  exitcode  : 3 \(pid: (\d+)\)\n)")))
      << r.err;
  EXPECT_TRUE(contains(r.err, "sh FAILED")) << r.err;
  EXPECT_TRUE(contains(r.err, "Signal 15 (SIGTERM) received by PID")) << r.err;
}

TEST(LauncherCli, RestartsTheGroupAfterAFailureWithANewRestartCount) {
  // Rank 1 fails in the first round only; every rank records each round it saw.
  TempDir dir;
  auto r =
      run_cli({"run", "--nproc-per-node", "2", "--max-restarts", "3", "--log-dir", dir.str(),
               "--rdzv-id", "again", "--", "/bin/sh", "-c",
               R"(echo "$RANK:$TORCHELASTIC_RESTART_COUNT:$MASTER_PORT" >> )" + dir.str() +
                   R"(/rounds; [ "$RANK$TORCHELASTIC_RESTART_COUNT" = 10 ] && exit 7; exit 0)"},
              {}, 20s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.status.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "[default] Worker group FAILED. 3/3 attempts left")) << r.err;
  EXPECT_TRUE(contains(r.err, "restart_count=0")) << r.err;
  EXPECT_TRUE(contains(r.err, "restart_count=1")) << r.err;
  EXPECT_FALSE(contains(r.err, "restart_count=2")) << r.err;
  EXPECT_TRUE(contains(r.err, "global_ranks=[0, 1]")) << r.err;
  EXPECT_FALSE(contains(r.err, "Root Cause")) << "no summary when a restart succeeds: " << r.err;
  const std::string rounds = read_file(dir.path() / "rounds");
  EXPECT_TRUE(contains(rounds, "0:1:") && contains(rounds, "1:1:")) << rounds;
  // Each round's output goes to its own attempt folder.
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "again" / "attempt_0" / "1" / "stdout.log"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "again" / "attempt_1" / "1" / "stdout.log"));
}

TEST(LauncherCli, ExhaustedRestartsExitWithTheSummary) {
  auto r = run_cli({"run", "--nproc-per-node", "2", "--max-restarts", "2", "--", "/bin/sh", "-c",
                    R"([ "$RANK" = 1 ] && exit 4; exec sleep 30)"},
                   {}, 30s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.status.exit_code, 4) << r.err;
  EXPECT_TRUE(contains(r.err, "2/2 attempts left")) << r.err;
  EXPECT_TRUE(contains(r.err, "1/2 attempts left")) << r.err;
  EXPECT_TRUE(contains(r.err, "restart_count=2")) << r.err;
  EXPECT_FALSE(contains(r.err, "0/2 attempts left")) << r.err;
  EXPECT_TRUE(contains(r.err, "Root Cause (first observed failure)")) << r.err;
  EXPECT_TRUE(contains(r.err, "rank      : 1 (local_rank: 1)")) << r.err;
}

TEST(LauncherCli, RestartsBackOffAndASignalEndsTheWait) {
  auto r = run_cli({"run", "--nproc-per-node", "1", "--max-restarts", "2", "--restart-backoff",
                    "0.5", "--", "/bin/sh", "-c", "exit 3"},
                   {}, 30s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.status.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "Restarting the worker group in 0.5 s (restart 1 of 2)")) << r.err;
  EXPECT_TRUE(contains(r.err, "Restarting the worker group in 1.0 s (restart 2 of 2)")) << r.err;
  EXPECT_GE(r.elapsed, 1500ms);
  EXPECT_LT(r.elapsed, 15s);

  // A long backoff ends at SIGTERM.
  Subprocess agent(
      SubprocessOptions{.argv = {kCli, "run", "--max-restarts", "3", "--restart-backoff", "60",
                                 "--", "/bin/sh", "-c", "exit 3"}});
  std::string err;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!contains(err, "Restarting the worker group in 60.0 s") &&
         std::chrono::steady_clock::now() < deadline) {
    pollfd p{.fd = agent.stderr_fd(), .events = POLLIN, .revents = 0};
    char buf[4096];
    if (::poll(&p, 1, 50) > 0) {
      const ssize_t n = ::read(agent.stderr_fd(), buf, sizeof buf);
      if (n > 0) err.append(buf, static_cast<std::size_t>(n));
    }
  }
  ASSERT_TRUE(contains(err, "Restarting the worker group in 60.0 s")) << err;
  const auto signalled = std::chrono::steady_clock::now();
  agent.send_signal(SIGTERM);
  auto o = mptest::collect(agent, 20s);
  ASSERT_FALSE(o.timed_out) << o.err;
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, 5s);
  EXPECT_EQ(o.status.exit_code, 3) << err << o.err;
  EXPECT_TRUE(contains(err + o.err, "while waiting to restart")) << err << o.err;
}

TEST(LauncherCli, SignalToTheAgentStopsWithoutRestarting) {
  Subprocess agent(
      SubprocessOptions{.argv = {kCli, "run", "--nproc-per-node", "2", "--max-restarts", "3", "--",
                                 "/bin/sh", "-c", "echo up; exec sleep 30"}});
  // Wait until both ranks are up, then interrupt the agent.
  std::string seen;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  char buf[4096];
  while (!(contains(seen, "[rank0]: up") && contains(seen, "[rank1]: up")) &&
         std::chrono::steady_clock::now() < deadline) {
    pollfd p{.fd = agent.stdout_fd(), .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 50) > 0) {
      const ssize_t n = ::read(agent.stdout_fd(), buf, sizeof buf);
      if (n > 0) seen.append(buf, static_cast<std::size_t>(n));
    }
  }
  ASSERT_TRUE(contains(seen, "[rank0]: up") && contains(seen, "[rank1]: up")) << seen;
  agent.send_signal(SIGTERM);
  auto r = mptest::collect(agent, 15s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.status.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_FALSE(contains(r.err, "restart_count=1")) << r.err;
}

TEST(LauncherCli, SigkilledRankGives137) {
  auto r = run_cli({"run", "--nproc-per-node", "2", "--", "/bin/sh", "-c",
                    R"(if [ "$RANK" = 0 ]; then kill -9 $$; fi; exec sleep 30)"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.status.exit_code, 137) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m,
                                std::regex(R"(Root Cause[^\n]*\n\[\d\]:\n(.*\n)*)"
                                           R"(  exitcode  : -9 \(pid: (\d+)\)\n)")))
      << r.err;
  EXPECT_TRUE(contains(r.err, "traceback : Signal 9 (SIGKILL) received by PID " + m[2].str()))
      << r.err;
}

TEST(LauncherCli, ProgramNotFound) {
  auto r = run_cli({"run", "--nproc-per-node", "2", "--", "ty-no-such-program"});
  EXPECT_NE(r.status.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "Could not start 'ty-no-such-program': No such file or directory"))
      << r.err;
}

TEST(LauncherCli, PythonScriptWithoutInterpreterGetsAHint) {
  auto r = run_cli({"run", "ty_missing_train.py"});
  EXPECT_NE(r.status.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "Could not start 'ty_missing_train.py'")) << r.err;
  EXPECT_TRUE(contains(r.err, "trainyard run -- python3 ty_missing_train.py")) << r.err;
}

TEST(LauncherCli, BadFlagsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> parts;  // each must appear in stderr
  };
  const std::vector<Case> cases = {
      {{"run", "--nproc-per-node", "0", "--", "/bin/true"}, {"--nproc-per-node", "'0'", "HINT"}},
      {{"run", "--nproc_per_node", "two", "/bin/true"}, {"--nproc-per-node", "'two'"}},
      {{"run", "--nproc-per-node", "2"}, {"needs a program to launch"}},
      {{"run", "--nnodes", "2", "/bin/true"}, {"--nnodes 2", "static rendezvous", "--node-rank"}},
      {{"run", "--nnodes", "1:4", "/bin/true"}, {"--nnodes 1:4", "elastic"}},
      {{"run", "--nnodes", "0", "/bin/true"}, {"--nnodes", "'0'"}},
      {{"run", "--rdzv-backend", "etcd", "/bin/true"}, {"--rdzv-backend etcd", "--rdzv-endpoint"}},
      {{"run", "--rdzv-backend", "zookeeper", "/bin/true"}, {"--rdzv-backend", "'zookeeper'"}},
      {{"run", "--master-port", "70000", "/bin/true"}, {"--master-port", "'70000'"}},
      {{"run", "--rdzv-backend", "c10d", "--rdzv-conf", "bogus=1", "/bin/true"},
       {"Unknown --rdzv-conf key 'bogus'"}},
      {{"run", "--rdzv-backend", "c10d", "--rdzv-conf", "join_timeout=-1", "/bin/true"},
       {"join_timeout", "'-1'"}},
      {{"run", "--rdzv-conf", "join_timeout=5", "/bin/true"}, {"--rdzv-conf", "static"}},
      {{"run", "--rdzv-backend", "c10d", "--nnodes", "1:2", "--node-rank", "1", "--rdzv-endpoint",
        "127.0.0.1:1", "/bin/true"},
       {"--node-rank is for the static rendezvous"}},
      {{"run", "--standalone", "--nnodes", "2", "/bin/true"}, {"--standalone", "--nnodes"}},
      {{"run", "--node-rank", "1", "/bin/true"}, {"--node-rank 1", "--nnodes 1"}},
  };
  for (const auto& c : cases) {
    auto r = run_cli(c.args);
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    EXPECT_NE(r.status.exit_code, 0) << joined;
    for (const auto& part : c.parts) EXPECT_TRUE(contains(r.err, part)) << joined << "\n" << r.err;
  }
}

TEST(LauncherCli, FlagsFromPetEnvironmentAndUnderscoreSpellings) {
  TempDir dir;
  const std::string script = R"(echo "$RANK $WORLD_SIZE $TORCHELASTIC_RUN_ID" > "$OUTDIR/r$RANK")";
  auto r = run_cli({"run", "--", "/bin/sh", "-c", script},
                   {{"PET_NPROC_PER_NODE", "3"}, {"PET_RDZV_ID", "pet-id"}, {"OUTDIR", dir.str()}});
  ASSERT_EQ(r.status.exit_code, 0) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    // Built with +=: GCC 12 warns (-Wrestrict, a false positive) on "r" + std::to_string(rank).
    std::string file = "r";
    file += std::to_string(rank);
    EXPECT_EQ(read_file(dir.path() / file), std::to_string(rank) + " 3 pet-id\n");
  }
  // A flag wins over its variable; the underscore spelling works too.
  r = run_cli({"run", "--nproc_per_node=2", "--rdzv_id", "flag-id", "--", "/bin/sh", "-c", script},
              {{"PET_NPROC_PER_NODE", "3"}, {"OUTDIR", dir.str()}});
  ASSERT_EQ(r.status.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(dir.path() / "r1"), "1 2 flag-id\n");
  // A bad variable is reported like a bad flag.
  r = run_cli({"run", "/bin/true"}, {{"PET_NPROC_PER_NODE", "0"}});
  EXPECT_NE(r.status.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "--nproc-per-node")) << r.err;
  EXPECT_TRUE(contains(r.err, "PET_NPROC_PER_NODE")) << r.err;
}

// --dry-run: what each engine's variables resolve to, one `key: value (from SOURCE)` a line, and
// nothing started; a flag wins over an engine's variable; contradicting variables are an error.
TEST(LauncherCli, DryRunPrintsWhatEachEngineResolvesToAndFromWhere) {
  struct Case {
    std::map<std::string, std::string> env;
    std::vector<std::string> flags;
    std::vector<std::string> lines;
  };
  const std::vector<Case> cases = {
      {{},
       {},
       {"engine: torchrun flags (from no engine's variables)\n", "nnodes: 1 (from default)\n",
        "rdzv_backend: static (from default)\n"}},
      {{{"SLURM_JOB_ID", "4242"},
        {"SLURM_NNODES", "3"},
        {"SLURM_NODEID", "1"},
        {"SLURM_JOB_NODELIST", "node[07-08],gpu1"}},
       {},
       {"engine: slurm (from SLURM_JOB_ID)\n", "nnodes: 3 (from SLURM_NNODES)\n",
        "node_rank: 1 (from SLURM_NODEID)\n",
        "rdzv_endpoint: node07:29500 (from the first host of SLURM_JOB_NODELIST, port default)\n",
        "run_id: 4242 (from SLURM_JOB_ID)\n"}},
      {{{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
        {"PET_NNODES", "2"},
        {"PET_NPROC_PER_NODE", "cpu"},
        {"PET_NODE_RANK", "1"},
        {"PET_MASTER_ADDR", "job-node-0-0.job"},
        {"PET_MASTER_PORT", "29500"}},
       {},
       {"engine: kubeflow (from PET_* variables)\n", "nnodes: 2 (from PET_NNODES)\n",
        "rdzv_endpoint: job-node-0-0.job:29500 (from PET_MASTER_ADDR, port PET_MASTER_PORT)\n"}},
      {{{"SKYPILOT_NODE_IPS", "198.18.0.1\n198.18.0.2"},
        {"SKYPILOT_NODE_RANK", "1"},
        {"SKYPILOT_NUM_NODES", "2"},
        {"SKYPILOT_NUM_GPUS_PER_NODE", "0"}},
       {"--nproc-per-node", "2"},
       {"engine: skypilot (from SKYPILOT_NODE_RANK)\n",
        "nproc_per_node: 2 (from --nproc-per-node)\n",
        "rdzv_endpoint: 198.18.0.1:29500 (from the first host of SKYPILOT_NODE_IPS, port "
        "default)\n"}},
      {{{"DSTACK_MASTER_NODE_IP", "198.18.0.1"},
        {"DSTACK_NODES_IPS", "198.18.0.1\n198.18.0.2"},
        {"DSTACK_NODE_RANK", "0"},
        {"DSTACK_NODES_NUM", "2"},
        {"DSTACK_RUN_NAME", "ft"}},
       {"--nnodes", "2", "--node-rank", "1"},
       {"engine: dstack (from DSTACK_NODE_RANK)\n", "node_rank: 1 (from --node-rank)\n",
        "run_id: ft (from DSTACK_RUN_NAME)\n"}},
      // An elastic range under an engine: the first node serves a c10d rendezvous, which
      // assigns the node ranks.
      {{{"SLURM_JOB_ID", "4242"},
        {"SLURM_NNODES", "3"},
        {"SLURM_NODEID", "2"},
        {"SLURM_JOB_NODELIST", "node[07-08],gpu1"}},
       {"--nnodes", "1:3"},
       {"node_rank: assigned when the nodes meet (from the c10d rendezvous)\n",
        "rdzv_backend: c10d (from --nnodes 1:3 (elastic))\n",
        "rdzv_endpoint: node07:29400 (from the first host of SLURM_JOB_NODELIST, port 29400 "
        "(c10d's default))\n"}},
      // --standalone is one node whatever the engine says.
      {{{"SLURM_JOB_ID", "4242"},
        {"SLURM_NNODES", "3"},
        {"SLURM_NODEID", "1"},
        {"SLURM_JOB_NODELIST", "node[07-08],gpu1"}},
       {"--standalone"},
       {"nnodes: 1 (from default)\n", "node_rank: 0 (from default)\n",
        "rdzv_backend: c10d (from --standalone)\n"}},
      {{{"VC_TASK_INDEX", "0"},
        {"MASTER_ADDR", "job-master-0.job"},
        {"MASTER_PORT", "23456"},
        {"WORLD_SIZE", "2"},
        {"RANK", "1"}},
       {},
       {"engine: volcano (from VC_TASK_INDEX)\n", "nnodes: 2 (from WORLD_SIZE)\n",
        "node_rank: 1 (from RANK)\n",
        "rdzv_endpoint: job-master-0.job:23456 (from MASTER_ADDR, port MASTER_PORT)\n"}},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"run", "--dry-run"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    args.insert(args.end(), {"--", "/bin/sh", "-c", "echo started"});
    auto r = run_cli(args, {c.env.begin(), c.env.end()});
    ASSERT_EQ(r.status.exit_code, 0) << r.err;
    EXPECT_FALSE(contains(r.out, "started")) << "nothing is launched";
    for (const auto& line : c.lines) EXPECT_TRUE(contains(r.out, line)) << line << "\n" << r.out;
  }
  auto bad = run_cli({"run", "--dry-run", "--", "/bin/true"}, {{"SLURM_JOB_ID", "7"},
                                                               {"SLURM_NNODES", "2"},
                                                               {"SLURM_NODEID", "0"},
                                                               {"SLURM_JOB_NODELIST", "n[1-2]"},
                                                               {"PET_NNODES", "3"}});
  EXPECT_NE(bad.status.exit_code, 0);
  EXPECT_TRUE(contains(bad.err, "SLURM_NNODES=2 and PET_NNODES=3 disagree")) << bad.err;
}

TEST(LauncherCli, NprocPerNodeTakesAutoCpuAndGpuAsTorchrunDoes) {
  // Kubeflow Trainer v2 sets PET_NPROC_PER_NODE=auto on GPU pods; torchrun also takes cpu and gpu.
  const std::string count = std::to_string(usable_cpu_count());
  const auto gpus = cluster::detect_nvml_gpus();
  for (const char* value : {"auto", "cpu"}) {
    auto r = run_cli({"run", "--no-prefix", "--", "/bin/sh", "-c",
                      R"(if [ "$RANK" = 0 ]; then echo "world $WORLD_SIZE"; fi)"},
                     {{"PET_NPROC_PER_NODE", value}});
    ASSERT_EQ(r.status.exit_code, 0) << value << ": " << r.err;
    if (std::string(value) == "cpu" || gpus.empty()) {
      EXPECT_TRUE(contains(r.out, "world " + count + "\n")) << value << ": " << r.out;
    }
  }
  if (gpus.empty()) {
    auto r = run_cli({"run", "--nproc-per-node", "gpu", "/bin/true"});
    EXPECT_NE(r.status.exit_code, 0);
    EXPECT_TRUE(contains(r.err, "is 'gpu', but this node has no GPU")) << r.err;
  }
  auto r = run_cli({"run", "--nproc-per-node", "many", "/bin/true"});
  EXPECT_NE(r.status.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "or auto, cpu or gpu; got 'many'")) << r.err;
}

pid_t pid_in(const std::filesystem::path& file) {
  const std::string text = read_file(file);
  return text.empty() ? 0 : static_cast<pid_t>(std::stol(text));
}

// Note [No rank outlives its agent]: `sh -c 'sleep 1000 & ...'` left its sleep running, reparented
// to init, when the rank ended or its agent was killed with SIGKILL.
TEST(LauncherCli, NoProcessOutlivesItsRankOrItsKilledAgent) {
  TempDir dir;
  const auto leftover = dir.path() / "leftover";
  auto r = run_cli({"run", "--", "/bin/sh", "-c", "sleep 1000 & echo $! > \"$OUT\""},
                   {{"OUT", leftover.string()}});
  ASSERT_EQ(r.status.exit_code, 0) << r.err;
  const pid_t first = pid_in(leftover);
  ASSERT_GT(first, 0);
  EXPECT_TRUE(mptest::wait_until_dead(first, 5s)) << "the rank's background process outlived it";

  const auto orphan = dir.path() / "orphan";
  elastic::Subprocess agent(elastic::SubprocessOptions{
      .argv = {kCli, "run", "--", "/bin/sh", "-c", "sleep 1000 & echo $! > \"$OUT\"; wait"},
      .env = {{"OUT", orphan.string()}}});
  for (int i = 0; i < 400 && pid_in(orphan) <= 0; ++i) std::this_thread::sleep_for(50ms);
  ASSERT_GT(pid_in(orphan), 0);
  const pid_t second = pid_in(orphan);
  ASSERT_TRUE(mptest::process_alive(second));
  ::kill(agent.pid(), SIGKILL);  // the agent alone, not its group
  EXPECT_TRUE(mptest::wait_until_dead(second, 5s)) << "a rank's child outlived its agent's kill -9";
  if (mptest::process_alive(second)) ::kill(second, SIGKILL);
}

// The children of `parent` whose command name is `comm` (from /proc/PID/stat).
std::vector<pid_t> children_named(pid_t parent, const std::string& comm) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    const std::string stat = read_file(entry.path() / "stat");
    const auto open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != "Z" && stat.substr(open + 1, close - open - 1) == comm)
      out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// Note [No rank outlives its agent]: the reaper killed first (it has a process group of its own)
// is replaced while the ranks run, so a kill -9 of the agent after it still kills a rank's child.
TEST(LauncherCli, AKilledReaperIsReplacedAndTheAgentsKillStillLeavesNoOrphan) {
  TempDir dir;
  const auto orphan = dir.path() / "orphan";
  elastic::Subprocess agent(elastic::SubprocessOptions{
      .argv = {kCli, "run", "--", "/bin/sh", "-c", "sleep 1000 & echo $! > \"$OUT\"; wait"},
      .env = {{"OUT", orphan.string()}}});
  for (int i = 0; i < 400 && pid_in(orphan) <= 0; ++i) std::this_thread::sleep_for(50ms);
  const pid_t sleeper = pid_in(orphan);
  ASSERT_GT(sleeper, 0);
  const auto reapers = children_named(agent.pid(), "trainyard");
  ASSERT_EQ(reapers.size(), 1u) << "the agent's one reaper";
  ::kill(reapers[0], SIGKILL);
  std::vector<pid_t> next;
  for (int i = 0; i < 100; ++i) {
    next = children_named(agent.pid(), "trainyard");
    if (next.size() == 1 && next[0] != reapers[0]) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(next.size(), 1u);
  EXPECT_NE(next[0], reapers[0]) << "no new reaper";
  ::kill(agent.pid(), SIGKILL);
  EXPECT_TRUE(mptest::wait_until_dead(sleeper, 5s))
      << "a rank's child outlived its agent's kill -9 after its reaper's";
  if (mptest::process_alive(sleeper)) ::kill(sleeper, SIGKILL);
  const RunOutput out = mptest::collect(agent, 5s);
  EXPECT_TRUE(contains(out.err + out.out, "The reaper of the ranks' process groups (pid " +
                                              std::to_string(reapers[0]) + ") ended with signal 9"))
      << out.err;
}

TEST(PlanCli, ZeroAndHugeValuesAreErrorsNamingTheFlag) {
  // --seq-len 0 and --nodes 0 were silently taken as "not given".
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--seq-len", "0"}, "--seq-len must be >= 2"},
      {{"--nodes", "0"}, "--nodes must be >= 1, got 0"},
      {{"--params", "1e30"}, "more than trainyard can count"},
      {{"--params", "0.1"}, "fewer than one parameter"}};
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {"plan", "--params", "7e9"};
    if (flags[0] == "--params") args.resize(1);
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = run_cli(args);
    EXPECT_NE(r.status.exit_code, 0) << flags[0];
    EXPECT_TRUE(contains(r.err, message)) << flags[0] << ": " << r.err;
  }
  EXPECT_EQ(
      run_cli({"plan", "--params", "7e9", "--seq-len", "2048", "--nodes", "1"}).status.exit_code,
      0);
}

TEST(LauncherCli, ProgramArgumentsPassThroughUntouched) {
  auto r = run_cli({"run", "--no-prefix", "/bin/sh", "-c", R"(printf '[%s]' "$@")", "sh",
                    "--nnodes", "7", "--", "-x"});
  ASSERT_EQ(r.status.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[--nnodes][7][--][-x]\n");
}

TEST(LauncherCli, StaticMultiNodeLaunchesThisNodesShare) {
  TempDir dir;
  auto r = run_cli(
      {"run", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--rdzv-backend",
       "static", "--master-addr", "127.0.0.1", "--master-port", "29555", "--", "/bin/sh", "-c",
       R"(echo "$RANK $LOCAL_RANK $WORLD_SIZE $GROUP_RANK $MASTER_PORT" > "$OUTDIR/r$RANK")"},
      {{"OUTDIR", dir.str()}});
  ASSERT_EQ(r.status.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(dir.path() / "r2"), "2 0 4 1 29555\n");
  EXPECT_EQ(read_file(dir.path() / "r3"), "3 1 4 1 29555\n");
}

// `trainyard run` with two ranks that write their pids to dir/pid<RANK> and sleep.
Subprocess start_sleeping_ranks(const TempDir& dir) {
  return Subprocess(
      SubprocessOptions{.argv = {kCli, "run", "--nproc-per-node", "2", "--", "/bin/sh", "-c",
                                 R"(echo $$ > "$OUTDIR/pid$RANK"; exec sleep 30)"},
                        .env = {{"OUTDIR", dir.str()}}});
}

// The ranks' pids, once both files exist (empty when they do not appear within 5 s).
std::vector<int> rank_pids(const TempDir& dir) {
  const std::vector<std::filesystem::path> files = {dir.path() / "pid0", dir.path() / "pid1"};
  std::vector<int> pids;
  if (!mptest::wait_for_files(files, 5s)) return pids;
  for (const auto& f : files) pids.push_back(std::stoi(read_file(f)));
  return pids;
}

TEST(LauncherCli, SigintStopsTheRanks) {
  TempDir dir;
  Subprocess cli = start_sleeping_ranks(dir);
  const auto pids = rank_pids(dir);
  ASSERT_EQ(pids.size(), 2u) << "the ranks did not start";
  ASSERT_EQ(kill(cli.pid(), SIGINT), 0);
  auto r = mptest::collect(cli, 10s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status.exit_code, 130) << r.err;
  EXPECT_LT(r.elapsed, 9s) << "SIGINT must stop the ranks, which would sleep 30 s";
  EXPECT_TRUE(contains(r.err, "Signal 2 (SIGINT) received by the launcher")) << r.err;
  for (int pid : pids) EXPECT_TRUE(mptest::wait_until_dead(pid, 2s)) << "rank pid " << pid;
}

TEST(LauncherCli, RanksDieWithTheLauncher) {
  TempDir dir;
  Subprocess cli = start_sleeping_ranks(dir);
  const auto pids = rank_pids(dir);
  ASSERT_EQ(pids.size(), 2u) << "the ranks did not start";
  ASSERT_EQ(kill(cli.pid(), SIGKILL), 0);  // no chance to clean up: PR_SET_PDEATHSIG must
  ASSERT_TRUE(cli.wait_for(5s).has_value());
  for (int pid : pids) {
    EXPECT_TRUE(mptest::wait_until_dead(pid, 3s)) << "rank pid " << pid << " outlived the launcher";
    if (mptest::process_alive(pid)) kill(pid, SIGKILL);  // leave nothing behind even on failure
  }
}

// --- PyTorch ---------------------------------------------------------------------------------

TEST(LauncherPython, TorchDdpScriptRunsUnchanged) {
  auto probe = run_program({TRAINYARD_PYTHON, "-c",
                            "import torch.distributed as d; "
                            "assert d.is_available()"},
                           {}, 60s);
  if (probe.timed_out || !probe.status.success()) {
    TY_MISSING_PREREQUISITE(
        TRAINYARD_PYTHON " cannot import torch.distributed (scripts/setup.sh installs torch): "
        << probe.err);
  }
  const std::string script = std::string(TRAINYARD_TEST_HELPERS_DIR) + "/python_ddp.py";
  auto r = run_cli({"run", "--nproc-per-node", "2", "--", TRAINYARD_PYTHON, script}, {}, 50s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.status.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[rank" + std::to_string(rank) + "]: ";
    EXPECT_TRUE(contains(r.out, p + "rank " + std::to_string(rank) +
                                    "/2 all_reduce sum=3 ddp_matches_full_batch=True\n"))
        << r.out << r.err;
  }
}

}  // namespace
}  // namespace trainyard::elastic
