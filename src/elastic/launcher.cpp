#include "trainyard/elastic/launcher.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "elastic/line_forwarder.h"
#include "trainyard/comm/dist_env.h"
#include "trainyard/elastic/rendezvous.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"

namespace trainyard::elastic {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The monitor wakes at least this often to reap ranks and check deadlines.
constexpr milliseconds kPollInterval{50};
// How long ranks get to die after SIGKILL before the launcher stops waiting for them.
constexpr milliseconds kKillWait{5000};
// Bytes read from one pipe per wake-up (fairness between ranks), and when a rank exits.
constexpr std::size_t kReadPerWake = 256 << 10;
constexpr std::size_t kReadAtExit = 4 << 20;
constexpr int kMaxLocalRanks = 4096;
constexpr const char* kTracebackHint =
    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";

// --- signals ----------------------------------------------------------------------------------

// Note [Launcher signals]: the handler only writes the signal number into a self-pipe; the monitor
// polls the read end with the ranks' pipes, so a signal wakes it without races.
std::atomic<int> g_signal_pipe{-1};  // write end, -1 when no launch() is running
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_launcher_signal(int sig) {
  const int saved_errno = errno;
  const int fd = g_signal_pipe.load();
  const auto byte = static_cast<unsigned char>(sig);
  if (fd >= 0) {
    [[maybe_unused]] ssize_t n = ::write(fd, &byte, 1);  // a full pipe already holds a wake-up
  }
  errno = saved_errno;
}

// Installs the handlers for the duration of a launch and restores the previous ones after.
class SignalScope {
 public:
  SignalScope() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw Error(
          detail::concat("Could not create the launcher's signal pipe: ", std::strerror(errno)));
    }
    read_.reset(fds[0]);
    write_.reset(fds[1]);
    int expected = -1;
    if (!g_signal_pipe.compare_exchange_strong(expected, write_.get())) {
      throw Error("launch() is already running in this process; run one launch at a time.");
    }
    struct sigaction action {};
    action.sa_handler = on_launcher_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (std::size_t i = 0; i < kStopSignals.size(); ++i) {
      sigaction(kStopSignals[i], &action, &previous_[i]);
    }
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &previous_pipe_);
  }

  ~SignalScope() {
    for (std::size_t i = 0; i < kStopSignals.size(); ++i) {
      sigaction(kStopSignals[i], &previous_[i], nullptr);
    }
    sigaction(SIGPIPE, &previous_pipe_, nullptr);
    g_signal_pipe.store(-1);
  }

  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  int fd() const { return read_.get(); }

  // The next signal received, or 0.
  int take() {
    unsigned char byte = 0;
    ssize_t n;
    do {
      n = ::read(read_.get(), &byte, 1);
    } while (n < 0 && errno == EINTR);
    return n == 1 ? byte : 0;
  }

 private:
  static constexpr std::array<int, 4> kStopSignals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  UniqueFd read_;
  UniqueFd write_;
  std::array<struct sigaction, 4> previous_{};
  struct sigaction previous_pipe_ {};
};

// --- setup ------------------------------------------------------------------------------------

void validate(const LaunchOptions& o) {
  TY_CHECK(!o.command.empty() && !o.command.front().empty(),
           "LaunchOptions.command is empty; give the program to run and its arguments.");
  TY_CHECK(o.nproc_per_node >= 1 && o.nproc_per_node <= kMaxLocalRanks,
           "LaunchOptions.nproc_per_node must be between 1 and ", kMaxLocalRanks, ", got ",
           o.nproc_per_node, ".");
  TY_CHECK(o.nnodes >= 1, "LaunchOptions.nnodes must be >= 1, got ", o.nnodes, ".");
  TY_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "LaunchOptions.node_rank must be in [0, ",
           o.nnodes, ") for nnodes ", o.nnodes, ", got ", o.node_rank, ".");
  TY_CHECK(static_cast<long long>(o.nnodes) * o.nproc_per_node <= (1 << 30),
           "LaunchOptions: nnodes * nproc_per_node = ", o.nnodes, " * ", o.nproc_per_node,
           " is too large a world.");
  TY_CHECK(!o.master_addr.empty(), "LaunchOptions.master_addr is empty.");
  TY_CHECK(o.master_port != 0 || o.nnodes == 1 || o.rendezvous,
           "LaunchOptions.master_port 0 (pick a free port) cannot work across nnodes = ", o.nnodes,
           " nodes: each would pick its own. HINT: give every node the same port.");
  TY_CHECK(o.max_restarts >= 0, "LaunchOptions.max_restarts must be >= 0, got ", o.max_restarts,
           ".");
  TY_CHECK(o.term_timeout.count() >= 0, "LaunchOptions.term_timeout must be >= 0 ms, got ",
           o.term_timeout.count(), " ms.");
  TY_CHECK(!o.role.empty(), "LaunchOptions.role is empty.");
  TY_CHECK(o.hang_timeout.count() >= 0, "LaunchOptions.hang_timeout must be >= 0 ms (0: off), got ",
           o.hang_timeout.count(), " ms.");
  for (const auto& [key, value] : o.extra_env) {
    TY_CHECK(!key.empty() && key.find('=') == std::string::npos,
             "LaunchOptions.extra_env has a bad variable name '", key, "' (empty, or with '=').");
  }
  TY_CHECK(!o.run_id.empty(), "LaunchOptions.run_id is empty.");
  TY_CHECK(o.log_dir.empty() ||
               (o.run_id.find('/') == std::string::npos && o.run_id != "." && o.run_id != ".."),
           "LaunchOptions.run_id '", o.run_id,
           "' names a directory under log_dir, so it cannot contain '/' or be '.' or '..'.");
}

// Binds port 0 on addr (falling back to every interface) and reads back the port the kernel chose,
// as torchrun --standalone does. The port is free now; the rank that hosts the store binds it.
std::uint16_t pick_free_port(const std::string& addr) {
  std::string failures;
  for (const char* host : {addr.c_str(), static_cast<const char*>(nullptr)}) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (int rc = getaddrinfo(host, "0", &hints, &found); rc != 0) {
      failures += detail::concat(" resolving '", host ? host : "*", "': ", gai_strerror(rc), ";");
      continue;
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, freeaddrinfo);
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      UniqueFd sock(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      sockaddr_storage bound{};
      socklen_t len = sizeof(bound);
      if (!sock.valid() || bind(sock.get(), a->ai_addr, a->ai_addrlen) != 0 ||
          getsockname(sock.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
        failures +=
            detail::concat(" binding on '", host ? host : "*", "': ", std::strerror(errno), ";");
        continue;
      }
      if (bound.ss_family == AF_INET6) {
        return ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
      }
      return ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    }
  }
  throw NetworkError(detail::concat("Could not find a free port for MASTER_PORT on '", addr,
                                    "':", failures, " HINT: pass --master-port explicitly."));
}

std::string shell_quote(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) {
    if (!out.empty()) out += ' ';
    bool plain = !a.empty() && std::all_of(a.begin(), a.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_./=:,+@%", c);
    });
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char c : a) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

UniqueFd open_log(const std::filesystem::path& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    throw Error(detail::concat("Could not open the rank log '", path.string(),
                               "': ", std::strerror(errno), ". HINT: check --log-dir."));
  }
  return fd;
}

// --- the ranks --------------------------------------------------------------------------------

struct Rank {
  int rank = 0;
  int local_rank = 0;
  Subprocess process;
  LineForwarder out;
  LineForwarder err;
  std::optional<RankExit> exit;
  bool stopped_by_launcher = false;
  std::optional<HeartbeatFile> heartbeat;  // when the hang watchdog is on
  milliseconds hang_silence{0};            // > 0: stopped by the watchdog
};

// A private folder for one round's heartbeat files (Note [Hang watchdog]), removed with it: in
// /dev/shm when it is there (the files are written often; no disk behind them), else $TMPDIR.
class HeartbeatDir {
 public:
  HeartbeatDir() {
    std::string base = "/dev/shm";
    if (::access(base.c_str(), W_OK | X_OK) != 0) {
      const char* tmp = std::getenv("TMPDIR");
      base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    }
    std::string pattern = base + "/trainyard-heartbeat-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw Error(detail::concat("Could not create a folder for the ranks' heartbeat files in ",
                                 base, ": ", std::strerror(errno),
                                 ". HINT: set TMPDIR to a writable folder, or turn the hang "
                                 "watchdog off with --hang-timeout 0."));
    }
    path_ = pattern;
  }
  ~HeartbeatDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  HeartbeatDir(const HeartbeatDir&) = delete;
  HeartbeatDir& operator=(const HeartbeatDir&) = delete;

  std::string file(int local_rank) const { return detail::concat(path_, "/rank_", local_rank); }

 private:
  std::string path_;
};

// Where this node's ranks stand in one round: given by the flags (static) or by the rendezvous.
struct RoundSpec {
  int restart_count = 0;
  int group_rank = 0;
  int group_world_size = 1;
  int rank_offset = 0;  // global rank of local rank 0
  int world_size = 1;
  std::string master_addr;
  std::uint16_t master_port = 0;
};

std::vector<std::pair<std::string, std::string>> rank_env(const LaunchOptions& o,
                                                          const RoundSpec& round,
                                                          int local_rank,
                                                          const std::string& heartbeat_file) {
  const int world_size = round.world_size;
  const std::string rank = std::to_string(round.rank_offset + local_rank);
  std::vector<std::pair<std::string, std::string>> env = {
      {"RANK", rank},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(round.group_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(round.group_world_size)},
      {"ROLE_RANK", rank},
      {"ROLE_NAME", o.role},
      {"ROLE_WORLD_SIZE", std::to_string(world_size)},
      {"MASTER_ADDR", round.master_addr},
      {"MASTER_PORT", std::to_string(round.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(round.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"PYTHONUNBUFFERED", "1"},
      // Empty when the watchdog is off, so that no rank beats into an outer launcher's file.
      {kHeartbeatFileEnv, heartbeat_file},
  };
  // torchrun's default: one OpenMP thread per rank when several share the node.
  if (std::getenv("OMP_NUM_THREADS") == nullptr && o.nproc_per_node > 1) {
    env.emplace_back("OMP_NUM_THREADS", "1");
  }
  if (isatty(STDOUT_FILENO)) env.emplace_back("TRAINYARD_TTY", "1");
  // Across nodes, the workers' Gloo sockets bind to the address the other nodes reach.
  if (o.rendezvous && std::getenv("GLOO_SOCKET_IFNAME") == nullptr &&
      std::getenv("TRAINYARD_BIND_ADDR") == nullptr) {
    env.emplace_back("TRAINYARD_BIND_ADDR", o.rendezvous->options().local_addr);
  }
  env.insert(env.end(), o.extra_env.begin(), o.extra_env.end());
  return env;
}

Rank start_rank(const LaunchOptions& o,
                const RoundSpec& round,
                int local_rank,
                const HeartbeatDir* heartbeat_dir,  // nullptr: the watchdog is off
                OutputSink* out,
                OutputSink* err) {
  const int rank = round.rank_offset + local_rank;
  UniqueFd out_log, err_log;
  if (!o.log_dir.empty()) {
    auto dir = std::filesystem::path(o.log_dir) / o.run_id /
               detail::concat("attempt_", round.restart_count) / std::to_string(local_rank);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      throw Error(detail::concat("Could not create the log directory '", dir.string(),
                                 "': ", ec.message(), ". HINT: check --log-dir."));
    }
    out_log = open_log(dir / "stdout.log");
    err_log = open_log(dir / "stderr.log");
  }
  const std::string prefix = o.prefix_output ? detail::concat("[rank", rank, "]: ") : "";
  std::optional<HeartbeatFile> heartbeat;
  if (heartbeat_dir != nullptr) heartbeat.emplace(heartbeat_dir->file(local_rank));
  Subprocess process(
      SubprocessOptions{.argv = o.command,
                        .env = rank_env(o, round, local_rank, heartbeat ? heartbeat->path() : ""),
                        .destructor_term_timeout = o.term_timeout});
  return Rank{.rank = rank,
              .local_rank = local_rank,
              .process = std::move(process),
              .out = LineForwarder(prefix, out, std::move(out_log)),
              .err = LineForwarder(prefix, err, std::move(err_log)),
              .exit = std::nullopt,
              .stopped_by_launcher = false,
              .heartbeat = std::move(heartbeat)};
}

// --- the summary ------------------------------------------------------------------------------

std::string format_list(int first, int count, int step = 1, int value = -1) {
  std::string out = "[";
  for (int i = 0; i < count; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(value >= 0 ? value : first + i * step);
  }
  return out + "]";
}

// What torchrun prints when a round's workers are assigned their ranks.
std::string format_round(const LaunchOptions& o, const RoundSpec& round) {
  const int world = round.world_size;
  const int first = round.rank_offset;
  const int n = o.nproc_per_node;
  return fmt::format(
      "[{}] Rendezvous complete for workers. Result:\n"
      "  restart_count={}\n  master_addr={}\n  master_port={}\n  group_rank={}\n"
      "  group_world_size={}\n  local_ranks={}\n  role_ranks={}\n  global_ranks={}\n"
      "  role_world_sizes={}\n  global_world_sizes={}\n",
      o.role, round.restart_count, round.master_addr, round.master_port, round.group_rank,
      round.group_world_size, format_list(0, n), format_list(first, n), format_list(first, n),
      format_list(0, n, 0, world), format_list(0, n, 0, world));
}

std::string format_time(std::chrono::system_clock::time_point t) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  localtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "<unknown>";
  return buf;
}

std::string format_seconds(milliseconds d) {
  return fmt::format("{:.1f} s", static_cast<double>(d.count()) / 1000.0);
}

// One entry of torchrun's failure list. `traceback` replaces the default text (torchrun's link
// to its error docs, or the signal) when not empty.
std::string format_failure(int idx,
                           const RankExit& e,
                           const std::string& host,
                           const std::string& indent,
                           std::string traceback = {}) {
  const std::string signal =
      detail::concat("Signal ", e.signal, " (", signal_name(e.signal), ") received by PID ", e.pid);
  if (!traceback.empty()) {
    // set by the caller
  } else if (e.hang_silence.count() > 0) {
    traceback = detail::concat("hung: no progress for ", format_seconds(e.hang_silence),
                               "; stopped by the launcher (",
                               e.signal != 0 ? signal : "it then exited", ")");
  } else {
    traceback = e.signal != 0 ? signal : kTracebackHint;
  }
  return fmt::format(
      "{0}[{1}]:\n"
      "{0}  time      : {2}\n"
      "{0}  host      : {3}\n"
      "{0}  rank      : {4} (local_rank: {5})\n"
      "{0}  exitcode  : {6} (pid: {7})\n"
      "{0}  error_file: <N/A>\n"
      "{0}  traceback : {8}\n",
      indent, idx, format_time(e.time), host, e.rank, e.local_rank,
      e.signal != 0 ? -e.signal : e.exit_code, e.pid, traceback);
}

// The last lines a rank wrote, where a user looks first for the cause.
std::string format_last_lines(const RankExit& e) {
  if (e.last_lines.empty()) {
    return detail::concat("Rank ", e.rank, " (local rank ", e.local_rank, ", pid ", e.pid,
                          ") wrote nothing.\n");
  }
  std::string out = detail::concat("Last lines of rank ", e.rank, " (local rank ", e.local_rank,
                                   ", pid ", e.pid, "):\n");
  for (const auto& line : e.last_lines) out += detail::concat("[rank", e.rank, "]: ", line, "\n");
  return out;
}

// torchrun's ChildFailedError report: the other failures, then the root cause; then, below
// torchrun's shape, the root cause's own last lines.
std::string format_summary(const LaunchOptions& o,
                           const LaunchResult& result,
                           std::chrono::system_clock::time_point signal_time) {
  const std::string host = host_name();
  const std::string border(60, '='), section(60, '-');
  const int count = static_cast<int>(result.exits.size());
  const bool has_failure = result.first_failure >= 0 && result.first_failure < count;
  // See Note [Early exit]: a rank that left early with status 0 caused the failure that followed.
  const bool early = has_failure && result.early_exit >= 0 && result.early_exit < count;
  const int root_index = early ? result.early_exit : result.first_failure;
  std::string others, root;
  int idx = 0;
  for (int i = 0; i < count; ++i) {
    const RankExit& e = result.exits[i];
    if (i == root_index && early) {
      const RankExit& failed = result.exits[result.first_failure];
      const auto gap = std::chrono::duration_cast<milliseconds>(failed.time - e.time);
      root = format_failure(
          idx++, e, host, "",
          detail::concat("exited early with status 0 while the others were still running; rank ",
                         failed.rank, "'s failure ", format_seconds(gap),
                         " later followed from it"));
    } else if (i == root_index) {
      root = format_failure(idx++, e, host, "");
    } else if (e.failed()) {
      others += format_failure(idx++, e, host, "  ");
    }
  }
  if (others.empty()) others = "  <NO_OTHER_FAILURES>\n";
  std::string last_lines;
  if (root.empty()) {
    root = detail::concat("[launcher]:\n  time      : ", format_time(signal_time),
                          "\n  host      : ", host, "\n  traceback : Signal ",
                          result.received_signal, " (", signal_name(result.received_signal),
                          ") received by the launcher (PID ", getpid(),
                          "), which stopped every rank\n");
  } else {
    if (early) last_lines = format_last_lines(result.exits[result.first_failure]);
    last_lines += format_last_lines(result.exits[root_index]);
    last_lines = section + "\n" + last_lines;
  }
  return detail::concat(border, "\n", std::filesystem::path(o.command.front()).filename().string(),
                        " FAILED\n", section, "\nFailures:\n", others, section,
                        "\nRoot Cause (first observed failure):\n", root, last_lines, border, "\n");
}

// --- the monitor ------------------------------------------------------------------------------

// Note [Hang watchdog]: a rank that stops making progress (SIGSTOP, a deadlock, a kernel or file
// system that never returns) does not exit, so reaping alone never notices it, and its peers wait
// in collectives until the collective timeout. So ranks report progress: the launcher creates one
// heartbeat file per rank and round (HeartbeatDir, $TRAINYARD_HEARTBEAT_FILE) and the rank calls
// trainyard::heartbeat() (heartbeat.h), which stores the time into the mapped file, from
//   - the training loop (each step, each evaluation batch, around checkpoint saves),
//   - inside waits on peers: ShmProcessGroup's barrier slices and wait_work() around Gloo work,
//     so a rank waiting for a hung peer keeps beating and the hung peer alone falls silent,
//   - inside bounded storage waits: an S3 request retrying within its retry_deadline, so a short
//     S3 outage is ridden out instead of being taken for a hang (a frozen file system is not
//     bounded, and its silence is reported).
// Every poll the monitor reads the files; a rank that has beaten at least once and then is silent
// for longer than LaunchOptions::hang_timeout is reported by rank, pid and seconds, and treated as
// that rank's failure: it is the root cause, the group is stopped and restarted while restarts
// are left. The stop sends SIGCONT after SIGTERM, so a stopped process takes its SIGTERM at once
// instead of waiting out term_timeout. A rank that never beats (any other program) is not
// watched, and neither is the time before a rank's first beat (start-up, data loading, the
// rendezvous: those have their own timeouts).
//
// Note [Early exit]: a rank that exits with status 0 is normal at the end of a job, when every
// rank finishes at about the same time. But a rank that leaves while the others still train (a
// user's bug: a return in the wrong place) makes the others fail ("Connection closed by peer", a
// dead shared-memory peer, or a hang), and torchrun's summary then blames a survivor. So the first
// rank that exits 0 while others still run is remembered; if a failure (or a hang) follows in the
// same round, that early exit is reported as the root cause, with the failure that followed it.

// Watches the ranks: forwards their output, reaps them, watches their heartbeats, and on the first
// failure or hang (or a signal to the launcher) stops the rest: SIGTERM (and SIGCONT), then
// SIGKILL after term_timeout, then gives up after kKillWait. Every wait is bounded by those
// deadlines.
class Monitor {
 public:
  // Hooks for the elastic agent: `on_failure` runs once, at the first failure, before the other
  // ranks are stopped; `on_signal` likewise at the first signal; `should_stop` is asked every
  // kPollInterval while the ranks run and stops them (without it counting as a failure) when it
  // answers true.
  struct Hooks {
    std::function<void()> on_failure;
    std::function<void()> on_signal;
    std::function<bool()> should_stop;
  };

  // hang_timeout 0: no hang watchdog.
  Monitor(std::vector<Rank>& ranks,
          SignalScope& signals,
          milliseconds term_timeout,
          milliseconds hang_timeout,
          Hooks hooks)
      : ranks_(ranks),
        signals_(signals),
        term_timeout_(term_timeout),
        hang_timeout_(hang_timeout),
        hooks_(std::move(hooks)) {}

  void run() {
    while (std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return !r.exit; })) {
      wait_and_pump();
      for (Rank& r : ranks_) {
        if (!r.exit) reap(r);
      }
      if (phase_ == Phase::kRunning) check_progress();
      if (phase_ == Phase::kRunning && hooks_.should_stop && hooks_.should_stop()) {
        stopped_by_hook_ = true;
        stop();
      }
      check_deadline();
    }
  }

  bool stopped_by_hook() const { return stopped_by_hook_; }
  int first_failure() const { return first_failure_; }
  int early_exit() const { return early_exit_; }
  int received_signal() const { return received_signal_; }
  std::chrono::system_clock::time_point signal_time() const { return signal_time_; }

 private:
  enum class Phase { kRunning, kStopping, kKilling };

  void wait_and_pump() {
    std::vector<pollfd> fds{{.fd = signals_.fd(), .events = POLLIN, .revents = 0}};
    std::vector<std::pair<Rank*, bool>> owners{{nullptr, false}};  // (rank, is_stderr)
    for (Rank& r : ranks_) {
      if (r.process.stdout_fd() >= 0) {
        fds.push_back({.fd = r.process.stdout_fd(), .events = POLLIN, .revents = 0});
        owners.emplace_back(&r, false);
      }
      if (r.process.stderr_fd() >= 0) {
        fds.push_back({.fd = r.process.stderr_fd(), .events = POLLIN, .revents = 0});
        owners.emplace_back(&r, true);
      }
    }
    milliseconds timeout = kPollInterval;
    if (phase_ != Phase::kRunning) {
      auto left = std::chrono::ceil<milliseconds>(deadline_ - Clock::now());
      timeout = std::clamp(left, milliseconds(0), kPollInterval);
    }
    // See Note [Launcher signals].
    if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) return;
    if (fds[0].revents != 0) {
      while (int sig = signals_.take()) on_signal(sig);
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto [rank, is_err] = owners[i];
      if (!pump(fds[i].fd, is_err ? rank->err : rank->out, kReadPerWake)) {
        is_err ? rank->process.close_stderr() : rank->process.close_stdout();
      }
    }
  }

  void on_signal(int sig) {
    if (received_signal_ == 0) {
      received_signal_ = sig;
      signal_time_ = std::chrono::system_clock::now();
    }
    if (phase_ == Phase::kRunning) {
      log_->warn("Received {}; stopping all ranks.", signal_name(sig));
      if (hooks_.on_signal) hooks_.on_signal();
      stop();
    } else if (phase_ == Phase::kStopping) {
      log_->warn("Received {} again; killing the ranks now.", signal_name(sig));
      kill();
    }
  }

  void reap(Rank& r) {
    auto status = r.process.poll();
    if (!status) return;
    // Everything the rank wrote before exiting is in the pipes now.
    for (bool is_err : {false, true}) {
      const int fd = is_err ? r.process.stderr_fd() : r.process.stdout_fd();
      LineForwarder& forwarder = is_err ? r.err : r.out;
      if (fd >= 0) pump(fd, forwarder, kReadAtExit);
      forwarder.finish();
    }
    r.process.close_stdout();
    r.process.close_stderr();
    record(r, *status);
  }

  void record(Rank& r, const ExitStatus& status) {
    auto last_lines = r.err.last_lines();
    if (last_lines.empty()) last_lines = r.out.last_lines();
    r.exit = RankExit{.rank = r.rank,
                      .local_rank = r.local_rank,
                      .pid = r.process.pid(),
                      .exit_code = status.exit_code,
                      .signal = status.signal,
                      .time = std::chrono::system_clock::now(),
                      .stopped_by_launcher = r.stopped_by_launcher,
                      .hang_silence = r.hang_silence,
                      .last_lines = std::move(last_lines)};
    if (phase_ != Phase::kRunning) return;
    if (!status.success()) {
      log_->error("Rank {} (local rank {}, pid {}) failed with {}; stopping the other ranks.",
                  r.rank, r.local_rank, r.process.pid(), status.to_string());
      fail(r);
    } else if (early_exit_candidate_ < 0 &&
               std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& o) { return !o.exit; })) {
      // See Note [Early exit].
      early_exit_candidate_ = r.local_rank;
      log_->debug("Rank {} (pid {}) exited with status 0 while other ranks still run.", r.rank,
                  r.process.pid());
    }
  }

  // The first failure (an exit or a hang) of the round: stops the group.
  void fail(Rank& r) {
    first_failure_ = r.local_rank;
    if (early_exit_candidate_ >= 0) {
      // See Note [Early exit].
      early_exit_ = early_exit_candidate_;
      const Rank& early = ranks_[static_cast<std::size_t>(early_exit_)];
      log_->error(
          "Rank {} (pid {}) had exited early with status 0 while the others were still "
          "running; rank {}'s failure followed from it.",
          early.rank, early.process.pid(), r.rank);
    }
    if (hooks_.on_failure) hooks_.on_failure();
    stop();
  }

  // See Note [Hang watchdog]. Reports the rank silent for longest, when one is past the limit.
  void check_progress() {
    if (hang_timeout_.count() == 0) return;
    const auto now = Clock::now();
    Rank* hung = nullptr;
    milliseconds longest{0};
    for (Rank& r : ranks_) {
      if (r.exit || !r.heartbeat) continue;
      const auto last = r.heartbeat->last_beat();
      if (!last) continue;  // never beaten: not watched
      const auto silent = std::chrono::duration_cast<milliseconds>(now - *last);
      if (silent > hang_timeout_ && silent > longest) {
        hung = &r;
        longest = silent;
      }
    }
    if (hung == nullptr) return;
    hung->hang_silence = longest;
    log_->error(
        "Rank {} (local rank {}, pid {}) made no progress for {} (last heartbeat at {}; hang "
        "timeout {}); stopping the worker group. HINT: it is stopped (SIGSTOP), deadlocked, or "
        "stuck in the kernel (a hung file system, a driver).",
        hung->rank, hung->local_rank, hung->process.pid(), format_seconds(longest),
        format_time(std::chrono::system_clock::now() - longest), format_seconds(hang_timeout_));
    fail(*hung);
  }

  void stop() {
    phase_ = Phase::kStopping;
    deadline_ = Clock::now() + term_timeout_;
    for (Rank& r : ranks_) {
      // Exited ranks too: their process group may hold descendants they left behind.
      if (!r.exit) r.stopped_by_launcher = true;
      r.process.send_signal(SIGTERM);
      // A stopped (SIGSTOP, SIGTSTP) process only acts on SIGTERM once continued.
      r.process.send_signal(SIGCONT);
    }
  }

  void kill() {
    phase_ = Phase::kKilling;
    deadline_ = Clock::now() + kKillWait;
    for (Rank& r : ranks_) r.process.send_signal(SIGKILL);
  }

  void check_deadline() {
    if (phase_ == Phase::kRunning || Clock::now() < deadline_) return;
    if (phase_ == Phase::kStopping) {
      for (const Rank& r : ranks_) {
        if (r.exit) continue;
        log_->warn("Rank {} (pid {}) is still running {} ms after SIGTERM; sending SIGKILL.",
                   r.rank, r.process.pid(), term_timeout_.count());
      }
      kill();
      return;
    }
    for (Rank& r : ranks_) {
      if (r.exit) continue;
      log_->error(
          "Rank {} (pid {}) did not exit {} ms after SIGKILL; reporting it as killed "
          "and no longer waiting for it.",
          r.rank, r.process.pid(), kKillWait.count());
      r.out.finish();
      r.err.finish();
      r.process.close_stdout();
      r.process.close_stderr();
      record(r, ExitStatus{.exit_code = 0, .signal = SIGKILL});
    }
  }

  std::shared_ptr<spdlog::logger> log_ = logger("launcher");
  std::vector<Rank>& ranks_;  // owned by launch(), which outlives the monitor
  SignalScope& signals_;      // likewise
  const milliseconds term_timeout_;
  const milliseconds hang_timeout_;  // 0: no watchdog
  Hooks hooks_;
  bool stopped_by_hook_ = false;
  Phase phase_ = Phase::kRunning;
  Clock::time_point deadline_;
  int first_failure_ = -1;
  int early_exit_candidate_ = -1;  // see Note [Early exit]
  int early_exit_ = -1;
  int received_signal_ = 0;
  std::chrono::system_clock::time_point signal_time_;
};

}  // namespace

int LaunchResult::exit_code() const {
  if (succeeded) return 0;
  if (first_failure >= 0 && first_failure < static_cast<int>(exits.size())) {
    const RankExit& root = exits[first_failure];
    if (root.signal != 0) return 128 + root.signal;
    // A hung rank that exited 0 on the launcher's SIGTERM still failed.
    return root.exit_code != 0 ? root.exit_code : 1;
  }
  if (received_signal != 0) return 128 + received_signal;
  return 1;
}

namespace {

// One round of this node's ranks: start them, watch them, collect how they ended.
struct RoundOutcome {
  LaunchResult result;
  bool membership_changed = false;  // stopped because the rendezvous round ended
  std::chrono::system_clock::time_point signal_time;
};

RoundOutcome run_round(const LaunchOptions& options,
                       const RoundSpec& round,
                       SignalScope& signals,
                       OutputSink& out,
                       OutputSink& err,
                       Monitor::Hooks hooks) {
  auto log = logger("launcher");
  err.write(format_round(options, round));
  // Declared before the ranks, so that the folder outlives them. See Note [Hang watchdog].
  std::optional<HeartbeatDir> heartbeats;
  if (options.hang_timeout.count() > 0) heartbeats.emplace();
  std::vector<Rank> ranks;
  ranks.reserve(static_cast<std::size_t>(options.nproc_per_node));
  try {
    for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
      ranks.push_back(
          start_rank(options, round, local_rank, heartbeats ? &*heartbeats : nullptr, &out, &err));
    }
  } catch (const Error&) {
    // Signal every started rank at once; their destructors then reap them.
    if (!ranks.empty()) {
      log->error("Starting local rank {} of {} failed; stopping the {} rank(s) already started.",
                 ranks.size(), options.nproc_per_node, ranks.size());
    }
    for (Rank& r : ranks) r.process.send_signal(SIGTERM);
    throw;
  }
  Monitor monitor(ranks, signals, options.term_timeout, options.hang_timeout, std::move(hooks));
  monitor.run();

  RoundOutcome outcome;
  auto& result = outcome.result;
  result.restart_count = round.restart_count;
  for (const Rank& r : ranks) result.exits.push_back(*r.exit);
  result.first_failure = monitor.first_failure();
  result.early_exit = monitor.early_exit();
  result.received_signal = monitor.received_signal();
  outcome.membership_changed = monitor.stopped_by_hook() && result.first_failure < 0;
  // A hang is a failure even when every rank then exits 0 on SIGTERM (a preemption handler).
  result.succeeded = result.received_signal == 0 && !outcome.membership_changed &&
                     result.first_failure < 0 &&
                     std::none_of(result.exits.begin(), result.exits.end(),
                                  [](const RankExit& e) { return e.failed(); });
  outcome.signal_time = monitor.signal_time();
  if (result.succeeded) log->info("All {} rank(s) exited successfully.", ranks.size());
  return outcome;
}

// Checks the restart and monitor options (LaunchOptions' own validate() covers the rest).
void validate_restart_options(const LaunchOptions& o) {
  TY_CHECK(o.restart_backoff.count() >= 0, "LaunchOptions.restart_backoff must be >= 0 ms, got ",
           o.restart_backoff.count(), " ms.");
  TY_CHECK(o.restart_backoff_max >= o.restart_backoff,
           "LaunchOptions.restart_backoff_max must be >= restart_backoff, got ",
           o.restart_backoff_max.count(), " ms < ", o.restart_backoff.count(), " ms.");
  TY_CHECK(o.monitor_interval.count() > 0, "LaunchOptions.monitor_interval must be > 0 ms, got ",
           o.monitor_interval.count(), " ms.");
}

// The options with TRAINYARD_JOB_INSTANCE added to every rank's environment.
LaunchOptions with_job_instance(const LaunchOptions& options, const std::string& instance) {
  LaunchOptions o = options;
  o.extra_env.emplace_back(kJobInstanceEnv, instance);
  return o;
}

std::string random_job_instance() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

// Waits the restart backoff before restart `restart_count` (0 for the first), calling
// `keep_alive` (when set) about every 500 ms meanwhile. Returns the signal that ended the wait
// early, or 0. See LaunchOptions::restart_backoff.
int back_off_before_restart(const LaunchOptions& o,
                            int restart_count,
                            SignalScope& signals,
                            const std::function<void()>& keep_alive = {}) {
  auto delay = o.restart_backoff;
  for (int k = 0; k < restart_count && delay < o.restart_backoff_max; ++k) delay *= 2;
  delay = std::min(delay, o.restart_backoff_max);
  if (delay.count() == 0) return 0;
  logger("launcher")
      ->warn("[{}] Restarting the worker group in {:.1f} s (restart {} of {}).", o.role,
             delay.count() / 1000.0, restart_count + 1, o.max_restarts);
  const auto until = Clock::now() + delay;
  while (true) {
    const auto left = std::chrono::ceil<milliseconds>(until - Clock::now());
    if (left.count() <= 0) return 0;
    if (keep_alive) keep_alive();
    pollfd fd{.fd = signals.fd(), .events = POLLIN, .revents = 0};
    if (::poll(&fd, 1, static_cast<int>(std::min<milliseconds>(left, milliseconds(500)).count())) >
        0) {
      if (int sig = signals.take()) {
        logger("launcher")
            ->warn("Received {} while waiting to restart; stopping.", signal_name(sig));
        return sig;
      }
    }
  }
}

// torchrun's line for a restart after the `restart_count`-th failure.
void log_restart(const LaunchOptions& options, int restart_count) {
  logger("launcher")
      ->warn("[{}] Worker group FAILED. {}/{} attempts left; will restart worker group.",
             options.role, options.max_restarts - restart_count, options.max_restarts);
}

// Static membership: the flags fix the node's place; rounds differ only by restart count.
LaunchResult launch_static(const LaunchOptions& launch_options,
                           SignalScope& signals,
                           OutputSink& out,
                           OutputSink& err) {
  validate_restart_options(launch_options);
  // One instance for every node and restart of this job: the user's, or, across static nodes
  // (which share no rendezvous state), one derived from what they share: the run id and the
  // master's address, where one job at a time serves its store.
  const char* given = std::getenv(kJobInstanceEnv);
  const LaunchOptions options = with_job_instance(
      launch_options, given != nullptr && *given != '\0' ? std::string(given)
                      : launch_options.nnodes > 1
                          ? fmt::format("{}@{}:{}", launch_options.run_id,
                                        launch_options.master_addr, launch_options.master_port)
                          : random_job_instance());
  for (int restart_count = 0;; ++restart_count) {
    const RoundSpec round{
        .restart_count = restart_count,
        .group_rank = options.node_rank,
        .group_world_size = options.nnodes,
        .rank_offset = options.node_rank * options.nproc_per_node,
        .world_size = options.nnodes * options.nproc_per_node,
        .master_addr = options.master_addr,
        // A fresh port each round: the previous round's store may linger in TIME_WAIT.
        .master_port =
            options.master_port != 0 ? options.master_port : pick_free_port(options.master_addr)};
    auto outcome = run_round(options, round, signals, out, err, {});
    auto& result = outcome.result;
    if (result.succeeded) return result;
    // A signal to the agent means stop, not retry.
    if (result.received_signal == 0 && restart_count < options.max_restarts) {
      log_restart(options, restart_count);
      result.received_signal = back_off_before_restart(options, restart_count, signals);
      if (result.received_signal == 0) continue;
      outcome.signal_time = std::chrono::system_clock::now();
    }
    err.write(format_summary(options, result, outcome.signal_time));
    return result;
  }
}

// Elastic membership: every round goes through the rendezvous (Note [Rendezvous state]). A
// failure of this node's ranks ends the round for all nodes and counts as a restart; a round
// ended by others (their failure, a node joining or lost) restarts the ranks without counting.
LaunchResult launch_elastic(const LaunchOptions& options,
                            SignalScope& signals,
                            OutputSink& out,
                            OutputSink& err) {
  validate_restart_options(options);
  auto log = logger("launcher");
  Rendezvous& rdzv = *options.rendezvous;
  const auto pick_port = [&] { return pick_free_port(rdzv.options().local_addr); };
  // Rendezvous calls whose failure must not lose what the agent reports (the serving agent may
  // be gone): logged, and the caller goes on.
  const auto tolerate = [&](const char* what, const std::function<void()>& call) {
    try {
      call();
    } catch (const Error& e) {
      log->warn("Could not {} the rendezvous: {}", what, e.what());
    }
  };
  // A signal while the agent waits on the rendezvous (no ranks running) ends the wait.
  int signal_while_waiting = 0;
  const auto interrupted = [&] {
    if (signal_while_waiting == 0) signal_while_waiting = signals.take();
    return signal_while_waiting != 0;
  };
  int restart_count = 0;
  // Counts a restart that is not a rank failure (the backend stayed away) and waits its backoff.
  // False when no restart is left or a signal ended the wait (signal_while_waiting).
  const auto rejoin = [&](const std::string& why) {
    if (restart_count >= options.max_restarts) return false;
    log->warn("[{}] {}; trying to rejoin the rendezvous ({}/{} attempts left).", options.role, why,
              options.max_restarts - restart_count, options.max_restarts);
    signal_while_waiting = back_off_before_restart(options, restart_count++, signals);
    return signal_while_waiting == 0;
  };
  const auto stopped_by_signal = [&] {
    log->warn("Received {} while waiting for the rendezvous; left it.",
              signal_name(signal_while_waiting));
    LaunchResult stopped;
    stopped.restart_count = restart_count;
    stopped.received_signal = signal_while_waiting;
    return stopped;
  };
  while (true) {
    std::optional<RendezvousInfo> info;
    try {
      info = rdzv.next_round(pick_port, interrupted);
    } catch (const RendezvousClosedError& e) {
      log->error("{}", e.what());
      LaunchResult closed;
      closed.restart_count = restart_count;
      return closed;
    } catch (const NetworkError& e) {
      // The backend stayed away past backend_timeout (or the join timeout) while joining.
      if (signal_while_waiting != 0) return stopped_by_signal();
      log->error("{}", e.what());
      if (rejoin("The rendezvous backend could not be reached")) continue;
      if (signal_while_waiting != 0) return stopped_by_signal();
      throw;
    }
    if (!info) return stopped_by_signal();
    const LaunchOptions round_options = with_job_instance(options, info->job_instance);
    const RoundSpec round{.restart_count = restart_count,
                          .group_rank = info->group_rank,
                          .group_world_size = info->group_world_size,
                          .rank_offset = info->rank_offset,
                          .world_size = info->world_size,
                          .master_addr = info->master_addr,
                          .master_port = info->master_port};
    // This node's heartbeat is written by these checks: at least once per keep-alive interval,
    // or the others would take it for dead (and the outage grace would not cover it).
    const auto watch_interval =
        std::min(options.monitor_interval, rdzv.options().keep_alive_interval);
    auto next_watch = Clock::now();
    std::string fatal;          // the rendezvous failed or closed while the ranks ran
    bool backend_lost = false;  // fatal: the backend stayed away past backend_timeout
    bool consequence = false;   // this node's ranks failed after another node ended the round
    Monitor::Hooks hooks{
        .on_failure =
            [&] {
              try {
                consequence =
                    !rdzv.start_next_round("a rank failed on node " + rdzv.options().node_id);
              } catch (const NetworkError& e) {
                // Restart as usual: joining the next round ends this one once the backend answers.
                log->warn("Could not end the round: {}", e.what());
              } catch (const Error& e) {
                fatal = e.what();
              }
            },
        .on_signal = [&] { tolerate("leave", [&] { rdzv.leave(); }); },
        .should_stop =
            [&] {
              if (Clock::now() < next_watch) return false;
              next_watch = Clock::now() + watch_interval;
              std::string change;
              try {
                switch (rdzv.watch()) {
                  case RoundChange::kNone:
                  case RoundChange::kBackendUnreachable:  // See Note [Backend outages].
                    return false;
                  case RoundChange::kNewRound:
                    change = "another node ended the round";
                    break;
                  case RoundChange::kNodesWaiting:
                    change = "nodes are waiting to join";
                    rdzv.start_next_round(change);
                    break;
                  case RoundChange::kParticipantLost:
                    change = "a node stopped sending heartbeats";
                    rdzv.start_next_round(change);
                    break;
                }
              } catch (const Error& e) {
                fatal = e.what();
                backend_lost = dynamic_cast<const NetworkError*>(&e) != nullptr;
                log->error("[{}] Stopping the worker group: {}", options.role, fatal);
                return true;
              }
              log->warn("[{}] Membership changed ({}); restarting the worker group in a new round.",
                        options.role, change);
              return true;
            }};
    auto outcome = run_round(round_options, round, signals, out, err, std::move(hooks));
    auto& result = outcome.result;
    if (result.succeeded) {
      // As torchrun's exit barrier: stay until every node is done, so that an agent serving the
      // rendezvous store does not pull it from under the others.
      tolerate("finish", [&] {
        rdzv.mark_done();
        if (!rdzv.wait_closed(options.exit_barrier_timeout, interrupted)) {
          log->warn("Not every node finished (within {} s, or before a signal); exiting anyway.",
                    options.exit_barrier_timeout.count() / 1000.0);
        }
      });
      return result;
    }
    if (backend_lost && result.received_signal == 0 &&
        rejoin("The rendezvous backend stayed unreachable")) {
      continue;
    }
    if (signal_while_waiting != 0) result.received_signal = signal_while_waiting;
    if (result.received_signal != 0 || !fatal.empty()) {
      // Exit code 1 when the rendezvous is gone and no rank failed; else the root cause.
      if (result.first_failure >= 0 || result.received_signal != 0) {
        err.write(format_summary(options, result, outcome.signal_time));
      }
      return result;
    }
    if (outcome.membership_changed) continue;
    if (consequence) {
      log->warn(
          "[{}] Worker group FAILED after another node ended the round; restarting it "
          "without counting a restart.",
          options.role);
      continue;
    }
    if (restart_count < options.max_restarts) {
      log_restart(options, restart_count);
      // This node's heartbeat stays fresh meanwhile, so the others' next round waits for it
      // (Note [Short last call]) instead of completing without it.
      signal_while_waiting = back_off_before_restart(
          options, restart_count++, signals, [&] { tolerate("beat in", [&] { rdzv.watch(); }); });
      if (signal_while_waiting == 0) continue;
      tolerate("leave", [&] { rdzv.leave(); });
      result.received_signal = signal_while_waiting;
      err.write(format_summary(options, result, std::chrono::system_clock::now()));
      return result;
    }
    tolerate("close", [&] {
      rdzv.close(detail::concat("node ", rdzv.options().node_id, " used all ", options.max_restarts,
                                " restart(s)"));
    });
    err.write(format_summary(options, result, outcome.signal_time));
    return result;
  }
}

}  // namespace

LaunchResult launch(const LaunchOptions& options) {
  validate(options);
  auto log = logger("launcher");
  SignalScope signals;
  if (options.rendezvous) {
    const auto& r = options.rendezvous->options();
    log->info(
        "Starting elastic agent: {} rank(s) per node, {}..{} node(s), rendezvous {} run id "
        "'{}', this node {} ({}), role '{}', max restarts {}{}; command: {}",
        options.nproc_per_node, r.min_nodes, r.max_nodes, options.rendezvous->describe(), r.run_id,
        r.node_id, r.local_addr, options.role, options.max_restarts,
        options.log_dir.empty() ? "" : ", logs in " + options.log_dir,
        shell_quote(options.command));
  } else {
    log->info(
        "Launching {} rank(s) per node on {} node(s), this is node {}; world size {}, "
        "master {}:{}, run id '{}', role '{}', max restarts {}{}; command: {}",
        options.nproc_per_node, options.nnodes, options.node_rank,
        options.nnodes * options.nproc_per_node, options.master_addr,
        options.master_port != 0 ? std::to_string(options.master_port) : std::string("<free port>"),
        options.run_id, options.role, options.max_restarts,
        options.log_dir.empty() ? "" : ", logs in " + options.log_dir,
        shell_quote(options.command));
  }
  if (std::getenv("OMP_NUM_THREADS") == nullptr && options.nproc_per_node > 1) {
    log->info(
        "Setting OMP_NUM_THREADS=1 for each rank to avoid overloading the node; set it "
        "yourself to tune it.");
  }
  OutputSink out(STDOUT_FILENO, "stdout");
  OutputSink err(STDERR_FILENO, "stderr");
  return options.rendezvous ? launch_elastic(options, signals, out, err)
                            : launch_static(options, signals, out, err);
}

std::string self_executable() {
  std::vector<char> buf(256);
  while (true) {
    ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size());
    if (n < 0) {
      throw Error(detail::concat("Could not read /proc/self/exe: ", std::strerror(errno),
                                 ". HINT: is /proc mounted?"));
    }
    if (static_cast<std::size_t>(n) < buf.size()) return std::string(buf.data(), n);
    buf.resize(buf.size() * 2);
  }
}

}  // namespace trainyard::elastic
