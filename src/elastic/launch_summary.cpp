// torchrun's round and failure reports. See launch_summary.h.
#include "elastic/launch_summary.h"

#include <signal.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "trainyard/elastic/subprocess.h"
#include "trainyard/error.h"

namespace trainyard::elastic {
namespace {

using std::chrono::milliseconds;

constexpr const char* kTracebackHint =
    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";

std::string format_list(int first, int count, int step = 1, int value = -1) {
  std::string out = "[";
  for (int i = 0; i < count; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(value >= 0 ? value : first + i * step);
  }
  return out + "]";
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "<unknown>";
  return buf;
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

}  // namespace

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

std::string format_seconds(milliseconds d) {
  return fmt::format("{:.1f} s", static_cast<double>(d.count()) / 1000.0);
}

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

}  // namespace trainyard::elastic
