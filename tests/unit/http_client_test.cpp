// net::HttpClient against a real local server (cpp-httplib's Server on 127.0.0.1, port 0):
// methods, headers and bodies, retries of chosen statuses, the final error listing every attempt,
// refused connections, stalled servers, connection reuse, and the backoff's jitter bounds.
#include "trainyard/net/http_client.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../closed_port.h"
#include "trainyard/error.h"

namespace trainyard::net {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A server on 127.0.0.1 with a free port, serving on a thread until the test ends. Handlers that
// stall wait on release(), which the destructor calls, so a test never waits on them to finish.
class TestServer {
 public:
  TestServer() {
    port_ = server_.bind_to_any_port("127.0.0.1");  // listening from here on (the backlog)
    EXPECT_GT(port_, 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~TestServer() {
    release();
    server_.stop();
    thread_.join();
  }
  httplib::Server& operator*() { return server_; }
  httplib::Server* operator->() { return &server_; }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  // Blocks a handler until release() or `limit`.
  void stall(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, limit, [&] { return released_; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;  // mu_
};

using trainyard::test::closed_port;

template <typename E, typename F>
E error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e;
  }
  ADD_FAILURE() << "expected an exception";
  throw std::logic_error("no exception");
}

TEST(HttpClient, GetAndPostCarryHeadersAndBodies) {
  TestServer server;
  server->Get("/hello", [](const httplib::Request& req, httplib::Response& res) {
    res.set_header("X-Reply", "yes");
    res.set_content("hello " + req.get_header_value("Authorization"), "text/plain");
  });
  server->Post("/echo", [](const httplib::Request& req, httplib::Response& res) {
    res.status = 201;
    res.set_content(req.get_header_value("Content-Type") + " " + req.body, "application/json");
  });
  server->Put("/put", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content("put " + req.body, "text/plain");
  });
  server->Delete("/thing",
                 [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
  HttpClient http;

  HttpResponse r = http.send(
      {.url = server.url("/hello"), .headers = {{"Authorization", "Bearer secret-token"}}});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hello Bearer secret-token");
  EXPECT_EQ(r.header("x-REPLY"), "yes") << "header names compare without case";
  EXPECT_EQ(r.header("X-Missing"), std::nullopt);
  EXPECT_EQ(r.attempt, 1);

  r = http.send({.method = "POST",
                 .url = server.url("/echo"),
                 .headers = {{"Content-Type", "application/json"}},
                 .body = R"({"a":1})"});
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(r.body, R"(application/json {"a":1})");

  const std::string big(3 << 20, 'x');  // above curl's 1 MiB "100 Continue" threshold
  r = http.perform({.method = "PUT", .url = server.url("/put"), .body_ref = big});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "put " + big);

  r = http.perform({.method = "DELETE", .url = server.url("/thing")});
  EXPECT_EQ(r.status, 204);
  r = http.send({.url = server.url("/nowhere")});
  EXPECT_EQ(r.status, 404) << "a 4xx is an answer for the caller, not retried";
}

TEST(HttpClient, RangesAndABodySink) {
  TestServer server;
  server->Get("/blob", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("0123456789", "application/octet-stream");
  });
  HttpClient http;
  HttpResponse r = http.perform({.url = server.url("/blob"), .range = "2-4"});
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(r.body, "234");

  std::string sunk;
  r = http.perform(
      {.url = server.url("/blob"), .body_sink = [&](std::uint64_t offset, std::string_view data) {
         EXPECT_EQ(offset, sunk.size());
         sunk.append(data);
       }});
  EXPECT_EQ(sunk, "0123456789");
  EXPECT_EQ(r.body, "") << "a 2xx body goes to the sink only";

  // An error's body is the caller's error text, not data for the sink.
  sunk.clear();
  r = http.perform({.url = server.url("/missing"),
                    .body_sink = [&](std::uint64_t, std::string_view data) { sunk.append(data); }});
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(sunk, "");

  // What a sink throws comes out of the call.
  EXPECT_THROW(http.perform({.url = server.url("/blob"),
                             .body_sink =
                                 [](std::uint64_t, std::string_view) {
                                   throw InvalidArgumentError("the disk is full");
                                 }}),
               InvalidArgumentError);
}

TEST(HttpClient, RetriesA503AndReturnsTheAnswerAfterIt) {
  TestServer server;
  std::atomic<int> calls{0};
  server->Get("/flaky", [&](const httplib::Request&, httplib::Response& res) {
    if (calls++ == 0) {
      res.status = 503;
      res.set_content("warming up", "text/plain");
    } else {
      res.set_content("ok", "text/plain");
    }
  });
  HttpClient http;
  std::vector<std::string> retries;
  std::vector<int> waits_before;  // attempts that on_progress was told send() waits for
  HttpResponse r = http.send({.url = server.url("/flaky"),
                              .on_progress =
                                  [&](const HttpProgress& p) {
                                    if (p.between_attempts) waits_before.push_back(p.attempt);
                                  }},
                             {.backoff = 10ms, .on_retry = [&](const RetryPolicy::Retry& retry) {
                                retries.push_back(std::string(retry.what));
                              }});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok");
  EXPECT_EQ(r.attempt, 2);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(retries, std::vector<std::string>{"HTTP 503: warming up."});
  EXPECT_EQ(waits_before, std::vector<int>{2}) << "progress (heartbeats) while backing off";

  // The caller decides which answers to retry: here none.
  calls = 0;
  r = http.send({.url = server.url("/flaky")},
                {.retry_if = [](const HttpResponse&) { return false; }});
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(calls.load(), 1);
}

TEST(HttpClient, DeadlineEndsRetriesAndTheErrorListsEveryAttempt) {
  TestServer server;
  std::atomic<int> calls{0};
  server->Get("/down", [&](const httplib::Request&, httplib::Response& res) {
    const int n = ++calls;
    res.status = n == 2 ? 502 : 503;
    res.set_content(n == 2 ? "bad gateway" : "busy", "text/plain");
  });
  HttpClient http;
  const auto start = Clock::now();
  const auto e = error_of<HttpError>([&] {
    http.send({.url = server.url("/down")},
              {.max_attempts = 0, .deadline = 800ms, .backoff = 20ms, .backoff_max = 100ms});
  });
  const auto took = Clock::now() - start;
  const std::string msg = e.what();
  const int n = calls.load();
  EXPECT_GE(n, 4) << msg;
  EXPECT_EQ(e.log().attempts, n);
  EXPECT_NE(msg.find("GET " + server.url("/down") + " failed after " + std::to_string(n) +
                     " attempt(s) over "),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("deadline = 800 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find(" Attempt 1: HTTP 503: busy. Attempt 2: HTTP 502: bad gateway. Attempts 3-" +
                     std::to_string(n) + ": HTTP 503: busy."),
            std::string::npos)
      << msg;
  EXPECT_EQ(e.transport(), TransportError::kNone);
  ASSERT_TRUE(e.last_response().has_value());
  EXPECT_EQ(e.last_response()->status, 503);
  EXPECT_GE(took, 700ms) << "the last pause ends within the deadline";
  EXPECT_LT(took, 3s);
}

TEST(HttpClient, RefusedConnectionsFailWithinBoundedTime) {
  const std::string url = "http://127.0.0.1:" + std::to_string(closed_port()) + "/x";
  HttpClient http;
  const auto start = Clock::now();
  const auto e =
      error_of<HttpError>([&] { http.send({.url = url}, {.max_attempts = 3, .backoff = 10ms}); });
  EXPECT_LT(Clock::now() - start, 2s);
  const std::string msg = e.what();
  EXPECT_NE(msg.find("GET " + url + " failed after 3 attempt(s)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("curl error 7 (Couldn't connect to server)"), std::string::npos) << msg;
  EXPECT_EQ(e.transport(), TransportError::kConnect);
  EXPECT_TRUE(e.retryable());
  EXPECT_FALSE(e.last_response().has_value());

  // perform(): one attempt, the same kind of error.
  const auto one = error_of<NetworkError>([&] { http.perform({.url = url}); });
  EXPECT_NE(std::string(one.what()).find("GET " + url + " failed: curl error 7"), std::string::npos)
      << one.what();
}

TEST(HttpClient, PermanentFailuresAreNotRetried) {
  HttpClient http;
  const auto e = error_of<HttpError>(
      [&] { http.send({.url = "gopher-nope://127.0.0.1/x"}, {.max_attempts = 5}); });
  EXPECT_FALSE(e.retryable());
  EXPECT_EQ(e.log().attempts, 1);
  EXPECT_NE(std::string(e.what()).find("curl error 1 "), std::string::npos) << e.what();
}

TEST(HttpClient, AStalledServerTimesOut) {
  TestServer server;
  server->Get("/silent", [&](const httplib::Request&, httplib::Response& res) {
    server.stall(10s);
    res.set_content("late", "text/plain");
  });
  // Headers, a few bytes, then nothing: only the stall limit ends it (no overall timeout).
  server->Get("/trickle", [&](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/plain",
                                     [&](std::size_t offset, httplib::DataSink& sink) {
                                       if (offset == 0) return sink.write("abc", 3);
                                       server.stall(10s);
                                       sink.done();
                                       return true;
                                     });
  });
  HttpClient http;
  auto start = Clock::now();
  auto e = error_of<HttpError>([&] {
    http.send({.url = server.url("/silent"), .timeout = 300ms},
              {.max_attempts = 2, .backoff = 0ms});
  });
  auto took = Clock::now() - start;
  EXPECT_GE(took, 600ms);
  EXPECT_LT(took, 3s);
  EXPECT_EQ(e.transport(), TransportError::kTimeout);
  EXPECT_EQ(e.log().attempts, 2);
  for (const auto& entry : e.log().entries) {  // "after 301 milliseconds" may differ by attempt
    EXPECT_TRUE(entry.what.starts_with("curl error 28 (Timeout was reached)")) << e.what();
  }

  start = Clock::now();
  std::atomic<int> progress_calls{0};
  e = error_of<HttpError>([&] {
    http.perform({.url = server.url("/trickle"),
                  .timeout = 0ms,
                  .stall_timeout = 1s,
                  .on_progress = [&](const HttpProgress&) { ++progress_calls; }});
  });
  took = Clock::now() - start;
  // curl averages the speed over the last few seconds: the 3 bytes keep it above 1 byte/s for
  // about 3 s, then 1 s below it ends the attempt (about 4 s in all).
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 10s);
  EXPECT_EQ(e.transport(), TransportError::kTimeout) << e.what();
  EXPECT_GT(progress_calls.load(), 0);
}

TEST(HttpClient, KeepsConnectionsAliveAndIsThreadSafe) {
  TestServer server;
  std::mutex mu;
  std::set<int> client_ports;
  server->Get("/who", [&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    client_ports.insert(req.remote_port);
    res.set_content("you", "text/plain");
  });
  HttpClient http;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(http.send({.url = server.url("/who")}).body, "you");
  EXPECT_EQ(client_ports.size(), 1u) << "one connection for three requests in a row";

  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5; ++i) ok += http.send({.url = server.url("/who")}).status == 200;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 20);
}

TEST(HttpClient, BackoffDoublesToItsCapAndJitterStaysInBounds) {
  const RetryPolicy p{.backoff = 100ms, .backoff_max = 1'000ms, .jitter = 0.2};
  EXPECT_EQ(retry_pause(p, 1, 0.0), 100ms);
  EXPECT_EQ(retry_pause(p, 2, 0.0), 200ms);
  EXPECT_EQ(retry_pause(p, 4, 0.0), 800ms);
  EXPECT_EQ(retry_pause(p, 5, 0.0), 1'000ms) << "capped";
  EXPECT_EQ(retry_pause(p, 1'000, 0.0), 1'000ms) << "no overflow";
  EXPECT_EQ(retry_pause(p, 4, 0.5), 720ms);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int i = 0; i < 1'000; ++i) {
    const auto d = retry_pause(p, 3, unit(rng));
    EXPECT_GE(d, 320ms);
    EXPECT_LE(d, 400ms);
  }
  EXPECT_EQ(retry_pause({.backoff = 50ms, .backoff_max = 1'000ms, .jitter = 0.0}, 3, 0.9), 200ms);
}

TEST(HttpClient, APolicyWithoutLimitsIsRefused) {
  HttpClient http;
  const auto e = error_of<InvalidArgumentError>(
      [&] { http.send({.url = "http://127.0.0.1:1/"}, {.max_attempts = 0}); });
  EXPECT_NE(std::string(e.what()).find("neither max_attempts nor a deadline"), std::string::npos)
      << e.what();
  EXPECT_THROW(http.send({.url = "http://127.0.0.1:1/"}, {.jitter = 1.5}), InvalidArgumentError);
}

}  // namespace
}  // namespace trainyard::net
