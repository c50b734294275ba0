// Forwarding of the ranks' output (internal to the launcher): OutputSink writes to one of the
// launcher's own descriptors, LineForwarder cuts one rank stream into whole, prefixed lines (for
// the sink) and bare ones (for a callback), and pump() moves what a pipe holds into a forwarder.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/elastic/subprocess.h"

namespace trainyard::elastic {

// One of the launcher's own descriptors (stdout or stderr), written from one thread. A sink that
// fails (EPIPE: the reader went away; or 10 s without progress) drops everything after one
// warning, so a closed pipe never stops the ranks.
class OutputSink {
 public:
  // fd -1: a sink that discards everything (an agent that does not forward output).
  OutputSink(int fd, const char* name) : fd_(fd), name_(name) {}

  // Writes all of data (blocking, EINTR retried, EAGAIN waited on with poll); nothing for fd -1.
  void write(std::string_view data);

 private:
  void break_with(const std::string& why);

  int fd_;
  const char* name_;  // "stdout" or "stderr", a literal
  bool broken_ = false;
};

// Splits one rank stream into lines and forwards them, each behind prefix, to a sink in whole
// lines only, so two ranks never mix within a line. '\n' and '\r' both end a line and stay with
// it ("\r\n" is one ending), so a progress bar drawn with '\r' still works through the prefix.
// Also hands each line, without its ending, to a callback when it has one, copies the raw bytes to
// a log file when it has one, and keeps the last few lines for the launcher's failure summary.
class LineForwarder {
 public:
  // A line longer than this is forwarded in pieces, each a line of its own.
  static constexpr std::size_t kMaxLineBytes = 1 << 20;
  // last_lines() keeps at most this many lines, each cut to kMaxKeptLineBytes.
  static constexpr std::size_t kKeptLines = 10;
  static constexpr std::size_t kMaxKeptLineBytes = 1000;

  using LineCallback = std::function<void(std::string_view line)>;

  LineForwarder(std::string prefix, OutputSink* sink, UniqueFd log_file, LineCallback on_line = {})
      : prefix_(std::move(prefix)),
        sink_(sink),
        log_(std::move(log_file)),
        on_line_(std::move(on_line)) {}

  void feed(std::string_view data);
  // Forwards a trailing partial line, with a '\n' added; call it when the rank has exited.
  void finish();
  // The last lines that ended with '\n' (a line redrawn with '\r' alone, like a progress bar,
  // is not kept), without their endings, oldest first.
  std::vector<std::string> last_lines() const { return {kept_.begin(), kept_.end()}; }

 private:
  void append_line(std::string& out, std::string_view tail);
  void write_log(std::string_view data);

  std::string prefix_;
  OutputSink* sink_;  // owned by the agent's loop, which outlives every forwarder
  UniqueFd log_;
  LineCallback on_line_;          // may be empty
  std::string pending_;           // the current line, not yet terminated
  bool after_cr_ = false;         // the last byte fed was a '\r' that ended a line
  std::deque<std::string> kept_;  // see last_lines()
};

// Reads what the non-blocking fd holds now, at most max_bytes, into forwarder. Returns false once
// the stream has ended (EOF or a read error).
bool pump(int fd, LineForwarder& forwarder, std::size_t max_bytes);

}  // namespace trainyard::elastic
