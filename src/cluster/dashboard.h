// The head's dashboard: one page with its script, style and Chart.js, embedded into the binary at
// build time (cmake/embed_files.cmake writes dashboard_files()). The page holds no data: its
// script reads everything through the token-protected API.
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include "trainyard/net/http_server.h"

namespace trainyard::cluster {

struct DashboardFile {
  std::string_view name;     // "index.html", "dashboard.js", "dashboard.css", "chart.min.js"
  std::string_view content;  // static storage
};

// Every embedded file (generated).
std::span<const DashboardFile> dashboard_files();

// The answer to GET /dashboard ("" or "index.html": the page) and GET /dashboard/<name>, or
// nullopt for a name that is not embedded.
std::optional<net::ServerResponse> dashboard_response(std::string_view name);

// Whether a request is for the dashboard's files, which carry no data and are served without the
// token (a browser cannot send one when it navigates; the page's script sends it on every fetch).
bool is_dashboard_request(const net::ServerRequest& request);

}  // namespace trainyard::cluster
