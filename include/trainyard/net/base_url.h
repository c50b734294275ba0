// Turning what a user types for a server ("head:8265", "http://10.0.0.1:8265/") into the base URL
// every request is built on.
#pragma once

#include <string>

namespace trainyard::net {

// "http://host:port" without a trailing slash: "http://" when no scheme is given, `default_port`
// when no port is. Throws InvalidArgumentError naming `what` (e.g. "--address") for an empty
// address, a scheme other than http/https, or a port that is not 1..65535.
std::string base_url(const std::string& address, int default_port, const std::string& what);

// The host part of a base URL ("http://head:8265" -> "head").
std::string url_host(const std::string& base);

// The port of a base URL ("http://head:8265" -> 8265; 80/443 by scheme when none).
int url_port(const std::string& base);

// "http://host:port", an IPv6 literal in brackets ("::1" -> "http://[::1]:8265"), as url_host
// and a browser read it back.
std::string http_url(const std::string& host, int port);

}  // namespace trainyard::net
