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
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "elastic/line_forwarder.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/error.h"
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
  TY_CHECK(o.master_port != 0 || o.nnodes == 1,
           "LaunchOptions.master_port 0 (pick a free port) cannot work across nnodes = ", o.nnodes,
           " nodes: each would pick its own. HINT: give every node the same port.");
  TY_CHECK(o.max_restarts >= 0, "LaunchOptions.max_restarts must be >= 0, got ", o.max_restarts,
           ".");
  TY_CHECK(o.term_timeout.count() >= 0, "LaunchOptions.term_timeout must be >= 0 ms, got ",
           o.term_timeout.count(), " ms.");
  TY_CHECK(!o.role.empty(), "LaunchOptions.role is empty.");
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
};

std::vector<std::pair<std::string, std::string>> rank_env(const LaunchOptions& o,
                                                          std::uint16_t port,
                                                          int local_rank) {
  const int world_size = o.nnodes * o.nproc_per_node;
  const std::string rank = std::to_string(o.node_rank * o.nproc_per_node + local_rank);
  std::vector<std::pair<std::string, std::string>> env = {
      {"RANK", rank},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"ROLE_RANK", rank},
      {"ROLE_NAME", o.role},
      {"ROLE_WORLD_SIZE", std::to_string(world_size)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(port)},
      {"TORCHELASTIC_RESTART_COUNT", "0"},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"PYTHONUNBUFFERED", "1"},
  };
  // torchrun's default: one OpenMP thread per rank when several share the node.
  if (std::getenv("OMP_NUM_THREADS") == nullptr && o.nproc_per_node > 1) {
    env.emplace_back("OMP_NUM_THREADS", "1");
  }
  if (isatty(STDOUT_FILENO)) env.emplace_back("TRAINYARD_TTY", "1");
  env.insert(env.end(), o.extra_env.begin(), o.extra_env.end());
  return env;
}

Rank start_rank(
    const LaunchOptions& o, std::uint16_t port, int local_rank, OutputSink* out, OutputSink* err) {
  const int rank = o.node_rank * o.nproc_per_node + local_rank;
  UniqueFd out_log, err_log;
  if (!o.log_dir.empty()) {
    auto dir =
        std::filesystem::path(o.log_dir) / o.run_id / "attempt_0" / std::to_string(local_rank);
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
  Subprocess process(SubprocessOptions{.argv = o.command,
                                       .env = rank_env(o, port, local_rank),
                                       .destructor_term_timeout = o.term_timeout});
  return Rank{.rank = rank,
              .local_rank = local_rank,
              .process = std::move(process),
              .out = LineForwarder(prefix, out, std::move(out_log)),
              .err = LineForwarder(prefix, err, std::move(err_log)),
              .exit = std::nullopt,
              .stopped_by_launcher = false};
}

// --- the summary ------------------------------------------------------------------------------

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

std::string format_failure(int idx,
                           const RankExit& e,
                           const std::string& host,
                           const std::string& indent) {
  const std::string traceback =
      e.signal != 0 ? detail::concat("Signal ", e.signal, " (", signal_name(e.signal),
                                     ") received by PID ", e.pid)
                    : kTracebackHint;
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

// torchrun's ChildFailedError report: the other failures, then the root cause.
std::string format_summary(const LaunchOptions& o,
                           const LaunchResult& result,
                           std::chrono::system_clock::time_point signal_time) {
  const std::string host = host_name();
  const std::string border(60, '='), section(60, '-');
  std::string others, root;
  int idx = 0;
  for (std::size_t i = 0; i < result.exits.size(); ++i) {
    const RankExit& e = result.exits[i];
    if (!e.failed()) continue;
    if (static_cast<int>(i) == result.first_failure) {
      root = format_failure(idx++, e, host, "");
    } else {
      others += format_failure(idx++, e, host, "  ");
    }
  }
  if (others.empty()) others = "  <NO_OTHER_FAILURES>\n";
  if (root.empty()) {
    root = detail::concat("[launcher]:\n  time      : ", format_time(signal_time),
                          "\n  host      : ", host, "\n  traceback : Signal ",
                          result.received_signal, " (", signal_name(result.received_signal),
                          ") received by the launcher (PID ", getpid(),
                          "), which stopped every rank\n");
  }
  return detail::concat(border, "\n", std::filesystem::path(o.command.front()).filename().string(),
                        " FAILED\n", section, "\nFailures:\n", others, section,
                        "\nRoot Cause (first observed failure):\n", root, border, "\n");
}

// --- the monitor ------------------------------------------------------------------------------

// Watches the ranks: forwards their output, reaps them, and on the first failure (or a signal to
// the launcher) stops the rest: SIGTERM, then SIGKILL after term_timeout, then gives up after
// kKillWait. Every wait is bounded by those deadlines.
class Monitor {
 public:
  Monitor(std::vector<Rank>& ranks, SignalScope& signals, milliseconds term_timeout)
      : ranks_(ranks), signals_(signals), term_timeout_(term_timeout) {}

  void run() {
    while (std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return !r.exit; })) {
      wait_and_pump();
      for (Rank& r : ranks_) {
        if (!r.exit) reap(r);
      }
      check_deadline();
    }
  }

  int first_failure() const { return first_failure_; }
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
    r.exit = RankExit{.rank = r.rank,
                      .local_rank = r.local_rank,
                      .pid = r.process.pid(),
                      .exit_code = status.exit_code,
                      .signal = status.signal,
                      .time = std::chrono::system_clock::now(),
                      .stopped_by_launcher = r.stopped_by_launcher};
    if (!status.success() && phase_ == Phase::kRunning) {
      log_->error("Rank {} (local rank {}, pid {}) failed with {}; stopping the other ranks.",
                  r.rank, r.local_rank, r.process.pid(), status.to_string());
      first_failure_ = r.local_rank;
      stop();
    }
  }

  void stop() {
    phase_ = Phase::kStopping;
    deadline_ = Clock::now() + term_timeout_;
    for (Rank& r : ranks_) {
      // Exited ranks too: their process group may hold descendants they left behind.
      if (!r.exit) r.stopped_by_launcher = true;
      r.process.send_signal(SIGTERM);
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
  Phase phase_ = Phase::kRunning;
  Clock::time_point deadline_;
  int first_failure_ = -1;
  int received_signal_ = 0;
  std::chrono::system_clock::time_point signal_time_;
};

}  // namespace

int LaunchResult::exit_code() const {
  if (succeeded) return 0;
  if (first_failure >= 0 && first_failure < static_cast<int>(exits.size())) {
    const RankExit& root = exits[first_failure];
    return root.signal != 0 ? 128 + root.signal : root.exit_code;
  }
  if (received_signal != 0) return 128 + received_signal;
  return 1;
}

LaunchResult launch(const LaunchOptions& options) {
  validate(options);
  auto log = logger("launcher");
  SignalScope signals;
  const std::uint16_t port =
      options.master_port != 0 ? options.master_port : pick_free_port(options.master_addr);
  log->info(
      "Launching {} rank(s) per node on {} node(s), this is node {}; world size {}, "
      "master {}:{}, run id '{}', role '{}', max restarts {}{}; command: {}",
      options.nproc_per_node, options.nnodes, options.node_rank,
      options.nnodes * options.nproc_per_node, options.master_addr, port, options.run_id,
      options.role, options.max_restarts,
      options.log_dir.empty() ? "" : ", logs in " + options.log_dir, shell_quote(options.command));
  if (std::getenv("OMP_NUM_THREADS") == nullptr && options.nproc_per_node > 1) {
    log->info(
        "Setting OMP_NUM_THREADS=1 for each rank to avoid overloading the node; set it "
        "yourself to tune it.");
  }

  OutputSink out(STDOUT_FILENO, "stdout");
  OutputSink err(STDERR_FILENO, "stderr");
  std::vector<Rank> ranks;
  ranks.reserve(static_cast<std::size_t>(options.nproc_per_node));
  try {
    for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
      ranks.push_back(start_rank(options, port, local_rank, &out, &err));
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

  Monitor monitor(ranks, signals, options.term_timeout);
  monitor.run();

  LaunchResult result;
  for (const Rank& r : ranks) result.exits.push_back(*r.exit);
  result.first_failure = monitor.first_failure();
  result.received_signal = monitor.received_signal();
  result.succeeded =
      result.received_signal == 0 && std::none_of(result.exits.begin(), result.exits.end(),
                                                  [](const RankExit& e) { return e.failed(); });
  if (result.succeeded) {
    log->info("All {} rank(s) exited successfully.", ranks.size());
  } else {
    err.write(format_summary(options, result, monitor.signal_time()));
  }
  return result;
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
