// Subprocess: exec and its errors, output capture, the environment, process groups, terminate()
// escalating to SIGKILL, the destructor reaping, and descriptors staying CLOEXEC.
#include "trainyard/elastic/subprocess.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "multiproc_util.h"
#include "trainyard/error.h"

namespace trainyard::elastic {
namespace {

using namespace std::chrono_literals;
using mptest::run_program;
using mptest::TempDir;

TEST(Subprocess, CapturesStdoutStderrAndExitCode) {
  auto r = run_program({"/bin/sh", "-c", "echo out; echo err >&2; exit 7"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(r.status.exit_code, 7);
  EXPECT_EQ(r.status.signal, 0);
  EXPECT_EQ(r.status.to_string(), "exit code 7");
}

TEST(Subprocess, EnvironmentIsParentsPlusOverrides) {
  ASSERT_EQ(setenv("TY_SUBPROCESS_INHERITED", "from-parent", 1), 0);
  ASSERT_EQ(setenv("TY_SUBPROCESS_OVERRIDDEN", "old", 1), 0);
  auto r = run_program(
      {"/bin/sh", "-c",
       R"(printf '%s|%s|%s' "$TY_SUBPROCESS_INHERITED" "$TY_SUBPROCESS_OVERRIDDEN" "$TY_NEW")"},
      {{"TY_SUBPROCESS_OVERRIDDEN", "first"},
       {"TY_NEW", "a b=c"},
       {"TY_SUBPROCESS_OVERRIDDEN", "new"}});
  unsetenv("TY_SUBPROCESS_INHERITED");
  unsetenv("TY_SUBPROCESS_OVERRIDDEN");
  EXPECT_EQ(r.out, "from-parent|new|a b=c");
  EXPECT_TRUE(r.status.success());
}

TEST(Subprocess, SearchesTheOverriddenPath) {
  TempDir dir;
  const auto script = dir.path() / "ty-custom-tool";
  {
    std::ofstream out(script);
    out << "#!/bin/sh\necho custom tool ran\n";
  }
  ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  auto r = run_program({"ty-custom-tool"}, {{"PATH", dir.str() + ":/usr/bin:/bin"}});
  EXPECT_EQ(r.out, "custom tool ran\n");
  EXPECT_TRUE(r.status.success());
}

TEST(Subprocess, ProgramNotFoundIsAClearError) {
  try {
    Subprocess child(SubprocessOptions{.argv = {"ty-no-such-program-xyz", "arg"}});
    FAIL() << "started a program that does not exist, pid " << child.pid();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "Could not start 'ty-no-such-program-xyz': No such file or directory"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("PATH"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Subprocess(SubprocessOptions{.argv = {"/nonexistent/dir/prog"}}), Error);
  // No child is left behind to reap.
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(Subprocess, NonExecutableFileIsPermissionDenied) {
  TempDir dir;
  const auto file = dir.path() / "not-executable";
  std::ofstream(file) << "echo hi\n";
  try {
    Subprocess child(SubprocessOptions{.argv = {file.string()}});
    FAIL() << "started a file without the execute bit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Permission denied"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
}

TEST(Subprocess, EmptyArgvIsInvalid) {
  EXPECT_THROW(Subprocess(SubprocessOptions{}), InvalidArgumentError);
  EXPECT_THROW(Subprocess(SubprocessOptions{.argv = {""}}), InvalidArgumentError);
}

TEST(Subprocess, ReadEndsAreCloexecNonBlockingAndDoNotLeak) {
  Subprocess sleeper(SubprocessOptions{.argv = {"/bin/sleep", "30"}});
  for (int fd : {sleeper.stdout_fd(), sleeper.stderr_fd()}) {
    ASSERT_GE(fd, 3);
    EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    EXPECT_TRUE(fcntl(fd, F_GETFL) & O_NONBLOCK);
  }
  struct stat st {};
  ASSERT_EQ(fstat(sleeper.stdout_fd(), &st), 0);
  const std::string sleeper_pipe = "pipe:[" + std::to_string(st.st_ino) + "]";
  // A second child sees none of the first one's pipes.
  auto r = run_program({"/bin/sh", "-c", "for f in /proc/$$/fd/*; do readlink $f; done; echo end"});
  // (The glob's own directory descriptor is gone by the time readlink runs; ignore that one.)
  ASSERT_NE(r.out.find("end\n"), std::string::npos) << r.err;
  ASSERT_NE(r.out.find("pipe:["), std::string::npos) << "its own stdout is a pipe: " << r.out;
  EXPECT_EQ(r.out.find(sleeper_pipe), std::string::npos) << r.out;
}

TEST(Subprocess, ChildLeadsItsOwnProcessGroup) {
  auto r = run_program({"/bin/sh", "-c", "cut -d' ' -f5 /proc/$$/stat; echo $$"});
  ASSERT_TRUE(r.status.success()) << r.err;
  std::istringstream lines(r.out);
  std::string pgid, pid;
  lines >> pgid >> pid;
  EXPECT_EQ(pgid, pid);
  EXPECT_NE(std::stoi(pgid), getpgrp());
}

TEST(Subprocess, WaitForTimesOutThenSeesTheExit) {
  Subprocess child(SubprocessOptions{.argv = {"/bin/sh", "-c", "sleep 0.3"}});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(child.wait_for(50ms).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
  auto status = child.wait_for(5s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->success());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "a 0.3 s child; margin for load";
}

TEST(Subprocess, TerminateStopsTheWholeGroup) {
  // The shell starts a grandchild and reports its pid; SIGTERM to the group must reach both.
  Subprocess child(SubprocessOptions{.argv = {"/bin/sh", "-c", "sleep 30 & echo $!; wait"}});
  std::string line;
  char c;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    if (::read(child.stdout_fd(), &c, 1) == 1) {
      line += c;
    } else {
      std::this_thread::sleep_for(5ms);
    }
  }
  ASSERT_NE(line.find('\n'), std::string::npos) << "no grandchild pid within 5 s";
  const int grandchild = std::stoi(line);
  ASSERT_TRUE(mptest::process_alive(grandchild));
  auto status = child.terminate(5s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->signal, SIGTERM);
  EXPECT_TRUE(mptest::wait_until_dead(grandchild, 2s)) << "grandchild " << grandchild;
  if (mptest::process_alive(grandchild)) kill(grandchild, SIGKILL);  // nothing left behind
}

TEST(Subprocess, TerminateEscalatesToSigkill) {
  // Both the shell and its sleep ignore SIGTERM.
  Subprocess child(
      SubprocessOptions{.argv = {"/bin/sh", "-c", "trap '' TERM; echo ready; sleep 30; exit 0"}});
  char buf[6] = {};
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (::read(child.stdout_fd(), buf, 6) <= 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(std::string(buf, 6), "ready\n");
  const auto start = std::chrono::steady_clock::now();
  auto status = child.terminate(300ms);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->signal, SIGKILL);
  EXPECT_EQ(status->torchrun_code(), -9);
  EXPECT_EQ(status->shell_code(), 137);
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 15s) << "the child would sleep 30 s unless killed";
}

TEST(Subprocess, DestructorStopsAndReapsARunningChild) {
  int pid = 0;
  const auto start = std::chrono::steady_clock::now();
  {
    Subprocess child(SubprocessOptions{.argv = {"/bin/sleep", "30"}});
    pid = child.pid();
    ASSERT_TRUE(child.running());
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s) << "the child would sleep 30 s";
  // Reaped: no such process, and it is no longer our child.
  EXPECT_EQ(kill(pid, 0), -1);
  EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(Subprocess, MoveTransfersOwnership) {
  Subprocess a(SubprocessOptions{.argv = {"/bin/sh", "-c", "exit 4"}});
  const int pid = a.pid();
  Subprocess b(std::move(a));
  EXPECT_EQ(a.pid(), -1);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(b.pid(), pid);
  auto status = b.wait_for(5s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->exit_code, 4);
}

TEST(Subprocess, SignalNames) {
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ((ExitStatus{.exit_code = 0, .signal = SIGSEGV}).to_string(), "signal 11 (SIGSEGV)");
}

}  // namespace
}  // namespace trainyard::elastic
