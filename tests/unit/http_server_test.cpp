// net::HttpServer over real HTTP on 127.0.0.1: routing with {params}, query, case-insensitive
// headers, the hook, JSON 404/405/500 errors, port 0, and a WebSocket written from another thread.
#include "trainyard/net/http_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "cluster_test_util.h"

namespace trainyard::net {
namespace {

using test::http;

std::string base(const HttpServer& s) {
  return "http://127.0.0.1:" + std::to_string(s.port());
}

TEST(HttpServerTest, RoutesParamsQueryHeadersAndBody) {
  HttpServer server(HttpServerOptions{});
  server.route("POST", "/items/{id}/notes", [](const ServerRequest& req) {
    ServerResponse res;
    res.body = nlohmann::json{{"id", req.params.at("id")},
                              {"q", req.query.count("q") ? req.query.at("q") : ""},
                              {"hdr", req.header("x-custom-thing")},
                              {"body", req.body},
                              {"remote", req.remote_address}}
                   .dump();
    res.headers["X-Reply"] = "yes";
    return res;
  });
  server.start();
  ASSERT_GT(server.port(), 0);
  auto r = http("POST", base(server) + "/items/abc-1/notes/?q=a%20b", R"({"x":1})",
                {{"X-Custom-Thing", "v"}});
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = r.json();
  EXPECT_EQ(j["id"], "abc-1");
  EXPECT_EQ(j["q"], "a b");
  EXPECT_EQ(j["hdr"], "v");
  EXPECT_EQ(j["body"], R"({"x":1})");
  EXPECT_EQ(j["remote"], "127.0.0.1");
}

TEST(HttpServerTest, LargeBodyWithExpectContinue) {
  HttpServer server(HttpServerOptions{});
  server.route("POST", "/size", [](const ServerRequest& req) {
    ServerResponse res;
    res.body = std::to_string(req.body.size());
    return res;
  });
  server.start();
  std::string big(3 << 20, 'x');
  auto r = http("POST", base(server) + "/size", big, {{"Expect", "100-continue"}});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, std::to_string(big.size()));
}

TEST(HttpServerTest, UnknownPathWrongMethodAndHandlerErrorsAreJson) {
  HttpServer server(HttpServerOptions{});
  server.route("GET", "/boom", [](const ServerRequest&) -> ServerResponse {
    throw std::runtime_error("database on fire");
  });
  server.route("GET", "/teapot", [](const ServerRequest&) -> ServerResponse {
    throw HttpStatusError(418, "short and stout");
  });
  server.start();
  auto r = http("GET", base(server) + "/nope");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.json()["error"].get<std::string>().find("/nope"), std::string::npos);
  r = http("POST", base(server) + "/boom");
  EXPECT_EQ(r.status, 405);
  r = http("GET", base(server) + "/boom");
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.json()["error"], "database on fire");
  r = http("GET", base(server) + "/teapot");
  EXPECT_EQ(r.status, 418);
  EXPECT_EQ(r.json()["error"], "short and stout");
}

TEST(HttpServerTest, HookRunsBeforeEveryHandler) {
  HttpServer server(HttpServerOptions{});
  std::atomic<int> handled{0};
  server.route("GET", "/x", [&](const ServerRequest&) {
    ++handled;
    return ServerResponse{};
  });
  server.set_hook([](const ServerRequest& req) -> std::optional<ServerResponse> {
    if (req.header("authorization") != "let me in") return ServerResponse::json_error(401, "no");
    return std::nullopt;
  });
  server.start();
  EXPECT_EQ(http("GET", base(server) + "/x").status, 401);
  EXPECT_EQ(handled, 0);
  EXPECT_EQ(http("GET", base(server) + "/x", "", {{"Authorization", "let me in"}}).status, 200);
  EXPECT_EQ(handled, 1);
  EXPECT_EQ(test::websocket_read_all("ws://127.0.0.1:" + std::to_string(server.port()) + "/x"),
            "<refused 401>\n");
}

TEST(HttpServerTest, PortInUseIsANetworkErrorNamingIt) {
  HttpServer a(HttpServerOptions{});
  a.start();
  HttpServer b(HttpServerOptions{.port = a.port()});
  try {
    b.start();
    FAIL() << "a second server bound the same port";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(a.port())),
              std::string::npos)
        << e.what();
  }
}

TEST(HttpServerTest, WebSocketSendsFromAnotherThreadAndCloses) {
  HttpServer server(HttpServerOptions{});
  std::thread writer;
  std::atomic<bool> closed_seen{false};
  server.websocket("/ws/{name}", [&](std::shared_ptr<WebSocketConnection> ws) {
    ws->on_closed([&] { closed_seen = true; });
    writer = std::thread([ws] {
      for (int i = 0; i < 3; ++i)
        ws->send_text(ws->request().params.at("name") + std::to_string(i) + ";");
      ws->close();
    });
  });
  server.start();
  std::string got =
      test::websocket_read_all("ws://127.0.0.1:" + std::to_string(server.port()) + "/ws/n");
  EXPECT_EQ(got, "n0;n1;n2;<closed>\n");
  EXPECT_TRUE(test::eventually([&] { return closed_seen.load(); }));
  if (writer.joinable()) writer.join();
}

TEST(HttpServerTest, WebSocketLearnsTheClientWentAway) {
  HttpServer server(HttpServerOptions{});
  std::shared_ptr<WebSocketConnection> kept;
  std::mutex mu;
  std::atomic<bool> closed_seen{false};
  server.websocket("/ws", [&](std::shared_ptr<WebSocketConnection> ws) {
    ws->on_closed([&] { closed_seen = true; });
    std::lock_guard<std::mutex> lock(mu);
    kept = ws;
  });
  server.start();
  // The client gives up after 1 s without frames.
  test::websocket_read_all("ws://127.0.0.1:" + std::to_string(server.port()) + "/ws", "", 1);
  EXPECT_TRUE(test::eventually([&] { return closed_seen.load(); }, std::chrono::seconds(8)));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_TRUE(kept);
  EXPECT_FALSE(kept->send_text("late"));
}

TEST(HttpServerTest, StopAfterServingIsQuick) {
  HttpServer server(HttpServerOptions{});
  server.route("GET", "/x", [](const ServerRequest&) { return ServerResponse{}; });
  server.start();
  EXPECT_EQ(http("GET", base(server) + "/x").status, 200);
  auto t0 = std::chrono::steady_clock::now();
  server.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1000));
  EXPECT_FALSE(server.running());
  EXPECT_EQ(http("GET", base(server) + "/x").status, 0);
}

// Note [Serving hostile clients]: 40 idle connections and 40 that send a byte every 100 ms hold
// no thread; the server answers others at once, and cuts the slow ones at request_timeout.
TEST(HttpServerTest, IdleAndSlowClientsHoldNothingAndAreCutAtTheDeadline) {
  HttpServer server(HttpServerOptions{.threads = 2, .request_timeout = std::chrono::seconds(2)});
  server.route("GET", "/x", [](const ServerRequest&) { return ServerResponse{.body = "{}"}; });
  server.start();
  std::vector<std::unique_ptr<test::RawClient>> idle, slow;
  for (int i = 0; i < 40; ++i) {
    idle.push_back(std::make_unique<test::RawClient>(server.port()));
    slow.push_back(std::make_unique<test::RawClient>(server.port()));
    ASSERT_TRUE(idle.back()->connected() && slow.back()->connected());
  }
  const std::string request = "GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ";
  double worst_ms = 0;
  for (int step = 0; step < 10; ++step) {  // 1 s of dribbling
    for (auto& c : slow) c->send(std::string(1, request[static_cast<std::size_t>(step)]));
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(http("GET", base(server) + "/x").status, 200);
    worst_ms = std::max(
        worst_ms,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Under civetweb each of them held a thread and this took 30 s; generous for a loaded machine.
  EXPECT_LT(worst_ms, 1000) << "a request waited behind idle and slow clients";
  // Past the 2 s deadline every one of them is cut, the slow ones although they kept sending.
  EXPECT_TRUE(test::eventually(
      [&] {
        for (auto* group : {&idle, &slow})
          for (auto& c : *group)
            if (!c->closed_by_server()) return false;
        return true;
      },
      std::chrono::seconds(6)));
  // The slow ones by the deadline (the idle ones may go first by libmicrohttpd's own silence
  // timeout).
  EXPECT_GE(server.stats().requests_timed_out, 40u);
  EXPECT_EQ(http("GET", base(server) + "/x").status, 200);
}

// Note [Keeping room for admitted clients]: past a cap the oldest connection no hook admitted
// goes (from the crowded address), an admitted one never does, and a new connection is refused
// only when every other in the way is admitted. libmicrohttpd refused every newcomer instead, so
// idle connections from anywhere locked out the clients with the token.
TEST(HttpServerTest, PastItsCapsTheServerEvictsUnadmittedConnectionsNeverAdmittedOnes) {
  HttpServer server(
      HttpServerOptions{.threads = 2, .max_connections = 12, .max_connections_per_client = 4});
  std::atomic<int> accepted{0};
  server.set_hook([&accepted](const ServerRequest& req) -> std::optional<ServerResponse> {
    if (req.header("Authorization") == "Bearer t") return ++accepted, std::nullopt;
    return ServerResponse::json_error(401, "no token");
  });
  server.route("POST", "/x",
               [](const ServerRequest& req) { return ServerResponse{.body = req.body}; });
  server.start();
  // Four admitted connections from 127.0.0.1, their bodies still to come: its cap per address.
  std::vector<std::unique_ptr<test::RawClient>> admitted, idle;
  for (int i = 0; i < 4; ++i) {
    admitted.push_back(std::make_unique<test::RawClient>(server.port()));
    ASSERT_TRUE(admitted.back()->send(
        "POST /x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer t\r\nContent-Length: 2\r\n\r\n"));
  }
  ASSERT_TRUE(test::eventually([&] { return accepted == 4; }));
  // Four idle ones from each of two other hosts: the total cap of 12.
  for (const char* from : {"127.0.0.2", "127.0.0.3"})
    for (int i = 0; i < 4; ++i)
      idle.push_back(std::make_unique<test::RawClient>(server.port(), from));
  EXPECT_EQ(server.stats().connections_evicted, 0u);
  // A thirteenth, from a third host: the oldest idle connection of a crowded host goes (in
  // whatever order the server sees the idle ones and this one, the hosts .2 and .3 hold 4).
  test::RawClient newcomer(server.port(), "127.0.0.4");
  EXPECT_TRUE(test::eventually([&] { return server.stats().connections_evicted > 0; }));
  EXPECT_EQ(server.stats().connections_evicted, 1u);
  EXPECT_EQ(server.stats().connections_refused, 0u);
  EXPECT_FALSE(newcomer.closed_by_server());
  EXPECT_TRUE(test::eventually(
      [&] { return idle[0]->closed_by_server() || idle[4]->closed_by_server(); }))
      << "the oldest first";
  // A fifth from 127.0.0.1, where every connection is admitted: the newcomer is refused.
  test::RawClient fifth(server.port());
  EXPECT_TRUE(test::eventually([&] { return fifth.closed_by_server(); }));
  EXPECT_EQ(server.stats().connections_refused, 1u);
  for (auto& c : admitted) {
    EXPECT_FALSE(c->closed_by_server()) << "an admitted connection is never evicted";
    c->send("ok");
    EXPECT_NE(c->read_head(std::chrono::seconds(5)).find(" 200 "), std::string::npos);
  }
}

TEST(HttpServerTest, AWebSocketClientThatDoesNotReadIsDroppedAndDelaysNothing) {
  HttpServer server(HttpServerOptions{.websocket_buffer_bytes = 256 << 10,
                                      .websocket_stall_timeout = std::chrono::seconds(1)});
  std::vector<std::shared_ptr<WebSocketConnection>> kept;
  std::mutex mu;
  server.websocket("/ws", [&](std::shared_ptr<WebSocketConnection> ws) {
    std::lock_guard<std::mutex> lock(mu);
    kept.push_back(ws);
  });
  server.route("GET", "/x", [](const ServerRequest&) { return ServerResponse{.body = "{}"}; });
  server.start();
  test::RawClient reader(server.port());
  ASSERT_TRUE(reader.send(test::websocket_handshake("/ws")));
  const std::string head = reader.read_head(std::chrono::seconds(5));
  ASSERT_NE(head.find("101"), std::string::npos) << head;
  // RFC 6455's example key and its answer.
  EXPECT_NE(head.find("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), std::string::npos)
      << head;
  ASSERT_TRUE(test::eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return kept.size() == 1;
  }));
  std::shared_ptr<WebSocketConnection> ws = kept[0];
  // The writer never blocks: it queues until the client's share is full, then the client is
  // dropped with a close frame, and the writer learns it from send_text.
  const std::string chunk(16 << 10, 'x');
  const auto t0 = std::chrono::steady_clock::now();
  bool refused = false;
  for (int i = 0; i < 1000 && !refused; ++i) {
    refused = !ws->send_text(chunk);
    if (!refused && ws->buffered_bytes() > (128 << 10))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(refused) << "a client that reads nothing was never dropped";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
  EXPECT_EQ(http("GET", base(server) + "/x").status, 200);  // nothing else waited
  EXPECT_TRUE(test::eventually([&] { return server.stats().websockets_dropped == 1; }));
  EXPECT_TRUE(test::eventually([&] { return server.stats().websockets_open == 0; }));
}

TEST(HttpServerTest, WebSocketsPastTheLimitAndRefusedAdmissionsAreAnsweredWithTheReason) {
  HttpServer server(HttpServerOptions{.max_websockets = 1});
  server.websocket(
      "/ws/{name}", [](std::shared_ptr<WebSocketConnection>) {},
      [](const ServerRequest& req) -> std::optional<ServerResponse> {
        if (req.params.at("name") == "full") return ServerResponse::json_error(429, "too many");
        return std::nullopt;
      });
  server.start();
  test::RawClient refused(server.port());
  refused.send(test::websocket_handshake("/ws/full"));
  const std::string r = refused.read_head(std::chrono::seconds(5), 8192);
  EXPECT_NE(r.find("429"), std::string::npos) << r;
  test::RawClient first(server.port());
  first.send(test::websocket_handshake("/ws/a"));
  EXPECT_NE(first.read_head(std::chrono::seconds(5)).find("101"), std::string::npos);
  ASSERT_TRUE(test::eventually([&] { return server.stats().websockets_open == 1; }));
  test::RawClient second(server.port());
  second.send(test::websocket_handshake("/ws/b"));
  EXPECT_NE(second.read_head(std::chrono::seconds(5)).find("503"), std::string::npos);
}

}  // namespace
}  // namespace trainyard::net
