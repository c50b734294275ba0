#include "trainyard/net/http_server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <poll.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>
#include <vector>

#include "trainyard/log.h"

// Note [Serving hostile clients]
// The head listens where anyone on the network (and every local user) can connect. Under
// civetweb each connection held a worker thread while its request arrived: 33 idle connections,
// or 40 clients sending a byte a second, took every thread for 30 s, heartbeats went unread and
// healthy nodes were declared dead; 32 log followers that did not read froze it the same way.
// So the server is event-driven (libmicrohttpd with an epoll thread pool):
//  - a connection holds no thread until its request is complete; handlers run on `threads`
//    threads, each for the few milliseconds a handler takes;
//  - the whole request (line, headers, body) must arrive within request_timeout of the connect:
//    the io thread shuts down the sockets of requests past it (libmicrohttpd's own timeout only
//    measures silence, which a client sending a byte a second never is);
//  - connections are capped in all and per client address (Note [Keeping room for admitted
//    clients]), and bodies by max_body_bytes, read only once the hook (authentication) has
//    accepted the headers;
//  - a WebSocket is a socket handed over after the handshake and served by the io thread with
//    non-blocking writes: send_text() queues and returns, a client whose queue passes
//    websocket_buffer_bytes, or that takes nothing for websocket_stall_timeout while bytes wait,
//    is dropped with close code 1008. A follower that does not read costs a buffer, not a thread.
// Every response says Connection: close (Note [No keep-alive]): a client's next request is a new
// connection, so the deadline counts from the connect.

// Note [Keeping room for admitted clients]
// The caps on connections (max_connections in all, max_connections_per_client from one address)
// are the server's own, not libmicrohttpd's (which is given twice as many, and no cap per
// address, so that it never refuses first). libmicrohttpd refused whatever came past a cap: 256
// idle connections from the workers' address (any local user on a one-host cluster), or 768 from
// anywhere, and no heartbeat got in; without a token, a stranger had healthy nodes declared dead
// and their jobs FAILED. Now a connection past a cap makes room: the oldest connection that no
// hook has admitted yet (its request has not arrived, or was refused) goes, from the same address
// for the cap per address, else from the address holding the most; a connection whose request
// the hook admitted (an authenticated client's) is never shut down for another's. Only when
// every connection in the way is admitted is the new one refused. Each eviction and refusal is
// counted (Stats), so that the head knows when it may have turned a heartbeat away (Note [A head
// that turned connections away] in head_state.cpp).

// Note [No keep-alive]
// A kept-alive connection is a client waiting between requests: with a deadline per request it
// would have to be measured from its first byte, which the server does not see. One request per
// connection keeps the rule simple; a connect on loopback or a LAN costs well under a
// millisecond.

namespace trainyard::net {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (j > i) out.push_back(path.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// Matches path segments against a pattern's; {name} segments are captured into params.
bool match(const std::vector<std::string>& pattern,
           const std::vector<std::string>& path,
           std::map<std::string, std::string>& params) {
  if (pattern.size() != path.size()) return false;
  std::map<std::string, std::string> found;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const std::string& p = pattern[i];
    if (p.size() >= 2 && p.front() == '{' && p.back() == '}') {
      found[p.substr(1, p.size() - 2)] = path[i];
    } else if (p != path[i]) {
      return false;
    }
  }
  params = std::move(found);
  return true;
}

MHD_Result collect_header(void* cls, MHD_ValueKind, const char* key, const char* value) {
  static_cast<ServerHeaders*>(cls)->emplace(key, value ? value : "");
  return MHD_YES;
}

MHD_Result collect_query(void* cls, MHD_ValueKind, const char* key, const char* value) {
  (*static_cast<std::map<std::string, std::string>*>(cls))[key] = value ? value : "";
  return MHD_YES;
}

std::string peer_address(MHD_Connection* c) {
  const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (info == nullptr || info->client_addr == nullptr) return "";
  char buf[INET6_ADDRSTRLEN] = {};
  const sockaddr* sa = info->client_addr;
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

MHD_Result send_response(MHD_Connection* c, const ServerResponse& res) {
  MHD_Response* r = MHD_create_response_from_buffer(
      res.body.size(), const_cast<char*>(res.body.data()), MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", res.content_type.c_str());
  for (const auto& [name, value] : res.headers) {
    if (strcasecmp(name.c_str(), "Content-Type") == 0 ||
        strcasecmp(name.c_str(), "Content-Length") == 0 ||
        strcasecmp(name.c_str(), "Connection") == 0)
      continue;
    MHD_add_response_header(r, name.c_str(), value.c_str());
  }
  MHD_add_response_header(r, "Connection", "close");  // Note [No keep-alive]
  const MHD_Result ok = MHD_queue_response(c, static_cast<unsigned>(res.status), r);
  MHD_destroy_response(r);
  return ok;
}

// --- WebSocket framing (RFC 6455), the server's side -------------------------------------------

constexpr const char* kWebSocketGuid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
constexpr unsigned char kOpText = 0x1, kOpClose = 0x8, kOpPing = 0x9, kOpPong = 0xA;
constexpr std::size_t kMaxClientFrameBytes = 64 << 10;  // clients send only control frames here

std::string accept_key(const std::string& key) {
  const std::string text = key + kWebSocketGuid;
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  unsigned char out[4 * ((SHA_DIGEST_LENGTH + 2) / 3) + 1];
  const int n = EVP_EncodeBlock(out, digest, SHA_DIGEST_LENGTH);
  return std::string(reinterpret_cast<char*>(out), static_cast<std::size_t>(n));
}

// One unmasked frame with FIN set.
std::string frame(unsigned char opcode, std::string_view payload) {
  std::string f;
  f.push_back(static_cast<char>(0x80 | opcode));
  const std::size_t n = payload.size();
  if (n < 126) {
    f.push_back(static_cast<char>(n));
  } else if (n <= 0xffff) {
    f.push_back(static_cast<char>(126));
    f.push_back(static_cast<char>(n >> 8));
    f.push_back(static_cast<char>(n & 0xff));
  } else {
    f.push_back(static_cast<char>(127));
    for (int shift = 56; shift >= 0; shift -= 8)
      f.push_back(static_cast<char>((n >> shift) & 0xff));
  }
  f.append(payload);
  return f;
}

std::string close_frame(int code, std::string_view reason) {
  std::string payload;
  payload.push_back(static_cast<char>(code >> 8));
  payload.push_back(static_cast<char>(code & 0xff));
  payload.append(reason.substr(0, 120));
  return frame(kOpClose, payload);
}

bool header_has_token(const std::string& value, const char* token) {
  // "keep-alive, Upgrade" contains the token "upgrade".
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  return v.find(token) != std::string::npos;
}

// A WebSocket after the handshake: its socket belongs to the server's io thread, which writes the
// queued bytes and reads the client's frames. Writers only queue (Note [Serving hostile clients]).
class Socket final : public WebSocketConnection {
 public:
  Socket(int fd,
         MHD_UpgradeResponseHandle* urh,
         ServerRequest request,
         std::size_t max_buffer,
         std::function<void()> wake)
      : fd_(fd),
        urh_(urh),
        request_(std::move(request)),
        max_buffer_(max_buffer),
        wake_(std::move(wake)),
        progress_at_(Clock::now()) {}

  bool send_text(const std::string& text) override {
    bool queued = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (gone_ || close_queued_) return false;
      if (out_.size() + text.size() > max_buffer_) {
        drop_locked("the client does not read what it is sent");
      } else {
        if (out_.empty()) progress_at_ = Clock::now();
        out_ += frame(kOpText, text);
        queued = true;
      }
    }
    wake_();
    return queued;
  }

  std::size_t buffered_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return out_.size();
  }

  void close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (gone_ || close_queued_) return;
      queue_close_locked(1000, "");
    }
    wake_();
  }

  bool closed() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return gone_ || close_queued_;
  }

  void on_closed(std::function<void()> callback) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!gone_) {
        callbacks_.push_back(std::move(callback));
        return;
      }
    }
    callback();
  }

  const ServerRequest& request() const override { return request_; }

  // --- the io thread's side ---------------------------------------------------------------------
  int fd() const { return fd_; }
  bool wants_write() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !out_.empty();
  }
  void add_input(std::string_view bytes) { in_.append(bytes); }

  // Writes what the socket takes; reads and answers the client's frames. False once the
  // connection is over (the client left, closed, or was dropped and its close went out).
  bool serve(short revents, Clock::time_point now, std::chrono::milliseconds stall_timeout) {
    if (revents & POLLIN) {
      char buf[16384];
      for (;;) {
        const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
          in_.append(buf, static_cast<std::size_t>(n));
          if (in_.size() > kMaxClientFrameBytes + 14) return false;
          continue;
        }
        if (n == 0) return false;  // the client went away
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return false;
      }
      if (!read_frames()) return false;
    }
    if ((revents & (POLLERR | POLLHUP)) && !(revents & POLLIN)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    while (!out_.empty()) {
      const ssize_t n = ::send(fd_, out_.data(), out_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        out_.erase(0, static_cast<std::size_t>(n));
        progress_at_ = now;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return false;  // the connection broke
    }
    if (out_.empty()) return !close_queued_;  // a close that went out ends it
    if (now - progress_at_ > stall_timeout) {
      if (close_queued_) return false;  // not even the close is taken: give up
      drop_locked("the client took nothing for " + std::to_string(stall_timeout.count() / 1000) +
                  " s");
    }
    return true;
  }

  bool was_dropped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dropped_;
  }

  // Marks the connection gone and runs the close callbacks; releases the socket to
  // libmicrohttpd unless it has stopped. Called by the io thread or by stop(); once.
  void finish(bool release = true) {
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (gone_) return;
      gone_ = true;
      callbacks.swap(callbacks_);
    }
    if (release) MHD_upgrade_action(urh_, MHD_UPGRADE_ACTION_CLOSE);
    for (auto& cb : callbacks) {
      try {
        cb();
      } catch (const std::exception& e) {
        logger("http")->warn("a WebSocket close callback failed: {}", e.what());
      }
    }
  }

  // stop(): a close frame if the socket takes it at once.
  void say_goodbye() {
    const std::string bye = close_frame(1001, "the server is stopping");
    ::send(fd_, bye.data(), bye.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  }

 private:
  // `mu_` held. The queue is replaced by a close frame: a client that does not read will never
  // read the rest anyway, and the close says why.
  void drop_locked(const std::string& why) {
    if (dropped_) return;
    dropped_ = true;
    logger("http")->warn("WebSocket {} from {} dropped: {}.", request_.path,
                         request_.remote_address, why);
    out_.clear();
    queue_close_locked(1008, why);
  }

  void queue_close_locked(int code, std::string_view reason) {
    close_queued_ = true;
    progress_at_ = Clock::now();
    out_ += close_frame(code, reason);
  }

  // Parses the client's frames in in_ (masked, as clients send them); false when the client
  // closed or broke the protocol.
  bool read_frames() {
    for (;;) {
      if (in_.size() < 2) return true;
      const auto b0 = static_cast<unsigned char>(in_[0]);
      const auto b1 = static_cast<unsigned char>(in_[1]);
      const unsigned char opcode = b0 & 0x0f;
      const bool masked = (b1 & 0x80) != 0;
      std::size_t len = b1 & 0x7f;
      std::size_t pos = 2;
      if (len == 126) {
        if (in_.size() < 4) return true;
        len = (static_cast<unsigned char>(in_[2]) << 8) | static_cast<unsigned char>(in_[3]);
        pos = 4;
      } else if (len == 127) {
        if (in_.size() < 10) return true;
        len = 0;
        for (int i = 2; i < 10; ++i) len = (len << 8) | static_cast<unsigned char>(in_[i]);
        pos = 10;
      }
      if (len > kMaxClientFrameBytes) return false;
      const std::size_t need = pos + (masked ? 4 : 0) + len;
      if (in_.size() < need) return true;
      std::string payload = in_.substr(pos + (masked ? 4 : 0), len);
      if (masked) {
        for (std::size_t i = 0; i < payload.size(); ++i) payload[i] ^= in_[pos + (i % 4)];
      }
      in_.erase(0, need);
      std::lock_guard<std::mutex> lock(mu_);
      if (opcode == kOpClose) {
        if (!close_queued_) {
          close_queued_ = true;
          out_ += frame(kOpClose, payload.substr(0, 2));
        }
        return !out_.empty();
      }
      if (opcode == kOpPing && !close_queued_) out_ += frame(kOpPong, payload);
      // Text, binary and pong frames from followers carry nothing the server uses.
    }
  }

  const int fd_;                          // owned by libmicrohttpd; released through urh_
  MHD_UpgradeResponseHandle* const urh_;  // valid until finish()
  const ServerRequest request_;
  const std::size_t max_buffer_;
  const std::function<void()> wake_;
  std::string in_;  // io thread only

  mutable std::mutex mu_;
  std::string out_;                // frames not yet taken by the socket
  Clock::time_point progress_at_;  // when the socket last took bytes (or bytes began to wait)
  bool close_queued_ = false;
  bool dropped_ = false;
  bool gone_ = false;
  std::vector<std::function<void()>> callbacks_;
};

// One HTTP request being received (libmicrohttpd's per-request context).
struct Request {
  virtual ~Request() = default;
  ServerRequest req;
  bool refused = false;    // a response went out on the first call
  bool too_large = false;  // the body passed max_body_bytes: discarded, answered 413
};

// One connection, for its request deadline and the caps.
struct Conn {
  int fd = -1;
  Clock::time_point started;
  std::string address;        // the client's
  bool request_done = false;  // the request arrived (or the deadline already cut it)
  bool admitted = false;      // the hook accepted its request: Note [Keeping room for ...]
  bool evicted = false;       // shut down to make room for another
};

}  // namespace

bool CaseInsensitiveLess::operator()(const std::string& a, const std::string& b) const {
  return strcasecmp(a.c_str(), b.c_str()) < 0;
}

std::string ServerRequest::header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

ServerResponse ServerResponse::json_error(int status, const std::string& message) {
  ServerResponse res;
  res.status = status;
  res.body = nlohmann::json{{"error", message}}.dump(-1, ' ', false,
                                                     nlohmann::json::error_handler_t::replace);
  return res;
}

struct HttpServer::Impl {
  struct Route {
    std::string method;
    std::vector<std::string> segments;
    HttpHandler handler;
  };
  struct WsRoute {
    std::vector<std::string> segments;
    WebSocketHandler handler;
    WebSocketAdmission admission;
  };
  // What the upgrade callback needs: the request and its route (libmicrohttpd's per-request
  // context of an upgrade).
  struct Upgrade : Request {
    const WsRoute* route = nullptr;
  };

  HttpServerOptions options;
  std::vector<Route> routes;
  std::vector<WsRoute> ws_routes;
  HttpHook hook;
  MHD_Daemon* daemon = nullptr;
  int port = 0;

  std::mutex conns_mu;
  std::unordered_map<MHD_Connection*, Conn> conns;

  std::mutex ws_mu;
  std::vector<std::shared_ptr<Socket>> sockets;
  int wake_fd = -1;  // eventfd: a writer queued bytes, or a socket arrived
  std::thread io;
  std::atomic<bool> stopping{false};
  std::atomic<std::uint64_t> timed_out{0}, dropped{0}, evicted{0}, refused{0};

  void wake() const {
    const std::uint64_t one = 1;
    if (wake_fd >= 0) (void)::write(wake_fd, &one, sizeof one);
  }

  ServerResponse dispatch(ServerRequest& req) {
    std::vector<std::string> segments = split_path(req.path);
    bool path_known = false;
    for (const Route& r : routes) {
      std::map<std::string, std::string> params;
      if (!match(r.segments, segments, params)) continue;
      path_known = true;
      if (r.method != req.method) continue;
      req.params = std::move(params);
      return r.handler(req);
    }
    if (path_known) {
      return ServerResponse::json_error(
          405, "Method " + req.method + " is not allowed on " + req.path + ".");
    }
    return ServerResponse::json_error(404, "No such path: " + req.path + ".");
  }

  void request_arrived(MHD_Connection* c) {
    std::lock_guard<std::mutex> lock(conns_mu);
    if (auto it = conns.find(c); it != conns.end()) it->second.request_done = true;
  }

  // The hook accepted the request's headers: Note [Keeping room for admitted clients].
  void admit(MHD_Connection* c) {
    std::lock_guard<std::mutex> lock(conns_mu);
    if (auto it = conns.find(c); it != conns.end()) it->second.admitted = true;
  }

  // Note [Keeping room for admitted clients]: after connection `newest` arrived, shuts down
  // connections not yet admitted until both caps hold (`newest` itself when nothing else can
  // go). Under conns_mu.
  void make_room(Conn& newest) {
    std::size_t total = 0;
    std::unordered_map<std::string, std::size_t> per_address;
    for (const auto& [c, conn] : conns) {
      if (conn.evicted) continue;
      ++total;
      ++per_address[conn.address];
    }
    const auto max_total = static_cast<std::size_t>(options.max_connections);
    const auto max_per_address = static_cast<std::size_t>(options.max_connections_per_client);
    while (!newest.evicted &&
           (total > max_total || per_address[newest.address] > max_per_address)) {
      // From the new connection's address when it is past its own cap, else from the address
      // holding the most connections not yet admitted.
      std::string from = newest.address;
      if (per_address[newest.address] <= max_per_address) {
        std::unordered_map<std::string, std::size_t> waiting;
        for (const auto& [c, conn] : conns)
          if (!conn.evicted && !conn.admitted) ++waiting[conn.address];
        std::size_t most = 0;
        for (const auto& [address, n] : waiting) {
          if (n <= most) continue;
          most = n;
          from = address;
        }
      }
      Conn* victim = &newest;  // refused, unless an older one can go
      for (auto& [c, conn] : conns)
        if (!conn.evicted && !conn.admitted && conn.address == from &&
            conn.started < victim->started)
          victim = &conn;
      ++(victim == &newest ? refused : evicted);
      victim->evicted = victim->request_done = true;
      if (victim->fd >= 0) ::shutdown(victim->fd, SHUT_RDWR);
      --total;
      --per_address[victim->address];
    }
  }

  // The answer to a WebSocket handshake: nullopt to upgrade, else the refusal.
  std::optional<ServerResponse> admit_websocket(Upgrade& u) {
    std::vector<std::string> segments = split_path(u.req.path);
    for (const WsRoute& r : ws_routes) {
      std::map<std::string, std::string> params;
      if (!match(r.segments, segments, params)) continue;
      u.req.params = std::move(params);
      u.route = &r;
      break;
    }
    if (u.route == nullptr) {
      return ServerResponse::json_error(404, "No WebSocket endpoint at " + u.req.path + ".");
    }
    if (u.req.header("Sec-WebSocket-Key").empty()) {
      return ServerResponse::json_error(400, "A WebSocket handshake needs Sec-WebSocket-Key.");
    }
    {
      std::lock_guard<std::mutex> lock(ws_mu);
      if (static_cast<int>(sockets.size()) >= options.max_websockets) {
        return ServerResponse::json_error(
            503, "The server holds " + std::to_string(sockets.size()) +
                     " WebSockets, its limit (HttpServerOptions.max_websockets). Try later.");
      }
    }
    if (u.route->admission) return u.route->admission(u.req);
    return std::nullopt;
  }

  static MHD_Result on_request(void* cls,
                               MHD_Connection* c,
                               const char* url,
                               const char* method,
                               const char*,
                               const char* upload_data,
                               size_t* upload_data_size,
                               void** con_cls) {
    auto* self = static_cast<Impl*>(cls);
    if (*con_cls == nullptr) {
      // The first call: the line and the headers, no body yet.
      ServerHeaders headers;
      MHD_get_connection_values(c, MHD_HEADER_KIND, &collect_header, &headers);
      const bool upgrade =
          header_has_token(headers.count("Upgrade") ? headers.at("Upgrade") : "", "websocket");
      Request* r = upgrade ? new Upgrade() : new Request();
      *con_cls = r;
      r->req.method = method ? method : "";
      r->req.path = url ? url : "/";
      r->req.headers = std::move(headers);
      MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, &collect_query, &r->req.query);
      r->req.remote_address = peer_address(c);
      std::optional<ServerResponse> refusal;
      try {
        // The hook (authentication) judges the headers before the body is read, so that a client
        // without the token cannot make the server read and hold up to max_body_bytes.
        if (self->hook) refusal = self->hook(r->req);
        if (!refusal) self->admit(c);
        if (!refusal && upgrade) refusal = self->admit_websocket(static_cast<Upgrade&>(*r));
        const char* length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (!refusal && length != nullptr && std::atoll(length) > self->options.max_body_bytes) {
          refusal = ServerResponse::json_error(
              413, "The request body of " + std::string(length) +
                       " bytes is larger than the limit of " +
                       std::to_string(self->options.max_body_bytes) + " bytes.");
        }
      } catch (const std::exception& e) {
        refusal = ServerResponse::json_error(500, e.what());
      }
      if (refusal) {
        r->refused = true;
        self->request_arrived(c);
        return send_response(c, *refusal);
      }
      if (upgrade) {
        self->request_arrived(c);
        return self->upgrade(c, static_cast<Upgrade&>(*r));
      }
      return MHD_YES;
    }
    auto* r = static_cast<Request*>(*con_cls);
    if (r->refused) {
      *upload_data_size = 0;  // the answer went out; what follows is discarded
      return MHD_YES;
    }
    if (*upload_data_size > 0) {
      if (!r->too_large) {
        if (static_cast<long long>(r->req.body.size() + *upload_data_size) >
            self->options.max_body_bytes) {
          r->too_large = true;
          r->req.body.clear();
        } else {
          r->req.body.append(upload_data, *upload_data_size);
        }
      }
      *upload_data_size = 0;
      return MHD_YES;
    }
    // The last call: the request is complete.
    self->request_arrived(c);
    ServerResponse res;
    if (r->too_large) {
      res = ServerResponse::json_error(413, "The request body is larger than the limit of " +
                                                std::to_string(self->options.max_body_bytes) +
                                                " bytes.");
      return send_response(c, res);
    }
    try {
      res = self->dispatch(r->req);
    } catch (const HttpStatusError& e) {
      res = ServerResponse::json_error(e.status(), e.what());
    } catch (const std::exception& e) {
      logger("http")->warn("{} {} failed: {}", r->req.method, r->req.path, e.what());
      res = ServerResponse::json_error(500, e.what());
    } catch (...) {
      res = ServerResponse::json_error(500, "internal error");
    }
    return send_response(c, res);
  }

  MHD_Result upgrade(MHD_Connection* c, Upgrade& u) {
    MHD_Response* r = MHD_create_response_for_upgrade(&Impl::on_upgraded, this);
    if (r == nullptr) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_UPGRADE, "websocket");
    MHD_add_response_header(r, "Sec-WebSocket-Accept",
                            accept_key(u.req.header("Sec-WebSocket-Key")).c_str());
    const MHD_Result ok = MHD_queue_response(c, MHD_HTTP_SWITCHING_PROTOCOLS, r);
    MHD_destroy_response(r);
    return ok;
  }

  static void on_upgraded(void* cls,
                          MHD_Connection*,
                          void* con_cls,
                          const char* extra_in,
                          size_t extra_in_size,
                          MHD_socket sock,
                          MHD_UpgradeResponseHandle* urh) {
    auto* self = static_cast<Impl*>(cls);
    auto* u = static_cast<Upgrade*>(con_cls);
    auto socket = std::make_shared<Socket>(sock, urh, u->req, self->options.websocket_buffer_bytes,
                                           [self] { self->wake(); });
    if (extra_in_size > 0) socket->add_input(std::string_view(extra_in, extra_in_size));
    {
      std::lock_guard<std::mutex> lock(self->ws_mu);
      self->sockets.push_back(socket);
    }
    self->wake();
    try {
      u->route->handler(socket);
    } catch (const std::exception& e) {
      logger("http")->warn("WebSocket {} failed: {}", u->req.path, e.what());
      socket->close();
    }
  }

  static void on_completed(void*, MHD_Connection*, void** con_cls, MHD_RequestTerminationCode) {
    delete static_cast<Request*>(*con_cls);
    *con_cls = nullptr;
  }

  static void on_connection(void* cls,
                            MHD_Connection* c,
                            void**,
                            MHD_ConnectionNotificationCode code) {
    auto* self = static_cast<Impl*>(cls);
    std::lock_guard<std::mutex> lock(self->conns_mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
      const MHD_ConnectionInfo* info =
          MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
      Conn& conn = self->conns[c] = Conn{
          .fd = info ? info->connect_fd : -1, .started = Clock::now(), .address = peer_address(c)};
      self->make_room(conn);
    } else {
      self->conns.erase(c);
    }
  }

  static void on_log(void*, const char* format, va_list ap) {
    char buf[512];
    std::vsnprintf(buf, sizeof buf, format, ap);
    std::string text(buf);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    logger("http")->debug("libmicrohttpd: {}", text);
  }

  // The io thread: WebSockets' reads and writes, and the request deadline.
  void run_io() {
    std::vector<std::shared_ptr<Socket>> live;
    std::vector<pollfd> fds;
    while (!stopping) {
      {
        std::lock_guard<std::mutex> lock(ws_mu);
        live = sockets;
      }
      fds.assign(1, pollfd{.fd = wake_fd, .events = POLLIN, .revents = 0});
      for (const auto& s : live) {
        fds.push_back(
            pollfd{.fd = s->fd(),
                   .events = static_cast<short>(POLLIN | (s->wants_write() ? POLLOUT : 0)),
                   .revents = 0});
      }
      ::poll(fds.data(), fds.size(), 100);
      if (fds[0].revents & POLLIN) {
        std::uint64_t n;
        (void)::read(wake_fd, &n, sizeof n);
      }
      const auto now = Clock::now();
      std::vector<std::shared_ptr<Socket>> over;
      for (std::size_t i = 0; i < live.size(); ++i) {
        if (!live[i]->serve(fds[i + 1].revents, now, options.websocket_stall_timeout)) {
          over.push_back(live[i]);
        }
      }
      for (const auto& s : over) {
        if (s->was_dropped()) ++dropped;
        s->finish();
        std::lock_guard<std::mutex> lock(ws_mu);
        sockets.erase(std::remove(sockets.begin(), sockets.end(), s), sockets.end());
      }
      cut_late_requests(now);
    }
  }

  // Shuts down connections whose request has not arrived within request_timeout; libmicrohttpd
  // then closes them (Note [Serving hostile clients]).
  void cut_late_requests(Clock::time_point now) {
    std::lock_guard<std::mutex> lock(conns_mu);
    for (auto& [c, conn] : conns) {
      if (conn.request_done || now - conn.started <= options.request_timeout) continue;
      conn.request_done = true;
      ++timed_out;
      if (conn.fd >= 0) ::shutdown(conn.fd, SHUT_RDWR);
    }
  }
};

HttpServer::HttpServer(HttpServerOptions options) : impl_(std::make_unique<Impl>()) {
  TY_CHECK(options.port >= 0 && options.port <= 65535, "HttpServerOptions.port must be in ",
           "[0, 65535]; got ", options.port, ".");
  TY_CHECK(options.threads >= 1, "HttpServerOptions.threads must be at least 1; got ",
           options.threads, ".");
  TY_CHECK(!options.bind_address.empty(), "HttpServerOptions.bind_address must not be empty.");
  TY_CHECK(options.max_body_bytes >= 0, "HttpServerOptions.max_body_bytes must not be negative; ",
           "got ", options.max_body_bytes, ".");
  TY_CHECK(options.request_timeout.count() > 0, "HttpServerOptions.request_timeout must be ",
           "positive; got ", options.request_timeout.count(), " ms.");
  TY_CHECK(options.max_connections >= 1 && options.max_connections_per_client >= 1 &&
               options.max_websockets >= 0,
           "HttpServerOptions: max_connections (", options.max_connections,
           ") and max_connections_per_client (", options.max_connections_per_client,
           ") must be at least 1, max_websockets (", options.max_websockets, ") not negative.");
  impl_->options = std::move(options);
}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::route(const std::string& method, const std::string& pattern, HttpHandler handler) {
  TY_CHECK(impl_->daemon == nullptr, "HttpServer::route(", method, " ", pattern,
           ") must be called before start().");
  impl_->routes.push_back({method, split_path(pattern), std::move(handler)});
}

void HttpServer::websocket(const std::string& pattern,
                           WebSocketHandler handler,
                           WebSocketAdmission admission) {
  TY_CHECK(impl_->daemon == nullptr, "HttpServer::websocket(", pattern,
           ") must be called before start().");
  impl_->ws_routes.push_back({split_path(pattern), std::move(handler), std::move(admission)});
}

void HttpServer::set_hook(HttpHook hook) {
  impl_->hook = std::move(hook);
}

void HttpServer::start() {
  TY_CHECK(impl_->daemon == nullptr, "HttpServer::start() was called twice.");
  const HttpServerOptions& o = impl_->options;
  const bool v6 = o.bind_address.find(':') != std::string::npos;
  const std::string shown =
      (v6 ? "[" + o.bind_address + "]" : o.bind_address) + ":" + std::to_string(o.port);
  sockaddr_in a4{};
  sockaddr_in6 a6{};
  const sockaddr* addr = nullptr;
  if (v6) {
    a6.sin6_family = AF_INET6;
    a6.sin6_port = htons(static_cast<std::uint16_t>(o.port));
    if (inet_pton(AF_INET6, o.bind_address.c_str(), &a6.sin6_addr) != 1)
      addr = nullptr;
    else
      addr = reinterpret_cast<const sockaddr*>(&a6);
  } else {
    a4.sin_family = AF_INET;
    a4.sin_port = htons(static_cast<std::uint16_t>(o.port));
    if (inet_pton(AF_INET, o.bind_address.c_str(), &a4.sin_addr) == 1)
      addr = reinterpret_cast<const sockaddr*>(&a4);
  }
  TY_CHECK_T(NetworkError, addr != nullptr, "The HTTP server cannot listen on ", shown, ": '",
             o.bind_address, "' is not an IP address. HINT: give one of this machine's ",
             "addresses, or 0.0.0.0 for all of them.");
  impl_->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  TY_CHECK_T(Error, impl_->wake_fd >= 0, "eventfd failed: ", std::strerror(errno));
  // libmicrohttpd's own inactivity timeout, in whole seconds, backs up the request deadline.
  const auto idle_s =
      static_cast<unsigned>(std::max<long long>(1, (o.request_timeout.count() + 999) / 1000));
  const unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_UPGRADE | MHD_USE_ERROR_LOG |
                         (v6 ? MHD_USE_IPv6 : 0);
  impl_->stopping = false;
  impl_->daemon = MHD_start_daemon(
      flags, static_cast<std::uint16_t>(o.port), nullptr, nullptr, &Impl::on_request, impl_.get(),
      // The logger first, so that libmicrohttpd says nothing on its own stderr.
      MHD_OPTION_EXTERNAL_LOGGER, &Impl::on_log, impl_.get(), MHD_OPTION_SOCK_ADDR, addr,
      // Twice the server's own caps, which it keeps itself: Note [Keeping room for admitted
      // clients].
      MHD_OPTION_THREAD_POOL_SIZE, static_cast<unsigned>(o.threads), MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned>(2 * o.max_connections), MHD_OPTION_CONNECTION_TIMEOUT, idle_s,
      MHD_OPTION_NOTIFY_COMPLETED, &Impl::on_completed, impl_.get(), MHD_OPTION_NOTIFY_CONNECTION,
      &Impl::on_connection, impl_.get(), MHD_OPTION_LISTEN_BACKLOG_SIZE, 512u, MHD_OPTION_END);
  if (impl_->daemon == nullptr) {
    const int err = errno;
    ::close(impl_->wake_fd);
    impl_->wake_fd = -1;
    throw NetworkError("The HTTP server could not listen on " + shown + ": " +
                       (err != 0 ? std::strerror(err) : "unknown error") +
                       ". Hint: is another process using the port, or is the address not one "
                       "of this machine's?");
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(impl_->daemon, MHD_DAEMON_INFO_BIND_PORT);
  impl_->port = info != nullptr && info->port != 0 ? info->port : o.port;
  impl_->io = std::thread([impl = impl_.get()] { impl->run_io(); });
}

void HttpServer::stop() {
  if (impl_->daemon == nullptr) return;
  // No new connections from here; the listening socket becomes ours to close.
  const MHD_socket listening = MHD_quiesce_daemon(impl_->daemon);
  impl_->stopping = true;
  impl_->wake();
  if (impl_->io.joinable()) impl_->io.join();
  // Every upgraded socket goes back to libmicrohttpd before it stops.
  std::vector<std::shared_ptr<Socket>> open;
  {
    std::lock_guard<std::mutex> lock(impl_->ws_mu);
    open.swap(impl_->sockets);
  }
  for (auto& s : open) {
    s->say_goodbye();
    s->finish();
  }
  MHD_stop_daemon(impl_->daemon);
  impl_->daemon = nullptr;
  if (listening != MHD_INVALID_SOCKET) ::close(listening);
  // A handshake that completed while the io thread stopped: libmicrohttpd closed its socket.
  {
    std::lock_guard<std::mutex> lock(impl_->ws_mu);
    open.swap(impl_->sockets);
  }
  for (auto& s : open) s->finish(/*release=*/false);
  ::close(impl_->wake_fd);
  impl_->wake_fd = -1;
  {
    std::lock_guard<std::mutex> lock(impl_->conns_mu);
    impl_->conns.clear();
  }
}

int HttpServer::port() const {
  return impl_->port;
}

bool HttpServer::running() const {
  return impl_->daemon != nullptr;
}

HttpServer::Stats HttpServer::stats() const {
  Stats s;
  s.requests_timed_out = impl_->timed_out;
  s.websockets_dropped = impl_->dropped;
  s.connections_evicted = impl_->evicted;
  s.connections_refused = impl_->refused;
  std::lock_guard<std::mutex> lock(impl_->ws_mu);
  s.websockets_open = impl_->sockets.size();
  return s;
}

}  // namespace trainyard::net
