// Token loading, the bind policy and the per-request check (cluster/auth.h).
#include "trainyard/cluster/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "cluster_test_util.h"

namespace trainyard::cluster {
namespace {

std::filesystem::path write_file(const std::filesystem::path& p,
                                 const std::string& text,
                                 mode_t mode) {
  std::ofstream(p) << text;
  chmod(p.c_str(), mode);
  return p;
}

TEST(ClusterAuthTest, LoadTokenTrimsAndRefusesReadableOrEmptyFiles) {
  test::TempDir dir;
  EXPECT_EQ(load_token(write_file(dir.path() / "ok", "  s3cret\n", 0600)), "s3cret");
  auto open = write_file(dir.path() / "open", "s3cret", 0644);
  try {
    load_token(open);
    FAIL() << "a world-readable token file was accepted";
  } catch (const InvalidArgumentError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(open.string()), std::string::npos) << m;
    EXPECT_NE(m.find("644"), std::string::npos) << m;
    EXPECT_NE(m.find("chmod 600"), std::string::npos) << m;
    EXPECT_EQ(m.find("s3cret"), std::string::npos) << m;
  }
  EXPECT_THROW(load_token(write_file(dir.path() / "empty", " \n", 0600)), InvalidArgumentError);
  EXPECT_THROW(load_token(dir.path() / "missing"), InvalidArgumentError);
}

TEST(ClusterAuthTest, NonLoopbackBindNeedsAToken) {
  EXPECT_NO_THROW(check_bind_policy("127.0.0.1", std::nullopt));
  EXPECT_NO_THROW(check_bind_policy("::1", std::nullopt));
  EXPECT_NO_THROW(check_bind_policy("0.0.0.0", std::string("t")));
  try {
    check_bind_policy("0.0.0.0", std::nullopt);
    FAIL() << "a public bind without a token was accepted";
  } catch (const InvalidArgumentError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("--bind 0.0.0.0"), std::string::npos) << m;
    EXPECT_NE(m.find("--token-file"), std::string::npos) << m;
  }
}

TEST(ClusterAuthTest, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal("abc", "abcd"));
  EXPECT_FALSE(constant_time_equal("", "a"));
}

net::ServerRequest request(const std::string& method, net::ServerHeaders headers) {
  net::ServerRequest r;
  r.method = method;
  r.path = "/api/jobs/";
  r.headers = std::move(headers);
  return r;
}

TEST(ClusterAuthTest, RequestCheckWithToken) {
  std::optional<std::string> token = "t0k";
  auto r = check_request(request("GET", {}), token);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = check_request(request("GET", {{"Authorization", "Bearer wrong"}}), token);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  EXPECT_EQ(r->body.find("t0k"), std::string::npos);
  EXPECT_FALSE(check_request(request("GET", {{"authorization", "Bearer t0k"}}), token));
  EXPECT_FALSE(check_request(
      request("POST", {{"X-Ray-Authorization", "Bearer t0k"}, {"Origin", "http://evil"}}), token));
}

TEST(ClusterAuthTest, TokenlessLoopbackRefusesBrowsersAndForeignHosts) {
  EXPECT_FALSE(check_request(request("GET", {{"Host", "127.0.0.1:8265"}}), std::nullopt));
  EXPECT_FALSE(check_request(request("POST", {{"Host", "localhost:8265"}}), std::nullopt));
  EXPECT_FALSE(check_request(request("GET", {{"Origin", "http://x"}}), std::nullopt));
  auto r = check_request(request("POST", {{"Origin", "http://evil.example"}}), std::nullopt);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  // A page's WebSocket to the log tail: no same-origin rule protects what it reads.
  r = check_request(request("GET", {{"Upgrade", "websocket"}, {"Origin", "http://evil.example"}}),
                    std::nullopt);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  EXPECT_NE(r->body.find("WebSocket"), std::string::npos);
  r = check_request(request("GET", {{"Host", "evil.example:8265"}}), std::nullopt);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  EXPECT_NE(r->body.find("evil.example"), std::string::npos);
}

}  // namespace
}  // namespace trainyard::cluster
