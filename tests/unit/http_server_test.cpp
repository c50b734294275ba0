// net::HttpServer over real HTTP on 127.0.0.1: routing with {params}, query, case-insensitive
// headers, the hook, JSON 404/405/500 errors, port 0, and a WebSocket written from another thread.
#include "trainyard/net/http_server.h"

#include <gtest/gtest.h>

#include <atomic>
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

}  // namespace
}  // namespace trainyard::net
