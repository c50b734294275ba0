#include "trainyard/net/http_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>
#include <vector>

#include "trainyard/log.h"

// Note [civetweb]
// civetweb owns the sockets and a pool of worker threads. One request handler and one WebSocket
// handler registered on the pattern "**" receive every request; routing, the hook and the JSON
// errors are ours, so the server behaves the same for every path (an unknown path is a JSON 404,
// not civetweb's HTML page). A WebSocket keeps its worker thread in civetweb's read loop for its
// whole life; other threads write to it through mg_websocket_write, which locks the connection.
// The mg_connection pointer is valid until civetweb's close handler returns: the handler marks
// our connection object closed under its mutex, so no write can use the pointer after that.

// Note [No keep-alive]
// civetweb gives a kept-alive connection its worker thread for as long as requests keep coming, so
// more busy clients than threads starve the rest, worker heartbeats included (measured: with 100
// pollers and 32 threads, 68 clients waited 10 s and healthy nodes were declared dead). Each
// request gets its own connection instead: a thread is held for one request, and clients queue
// fairly. A connect on loopback or a LAN costs well under a millisecond.

// Note [Stopping civetweb]
// civetweb's threads wait in poll() for up to 2 s (its SOCKET_TIMEOUT_QUANTUM) before they see
// the stop flag, so mg_stop() takes about 2 s once a request has been served. While it runs, a
// helper thread connects to the listening port a few times, which wakes the poll at once.

// Note [civetweb's thread stacks]
// Debian builds civetweb with a fixed thread stack of 100 KiB (USE_STACK_SIZE), passed to
// pthread_attr_setstacksize for every thread it starts. glibc places a thread's static TLS inside
// its stack, and a process that has loaded LibTorch, OpenBLAS and glog needs more static TLS than
// that: pthread_create then fails with EINVAL and mg_start reports "Cannot create first worker
// thread" (the `trainyard` binary did; the LibTorch-free test binaries did not). This definition
// takes the place of glibc's for the whole process (the executable's symbol comes first for
// libcivetweb.so) and raises a stack size below kMinThreadStackBytes to it; larger sizes pass
// through unchanged.
namespace {
constexpr std::size_t kMinThreadStackBytes = 2 << 20;
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, std::size_t size) {
  using Fn = int (*)(pthread_attr_t*, std::size_t);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (real == nullptr) return EINVAL;
  return real(attr, std::max(size, kMinThreadStackBytes));
}

namespace trainyard::net {
namespace {

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

std::string url_decode(const std::string& s) {
  std::string out(s.size() + 1, '\0');
  int n = mg_url_decode(s.data(), static_cast<int>(s.size()), out.data(),
                        static_cast<int>(out.size()), /*is_form_url_encoded=*/1);
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

std::map<std::string, std::string> parse_query(const char* qs) {
  std::map<std::string, std::string> out;
  if (qs == nullptr) return out;
  std::string query(qs);
  size_t i = 0;
  while (i <= query.size()) {
    size_t j = query.find('&', i);
    if (j == std::string::npos) j = query.size();
    std::string pair = query.substr(i, j - i);
    if (!pair.empty()) {
      size_t eq = pair.find('=');
      if (eq == std::string::npos) {
        out[url_decode(pair)] = "";
      } else {
        out[url_decode(pair.substr(0, eq))] = url_decode(pair.substr(eq + 1));
      }
    }
    i = j + 1;
  }
  return out;
}

ServerRequest request_from(const mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  ServerRequest req;
  req.method = ri->request_method ? ri->request_method : "";
  req.path = ri->local_uri ? ri->local_uri : "/";
  req.query = parse_query(ri->query_string);
  for (int i = 0; i < ri->num_headers; ++i) {
    req.headers[ri->http_headers[i].name] =
        ri->http_headers[i].value ? ri->http_headers[i].value : "";
  }
  req.remote_address = ri->remote_addr;
  return req;
}

void send_response(mg_connection* conn, const ServerResponse& res) {
  mg_response_header_start(conn, res.status);
  mg_response_header_add(conn, "Content-Type", res.content_type.c_str(), -1);
  std::string length = std::to_string(res.body.size());
  mg_response_header_add(conn, "Content-Length", length.c_str(), -1);
  for (const auto& [name, value] : res.headers) {
    if (strcasecmp(name.c_str(), "Content-Type") == 0 ||
        strcasecmp(name.c_str(), "Content-Length") == 0)
      continue;
    mg_response_header_add(conn, name.c_str(), value.c_str(), -1);
  }
  mg_response_header_send(conn);
  if (!res.body.empty()) mg_write(conn, res.body.data(), res.body.size());
}

// The answer to a refused WebSocket upgrade, written raw: civetweb's response-header functions
// do not write on a connection that is inside the WebSocket handshake.
void send_raw_response(mg_connection* conn, const ServerResponse& res) {
  const char* reason = mg_get_response_code_text(conn, res.status);
  std::string head = "HTTP/1.1 " + std::to_string(res.status) + " " + (reason ? reason : "") +
                     "\r\nContent-Type: " + res.content_type +
                     "\r\nContent-Length: " + std::to_string(res.body.size()) +
                     "\r\nConnection: close\r\n\r\n";
  mg_write(conn, head.data(), head.size());
  if (!res.body.empty()) mg_write(conn, res.body.data(), res.body.size());
}

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
  res.body = nlohmann::json{{"error", message}}.dump();
  return res;
}

namespace {

class CivetWebSocket : public WebSocketConnection {
 public:
  CivetWebSocket(mg_connection* conn, ServerRequest request)
      : conn_(conn), request_(std::move(request)) {}

  bool send_text(const std::string& text) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || close_sent_) return false;
    int n = mg_websocket_write(conn_, MG_WEBSOCKET_OPCODE_TEXT, text.data(), text.size());
    return n > 0;
  }

  void close() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || close_sent_) return;
    close_sent_ = true;
    // Status 1000 (normal closure), big-endian.
    const char payload[2] = {0x03, static_cast<char>(0xE8)};
    mg_websocket_write(conn_, MG_WEBSOCKET_OPCODE_CONNECTION_CLOSE, payload, sizeof(payload));
  }

  bool closed() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_ || close_sent_;
  }

  void on_closed(std::function<void()> callback) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_) {
        callbacks_.push_back(std::move(callback));
        return;
      }
    }
    callback();
  }

  const ServerRequest& request() const override { return request_; }

  // civetweb's close handler: after this the connection pointer is never used.
  void mark_closed() {
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      conn_ = nullptr;
      callbacks.swap(callbacks_);
    }
    for (auto& cb : callbacks) {
      try {
        cb();
      } catch (const std::exception& e) {
        logger("http")->warn("a WebSocket close callback failed: {}", e.what());
      }
    }
  }

 private:
  mutable std::mutex mu_;
  mg_connection* conn_;  // owned by civetweb; valid while !closed_ (Note [civetweb])
  bool closed_ = false;
  bool close_sent_ = false;
  std::vector<std::function<void()>> callbacks_;
  ServerRequest request_;
};

}  // namespace

struct HttpServer::Impl {
  struct Route {
    std::string method;
    std::vector<std::string> segments;
    HttpHandler handler;
  };
  struct WsRoute {
    std::vector<std::string> segments;
    WebSocketHandler handler;
  };
  struct PendingWs {
    std::shared_ptr<CivetWebSocket> socket;
    const WsRoute* route = nullptr;
  };

  HttpServerOptions options;
  std::vector<Route> routes;
  std::vector<WsRoute> ws_routes;
  HttpHook hook;
  mg_context* ctx = nullptr;
  int port = 0;
  std::mutex ws_mu;
  std::unordered_map<const mg_connection*, PendingWs> sockets;  // open WebSockets

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

  static int on_request(mg_connection* conn, void* data) {
    auto* self = static_cast<Impl*>(data);
    ServerRequest req = request_from(conn);
    ServerResponse res;
    try {
      // The hook (authentication) judges the headers before the body is read, so that a client
      // without the token cannot make the server read and hold up to max_body_bytes.
      if (self->hook) {
        if (auto stop = self->hook(req)) {
          send_response(conn, *stop);
          return stop->status;
        }
      }
      const mg_request_info* ri = mg_get_request_info(conn);
      const long long limit = self->options.max_body_bytes;
      if (ri->content_length > limit) {
        throw HttpStatusError(413, "The request body of " + std::to_string(ri->content_length) +
                                       " bytes is larger than the limit of " +
                                       std::to_string(limit) + " bytes.");
      }
      char buf[16384];
      for (;;) {
        int n = mg_read(conn, buf, sizeof(buf));
        if (n <= 0) break;
        req.body.append(buf, static_cast<size_t>(n));
        if (static_cast<long long>(req.body.size()) > limit) {
          throw HttpStatusError(413, "The request body is larger than the limit of " +
                                         std::to_string(limit) + " bytes.");
        }
      }
      res = self->dispatch(req);
    } catch (const HttpStatusError& e) {
      res = ServerResponse::json_error(e.status(), e.what());
    } catch (const std::exception& e) {
      logger("http")->warn("{} {} failed: {}", req.method, req.path, e.what());
      res = ServerResponse::json_error(500, e.what());
    } catch (...) {
      res = ServerResponse::json_error(500, "internal error");
    }
    send_response(conn, res);
    return res.status;
  }

  static int on_ws_connect(const mg_connection* conn, void* data) {
    auto* self = static_cast<Impl*>(data);
    ServerRequest req = request_from(conn);
    auto* mconn = const_cast<mg_connection*>(conn);
    try {
      if (self->hook) {
        if (auto stop = self->hook(req)) {
          send_raw_response(mconn, *stop);
          return 1;
        }
      }
      std::vector<std::string> segments = split_path(req.path);
      for (const WsRoute& r : self->ws_routes) {
        std::map<std::string, std::string> params;
        if (!match(r.segments, segments, params)) continue;
        req.params = std::move(params);
        auto socket = std::make_shared<CivetWebSocket>(mconn, std::move(req));
        std::lock_guard<std::mutex> lock(self->ws_mu);
        self->sockets[conn] = PendingWs{socket, &r};
        return 0;
      }
      send_raw_response(
          mconn, ServerResponse::json_error(404, "No WebSocket endpoint at " + req.path + "."));
    } catch (const std::exception& e) {
      send_raw_response(mconn, ServerResponse::json_error(500, e.what()));
    }
    return 1;
  }

  static void on_ws_ready(mg_connection* conn, void* data) {
    auto* self = static_cast<Impl*>(data);
    PendingWs ws;
    {
      std::lock_guard<std::mutex> lock(self->ws_mu);
      auto it = self->sockets.find(conn);
      if (it == self->sockets.end()) return;
      ws = it->second;
    }
    try {
      ws.route->handler(ws.socket);
    } catch (const std::exception& e) {
      logger("http")->warn("WebSocket {} failed: {}", ws.socket->request().path, e.what());
      ws.socket->close();
    }
  }

  static int on_ws_data(mg_connection*, int bits, char*, size_t, void*) {
    // Client frames are not used; a close frame ends the connection.
    return (bits & 0x0f) == MG_WEBSOCKET_OPCODE_CONNECTION_CLOSE ? 0 : 1;
  }

  static void on_ws_close(const mg_connection* conn, void* data) {
    auto* self = static_cast<Impl*>(data);
    std::shared_ptr<CivetWebSocket> socket;
    {
      std::lock_guard<std::mutex> lock(self->ws_mu);
      auto it = self->sockets.find(conn);
      if (it == self->sockets.end()) return;
      socket = it->second.socket;
      self->sockets.erase(it);
    }
    socket->mark_closed();
  }

  static int on_log(const mg_connection*, const char* message) {
    logger("http")->debug("civetweb: {}", message);
    return 1;
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
  impl_->options = std::move(options);
}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::route(const std::string& method, const std::string& pattern, HttpHandler handler) {
  TY_CHECK(impl_->ctx == nullptr, "HttpServer::route(", method, " ", pattern,
           ") must be called before start().");
  impl_->routes.push_back({method, split_path(pattern), std::move(handler)});
}

void HttpServer::websocket(const std::string& pattern, WebSocketHandler handler) {
  TY_CHECK(impl_->ctx == nullptr, "HttpServer::websocket(", pattern,
           ") must be called before start().");
  impl_->ws_routes.push_back({split_path(pattern), std::move(handler)});
}

void HttpServer::set_hook(HttpHook hook) {
  impl_->hook = std::move(hook);
}

void HttpServer::start() {
  TY_CHECK(impl_->ctx == nullptr, "HttpServer::start() was called twice.");
  const HttpServerOptions& o = impl_->options;
  std::string address = o.bind_address;
  if (address.find(':') != std::string::npos) address = "[" + address + "]";
  std::string ports = address + ":" + std::to_string(o.port);
  std::string threads = std::to_string(o.threads);
  std::string timeout = std::to_string(o.request_timeout.count());
  const char* config[] = {"listening_ports", ports.c_str(), "num_threads", threads.c_str(),
                          "request_timeout_ms", timeout.c_str(),
                          // Note [No keep-alive]
                          "enable_keep_alive", "no",
                          // A response's headers and body go out as two writes: without this
                          // the body waits for the client's delayed ACK (~40 ms per answer).
                          "tcp_nodelay", "1", "websocket_timeout_ms", "3600000", nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = &Impl::on_log;
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = impl_.get();
  init.configuration_options = config;
  unsigned code = 0;
  char text[256] = {0};
  mg_error_data error{};
  error.code = &code;
  error.text = text;
  error.text_buffer_size = sizeof(text);
  mg_context* ctx = mg_start2(&init, &error);
  if (ctx == nullptr) {
    throw NetworkError("The HTTP server could not listen on " + ports + ": " +
                       (text[0] ? std::string(text) : std::string("unknown error")) +
                       ". Hint: is another process using the port, or is the address not one "
                       "of this machine's?");
  }
  mg_set_request_handler(ctx, "**", &Impl::on_request, impl_.get());
  mg_set_websocket_handler(ctx, "**", &Impl::on_ws_connect, &Impl::on_ws_ready, &Impl::on_ws_data,
                           &Impl::on_ws_close, impl_.get());
  mg_server_port sp[4]{};
  int n = mg_get_server_ports(ctx, 4, sp);
  impl_->port = n > 0 ? sp[0].port : o.port;
  impl_->ctx = ctx;
}

void HttpServer::stop() {
  if (impl_->ctx == nullptr) return;
  std::vector<std::shared_ptr<CivetWebSocket>> open;
  {
    std::lock_guard<std::mutex> lock(impl_->ws_mu);
    for (auto& [conn, ws] : impl_->sockets) open.push_back(ws.socket);
  }
  for (auto& s : open) s->close();
  // See Note [Stopping civetweb].
  std::atomic<bool> stopped{false};
  std::thread poke([&] {
    std::string host =
        impl_->options.bind_address == "0.0.0.0" ? "127.0.0.1" : impl_->options.bind_address;
    for (int i = 0; i < 40 && !stopped; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      int fd = ::socket(host.find(':') == std::string::npos ? AF_INET : AF_INET6,
                        SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      if (host.find(':') == std::string::npos) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(impl_->port));
        inet_pton(AF_INET, host.c_str(), &a.sin_addr);
        ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
      } else {
        sockaddr_in6 a{};
        a.sin6_family = AF_INET6;
        a.sin6_port = htons(static_cast<uint16_t>(impl_->port));
        inet_pton(AF_INET6, host.c_str(), &a.sin6_addr);
        ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
      }
      ::close(fd);
    }
  });
  mg_stop(impl_->ctx);
  stopped = true;
  poke.join();
  impl_->ctx = nullptr;
  // civetweb has closed every connection; a socket whose close handler did not run is closed now.
  std::unordered_map<const mg_connection*, Impl::PendingWs> left;
  {
    std::lock_guard<std::mutex> lock(impl_->ws_mu);
    left.swap(impl_->sockets);
  }
  for (auto& [conn, ws] : left) ws.socket->mark_closed();
}

int HttpServer::port() const {
  return impl_->port;
}

bool HttpServer::running() const {
  return impl_->ctx != nullptr;
}

}  // namespace trainyard::net
