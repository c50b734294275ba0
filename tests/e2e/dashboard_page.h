// What the dashboard shows, read in the browser by a script (tests/e2e/webdriver.h drives it):
// the charts' series and their points, the nodes table's states and badges. Shared by the
// dashboard test with simulated workers and the cluster test that watches a real job.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "webdriver.h"

namespace trainyard::test {

// What the page shows, read by a script in it.
inline constexpr char kReadPage[] = R"JS(
  const d = window.trainyardDashboard;
  if (!d) return {ready: false};
  const series = (key) => {
    const c = d.charts[key];
    return c ? c.data.datasets.map((s) => ({label: s.label,
                                            points: s.data.filter((p) => (typeof p === 'object' && p !== null) ? p.y != null : p != null).length}))
             : [];
  };
  const rows = [...document.querySelectorAll('#nodes tbody tr')].map((r) => ({
    id: r.dataset.nodeId, state: r.dataset.state,
    badge: r.querySelector('.badge').className}));
  return {ready: true, refreshes: d.refreshes, error: d.lastError, job: d.selectedJob,
          loss: series('job:loss'), throughput: series('job:throughput'),
          steps: series('job:steps'), communication: series('job:communication'),
          nodeCpu: Object.keys(d.charts).filter((k) => k.endsWith(':cpu')).length,
          gpuCharts: Object.keys(d.charts).filter((k) => k.includes(':gpu:')).length,
          nodes: rows};
)JS";

inline bool every_rank_has_points(const nlohmann::json& series, size_t ranks, int at_least) {
  if (series.size() != ranks) return false;
  for (const auto& s : series)
    if (s["points"].get<int>() < at_least) return false;
  return true;
}

inline std::string node_state(const nlohmann::json& page, const std::string& id) {
  for (const auto& n : page["nodes"])
    if (n["id"] == id) return n["state"].get<std::string>();
  return "";
}

// Saves the page as build/test-artifacts/<name> when the test ends, whichever way it ends: a
// failed assertion's screenshot is the one most worth having. save() returns the PNG's bytes.
class ScreenshotAtExit {
 public:
  ScreenshotAtExit(WebDriver& browser, std::filesystem::path png)
      : browser_(browser), png_(std::move(png)) {}
  ScreenshotAtExit(const ScreenshotAtExit&) = delete;
  ScreenshotAtExit& operator=(const ScreenshotAtExit&) = delete;
  ~ScreenshotAtExit() {
    if (saved_) return;
    try {
      save();
    } catch (const std::exception& e) {
      std::cout << "no screenshot: " << e.what() << "\n";
    }
  }

  std::string save() {
    const std::string bytes = browser_.screenshot_png();
    std::filesystem::create_directories(png_.parent_path());
    std::ofstream(png_, std::ios::binary) << bytes;
    std::cout << "dashboard screenshot: " << png_.string() << "\n";
    saved_ = true;
    return bytes;
  }

 private:
  WebDriver& browser_;  // outlives this: declared before it in the test
  std::filesystem::path png_;
  bool saved_ = false;
};

}  // namespace trainyard::test
