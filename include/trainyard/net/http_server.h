// A small HTTP and WebSocket server over libmicrohttpd (Note [Serving hostile clients] in
// http_server.cpp): routes by method and path pattern ("/api/jobs/{id}/logs"), a hook run before
// every handler (for authentication), WebSocket endpoints whose connection can be written from
// any thread without blocking, and JSON errors: a handler's exception becomes 500
// {"error": ...} (HttpStatusError its own status) and an unknown path 404 {"error": ...}.
// Connections and WebSockets hold no thread: a client that sends slowly, or a follower that does
// not read, costs a socket and a bounded buffer, and is cut off at a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "trainyard/error.h"

namespace trainyard::net {

// Compares header names without regard to case ("content-type" == "Content-Type").
struct CaseInsensitiveLess {
  bool operator()(const std::string& a, const std::string& b) const;
};
using ServerHeaders = std::map<std::string, std::string, CaseInsensitiveLess>;

struct ServerRequest {
  std::string method;                         // "GET", "POST", ...
  std::string path;                           // URL-decoded, without the query
  std::map<std::string, std::string> params;  // from the route's {name} segments
  std::map<std::string, std::string> query;   // URL-decoded ?a=b&c=d
  ServerHeaders headers;
  std::string body;            // empty for a WebSocket upgrade
  std::string remote_address;  // the peer's IP address

  // The header's value, or "" when the request has none.
  std::string header(const std::string& name) const;
};

struct ServerResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  ServerHeaders
      headers;  // extra headers; Content-Type and Content-Length are written from the fields

  // A response whose body is {"error": message}.
  static ServerResponse json_error(int status, const std::string& message);
};

// Thrown by a handler to answer with a status other than 500; the message becomes
// {"error": message}.
class HttpStatusError : public Error {
 public:
  HttpStatusError(int status, const std::string& message) : Error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

// One WebSocket client. send_text and close may be called from any thread, also after the client
// went away (they then do nothing and send_text returns false). Shared by the server and the
// handler that keeps it; it stays valid as long as someone holds it.
class WebSocketConnection {
 public:
  virtual ~WebSocketConnection() = default;
  // Queues one text frame and returns at once; false when the connection is closed, or when the
  // frame would take the client's unsent bytes past HttpServerOptions::websocket_buffer_bytes:
  // then the client is dropped (close code 1008) as one that does not read.
  virtual bool send_text(const std::string& text) = 0;
  // Bytes queued and not yet taken by the client's socket: a writer with more to send waits while
  // this is high instead of dropping the client.
  virtual std::size_t buffered_bytes() const = 0;
  // Sends a close frame; the client then closes the connection.
  virtual void close() = 0;
  virtual bool closed() const = 0;
  // Called once, on a server thread, when the connection is gone (client or close()). A callback
  // set after that runs at once on the caller's thread.
  virtual void on_closed(std::function<void()> callback) = 0;
  virtual const ServerRequest& request() const = 0;
};

using HttpHandler = std::function<ServerResponse(const ServerRequest&)>;
// Runs on a server thread after the handshake; it may keep the connection and return at once.
using WebSocketHandler = std::function<void(std::shared_ptr<WebSocketConnection>)>;
// Runs before a WebSocket handshake (after the hook), with the route's params: a response refuses
// the upgrade (e.g. 429 when a job has too many followers).
using WebSocketAdmission = std::function<std::optional<ServerResponse>(const ServerRequest&)>;
// Runs before every handler (WebSocket upgrades included) on the request's line and headers: the
// body is not read yet, so that a refused client costs no memory. A response stops the request
// there and is sent instead.
using HttpHook = std::function<std::optional<ServerResponse>(const ServerRequest&)>;

struct HttpServerOptions {
  static constexpr int kDefaultThreads = 4;
  static constexpr long long kDefaultMaxBodyBytes = 8LL << 20;
  std::string bind_address = "127.0.0.1";  // an IPv4 or IPv6 address; "0.0.0.0" for every interface
  int port = 0;                            // 0: the system picks one; read it back with port()
  // Threads that run handlers. Connections waiting for their request hold none.
  int threads = kDefaultThreads;
  // The whole request (line, headers and body) must arrive within this of the connect, else the
  // connection is cut: a client sending one byte a second holds nothing for long.
  std::chrono::milliseconds request_timeout{10'000};
  // A larger body is refused with 413 naming the limit, before it is read.
  long long max_body_bytes = kDefaultMaxBodyBytes;
  // Open connections (WebSockets included), in all and from one client address. Past either cap
  // the oldest connection no hook has admitted yet is shut down to make room, and the new one
  // only when every other in the way is admitted (Note [Keeping room for admitted clients]).
  int max_connections = 768;
  int max_connections_per_client = 256;
  // WebSockets: open at once (past it 503), bytes queued for one client before it is dropped,
  // and how long a client may take nothing while bytes wait for it before it is dropped.
  int max_websockets = 256;
  std::size_t websocket_buffer_bytes = 1 << 20;
  std::chrono::milliseconds websocket_stall_timeout{10'000};
};

// Handlers run on the server's threads, several at once: they must be thread-safe.
// Configure (route, websocket, set_hook) and start/stop from one thread.
class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes: pattern segments written {name} match one path segment, into request.params. A
  // trailing slash is ignored ("/api/jobs/" and "/api/jobs" are the same path). The first route
  // added that matches wins. Add routes before start().
  void route(const std::string& method, const std::string& pattern, HttpHandler handler);
  void websocket(const std::string& pattern,
                 WebSocketHandler handler,
                 WebSocketAdmission admission = nullptr);
  void set_hook(HttpHook hook);

  // Listens and serves on background threads; NetworkError naming the address and port when it
  // cannot bind.
  void start();
  // Closes open WebSockets (a close frame, best effort), waits for running handlers and stops.
  // Idempotent.
  void stop();
  int port() const;  // the port listened on (after start)
  bool running() const;

  // What the server has refused or cut off since start (for tests and benchmarks).
  struct Stats {
    std::uint64_t requests_timed_out = 0;  // cut at request_timeout
    std::uint64_t websockets_dropped = 0;  // did not read (buffer full or stalled)
    std::uint64_t websockets_open = 0;     // now
    // Past a connection cap: connections not yet admitted shut down to make room, and new ones
    // refused because every connection in the way was admitted. Both only grow.
    std::uint64_t connections_evicted = 0;
    std::uint64_t connections_refused = 0;
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::net
