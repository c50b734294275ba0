// Starting and watching one round's ranks. See rank_monitor.h.
#include "elastic/rank_monitor.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "trainyard/comm/address.h"
#include "trainyard/env.h"
#include "trainyard/elastic/rendezvous.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/remove_tree.h"

namespace trainyard::elastic {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The monitor wakes at least this often to reap ranks and check deadlines.
constexpr milliseconds kPollInterval{50};
// Bytes read from one pipe per wake-up (fairness between ranks), and when a rank exits.
constexpr std::size_t kReadPerWake = 256 << 10;
constexpr std::size_t kReadAtExit = 4 << 20;

UniqueFd open_log(const std::filesystem::path& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    throw Error(detail::concat("Could not open the rank log '", path.string(),
                               "': ", std::strerror(errno), ". HINT: check --log-dir."));
  }
  return fd;
}

std::vector<std::pair<std::string, std::string>> rank_env(const LaunchOptions& o,
                                                          const RoundSpec& round,
                                                          int local_rank,
                                                          const std::string& heartbeat_file) {
  const int world_size = round.world_size;
  const std::string rank = std::to_string(round.rank_offset + local_rank);
  std::vector<std::pair<std::string, std::string>> env = {
      {kRankEnv, rank},
      {kLocalRankEnv, std::to_string(local_rank)},
      {kWorldSizeEnv, std::to_string(world_size)},
      {kLocalWorldSizeEnv, std::to_string(o.nproc_per_node)},
      {kGroupRankEnv, std::to_string(round.group_rank)},
      {kGroupWorldSizeEnv, std::to_string(round.group_world_size)},
      {kRoleRankEnv, rank},
      {kRoleNameEnv, o.role},
      {kRoleWorldSizeEnv, std::to_string(world_size)},
      {kMasterAddrEnv, round.master_addr},
      {kMasterPortEnv, std::to_string(round.master_port)},
      {kRestartCountEnv, std::to_string(round.restart_count)},
      {kMaxRestartsEnv, std::to_string(o.max_restarts)},
      {kRunIdEnv, o.run_id},
      {kUseAgentStoreEnv, "False"},
      {"PYTHONUNBUFFERED", "1"},
      // Empty when the watchdog is off, so that no rank beats into an outer launcher's file.
      {kHeartbeatFileEnv, heartbeat_file},
  };
  // torchrun's default: one OpenMP thread per rank when several share the node.
  if (std::getenv("OMP_NUM_THREADS") == nullptr && o.nproc_per_node > 1) {
    env.emplace_back("OMP_NUM_THREADS", "1");
  }
  if (o.forward_output && isatty(STDOUT_FILENO)) env.emplace_back(kTtyEnv, "1");
  // Across nodes, the workers' Gloo sockets bind to the address the other nodes reach: the
  // rendezvous' local address, or in a static job the address on the route to MASTER_ADDR. Left
  // to Gloo, it binds to whatever this host's name resolves to, which on a stock Debian host is
  // 127.0.1.1.
  if (std::getenv("GLOO_SOCKET_IFNAME") == nullptr && std::getenv(kBindAddrEnv) == nullptr) {
    if (o.rendezvous) {
      env.emplace_back(kBindAddrEnv, o.rendezvous->options().local_addr);
    } else if (round.group_world_size > 1 && !is_loopback_address(round.master_addr)) {
      env.emplace_back(kBindAddrEnv, route_address(round.master_addr, round.master_port,
                                                   {.what = "the master (MASTER_ADDR)",
                                                    .host_flag = "--master-addr",
                                                    .local_flag = std::string(kBindAddrEnv)}));
    }
  }
  env.insert(env.end(), o.extra_env.begin(), o.extra_env.end());
  return env;
}

}  // namespace

ScratchDir::ScratchDir(const std::string& name, const std::string& hint) {
  std::string base = "/dev/shm";
  if (::access(base.c_str(), W_OK | X_OK) != 0) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string pattern = detail::concat(base, "/trainyard-", name, "-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw Error(detail::concat("Could not create a folder for the ranks' ", name, " files in ",
                               base, ": ", std::strerror(errno), ". HINT: ", hint));
  }
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  remove_tree(path_, ec);
}

std::string ScratchDir::file(int local_rank) const {
  return detail::concat(path_, "/rank_", local_rank);
}

Rank start_rank(const LaunchOptions& o,
                const RoundSpec& round,
                int local_rank,
                const ScratchDir* heartbeat_dir,  // nullptr: the watchdog is off
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
  // Each line to LaunchOptions::on_output too, with where it came from.
  const auto lines_to = [&](OutputStream stream) -> LineForwarder::LineCallback {
    if (!o.on_output) return {};
    return [on_output = o.on_output, rank, local_rank, restart_count = round.restart_count,
            stream](std::string_view text) {
      on_output(OutputLine{.rank = rank,
                           .local_rank = local_rank,
                           .restart_count = restart_count,
                           .stream = stream,
                           .text = text});
    };
  };
  return Rank{
      .rank = rank,
      .local_rank = local_rank,
      .process = std::move(process),
      .out = LineForwarder(prefix, out, std::move(out_log), lines_to(OutputStream::kStdout)),
      .err = LineForwarder(prefix, err, std::move(err_log), lines_to(OutputStream::kStderr)),
      .exit = std::nullopt,
      .stopped_by_launcher = false,
      .heartbeat = std::move(heartbeat)};
}

namespace {

// --- the monitor ------------------------------------------------------------------------------

// Note [Hang watchdog]: a rank that stops making progress (SIGSTOP, a deadlock, a kernel or file
// system that never returns) does not exit, so reaping alone never notices it, and its peers wait
// in collectives until the collective timeout. So ranks report progress: the launcher creates one
// heartbeat file per rank and round (a ScratchDir, $TRAINYARD_HEARTBEAT_FILE) and the rank calls
// trainyard::heartbeat() (heartbeat.h), which stores the time into the mapped file, from
//   - the training loop (each step, each evaluation batch, around checkpoint saves),
//   - inside a step, so that one slow step (a bf16 output layer on a CPU that emulates bf16
//     takes ~36 s) is not taken for a hang: after each FSDP unit's forward, at the start of its
//     backward, at each gradient a DDP or FSDP hook receives, and at each phase of the step
//     (Trainer::phase: after the loss, after backward),
//   - inside a checkpoint save: FileStorage writes and the SHA-256 of each file in 64 MiB slices
//     (heartbeat_while_waiting, so a background save's thread does not speak for the trainer),
//   - inside waits on peers: ShmProcessGroup's barrier slices and wait_work() around Gloo work,
//     so a rank waiting for a hung peer keeps beating and the hung peer alone falls silent; on
//     a GPU, whose host waits for NCCL work later and elsewhere, a thread beats while such work
//     is in flight (Note [Beating while device work runs], src/comm/device_work_beacon.cpp),
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

// See monitor_ranks().
class Monitor {
 public:
  using Hooks = MonitorHooks;

  // hang_timeout 0: no hang watchdog.
  Monitor(std::vector<Rank>& ranks,
          StopChannel& stops,
          milliseconds term_timeout,
          milliseconds hang_timeout,
          Hooks hooks)
      : ranks_(ranks),
        stops_(stops),
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
    std::vector<pollfd> fds{{.fd = stops_.fd(), .events = POLLIN, .revents = 0}};
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
    // See Note [Stopping an agent].
    if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) return;
    if (fds[0].revents != 0) {
      while (int sig = stops_.take()) on_signal(sig);
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
    if (hooks_.on_exit) hooks_.on_exit(*r.exit);
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
    deadline_ = Clock::now() + Subprocess::kSigkillWait;
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
          r.rank, r.process.pid(), Subprocess::kSigkillWait.count());
      r.out.finish();
      r.err.finish();
      r.process.close_stdout();
      r.process.close_stderr();
      record(r, ExitStatus{.exit_code = 0, .signal = SIGKILL});
    }
  }

  std::shared_ptr<spdlog::logger> log_ = logger("launcher");
  std::vector<Rank>& ranks_;  // owned by run_round(), which outlives the monitor
  StopChannel& stops_;        // likewise
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

MonitorOutcome monitor_ranks(std::vector<Rank>& ranks,
                             StopChannel& stops,
                             milliseconds term_timeout,
                             milliseconds hang_timeout,
                             MonitorHooks hooks) {
  Monitor monitor(ranks, stops, term_timeout, hang_timeout, std::move(hooks));
  monitor.run();
  return MonitorOutcome{.first_failure = monitor.first_failure(),
                        .early_exit = monitor.early_exit(),
                        .received_signal = monitor.received_signal(),
                        .signal_time = monitor.signal_time(),
                        .stopped_by_hook = monitor.stopped_by_hook()};
}

}  // namespace trainyard::elastic
