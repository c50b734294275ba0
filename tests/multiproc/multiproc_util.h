// Helpers for the multi-process tests: the shared temporary directory, file reading, a bounded
// wait for a file to appear, process liveness, running a program to completion with captured
// output, and the rule for a missing prerequisite (skip on a developer's machine, fail under CI).
#pragma once

#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../prerequisite.h"
#include "../temp_dir.h"
#include "trainyard/elastic/subprocess.h"

namespace trainyard::mptest {

using test::running_under_ci;

// The shared temporary folder (tests/temp_dir.h).
using test::TempDir;

#ifdef TRAINYARD_CLI_PATH
// The `trainyard` program of this build (test programs that run it define its path).
inline constexpr const char* kCli = TRAINYARD_CLI_PATH;
#endif

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The result.json a run named `name` wrote under the storage folder `storage`.
inline nlohmann::json result_of(const std::filesystem::path& storage, const std::string& name) {
  return nlohmann::json::parse(read_file(storage / name / "result.json"));
}

// Waits at most timeout for every path to exist and be non-empty.
inline bool wait_for_files(const std::vector<std::filesystem::path>& paths,
                           std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    for (const auto& p : paths) {
      std::error_code ec;
      all = all && std::filesystem::file_size(p, ec) > 0 && !ec;
    }
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// True while pid names a process that has not died (a zombie counts as dead).
inline bool process_alive(int pid) {
  if (kill(pid, 0) != 0) return false;
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'Z';
}

// Waits at most timeout for pid to be gone (or a zombie of someone else).
inline bool wait_until_dead(int pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (process_alive(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// The pid of a live process whose environment has TORCHELASTIC_RUN_ID=run_id and RANK=rank, or -1.
inline int find_rank(const std::string& run_id, int rank) {
  const std::string want_run = "TORCHELASTIC_RUN_ID=" + run_id;
  const std::string want_rank = "RANK=" + std::to_string(rank);
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return -1;
  int found = -1;
  while (dirent* e = readdir(proc)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string env = read_file("/proc/" + std::string(e->d_name) + "/environ");
    bool run = false, rank_ok = false;
    for (std::size_t begin = 0; begin < env.size();) {
      const auto end = std::min(env.find('\0', begin), env.size());
      const auto var = env.substr(begin, end - begin);
      run = run || var == want_run;
      rank_ok = rank_ok || var == want_rank;
      begin = end + 1;
    }
    if (run && rank_ok && process_alive(pid)) {
      found = pid;
      break;
    }
  }
  closedir(proc);
  return found;
}

struct RunOutput {
  elastic::ExitStatus status;
  std::string out;
  std::string err;
  std::chrono::milliseconds elapsed{0};
  bool timed_out = false;
};

// Drains every child's pipes together (so that none blocks on a full pipe while another is
// waited for) until each has exited and reached EOF on both, at most timeout in all; a child
// still running then is terminated and its result marked timed_out.
inline std::vector<RunOutput> collect_all(std::vector<elastic::Subprocess*> children,
                                          std::chrono::milliseconds timeout) {
  std::vector<RunOutput> results(children.size());
  // Not `elapsed > 0`: a child done within a millisecond of the start has elapsed 0 ms.
  std::vector<bool> done(children.size(), false);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  const auto finished = [](elastic::Subprocess& c) {
    return c.stdout_fd() < 0 && c.stderr_fd() < 0 && c.poll();
  };
  char buf[4096];
  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::size_t> owner;
    bool all_done = true;
    for (std::size_t i = 0; i < children.size(); ++i) {
      elastic::Subprocess& c = *children[i];
      if (done[i]) continue;
      if (finished(c)) {
        done[i] = true;
        results[i].elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start);
        continue;
      }
      all_done = false;
      for (int fd : {c.stdout_fd(), c.stderr_fd()}) {
        if (fd < 0) continue;
        fds.push_back({.fd = fd, .events = POLLIN, .revents = 0});
        owner.push_back(i);
      }
    }
    if (all_done || std::chrono::steady_clock::now() >= deadline) break;
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    ::poll(fds.data(), fds.size(), 20);
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      elastic::Subprocess& c = *children[owner[k]];
      const bool is_out = fds[k].fd == c.stdout_fd();
      ssize_t n = ::read(fds[k].fd, buf, sizeof(buf));
      if (n > 0) {
        (is_out ? results[owner[k]].out : results[owner[k]].err)
            .append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        is_out ? c.close_stdout() : c.close_stderr();
      }
    }
  }
  for (std::size_t i = 0; i < children.size(); ++i) {
    RunOutput& r = results[i];
    if (!done[i]) {
      r.timed_out = true;
      children[i]->terminate(std::chrono::milliseconds(1000));
      r.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
    }
    if (auto status = children[i]->exit_status()) r.status = *status;
  }
  return results;
}

// collect_all for one child.
inline RunOutput collect(elastic::Subprocess& child, std::chrono::milliseconds timeout) {
  return std::move(collect_all({&child}, timeout).front());
}

// Runs argv to completion (at most timeout) with env added, capturing stdout and stderr.
inline RunOutput run_program(std::vector<std::string> argv,
                             std::vector<std::pair<std::string, std::string>> env = {},
                             std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  elastic::Subprocess child(
      elastic::SubprocessOptions{.argv = std::move(argv), .env = std::move(env)});
  return collect(child, timeout);
}

// A socket bound to 127.0.0.1 at a kernel-chosen port, listening when `listen` (it never
// accepts, so a client's request is never answered).
inline elastic::UniqueFd bind_loopback(bool listen, int* port) {
  elastic::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (!fd.valid() || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      (listen && ::listen(fd.get(), 16) != 0) ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error("could not bind a socket on 127.0.0.1");
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace trainyard::mptest
