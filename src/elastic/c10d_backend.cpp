#include "trainyard/elastic/c10d_backend.h"

#include <netdb.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/exception.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <memory>

#include "trainyard/comm/address.h"
#include "trainyard/error.h"
#include "trainyard/log.h"

namespace trainyard::elastic {
namespace {

std::vector<std::uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string text(const std::vector<std::uint8_t>& b) {
  return {b.begin(), b.end()};
}

// The state's token is the state itself: TCPStore's compareSet compares whole values.
class C10dBackend final : public RendezvousBackend {
  // Store failures become NetworkError naming the store.
  template <typename F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const c10::Error& e) {
      throw store_error(e.what_without_backtrace());
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // c10d's socket errors and timeouts, system errors
      throw store_error(e.what());
    }
  }

  NetworkError store_error(const std::string& what) const {
    return NetworkError(detail::concat("The rendezvous store (", where_, ") failed: ", what,
                                       " HINT: the agent serving it may have exited; it is the "
                                       "one started with --rdzv-endpoint on its own host."));
  }

 public:
  C10dBackend(c10::intrusive_ptr<c10d::TCPStore> store, std::string key, std::string where)
      : store_(std::move(store)), key_(std::move(key)), where_(std::move(where)) {}

  std::optional<std::pair<std::string, std::string>> get_state() override {
    return guarded([&]() -> std::optional<std::pair<std::string, std::string>> {
      if (!store_->check({key_})) return std::nullopt;
      auto state = text(store_->get(key_));
      return std::make_pair(state, state);
    });
  }

  SetResult set_state(const std::string& state, const std::optional<std::string>& token) override {
    return guarded([&] {
      // With an empty expected value, compareSet creates the key only if it is absent.
      const auto now = text(store_->compareSet(key_, bytes(token.value_or("")), bytes(state)));
      return SetResult{.state = now, .token = now, .written = now == state};
    });
  }

  std::string describe() const override { return where_; }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::string key_;
  std::string where_;
};

// Whether host:port can be bound now (as TCPStore binds it, with SO_REUSEADDR); checked first so
// that the usual case, another agent on this host already serving, logs no bind failures.
bool port_is_free(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool free = false;
  for (addrinfo* a = found; a != nullptr && !free; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    free = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(found);
  return free;
}

}  // namespace

std::unique_ptr<RendezvousBackend> make_c10d_backend(const C10dBackendOptions& o) {
  TY_CHECK(!o.host.empty() && o.port != 0, "The c10d rendezvous needs a host and a port.");
  const std::string where = detail::concat("c10d store at ", o.host, ":", o.port);
  auto log = logger("rendezvous");
  c10d::TCPStoreOptions options;
  options.port = o.port;
  options.waitWorkers = false;
  options.timeout = o.timeout;
  if (o.may_serve && is_local_address(o.host) && port_is_free(o.host, o.port)) {
    options.isServer = true;
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(o.host, options);
      log->info("Serving the rendezvous store on {}:{}.", o.host, o.port);
      return std::make_unique<C10dBackend>(std::move(store), o.key, where + " (served here)");
    } catch (const std::exception& e) {
      // Another agent on this host serves it already (we lost the race): join as a client.
      log->debug("Not serving the rendezvous store on {}:{} ({}); connecting to it.", o.host,
                 o.port, e.what());
    }
    options.isServer = false;
  }
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(o.host, options);
    return std::make_unique<C10dBackend>(std::move(store), o.key, where);
  } catch (const std::exception& e) {
    throw NetworkError(
        detail::concat("Cannot reach the rendezvous ", where, " within ",
                       o.timeout.count() / 1000.0, " s: ", e.what(),
                       " HINT: start the agent on that host first (it serves the store), and check "
                       "--rdzv-endpoint and the network."));
  }
}

}  // namespace trainyard::elastic
