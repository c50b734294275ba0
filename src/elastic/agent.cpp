// elastic::Agent: the launch loop (static rounds, or elastic ones through a rendezvous, with
// restarts and their backoff) on the agent's own thread. Each round's ranks are started and
// watched by rank_monitor.h. See agent.h, and launcher.h for launch().
#include "trainyard/elastic/agent.h"

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
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "elastic/launch_summary.h"
#include "elastic/line_forwarder.h"
#include "elastic/rank_monitor.h"
#include "elastic/stop_channel.h"
#include "trainyard/elastic/rendezvous.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/env.h"
#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"

namespace trainyard::elastic {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kMaxLocalRanks = 4096;

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
  TY_CHECK(o.restart_backoff.count() >= 0, "LaunchOptions.restart_backoff must be >= 0 ms, got ",
           o.restart_backoff.count(), " ms.");
  TY_CHECK(o.restart_backoff_max >= o.restart_backoff,
           "LaunchOptions.restart_backoff_max must be >= restart_backoff, got ",
           o.restart_backoff_max.count(), " ms < ", o.restart_backoff.count(), " ms.");
  TY_CHECK(o.monitor_interval.count() > 0, "LaunchOptions.monitor_interval must be > 0 ms, got ",
           o.monitor_interval.count(), " ms.");
  TY_CHECK(!o.run_id.empty(), "LaunchOptions.run_id is empty.");
  TY_CHECK(o.log_dir.empty() ||
               (o.run_id.find('/') == std::string::npos && o.run_id != "." && o.run_id != ".."),
           "LaunchOptions.run_id '", o.run_id,
           "' names a directory under log_dir, so it cannot contain '/' or be '.' or '..'.");
}

// Note [Holding the master port]
// torchrun picks MASTER_PORT by binding port 0 and closing the socket; the rank that hosts the
// store binds the port a second or more later (a process to start, libraries to load). Anything on
// the host that binds port 0 or connects meanwhile may be handed that very port, and rank 0 then
// fails at once with "address already in use" (seen in the suite: a browser starting beside a
// job). So the agent keeps the port bound, with SO_REUSEADDR and never listening, until the round
// is over: the kernel hands a bound port to no other bind(0) or connect(), while the store's
// listening socket, which sets SO_REUSEADDR too (c10d's and libuv's), may bind beside a socket that
// does not listen.
struct PortReservation {
  std::uint16_t port = 0;
  UniqueFd socket;  // bound to port, not listening
};

// Binds port 0 on addr (falling back to every interface) and keeps it: see Note [Holding the
// master port].
PortReservation reserve_free_port(const std::string& addr) {
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
      const int on = 1;
      if (!sock.valid() || setsockopt(sock.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
          bind(sock.get(), a->ai_addr, a->ai_addrlen) != 0 ||
          getsockname(sock.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
        failures +=
            detail::concat(" binding on '", host ? host : "*", "': ", std::strerror(errno), ";");
        continue;
      }
      const std::uint16_t port = bound.ss_family == AF_INET6
                                     ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      return PortReservation{.port = port, .socket = std::move(sock)};
    }
  }
  throw NetworkError(detail::concat("Could not find a free port for MASTER_PORT on '", addr,
                                    "':", failures, " HINT: pass --master-port explicitly."));
}

// Hands event to LaunchOptions::on_event, stamped with the time.
void emit(const LaunchOptions& options, AgentEvent event) {
  if (!options.on_event) return;
  event.time = std::chrono::system_clock::now();
  options.on_event(event);
}

// One round of this node's ranks: start them, watch them, collect how they ended.
struct RoundOutcome {
  LaunchResult result;
  bool membership_changed = false;  // stopped because the rendezvous round ended
  std::chrono::system_clock::time_point signal_time;
};

RoundOutcome run_round(const LaunchOptions& options,
                       const RoundSpec& round,
                       StopChannel& stops,
                       OutputSink& out,
                       OutputSink& err,
                       MonitorHooks hooks) {
  auto log = logger("launcher");
  err.write(format_round(options, round));
  emit(options, AgentEvent{.kind = AgentEventKind::kRoundStarted,
                           .restart_count = round.restart_count,
                           .world_size = round.world_size,
                           .local_world_size = options.nproc_per_node,
                           .group_rank = round.group_rank,
                           .group_world_size = round.group_world_size,
                           .rank_offset = round.rank_offset,
                           .master_addr = round.master_addr,
                           .master_port = round.master_port});
  // Declared before the ranks, so that the folder outlives them. See Note [Hang watchdog].
  std::optional<ScratchDir> heartbeats;
  if (options.hang_timeout.count() > 0) {
    heartbeats.emplace("heartbeat",
                       "set TMPDIR to a writable folder, or turn the hang watchdog off with "
                       "--hang-timeout 0.");
  }
  // Declared before the ranks: their groups are killed should this process die before they end
  // (Note [No rank outlives its agent]).
  GroupReaper reaper;
  std::vector<Rank> ranks;
  ranks.reserve(static_cast<std::size_t>(options.nproc_per_node));
  try {
    for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
      ranks.push_back(
          start_rank(options, round, local_rank, heartbeats ? &*heartbeats : nullptr, &out, &err));
      reaper.watch(ranks.back().process.pid());
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
  AgentEvent started{.kind = AgentEventKind::kRanksStarted, .restart_count = round.restart_count};
  for (const Rank& r : ranks) started.pids.push_back(r.process.pid());
  emit(options, std::move(started));
  // The reaper is checked on at every poll of the monitor (Note [No rank outlives its agent]).
  hooks.should_stop = [&reaper, should_stop = std::move(hooks.should_stop)] {
    reaper.keep_alive();
    return should_stop && should_stop();
  };
  hooks.on_exit = [&](const RankExit& exit) {
    emit(options, AgentEvent{.kind = AgentEventKind::kRankExited,
                             .restart_count = round.restart_count,
                             .rank_exit = exit});
  };
  const MonitorOutcome monitor =
      monitor_ranks(ranks, stops, options.term_timeout, options.hang_timeout, std::move(hooks));

  RoundOutcome outcome;
  auto& result = outcome.result;
  result.restart_count = round.restart_count;
  for (const Rank& r : ranks) result.exits.push_back(*r.exit);
  result.first_failure = monitor.first_failure;
  result.early_exit = monitor.early_exit;
  result.received_signal = monitor.received_signal;
  outcome.membership_changed = monitor.stopped_by_hook && result.first_failure < 0;
  // A hang is a failure even when every rank then exits 0 on SIGTERM (a preemption handler).
  result.succeeded = result.received_signal == 0 && !outcome.membership_changed &&
                     result.first_failure < 0 &&
                     std::none_of(result.exits.begin(), result.exits.end(),
                                  [](const RankExit& e) { return e.failed(); });
  outcome.signal_time = monitor.signal_time;
  if (result.succeeded) log->info("All {} rank(s) exited successfully.", ranks.size());
  return outcome;
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

// Reports a restart that does not count against max_restarts (the round ended under the ranks)
// and comes at once: the kRestarting event.
void report_free_restart(const LaunchOptions& o, int restart_count, std::string reason) {
  emit(o, AgentEvent{.kind = AgentEventKind::kRestarting,
                     .restart_count = restart_count,
                     .reason = std::move(reason),
                     .counted = false});
}

// Reports restart `restart_count` (0 for the first; the kRestarting event, for `reason`), then
// waits its backoff, calling `keep_alive` (when set) about every 500 ms meanwhile. Returns the
// stop (signal) that ended the wait early, or 0. See LaunchOptions::restart_backoff.
int back_off_before_restart(const LaunchOptions& o,
                            int restart_count,
                            std::string reason,
                            StopChannel& stops,
                            const std::function<void()>& keep_alive = {}) {
  auto delay = o.restart_backoff;
  for (int k = 0; k < restart_count && delay < o.restart_backoff_max; ++k) delay *= 2;
  delay = std::min(delay, o.restart_backoff_max);
  emit(o, AgentEvent{.kind = AgentEventKind::kRestarting,
                     .restart_count = restart_count + 1,
                     .reason = std::move(reason),
                     .backoff = delay,
                     .counted = true});
  if (delay.count() == 0) return 0;
  logger("launcher")
      ->warn("[{}] Restarting the worker group in {:.1f} s (restart {} of {}).", o.role,
             delay.count() / 1000.0, restart_count + 1, o.max_restarts);
  const auto until = Clock::now() + delay;
  while (true) {
    const auto left = std::chrono::ceil<milliseconds>(until - Clock::now());
    if (left.count() <= 0) return 0;
    if (keep_alive) keep_alive();
    pollfd fd{.fd = stops.fd(), .events = POLLIN, .revents = 0};
    if (::poll(&fd, 1, static_cast<int>(std::min<milliseconds>(left, milliseconds(500)).count())) >
        0) {
      if (int sig = stops.take()) {
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

// Why a round failed, for the kRestarting event: "rank 1 (local rank 1) failed with exit code 3".
std::string failure_reason(const LaunchResult& result) {
  if (result.first_failure < 0 || result.first_failure >= static_cast<int>(result.exits.size())) {
    return "the worker group failed";
  }
  const RankExit& e = result.exits[static_cast<std::size_t>(result.first_failure)];
  if (e.hang_silence.count() > 0) {
    return detail::concat("rank ", e.rank, " (local rank ", e.local_rank, ") made no progress for ",
                          format_seconds(e.hang_silence));
  }
  return detail::concat("rank ", e.rank, " (local rank ", e.local_rank, ") failed with ",
                        ExitStatus{.exit_code = e.exit_code, .signal = e.signal}.to_string());
}

// Puts torchrun's failure report into the result and, when output is forwarded, on stderr.
void report_failure(const LaunchOptions& options,
                    LaunchResult& result,
                    std::chrono::system_clock::time_point signal_time,
                    OutputSink& err) {
  result.summary = format_summary(options, result, signal_time);
  err.write(result.summary);
}

// Static membership: the flags fix the node's place; rounds differ only by restart count.
LaunchResult launch_static(const LaunchOptions& launch_options,
                           StopChannel& stops,
                           OutputSink& out,
                           OutputSink& err) {
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
    // A stop before the round (before start(), or after a backoff of 0) starts no ranks.
    if (const int sig = stops.take()) {
      logger("launcher")
          ->warn("Received {} before starting the ranks; stopping.", signal_name(sig));
      LaunchResult stopped;
      stopped.restart_count = restart_count;
      stopped.received_signal = sig;
      report_failure(options, stopped, std::chrono::system_clock::now(), err);
      return stopped;
    }
    // Held until the round is over: Note [Holding the master port].
    const PortReservation reserved =
        options.master_port != 0 ? PortReservation{} : reserve_free_port(options.master_addr);
    const RoundSpec round{
        .restart_count = restart_count,
        .group_rank = options.node_rank,
        .group_world_size = options.nnodes,
        .rank_offset = options.node_rank * options.nproc_per_node,
        .world_size = options.nnodes * options.nproc_per_node,
        .master_addr = options.master_addr,
        // A fresh port each round: the previous round's store may linger in TIME_WAIT.
        .master_port = options.master_port != 0 ? options.master_port : reserved.port};
    auto outcome = run_round(options, round, stops, out, err, {});
    auto& result = outcome.result;
    if (result.succeeded) return result;
    // A signal to the agent means stop, not retry.
    if (result.received_signal == 0 && restart_count < options.max_restarts) {
      log_restart(options, restart_count);
      result.received_signal =
          back_off_before_restart(options, restart_count, failure_reason(result), stops);
      if (result.received_signal == 0) continue;
      outcome.signal_time = std::chrono::system_clock::now();
    }
    report_failure(options, result, outcome.signal_time, err);
    return result;
  }
}

// Elastic membership: every round goes through the rendezvous (Note [Rendezvous state]). A
// failure of this node's ranks ends the round for all nodes and counts as a restart; a round
// ended by others (their failure, a node joining or lost) restarts the ranks without counting.
// Each round: join it (join_round), run the ranks while watching the rendezvous (run_group),
// then end the run or go on to the next round (after_round).
class ElasticLaunch {
 public:
  ElasticLaunch(const LaunchOptions& options, StopChannel& stops, OutputSink& out, OutputSink& err)
      : options_(options),
        stops_(stops),
        out_(out),
        err_(err),
        rdzv_(*options.rendezvous),
        watch_interval_(std::min(options.monitor_interval, rdzv_.options().keep_alive_interval)) {}
  ElasticLaunch(const ElasticLaunch&) = delete;
  ElasticLaunch& operator=(const ElasticLaunch&) = delete;

  LaunchResult run() {
    while (true) {
      auto joined = join_round();
      if (auto* ended = std::get_if<LaunchResult>(&joined)) return *ended;
      RoundWatch watch{.next_watch = Clock::now()};
      RoundOutcome outcome = run_group(std::get<RendezvousInfo>(joined), watch);
      if (auto ended = after_round(outcome, watch)) return *ended;
    }
  }

 private:
  // What the rendezvous said while a round's ranks ran (the monitor's hooks write it).
  struct RoundWatch {
    Clock::time_point next_watch;  // when should_stop next asks the rendezvous
    std::string fatal;             // the rendezvous failed or closed while the ranks ran
    bool backend_lost = false;     // fatal: the backend stayed away past backend_timeout
    bool consequence = false;      // this node's ranks failed after another node ended the round
    std::string change_reason;     // why the round ended under the ranks (membership changed)
  };

  std::variant<RendezvousInfo, LaunchResult> join_round();
  RoundOutcome run_group(const RendezvousInfo& info, RoundWatch& watch);
  void end_round_after_failure(RoundWatch& watch);
  bool round_ended(RoundWatch& watch);
  std::optional<LaunchResult> after_round(RoundOutcome& outcome, const RoundWatch& watch);
  LaunchResult finish(const LaunchResult& result);
  std::optional<LaunchResult> restart_after_failure(LaunchResult& result);
  LaunchResult close_after_last_failure(RoundOutcome& outcome);

  bool interrupted();
  bool rejoin(const std::string& why);
  LaunchResult stopped_by_signal();
  void tolerate(const char* what, const std::function<void()>& call);

  const LaunchOptions& options_;
  StopChannel& stops_;
  OutputSink& out_;
  OutputSink& err_;
  Rendezvous& rdzv_;  // options_.rendezvous
  // How often round_ended asks the rendezvous. This node's heartbeat is written by these checks:
  // at least once per keep-alive interval, or the others would take it for dead (and the outage
  // grace would not cover it).
  const milliseconds watch_interval_;
  std::shared_ptr<spdlog::logger> log_ = logger("launcher");
  int restart_count_ = 0;
  PortReservation reserved_port_;  // this node's master port, when it hosts the round's store
  // A signal while the agent waits on the rendezvous (no ranks running) ends the wait.
  int signal_while_waiting_ = 0;
};

// The next round's place for this node; or the result the run ends with: the rendezvous was
// closed, or a signal came while waiting. A backend outage past backend_timeout is rejoined while
// restarts are left, else rethrown.
std::variant<RendezvousInfo, LaunchResult> ElasticLaunch::join_round() {
  while (true) {
    std::optional<RendezvousInfo> info;
    try {
      info = rdzv_.next_round(
          [this] {
            // Held until the next round's: Note [Holding the master port].
            reserved_port_ = reserve_free_port(rdzv_.options().local_addr);
            return reserved_port_.port;
          },
          [this] { return interrupted(); });
    } catch (const RendezvousClosedError& e) {
      log_->error("{}", e.what());
      LaunchResult closed;
      closed.restart_count = restart_count_;
      return closed;
    } catch (const NetworkError& e) {
      // The backend stayed away past backend_timeout (or the join timeout) while joining.
      if (signal_while_waiting_ != 0) return stopped_by_signal();
      log_->error("{}", e.what());
      if (rejoin("The rendezvous backend could not be reached")) continue;
      if (signal_while_waiting_ != 0) return stopped_by_signal();
      throw;
    }
    if (!info) return stopped_by_signal();
    return *info;
  }
}

// Starts this node's ranks in the round `info` describes and monitors them until they end, ending
// the round for every node when one fails here, or stopping them when the round ends elsewhere.
RoundOutcome ElasticLaunch::run_group(const RendezvousInfo& info, RoundWatch& watch) {
  const LaunchOptions round_options = with_job_instance(options_, info.job_instance);
  const RoundSpec round{.restart_count = restart_count_,
                        .group_rank = info.group_rank,
                        .group_world_size = info.group_world_size,
                        .rank_offset = info.rank_offset,
                        .world_size = info.world_size,
                        .master_addr = info.master_addr,
                        .master_port = info.master_port};
  MonitorHooks hooks{.on_failure = [this, &watch] { end_round_after_failure(watch); },
                     .on_signal = [this] { tolerate("leave", [&] { rdzv_.leave(); }); },
                     .should_stop = [this, &watch] { return round_ended(watch); }};
  return run_round(round_options, round, stops_, out_, err_, std::move(hooks));
}

// The monitor's on_failure: a rank of this node failed, so the round ends for every node.
void ElasticLaunch::end_round_after_failure(RoundWatch& watch) {
  try {
    watch.consequence = !rdzv_.start_next_round("a rank failed on node " + rdzv_.options().node_id);
  } catch (const NetworkError& e) {
    // Restart as usual: joining the next round ends this one once the backend answers.
    log_->warn("Could not end the round: {}", e.what());
  } catch (const Error& e) {
    watch.fatal = e.what();
  }
}

// The monitor's should_stop: asks the rendezvous (at most every watch_interval_) whether the round
// ended under the ranks, ending it here for the changes this node acts on. True: stop the ranks.
bool ElasticLaunch::round_ended(RoundWatch& watch) {
  if (Clock::now() < watch.next_watch) return false;
  watch.next_watch = Clock::now() + watch_interval_;
  std::string change;
  try {
    switch (rdzv_.watch()) {
      case RoundChange::kNone:
      case RoundChange::kBackendUnreachable:  // See Note [Backend outages].
        return false;
      case RoundChange::kNewRound:
        change = "another node ended the round";
        break;
      case RoundChange::kNodesWaiting:
        change = "nodes are waiting to join";
        rdzv_.start_next_round(change);
        break;
      case RoundChange::kParticipantLost:
        change = "a node stopped sending heartbeats";
        rdzv_.start_next_round(change);
        break;
    }
  } catch (const Error& e) {
    watch.fatal = e.what();
    watch.backend_lost = dynamic_cast<const NetworkError*>(&e) != nullptr;
    log_->error("[{}] Stopping the worker group: {}", options_.role, watch.fatal);
    return true;
  }
  log_->warn("[{}] Membership changed ({}); restarting the worker group in a new round.",
             options_.role, change);
  watch.change_reason = change;
  return true;
}

// After a round's ranks ended: the result the run ends with, or nullopt to join the next round.
std::optional<LaunchResult> ElasticLaunch::after_round(RoundOutcome& outcome,
                                                       const RoundWatch& watch) {
  auto& result = outcome.result;
  if (result.succeeded) return finish(result);
  if (watch.backend_lost && result.received_signal == 0 &&
      rejoin("The rendezvous backend stayed unreachable")) {
    return std::nullopt;
  }
  if (signal_while_waiting_ != 0) result.received_signal = signal_while_waiting_;
  if (result.received_signal != 0 || !watch.fatal.empty()) {
    // Exit code 1 when the rendezvous is gone and no rank failed; else the root cause.
    if (result.first_failure >= 0 || result.received_signal != 0) {
      report_failure(options_, result, outcome.signal_time, err_);
    }
    return result;
  }
  if (outcome.membership_changed) {
    report_free_restart(options_, restart_count_, watch.change_reason);
    return std::nullopt;
  }
  if (watch.consequence) {
    log_->warn(
        "[{}] Worker group FAILED after another node ended the round; restarting it "
        "without counting a restart.",
        options_.role);
    report_free_restart(
        options_, restart_count_,
        detail::concat(failure_reason(result), " after another node ended the round"));
    return std::nullopt;
  }
  if (restart_count_ < options_.max_restarts) return restart_after_failure(result);
  return close_after_last_failure(outcome);
}

// The ranks succeeded.
LaunchResult ElasticLaunch::finish(const LaunchResult& result) {
  // As torchrun's exit barrier: stay until every node is done, so that an agent serving the
  // rendezvous store does not pull it from under the others.
  tolerate("finish", [&] {
    rdzv_.mark_done();
    if (!rdzv_.wait_closed(options_.exit_barrier_timeout, [this] { return interrupted(); })) {
      log_->warn("Not every node finished (within {} s, or before a signal); exiting anyway.",
                 options_.exit_barrier_timeout.count() / 1000.0);
    }
  });
  return result;
}

// This node's ranks failed and a restart is left: waits its backoff, then nullopt to join the
// next round; or the result, when a signal ended the wait.
std::optional<LaunchResult> ElasticLaunch::restart_after_failure(LaunchResult& result) {
  log_restart(options_, restart_count_);
  // This node's heartbeat stays fresh meanwhile, so the others' next round waits for it
  // (Note [Short last call]) instead of completing without it.
  signal_while_waiting_ =
      back_off_before_restart(options_, restart_count_++, failure_reason(result), stops_,
                              [&] { tolerate("beat in", [&] { rdzv_.watch(); }); });
  if (signal_while_waiting_ == 0) return std::nullopt;
  tolerate("leave", [&] { rdzv_.leave(); });
  result.received_signal = signal_while_waiting_;
  report_failure(options_, result, std::chrono::system_clock::now(), err_);
  return result;
}

// This node's ranks failed with no restart left: the run is closed for every node.
LaunchResult ElasticLaunch::close_after_last_failure(RoundOutcome& outcome) {
  tolerate("close", [&] {
    rdzv_.close(detail::concat("node ", rdzv_.options().node_id, " used all ",
                               options_.max_restarts, " restart(s)"));
  });
  report_failure(options_, outcome.result, outcome.signal_time, err_);
  return outcome.result;
}

// Asked by the rendezvous while the agent waits on it; keeps the signal in signal_while_waiting_.
bool ElasticLaunch::interrupted() {
  if (signal_while_waiting_ == 0) signal_while_waiting_ = stops_.take();
  return signal_while_waiting_ != 0;
}

// Counts a restart that is not a rank failure (the backend stayed away) and waits its backoff.
// False when no restart is left or a signal ended the wait (signal_while_waiting_).
bool ElasticLaunch::rejoin(const std::string& why) {
  if (restart_count_ >= options_.max_restarts) return false;
  log_->warn("[{}] {}; trying to rejoin the rendezvous ({}/{} attempts left).", options_.role, why,
             options_.max_restarts - restart_count_, options_.max_restarts);
  signal_while_waiting_ = back_off_before_restart(options_, restart_count_++, why, stops_);
  return signal_while_waiting_ == 0;
}

LaunchResult ElasticLaunch::stopped_by_signal() {
  log_->warn("Received {} while waiting for the rendezvous; left it.",
             signal_name(signal_while_waiting_));
  LaunchResult stopped;
  stopped.restart_count = restart_count_;
  stopped.received_signal = signal_while_waiting_;
  return stopped;
}

// Rendezvous calls whose failure must not lose what the agent reports (the serving agent may
// be gone): logged, and the caller goes on.
void ElasticLaunch::tolerate(const char* what, const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    log_->warn("Could not {} the rendezvous: {}", what, e.what());
  }
}

LaunchResult launch_elastic(const LaunchOptions& options,
                            StopChannel& stops,
                            OutputSink& out,
                            OutputSink& err) {
  return ElasticLaunch(options, stops, out, err).run();
}

// The whole run on the agent's thread: the start line, then the rounds.
LaunchResult run_launch(const LaunchOptions& options, StopChannel& stops) {
  auto log = logger("launcher");
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
  // See LaunchOptions::forward_output: otherwise nothing goes to this process's fds 1 and 2.
  OutputSink out(options.forward_output ? STDOUT_FILENO : -1, "stdout");
  OutputSink err(options.forward_output ? STDERR_FILENO : -1, "stderr");
  return options.rendezvous ? launch_elastic(options, stops, out, err)
                            : launch_static(options, stops, out, err);
}

}  // namespace

struct Agent::State {
  explicit State(LaunchOptions o) : options(std::move(o)) {}

  // The agent's thread: runs the loop, keeps its outcome, reports kFinished.
  void run() noexcept {
    AgentEvent finished{.kind = AgentEventKind::kFinished};
    try {
      result = run_launch(options, stops);
      finished.restart_count = result->restart_count;
      finished.result = *result;
    } catch (const std::exception& e) {
      error = std::current_exception();
      finished.error = e.what();
    } catch (...) {
      error = std::current_exception();
      finished.error = "unknown exception";
    }
    try {
      emit(options, std::move(finished));
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    running.store(false);
  }

  const LaunchOptions options;
  StopChannel stops;
  std::atomic<bool> running{false};
  std::atomic<bool> stop_requested{false};
  std::mutex wait_mutex;  // serialises wait() (the join)
  std::thread thread;
  // Set by the thread before running turns false; read after the join.
  std::optional<LaunchResult> result;
  std::exception_ptr error;
};

Agent::Agent(LaunchOptions options) {
  validate(options);
  state_ = std::make_unique<State>(std::move(options));
}

Agent::~Agent() {
  if (!state_->thread.joinable()) return;
  if (state_->running.load() && !state_->stop_requested.load()) stop(SIGTERM);
  std::lock_guard<std::mutex> lock(state_->wait_mutex);
  if (state_->thread.joinable()) state_->thread.join();
}

void Agent::start() {
  std::lock_guard<std::mutex> lock(state_->wait_mutex);
  if (state_->thread.joinable() || state_->result || state_->error) {
    throw Error("Agent::start() was called twice; an Agent runs once. HINT: make a new Agent.");
  }
  state_->running.store(true);
  try {
    state_->thread = std::thread([state = state_.get()] { state->run(); });
  } catch (const std::system_error& e) {
    state_->running.store(false);
    throw Error(detail::concat("Could not start the agent's thread: ", e.what(), "."));
  }
}

void Agent::stop(int signal) noexcept {
  state_->stop_requested.store(true);
  state_->stops.request(signal);
}

LaunchResult Agent::wait() {
  std::lock_guard<std::mutex> lock(state_->wait_mutex);
  if (state_->thread.joinable()) state_->thread.join();
  if (state_->error) std::rethrow_exception(state_->error);
  if (!state_->result) throw Error("Agent::wait() was called before start().");
  return *state_->result;
}

bool Agent::running() const {
  return state_->running.load();
}

const LaunchOptions& Agent::options() const {
  return state_->options;
}

}  // namespace trainyard::elastic
