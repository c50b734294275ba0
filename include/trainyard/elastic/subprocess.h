// A child process owned by an RAII handle: started with execvp semantics in its own process group,
// its stdout/stderr captured through pipes or inherited, stopped with SIGTERM then SIGKILL, always
// reaped. UniqueFd, the file descriptor owner it is built on, is declared here too.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trainyard::elastic {

// Owns one file descriptor and closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);  // closes the current descriptor (errors ignored), then owns fd

 private:
  int fd_ = -1;
};

// How a process ended: a normal exit with a code, or a signal.
struct ExitStatus {
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that ended the process, or 0

  bool success() const { return signal == 0 && exit_code == 0; }
  // torchrun's convention: the exit code, or -signal.
  int torchrun_code() const { return signal != 0 ? -signal : exit_code; }
  // A shell's convention: the exit code, or 128 + signal.
  int shell_code() const { return signal != 0 ? 128 + signal : exit_code; }
  // "exit code 3" or "signal 9 (SIGKILL)".
  std::string to_string() const;
  // Decodes a waitpid() status.
  static ExitStatus from_wait_status(int status);
};

// A command line as one string that a POSIX shell splits back into the same words: plain words as
// they are, others in single quotes. For messages and for `sh -c`.
std::string shell_quote(const std::vector<std::string>& args);

// "SIGKILL" for 9; "signal 77" for a number without a name.
std::string signal_name(int signal);

enum class OutputMode {
  kInherit,  // the child writes to the parent's descriptor
  kPipe,     // the child writes into a pipe; read it from stdout_fd() / stderr_fd()
};

struct SubprocessOptions {
  // The program and its arguments. argv[0] is looked up in PATH (the overridden PATH when env
  // sets one) unless it contains a '/'.
  std::vector<std::string> argv{};
  // Variables set on top of the parent's environment (later entries win).
  std::vector<std::pair<std::string, std::string>> env{};
  OutputMode stdout_mode = OutputMode::kPipe;
  OutputMode stderr_mode = OutputMode::kPipe;
  // Makes the child the leader of a new process group, so signals reach its descendants too.
  bool new_process_group = true;
  // PR_SET_PDEATHSIG: the kernel SIGKILLs the child when the thread that started it dies.
  bool kill_with_parent = true;
  // The destructor's grace between SIGTERM and SIGKILL for a child still running.
  std::chrono::milliseconds destructor_term_timeout = std::chrono::seconds(5);
};

// A running (or finished) child process. Not thread-safe: use one handle from one thread.
//
// The child starts with an empty signal mask and SIGPIPE at its default action (as Python's
// subprocess does), stdin inherited, and every descriptor of the parent that is CLOEXEC closed.
class Subprocess {
 public:
  // Forks and execs. Throws InvalidArgumentError for an empty argv and Error when the program
  // cannot be started ("Could not start 'foo': No such file or directory"); in that case no
  // child is left behind.
  explicit Subprocess(const SubprocessOptions& options);
  // Stops a child that is still running (terminate() with destructor_term_timeout). Never throws.
  ~Subprocess();
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  int pid() const { return pid_; }
  const std::string& program() const { return program_; }

  // The read ends of the pipes (non-blocking, CLOEXEC), or -1 when inherited or closed.
  int stdout_fd() const { return stdout_.get(); }
  int stderr_fd() const { return stderr_.get(); }
  void close_stdout() { stdout_.reset(); }
  void close_stderr() { stderr_.reset(); }

  // Reaps the child if it has exited; never blocks. Returns its status once it is known.
  std::optional<ExitStatus> poll();
  // Waits at most timeout for the child to exit. Returns its status, or nullopt on timeout.
  std::optional<ExitStatus> wait_for(std::chrono::milliseconds timeout);
  // The status once the child has been reaped.
  const std::optional<ExitStatus>& exit_status() const { return status_; }
  bool running() { return !poll().has_value(); }

  // Sends sig to the child's process group (or to the child alone without one). The group is
  // signalled even after its leader exited, to reach descendants it left behind. Returns false
  // when nothing received it.
  bool send_signal(int sig);

  // SIGTERM to the process group, waits at most grace, then SIGKILL and waits at most
  // kSigkillWait. Returns the child's status, or nullopt when even SIGKILL did not end it (a
  // process stuck in the kernel). Returns at once when the child has already been reaped.
  std::optional<ExitStatus> terminate(std::chrono::milliseconds grace);

  // How long a process gets to die after SIGKILL before its parent stops waiting for it.
  static constexpr std::chrono::milliseconds kSigkillWait{5000};

 private:
  void stop_noexcept() noexcept;
  // Kills what is left in the child's process group once its leader was reaped (Note [No rank
  // outlives its agent]).
  void end_leftovers() noexcept;

  int pid_ = -1;
  bool own_group_ = false;
  std::string program_;
  std::chrono::milliseconds destructor_term_timeout_{0};
  UniqueFd stdout_;
  UniqueFd stderr_;
  std::optional<ExitStatus> status_;
};

// Kills the process groups it is told about if this process dies before the reaper is destroyed
// (kill -9 included): a process forked for the purpose, reading a socket (Note [No rank outlives
// its agent] in subprocess.cpp). One per round of ranks; destroying it lets the groups be. When it
// cannot fork it warns and watches nothing. Not thread-safe.
class GroupReaper {
 public:
  GroupReaper();
  ~GroupReaper();
  GroupReaper(const GroupReaper&) = delete;
  GroupReaper& operator=(const GroupReaper&) = delete;

  void watch(int pgid);
  // When the reaper has died (killed on its own), warns and starts another, told every group
  // so far. Cheap (one waitpid with WNOHANG): call it as the ranks run.
  void keep_alive();

 private:
  void start();
  bool tell(std::int32_t value);  // false when the reaper cannot be told

  int fd_ = -1;   // the socket's end on this side
  int pid_ = -1;  // the reaper
  std::vector<std::int32_t> groups_;  // every group watched
};

}  // namespace trainyard::elastic
