// Several hosts on one machine for the end-to-end tests: network namespaces on a bridge, each
// with an address from 198.18.0.0/15 (the range reserved for benchmarking, so no test traffic ever
// aims at a real network), their own /etc/hosts, and ways to kill, pause or cut one off.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../multiproc/multiproc_util.h"

namespace trainyard::mptest {

// A bridge and N namespaces ty<pid>n<i> with addresses 198.18.213.<i+1>/24; all removed on
// destruction.
class Hosts {
 public:
  explicit Hosts(int n) {
    const std::string tag = std::to_string(getpid() % 100000);
    bridge_ = "tyb" + tag;
    if (!ip({"link", "add", bridge_, "type", "bridge"}) || !ip({"link", "set", bridge_, "up"})) {
      return;
    }
    for (int i = 0; i < n; ++i) {
      const std::string ns = "ty" + tag + "n" + std::to_string(i);
      const std::string host_side = "tyv" + tag + "_" + std::to_string(i);
      const std::string addr = "198.18.213." + std::to_string(i + 1);
      names_.push_back(ns);
      if (!ip({"netns", "add", ns}) ||
          !ip({"link", "add", host_side, "type", "veth", "peer", "name", "eth0", "netns", ns}) ||
          !ip({"link", "set", host_side, "master", bridge_, "up"}) ||
          !ip({"netns", "exec", ns, "ip", "addr", "add", addr + "/24", "dev", "eth0"}) ||
          !ip({"netns", "exec", ns, "ip", "link", "set", "eth0", "up"}) ||
          !ip({"netns", "exec", ns, "ip", "link", "set", "lo", "up"})) {
        return;
      }
      addrs_.push_back(addr);
    }
    ok_ = true;
  }
  ~Hosts() {
    for (std::size_t i = 0; i < names_.size(); ++i) kill_all(static_cast<int>(i));
    for (const auto& ns : names_) ip({"netns", "del", ns});
    ip({"link", "del", bridge_});
    std::error_code ec;
    for (const auto& ns : names_) std::filesystem::remove_all("/etc/netns/" + ns, ec);
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  const std::string& addr(int i) const { return addrs_[i]; }
  // Namespace i's name, for `ip netns exec NAME`.
  const std::string& name(int i) const { return names_[i]; }

  // argv run inside namespace i.
  std::vector<std::string> in(int i, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"ip", "netns", "exec", names_[i]});
    return argv;
  }

  // Names that resolve inside namespace i: `ip netns exec` mounts /etc/netns/<ns>/hosts over
  // /etc/hosts, as a private DNS zone (Cloud Map, a cluster's DNS) gives each host its view.
  // Applies to the commands started afterwards.
  bool set_hosts(int i, const std::string& lines) {
    std::error_code ec;
    const std::filesystem::path dir = "/etc/netns/" + names_[i];
    std::filesystem::create_directories(dir, ec);
    std::ofstream out(dir / "hosts", std::ios::trunc);
    out << "127.0.0.1 localhost\n" << lines;
    return !ec && out.good();
  }

  // SIGKILL to every process in namespace i: the node is gone.
  void kill_all(int i) {
    for (int pid : pids(i)) kill(pid, SIGKILL);
  }

  // Cuts (up = false) or restores node i's link: its own interface goes down, as when its cable
  // is pulled, so its connections fail at once (no route) rather than after TCP's retries. The
  // address stays, and its route returns with the interface.
  bool set_link(int i, bool up) {
    return ip({"-n", names_[i], "link", "set", "eth0", up ? "up" : "down"});
  }

  // `sig` to the training ranks in namespace i (the processes with RANK in their environment),
  // not to the agent. Returns how many got it.
  int signal_ranks(int i, int sig) {
    int n = 0;
    for (int pid : pids(i)) {
      const auto environ = read_file("/proc/" + std::to_string(pid) + "/environ");
      if (environ.starts_with("RANK=") ||
          environ.find(std::string("\0RANK=", 6)) != std::string::npos) {
        n += kill(pid, sig) == 0 ? 1 : 0;
      }
    }
    return n;
  }

 private:
  std::vector<int> pids(int i) {
    auto r = run_program({"ip", "netns", "pids", names_[i]}, {}, std::chrono::seconds(5));
    std::istringstream in(r.out);
    std::vector<int> out;
    for (int pid; in >> pid;) out.push_back(pid);
    return out;
  }

  bool ip(std::vector<std::string> args) {
    args.insert(args.begin(), "ip");
    auto r = run_program(args, {}, std::chrono::seconds(10));
    if (!r.status.success() && error_.empty()) error_ = r.err;
    return r.status.success();
  }
  std::string bridge_;
  std::vector<std::string> names_, addrs_;
  std::string error_;
  bool ok_ = false;
};

}  // namespace trainyard::mptest
