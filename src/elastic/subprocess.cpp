#include "trainyard/elastic/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

#include "trainyard/error.h"
#include "trainyard/log.h"

extern char** environ;

namespace trainyard::elastic {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// wait_for() polls waitpid with a back-off between these bounds.
constexpr milliseconds kMinPollInterval{1};
constexpr milliseconds kMaxPollInterval{20};

// What the child reports through the error pipe when it cannot reach exec.
enum class ChildStage : int { kSetpgid = 1, kDeathSignal, kRedirect, kExec };

struct ChildError {
  ChildStage stage;
  int error;  // errno
};

const char* stage_text(ChildStage stage) {
  switch (stage) {
    case ChildStage::kSetpgid:
      return " (while creating its process group)";
    case ChildStage::kDeathSignal:
      return " (while setting PR_SET_PDEATHSIG)";
    case ChildStage::kRedirect:
      return " (while redirecting its output)";
    case ChildStage::kExec:
      return "";
  }
  return "";
}

// Everything the child needs, built before fork so the child allocates nothing.
struct ExecPlan {
  std::vector<std::string> candidates;  // paths to try with execve, in order
  std::vector<std::string> env_storage;
  std::vector<char*> argv;
  std::vector<char*> envp;
};

std::string_view env_key(std::string_view entry) {
  return entry.substr(0, entry.find('='));
}

ExecPlan make_plan(const SubprocessOptions& options) {
  ExecPlan plan;
  // The overrides, the last one of each name winning, on top of the inherited environment.
  std::vector<std::pair<std::string, std::string>> overrides;
  for (const auto& entry : options.env) {
    const std::string& key = entry.first;
    TY_CHECK(!key.empty() && key.find('=') == std::string::npos,
             "Subprocess environment variable name '", key, "' is empty or contains '='.");
    auto it = std::find_if(overrides.begin(), overrides.end(),
                           [&](const auto& kv) { return kv.first == key; });
    if (it != overrides.end()) {
      it->second = entry.second;
    } else {
      overrides.push_back(entry);
    }
  }
  auto overridden = [&](std::string_view key) {
    return std::any_of(overrides.begin(), overrides.end(),
                       [&](const auto& kv) { return kv.first == key; });
  };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (!overridden(env_key(*e))) plan.env_storage.emplace_back(*e);
  }
  std::string path = "/bin:/usr/bin";  // glibc's default when PATH is unset
  if (const char* p = std::getenv("PATH")) path = p;
  for (const auto& [key, value] : overrides) {
    plan.env_storage.push_back(key + "=" + value);
    if (key == "PATH") path = value;
  }

  const std::string& program = options.argv.front();
  if (program.find('/') != std::string::npos) {
    plan.candidates.push_back(program);
  } else {
    std::size_t begin = 0;
    while (begin <= path.size()) {
      std::size_t end = std::min(path.find(':', begin), path.size());
      std::string dir = path.substr(begin, end - begin);
      plan.candidates.push_back((dir.empty() ? std::string(".") : dir) + "/" + program);
      begin = end + 1;
    }
  }
  for (const auto& arg : options.argv) plan.argv.push_back(const_cast<char*>(arg.c_str()));
  plan.argv.push_back(nullptr);
  for (auto& entry : plan.env_storage) plan.envp.push_back(entry.data());
  plan.envp.push_back(nullptr);
  return plan;
}

// Creates a CLOEXEC pipe whose descriptors are all >= 3, so dup2 onto 1 and 2 in the child never
// clobbers one of them even when the parent runs with a standard descriptor closed.
std::pair<UniqueFd, UniqueFd> make_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    throw Error(detail::concat("Could not create a pipe: ", std::strerror(errno),
                               ". HINT: the process may have run out of file descriptors "
                               "(ulimit -n)."));
  }
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  for (UniqueFd* fd : {&read_end, &write_end}) {
    if (fd->get() < 3) {
      int moved = fcntl(fd->get(), F_DUPFD_CLOEXEC, 3);
      if (moved < 0) throw Error(detail::concat("Could not move a pipe: ", std::strerror(errno)));
      fd->reset(moved);
    }
  }
  return {std::move(read_end), std::move(write_end)};
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw Error(
        detail::concat("Could not make descriptor ", fd, " non-blocking: ", std::strerror(errno)));
  }
}

// Async-signal-safe: reports the failure to the parent and exits. Never returns.
[[noreturn]] void child_fail(int error_fd, ChildStage stage, int error) {
  ChildError report{stage, error};
  ssize_t ignored;
  do {
    ignored = write(error_fd, &report, sizeof(report));
  } while (ignored < 0 && errno == EINTR);
  _exit(127);
}

// Async-signal-safe: points target (1 or 2) at fd for the exec'd program.
bool child_redirect(int fd, int target) {
  int r;
  do {
    r = dup2(fd, target);
  } while (r < 0 && errno == EINTR);
  return r >= 0;
}

// Runs in the child between fork and exec: only async-signal-safe calls, no allocation.
[[noreturn]] void run_child(const SubprocessOptions& options,
                            const ExecPlan& plan,
                            pid_t parent,
                            int stdout_write,
                            int stderr_write,
                            int error_fd) {
  if (options.new_process_group && setpgid(0, 0) != 0) {
    child_fail(error_fd, ChildStage::kSetpgid, errno);
  }
  if (options.kill_with_parent) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
      child_fail(error_fd, ChildStage::kDeathSignal, errno);
    }
    // The parent may have died before prctl: then the signal will never come.
    if (getppid() != parent) _exit(127);
  }
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGPIPE, &dfl, nullptr);

  if (stdout_write >= 0 && !child_redirect(stdout_write, STDOUT_FILENO)) {
    child_fail(error_fd, ChildStage::kRedirect, errno);
  }
  if (stderr_write >= 0 && !child_redirect(stderr_write, STDERR_FILENO)) {
    child_fail(error_fd, ChildStage::kRedirect, errno);
  }

  // execvp's search: remember EACCES, skip directories that lack the file, stop on anything else.
  int error = ENOENT;
  bool denied = false;
  for (const auto& candidate : plan.candidates) {
    execve(candidate.c_str(), plan.argv.data(), plan.envp.data());
    error = errno;
    if (error == EACCES) {
      denied = true;
    } else if (error != ENOENT && error != ENOTDIR && error != ESTALE && error != ENODEV &&
               error != ETIMEDOUT) {
      break;
    }
  }
  if (denied && (error == ENOENT || error == ENOTDIR)) error = EACCES;
  child_fail(error_fd, ChildStage::kExec, error);
}

pid_t waitpid_retry(pid_t pid, int* status, int flags) {
  pid_t r;
  do {
    r = waitpid(pid, status, flags);
  } while (r < 0 && errno == EINTR);
  return r;
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  // close() is not retried on EINTR: on Linux the descriptor is released either way.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string signal_name(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  if (abbrev == nullptr) return "signal " + std::to_string(signal);
  return std::string("SIG") + abbrev;
}

std::string ExitStatus::to_string() const {
  if (signal != 0) return detail::concat("signal ", signal, " (", signal_name(signal), ")");
  return detail::concat("exit code ", exit_code);
}

ExitStatus ExitStatus::from_wait_status(int status) {
  if (WIFSIGNALED(status)) return ExitStatus{.exit_code = 0, .signal = WTERMSIG(status)};
  if (WIFEXITED(status)) return ExitStatus{.exit_code = WEXITSTATUS(status), .signal = 0};
  return ExitStatus{.exit_code = 255, .signal = 0};  // stopped/continued: not an exit
}

Subprocess::Subprocess(const SubprocessOptions& options)
    : own_group_(options.new_process_group),
      destructor_term_timeout_(options.destructor_term_timeout) {
  TY_CHECK(!options.argv.empty() && !options.argv.front().empty(),
           "Subprocess needs a program to run; argv is empty.");
  program_ = options.argv.front();
  const ExecPlan plan = make_plan(options);

  UniqueFd stdout_write;
  UniqueFd stderr_write;
  if (options.stdout_mode == OutputMode::kPipe) std::tie(stdout_, stdout_write) = make_pipe();
  if (options.stderr_mode == OutputMode::kPipe) std::tie(stderr_, stderr_write) = make_pipe();
  auto [error_read, error_write] = make_pipe();
  // Only the parent's read ends: O_NONBLOCK belongs to the open file, not shared with the writer.
  if (stdout_.valid()) set_nonblocking(stdout_.get());
  if (stderr_.valid()) set_nonblocking(stderr_.get());

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    throw Error(detail::concat("Could not start '", program_,
                               "': fork failed: ", std::strerror(errno),
                               ". HINT: check the process limit (ulimit -u) and free memory."));
  }
  if (pid == 0) {
    run_child(options, plan, parent, stdout_write.get(), stderr_write.get(), error_write.get());
  }
  pid_ = pid;
  // Also from the parent, so the group exists before anyone signals it; EACCES means the child
  // has already exec'd (and made the group itself).
  if (own_group_) setpgid(pid, pid);
  stdout_write.reset();
  stderr_write.reset();
  error_write.reset();

  // The error pipe closes on a successful exec (CLOEXEC); otherwise it carries a ChildError.
  ChildError report{};
  std::size_t got = 0;
  while (got < sizeof(report)) {
    ssize_t n =
        read(error_read.get(), reinterpret_cast<char*>(&report) + got, sizeof(report) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got == sizeof(report)) {
    int status = 0;
    waitpid_retry(pid_, &status, 0);  // the child _exits right after reporting
    status_ = ExitStatus::from_wait_status(status);
    std::string message =
        detail::concat("Could not start '", program_, "': ", std::strerror(report.error),
                       stage_text(report.stage));
    if (report.stage == ChildStage::kExec && report.error == ENOENT &&
        program_.find('/') == std::string::npos) {
      message += ". HINT: it is not in any directory of PATH; give its full path or fix PATH.";
    } else if (report.stage == ChildStage::kExec && report.error == EACCES) {
      message += ". HINT: check that the file is executable (chmod +x) and not a directory.";
    } else if (report.stage == ChildStage::kExec && report.error == ENOEXEC) {
      message += ". HINT: a script needs a '#!' line, or name its interpreter first.";
    }
    throw Error(message);
  }
}

Subprocess::~Subprocess() {
  stop_noexcept();
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      own_group_(other.own_group_),
      program_(std::move(other.program_)),
      destructor_term_timeout_(other.destructor_term_timeout_),
      stdout_(std::move(other.stdout_)),
      stderr_(std::move(other.stderr_)),
      status_(std::exchange(other.status_, std::nullopt)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    stop_noexcept();
    pid_ = std::exchange(other.pid_, -1);
    own_group_ = other.own_group_;
    program_ = std::move(other.program_);
    destructor_term_timeout_ = other.destructor_term_timeout_;
    stdout_ = std::move(other.stdout_);
    stderr_ = std::move(other.stderr_);
    status_ = std::exchange(other.status_, std::nullopt);
  }
  return *this;
}

void Subprocess::stop_noexcept() noexcept {
  if (pid_ <= 0 || status_.has_value()) return;
  try {
    if (!terminate(destructor_term_timeout_).has_value()) {
      logger("subprocess")
          ->warn("'{}' (pid {}) did not exit after SIGKILL; leaving it behind.", program_, pid_);
    }
  } catch (...) {
    // A destructor never throws; terminate() itself only throws if logging does.
  }
}

std::optional<ExitStatus> Subprocess::poll() {
  if (status_.has_value() || pid_ <= 0) return status_;
  int status = 0;
  pid_t r = waitpid_retry(pid_, &status, WNOHANG);
  if (r == pid_) {
    status_ = ExitStatus::from_wait_status(status);
    end_leftovers();
  } else if (r < 0 && errno == ECHILD) {
    // Someone else reaped it (SIGCHLD set to SIG_IGN, or a stray waitpid(-1)): the status is lost.
    auto log = logger("subprocess");
    log->warn(
        "The exit status of '{}' (pid {}) was lost: another waitpid() reaped it. "
        "Reporting exit code 255.",
        program_, pid_);
    status_ = ExitStatus{.exit_code = 255, .signal = 0};
  }
  return status_;
}

std::optional<ExitStatus> Subprocess::wait_for(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  milliseconds interval = kMinPollInterval;
  while (true) {
    if (auto status = poll()) return status;
    const auto now = Clock::now();
    if (now >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::min<Clock::duration>(interval, deadline - now));
    interval = std::min(interval * 2, kMaxPollInterval);
  }
}

// Note [No rank outlives its agent]
// A rank is the leader of its own process group, and what it starts stays in that group unless it
// leaves on purpose (setsid). `sh -c 'sleep 1000 & wait'` left its sleep running after the rank
// was stopped, reparented to init, while the job's message said the ranks were stopped. So:
//  - when a child's leader is reaped, whatever is left in its group is killed at once (its pid
//    cannot have been reused yet: the kernel keeps a group id while any process is in the
//    group, and the leader was only just reaped);
//  - a GroupReaper, a small process forked by the agent for each round, is told every rank's
//    group; when the agent dies without saying goodbye (kill -9 of `trainyard run` or of a
//    worker), the reaper reads end-of-file on its pipe and kills those groups. It has a process
//    group of its own, so that a signal to the agent's group does not take it along, and ignores
//    the terminal's signals. (PR_SET_PDEATHSIG kills only a rank's own process, not its children.)
//  - the reaper may die first (`pkill -9 trainyard`, the OOM killer): the agent checks on it as
//    the ranks run (GroupReaper::keep_alive, every poll of the monitor) and starts another,
//    told every group, so a later kill -9 of the agent still leaves no orphan. The agent talks to
//    it over a socket with MSG_NOSIGNAL, so a dead reaper is an error, never a SIGPIPE.
void Subprocess::end_leftovers() noexcept {
  if (!own_group_ || pid_ <= 0) return;
  if (::kill(-pid_, SIGKILL) == 0) {
    try {
      logger("subprocess")
          ->info("'{}' (pid {}) exited leaving processes in its group; they were killed.", program_,
                 pid_);
    } catch (...) {
    }
  }
}

GroupReaper::GroupReaper() {
  start();
}

void GroupReaper::start() {
  // Without a reaper the ranks still run; only a kill -9 of this process may then leave their
  // children behind, so a failure here is a warning, not the round's end.
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    logger("subprocess")
        ->warn("No reaper for the ranks' process groups: socketpair failed: {}",
               std::strerror(errno));
    return;
  }
  static constexpr int kMaxGroups = 4096;
  std::vector<pid_t> groups(kMaxGroups);  // before fork: the child allocates nothing
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    logger("subprocess")
        ->warn("No reaper for the ranks' process groups: fork failed: {}", std::strerror(err));
    return;
  }
  if (pid == 0) {
    // The reaper: async-signal-safe calls only (the parent has threads).
    ::setpgid(0, 0);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::sigaction(sig, &ignore, nullptr);
    const int in = fds[0];
    ::close_range(0, static_cast<unsigned>(in) - 1, 0);
    ::close_range(static_cast<unsigned>(in) + 1, ~0U, 0);
    int n = 0;
    for (;;) {
      std::int32_t value = 0;
      const ssize_t r = ::read(in, &value, sizeof value);
      if (r == sizeof value) {
        if (value == 0) ::_exit(0);  // goodbye: the agent ended its round itself
        if (n < kMaxGroups) groups[static_cast<std::size_t>(n++)] = value;
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      break;  // end of file: the agent is gone
    }
    for (int i = 0; i < n; ++i) ::kill(-groups[static_cast<std::size_t>(i)], SIGKILL);
    ::_exit(0);
  }
  ::close(fds[0]);
  fd_ = fds[1];
  pid_ = pid;
}

bool GroupReaper::tell(std::int32_t value) {
  return fd_ >= 0 && ::send(fd_, &value, sizeof value, MSG_NOSIGNAL) == sizeof value;
}

GroupReaper::~GroupReaper() {
  if (fd_ >= 0) {
    tell(0);  // goodbye
    ::close(fd_);
  }
  if (pid_ > 0) {
    int status = 0;
    waitpid_retry(pid_, &status, 0);
  }
}

void GroupReaper::watch(int pgid) {
  if (pgid <= 0) return;
  groups_.push_back(pgid);
  if (fd_ >= 0 && !tell(pgid)) {
    logger("subprocess")
        ->warn("Could not tell the reaper about process group {}: {}", pgid, std::strerror(errno));
  }
}

void GroupReaper::keep_alive() {
  if (pid_ <= 0) return;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return;
  logger("subprocess")
      ->warn(
          "The reaper of the ranks' process groups (pid {}) ended with {}; starting another "
          "(Note [No rank outlives its agent]).",
          pid_, ExitStatus::from_wait_status(status).to_string());
  ::close(fd_);
  fd_ = -1;
  pid_ = -1;
  start();
  for (const auto pgid : groups_) tell(pgid);
}

bool Subprocess::send_signal(int sig) {
  if (pid_ <= 0) return false;
  if (own_group_ && kill(-pid_, sig) == 0) return true;
  // Without a group (or when the child left it), only a child not yet reaped may be signalled:
  // after waitpid its pid can belong to someone else.
  if (status_.has_value()) return false;
  return kill(pid_, sig) == 0;
}

std::optional<ExitStatus> Subprocess::terminate(std::chrono::milliseconds grace) {
  if (auto status = poll()) return status;
  send_signal(SIGTERM);
  send_signal(SIGCONT);  // a stopped child acts on SIGTERM only once continued
  if (auto status = wait_for(grace)) return status;
  logger("subprocess")
      ->warn("'{}' (pid {}) is still running {} ms after SIGTERM; sending SIGKILL.", program_, pid_,
             grace.count());
  send_signal(SIGKILL);
  return wait_for(kSigkillWait);
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

}  // namespace trainyard::elastic
