#include "trainyard/net/base_url.h"

#include <gtest/gtest.h>

#include "trainyard/error.h"

namespace trainyard::net {
namespace {

TEST(BaseUrl, AddsTheSchemeAndTheDefaultPort) {
  EXPECT_EQ(base_url("head.trainyard.local", 8265, "--head"), "http://head.trainyard.local:8265");
  EXPECT_EQ(base_url("10.0.0.1:9000", 8265, "--head"), "http://10.0.0.1:9000");
  EXPECT_EQ(base_url("http://head:8265/", 1, "--address"), "http://head:8265");
  EXPECT_EQ(base_url(" https://head ", 443, "--address"), "https://head:443");
  EXPECT_EQ(base_url("[::1]", 8265, "--head"), "http://[::1]:8265");
  EXPECT_EQ(base_url("[::1]:99", 8265, "--head"), "http://[::1]:99");
}

TEST(BaseUrl, TakesTheUrlApart) {
  EXPECT_EQ(url_host("http://head:8265"), "head");
  EXPECT_EQ(url_port("http://head:8265"), 8265);
  EXPECT_EQ(url_host("http://[::1]:99"), "::1");
  EXPECT_EQ(url_port("http://[::1]:99"), 99);
  EXPECT_EQ(url_port("https://head"), 443);
  // What the head prints for its --bind: an IPv6 literal in brackets, read back as it was.
  EXPECT_EQ(http_url("::1", 8265), "http://[::1]:8265");
  EXPECT_EQ(url_host(http_url("::1", 8265)), "::1");
  EXPECT_EQ(url_port(http_url("::1", 8265)), 8265);
  EXPECT_EQ(http_url("127.0.0.1", 80), "http://127.0.0.1:80");
  EXPECT_EQ(http_url("[::1]", 99), "http://[::1]:99");
}

TEST(BaseUrl, RefusesWhatIsNoServerAddress) {
  const auto message = [](const std::string& address) {
    try {
      base_url(address, 8265, "--address");
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message("").find("--address is empty"), std::string::npos);
  EXPECT_NE(message("ftp://head").find("the scheme 'ftp'"), std::string::npos);
  EXPECT_NE(message("head:0").find("the port '0'"), std::string::npos);
  EXPECT_NE(message("head:http").find("the port 'http'"), std::string::npos);
  EXPECT_NE(message("head:70000").find("expected 1..65535"), std::string::npos);
  EXPECT_NE(message("http://:80").find("names no host"), std::string::npos);
}

}  // namespace
}  // namespace trainyard::net
