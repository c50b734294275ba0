#include "trainyard/comm/address.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "trainyard/error.h"
#include "trainyard/log.h"

namespace trainyard {

bool is_loopback_address(const std::string& addr) {
  in_addr v4{};
  if (inet_pton(AF_INET, addr.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, addr.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return addr == "localhost";
}

bool is_local_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool local = false;
  for (addrinfo* a = found; a != nullptr && !local; a = a->ai_next) {
    // Binding succeeds only on an address this machine has.
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    local = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(found);
  return local;
}

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kAttemptTimeout{5000};  // the longest one connect() may wait for an answer
constexpr milliseconds kFirstPause{100};
constexpr milliseconds kMaxPause{1000};

// One connect to a: empty on success, else why it failed; `refused` tells whether the host
// answered by refusing (it is up; nothing listens on the port yet).
std::string try_connect(const addrinfo& a, milliseconds wait, bool& refused) {
  refused = false;
  const int fd = socket(a.ai_family, a.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a.ai_protocol);
  if (fd < 0) return std::strerror(errno);
  std::string error;
  if (connect(fd, a.ai_addr, a.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      refused = errno == ECONNREFUSED;
      error = std::strerror(errno);
    } else {
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      int n;
      do {
        n = poll(&p, 1, static_cast<int>(std::max<long>(1, wait.count())));
      } while (n < 0 && errno == EINTR);
      if (n == 0) {
        error = fmt::format("no answer within {:.1f} s (packets dropped?)", wait.count() / 1000.0);
      } else {
        int so_error = 0;
        socklen_t len = sizeof(so_error);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
        refused = so_error == ECONNREFUSED;
        if (so_error != 0) error = std::strerror(so_error);
      }
    }
  }
  close(fd);
  return error;
}

}  // namespace

void wait_until_reachable(const std::string& host,
                          std::uint16_t port,
                          milliseconds timeout,
                          milliseconds refused_timeout,
                          const std::string& what,
                          const std::string& hint) {
  const auto start = Clock::now();
  auto deadline = start + timeout;
  auto next_log = start + std::chrono::seconds(10);
  milliseconds pause = kFirstPause;
  std::string last_error = "no attempt finished";
  int attempts = 0;
  while (true) {
    ++attempts;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string service = std::to_string(port);
    if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
      last_error = detail::concat("cannot resolve '", host, "': ", gai_strerror(rc));
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
        bool refused = false;
        auto error = try_connect(*a, std::clamp(left, milliseconds(1), kAttemptTimeout), refused);
        if (error.empty()) {
          freeaddrinfo(found);
          return;
        }
        last_error = std::move(error);
        // The host answers: the process that serves the port may just start later.
        deadline = start + (refused ? std::max(timeout, refused_timeout) : timeout);
      }
      freeaddrinfo(found);
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (now >= next_log) {
      logger("comm")->warn("Still trying to reach {} ({} attempts, last: {}).", what, attempts,
                           last_error);
      next_log = now + std::chrono::seconds(10);
    }
    std::this_thread::sleep_for(std::min(pause, std::chrono::ceil<milliseconds>(deadline - now)));
    pause = std::min(pause * 2, kMaxPause);
  }
  throw NetworkError(fmt::format(
      "Cannot reach {} within {:.1f} s ({} attempts; the last: {}). HINT: {}", what,
      std::chrono::duration<double>(Clock::now() - start).count(), attempts, last_error, hint));
}

std::string first_interface_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* i = list; i != nullptr && out.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
        (i->ifa_flags & IFF_LOOPBACK)) {
      continue;
    }
    const auto& addr = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    // Link-local 169.254.0.0/16 (an ECS awsvpc task's ecs-eth0, the metadata endpoints) is not
    // an address the other nodes can reach.
    if ((ntohl(addr.s_addr) >> 16) == ((169u << 8) | 254u)) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (inet_ntop(AF_INET, &addr, text, sizeof text) != nullptr) out = text;
  }
  freeifaddrs(list);
  return out;
}

std::string route_address(const std::string& host, int port, const RouteNames& names) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0) {
    throw NetworkError(detail::concat("Cannot resolve ", names.what, " '", host, "'. HINT: check ",
                                      names.host_flag, ", or pass ", names.local_flag, "."));
  }
  std::string addr;
  for (addrinfo* a = found; a != nullptr && addr.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    char text[INET6_ADDRSTRLEN] = {};
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* raw =
          local.ss_family == AF_INET6
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (inet_ntop(local.ss_family, raw, text, sizeof text) != nullptr) addr = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  TY_CHECK_T(NetworkError, !addr.empty(), "No route to ", names.what, " '", host, "'. HINT: check ",
             names.host_flag, " and the network, or pass ", names.local_flag, ".");
  // On the endpoint's own host the route is loopback (a host name in /etc/hosts as 127.0.1.1,
  // say), which the other nodes cannot reach: take the first address on a real interface.
  if (is_loopback_address(addr) && !is_loopback_address(host)) {
    addr = first_interface_address();
    TY_CHECK_T(NetworkError, !addr.empty(), "This host reaches ", names.what, " '", host,
               "' only through loopback and has no other address for the other nodes. HINT: "
               "pass ",
               names.local_flag, " with this node's address.");
  }
  return addr;
}

}  // namespace trainyard
