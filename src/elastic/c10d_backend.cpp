#include "trainyard/elastic/c10d_backend.h"

#include <netdb.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/exception.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

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
//
// A client whose request failed is dropped and the next call connects afresh: after a timeout the
// old connection may still deliver the late answer, which would be read as the next one's.
class C10dBackend final : public RendezvousBackend {
 public:
  // `store` is the connected store; `serving` when this agent serves it (then it is never dropped).
  C10dBackend(c10::intrusive_ptr<c10d::TCPStore> store,
              c10d::TCPStoreOptions client_options,
              std::string host,
              std::string key,
              std::string where,
              bool serving)
      : store_(std::move(store)),
        client_options_(client_options),
        host_(std::move(host)),
        key_(std::move(key)),
        where_(std::move(where)),
        serving_(serving) {}

  // The operations capture what they use by value: see Note [Bounding store calls].
  std::optional<std::pair<std::string, std::string>> get_state() override {
    using State = std::optional<std::pair<std::string, std::string>>;
    return guarded<State>([key = key_](c10d::TCPStore& store) -> State {
      if (!store.check({key})) return std::nullopt;
      auto state = text(store.get(key));
      return std::make_pair(state, state);
    });
  }

  SetResult set_state(const std::string& state, const std::optional<std::string>& token) override {
    return guarded<SetResult>([key = key_, expected = bytes(token.value_or("")),
                               desired = bytes(state), state](c10d::TCPStore& store) {
      // With an empty expected value, compareSet creates the key only if it is absent.
      const auto now = text(store.compareSet(key, expected, desired));
      return SetResult{.state = now, .token = now, .written = now == state};
    });
  }

  std::string describe() const override { return where_; }

 private:
  // Runs op on a connected store, within the request timeout where the store is another agent's
  // (Note [Bounding store calls]); store failures become NetworkError naming the store.
  template <typename R>
  R guarded(std::function<R(c10d::TCPStore&)> op) {
    std::string what;
    const auto start = std::chrono::steady_clock::now();
    try {
      if (!store_) store_ = c10::make_intrusive<c10d::TCPStore>(host_, client_options_);
      R result = serving_ ? op(*store_) : bounded(std::move(op));
      failing_since_.reset();
      return result;
    } catch (const c10::Error& e) {
      what = e.what_without_backtrace();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // c10d's socket errors and timeouts, system errors
      what = e.what();
    }
    if (!serving_) store_.reset();
    if (!failing_since_) failing_since_ = start;
    throw store_error(what);
  }

  // Note [Bounding store calls]
  // LibTorch 2.x's TCPStore client retries a request whose answer does not come within its
  // timeout, reconnecting, for as long as the store's host stays silent (a client of a SIGSTOPped
  // store waited past 25 s with a 3 s timeout; torch 2.15): a node whose link is cut would never
  // learn that the store is gone. So a call to another agent's store runs on a thread of its own,
  // holding its own reference to the store and copies of its arguments, and the agent waits for
  // it at most the request timeout. Past that the store is dropped, the call reports a network
  // error as any failed call does, and the thread is left to finish alone: it ends when the
  // client's retries do (the link back, or the store's host refusing the connection).
  template <typename R>
  R bounded(std::function<R(c10d::TCPStore&)> op) {
    auto task = std::make_shared<std::packaged_task<R()>>(
        [store = store_, op = std::move(op)] { return op(*store); });
    auto answer = task->get_future();
    std::thread([task] { (*task)(); }).detach();
    if (answer.wait_for(client_options_.timeout) == std::future_status::timeout) {
      throw std::runtime_error(fmt::format("no answer within the request timeout ({:.1f} s)",
                                           client_options_.timeout.count() / 1000.0));
    }
    return answer.get();
  }

  NetworkError store_error(const std::string& what) const {
    const double silent_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - *failing_since_).count();
    return NetworkError(fmt::format(
        "No answer from the rendezvous store at {}:{} for {:.1f} s: either this node's network is "
        "down or the agent serving it exited (it is the one started with --rdzv-endpoint on its "
        "own host). Last error: {}",
        host_, client_options_.port, silent_s, what));
  }

  c10::intrusive_ptr<c10d::TCPStore> store_;  // null after a failure, until the next call
  const c10d::TCPStoreOptions client_options_;
  const std::string host_;
  const std::string key_;
  const std::string where_;
  const bool serving_;
  // When the first of the calls failing since the last success began.
  std::optional<std::chrono::steady_clock::time_point> failing_since_;
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
  options.timeout = o.request_timeout;
  if (o.may_serve && is_local_address(o.host) && port_is_free(o.host, o.port)) {
    options.isServer = true;
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(o.host, options);
      log->info("Serving the rendezvous store on {}:{}.", o.host, o.port);
      return std::make_unique<C10dBackend>(std::move(store), options, o.host, o.key,
                                           where + " (served here)", /*serving=*/true);
    } catch (const std::exception& e) {
      // Another agent on this host serves it already (we lost the race): join as a client.
      log->debug("Not serving the rendezvous store on {}:{} ({}); connecting to it.", o.host,
                 o.port, e.what());
    }
    options.isServer = false;
  }
  // The serving agent may start later: connect with the request timeout, again until o.timeout.
  const auto deadline = std::chrono::steady_clock::now() + o.timeout;
  while (true) {
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(o.host, options);
      return std::make_unique<C10dBackend>(std::move(store), options, o.host, o.key, where,
                                           /*serving=*/false);
    } catch (const std::exception& e) {
      if (std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      throw NetworkError(detail::concat(
          "Cannot reach the rendezvous ", where, " within ", o.timeout.count() / 1000.0,
          " s: ", e.what(),
          " HINT: start the agent on that host first (it serves the store), and check "
          "--rdzv-endpoint and the network."));
    }
  }
}

}  // namespace trainyard::elastic
