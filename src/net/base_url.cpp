#include "trainyard/net/base_url.h"

#include <charconv>
#include <string_view>

#include "trainyard/error.h"

namespace trainyard::net {
namespace {

// The text between the scheme and the path.
std::string_view authority(std::string_view base) {
  std::size_t start = base.find("://");
  start = start == std::string_view::npos ? 0 : start + 3;
  const std::size_t end = base.find('/', start);
  return base.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
}

// The position of the colon before the port in an authority ("[::1]:80", "host:80"), or npos.
std::size_t port_colon(std::string_view a) {
  const std::size_t colon = a.rfind(':');
  if (colon == std::string_view::npos) return colon;
  const std::size_t bracket = a.rfind(']');
  if (bracket != std::string_view::npos && bracket > colon) return std::string_view::npos;
  return colon;
}

}  // namespace

std::string base_url(const std::string& address, int default_port, const std::string& what) {
  std::string e = address;
  while (!e.empty() && (e.back() == '/' || e.back() == ' ')) e.pop_back();
  while (!e.empty() && e.front() == ' ') e.erase(0, 1);
  TY_CHECK_T(
      InvalidArgumentError, !e.empty(), what,
      " is empty. HINT: give the head's address as HOST:PORT, e.g. head.trainyard.local:8265.");
  const std::size_t scheme_end = e.find("://");
  if (scheme_end == std::string::npos) {
    e.insert(0, "http://");
  } else {
    const std::string scheme = e.substr(0, scheme_end);
    TY_CHECK_T(InvalidArgumentError, scheme == "http" || scheme == "https", what, " '", address,
               "' has the scheme '", scheme, "'; only http:// and https:// are served.");
  }
  const std::string_view a = authority(e);
  TY_CHECK_T(InvalidArgumentError, !a.empty() && a.front() != ':', what, " '", address,
             "' names no host.");
  const std::size_t colon = port_colon(a);
  if (colon == std::string_view::npos) {
    e += ':';
    e += std::to_string(default_port);
  } else {
    const std::string_view digits = a.substr(colon + 1);
    int port = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
    TY_CHECK_T(
        InvalidArgumentError,
        ec == std::errc() && end == digits.data() + digits.size() && port >= 1 && port <= 65535,
        what, " '", address, "' has the port '", digits, "'; expected 1..65535.");
  }
  return e;
}

std::string url_host(const std::string& base) {
  std::string_view a = authority(base);
  const std::size_t colon = port_colon(a);
  if (colon != std::string_view::npos) a = a.substr(0, colon);
  if (a.size() >= 2 && a.front() == '[' && a.back() == ']') a = a.substr(1, a.size() - 2);
  return std::string(a);
}

std::string http_url(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos && !host.starts_with("[");
  return "http://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

int url_port(const std::string& base) {
  const std::string_view a = authority(base);
  const std::size_t colon = port_colon(a);
  if (colon == std::string_view::npos) return base.starts_with("https://") ? 443 : 80;
  int port = 0;
  std::from_chars(a.data() + colon + 1, a.data() + a.size(), port);
  return port;
}

}  // namespace trainyard::net
