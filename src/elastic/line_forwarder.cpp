#include "elastic/line_forwarder.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "trainyard/log.h"

namespace trainyard::elastic {
namespace {

using Clock = std::chrono::steady_clock;

// How long a write to the launcher's stdout/stderr may stall before output is dropped.
constexpr std::chrono::seconds kWriteStall{10};
constexpr int kWriteWaitMs = 100;

}  // namespace

void OutputSink::write(std::string_view data) {
  if (fd_ < 0) return;
  const auto deadline = Clock::now() + kWriteStall;
  while (!broken_ && !data.empty()) {
    ssize_t n = ::write(fd_, data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (Clock::now() >= deadline) {
        break_with("it accepted nothing for " + std::to_string(kWriteStall.count()) + " s");
      }
      pollfd p{.fd = fd_, .events = POLLOUT, .revents = 0};
      ::poll(&p, 1, kWriteWaitMs);
    } else if (errno != EINTR) {
      break_with(std::strerror(errno));
    }
  }
}

void OutputSink::break_with(const std::string& why) {
  broken_ = true;
  logger("launcher")
      ->warn("Dropping the ranks' {} from now on: writing it failed: {}.", name_, why);
}

void LineForwarder::feed(std::string_view data) {
  write_log(data);
  std::string out;
  std::size_t start = 0;
  if (after_cr_ && !data.empty() && data.front() == '\n') {
    out += '\n';  // a "\r\n" split across reads: its line already went out with the '\r'
    start = 1;
  }
  after_cr_ = false;
  for (std::size_t i = start; i < data.size(); ++i) {
    if (data[i] != '\n' && data[i] != '\r') continue;
    std::size_t end = i + 1;
    if (data[i] == '\r') {
      if (end < data.size() && data[end] == '\n') {
        ++end;
      } else if (end == data.size()) {
        after_cr_ = true;
      }
    }
    append_line(out, data.substr(start, end - start));
    i = end - 1;
    start = end;
  }
  pending_.append(data.substr(start));
  if (pending_.size() >= kMaxLineBytes) {
    pending_ += '\n';
    append_line(out, {});
  }
  if (!out.empty()) sink_->write(out);
}

void LineForwarder::finish() {
  if (pending_.empty()) return;
  std::string out;
  pending_ += '\n';
  append_line(out, {});
  sink_->write(out);
}

void LineForwarder::append_line(std::string& out, std::string_view tail) {
  // Every path here ends the line in tail, or in pending_ when tail is empty.
  const bool kept = (tail.empty() ? std::string_view(pending_) : tail).ends_with('\n');
  if (kept || on_line_) {
    std::string text = pending_;
    text += tail;
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (on_line_) on_line_(text);
    if (kept) {
      if (text.size() > kMaxKeptLineBytes) text.resize(kMaxKeptLineBytes);
      kept_.push_back(std::move(text));
      if (kept_.size() > kKeptLines) kept_.pop_front();
    }
  }
  out += prefix_;
  out += pending_;
  out += tail;
  pending_.clear();
}

void LineForwarder::write_log(std::string_view data) {
  while (log_.valid() && !data.empty()) {
    ssize_t n = ::write(log_.get(), data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (errno != EINTR) {
      logger("launcher")
          ->warn("Writing a rank's log file failed ({}); no longer logging to it.",
                 std::strerror(errno));
      log_.reset();
    }
  }
}

bool pump(int fd, LineForwarder& forwarder, std::size_t max_bytes) {
  static thread_local std::vector<char> buffer(64 << 10);
  for (std::size_t total = 0; total < max_bytes;) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n > 0) {
      forwarder.feed({buffer.data(), static_cast<std::size_t>(n)});
      total += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return true;  // drained for now
    } else if (n == 0 || errno != EINTR) {
      return false;  // end of stream, or a broken one
    }
  }
  return true;
}

}  // namespace trainyard::elastic
