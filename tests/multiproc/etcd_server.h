// A throw-away one-member etcd for tests (Debian's etcd-server, installed by scripts/setup.sh):
// started on free loopback ports with a temporary data dir, stopped on destruction.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "multiproc_util.h"
#include "trainyard/elastic/etcd_backend.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/error.h"

#ifndef TRAINYARD_ETCD_PATH
#error "TRAINYARD_ETCD_PATH must name the etcd executable (a compile definition)"
#endif

namespace trainyard::elastic {

inline constexpr const char* kEtcd = TRAINYARD_ETCD_PATH;

// What can be read from a non-blocking pipe now.
inline std::string pending_output(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; fd >= 0 && (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  return out;
}

// A one-member etcd cluster on free loopback ports; stopped (SIGTERM) on destruction. stop() and
// start() take it away and bring it back on the same ports and data (an outage).
class EtcdServer {
 public:
  EtcdServer() {
    int client_port = 0, peer_port = 0;
    {
      // Both held at once so that they differ; released for etcd to bind a moment later.
      auto client = mptest::bind_loopback(false, &client_port);
      auto peer = mptest::bind_loopback(false, &peer_port);
    }
    endpoint_ = "127.0.0.1:" + std::to_string(client_port);
    peer_endpoint_ = "127.0.0.1:" + std::to_string(peer_port);
    start();
  }

  // Stops etcd (SIGTERM, waits for it); the data stays.
  void stop() { child_.reset(); }

  // Starts etcd (again) and waits until it answers.
  void start() {
    const std::string client_url = "http://" + endpoint_;
    const std::string peer_url = "http://" + peer_endpoint_;
    const std::string log = (dir_.path() / "etcd.log").string();
    child_.emplace(SubprocessOptions{
        .argv = {kEtcd, "--name=test", "--data-dir=" + (dir_.path() / "data").string(),
                 "--logger=zap", "--log-outputs=" + log, "--log-level=warn",
                 // A lone member elects itself after the election timeout: keep it short.
                 "--heartbeat-interval=10", "--election-timeout=100",
                 "--listen-client-urls=" + client_url, "--advertise-client-urls=" + client_url,
                 "--listen-peer-urls=" + peer_url, "--initial-advertise-peer-urls=" + peer_url,
                 "--initial-cluster=test=" + peer_url},
        // Quiet (its log goes to the file), but gRPC may still warn on stderr while it stops.
        .stdout_mode = OutputMode::kPipe,
        .stderr_mode = OutputMode::kPipe,
        .destructor_term_timeout = std::chrono::seconds(2)});
    // Ready once it answers a read (it takes about 0.1 s).
    auto probe = make_etcd_backend({.endpoint = endpoint_,
                                    .key = "/probe",
                                    .timeout = std::chrono::milliseconds(500),
                                    .max_attempts = 1});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (true) {
      try {
        probe->get_state();
        return;
      } catch (const Error& e) {
        if (std::chrono::steady_clock::now() > deadline || !child_->running()) {
          throw std::runtime_error(std::string("etcd did not start within 10 s: ") + e.what() +
                                   "\nits log:\n" + mptest::read_file(log) + "\nits stderr:\n" +
                                   pending_output(child_->stderr_fd()));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& peer_endpoint() const { return peer_endpoint_; }  // raft, no gateway

 private:
  mptest::TempDir dir_;
  std::string endpoint_;
  std::string peer_endpoint_;
  std::optional<Subprocess> child_;
};

// Runs next_round on each node on its own thread; rethrows the first failure.
}  // namespace trainyard::elastic
