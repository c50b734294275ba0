#include "cluster/dashboard.h"

#include "trainyard/cluster/api.h"

namespace trainyard::cluster {
namespace {

std::string_view content_type(std::string_view name) {
  auto ends = [&](std::string_view s) { return name.ends_with(s); };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

}  // namespace

std::optional<net::ServerResponse> dashboard_response(std::string_view name) {
  if (name.empty()) name = "index.html";
  for (const DashboardFile& f : dashboard_files()) {
    if (f.name != name) continue;
    net::ServerResponse res;
    res.content_type = std::string(content_type(name));
    res.body = std::string(f.content);
    res.headers["Cache-Control"] = "no-cache";
    // The page runs only its own files: no inline script, nothing from elsewhere.
    res.headers["Content-Security-Policy"] =
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src "
        "'self'";
    res.headers["X-Content-Type-Options"] = "nosniff";
    return res;
  }
  return std::nullopt;
}

bool is_dashboard_request(const net::ServerRequest& request) {
  if (request.method != "GET") return false;
  std::string_view path = request.path;
  const std::string_view base = api::kDashboardPath;
  if (!path.starts_with(base)) return false;
  path.remove_prefix(base.size());
  // "/dashboard", "/dashboard/" or "/dashboard/<one segment>".
  return path.empty() || path == "/" ||
         (path.front() == '/' && path.find('/', 1) == std::string_view::npos);
}

}  // namespace trainyard::cluster
