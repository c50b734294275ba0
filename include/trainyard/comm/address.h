// Small questions about network addresses that the launcher and the process group both ask.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace trainyard {

// True for "localhost", 127.0.0.0/8 and ::1 (numeric addresses; names other than localhost are
// not resolved).
bool is_loopback_address(const std::string& addr);

// True when `host` (a name or an address) resolves to an address this machine has, so that a
// server can listen there.
bool is_local_address(const std::string& host);

// Connects to host:port (and closes the connection at once), retrying refused, unreachable and
// timed-out attempts with a growing pause, until one succeeds or `timeout` has passed; while the
// host answers by refusing (it is up, the port not yet served: rank 0's node starting late) the
// limit is `refused_timeout` when that is longer. Blocks for at most about the limit; each
// attempt waits at most 5 s for an answer, so an address that drops packets is told apart from
// one that refuses. Throws NetworkError "Cannot reach <what> within
// <seconds> s (...; the last: <error>). HINT: <hint>", with what e.g. "the rendezvous store at
// 10.0.0.1:29500 (MASTER_ADDR:MASTER_PORT)". Thread-safe.
// What route_address() names in its messages.
struct RouteNames {
  std::string what = "the rendezvous host";   // the host being routed to, e.g. "the head"
  std::string host_flag = "--rdzv-endpoint";  // the flag that gave the host
  std::string local_flag = "--local-addr";    // the flag that overrides the answer
};

// The address of this host on the route to host:port, i.e. what the other nodes reach this one
// at: the kernel's source address for a UDP socket "connected" there (nothing is sent). On the
// host's own machine the route is loopback, which other nodes cannot reach: the first address of
// an interface that is up is taken instead. Resolves `host` (blocking, getaddrinfo). Throws
// NetworkError naming `names.what` and the flags when the host does not resolve or has no route.
std::string route_address(const std::string& host, int port, const RouteNames& names = {});

// The first IPv4 address of an interface that is up, not loopback and not link-local
// (169.254.0.0/16), or "".
std::string first_interface_address();

void wait_until_reachable(const std::string& host,
                          std::uint16_t port,
                          std::chrono::milliseconds timeout,
                          std::chrono::milliseconds refused_timeout,
                          const std::string& what,
                          const std::string& hint);

}  // namespace trainyard
