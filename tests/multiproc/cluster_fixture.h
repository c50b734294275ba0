// A head and workers as real `trainyard head` / `trainyard worker` processes on loopback (or in
// network namespaces, through a command prefix), each with its own state directory and its
// output in a file, plus the client commands run against them.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "multiproc_util.h"

namespace trainyard::mptest {

class ClusterFixture {
 public:
  // Fast heartbeats so that node deaths are seen within seconds (suspect after 3 missed ones).
  static constexpr const char* kHeartbeat = "0.5";
  static constexpr const char* kDeadAfter = "3";

  // The head's --heartbeat-interval and --dead-after (seconds), for tests that start it later and
  // load the machine enough (a browser, Prometheus, training ranks) that a 1.5 s silence can
  // happen without any node being unhealthy.
  void set_heartbeat(std::string interval, std::string dead_after) {
    heartbeat_ = std::move(interval);
    dead_after_ = std::move(dead_after);
  }

  ClusterFixture(std::string cli, const std::filesystem::path& dir)
      : cli_(std::move(cli)), dir_(dir), token_file_(dir / "token") {
    write_token("cluster-test-token-0123456789");
    int port = 0;
    bind_loopback(false, &port);  // a free port; the socket closes at once
    port_ = port;
  }

  void write_token(const std::string& token) {
    token_ = token;
    std::ofstream(token_file_) << token << "\n";
    ::chmod(token_file_.c_str(), 0600);
  }

  int port() const { return port_; }
  std::string address() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& token() const { return token_; }
  const std::filesystem::path& token_file() const { return token_file_; }

  // `trainyard head` on this fixture's port, its output in dir/head.log (appended across
  // restarts). `prefix` runs it elsewhere (e.g. {"ip", "netns", "exec", "ns0"}).
  void start_head(std::vector<std::string> extra = {}, std::vector<std::string> prefix = {}) {
    std::vector<std::string> argv = {cli_,
                                     "head",
                                     "--port",
                                     std::to_string(port_),
                                     "--token-file",
                                     token_file_.string(),
                                     "--state-dir",
                                     (dir_ / "head").string(),
                                     "--heartbeat-interval",
                                     heartbeat_,
                                     "--dead-after",
                                     dead_after_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    head_ = spawn("head", prefix, argv);
  }

  // `trainyard worker` named `name` (its state in dir/name, output in dir/name.log).
  void start_worker(const std::string& name,
                    std::vector<std::string> extra = {},
                    std::vector<std::string> prefix = {},
                    const std::string& head = "") {
    std::vector<std::string> argv = {
        cli_,           "worker",
        "--head",       head.empty() ? "127.0.0.1:" + std::to_string(port_) : head,
        "--token-file", token_file_.string(),
        "--state-dir",  (dir_ / name).string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    workers_[name] = spawn(name, prefix, argv);
  }

  elastic::Subprocess& head() { return *head_; }
  elastic::Subprocess& worker(const std::string& name) { return *workers_.at(name); }
  std::string node_id(const std::string& name) const {
    std::string id = read_file(dir_ / name / "node_id");
    while (!id.empty() && id.back() == '\n') id.pop_back();
    return id;
  }
  std::string log_of(const std::string& name) const { return read_file(dir_ / (name + ".log")); }

  // A client command against the head: `trainyard <args...> --address A --token-file F`.
  RunOutput cli(std::vector<std::string> args,
                std::chrono::milliseconds timeout = std::chrono::seconds(30)) const {
    std::vector<std::string> argv = {cli_};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_program(argv, {{"TRAINYARD_ADDRESS", address()}, {"TRAINYARD_TOKEN", token_}},
                       timeout);
  }

  nlohmann::json status() const {
    const RunOutput r = cli({"status", "--json"}, std::chrono::seconds(10));
    if (r.status.exit_code != 0) return nullptr;
    return nlohmann::json::parse(r.out, nullptr, false);
  }

  nlohmann::json job(const std::string& id) const {
    const RunOutput r = cli({"jobs", "--json"}, std::chrono::seconds(10));
    if (r.status.exit_code != 0) return nullptr;
    const auto jobs = nlohmann::json::parse(r.out, nullptr, false);
    if (!jobs.is_array()) return nullptr;
    for (const auto& j : jobs) {
      if (j.value("submission_id", "") == id) return j;
    }
    return nullptr;
  }

  // Nodes of the status snapshot in `state`.
  std::size_t nodes_in(const std::string& state) const {
    const auto s = status();
    if (!s.is_object()) return 0;
    std::size_t n = 0;
    for (const auto& node : s.value("nodes", nlohmann::json::array())) {
      n += node.value("state", "") == state;
    }
    return n;
  }

  // Polls `done` every 200 ms for at most `timeout`.
  static bool eventually(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return done();
  }

  std::string wait_for_terminal(const std::string& id, std::chrono::milliseconds timeout) const {
    std::string status;
    eventually(
        [&] {
          const auto j = job(id);
          status = j.is_object() ? j.value("status", "") : "";
          return status == "SUCCEEDED" || status == "FAILED" || status == "STOPPED";
        },
        timeout);
    return status;
  }

 private:
  std::unique_ptr<elastic::Subprocess> spawn(const std::string& name,
                                             const std::vector<std::string>& prefix,
                                             const std::vector<std::string>& argv) {
    std::string command = "exec";
    for (const auto& a : prefix) command += " '" + a + "'";
    for (const auto& a : argv) command += " '" + a + "'";
    command += " >>'" + (dir_ / (name + ".log")).string() + "' 2>&1";
    return std::make_unique<elastic::Subprocess>(
        elastic::SubprocessOptions{.argv = {"/bin/sh", "-c", command},
                                   .stdout_mode = elastic::OutputMode::kInherit,
                                   .stderr_mode = elastic::OutputMode::kInherit,
                                   .destructor_term_timeout = std::chrono::seconds(15)});
  }

  std::string cli_;
  std::filesystem::path dir_;
  std::filesystem::path token_file_;
  std::string token_;
  std::string heartbeat_ = kHeartbeat;
  std::string dead_after_ = kDeadAfter;
  int port_ = 0;
  std::unique_ptr<elastic::Subprocess> head_;
  std::map<std::string, std::unique_ptr<elastic::Subprocess>> workers_;
};

}  // namespace trainyard::mptest
